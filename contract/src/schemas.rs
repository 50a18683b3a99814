//! The JSON Schemas of the contract, generated from the Rust types. `schemas/` in the repository
//! holds the generated files; a golden test fails when they drift (rewrite them with
//! `TOOLSMITH_BLESS=1 cargo test -p toolsmith-contract`).

use std::path::Path;

use schemars::generate::SchemaSettings;
use serde_json::Value;

use crate::{Manifest, StructuredError};

/// Every generated schema as `(file name, schema)`.
pub fn all() -> Vec<(&'static str, Value)> {
    vec![
        ("tool-manifest.schema.json", schema_for::<Manifest>()),
        ("tool-error.schema.json", schema_for::<StructuredError>()),
    ]
}

/// The draft 2020-12 schema of `T`, with subschemas inlined so that consumers without `$ref`
/// support (many LLM function-calling APIs) can read it.
pub fn schema_for<T: schemars::JsonSchema>() -> Value {
    let mut settings = SchemaSettings::draft2020_12();
    settings.inline_subschemas = true;
    settings.into_generator().into_root_schema_for::<T>().to_value()
}

/// [`schema_for`] for a tool's input or output type. Enums with one object per variant come out
/// as a top-level `oneOf`; MCP and OpenAI require `"type": "object"` at the top, which holds for
/// every branch, so it is stated explicitly.
pub fn tool_schema_for<T: schemars::JsonSchema>() -> Value {
    let mut schema = schema_for::<T>();
    if let Some(obj) = schema.as_object_mut()
        && !obj.contains_key("type")
    {
        obj.insert("type".into(), Value::String("object".into()));
    }
    schema
}

/// What a golden test of a generated file does: with `TOOLSMITH_BLESS` set, writes `schema` to
/// `path`; either way, fails (naming `bless`, the command that rewrites it) unless the file
/// holds exactly `schema`, pretty-printed with a final newline.
pub fn check_committed(path: &Path, schema: &Value, bless: &str) -> Result<(), String> {
    let text = serde_json::to_string_pretty(schema).map_err(|e| e.to_string())? + "\n";
    if std::env::var_os("TOOLSMITH_BLESS").is_some() {
        std::fs::write(path, &text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    if committed == text {
        Ok(())
    } else {
        Err(format!("{} is out of date with the Rust types; run TOOLSMITH_BLESS=1 {bless}", path.display()))
    }
}
