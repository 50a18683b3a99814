//! The tool manifest: what a tool is, independent of how it runs.

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::capabilities::Capabilities;

/// The pattern every tool name matches: snake_case ASCII, starting with a letter.
pub const NAME_PATTERN: &str = "^[a-z][a-z0-9]*(_[a-z0-9]+)*$";
/// The longest tool name accepted (OpenAI function names allow 64 characters).
pub const NAME_MAX_LEN: usize = 64;

/// A tool's manifest: its interface (name, description, input and output JSON Schemas), examples
/// and provenance. It maps 1:1 to an MCP tool and to an OpenAI function definition.
///
/// Parse untrusted manifests with [`Manifest::from_json`] or [`Manifest::from_value`]: they reject
/// unknown fields and check what serde alone cannot (schemas that are objects, examples present).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Toolsmith tool manifest")]
pub struct Manifest {
    /// Unique snake_case name, e.g. `unit_convert`.
    pub name: ToolName,
    /// Semantic version of the tool's interface and behaviour, e.g. `1.2.0`.
    #[schemars(regex(pattern = r"^\d+\.\d+\.\d+([-+][0-9A-Za-z.-]+)?$"))]
    pub version: String,
    /// What the tool does, when to use it, and what it returns: agents choose tools by this text.
    #[schemars(length(min = 1))]
    pub description: String,
    /// JSON Schema (2020-12) of the arguments; its top-level type is `object` (as MCP requires).
    #[schemars(schema_with = "object_schema")]
    pub input_schema: Value,
    /// JSON Schema (2020-12) of the result; its top-level type is `object`.
    #[schemars(schema_with = "object_schema")]
    pub output_schema: Value,
    /// Worked examples: each input validates against `input_schema` and yields `output`.
    #[serde(default)]
    pub examples: Vec<Example>,
    /// How the tool runs.
    #[serde(default)]
    pub kind: ToolKind,
    /// Where the tool came from.
    #[serde(default, skip_serializing_if = "Provenance::is_empty")]
    pub provenance: Provenance,
    /// What the tool asks to reach beyond pure computation (hosts, directories, secrets,
    /// environment variables). Declaring grants nothing: an operator grants per tool.
    #[serde(default, skip_serializing_if = "Capabilities::is_empty")]
    pub capabilities: Capabilities,
}

/// One worked example of a tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Example {
    /// Arguments of the call.
    pub input: Value,
    /// The result the tool returns for `input`.
    pub output: Value,
    /// What the example shows, if it is not obvious.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// How a tool runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ToolKind {
    /// A WebAssembly component built with the SDK.
    #[default]
    Plugin,
    /// A Python function run by the interpreter guest.
    Python,
    /// An interface only; a model simulates its observations.
    Simulated,
    /// Implemented by the host itself (meta tools such as search).
    Native,
}

impl fmt::Display for ToolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ToolKind::Plugin => "plugin",
            ToolKind::Python => "python",
            ToolKind::Simulated => "simulated",
            ToolKind::Native => "native",
        })
    }
}

/// Where a tool came from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    /// A person or agent that wrote the tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    /// The run (training or evaluation) whose trajectory created the tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by_run: Option<String>,
    /// Tools this one was derived from or merged with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parents: Vec<ToolName>,
}

impl Provenance {
    /// True when nothing is known.
    pub fn is_empty(&self) -> bool {
        self.author.is_none() && self.created_by_run.is_none() && self.parents.is_empty()
    }
}

/// A validated tool name (see [`NAME_PATTERN`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ToolName(String);

impl ToolName {
    /// Checks `name` against [`NAME_PATTERN`] and [`NAME_MAX_LEN`].
    pub fn new(name: impl Into<String>) -> Result<Self, ManifestError> {
        let name = name.into();
        let mut segments = name.split('_');
        let first_ok = segments.next().is_some_and(|s| {
            s.starts_with(|c: char| c.is_ascii_lowercase())
                && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        });
        let rest_ok =
            segments.all(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
        if first_ok && rest_ok && name.len() <= NAME_MAX_LEN {
            Ok(ToolName(name))
        } else {
            Err(ManifestError::InvalidName { name })
        }
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ToolName {
    type Error = ManifestError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        ToolName::new(value)
    }
}

impl From<ToolName> for String {
    fn from(value: ToolName) -> Self {
        value.0
    }
}

impl fmt::Display for ToolName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl JsonSchema for ToolName {
    fn schema_name() -> Cow<'static, str> {
        "ToolName".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": NAME_PATTERN,
            "minLength": 1,
            "maxLength": NAME_MAX_LEN,
            "description": "snake_case ASCII, starting with a letter",
        })
    }
}

fn object_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "description": "A JSON Schema (draft 2020-12) whose top-level type is \"object\".",
        "properties": {"type": {"const": "object"}},
        "required": ["type"],
    })
}

/// Why a manifest was rejected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    /// Not JSON, or not the manifest's shape (unknown or missing fields, wrong types).
    #[error("manifest is not valid: {0}")]
    Malformed(#[from] serde_json::Error),
    /// The name is not snake_case.
    #[error(
        "tool name {name:?} is not snake_case (lowercase ASCII letters and digits separated by single underscores, starting with a letter, at most {NAME_MAX_LEN} characters)"
    )]
    InvalidName {
        /// The rejected name.
        name: String,
    },
    /// The version is not `MAJOR.MINOR.PATCH`.
    #[error("version {version:?} is not a semantic version such as 1.0.0")]
    InvalidVersion {
        /// The rejected version.
        version: String,
    },
    /// The description is empty.
    #[error("description is empty: agents choose tools by their descriptions")]
    EmptyDescription,
    /// A schema is not an object schema.
    #[error("{which} must be a JSON Schema object with \"type\": \"object\" (got {got})")]
    NotAnObjectSchema {
        /// `input_schema` or `output_schema`.
        which: &'static str,
        /// What was found instead.
        got: String,
    },
}

impl Manifest {
    /// Parses and checks a manifest from JSON text.
    pub fn from_json(text: &str) -> Result<Self, ManifestError> {
        let manifest: Manifest = serde_json::from_str(text)?;
        manifest.check()?;
        Ok(manifest)
    }

    /// Parses and checks a manifest from a JSON value.
    pub fn from_value(value: Value) -> Result<Self, ManifestError> {
        let manifest: Manifest = serde_json::from_value(value)?;
        manifest.check()?;
        Ok(manifest)
    }

    /// Checks the invariants serde cannot express. Schema *compilation* is the host's job (it owns
    /// the validator); this checks shape only.
    pub fn check(&self) -> Result<(), ManifestError> {
        if !is_semver(&self.version) {
            return Err(ManifestError::InvalidVersion { version: self.version.clone() });
        }
        if self.description.trim().is_empty() {
            return Err(ManifestError::EmptyDescription);
        }
        for (which, schema) in [("input_schema", &self.input_schema), ("output_schema", &self.output_schema)] {
            if schema.get("type").and_then(Value::as_str) != Some("object") {
                let got = match schema.get("type") {
                    Some(t) => format!("type {t}"),
                    None if schema.is_object() => "no \"type\"".to_owned(),
                    None => format!("{schema}"),
                };
                return Err(ManifestError::NotAnObjectSchema { which, got });
            }
        }
        Ok(())
    }

    /// The manifest as pretty JSON.
    pub fn to_json_pretty(&self) -> String {
        // A Manifest holds only JSON-representable data, so this cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

fn is_semver(version: &str) -> bool {
    let core = version.split(['-', '+']).next().unwrap_or_default();
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3 && parts.iter().all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_must_be_snake_case() {
        for ok in ["a", "calc", "json_query", "x2", "unit_convert_v2"] {
            assert!(ToolName::new(ok).is_ok(), "{ok} should be accepted");
        }
        for bad in ["", "Calc", "2x", "_a", "a_", "a__b", "a-b", "a b", "é", &"a".repeat(65)] {
            assert!(ToolName::new(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn versions_must_be_semver() {
        assert!(is_semver("1.0.0") && is_semver("0.1.2-alpha.1") && is_semver("1.2.3+build"));
        assert!(!is_semver("1.0") && !is_semver("v1.0.0") && !is_semver("1.x.0"));
    }
}
