//! What a failed tool call looks like to the agent that made it.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The kind of a failed tool call. Every call ends either in a result or in exactly one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorKind {
    /// The arguments do not validate against the tool's `input_schema`; fix them and retry.
    InvalidArgs,
    /// The tool returned something that is not JSON or does not validate against its
    /// `output_schema`: a bug in the tool.
    InvalidOutput,
    /// The tool reported a failure of its own (e.g. division by zero, unknown unit).
    ToolError,
    /// The tool crashed: a panic, `unreachable`, a stack overflow or another WebAssembly trap.
    Trap,
    /// The tool ran past its deadline and was interrupted.
    Timeout,
    /// The tool tried to use more memory than its cap.
    OutOfMemory,
    /// The tool's result (or its logs) exceeded the output cap.
    OutputTooLarge,
    /// The component could not be loaded: not WebAssembly, not a component, a bad manifest, or an
    /// import outside the allowed set.
    InvalidComponent,
    /// No tool has that name.
    NotFound,
    /// Agent-written Python code raised an exception.
    PythonError,
    /// The host is at its concurrency limit; nothing is wrong with the call, retry it later.
    Busy,
    /// The tool reached for a capability (a host, a directory, a secret) no operator granted it;
    /// `expected` names the capability.
    PermissionDenied,
}

impl ErrorKind {
    /// The snake_case wire name, e.g. `invalid_args`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgs => "invalid_args",
            ErrorKind::InvalidOutput => "invalid_output",
            ErrorKind::ToolError => "tool_error",
            ErrorKind::Trap => "trap",
            ErrorKind::Timeout => "timeout",
            ErrorKind::OutOfMemory => "out_of_memory",
            ErrorKind::OutputTooLarge => "output_too_large",
            ErrorKind::InvalidComponent => "invalid_component",
            ErrorKind::NotFound => "not_found",
            ErrorKind::PythonError => "python_error",
            ErrorKind::Busy => "busy",
            ErrorKind::PermissionDenied => "permission_denied",
        }
    }

    /// True when the caller, not the tool, is to blame: bad arguments, a name that is not a
    /// tool, a server at its limit. Such a call says nothing about how well the tool works, so
    /// it does not lower the tool's success rate.
    pub fn is_callers(self) -> bool {
        matches!(self, ErrorKind::InvalidArgs | ErrorKind::NotFound | ErrorKind::Busy | ErrorKind::PermissionDenied)
    }

    /// The kind a wire name such as `invalid_args` stands for, for readers of error envelopes.
    pub fn parse(s: &str) -> Option<Self> {
        ErrorKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Every kind, in declaration order.
    pub const ALL: [ErrorKind; 12] = [
        ErrorKind::InvalidArgs,
        ErrorKind::InvalidOutput,
        ErrorKind::ToolError,
        ErrorKind::Trap,
        ErrorKind::Timeout,
        ErrorKind::OutOfMemory,
        ErrorKind::OutputTooLarge,
        ErrorKind::InvalidComponent,
        ErrorKind::NotFound,
        ErrorKind::PythonError,
        ErrorKind::Busy,
        ErrorKind::PermissionDenied,
    ];
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed call, in the form an agent reads and corrects: what kind of failure, where in the
/// arguments (a JSON pointer), what was expected, what was got, and a one-line hint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Toolsmith structured tool error")]
pub struct StructuredError {
    /// The kind of failure.
    pub kind: ErrorKind,
    /// The tool that was called.
    pub tool: String,
    /// One sentence saying what went wrong.
    pub message: String,
    /// JSON pointer (RFC 6901) to the offending value, `""` for the whole document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pointer: Option<String>,
    /// What the schema (or the tool) expected there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<String>,
    /// The offending value (truncated when large).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub got: Option<Value>,
    /// How to fix the call, in one line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    /// The tool's own error code, for `tool_error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Further violations beyond the first, for schema failures.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more: Vec<StructuredError>,
    /// The exception, for `python_error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exception: Option<Box<PythonException>>,
}

/// A Python exception raised by agent-written code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PythonException {
    /// The exception's class name, e.g. `ZeroDivisionError`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `str(exception)`.
    pub message: String,
    /// The traceback, limited to frames of the tool's own code.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub traceback: String,
    /// For syntax errors: the line number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
}

impl StructuredError {
    /// A failure with just a kind, tool and message.
    pub fn new(kind: ErrorKind, tool: impl Into<String>, message: impl Into<String>) -> Self {
        StructuredError {
            kind,
            tool: tool.into(),
            message: message.into(),
            pointer: None,
            expected: None,
            got: None,
            hint: None,
            code: None,
            more: Vec::new(),
            exception: None,
        }
    }

    /// Adds the one-line fix an agent should try next.
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// The error as `{"error": {...}}`, the shape the CLI prints and MCP results carry.
    pub fn to_envelope(&self) -> Value {
        serde_json::json!({ "error": self })
    }
}

impl fmt::Display for StructuredError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} in tool `{}`: {}", self.kind, self.tool, self.message)?;
        if let Some(pointer) = &self.pointer {
            write!(f, " (at {:?})", pointer)?;
        }
        if let Some(hint) = &self.hint {
            write!(f, "; hint: {hint}")?;
        }
        Ok(())
    }
}

impl std::error::Error for StructuredError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_through_their_wire_names() {
        for kind in ErrorKind::ALL {
            assert_eq!(ErrorKind::parse(kind.as_str()), Some(kind));
            let json = serde_json::to_value(kind).expect("serialise");
            assert_eq!(json, kind.as_str());
        }
        assert_eq!(ErrorKind::parse("nope"), None);
    }
}
