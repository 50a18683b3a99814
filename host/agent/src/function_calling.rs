//! Function calling as the served policy reads it: the system prompt a request's `tools` become,
//! a call in the trace grammar, and the schema of one call to any listed tool.
//!
//! `POST /v1/chat/completions` renders a request with `tools` through these functions, and
//! `toolsmith train tools` renders its training tasks through the same ones, so an adapter trained
//! on the tasks reads, at serving time, exactly the prompt it was trained on.

use serde_json::{Value, json};

use crate::ToolFormat;
use crate::backend::plain;
use crate::runner::{CALL_INSTRUCTIONS, tool_line};

/// The trace grammar's tag that opens a call.
pub const OPEN: &str = "<tool_call>";
/// The trace grammar's tag that closes a call.
pub const CLOSE: &str = "</tool_call>";
/// The system prompt's first line when a request brings no system message of its own.
pub const PREAMBLE: &str = "You answer questions with tools. Think in <think>...</think>.";

/// A function as a request lists it.
#[derive(Debug, Clone, Copy)]
pub struct Function<'a> {
    /// The name calls must give.
    pub name: &'a str,
    /// What it does.
    pub description: &'a str,
    /// The JSON Schema of its arguments.
    pub parameters: &'a Value,
}

/// The system prompt's tool section: the agent's call instructions and its listing.
pub fn tool_section(tools: &[Function<'_>]) -> String {
    let mut s = format!("{CALL_INSTRUCTIONS} Several calls in one turn run in parallel.\nTools:\n");
    for t in tools {
        s.push_str(&plain(&tool_line(t.name, t.description, t.parameters, ToolFormat::Compact)));
        s.push('\n');
    }
    s
}

/// The whole system prompt of a request without a system message of its own.
pub fn system_prompt(tools: &[Function<'_>]) -> String {
    format!("{PREAMBLE} {}", tool_section(tools))
}

/// A call as the agent writes it (keys in the order the trace's JSON has them).
pub fn call_text(name: &str, arguments: &Value) -> String {
    format!("{OPEN}{}{CLOSE}", json!({"name": name, "arguments": arguments}))
}

/// A tool's answer as the observation turn shows it (a result that is JSON is shown as JSON).
pub fn observation_text(name: &str, result: &Value) -> String {
    format!("<observation>{}</observation>", plain(&json!({"name": name, "result": result}).to_string()))
}

/// The schema of one call to any of `tools`, as the agent writes calls.
pub fn call_schema(tools: &[Function<'_>]) -> Value {
    let branches: Vec<Value> = tools
        .iter()
        .map(|t| {
            json!({"type": "object",
                   "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                   "required": ["name", "arguments"]})
        })
        .collect();
    json!({ "anyOf": branches })
}
