//! Native tool calls: the agent's trace grammar as OpenAI `tools`/`tool_calls` and back.
//!
//! The agent speaks one grammar in every mode: `<tool_call>` blocks in the assistant's turn, the
//! runtime's `<observation>`s in the next user message. Chat models tuned for function calling
//! call tools far more reliably through the API's own fields, so an OpenAI backend in native
//! mode rewrites the conversation before sending it ([`to_native`]: each run call becomes a
//! `tool_calls` entry and its observation a `tool` message) and rewrites the answer into one
//! grammar turn ([`from_native`]). The agent loop (plans, levels, memory, answers) never sees the
//! difference, and every mode maps onto the same two conversions: a ReAct or SEARL turn of calls,
//! a GAP plan turn (content only) and then a level of parallel calls, MemPO's `<mem>` kept in the
//! assistant's content.

use serde_json::{Map, Value, json};
use toolsmith_contract::Manifest;

use super::{Message, Role};
use crate::trace::{self, Block, Tag};

const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";
const OBSERVATION_OPEN: &str = "<observation>";
const OBSERVATION_CLOSE: &str = "</observation>";

/// The request's `tools`: every listed tool as an OpenAI function.
pub fn tools(manifests: &[Manifest]) -> Value {
    Value::Array(manifests.iter().map(Manifest::to_openai_function).collect())
}

/// The id of call `index` of assistant turn `turn` (both from 0). Ids only have to match
/// between an assistant message and its `tool` messages of one request, and a conversation is
/// rewritten whole for every request, so they are derived rather than stored.
pub fn call_id(turn: usize, index: usize) -> String {
    format!("call_{turn}_{index}")
}

/// A conversation in the trace grammar as OpenAI chat messages with native tool calls.
///
/// An assistant turn followed by the runtime's observations becomes an assistant message whose
/// well-formed `<tool_call>` blocks are `tool_calls` (the rest of its text, tags and all, the
/// `content`; `null` when nothing is left), then one `tool` message per call with the result as
/// JSON text, then a `user` message with the turn's error observations if there were any. A call
/// that did not parse stays in the content as written, since the model wrote it and was told it
/// was malformed. Every other message is sent as it is.
pub fn to_native(messages: &[Message]) -> Vec<Value> {
    let mut out = Vec::with_capacity(messages.len());
    let mut turn = 0;
    let mut i = 0;
    while i < messages.len() {
        let message = &messages[i];
        if message.role == Role::Assistant {
            let next = messages.get(i + 1).filter(|m| m.role == Role::User);
            let converted = next.and_then(|n| native_turn(turn, &message.content, &n.content));
            turn += 1;
            if let Some(converted) = converted {
                out.extend(converted);
                i += 2;
                continue;
            }
        }
        out.push(plain(message));
        i += 1;
    }
    out
}

/// A message as OpenAI takes it: role and content.
fn plain(message: &Message) -> Value {
    json!({ "role": message.role, "content": message.content })
}

/// One observation the runtime wrote.
#[derive(Debug)]
enum Observed {
    /// A call's result: `{"name": N, "result": R}`.
    Call { name: String, result: Value },
    /// An error of the turn, its line kept verbatim: `{"error": "..."}`.
    Error(String),
}

/// The observations of a user message, if it is exactly what `runner::observation` writes: one
/// `<observation>JSON</observation>` per line. Lines are the reliable boundary (compact JSON
/// never holds a raw newline, while a result's text may hold `</observation>`).
fn observations(text: &str) -> Option<Vec<Observed>> {
    text.split('\n')
        .map(|line| {
            let body = line.strip_prefix(OBSERVATION_OPEN)?.strip_suffix(OBSERVATION_CLOSE)?;
            let Value::Object(mut object) = serde_json::from_str::<Value>(body).ok()? else { return None };
            match (object.remove("name"), object.remove("result")) {
                (Some(Value::String(name)), Some(result)) if object.is_empty() => Some(Observed::Call { name, result }),
                (None, None) if object.len() == 1 && object.contains_key("error") => {
                    Some(Observed::Error(line.to_string()))
                }
                _ => None,
            }
        })
        .collect()
}

/// A well-formed call of an assistant turn and the byte span of its block.
#[derive(Debug)]
struct WrittenCall {
    name: String,
    arguments: Map<String, Value>,
    span: (usize, usize),
}

/// The well-formed `<tool_call>` blocks of `text`, in order, with their spans. The parser gives
/// each block's start; its end is the first `</tool_call>` after it (blocks do not nest, so the
/// parser closes it there too), or the end of the text for a block the turn never closed.
fn written_calls(text: &str) -> Vec<WrittenCall> {
    let turn = trace::parse(text);
    let starts = turn.blocks.iter().filter_map(|b| match b {
        Block::Tagged { tag: Tag::ToolCall, offset, .. } => Some(*offset),
        _ => None,
    });
    // `Turn::tool_calls` has one entry per `<tool_call>` block, in block order.
    starts
        .zip(turn.tool_calls())
        .filter_map(|(start, call)| {
            let call = call.ok()?;
            let content_start = start + CALL_OPEN.len();
            let end = text
                .get(content_start..)
                .and_then(|rest| rest.find(CALL_CLOSE))
                .map_or(text.len(), |at| content_start + at + CALL_CLOSE.len());
            Some(WrittenCall { name: call.name, arguments: call.arguments, span: (start, end) })
        })
        .collect()
}

/// `text` without the spans, each remaining piece trimmed, the non-empty ones on their own lines.
fn without_spans(text: &str, spans: &[(usize, usize)]) -> String {
    let mut pieces = Vec::new();
    let mut at = 0;
    for &(start, end) in spans {
        pieces.push(&text[at..start]);
        at = end;
    }
    pieces.push(&text[at..]);
    pieces.iter().map(|p| p.trim()).filter(|p| !p.is_empty()).collect::<Vec<_>>().join("\n")
}

/// Assistant turn `turn` and the user message after it as native messages, or `None` when the
/// turn ran no call or the message is not the runtime's observations of its calls (then both
/// are sent as they are).
fn native_turn(turn: usize, assistant: &str, user: &str) -> Option<Vec<Value>> {
    let calls = written_calls(assistant);
    if calls.is_empty() {
        return None;
    }
    let observed = observations(user)?;
    let mut results = Vec::new();
    let mut errors = Vec::new();
    for o in observed {
        match o {
            Observed::Call { name, result } => results.push((name, result)),
            Observed::Error(line) => errors.push(line),
        }
    }
    // The runtime observes the calls it ran in call order (ReAct runs only the first).
    if results.len() > calls.len() || results.iter().zip(&calls).any(|((name, _), call)| *name != call.name) {
        return None;
    }
    let spans: Vec<(usize, usize)> = calls.iter().map(|c| c.span).collect();
    let content = without_spans(assistant, &spans);
    let tool_calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({
                "id": call_id(turn, i),
                "type": "function",
                "function": {"name": c.name, "arguments": Value::Object(c.arguments.clone()).to_string()},
            })
        })
        .collect();
    let mut out = vec![json!({
        "role": "assistant",
        "content": if content.is_empty() { Value::Null } else { Value::String(content) },
        "tool_calls": tool_calls,
    })];
    for i in 0..calls.len() {
        // A call the runtime did not run (a ReAct turn's extra calls) still needs its answer:
        // endpoints refuse `tool_calls` left without one. The turn's errors say why.
        let content = results.get(i).map_or_else(|| json!({"error": "not run"}).to_string(), |(_, r)| r.to_string());
        out.push(json!({"role": "tool", "tool_call_id": call_id(turn, i), "content": content}));
    }
    if !errors.is_empty() {
        out.push(json!({"role": "user", "content": errors.join("\n")}));
    }
    Some(out)
}

/// The text of a response message's `content`: a string, a list of text parts
/// (`[{"type": "text", "text": ...}]`), or nothing (`null`, as with only tool calls).
pub fn content_text(content: Option<&Value>) -> Option<String> {
    match content? {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => Some(
            parts
                .iter()
                .filter_map(|p| match p {
                    Value::String(s) => Some(s.as_str()),
                    p => p.get("text").and_then(Value::as_str),
                })
                .collect(),
        ),
        _ => None,
    }
}

/// A response's message (`choices[0].message`) as one trace-grammar turn: its content, then a
/// `<tool_call>` block per native call, so the agent parses calls it did not have to write.
///
/// Arguments come as a JSON string; one that is not a JSON object is written as that string
/// (`"arguments": "RAW"`), which the grammar refuses, so the model is told its call was
/// malformed just as it would be for a malformed text call.
pub fn from_native(message: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(content) = content_text(message.get("content")) {
        let content = content.trim();
        if !content.is_empty() {
            parts.push(content.to_string());
        }
    }
    for call in message.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
        let function = call.get("function");
        let name = function.and_then(|f| f.get("name")).and_then(Value::as_str).unwrap_or_default();
        let arguments = match function.and_then(|f| f.get("arguments")) {
            Some(Value::String(raw)) if raw.trim().is_empty() => Value::Object(Map::new()),
            Some(Value::String(raw)) => match serde_json::from_str::<Value>(raw) {
                Ok(object @ Value::Object(_)) => object,
                _ => Value::String(raw.clone()),
            },
            // Some servers send the arguments as an object already.
            Some(object @ Value::Object(_)) => object.clone(),
            None | Some(Value::Null) => Value::Object(Map::new()),
            Some(other) => Value::String(other.to_string()),
        };
        let body = format!("{{\"name\": {}, \"arguments\": {arguments}}}", Value::String(name.to_string()));
        // `<` only occurs inside JSON strings, where `<\/` is the same text: a value holding
        // `</tool_call>` must not close the block early.
        parts.push(format!("{CALL_OPEN}{}{CALL_CLOSE}", body.replace("</", "<\\/")));
    }
    parts.join("\n")
}
