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
    standard_formats(&mut schema);
    schema
}

/// The `format` values JSON Schema 2020-12 defines, the only ones every validator knows.
pub const STANDARD_FORMATS: [&str; 19] = [
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uuid",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
    "regex",
];

/// `schema` as it is served: a copy with [`standard_formats`] applied.
pub fn served_schema(schema: &Value) -> Value {
    let mut schema = schema.clone();
    standard_formats(&mut schema);
    schema
}

/// Drops every `format` that JSON Schema does not define, in `schema` and its subschemas.
/// schemars marks Rust integers `"format": "uint"`, `"int32"` and so on; strict validators (Ajv,
/// which the TypeScript MCP SDK uses) warn about each unknown one, and the range they stand for
/// is already stated by `minimum` and `maximum`. Values (`default`, `examples`, `const`, `enum`)
/// are data and left alone, as is a property that happens to be called `format`.
pub fn standard_formats(schema: &mut Value) {
    let Some(object) = schema.as_object_mut() else { return };
    if object.get("format").and_then(Value::as_str).is_some_and(|f| !STANDARD_FORMATS.contains(&f)) {
        object.remove("format");
    }
    for (key, value) in object.iter_mut() {
        match key.as_str() {
            "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" => {
                if let Some(map) = value.as_object_mut() {
                    map.values_mut().for_each(standard_formats);
                }
            }
            "allOf" | "anyOf" | "oneOf" | "prefixItems" => {
                if let Some(list) = value.as_array_mut() {
                    list.iter_mut().for_each(standard_formats);
                }
            }
            "items" => match value {
                Value::Array(list) => list.iter_mut().for_each(standard_formats),
                other => standard_formats(other),
            },
            "additionalProperties"
            | "unevaluatedProperties"
            | "unevaluatedItems"
            | "contains"
            | "propertyNames"
            | "not"
            | "if"
            | "then"
            | "else"
            | "additionalItems" => standard_formats(value),
            _ => {}
        }
    }
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

#[cfg(test)]
mod format_tests {
    use super::standard_formats;
    use serde_json::json;

    #[test]
    fn only_standard_formats_stay() {
        let mut schema = json!({
            "type": "object",
            "properties": {
                "n": {"type": "integer", "format": "uint", "minimum": 0},
                "when": {"type": "string", "format": "date-time"},
                "format": {"type": "string", "format": "uint8", "default": {"format": "uint"}},
                "list": {"type": "array", "items": {"type": "integer", "format": "int32"}},
                "either": {"anyOf": [{"type": "integer", "format": "uint64"}, {"type": "null"}]},
            },
            "$defs": {"x": {"format": "double"}},
        });
        standard_formats(&mut schema);
        assert_eq!(schema["properties"]["n"], json!({"type": "integer", "minimum": 0}));
        assert_eq!(schema["properties"]["when"]["format"], "date-time");
        assert_eq!(schema["properties"]["format"], json!({"type": "string", "default": {"format": "uint"}}));
        assert_eq!(schema["properties"]["list"]["items"], json!({"type": "integer"}));
        assert_eq!(schema["properties"]["either"]["anyOf"][0], json!({"type": "integer"}));
        assert_eq!(schema["$defs"]["x"], json!({}));
    }
}
