//! Whole-manifest checks that need a JSON Schema validator (the `validate` feature): every schema
//! against the draft 2020-12 meta-schema, and every declared example against the tool's own input
//! and output schemas.
//!
//! [`Manifest::check`](crate::Manifest::check) checks shape only, so that a guest compiled to
//! WebAssembly does not carry a validator; hosts, registries and the SDK's native tests call
//! [`check_manifest`] as well, so that a manifest is refused where it is added, not at its first call.

use serde_json::Value;

use crate::Manifest;

/// The first thing wrong with a manifest's schemas or examples.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestProblem {
    /// A schema is not a JSON Schema (it fails the meta-schema, e.g. `"type": "float"`).
    #[error("{which} is not a valid JSON Schema: at {pointer}: {message}")]
    Schema {
        /// `input_schema` or `output_schema`.
        which: &'static str,
        /// JSON pointer inside the schema of the offending keyword (`""` for the root).
        pointer: String,
        /// What the meta-schema check said.
        message: String,
    },
    /// A declared example does not validate against the tool's schema.
    #[error("example {index} ({part}) does not match {which}: at {pointer}: {message}")]
    Example {
        /// Position of the example in `examples`, from 0.
        index: usize,
        /// `input` or `output`.
        part: &'static str,
        /// `input_schema` or `output_schema`.
        which: &'static str,
        /// JSON pointer of the offending value inside the example's part (`""` for the root).
        pointer: String,
        /// What the validator said.
        message: String,
    },
}

/// Checks both schemas against the meta-schema, then every example against them.
pub fn check_manifest(manifest: &Manifest) -> Result<(), ManifestProblem> {
    check_schema("input_schema", &manifest.input_schema)?;
    check_schema("output_schema", &manifest.output_schema)?;
    let input = compile("input_schema", &manifest.input_schema)?;
    let output = compile("output_schema", &manifest.output_schema)?;
    for (index, example) in manifest.examples.iter().enumerate() {
        check_value(&input, &example.input, index, "input", "input_schema")?;
        // `null` is how an interface-only manifest says "the output is not known".
        if !example.output.is_null() {
            check_value(&output, &example.output, index, "output", "output_schema")?;
        }
    }
    Ok(())
}

/// Checks one schema against the JSON Schema meta-schema of its `$schema` (2020-12 by default).
pub fn check_schema(which: &'static str, schema: &Value) -> Result<(), ManifestProblem> {
    jsonschema::meta::validate(schema).map_err(|e| ManifestProblem::Schema {
        which,
        pointer: e.instance_path().to_string(),
        message: e.to_string(),
    })
}

fn compile(which: &'static str, schema: &Value) -> Result<jsonschema::Validator, ManifestProblem> {
    jsonschema::validator_for(schema).map_err(|e| ManifestProblem::Schema {
        which,
        pointer: e.instance_path().to_string(),
        message: e.to_string(),
    })
}

fn check_value(
    validator: &jsonschema::Validator,
    value: &Value,
    index: usize,
    part: &'static str,
    which: &'static str,
) -> Result<(), ManifestProblem> {
    match validator.iter_errors(value).next() {
        None => Ok(()),
        Some(e) => Err(ManifestProblem::Example {
            index,
            part,
            which,
            pointer: e.instance_path().to_string(),
            message: e.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn manifest(input_schema: Value, examples: Value) -> Manifest {
        Manifest::from_value(json!({
            "name": "t", "version": "1.0.0", "description": "d",
            "input_schema": input_schema,
            "output_schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
            "examples": examples,
        }))
        .expect("shape is fine")
    }

    #[test]
    fn a_nested_non_schema_type_is_named_with_its_pointer() {
        let m = manifest(json!({"type": "object", "properties": {"x": {"type": "float"}}}), json!([]));
        let problem = check_manifest(&m).expect_err("float is not a JSON type");
        let ManifestProblem::Schema { which, pointer, .. } = &problem else { panic!("{problem}") };
        assert_eq!((*which, pointer.as_str()), ("input_schema", "/properties/x/type"));
    }

    #[test]
    fn an_example_outside_its_schema_is_named_by_index_and_pointer() {
        let schema = json!({"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]});
        let m = manifest(
            schema.clone(),
            json!([{"input": {"x": 1}, "output": {"n": 1}}, {"input": {"x": "one"}, "output": {"n": 1}}]),
        );
        let problem = check_manifest(&m).expect_err("\"one\" is not an integer");
        assert!(
            matches!(&problem, ManifestProblem::Example { index: 1, part: "input", pointer, .. } if pointer == "/x"),
            "{problem:?}"
        );
        let m = manifest(schema, json!([{"input": {"x": 1}, "output": {"n": "many"}}]));
        let problem = check_manifest(&m).expect_err("output is checked too");
        assert!(matches!(&problem, ManifestProblem::Example { index: 0, part: "output", .. }), "{problem:?}");
    }

    #[test]
    fn a_good_manifest_passes_and_null_outputs_are_not_checked() {
        let schema = json!({"type": "object", "properties": {"x": {"type": "integer"}}});
        let m = manifest(schema, json!([{"input": {"x": 1}, "output": null}]));
        assert_eq!(check_manifest(&m), Ok(()));
    }
}
