//! Conversations to train on.
//!
//! A line of a data file is one conversation, in either form:
//! - Toolsmith's (what `toolsmith world traces` writes): `{"messages": [{"role", "content"}], ...}`
//!   with roles `system`, `user` and `assistant`; observations are `user` turns, as the agent
//!   loop shows them to the model;
//! - OpenAI's: the same `messages`, where an assistant turn may carry `tool_calls` and tool
//!   results come as `tool` turns. They are converted to the trace grammar the agent speaks:
//!   each call becomes `<tool_call>{"name", "arguments"}</tool_call>` after the assistant's text,
//!   and consecutive `tool` turns become one observation turn of `<observation>` blocks.
//!
//! A bare JSON array of messages is accepted too. A turn's content can also be token ids
//! ([`Content::Ids`]): the exact ids a rollout generated, which the trainer must never
//! re-tokenise.

use std::path::Path;

use serde_json::{Value, json};
use toolsmith_agent::backend::{Message, Role};

use crate::TrainError;

/// What a turn says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// Text, tokenized with the rest of the conversation.
    Text(String),
    /// Token ids taken as they are (a sampled assistant turn, without its end-of-turn token).
    Ids(Vec<i64>),
}

/// One turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    /// Who speaks. Tool observations are `user` turns, as the agent loop shows them.
    pub role: Role,
    /// What is said.
    pub content: Content,
}

/// A conversation: system, user, assistant and observation turns in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chat {
    /// The turns.
    pub turns: Vec<Turn>,
}

impl Chat {
    /// A conversation of text messages.
    pub fn from_messages(messages: &[Message]) -> Self {
        Chat {
            turns: messages.iter().map(|m| Turn { role: m.role, content: Content::Text(m.content.clone()) }).collect(),
        }
    }

    /// Checks what every trainable conversation needs: at least one assistant turn, and no
    /// empty one.
    pub fn validate(&self) -> Result<(), String> {
        let mut assistant = 0;
        for (i, turn) in self.turns.iter().enumerate() {
            if turn.role != Role::Assistant {
                continue;
            }
            assistant += 1;
            let empty = match &turn.content {
                Content::Text(t) => t.trim().is_empty(),
                Content::Ids(ids) => ids.is_empty(),
            };
            if empty {
                return Err(format!("message {i} is an empty assistant turn: there is nothing to learn from it"));
            }
        }
        if assistant == 0 {
            return Err("no assistant turn: there is nothing to train on".into());
        }
        Ok(())
    }
}

/// Reads every conversation of a JSON-lines file, with its 1-based line number. Blank lines are
/// skipped; any other line that is not a conversation is an error naming the file and line.
pub fn read_chats(path: &Path) -> Result<Vec<(usize, Chat)>, TrainError> {
    let text = read_regular_file(path)?;
    let mut chats = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |message: String| TrainError::Data { path: path.to_owned(), line: i + 1, message };
        let value: Value = serde_json::from_str(line).map_err(|e| bad(format!("not JSON: {e}")))?;
        let chat = parse_chat(&value).map_err(bad)?;
        chat.validate().map_err(bad)?;
        chats.push((i + 1, chat));
    }
    Ok(chats)
}

/// Reads a regular file whole. It is opened without blocking and checked before a byte is
/// read: a FIFO or a device named as a data file is refused at once, where a plain read would
/// hang the run (and whatever waits for it) until someone wrote to the other end.
pub fn read_regular_file(path: &Path) -> Result<String, TrainError> {
    use std::io::Read;
    #[cfg(unix)]
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)
    };
    #[cfg(not(unix))]
    let file = std::fs::File::open(path);
    let mut file = file.map_err(|e| TrainError::io(path, e))?;
    let meta = file.metadata().map_err(|e| TrainError::io(path, e))?;
    if !meta.is_file() {
        let e = std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file");
        return Err(TrainError::io(path, e));
    }
    let mut text = String::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.read_to_string(&mut text).map_err(|e| TrainError::io(path, e))?;
    Ok(text)
}

/// Parses one conversation (`{"messages": [...]}` or a bare array).
pub fn parse_chat(value: &Value) -> Result<Chat, String> {
    let messages = match value {
        Value::Array(m) => m,
        Value::Object(o) => o
            .get("messages")
            .and_then(Value::as_array)
            .ok_or("expected {\"messages\": [...]} or an array of messages")?,
        _ => return Err("expected {\"messages\": [...]} or an array of messages".into()),
    };
    let mut turns: Vec<Turn> = Vec::new();
    // Consecutive tool results become one observation turn.
    let mut observations: Vec<String> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).ok_or_else(|| format!("message {i} has no \"role\""))?;
        if role != "tool" && !observations.is_empty() {
            turns.push(Turn { role: Role::User, content: Content::Text(observations.join("\n")) });
            observations.clear();
        }
        let content = match m.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            // OpenAI's content parts: keep the text parts.
            Some(Value::Array(parts)) => parts
                .iter()
                .map(|p| {
                    p.get("text")
                        .and_then(Value::as_str)
                        .ok_or_else(|| format!("message {i}: a content part without \"text\""))
                })
                .collect::<Result<Vec<_>, _>>()?
                .join(""),
            Some(other) => return Err(format!("message {i}: content must be a string, got {other}")),
        };
        match role {
            "system" => turns.push(Turn { role: Role::System, content: Content::Text(content) }),
            "user" => turns.push(Turn { role: Role::User, content: Content::Text(content) }),
            "assistant" => {
                let mut text = content;
                for call in m.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
                    text.push_str(&tool_call_block(call).map_err(|e| format!("message {i}: {e}"))?);
                }
                turns.push(Turn { role: Role::Assistant, content: Content::Text(text) });
            }
            "tool" => {
                let name = m.get("name").and_then(Value::as_str).unwrap_or("tool");
                // Results are JSON where they parse, as the agent loop shows them.
                let result = serde_json::from_str::<Value>(&content).unwrap_or(Value::String(content));
                observations.push(format!("<observation>{}</observation>", json!({"name": name, "result": result})));
            }
            other => {
                return Err(format!("message {i} has the unknown role {other:?} (system, user, assistant or tool)"));
            }
        }
    }
    if !observations.is_empty() {
        turns.push(Turn { role: Role::User, content: Content::Text(observations.join("\n")) });
    }
    Ok(Chat { turns })
}

/// `<tool_call>{"name", "arguments"}</tool_call>` from an OpenAI tool call (whose arguments are a
/// JSON string, or an object).
fn tool_call_block(call: &Value) -> Result<String, String> {
    let function = call.get("function").unwrap_or(call);
    let name = function.get("name").and_then(Value::as_str).ok_or("a tool call without a function name")?;
    let arguments = match function.get("arguments") {
        Some(Value::String(s)) => {
            serde_json::from_str::<Value>(s).map_err(|e| format!("tool call {name}: arguments are not JSON: {e}"))?
        }
        Some(v) => v.clone(),
        None => json!({}),
    };
    Ok(format!("<tool_call>{}</tool_call>", json!({"name": name, "arguments": arguments})))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FIFO named as a data file (or put in a checked file's place) is refused at once: the
    /// read must not wait for a writer that never comes.
    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("data.jsonl");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo").success());
        let (done, finished) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || {
            let _ = done.send(read_chats(&path).map(|c| c.len()).map_err(|e| e.to_string()));
        });
        let outcome = finished.recv_timeout(std::time::Duration::from_secs(20)).expect("the read blocked on a FIFO");
        let error = outcome.expect_err("a FIFO is not data");
        assert!(error.contains("not a regular file"), "{error}");
    }

    fn text(turn: &Turn) -> &str {
        match &turn.content {
            Content::Text(t) => t,
            Content::Ids(_) => panic!("ids"),
        }
    }

    #[test]
    fn openai_tool_calls_become_the_trace_grammar() {
        let chat = parse_chat(&json!({"messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "search", "arguments": "{\"query\": \"x\"}"}},
                {"id": "b", "type": "function", "function": {"name": "search", "arguments": "{\"query\": \"y\"}"}}]},
            {"role": "tool", "tool_call_id": "a", "name": "search", "content": "{\"hits\": 1}"},
            {"role": "tool", "tool_call_id": "b", "content": "plain"},
            {"role": "assistant", "content": "<answer>\\boxed{1}</answer>"}
        ]}))
        .expect("parses");
        assert_eq!(chat.turns.len(), 5);
        assert_eq!(
            text(&chat.turns[2]),
            r#"<tool_call>{"arguments":{"query":"x"},"name":"search"}</tool_call><tool_call>{"arguments":{"query":"y"},"name":"search"}</tool_call>"#
        );
        assert_eq!(chat.turns[3].role, Role::User);
        assert_eq!(
            text(&chat.turns[3]),
            "<observation>{\"name\":\"search\",\"result\":{\"hits\":1}}</observation>\n<observation>{\"name\":\"tool\",\"result\":\"plain\"}</observation>"
        );
        chat.validate().expect("valid");
    }

    #[test]
    fn bad_conversations_say_what_is_wrong() {
        let unknown = parse_chat(&json!([{"role": "robot", "content": "x"}])).expect_err("unknown role");
        assert!(unknown.contains("unknown role \"robot\""), "{unknown}");
        let empty = parse_chat(&json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": "  "}]))
            .expect("parses")
            .validate()
            .expect_err("empty turn");
        assert!(empty.contains("empty assistant turn"), "{empty}");
        let none =
            parse_chat(&json!([{"role": "user", "content": "q"}])).expect("parses").validate().expect_err("none");
        assert!(none.contains("no assistant turn"), "{none}");
        let args =
            parse_chat(&json!([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}]))
                .expect_err("bad arguments");
        assert!(args.contains("arguments are not JSON"), "{args}");
    }
}
