//! `pattern` keywords: a regex's DFA over the bytes a generated string may hold, and how far
//! each of its states is from a match.

use std::collections::{HashMap, VecDeque};

use regex_automata::dfa::{Automaton, dense};
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};

/// A pattern's DFA, matched against the whole string: JSON Schema's `pattern` is unanchored, so
/// `P` becomes `.*P.*`, and a leading `^` or trailing `$` drops the matching side.
#[derive(Debug)]
pub(super) struct Pattern {
    dfa: dense::DFA<Vec<u32>>,
    /// The state before the string's first byte.
    pub(super) start: StateID,
    /// Per state: the fewest allowed bytes to an accepting state (`None`: unreachable).
    distance: std::sync::Mutex<HashMap<StateID, Option<usize>>>,
}

impl Pattern {
    /// The DFA of `pattern`; `None` when it does not compile, grows too large, or no string of
    /// allowed bytes matches it.
    pub(super) fn compile(pattern: &str) -> Option<Pattern> {
        let (body, anchored_start) = match pattern.strip_prefix('^') {
            Some(rest) => (rest, true),
            None => (pattern, false),
        };
        let (body, anchored_end) = match body.strip_suffix('$') {
            Some(rest) if !rest.ends_with('\\') => (rest, true),
            _ => (body, false),
        };
        let prefix = if anchored_start { "" } else { "(?s:.)*" };
        let suffix = if anchored_end { "" } else { "(?s:.)*" };
        let dfa = dense::Builder::new()
            .configure(dense::Config::new().match_kind(MatchKind::All).dfa_size_limit(Some(1 << 20)))
            .build(&format!("{prefix}(?:{body}){suffix}"))
            .ok()?;
        let start = dfa.start_state(&start::Config::new().anchored(Anchored::Yes)).ok()?;
        let pattern = Pattern { dfa, start, distance: std::sync::Mutex::new(HashMap::new()) };
        // A pattern no string of allowed bytes satisfies is not followed at all.
        pattern.distance_to_accept(start)?;
        Some(pattern)
    }

    /// The state after `byte`; `None` when no match can follow.
    pub(super) fn next(&self, state: StateID, byte: u8) -> Option<StateID> {
        let s = self.dfa.next_state(state, byte);
        if self.dfa.is_dead_state(s) || self.dfa.is_quit_state(s) { None } else { Some(s) }
    }

    /// Whether the string may end in `state`.
    pub(super) fn accepts(&self, state: StateID) -> bool {
        self.dfa.is_match_state(self.dfa.next_eoi_state(state))
    }

    /// The fewest allowed bytes that take `state` to acceptance.
    pub(super) fn distance_to_accept(&self, state: StateID) -> Option<usize> {
        if let Some(d) = toolsmith_contract::sync::lock(&self.distance).get(&state) {
            return *d;
        }
        let d = self.shortest_completion(state, 0, 0).map(|p| p.len());
        toolsmith_contract::sync::lock(&self.distance).insert(state, d);
        d
    }

    /// Shortest content (allowed bytes only) that takes `state` with `len` characters to an
    /// accepting state with at least `min` characters.
    pub(super) fn shortest_completion(&self, state: StateID, len: usize, min: usize) -> Option<Vec<u8>> {
        let need = |l: usize| l.min(min);
        let mut seen: HashMap<(StateID, usize), ()> = HashMap::new();
        let mut queue = VecDeque::from([(state, len, Vec::new())]);
        while let Some((s, l, path)) = queue.pop_front() {
            if l >= min && self.accepts(s) {
                return Some(path);
            }
            if path.len() > 256 {
                continue;
            }
            for b in STRING_BYTES {
                if let Some(n) = self.next(s, b)
                    && seen.insert((n, need(l + 1)), ()).is_none()
                {
                    let mut p = path.clone();
                    p.push(b);
                    queue.push_back((n, l + 1, p));
                }
            }
        }
        None
    }
}

/// Bytes a generated string may contain: printable ASCII without `"` and `\`.
const STRING_BYTES: [u8; 93] = {
    let mut out = [0u8; 93];
    let mut i = 0;
    let mut b = 0x20u8;
    while b < 0x7f {
        if b != b'"' && b != b'\\' {
            out[i] = b;
            i += 1;
        }
        b += 1;
    }
    out
};

/// Whether `c` may stand in a generated string ([`STRING_BYTES`]).
pub(super) fn string_byte(c: char) -> bool {
    c.is_ascii() && !c.is_ascii_control() && c != '"' && c != '\\'
}
