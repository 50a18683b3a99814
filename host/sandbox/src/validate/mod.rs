//! Schema checks before and after every call.
//!
//! Arguments are checked against a tool's `input_schema` before the sandbox is entered, results
//! against its `output_schema` after. Both schemas are compiled once, when the tool is loaded
//! ([`ToolSchemas::compile`]), and the compiled validators live as long as the tool. MTR's "light
//! checks" (type, regex, range) are plain JSON Schema keywords (`type`, `pattern`, `minimum`, ...),
//! so there is one mechanism, not two.
//!
//! A violation becomes a [`StructuredError`] an agent can act on: the JSON pointer of the offending
//! value, what was expected there, what was got, and a one-line hint that quotes the field's own
//! `description` when the schema has one.

use jsonschema::Validator;
use serde_json::Value;
use toolsmith_contract::{ErrorKind, StructuredError};

/// Violations reported per failed check beyond the first (the rest are counted, not listed).
const MAX_REPORTED: usize = 8;
/// Offending values longer than this (as JSON text) are truncated in errors.
const MAX_GOT_CHARS: usize = 200;

/// A schema that does not compile.
#[derive(Debug, thiserror::Error)]
#[error("{which} is not a valid JSON Schema: {message}")]
pub struct SchemaError {
    /// `input_schema` or `output_schema`.
    pub which: &'static str,
    /// What the schema compiler said.
    pub message: String,
}

/// A tool's compiled input and output validators.
pub struct ToolSchemas {
    input: Validator,
    input_schema: Value,
    output: Validator,
    output_schema: Value,
}

impl std::fmt::Debug for ToolSchemas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolSchemas").finish_non_exhaustive()
    }
}

impl ToolSchemas {
    /// Compiles both schemas (draft 2020-12 unless a schema's `$schema` says otherwise). External
    /// `$ref`s are not resolved: no file or network access happens here.
    pub fn compile(input_schema: &Value, output_schema: &Value) -> Result<Self, SchemaError> {
        let compile = |which, schema: &Value| {
            jsonschema::validator_for(schema).map_err(|e| SchemaError { which, message: e.to_string() })
        };
        Ok(ToolSchemas {
            input: compile("input_schema", input_schema)?,
            input_schema: input_schema.clone(),
            output: compile("output_schema", output_schema)?,
            output_schema: output_schema.clone(),
        })
    }

    /// Checks arguments; a violation is `invalid_args`.
    pub fn check_args(&self, tool: &str, args: &Value) -> Result<(), StructuredError> {
        check(&self.input, &self.input_schema, ErrorKind::InvalidArgs, tool, args)
    }

    /// Checks a result; a violation is `invalid_output`.
    pub fn check_output(&self, tool: &str, output: &Value) -> Result<(), StructuredError> {
        check(&self.output, &self.output_schema, ErrorKind::InvalidOutput, tool, output)
    }
}

fn check(
    validator: &Validator,
    schema: &Value,
    kind: ErrorKind,
    tool: &str,
    value: &Value,
) -> Result<(), StructuredError> {
    // The fast path: no allocation of error objects for the common, valid case.
    if validator.is_valid(value) {
        return Ok(());
    }
    let mut errors = validator.iter_errors(value).map(|e| violation(kind, tool, schema, &e));
    let Some(mut first) = errors.next() else {
        return Ok(());
    };
    let rest: Vec<StructuredError> = errors.collect();
    let extra = rest.len().saturating_sub(MAX_REPORTED);
    first.more = rest.into_iter().take(MAX_REPORTED).collect();
    let what = if kind == ErrorKind::InvalidArgs { "arguments" } else { "result" };
    let total = 1 + first.more.len() + extra;
    let detail = std::mem::take(&mut first.message);
    first.message = if total == 1 {
        format!("the {what} do not match the schema: {detail}")
    } else {
        format!("the {what} do not match the schema ({total} violations); first: {detail}")
    };
    Err(first)
}

fn violation(kind: ErrorKind, tool: &str, schema: &Value, error: &jsonschema::ValidationError<'_>) -> StructuredError {
    use jsonschema::error::ValidationErrorKind as K;
    let pointer = error.instance_path().as_str().to_owned();
    let at = if pointer.is_empty() { "the top level".to_owned() } else { format!("`{pointer}`") };
    let expected = expected_of(error.kind());
    let field_doc = field_description(schema, error.schema_path().as_str());
    let mut hint = match error.kind() {
        K::Required { property } => format!("add the required property {property} at {at}"),
        K::AdditionalProperties { unexpected } => {
            format!("remove {} at {at}: the schema allows no other properties", unexpected.join(", "))
        }
        K::Type { .. } => format!("give {at} a value of {expected}"),
        K::Enum { .. } | K::Constant { .. } => format!("use {expected} at {at}"),
        _ => format!("change the value at {at} so that it satisfies: {expected}"),
    };
    if let Some(doc) = field_doc {
        hint.push_str(&format!(" ({doc})"));
    }
    let mut e = StructuredError::new(kind, tool, error.to_string());
    e.pointer = Some(pointer);
    e.expected = Some(expected);
    e.got = Some(truncate(error.instance()));
    e.hint = Some(hint);
    e
}

/// The expectation, phrased from the violated keyword.
fn expected_of(kind: &jsonschema::error::ValidationErrorKind) -> String {
    use jsonschema::error::ValidationErrorKind as K;
    match kind {
        K::Type { kind } => format!("type {}", type_names(kind)),
        K::Required { property } => format!("property {property} present"),
        K::Pattern { pattern } => format!("a string matching /{pattern}/"),
        K::Minimum { limit } => format!("a number >= {limit}"),
        K::Maximum { limit } => format!("a number <= {limit}"),
        K::ExclusiveMinimum { limit } => format!("a number > {limit}"),
        K::ExclusiveMaximum { limit } => format!("a number < {limit}"),
        K::MinLength { limit } => format!("a string of at least {limit} characters"),
        K::MaxLength { limit } => format!("a string of at most {limit} characters"),
        K::MinItems { limit } => format!("an array of at least {limit} items"),
        K::MaxItems { limit } => format!("an array of at most {limit} items"),
        K::Enum { options } => format!("one of {options}"),
        K::Constant { expected_value } => format!("exactly {expected_value}"),
        K::AdditionalProperties { .. } => "no properties beyond those in the schema".to_owned(),
        K::OneOfNotValid { .. } | K::AnyOf { .. } => "a value matching one of the allowed shapes".to_owned(),
        K::OneOfMultipleValid { .. } => "a value matching exactly one of the allowed shapes".to_owned(),
        K::Format { format } => format!("a string in {format} format"),
        K::MultipleOf { multiple_of } => format!("a multiple of {multiple_of}"),
        K::UniqueItems => "an array without duplicates".to_owned(),
        other => format!("{other:?}").chars().take(120).collect(),
    }
}

fn type_names(kind: &jsonschema::error::TypeKind) -> String {
    use jsonschema::error::TypeKind;
    match kind {
        TypeKind::Single(t) => t.to_string(),
        TypeKind::Multiple(ts) => {
            let names: Vec<String> = ts.iter().map(|t| t.to_string()).collect();
            names.join(" or ")
        }
    }
}

/// The `description` of the schema node the violated keyword belongs to, if any.
fn field_description(schema: &Value, keyword_path: &str) -> Option<String> {
    let parent = keyword_path.rsplit_once('/').map(|(p, _)| p)?;
    let node = schema.pointer(parent)?;
    let doc = node.get("description")?.as_str()?;
    let doc = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    // The first sentence: a ". " followed by a capital letter ("e.g. `x`" does not end one).
    let end = doc.match_indices(". ").map(|(i, _)| i).find(|&i| doc[i + 2..].starts_with(|c: char| c.is_uppercase()));
    let sentence = match end {
        Some(end) => &doc[..=end],
        None => doc.as_str(),
    };
    (!sentence.is_empty()).then(|| sentence.chars().take(160).collect())
}

fn truncate(value: &Value) -> Value {
    let text = value.to_string();
    if text.chars().count() <= MAX_GOT_CHARS {
        value.clone()
    } else {
        let head: String = text.chars().take(MAX_GOT_CHARS).collect();
        Value::String(format!("{head}… ({} bytes)", text.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schemas() -> ToolSchemas {
        ToolSchemas::compile(
            &json!({
                "type": "object",
                "properties": {
                    "expression": {"type": "string", "description": "The expression to evaluate.", "maxLength": 5},
                    "mode": {"enum": ["fast", "exact"]},
                    "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
                    "n": {"type": "integer", "minimum": 0, "maximum": 10}
                },
                "required": ["expression"],
                "additionalProperties": false
            }),
            &json!({"type": "object", "properties": {"value": {"type": "number"}}, "required": ["value"]}),
        )
        .expect("schemas compile")
    }

    #[test]
    fn valid_arguments_pass() {
        assert!(schemas().check_args("t", &json!({"expression": "1+1", "n": 3})).is_ok());
    }

    #[test]
    fn type_errors_point_at_the_value_and_quote_the_field_description() {
        let e = schemas().check_args("calc", &json!({"expression": 42})).expect_err("invalid");
        assert_eq!(e.kind, ErrorKind::InvalidArgs);
        assert_eq!(e.tool, "calc");
        assert_eq!(e.pointer.as_deref(), Some("/expression"));
        assert_eq!(e.expected.as_deref(), Some("type string"));
        assert_eq!(e.got, Some(json!(42)));
        let hint = e.hint.expect("hint");
        assert!(hint.contains("The expression to evaluate."), "{hint}");
    }

    #[test]
    fn light_checks_are_schema_keywords() {
        let s = schemas();
        let e = s.check_args("t", &json!({"expression": "1", "code": "usd"})).expect_err("pattern");
        assert_eq!(e.pointer.as_deref(), Some("/code"));
        assert!(e.expected.as_deref().is_some_and(|x| x.contains("^[A-Z]{3}$")));
        let e = s.check_args("t", &json!({"expression": "1", "n": 11})).expect_err("range");
        assert_eq!(e.expected.as_deref(), Some("a number <= 10"));
        let e = s.check_args("t", &json!({"expression": "1", "mode": "slow"})).expect_err("enum");
        assert!(e.expected.as_deref().is_some_and(|x| x.contains("fast")));
    }

    #[test]
    fn missing_and_unexpected_properties_are_reported_together() {
        let e = schemas().check_args("t", &json!({"extra": 1})).expect_err("invalid");
        let all: Vec<&StructuredError> = std::iter::once(&e).chain(e.more.iter()).collect();
        assert!(all.iter().any(|v| v.hint.as_deref().is_some_and(|h| h.contains("add the required property"))));
        assert!(all.iter().any(|v| v.hint.as_deref().is_some_and(|h| h.contains("remove"))));
        assert!(e.message.contains("2 violations"), "{}", e.message);
    }

    #[test]
    fn outputs_are_checked_too() {
        let e = schemas().check_output("t", &json!({"value": "x"})).expect_err("invalid");
        assert_eq!(e.kind, ErrorKind::InvalidOutput);
        assert_eq!(e.pointer.as_deref(), Some("/value"));
    }

    #[test]
    fn large_values_are_truncated_in_errors() {
        let big = "x".repeat(10_000);
        let e = schemas().check_args("t", &json!({"expression": big})).expect_err("too long");
        let got = e.got.expect("got").as_str().expect("string").to_owned();
        assert!(got.len() < 400 && got.contains("bytes"), "{got}");
    }

    #[test]
    fn invalid_schemas_are_rejected_at_compile_time() {
        let err = ToolSchemas::compile(&json!({"type": "objekt"}), &json!({"type": "object"})).expect_err("bad schema");
        assert_eq!(err.which, "input_schema");
    }
}
