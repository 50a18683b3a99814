//! The model's turn as OpenAI's assistant message: text outside `<tool_call>` blocks is
//! `content`, each block that holds a call to a listed tool with valid arguments is an entry of
//! `tool_calls`, and a block that does not (possible only where calls were decoded without the
//! grammar) stays in `content` and is reported in `toolsmith.invalid_tool_calls`.
//!
//! One [`TurnParser`] reads a streamed turn piece by piece and a whole turn at once, so what a
//! stream sends adds up to the answer without streaming, by construction.

use serde_json::{Value, json};

use super::request::{CLOSE, OPEN, Tool};

/// A call the client receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// Its position in the turn's `tool_calls`.
    pub index: usize,
    /// The call's id, unique to the request and choice (the client answers with it).
    pub id: String,
    /// The listed tool it calls.
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

impl Call {
    /// The `tool_calls` entry.
    pub fn to_json(&self) -> Value {
        json!({"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}})
    }
}

/// What the turn adds next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Text outside calls (a rejected block included), to send as `content`.
    Content(String),
    /// A valid call of a listed tool, to send as a `tool_calls` entry.
    Call(Call),
}

/// A block that is not a valid call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// The block as written.
    pub text: String,
    /// Why it is not a call (not closed, no such tool, arguments that do not fit), for clients.
    pub error: String,
}

/// Reads one turn.
#[derive(Debug)]
pub struct TurnParser<'a> {
    tools: &'a [Tool],
    /// Prefix of call ids, unique to the request and choice.
    ids: String,
    /// Bytes of the text read.
    cursor: usize,
    /// Trailing whitespace of the text outside calls, not sent yet.
    held: String,
    calls: usize,
    /// The blocks read so far that were not valid calls (they went out as content).
    pub invalid: Vec<Invalid>,
}

/// The longest end of `text` that begins `tag` without being all of it.
fn partial_tag(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && tag.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

impl<'a> TurnParser<'a> {
    /// A parser for a turn that may call `tools`; call ids start with `ids`.
    pub fn new(tools: &'a [Tool], ids: impl Into<String>) -> Self {
        TurnParser { tools, ids: ids.into(), cursor: 0, held: String::new(), calls: 0, invalid: Vec::new() }
    }

    /// Calls read so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Reads `text`, the turn so far (each call with the text before extended), and returns what
    /// it adds; `finished` when the turn is whole.
    pub fn push(&mut self, text: &str, finished: bool) -> Vec<Event> {
        let mut events = Vec::new();
        if self.tools.is_empty() {
            // No tools: all of it is content.
            if text.len() > self.cursor {
                events.push(Event::Content(text[self.cursor..].to_string()));
                self.cursor = text.len();
            }
            return events;
        }
        loop {
            let rest = &text[self.cursor..];
            match rest.find(OPEN) {
                Some(at) => {
                    let body_start = self.cursor + at + OPEN.len();
                    let Some(close) = text[body_start..].find(CLOSE) else {
                        // A call being written: the text before it is final.
                        self.outside(&rest[..at], &mut events);
                        self.cursor += at;
                        if finished {
                            let raw = text[self.cursor..].to_string();
                            self.reject(raw, "the call is not closed with </tool_call>".into(), &mut events);
                            self.cursor = text.len();
                        }
                        break;
                    };
                    self.outside(&rest[..at], &mut events);
                    let end = body_start + close + CLOSE.len();
                    let raw = &text[self.cursor + at..end];
                    match self.call(&text[body_start..body_start + close]) {
                        Ok(call) => {
                            self.calls += 1;
                            events.push(Event::Call(call));
                        }
                        Err(error) => self.reject(raw.to_string(), error, &mut events),
                    }
                    self.cursor = end;
                }
                None => {
                    // Hold back what may be the start of a tag, until the turn is whole.
                    let keep = if finished { 0 } else { partial_tag(rest, OPEN) };
                    let upto = rest.len() - keep;
                    self.outside(&rest[..upto], &mut events);
                    self.cursor += upto;
                    if finished {
                        self.held.clear();
                    }
                    break;
                }
            }
        }
        events
    }

    /// Text outside any call. Trailing whitespace is held until text that is not whitespace
    /// follows (calls are separated by newlines, which are not content, and a turn's content
    /// does not end in them), so the content a stream sends depends only on the text, never on
    /// where the pieces were cut.
    fn outside(&mut self, text: &str, events: &mut Vec<Event>) {
        self.held.push_str(text);
        let end = self.held.trim_end().len();
        if end > 0 {
            let rest = self.held.split_off(end);
            events.push(Event::Content(std::mem::replace(&mut self.held, rest)));
        }
    }

    fn reject(&mut self, raw: String, error: String, events: &mut Vec<Event>) {
        let held = std::mem::take(&mut self.held);
        events.push(Event::Content(format!("{held}{raw}")));
        self.invalid.push(Invalid { text: raw, error });
    }

    /// A block's call, checked against the listed tools.
    fn call(&self, body: &str) -> Result<Call, String> {
        let value: Value = serde_json::from_str(body.trim()).map_err(|e| format!("the call is not JSON: {e}"))?;
        let Some(name) = value.get("name").and_then(Value::as_str) else {
            return Err("the call has no \"name\"".into());
        };
        let Some(tool) = self.tools.iter().find(|t| t.name == name) else {
            return Err(format!("`{name}` is not a listed tool"));
        };
        let arguments = value.get("arguments").cloned().unwrap_or_else(|| json!({}));
        if !arguments.is_object() {
            return Err(format!("the arguments of `{name}` are not a JSON object"));
        }
        let errors: Vec<String> = tool.validator.iter_errors(&arguments).map(|e| e.to_string()).collect();
        if !errors.is_empty() {
            return Err(format!("the arguments of `{name}` do not match its parameters: {}", errors.join("; ")));
        }
        Ok(Call {
            index: self.calls,
            id: format!("{}{}", self.ids, self.calls),
            name: name.to_string(),
            arguments: arguments.to_string(),
        })
    }
}

/// A whole turn: its content (`None` when it is empty) and its calls.
pub fn parse_turn(tools: &[Tool], ids: &str, text: &str) -> (Option<String>, Vec<Call>, Vec<Invalid>) {
    let mut parser = TurnParser::new(tools, ids);
    let mut content = String::new();
    let mut calls = Vec::new();
    for event in parser.push(text, true) {
        match event {
            Event::Content(c) => content.push_str(&c),
            Event::Call(c) => calls.push(c),
        }
    }
    ((!content.is_empty()).then_some(content), calls, parser.invalid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn tools() -> Vec<Tool> {
        let parameters = json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
        vec![Tool {
            name: "math.factorial".into(),
            description: String::new(),
            validator: Arc::new(jsonschema::validator_for(&parameters).expect("schema")),
            parameters,
            strict: false,
        }]
    }

    #[test]
    fn content_calls_and_invalid_calls_are_told_apart() {
        let tools = tools();
        let text = concat!(
            "Let me see.\n",
            r#"<tool_call>{"arguments":{"n":5},"name":"math.factorial"}</tool_call>"#,
            "\n",
            r#"<tool_call>{"arguments":{"n":"five"},"name":"math.factorial"}</tool_call>"#,
            "\n",
            r#"<tool_call>{"name": "math.factorial", "arguments": {"n": 3}}</tool_call>"#,
            "\n"
        );
        let (content, calls, invalid) = parse_turn(&tools, "call_x_", text);
        assert_eq!(calls.len(), 2);
        assert_eq!(
            calls[0],
            Call { index: 0, id: "call_x_0".into(), name: "math.factorial".into(), arguments: r#"{"n":5}"#.into() }
        );
        assert_eq!(calls[1].arguments, r#"{"n":3}"#);
        assert_eq!(invalid.len(), 1);
        assert!(invalid[0].error.contains("do not match"), "{}", invalid[0].error);
        let content = content.expect("content");
        assert!(content.starts_with("Let me see.\n") && content.contains(r#""n":"five""#), "{content}");
    }

    #[test]
    fn streamed_pieces_add_up_to_the_whole_turn() {
        let tools = tools();
        let text = "Hmm <tool_cal is not a tag. <tool_call>{\"arguments\":{\"n\":2},\"name\":\"math.factorial\"}</tool_call>\n\n";
        let whole = parse_turn(&tools, "id", text);
        for step in [1, 3, 7] {
            let mut parser = TurnParser::new(&tools, "id");
            let (mut content, mut calls) = (String::new(), Vec::new());
            let mut end = 0;
            while end < text.len() {
                end = (end + step).min(text.len());
                while !text.is_char_boundary(end) {
                    end += 1;
                }
                for e in parser.push(&text[..end], false) {
                    match e {
                        Event::Content(c) => content.push_str(&c),
                        Event::Call(c) => calls.push(c),
                    }
                }
            }
            for e in parser.push(text, true) {
                match e {
                    Event::Content(c) => content.push_str(&c),
                    Event::Call(c) => calls.push(c),
                }
            }
            assert_eq!((Some(content), calls), (whole.0.clone(), whole.1.clone()), "step {step}");
        }
    }
}
