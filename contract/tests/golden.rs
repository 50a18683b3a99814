//! The files in `schemas/` are generated from the Rust types; this fails when they drift.
//! Rewrite them with `TOOLSMITH_BLESS=1 cargo test -p toolsmith-contract --test golden`.

use std::path::Path;

#[test]
fn schemas_match_the_rust_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../schemas");
    for (file, schema) in toolsmith_contract::schemas::all() {
        let checked = toolsmith_contract::schemas::check_committed(
            &dir.join(file),
            &schema,
            "cargo test -p toolsmith-contract --test golden",
        );
        if let Err(e) = checked {
            panic!("{e}");
        }
    }
}

#[test]
fn the_manifest_schema_accepts_a_real_manifest_and_rejects_a_bad_one() {
    let schema = toolsmith_contract::schemas::schema_for::<toolsmith_contract::Manifest>();
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    let good = serde_json::json!({
        "name": "calculator", "version": "0.1.0", "description": "Evaluates arithmetic.",
        "input_schema": {"type": "object"}, "output_schema": {"type": "object"},
        "examples": [{"input": {"expression": "1+1"}, "output": {"value": 2.0}}], "kind": "plugin"
    });
    assert!(validator.is_valid(&good));
    let mut bad = good.clone();
    bad["name"] = "Calculator".into();
    assert!(!validator.is_valid(&bad));
    let mut bad = good;
    bad["surprise"] = true.into();
    assert!(!validator.is_valid(&bad), "unknown fields are rejected");
}
