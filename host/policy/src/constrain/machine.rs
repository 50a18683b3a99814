//! The character machine: the frames of a parse in progress, and how one character moves a stack
//! of them (every way it can: a document may be read several ways at once).

use std::sync::Arc;

use regex_automata::util::primitives::StateID;

use super::number::NumSpec;
use super::pattern::string_byte;
use super::schema::{Node, key_candidates, props};

/// Where a parse is in an object of declared properties.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ObjState {
    Open,
    /// After `{` or `,`; `comma` says a key must follow.
    BeforeKey {
        comma: bool,
    },
    Colon(usize),
    AfterValue,
}

/// Where a parse is in an object of free keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MapState {
    Open,
    BeforeKey { comma: bool },
    Colon,
    AfterValue,
}

/// Where a parse is in an array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ArrState {
    Open,
    AfterOpen,
    AfterItem,
    AfterComma,
}

/// One level of a parse in progress: the value it expects, or the container, key, string,
/// number or literal it is inside.
#[derive(Debug, Clone)]
pub(super) enum Frame {
    Value(Arc<Node>),
    Object { node: Arc<Node>, next: usize, state: ObjState },
    Key { candidates: Vec<usize>, pos: usize, node: Arc<Node> },
    Array { node: Arc<Node>, count: usize, state: ArrState },
    Map { node: Arc<Node>, count: usize, state: MapState },
    Str { node: Arc<Node>, len: usize, dfa: Option<StateID>, open: bool },
    Num { spec: NumSpec, text: String },
    Lit { options: Arc<Vec<String>>, alive: Vec<usize>, pos: usize },
}

/// A parse in progress, innermost frame last.
pub(super) type Stack = Vec<Frame>;

/// Feeds `c` to a stack; returns the stacks it can become (none when `c` is not allowed).
pub(super) fn feed(mut stack: Stack, c: char, out: &mut Vec<Stack>) {
    let Some(top) = stack.pop() else { return };
    match top {
        Frame::Value(node) => feed_value(stack, node, c, out),
        Frame::Object { node, next, state } => feed_object(stack, node, next, state, c, out),
        Frame::Key { candidates, pos, node } => feed_key(stack, candidates, pos, node, c, out),
        Frame::Array { node, count, state } => feed_array(stack, node, count, state, c, out),
        Frame::Map { node, count, state } => feed_map(stack, node, count, state, c, out),
        Frame::Str { node, len, dfa, open } => feed_string(stack, node, len, dfa, open, c, out),
        Frame::Num { spec, text } => feed_number(stack, spec, text, c, out),
        Frame::Lit { options, alive, pos } => feed_literal(stack, options, alive, pos, c, out),
    }
}

/// A value about to start: the frame of its kind (each alternative's, for `anyOf`) takes `c`.
fn feed_value(mut stack: Stack, node: Arc<Node>, c: char, out: &mut Vec<Stack>) {
    match &*node {
        Node::AnyOf(alts) => {
            for alt in alts {
                let mut s = stack.clone();
                s.push(Frame::Value(alt.clone()));
                feed(s, c, out);
            }
        }
        Node::Object(_) => {
            stack.push(Frame::Object { node: node.clone(), next: 0, state: ObjState::Open });
            feed(stack, c, out);
        }
        Node::Array { .. } => {
            stack.push(Frame::Array { node: node.clone(), count: 0, state: ArrState::Open });
            feed(stack, c, out);
        }
        Node::Map { .. } => {
            stack.push(Frame::Map { node: node.clone(), count: 0, state: MapState::Open });
            feed(stack, c, out);
        }
        Node::Str { pattern, .. } => {
            let dfa = pattern.as_ref().map(|p| p.start);
            stack.push(Frame::Str { node: node.clone(), len: 0, dfa, open: false });
            feed(stack, c, out);
        }
        Node::Num(spec) => {
            stack.push(Frame::Num { spec: *spec, text: String::new() });
            feed(stack, c, out);
        }
        Node::Lit(options) => {
            let alive = (0..options.len()).collect();
            stack.push(Frame::Lit { options: Arc::new(options.clone()), alive, pos: 0 });
            feed(stack, c, out);
        }
    }
}

/// An object of declared properties (`next`: the first property that may still come).
fn feed_object(mut stack: Stack, node: Arc<Node>, next: usize, state: ObjState, c: char, out: &mut Vec<Stack>) {
    match state {
        ObjState::Open if c == '{' => {
            stack.push(Frame::Object { node, next, state: ObjState::BeforeKey { comma: false } });
            out.push(stack);
        }
        ObjState::BeforeKey { comma } => {
            let (candidates, may_close) = key_candidates(&node, next);
            if c == '}' && may_close && !comma {
                out.push(stack);
            } else if c == '"' && !candidates.is_empty() {
                stack.push(Frame::Object { node: node.clone(), next, state });
                stack.push(Frame::Key { candidates, pos: 1, node });
                out.push(stack);
            }
        }
        ObjState::Colon(i) if c == ':' => {
            let value = props(&node)[i].node.clone();
            stack.push(Frame::Object { node, next: i + 1, state: ObjState::AfterValue });
            stack.push(Frame::Value(value));
            out.push(stack);
        }
        ObjState::AfterValue => {
            let (candidates, may_close) = key_candidates(&node, next);
            if c == ',' && !candidates.is_empty() {
                stack.push(Frame::Object { node, next, state: ObjState::BeforeKey { comma: true } });
                out.push(stack);
            } else if c == '}' && may_close {
                out.push(stack);
            }
        }
        _ => {}
    }
}

/// A declared key, `pos` bytes in: the candidates it may still name narrow with `c`.
fn feed_key(mut stack: Stack, candidates: Vec<usize>, pos: usize, node: Arc<Node>, c: char, out: &mut Vec<Stack>) {
    let ps = props(&node);
    let alive: Vec<usize> = candidates.into_iter().filter(|&i| continues(&ps[i].key, pos, c)).collect();
    if alive.is_empty() {
        return;
    }
    let pos = pos + c.len_utf8();
    if let Some(&done) = alive.iter().find(|&&i| ps[i].key.len() == pos) {
        // The key is complete: the object frame below waits for its colon.
        if let Some(Frame::Object { state, .. }) = stack.last_mut() {
            *state = ObjState::Colon(done);
        }
        out.push(stack);
    } else {
        stack.push(Frame::Key { candidates: alive, pos, node });
        out.push(stack);
    }
}

/// An array with `count` items begun so far.
fn feed_array(mut stack: Stack, node: Arc<Node>, count: usize, state: ArrState, c: char, out: &mut Vec<Stack>) {
    let Node::Array { items, min, max } = &*node else { return };
    let (min, max, items) = (*min, *max, items.clone());
    match state {
        ArrState::Open if c == '[' => {
            stack.push(Frame::Array { node, count, state: ArrState::AfterOpen });
            out.push(stack);
        }
        ArrState::AfterOpen | ArrState::AfterComma => {
            if c == ']' && state == ArrState::AfterOpen && min == 0 {
                out.push(stack);
                return;
            }
            if count < max {
                stack.push(Frame::Array { node, count: count + 1, state: ArrState::AfterItem });
                stack.push(Frame::Value(items));
                feed(stack, c, out);
            }
        }
        ArrState::AfterItem => {
            if c == ',' && count < max {
                stack.push(Frame::Array { node, count, state: ArrState::AfterComma });
                out.push(stack);
            } else if c == ']' && count >= min {
                out.push(stack);
            }
        }
        ArrState::Open => {}
    }
}

/// An object of free keys with `count` entries begun so far.
fn feed_map(mut stack: Stack, node: Arc<Node>, count: usize, state: MapState, c: char, out: &mut Vec<Stack>) {
    let (key, value, max) = match &*node {
        Node::Map { key, value, max } => (key.clone(), value.clone(), *max),
        _ => return,
    };
    match state {
        MapState::Open if c == '{' => {
            stack.push(Frame::Map { node, count, state: MapState::BeforeKey { comma: false } });
            out.push(stack);
        }
        MapState::BeforeKey { comma } => {
            if c == '}' && !comma {
                out.push(stack);
            } else if c == '"' && count < max {
                stack.push(Frame::Map { node, count, state: MapState::Colon });
                // The key's opening quote is this one.
                stack.push(Frame::Str { node: key, len: 0, dfa: None, open: true });
                out.push(stack);
            }
        }
        MapState::Colon if c == ':' => {
            stack.push(Frame::Map { node, count: count + 1, state: MapState::AfterValue });
            stack.push(Frame::Value(value));
            out.push(stack);
        }
        MapState::AfterValue => {
            if c == ',' && count < max {
                stack.push(Frame::Map { node, count, state: MapState::BeforeKey { comma: true } });
                out.push(stack);
            } else if c == '}' {
                out.push(stack);
            }
        }
        _ => {}
    }
}

/// A string, `len` characters in (`dfa`: its pattern's state; `open`: past the opening quote):
/// allowed bytes within the length cap and where a pattern can still be met, then the closing
/// quote.
fn feed_string(
    mut stack: Stack,
    node: Arc<Node>,
    len: usize,
    dfa: Option<StateID>,
    open: bool,
    c: char,
    out: &mut Vec<Stack>,
) {
    let Node::Str { min, max, pattern } = &*node else { return };
    if !open {
        if c == '"' {
            stack.push(Frame::Str { node: node.clone(), len, dfa, open: true });
            out.push(stack);
        }
        return;
    }
    if c == '"' {
        let accepts = match (pattern, dfa) {
            (Some(p), Some(s)) => p.accepts(s),
            _ => true,
        };
        if len >= *min && accepts {
            out.push(stack);
        }
        return;
    }
    if !string_byte(c) || len >= *max {
        return;
    }
    let next = match (pattern, dfa) {
        (Some(p), Some(s)) => match p.next(s, c as u8) {
            // Only if the pattern can still be met within the length cap.
            Some(n) if p.distance_to_accept(n).is_some_and(|d| len + 1 + d <= *max) => Some(n),
            _ => return,
        },
        _ => None,
    };
    stack.push(Frame::Str { node: node.clone(), len: len + 1, dfa: next, open: true });
    out.push(stack);
}

/// A number: `c` extends it while it stays viable; otherwise, where it may end, `c` goes to the
/// frame below.
fn feed_number(mut stack: Stack, spec: NumSpec, mut text: String, c: char, out: &mut Vec<Stack>) {
    if c == '-' || c == '.' || c.is_ascii_digit() {
        let before = text.len();
        text.push(c);
        if spec.viable(&text) {
            stack.push(Frame::Num { spec, text });
            out.push(stack);
            return;
        }
        text.truncate(before);
    }
    if spec.can_end(&text) {
        feed(stack, c, out);
    }
}

/// A literal (`true`, an enum's values), `pos` bytes in: `c` continues the options it fits, and
/// goes to the frame below where an option has ended.
fn feed_literal(stack: Stack, options: Arc<Vec<String>>, alive: Vec<usize>, pos: usize, c: char, out: &mut Vec<Stack>) {
    let ended = alive.iter().any(|&i| options[i].len() == pos);
    let next: Vec<usize> = alive.iter().copied().filter(|&i| continues(&options[i], pos, c)).collect();
    if !next.is_empty() {
        let mut s = stack.clone();
        s.push(Frame::Lit { options: options.clone(), alive: next, pos: pos + c.len_utf8() });
        out.push(s);
    }
    if ended {
        feed(stack, c, out);
    }
}

/// Whether `text` continues with `c` at byte offset `pos`.
fn continues(text: &str, pos: usize, c: char) -> bool {
    text.get(pos..).is_some_and(|rest| rest.starts_with(c))
}

/// Whether a stack has a complete document (numbers and literals may still be open).
pub(super) fn complete(stack: &Stack) -> bool {
    match stack.as_slice() {
        [] => true,
        [Frame::Num { spec, text }] => spec.can_end(text),
        [Frame::Lit { options, alive, pos }] => alive.iter().any(|&i| options[i].len() == *pos),
        _ => false,
    }
}
