//! The grammar of a whole assistant turn: free text, tool calls in the trace grammar's
//! `<tool_call>{json}</tool_call>` blocks, or one JSON document (structured output), decoded
//! token by token so that what is constrained is always well formed.
//!
//! A [`TurnGrammar`] says what a turn may be; a [`TurnMatcher`] follows one turn character by
//! character; a [`TurnConstraint`] applies matchers to the rows of a batch, leaving rows without
//! one free. The JSON inside a call follows a [`JsonSchemaGrammar`] (in practice an `anyOf` of
//! `{"name": const, "arguments": schema}`, one branch per tool), so a call's name is a listed
//! tool and its arguments validate. Between and after calls only whitespace and the next call's
//! tag may follow, so a turn of calls cannot trail off into a made-up observation.

use std::sync::Arc;

use crate::constrain::{JsonMatcher, JsonSchemaGrammar, TokenTable};
use crate::generate::Constraint;

/// What a turn may be.
#[derive(Debug, Clone)]
pub enum TurnGrammar {
    /// One JSON document and nothing else (`response_format`).
    Json(JsonSchemaGrammar),
    /// Text and tool calls.
    Calls(CallRules),
}

/// How a turn may call tools.
#[derive(Debug, Clone)]
pub struct CallRules {
    /// The JSON of one call; `None` leaves calls free (they are checked after decoding).
    pub call: Option<JsonSchemaGrammar>,
    /// Whether text may come before the first call (`tool_choice: "auto"` and `"none"`); without
    /// it the turn opens with a call.
    pub text_first: bool,
    /// Calls the turn must make before it may end.
    pub min_calls: usize,
    /// Calls it may make at most (0: none, 1: `parallel_tool_calls: false`).
    pub max_calls: usize,
    /// The tag that opens a call.
    pub open: String,
    /// The tag that closes one.
    pub close: String,
}

impl CallRules {
    /// Rules with the trace grammar's tags.
    pub fn new(call: Option<JsonSchemaGrammar>, text_first: bool, min_calls: usize, max_calls: usize) -> Self {
        CallRules { call, text_first, min_calls, max_calls, open: "<tool_call>".into(), close: "</tool_call>".into() }
    }
}

/// Whitespace allowed between two calls.
const MAX_GAP: usize = 2;

#[derive(Debug, Clone)]
enum State {
    /// Free text before any call; `tail` is the longest end of it that begins the open tag.
    Text { tail: String },
    /// After a call (or at the start of a turn that must open with one): up to [`MAX_GAP`]
    /// whitespace characters, then `pos` bytes of the open tag.
    Between { gap: usize, pos: usize },
    /// Inside a call's JSON, under the grammar.
    Call(Box<JsonMatcher>),
    /// Inside a call left free; `tail` as in [`State::Text`], for the close tag.
    FreeCall { tail: String },
    /// `pos` bytes of the close tag written.
    Close { pos: usize },
    /// Inside a JSON document (structured output).
    Json(Box<JsonMatcher>),
    /// Nothing more may be written.
    Done,
}

/// One turn's progress through a [`TurnGrammar`].
#[derive(Debug, Clone)]
pub struct TurnMatcher {
    grammar: Arc<TurnGrammar>,
    state: State,
    calls: usize,
}

/// The longest end of `text` + `c` that begins `tag`, and whether it is the whole tag.
fn track(tail: &str, c: char, tag: &str) -> (String, bool) {
    let mut candidate = format!("{tail}{c}");
    while !tag.starts_with(&candidate) {
        let mut chars = candidate.chars();
        chars.next();
        candidate = chars.as_str().to_string();
    }
    let whole = candidate == tag;
    (candidate, whole)
}

impl TurnMatcher {
    /// A matcher at the start of a turn.
    pub fn new(grammar: Arc<TurnGrammar>) -> Self {
        let state = match &*grammar {
            TurnGrammar::Json(g) => State::Json(Box::new(g.matcher())),
            TurnGrammar::Calls(r) if r.text_first || r.max_calls == 0 => State::Text { tail: String::new() },
            TurnGrammar::Calls(_) => State::Between { gap: 0, pos: 0 },
        };
        TurnMatcher { grammar, state, calls: 0 }
    }

    fn rules(&self) -> Option<&CallRules> {
        match &*self.grammar {
            TurnGrammar::Calls(r) => Some(r),
            TurnGrammar::Json(_) => None,
        }
    }

    /// Calls closed so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// The state after a call's open tag.
    fn call_opened(&self) -> State {
        match self.rules().and_then(|r| r.call.as_ref()) {
            Some(g) => State::Call(Box::new(g.matcher())),
            None => State::FreeCall { tail: String::new() },
        }
    }

    /// The state after a call's close tag.
    fn call_closed(&mut self) -> State {
        self.calls += 1;
        match self.rules() {
            Some(r) if self.calls < r.max_calls => State::Between { gap: 0, pos: 0 },
            _ => State::Done,
        }
    }

    /// Feeds one character; false (and the matcher unchanged) when the grammar refuses it.
    fn step(&mut self, c: char) -> bool {
        let grammar = self.grammar.clone();
        let rules = match &*grammar {
            TurnGrammar::Calls(rules) => rules,
            TurnGrammar::Json(_) => {
                // Structured output: the document, then nothing.
                let State::Json(m) = &mut self.state else { return false };
                if !m.feed_str(c.encode_utf8(&mut [0; 4])) {
                    return false;
                }
                if m.is_closed() {
                    self.state = State::Done;
                }
                return true;
            }
        };
        let next = match &self.state {
            State::Text { tail } => {
                let (tail, whole) = track(tail, c, &rules.open);
                if !whole {
                    State::Text { tail }
                } else if self.calls < rules.max_calls {
                    self.call_opened()
                } else {
                    return false;
                }
            }
            State::Between { gap, pos } => {
                let (gap, pos) = (*gap, *pos);
                if pos == 0 && c.is_whitespace() && gap < MAX_GAP {
                    State::Between { gap: gap + 1, pos }
                } else if rules.open[pos..].starts_with(c) {
                    let pos = pos + c.len_utf8();
                    if pos == rules.open.len() { self.call_opened() } else { State::Between { gap, pos } }
                } else {
                    return false;
                }
            }
            State::Call(m) => {
                let mut m = m.clone();
                if m.feed_str(c.encode_utf8(&mut [0; 4])) {
                    State::Call(m)
                } else if m.is_complete() && rules.close.starts_with(c) {
                    State::Close { pos: c.len_utf8() }
                } else {
                    return false;
                }
            }
            State::FreeCall { tail } => {
                let (tail, whole) = track(tail, c, &rules.close);
                if whole { self.call_closed() } else { State::FreeCall { tail } }
            }
            State::Close { pos } => {
                if !rules.close[*pos..].starts_with(c) {
                    return false;
                }
                let pos = pos + c.len_utf8();
                if pos == rules.close.len() { self.call_closed() } else { State::Close { pos } }
            }
            State::Json(_) | State::Done => return false,
        };
        self.state = next;
        true
    }

    /// Feeds `text`; false (and the matcher unchanged) when any of it is refused.
    pub fn feed(&mut self, text: &str) -> bool {
        let before = self.clone();
        for c in text.chars() {
            if !self.step(c) {
                *self = before;
                return false;
            }
        }
        true
    }

    /// Whether `c` may come next. The mask asks this for every first character of the
    /// vocabulary at every step, so the JSON states answer without cloning the matcher.
    pub fn allows_char(&self, c: char) -> bool {
        match (&self.state, self.rules()) {
            (State::Call(m), Some(r)) => m.allows_char(c) || (r.close.starts_with(c) && m.is_complete()),
            (State::Json(m), _) => m.allows_char(c),
            _ => self.clone().step(c),
        }
    }

    /// Whether `text` may come next.
    pub fn allows(&self, text: &str) -> bool {
        self.clone().feed(text)
    }

    /// Whether the turn may end here (an end-of-turn token may be sampled).
    pub fn may_end(&self) -> bool {
        let min = self.rules().map_or(0, |r| r.min_calls);
        match &self.state {
            State::Text { .. } => self.calls >= min,
            State::Between { pos: 0, .. } => self.calls >= min,
            State::Done => true,
            State::Json(m) => m.is_complete(),
            _ => false,
        }
    }

    /// Whether nothing more may be written.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Whether any text may follow for now (free text or a free call), so no mask applies.
    fn is_free(&self) -> bool {
        matches!(self.state, State::Text { .. } | State::FreeCall { .. })
    }

    /// Text that ends the turn validly from here when the token budget ran out (the rest of an
    /// open call or document); `None` when the turn cannot be closed (a free call, or calls
    /// still owed).
    pub fn closing(&self) -> Option<String> {
        let rules = self.rules();
        let min = rules.map_or(0, |r| r.min_calls);
        match &self.state {
            State::Text { .. } | State::Between { pos: 0, .. } if self.calls >= min => Some(String::new()),
            State::Done => Some(String::new()),
            State::Json(m) => Some(m.completion()),
            State::Call(m) => {
                let close = rules.map_or("", |r| r.close.as_str());
                let rest = m.completion();
                (self.calls + 1 >= min).then(|| format!("{rest}{close}"))
            }
            State::Close { pos } => {
                let close = rules.map_or("", |r| r.close.as_str());
                (self.calls + 1 >= min).then(|| close[*pos..].to_string())
            }
            _ => None,
        }
    }
}

/// Constrains a batch: row `i` follows `rows[i]`, or decodes freely when it is `None`.
#[derive(Debug)]
pub struct TurnConstraint<'a> {
    table: &'a TokenTable,
    end_ids: &'a [i64],
    rows: Vec<Option<TurnMatcher>>,
}

impl<'a> TurnConstraint<'a> {
    /// `end_ids`: the tokens that end a turn (the tokenizer's end-of-sequence ids).
    pub fn new(table: &'a TokenTable, end_ids: &'a [i64], rows: Vec<Option<TurnMatcher>>) -> Self {
        TurnConstraint { table, end_ids, rows }
    }

    /// The matchers, advanced past what was decoded.
    pub fn into_rows(self) -> Vec<Option<TurnMatcher>> {
        self.rows
    }
}

impl Constraint for TurnConstraint<'_> {
    fn mask(&mut self, sequence: usize, logits: &mut [f32]) {
        let Some(Some(m)) = self.rows.get(sequence) else { return };
        if m.is_free() {
            return;
        }
        let keep: &[i64] = if m.may_end() { self.end_ids } else { &[] };
        self.table.mask_by_first_char(|c| m.allows_char(c), keep, logits);
    }

    fn allows(&mut self, sequence: usize, token: i64) -> bool {
        let Some(Some(m)) = self.rows.get(sequence) else { return true };
        if self.end_ids.contains(&token) {
            return m.may_end();
        }
        match self.table.text(token) {
            Some(text) => m.allows(text),
            // Special tokens and pieces of characters: only in free text.
            None => m.is_free(),
        }
    }

    fn advance(&mut self, sequence: usize, token: i64) -> bool {
        let Some(Some(m)) = self.rows.get_mut(sequence) else { return false };
        // An end token ends the turn as an end token (the caller's `Eos`), not as the grammar's.
        if self.end_ids.contains(&token) {
            return false;
        }
        if let Some(text) = self.table.text(token) {
            m.feed(text);
        }
        m.is_done()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn weather() -> JsonSchemaGrammar {
        JsonSchemaGrammar::compile(&json!({"anyOf": [{
            "type": "object",
            "properties": {
                "name": {"const": "get_weather"},
                "arguments": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]},
            },
            "required": ["name", "arguments"],
        }]}))
        .expect("compiles")
    }

    fn matcher(rules: CallRules) -> TurnMatcher {
        TurnMatcher::new(Arc::new(TurnGrammar::Calls(rules)))
    }

    #[test]
    fn a_required_call_opens_the_turn_and_follows_the_schema() {
        let m = matcher(CallRules::new(Some(weather()), false, 1, 1));
        assert!(!m.may_end(), "a required call is owed");
        assert!(!m.allows("hello"), "no text before a required call");
        let call = r#"<tool_call>{"arguments":{"city":"Oslo"},"name":"get_weather"}</tool_call>"#;
        let mut done = m.clone();
        assert!(done.feed(call));
        assert!(done.is_done() && done.may_end() && done.calls() == 1);
        assert!(!m.allows(r#"<tool_call>{"arguments":{"town":"#), "unknown argument");
        assert!(!m.allows(r#"<tool_call>{"arguments":{"city":"Oslo"},"name":"get_time"#), "unknown tool");
        let mut partial = m.clone();
        assert!(partial.feed(r#"<tool_call>{"arguments":{"ci"#));
        let closing = partial.closing().expect("an open call can be closed");
        assert!(partial.feed(&closing) && partial.is_done(), "{closing}");
    }

    #[test]
    fn auto_allows_text_then_calls_and_none_forbids_the_tag() {
        let mut auto = matcher(CallRules::new(Some(weather()), true, 0, usize::MAX));
        assert!(auto.may_end());
        assert!(auto.feed("I will check. <tool_call>"));
        assert!(!auto.may_end(), "inside a call");
        assert!(!auto.allows("{\"x\""), "the call follows the schema once opened");
        assert!(auto.feed(r#"{"arguments":{"city":"Rome"},"name":"get_weather"}</tool_call>"#));
        assert!(auto.may_end() && !auto.is_done());
        assert!(!auto.allows("more text"), "only another call may follow a call");
        assert!(auto.feed("\n<tool_call>"));
        let none = matcher(CallRules::new(None, true, 0, 0));
        assert!(none.allows("a <tool_cal"));
        assert!(!none.allows("a <tool_call>"), "tool_choice none refuses the tag");
    }

    #[test]
    fn one_call_at_most_ends_the_turn_after_it() {
        let mut one = matcher(CallRules::new(None, true, 0, 1));
        assert!(one.feed(r#"x<tool_call>{"anything": [1}</tool_call>"#), "a free call is not checked here");
        assert!(one.is_done());
        assert!(!one.allows("\n"));
    }

    #[test]
    fn a_document_turn_ends_with_the_document() {
        let mut m = TurnMatcher::new(Arc::new(TurnGrammar::Json(JsonSchemaGrammar::any_object())));
        assert!(!m.allows("text"));
        assert!(m.feed(r#"{"a":[1,"b"],"c":{"d":null}}"#));
        assert!(m.is_done() && m.may_end());
    }
}
