//! The trace grammar: one tagged format for every method (GAP, ReAct, MemPO, SEARL).
//!
//! A turn is text with blocks: `<think>`, `<plan>`, `<graph>`, `<subtask>`, `<tool_call>{json}
//! </tool_call>` (several in one turn run in parallel), `<observation>`, `<mem>`, `<reflection>`,
//! `<answer>` (with `\boxed{}` extraction). Blocks do not nest (a `<graph>` holds `<node>`s, which
//! the plan parser reads). Anything outside a block is text; SEARL's `##DAG_LIST` plans may be
//! written there. Parsing never fails: problems are collected as [`TraceError`]s, which the agent
//! is shown as an observation so it can correct itself.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::plan::{self, Plan, PlanError};

/// The tags of the grammar (the tiny tokenizer has each as one token).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tag {
    /// Reasoning the runner keeps in the context but never acts on.
    Think,
    /// GAP's `Task N: ... - Dependencies: ...` lines, parsed into a [`Plan`].
    Plan,
    /// GAP's `<node id depends>` graph, the other way to write a [`Plan`].
    Graph,
    /// A sub-task stated before working on it; the runner keeps it in the context as written.
    Subtask,
    /// A JSON call `{"name", "arguments"}`; several in one turn run in parallel.
    ToolCall,
    /// What the host wrote back (results and errors), masked out of training losses.
    Observation,
    /// MemPO's running memory: the context keeps only the latest one.
    Mem,
    /// A look back at what went wrong, read with `<think>` as the turn's last thought.
    Reflection,
    /// The final answer, ending the episode; `\boxed{}` inside it is the graded part.
    Answer,
}

impl Tag {
    /// Every tag, for code that must handle each one (the parser looks names up in it).
    pub const ALL: [Tag; 9] = [
        Tag::Think,
        Tag::Plan,
        Tag::Graph,
        Tag::Subtask,
        Tag::ToolCall,
        Tag::Observation,
        Tag::Mem,
        Tag::Reflection,
        Tag::Answer,
    ];

    /// The name inside the angle brackets.
    pub fn name(self) -> &'static str {
        match self {
            Tag::Think => "think",
            Tag::Plan => "plan",
            Tag::Graph => "graph",
            Tag::Subtask => "subtask",
            Tag::ToolCall => "tool_call",
            Tag::Observation => "observation",
            Tag::Mem => "mem",
            Tag::Reflection => "reflection",
            Tag::Answer => "answer",
        }
    }

    fn from_name(name: &str) -> Option<Tag> {
        Tag::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// A piece of a turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Block {
    /// A tagged block and its content (trimmed).
    Tagged {
        /// Which block it is.
        tag: Tag,
        /// The text between the opening and closing tag, trimmed.
        content: String,
        /// Byte offset of the opening tag in the turn, for error messages.
        offset: usize,
    },
    /// Text outside any block (trimmed, never empty).
    Text {
        /// The text, trimmed; SEARL's `##DAG_LIST` plans are read from here.
        content: String,
        /// Byte offset of the text in the turn, for error messages.
        offset: usize,
    },
}

/// A tool call as the agent writes it: `{"name": ..., "arguments": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The name the executor looks the tool up by.
    pub name: String,
    /// Its arguments (an empty object when omitted).
    pub arguments: Map<String, Value>,
}

/// A problem in a turn, with the byte offset where it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TraceError {
    /// A block opened and the turn ended before its closing tag (its content is still kept).
    #[error("`<{tag}>` at byte {offset} is never closed (add `</{tag}>`)")]
    Unclosed {
        /// The tag's name, without angle brackets.
        tag: String,
        /// Byte offset of the opening tag.
        offset: usize,
    },
    /// A closing tag with no open block to close.
    #[error("`</{tag}>` at byte {offset} closes nothing")]
    UnexpectedClose {
        /// The tag's name, without angle brackets.
        tag: String,
        /// Byte offset of the closing tag.
        offset: usize,
    },
    /// A block opened inside another, which the grammar does not allow.
    #[error("`<{inner}>` at byte {offset} is inside `<{outer}>`: blocks do not nest")]
    Nested {
        /// The block that was open.
        outer: String,
        /// The block opened inside it.
        inner: String,
        /// Byte offset of the inner opening tag.
        offset: usize,
    },
    /// A `<tool_call>` whose content is not a `{"name", "arguments"}` JSON object.
    #[error("tool call at byte {offset}: {message}")]
    InvalidToolCall {
        /// Byte offset of the `<tool_call>` block.
        offset: usize,
        /// What is wrong with the JSON, for the agent to fix.
        message: String,
    },
    /// A plan (`<plan>`, `<graph>` or `##DAG_LIST`) that does not parse or validate.
    #[error("plan at byte {offset}: {error}")]
    InvalidPlan {
        /// Byte offset of the plan's block or text.
        offset: usize,
        /// Why the plan is unusable.
        error: PlanError,
    },
}

/// A parsed turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    /// Blocks and text in written order.
    pub blocks: Vec<Block>,
    /// What was wrong with the turn's syntax.
    pub errors: Vec<TraceError>,
}

impl Turn {
    /// Contents of every block with this tag, in order.
    pub fn contents(&self, tag: Tag) -> impl Iterator<Item = &str> {
        self.blocks.iter().filter_map(move |b| match b {
            Block::Tagged { tag: t, content, .. } if *t == tag => Some(content.as_str()),
            _ => None,
        })
    }

    /// The tool calls of the turn (all run in parallel), each parsed or with its error.
    pub fn tool_calls(&self) -> Vec<Result<ToolCall, TraceError>> {
        self.blocks
            .iter()
            .filter_map(|b| match b {
                Block::Tagged { tag: Tag::ToolCall, content, offset } => Some(parse_tool_call(content, *offset)),
                _ => None,
            })
            .collect()
    }

    /// The turn's plan, from `<plan>`, `<graph>` or a SEARL `##DAG_LIST` in the text; `None`
    /// when the turn has none.
    pub fn plan(&self) -> Option<Result<Plan, TraceError>> {
        self.blocks.iter().find_map(|b| {
            let (content, offset) = match b {
                Block::Tagged { tag: Tag::Plan | Tag::Graph, content, offset } => (content, *offset),
                Block::Text { content, offset } if content.contains("##DAG_LIST") => (content, *offset),
                _ => return None,
            };
            Some(plan::parse(content).map_err(|error| TraceError::InvalidPlan { offset, error }))
        })
    }

    /// The last `<mem>` of the turn.
    pub fn mem(&self) -> Option<&str> {
        self.contents(Tag::Mem).last()
    }

    /// The `<answer>` text, if any.
    pub fn answer(&self) -> Option<&str> {
        self.contents(Tag::Answer).last()
    }

    /// The final answer: the content of the last `\boxed{}` in `<answer>` if there is one, else
    /// the whole answer.
    pub fn final_answer(&self) -> Option<String> {
        self.answer().map(|a| boxed(a).unwrap_or_else(|| a.to_string()))
    }
}

/// Parses one turn. Never fails; see [`Turn::errors`].
pub fn parse(text: &str) -> Turn {
    let mut blocks = Vec::new();
    let mut errors = Vec::new();
    let mut open: Option<(Tag, usize, usize)> = None; // tag, offset of `<tag>`, content start
    let mut text_start = 0;
    let mut i = 0;
    while let Some(rel) = text[i..].find('<') {
        let at = i + rel;
        let Some((tag, closing, len)) = tag_at(&text[at..]) else {
            i = at + 1;
            continue;
        };
        match (open, closing) {
            (None, false) => {
                push_text(&mut blocks, text, text_start, at);
                open = Some((tag, at, at + len));
            }
            (None, true) => {
                errors.push(TraceError::UnexpectedClose { tag: tag.name().into(), offset: at });
            }
            (Some((outer, start, content_start)), true) if outer == tag => {
                blocks.push(Block::Tagged { tag, content: text[content_start..at].trim().to_string(), offset: start });
                open = None;
                text_start = at + len;
            }
            (Some((outer, _, _)), false) => {
                errors.push(TraceError::Nested { outer: outer.name().into(), inner: tag.name().into(), offset: at });
            }
            (Some(_), true) => {
                errors.push(TraceError::UnexpectedClose { tag: tag.name().into(), offset: at });
            }
        }
        i = at + len;
    }
    match open {
        Some((tag, start, content_start)) => {
            errors.push(TraceError::Unclosed { tag: tag.name().into(), offset: start });
            // Keep what was written: a model cut off by max tokens still said something.
            blocks.push(Block::Tagged { tag, content: text[content_start..].trim().to_string(), offset: start });
        }
        None => push_text(&mut blocks, text, text_start, text.len()),
    }
    Turn { blocks, errors }
}

fn push_text(blocks: &mut Vec<Block>, text: &str, start: usize, end: usize) {
    let content = text[start..end].trim();
    if !content.is_empty() {
        blocks.push(Block::Text { content: content.to_string(), offset: start });
    }
}

/// A known tag at the start of `s`: (tag, closing, length of the tag text).
fn tag_at(s: &str) -> Option<(Tag, bool, usize)> {
    let (closing, body) = match s.strip_prefix("</") {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('<')?),
    };
    // Tag names are short: look no further (a long run of `<` must not make parsing quadratic).
    let end = body.bytes().take(16).position(|b| b == b'>')?;
    let tag = Tag::from_name(&body[..end])?;
    Some((tag, closing, end + 1 + if closing { 2 } else { 1 }))
}

fn parse_tool_call(content: &str, offset: usize) -> Result<ToolCall, TraceError> {
    let invalid = |message: String| TraceError::InvalidToolCall { offset, message };
    let value: Value = serde_json::from_str(content)
        .map_err(|e| invalid(format!("not JSON ({e}); write {{\"name\": \"tool\", \"arguments\": {{...}}}}")))?;
    let Value::Object(mut object) = value else {
        return Err(invalid("a tool call is a JSON object {\"name\": ..., \"arguments\": {...}}".into()));
    };
    let name = match object.remove("name") {
        Some(Value::String(name)) if !name.trim().is_empty() => name,
        Some(other) => return Err(invalid(format!("\"name\" must be a non-empty string, got {other}"))),
        None => return Err(invalid("missing \"name\"".into())),
    };
    let arguments = match object.remove("arguments") {
        Some(Value::Object(arguments)) => arguments,
        None | Some(Value::Null) => Map::new(),
        // Some models write the arguments as a JSON string, as the OpenAI API returns them.
        Some(Value::String(text)) => match serde_json::from_str(&text) {
            Ok(Value::Object(arguments)) => arguments,
            _ => return Err(invalid(format!("\"arguments\" of `{name}` must be an object"))),
        },
        Some(other) => return Err(invalid(format!("\"arguments\" of `{name}` must be an object, got {other}"))),
    };
    if let Some(extra) = object.keys().next() {
        return Err(invalid(format!("unexpected key \"{extra}\" (only \"name\" and \"arguments\")")));
    }
    Ok(ToolCall { name, arguments })
}

/// The content of the last `\boxed{...}` in `text`, braces balanced.
pub fn boxed(text: &str) -> Option<String> {
    let start = text.rfind("\\boxed{")? + "\\boxed{".len();
    let mut depth = 1_usize;
    for (i, c) in text[start..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(text[start..start + i].trim().to_string());
                }
            }
            _ => {}
        }
    }
    None
}

impl fmt::Display for Turn {
    /// The turn written back in the grammar (blocks on their own lines).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, block) in self.blocks.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            match block {
                Block::Tagged { tag, content, .. } => write!(f, "<{0}>{content}</{0}>", tag.name())?,
                Block::Text { content, .. } => write!(f, "{content}")?,
            }
        }
        Ok(())
    }
}
