//! JSON-Schema-constrained decoding over the policy's tokenizer: at each step only tokens whose
//! text keeps the output a valid prefix of a document that validates are allowed, so the output
//! always validates (MTR's ToolActor needs observations that match a tool's output schema).
//!
//! The schema is compiled to a character-level machine. Supported: objects (properties in
//! declared order, optional ones may be skipped), arrays (`minItems`/`maxItems`), strings
//! (`minLength`/`maxLength`, `pattern` through a DFA where the regex compiles), integers and
//! numbers (`minimum`/`maximum`, exclusive bounds), `enum`, `const`, booleans, null, `anyOf`,
//! `oneOf` and type lists. Output is compact (no whitespace); strings use printable ASCII without
//! escapes. Lengths are capped so every output ends: when a generation runs out of tokens,
//! [`JsonMatcher::completion`] closes it with the shortest valid suffix.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use regex_automata::dfa::{Automaton, dense};
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};
use serde_json::Value;

use crate::generate::Constraint;
use crate::{Policy, PolicyError, SamplingParams, Tokenizer};

/// Longest string generated when the schema gives no `maxLength`.
pub const DEFAULT_MAX_STRING: usize = 24;
/// Most array items generated when the schema gives no `maxItems`.
pub const DEFAULT_MAX_ITEMS: usize = 3;
/// Most integer digits when a number has no bounds.
const DEFAULT_INT_DIGITS: usize = 6;
/// Most fraction digits of a number.
const FRACTION_DIGITS: usize = 3;

/// A compiled schema node.
#[derive(Debug)]
enum Node {
    Object(Vec<Property>),
    Array {
        items: Arc<Node>,
        min: usize,
        max: usize,
    },
    Str {
        min: usize,
        max: usize,
        pattern: Option<Arc<Pattern>>,
    },
    Num(NumSpec),
    Lit(Vec<String>),
    AnyOf(Vec<Arc<Node>>),
    /// An object with free keys (`additionalProperties`, `json_object`): up to `max` entries.
    Map {
        key: Arc<Node>,
        value: Arc<Node>,
        max: usize,
    },
}

/// Most entries of an object with free keys.
const DEFAULT_MAX_ENTRIES: usize = 6;
/// How deep a value of unknown shape (`json_object`, `additionalProperties: true`) may nest.
const ANY_DEPTH: usize = 2;

/// Any JSON value, nested at most `depth` containers deep.
fn any_value(depth: usize) -> Arc<Node> {
    let mut alts = vec![
        Arc::new(Node::Str { min: 0, max: DEFAULT_MAX_STRING, pattern: None }),
        Arc::new(Node::Num(NumSpec { integer: false, lo: None, hi: None, int_digits: DEFAULT_INT_DIGITS })),
        Arc::new(Node::Lit(vec!["true".into(), "false".into(), "null".into()])),
    ];
    if depth > 0 {
        let inner = any_value(depth - 1);
        alts.push(Arc::new(Node::Array { items: inner.clone(), min: 0, max: DEFAULT_MAX_ITEMS }));
        alts.push(free_object(inner));
    }
    Arc::new(Node::AnyOf(alts))
}

fn free_object(value: Arc<Node>) -> Arc<Node> {
    let key = Arc::new(Node::Str { min: 1, max: DEFAULT_MAX_STRING, pattern: None });
    Arc::new(Node::Map { key, value, max: DEFAULT_MAX_ENTRIES })
}

#[derive(Debug)]
struct Property {
    /// The key as JSON, quotes included.
    key: String,
    required: bool,
    node: Arc<Node>,
}

#[derive(Debug, Clone, Copy)]
struct NumSpec {
    integer: bool,
    lo: Option<(f64, bool)>,
    hi: Option<(f64, bool)>,
    int_digits: usize,
}

/// A pattern's DFA, matched against the whole string: JSON Schema's `pattern` is unanchored, so
/// `P` becomes `.*P.*`, and a leading `^` or trailing `$` drops the matching side.
#[derive(Debug)]
struct Pattern {
    dfa: dense::DFA<Vec<u32>>,
    start: StateID,
    /// Per state: the fewest allowed bytes to an accepting state (`None`: unreachable).
    distance: std::sync::Mutex<HashMap<StateID, Option<usize>>>,
}

impl Pattern {
    fn compile(pattern: &str) -> Option<Pattern> {
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

    fn next(&self, state: StateID, byte: u8) -> Option<StateID> {
        let s = self.dfa.next_state(state, byte);
        if self.dfa.is_dead_state(s) || self.dfa.is_quit_state(s) { None } else { Some(s) }
    }

    fn accepts(&self, state: StateID) -> bool {
        self.dfa.is_match_state(self.dfa.next_eoi_state(state))
    }

    /// The fewest allowed bytes that take `state` to acceptance.
    fn distance_to_accept(&self, state: StateID) -> Option<usize> {
        if let Some(d) = toolsmith_contract::sync::lock(&self.distance).get(&state) {
            return *d;
        }
        let d = self.shortest_completion(state, 0, 0).map(|p| p.len());
        toolsmith_contract::sync::lock(&self.distance).insert(state, d);
        d
    }

    /// Shortest content (allowed bytes only) that takes `state` with `len` characters to an
    /// accepting state with at least `min` characters.
    fn shortest_completion(&self, state: StateID, len: usize, min: usize) -> Option<Vec<u8>> {
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

fn string_byte(c: char) -> bool {
    c.is_ascii() && !c.is_ascii_control() && c != '"' && c != '\\'
}

/// A schema the machine cannot follow.
fn unsupported(what: String) -> PolicyError {
    PolicyError::Sampling(format!("constrained decoding: {what}"))
}

fn compile(schema: &Value, depth: usize) -> Result<Arc<Node>, PolicyError> {
    if depth > 32 {
        return Err(unsupported("schema nests deeper than 32 levels".into()));
    }
    let Some(obj) = schema.as_object() else {
        return match schema {
            // `true` accepts anything: a string is as good as any.
            Value::Bool(true) => Ok(Arc::new(Node::Str { min: 0, max: DEFAULT_MAX_STRING, pattern: None })),
            _ => Err(unsupported(format!("schema {schema} accepts nothing"))),
        };
    };
    // Keywords the machine cannot honour: refuse rather than emit documents that fail them.
    const UNSUPPORTED: [&str; 14] = [
        "$ref",
        "$dynamicRef",
        "not",
        "if",
        "then",
        "else",
        "uniqueItems",
        "multipleOf",
        "minProperties",
        "maxProperties",
        "prefixItems",
        "contains",
        "dependentRequired",
        "dependentSchemas",
    ];
    if let Some(k) = UNSUPPORTED.iter().find(|k| obj.contains_key(**k)) {
        return Err(unsupported(format!("the keyword `{k}` is not supported")));
    }
    let combinators = ["anyOf", "oneOf", "allOf", "enum", "const"].iter().filter(|k| obj.contains_key(**k)).count();
    let typed = ["type", "properties", "items", "required"].iter().any(|k| obj.contains_key(*k));
    if combinators > 1 || (combinators == 1 && typed && !obj.contains_key("enum") && !obj.contains_key("const")) {
        return Err(unsupported("combining anyOf/oneOf/allOf/enum/const with sibling constraints".into()));
    }
    if let Some(c) = obj.get("const") {
        return Ok(Arc::new(Node::Lit(vec![c.to_string()])));
    }
    if let Some(values) = obj.get("enum").and_then(Value::as_array) {
        if values.is_empty() {
            return Err(unsupported("empty enum".into()));
        }
        return Ok(Arc::new(Node::Lit(values.iter().map(Value::to_string).collect())));
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(alts) = obj.get(key).and_then(Value::as_array) {
            if alts.is_empty() {
                return Err(unsupported(format!("empty {key}")));
            }
            let alts = alts.iter().map(|a| compile(a, depth + 1)).collect::<Result<Vec<_>, _>>()?;
            // oneOf needs exactly one branch to match: numbers of both numeric kinds could match two.
            let numeric = alts.iter().filter(|a| matches!(&***a, Node::Num(_))).count();
            if key == "oneOf" && numeric > 1 {
                return Err(unsupported("oneOf with more than one numeric branch".into()));
            }
            return Ok(Arc::new(Node::AnyOf(alts)));
        }
    }
    if let Some(all) = obj.get("allOf").and_then(Value::as_array) {
        return match all.as_slice() {
            [only] => compile(only, depth + 1),
            _ => Err(unsupported("allOf with more than one schema".into())),
        };
    }
    match obj.get("type") {
        Some(Value::Array(types)) => {
            let alts = types
                .iter()
                .map(|t| {
                    let mut single = obj.clone();
                    single.insert("type".into(), t.clone());
                    compile(&Value::Object(single), depth + 1)
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Arc::new(Node::AnyOf(alts)))
        }
        Some(Value::String(t)) => compile_type(t, obj, depth),
        Some(other) => Err(unsupported(format!("type {other}"))),
        // No type: infer it from the keywords present.
        None if obj.contains_key("properties") => compile_type("object", obj, depth),
        None if obj.contains_key("items") => compile_type("array", obj, depth),
        None => compile_type("string", obj, depth),
    }
}

fn usize_of(obj: &serde_json::Map<String, Value>, key: &str) -> Option<usize> {
    obj.get(key).and_then(Value::as_u64).map(|v| v as usize)
}

fn compile_type(t: &str, obj: &serde_json::Map<String, Value>, depth: usize) -> Result<Arc<Node>, PolicyError> {
    Ok(Arc::new(match t {
        "object" => {
            let required: Vec<&str> = obj
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let additional = obj.get("additionalProperties");
            if !obj.contains_key("properties") && required.is_empty() && additional != Some(&Value::Bool(false)) {
                // No declared keys: any keys, with values of `additionalProperties` (any value
                // when it is absent or `true`).
                let value = match additional {
                    None | Some(Value::Bool(true)) => any_value(ANY_DEPTH),
                    Some(schema) => compile(schema, depth + 1)?,
                };
                return Ok(free_object(value));
            }
            let mut props = Vec::new();
            if let Some(p) = obj.get("properties").and_then(Value::as_object) {
                for (name, schema) in p {
                    props.push(Property {
                        key: Value::String(name.clone()).to_string(),
                        required: required.contains(&name.as_str()),
                        node: compile(schema, depth + 1)?,
                    });
                }
            }
            for r in &required {
                // Keys are stored as JSON text, quotes included.
                let key = Value::String((*r).to_string()).to_string();
                if !props.iter().any(|p| p.key == key) {
                    return Err(unsupported(format!("required property `{r}` has no schema")));
                }
            }
            Node::Object(props)
        }
        "array" => {
            let items = match obj.get("items") {
                Some(s) => compile(s, depth + 1)?,
                None => compile(&Value::Bool(true), depth + 1)?,
            };
            let min = usize_of(obj, "minItems").unwrap_or(0);
            let max = usize_of(obj, "maxItems").unwrap_or(DEFAULT_MAX_ITEMS.max(min));
            if max < min {
                return Err(unsupported(format!("maxItems {max} < minItems {min}")));
            }
            Node::Array { items, min, max }
        }
        "string" => {
            let min = usize_of(obj, "minLength").unwrap_or(0);
            let pattern = match obj.get("pattern").and_then(Value::as_str) {
                None => None,
                Some(p) => Some(Arc::new(Pattern::compile(p).ok_or_else(|| {
                    unsupported(format!("the pattern `{p}` cannot be followed (unsupported syntax, too large, or no printable-ASCII match)"))
                })?)),
            };
            // A pattern may need more than the usual cap: never less than its shortest match.
            let shortest = pattern.as_ref().and_then(|p| p.distance_to_accept(p.start)).unwrap_or(0);
            let default_max = if pattern.is_some() { shortest.max(64) } else { DEFAULT_MAX_STRING };
            let max = usize_of(obj, "maxLength").unwrap_or(default_max.max(min));
            if max < min {
                return Err(unsupported(format!("maxLength {max} < minLength {min}")));
            }
            Node::Str { min, max, pattern }
        }
        "integer" | "number" => {
            for k in ["exclusiveMinimum", "exclusiveMaximum"] {
                if obj.get(k).is_some_and(Value::is_boolean) {
                    return Err(unsupported(format!("draft-4 boolean `{k}`")));
                }
            }
            // Both forms may be present: the tighter bound wins (exclusive on a tie).
            let bound = |inclusive: &str, exclusive: &str, lower: bool| {
                let ex = obj.get(exclusive).and_then(Value::as_f64).map(|v| (v, true));
                let inc = obj.get(inclusive).and_then(Value::as_f64).map(|v| (v, false));
                match (ex, inc) {
                    (Some(e), Some(i)) => Some(if (lower && i.0 > e.0) || (!lower && i.0 < e.0) { i } else { e }),
                    (e, i) => e.or(i),
                }
            };
            let lo = bound("minimum", "exclusiveMinimum", true);
            let hi = bound("maximum", "exclusiveMaximum", false);
            let digits = |v: f64| (v.abs().max(1.0).log10().floor() as usize) + 1;
            let int_digits = match (lo, hi) {
                (Some((a, _)), Some((b, _))) => digits(a).max(digits(b)),
                // One side open: room past the known bound.
                (Some((v, _)), None) | (None, Some((v, _))) => (digits(v) + 1).max(DEFAULT_INT_DIGITS),
                (None, None) => DEFAULT_INT_DIGITS,
            };
            if int_digits > 15 {
                return Err(unsupported("numbers beyond 15 digits".into()));
            }
            if let (Some((a, _)), Some((b, _))) = (lo, hi)
                && a > b
            {
                return Err(unsupported(format!("minimum {a} > maximum {b}")));
            }
            Node::Num(NumSpec { integer: t == "integer", lo, hi, int_digits })
        }
        "boolean" => Node::Lit(vec!["true".into(), "false".into()]),
        "null" => Node::Lit(vec!["null".into()]),
        other => return Err(unsupported(format!("type `{other}`"))),
    }))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ObjState {
    Open,
    /// After `{` or `,`; `comma` says a key must follow.
    BeforeKey {
        comma: bool,
    },
    Colon(usize),
    AfterValue,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MapState {
    Open,
    BeforeKey { comma: bool },
    Colon,
    AfterValue,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ArrState {
    Open,
    AfterOpen,
    AfterItem,
    AfterComma,
}

#[derive(Debug, Clone)]
enum Frame {
    Value(Arc<Node>),
    Object { node: Arc<Node>, next: usize, state: ObjState },
    Key { candidates: Vec<usize>, pos: usize, node: Arc<Node> },
    Array { node: Arc<Node>, count: usize, state: ArrState },
    Map { node: Arc<Node>, count: usize, state: MapState },
    Str { node: Arc<Node>, len: usize, dfa: Option<StateID>, open: bool },
    Num { spec: NumSpec, text: String },
    Lit { options: Arc<Vec<String>>, alive: Vec<usize>, pos: usize },
}

type Stack = Vec<Frame>;

/// The state of one constrained output: the set of parses the text so far allows.
#[derive(Debug, Clone)]
pub struct JsonMatcher {
    stacks: Vec<Stack>,
}

/// A compiled schema to start matchers from.
#[derive(Debug, Clone)]
pub struct JsonSchemaGrammar {
    root: Arc<Node>,
}

impl JsonSchemaGrammar {
    /// Compiles `schema`, refusing schemas it cannot follow to a complete document.
    pub fn compile(schema: &Value) -> Result<Self, PolicyError> {
        let grammar = JsonSchemaGrammar { root: compile(schema, 0)? };
        // Some constraint sets compile but admit no document of the machine's shape (a number
        // range with no 3-decimal value, a pattern longer than its cap): find out now.
        let start = grammar.matcher();
        let suffix = start.completion();
        let closes = start.after(&suffix).is_some_and(|m| m.is_complete());
        if !closes {
            return Err(unsupported(format!("no document satisfies {schema} within the generation caps")));
        }
        Ok(grammar)
    }

    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`): free keys, values of
    /// any type nested a few levels deep.
    pub fn any_object() -> Self {
        JsonSchemaGrammar { root: free_object(any_value(ANY_DEPTH)) }
    }

    /// A matcher at the start of a document.
    pub fn matcher(&self) -> JsonMatcher {
        JsonMatcher { stacks: vec![vec![Frame::Value(self.root.clone())]] }
    }
}

fn props(node: &Node) -> &[Property] {
    match node {
        Node::Object(p) => p,
        _ => &[],
    }
}

/// Property indices a key may name after `next`: up to and including the first required one.
fn key_candidates(node: &Node, next: usize) -> (Vec<usize>, bool) {
    let ps = props(node);
    let mut out = Vec::new();
    for (i, p) in ps.iter().enumerate().skip(next) {
        out.push(i);
        if p.required {
            return (out, false);
        }
    }
    (out, true)
}

impl NumSpec {
    fn in_range(&self, a: f64, b: f64) -> bool {
        let lo_ok = match self.lo {
            None => true,
            Some((lo, true)) => b > lo,
            Some((lo, false)) => b >= lo,
        };
        let hi_ok = match self.hi {
            None => true,
            Some((hi, true)) => a < hi,
            Some((hi, false)) => a <= hi,
        };
        lo_ok && hi_ok
    }

    fn parts(text: &str) -> (bool, &str, Option<&str>) {
        let (neg, rest) = match text.strip_prefix('-') {
            Some(r) => (true, r),
            None => (false, text),
        };
        match rest.split_once('.') {
            Some((i, f)) => (neg, i, Some(f)),
            None => (neg, rest, None),
        }
    }

    /// Whether `text` is a well-formed prefix some completion of which is in range.
    fn viable(&self, text: &str) -> bool {
        let (neg, int, frac) = Self::parts(text);
        if int.len() > self.int_digits || !int.chars().all(|c| c.is_ascii_digit()) {
            return false;
        }
        if int.len() > 1 && int.starts_with('0') {
            return false;
        }
        if let Some(f) = frac
            && (self.integer || int.is_empty() || f.len() > FRACTION_DIGITS || !f.chars().all(|c| c.is_ascii_digit()))
        {
            return false;
        }
        let sign = if neg { -1.0 } else { 1.0 };
        let span = |a: f64, b: f64| if neg { self.in_range(-b, -a) } else { self.in_range(a, b) };
        if int.is_empty() {
            let max = 10f64.powi(self.int_digits as i32);
            return span(0.0, max);
        }
        let base: f64 = int.parse().unwrap_or(0.0);
        if let Some(f) = frac {
            let scale = 10f64.powi(f.len() as i32);
            let v = base + f.parse::<f64>().unwrap_or(0.0) / scale;
            let width = if f.len() < FRACTION_DIGITS { 1.0 / scale } else { 0.0 };
            let _ = sign;
            return span(v, v + width);
        }
        let frac_width = if self.integer { 0.0 } else { 1.0 - 10f64.powi(-(FRACTION_DIGITS as i32)) };
        if int == "0" {
            return span(0.0, frac_width);
        }
        (0..=self.int_digits - int.len()).any(|k| {
            let scale = 10f64.powi(k as i32);
            let a = base * scale;
            span(a, a + scale - 1.0 + frac_width)
        })
    }

    fn can_end(&self, text: &str) -> bool {
        let (neg, int, frac) = Self::parts(text);
        if int.is_empty() || frac.is_some_and(str::is_empty) || !self.viable(text) {
            return false;
        }
        let v: f64 = text.parse().unwrap_or(f64::NAN);
        let _ = neg;
        v.is_finite() && self.in_range(v, v)
    }
}

/// Feeds `c` to a stack; returns the stacks it can become (none when `c` is not allowed).
fn feed(mut stack: Stack, c: char, out: &mut Vec<Stack>) {
    let Some(top) = stack.pop() else { return };
    match top {
        Frame::Value(node) => match &*node {
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
        },
        Frame::Object { node, next, state } => match state {
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
        },
        Frame::Key { candidates, pos, node } => {
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
        Frame::Array { node, count, state } => {
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
        Frame::Map { node, count, state } => {
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
        Frame::Str { node, len, dfa, open } => {
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
        Frame::Num { spec, mut text } => {
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
        Frame::Lit { options, alive, pos } => {
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
    }
}

/// Whether `text` continues with `c` at byte offset `pos`.
fn continues(text: &str, pos: usize, c: char) -> bool {
    text.get(pos..).is_some_and(|rest| rest.starts_with(c))
}

/// Whether a stack has a complete document (numbers and literals may still be open).
fn complete(stack: &Stack) -> bool {
    match stack.as_slice() {
        [] => true,
        [Frame::Num { spec, text }] => spec.can_end(text),
        [Frame::Lit { options, alive, pos }] => alive.iter().any(|&i| options[i].len() == *pos),
        _ => false,
    }
}

impl JsonMatcher {
    /// Feeds text; false (and the matcher unchanged) when it cannot continue a valid document.
    pub fn feed_str(&mut self, text: &str) -> bool {
        match self.after(text) {
            Some(next) => {
                *self = next;
                true
            }
            None => false,
        }
    }

    /// The matcher after `text`, if `text` is allowed.
    pub fn after(&self, text: &str) -> Option<JsonMatcher> {
        let mut stacks = self.stacks.clone();
        for c in text.chars() {
            let mut next = Vec::new();
            for s in stacks {
                feed(s, c, &mut next);
            }
            if next.is_empty() {
                return None;
            }
            // Forks that reached the same state would multiply: keep at most a few.
            next.truncate(16);
            stacks = next;
        }
        Some(JsonMatcher { stacks })
    }

    /// Whether `c` may come next.
    pub fn allows_char(&self, c: char) -> bool {
        let mut out = Vec::new();
        for s in &self.stacks {
            feed(s.clone(), c, &mut out);
            if !out.is_empty() {
                return true;
            }
        }
        false
    }

    /// Whether the text so far is a complete document.
    pub fn is_complete(&self) -> bool {
        self.stacks.iter().any(complete)
    }

    /// Whether the document is complete and nothing more may follow.
    pub fn is_closed(&self) -> bool {
        self.stacks.iter().all(Vec::is_empty)
    }

    /// The shortest-effort suffix that completes the document (empty when complete).
    pub fn completion(&self) -> String {
        let mut out = String::new();
        let mut m = self.clone();
        for _ in 0..4096 {
            if m.is_complete() {
                return out;
            }
            let Some(c) = m.preferred_char() else { return out };
            match m.after(&c.to_string()) {
                Some(next) => {
                    m = next;
                    out.push(c);
                }
                None => return out,
            }
        }
        out
    }

    /// The character that moves the first parse closest to completion.
    fn preferred_char(&self) -> Option<char> {
        let stack = self.stacks.first()?;
        preferred(stack).into_iter().find(|&c| self.allows_char(c))
    }
}

/// Characters that move `stack` towards completion, best first.
fn preferred(stack: &[Frame]) -> Vec<char> {
    let Some((top, below)) = stack.split_last() else { return Vec::new() };
    match top {
        Frame::Value(node) => first_chars(node),
        Frame::Object { node, next, state } => match state {
            ObjState::Open => vec!['{'],
            ObjState::BeforeKey { .. } => {
                let (_, may_close) = key_candidates(node, *next);
                if may_close { vec!['}', '"'] } else { vec!['"'] }
            }
            ObjState::Colon(_) => vec![':'],
            ObjState::AfterValue => vec!['}', ','],
        },
        Frame::Key { candidates, pos, node } => {
            let ps = props(node);
            let key = candidates.iter().rev().find(|&&i| ps[i].required).or(candidates.first());
            key.and_then(|&i| ps[i].key.get(*pos..)).and_then(|r| r.chars().next()).into_iter().collect()
        }
        Frame::Map { state, count, node } => match state {
            MapState::Open => vec!['{'],
            MapState::BeforeKey { comma: false } => vec!['}', '"'],
            MapState::BeforeKey { comma: true } => vec!['"'],
            MapState::Colon => vec![':'],
            MapState::AfterValue => {
                let room = matches!(&**node, Node::Map { max, .. } if count < max);
                if room { vec!['}', ','] } else { vec!['}'] }
            }
        },
        Frame::Array { node, state, .. } => match state {
            ArrState::Open => vec!['['],
            _ => {
                let mut v = vec![']', ','];
                if let Node::Array { items, .. } = &**node {
                    v.extend(first_chars(items));
                }
                v
            }
        },
        Frame::Str { node, len, dfa, open } => {
            if !open {
                vec!['"']
            } else if let (Node::Str { min, pattern: Some(p), .. }, Some(s)) = (&**node, dfa) {
                match p.shortest_completion(*s, *len, *min) {
                    Some(path) if !path.is_empty() => vec![path[0] as char],
                    _ => vec!['"'],
                }
            } else {
                vec!['"', 'a']
            }
        }
        // A number or literal that may end: the enclosing value decides what comes next.
        Frame::Num { spec, text } if spec.can_end(text) => preferred(below),
        Frame::Num { spec, text } => {
            let mut v: Vec<char> = "0123456789".chars().collect();
            // Prefer a digit after which the number can end.
            v.sort_by_key(|&d| !spec.can_end(&format!("{text}{d}")));
            v.push('-');
            v.push('.');
            v
        }
        Frame::Lit { options, alive, pos } if alive.iter().any(|&i| options[i].len() == *pos) => preferred(below),
        Frame::Lit { options, alive, pos } => {
            let shortest = alive.iter().min_by_key(|&&i| options[i].len());
            shortest.and_then(|&i| options[i].get(*pos..)).and_then(|r| r.chars().next()).into_iter().collect()
        }
    }
}

fn first_chars(node: &Node) -> Vec<char> {
    match node {
        Node::Object(_) | Node::Map { .. } => vec!['{'],
        Node::Array { .. } => vec!['['],
        Node::Str { .. } => vec!['"'],
        Node::Num(_) => "0123456789-".chars().collect(),
        Node::Lit(options) => {
            let mut o: Vec<&String> = options.iter().collect();
            o.sort_by_key(|s| s.len());
            o.iter().filter_map(|s| s.chars().next()).collect()
        }
        Node::AnyOf(alts) => alts.iter().flat_map(|a| first_chars(a)).collect(),
    }
}

/// Each token's text, decoded once per tokenizer, indexed by first character for the cheap
/// filter.
#[derive(Debug)]
pub struct TokenTable {
    texts: Vec<Option<String>>,
    by_first: HashMap<char, Vec<i64>>,
}

impl TokenTable {
    /// Decodes every token of `tokenizer`. Special tokens and tokens that decode to nothing are
    /// never allowed inside a document.
    pub fn new(tokenizer: &Tokenizer) -> Result<Self, PolicyError> {
        let n = tokenizer.vocab_size();
        let mut texts = Vec::with_capacity(n);
        let mut by_first: HashMap<char, Vec<i64>> = HashMap::new();
        // SentencePiece-style decoders drop a word-initial space at the start of a text; decoding
        // each token after a fixed one keeps it ("▁word" is " word" mid-text).
        let anchor = tokenizer.encode("a")?.first().copied();
        let anchor_text = match anchor {
            Some(a) => tokenizer.decode(&[a])?,
            None => String::new(),
        };
        for id in 0..n as i64 {
            let text = match anchor {
                Some(a) => {
                    let both = tokenizer.decode(&[a, id])?;
                    match both.strip_prefix(anchor_text.as_str()) {
                        Some(rest) if !anchor_text.is_empty() => rest.to_string(),
                        _ => tokenizer.decode(&[id])?,
                    }
                }
                None => tokenizer.decode(&[id])?,
            };
            let usable = !text.is_empty() && !text.contains('\u{FFFD}');
            if usable {
                if let Some(c) = text.chars().next() {
                    by_first.entry(c).or_default().push(id);
                }
                texts.push(Some(text));
            } else {
                texts.push(None);
            }
        }
        Ok(TokenTable { texts, by_first })
    }

    /// The text of `id`.
    pub fn text(&self, id: i64) -> Option<&str> {
        self.texts.get(id as usize).and_then(|t| t.as_deref())
    }

    /// Sets the logits of tokens that cannot follow to -inf, using only their first character.
    pub fn mask_first_chars(&self, matcher: &JsonMatcher, logits: &mut [f32]) {
        self.mask_by_first_char(|c| matcher.allows_char(c), &[], logits);
    }

    /// Sets the logits of tokens whose first character `allows` refuses to -inf, except the ids
    /// in `keep` (an end-of-turn token where the grammar may end).
    pub fn mask_by_first_char(&self, allows: impl Fn(char) -> bool, keep: &[i64], logits: &mut [f32]) {
        let mut allowed = vec![false; logits.len()];
        for &id in keep {
            if let Some(a) = allowed.get_mut(id as usize) {
                *a = true;
            }
        }
        for (&c, ids) in &self.by_first {
            if allows(c) {
                for &id in ids {
                    if let Some(a) = allowed.get_mut(id as usize) {
                        *a = true;
                    }
                }
            }
        }
        for (l, a) in logits.iter_mut().zip(allowed) {
            if !a {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

/// Constrains a batch: sequence `i` follows `matchers[i]`.
#[derive(Debug)]
pub struct JsonConstraint<'a> {
    table: &'a TokenTable,
    matchers: Vec<JsonMatcher>,
    texts: Vec<String>,
}

impl<'a> JsonConstraint<'a> {
    /// One matcher per sequence.
    pub fn new(table: &'a TokenTable, matchers: Vec<JsonMatcher>) -> Self {
        let texts = vec![String::new(); matchers.len()];
        JsonConstraint { table, matchers, texts }
    }
}

impl Constraint for JsonConstraint<'_> {
    fn mask(&mut self, sequence: usize, logits: &mut [f32]) {
        if let Some(m) = self.matchers.get(sequence) {
            self.table.mask_first_chars(m, logits);
        }
    }

    fn allows(&mut self, sequence: usize, token: i64) -> bool {
        let (Some(m), Some(text)) = (self.matchers.get(sequence), self.table.text(token)) else { return false };
        m.after(text).is_some()
    }

    fn advance(&mut self, sequence: usize, token: i64) -> bool {
        let (Some(m), Some(text)) = (self.matchers.get_mut(sequence), self.table.text(token)) else { return true };
        if m.feed_str(text) {
            self.texts[sequence].push_str(text);
        }
        m.is_complete()
    }
}

/// A constrained output.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonOutput {
    /// The document's text.
    pub text: String,
    /// The document.
    pub value: Value,
    /// Tokens the model generated.
    pub generated_tokens: usize,
    /// Characters appended to close the document after the token budget ran out.
    pub completed_chars: usize,
}

impl Policy {
    /// Generates one JSON document per prompt, each following its grammar: every output parses and
    /// validates against its schema. The outer error is the batch's (bad prompts, the model); an
    /// inner one is a sequence's own, so one bad sequence does not cost the others.
    pub fn generate_json(
        &self,
        prompts: &[Vec<i64>],
        grammars: &[&JsonSchemaGrammar],
        table: &TokenTable,
        params: &SamplingParams,
    ) -> Result<Vec<Result<JsonOutput, PolicyError>>, PolicyError> {
        if prompts.len() != grammars.len() {
            return Err(PolicyError::Sampling(format!("{} prompts but {} grammars", prompts.len(), grammars.len())));
        }
        let matchers = grammars.iter().map(|g| g.matcher()).collect();
        let mut constraint = JsonConstraint::new(table, matchers);
        let (generations, _) = self.generate_with(prompts, params, None, Some(&mut constraint))?;
        let mut out = Vec::with_capacity(prompts.len());
        for (i, g) in generations.iter().enumerate() {
            let suffix = constraint.matchers[i].completion();
            let text = format!("{}{suffix}", constraint.texts[i]);
            let parsed = serde_json::from_str(&text)
                .map_err(|e| PolicyError::Sampling(format!("constrained output `{text}` is not JSON: {e}")));
            out.push(parsed.map(|value| JsonOutput {
                text,
                value,
                generated_tokens: g.output_ids.len(),
                completed_chars: suffix.len(),
            }));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn accepts(schema: Value, text: &str) -> bool {
        let g = JsonSchemaGrammar::compile(&schema).expect("compiles");
        let mut m = g.matcher();
        m.feed_str(text) && m.is_complete()
    }

    #[test]
    fn documents_follow_the_schema() {
        let s = json!({"type": "object", "properties": {
            "a": {"type": "integer", "minimum": 10, "maximum": 20},
            "b": {"type": "string", "maxLength": 3},
            "c": {"type": "boolean"}
        }, "required": ["a", "c"]});
        assert!(accepts(s.clone(), r#"{"a":15,"b":"xy","c":true}"#));
        assert!(accepts(s.clone(), r#"{"a":10,"c":false}"#));
        assert!(!accepts(s.clone(), r#"{"a":9,"c":false}"#));
        assert!(!accepts(s.clone(), r#"{"a":21,"c":false}"#));
        assert!(!accepts(s.clone(), r#"{"a":15,"b":"long","c":true}"#));
        assert!(!accepts(s.clone(), r#"{"c":true}"#));
        assert!(!accepts(s, r#"{"a":15}"#));
        let p = json!({"type": "string", "pattern": "^[A-Z]{2}-[0-9]+$"});
        assert!(accepts(p.clone(), r#""AB-12""#));
        assert!(!accepts(p, r#""ab-12""#));
        let n = json!({"type": "number", "exclusiveMinimum": 0, "maximum": 1});
        assert!(accepts(n.clone(), "0.5"));
        assert!(!accepts(n.clone(), "0"));
        assert!(!accepts(n, "1.5"));
    }

    #[test]
    fn completion_closes_any_prefix_validly() {
        let s = json!({"type": "object", "properties": {
            "items": {"type": "array", "items": {"type": "string", "pattern": "^id-[0-9]{3}$"}, "minItems": 2},
            "score": {"type": "number", "minimum": -5, "maximum": 5},
            "kind": {"enum": ["alpha", "beta"]}
        }, "required": ["items", "score", "kind"]});
        let g = JsonSchemaGrammar::compile(&s).expect("compiles");
        for prefix in [
            "",
            "{",
            r#"{"items":["id-"#,
            r#"{"items":["id-123","#,
            r#"{"items":["id-123","id-456"],"kind":"beta","score":-"#,
        ] {
            let mut m = g.matcher();
            assert!(m.feed_str(prefix), "{prefix}");
            let text = format!("{prefix}{}", m.completion());
            let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert!(value["items"].as_array().is_some_and(|a| a.len() >= 2), "{text}");
            assert!(value["kind"] == "alpha" || value["kind"] == "beta", "{text}");
        }
    }
}
