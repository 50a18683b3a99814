//! JSON-Schema-constrained decoding: an untrained tiny policy, sampling freely, produces 1,000
//! observations for varied output schemas, and every one validates.

mod common;

use serde_json::{Value, json};
use toolsmith_policy::SamplingParams;
use toolsmith_policy::constrain::{JsonSchemaGrammar, TokenTable};

fn schemas() -> Vec<Value> {
    vec![
        json!({"type": "object", "properties": {"value": {"type": "number"}}, "required": ["value"]}),
        json!({"type": "object", "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 12},
            "population": {"type": "integer", "minimum": 1000, "maximum": 5000000}
        }, "required": ["city", "population"]}),
        json!({"type": "object", "properties": {
            "status": {"enum": ["ok", "not_found", "rate_limited"]},
            "retry_after": {"type": "integer", "minimum": 0, "maximum": 60}
        }, "required": ["status"]}),
        json!({"type": "object", "properties": {
            "results": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
                "type": "object",
                "properties": {"title": {"type": "string"}, "score": {"type": "number", "minimum": 0, "maximum": 1}},
                "required": ["title", "score"]
            }}
        }, "required": ["results"]}),
        json!({"type": "object", "properties": {
            "order_id": {"type": "string", "pattern": "^ORD-[0-9]{4}$"},
            "shipped": {"type": "boolean"},
            "carrier": {"type": ["string", "null"], "maxLength": 8}
        }, "required": ["order_id", "shipped", "carrier"]}),
        json!({"type": "object", "properties": {
            "celsius": {"type": "number", "exclusiveMinimum": -273.15, "maximum": 100},
            "unit": {"const": "C"}
        }, "required": ["celsius", "unit"]}),
        json!({"type": "object", "properties": {
            "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 6}, "maxItems": 4},
            "count": {"type": "integer", "minimum": -5, "maximum": 5}
        }, "required": ["tags", "count"]}),
        json!({"type": "object", "properties": {
            "answer": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99}, {"type": "string", "maxLength": 5}]},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1}
        }, "required": ["answer"]}),
        json!({"type": "object", "properties": {
            "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.(com|org)$"},
            "verified": {"type": "boolean"}
        }, "required": ["email", "verified"]}),
        json!({"type": "object", "properties": {
            "matrix": {"type": "array", "minItems": 2, "maxItems": 2, "items": {
                "type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "integer", "minimum": 0, "maximum": 9}
            }},
            "note": {"type": "string"}
        }, "required": ["matrix"]}),
    ]
}

#[test]
fn a_thousand_simulated_observations_all_validate() {
    let policy = common::tiny(11);
    let table = TokenTable::new(policy.tokenizer()).expect("token table");
    let schemas = schemas();
    let grammars: Vec<JsonSchemaGrammar> =
        schemas.iter().map(|s| JsonSchemaGrammar::compile(s).expect("schema compiles")).collect();
    let validators: Vec<jsonschema::Validator> =
        schemas.iter().map(|s| jsonschema::validator_for(s).expect("valid schema")).collect();
    let prompt =
        policy.tokenizer().encode("<tool_call>{\"name\": \"lookup\"}</tool_call><observation>").expect("encode");
    let mut total = 0;
    let mut completed = 0;
    let mut distinct = std::collections::HashSet::new();
    for round in 0..20 {
        // 50 observations per batch: five for each schema.
        let chosen: Vec<usize> = (0..50).map(|i| i % schemas.len()).collect();
        let prompts = vec![prompt.clone(); chosen.len()];
        let batch: Vec<&JsonSchemaGrammar> = chosen.iter().map(|&i| &grammars[i]).collect();
        let params =
            SamplingParams { max_new_tokens: 40, temperature: 1.0, seed: round * 1000, ..SamplingParams::default() };
        let outputs = policy.generate_json(&prompts, &batch, &table, &params).expect("generation");
        for (o, &i) in outputs.iter().zip(&chosen) {
            let o = o.as_ref().expect("every sequence ends in a document");
            let errors: Vec<String> = validators[i].iter_errors(&o.value).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "schema {i}: {} -> {errors:?}", o.text);
            total += 1;
            completed += usize::from(o.completed_chars > 0);
            distinct.insert(o.text.clone());
        }
    }
    assert_eq!(total, 1000);
    // Sampling, not a template: outputs differ.
    assert!(distinct.len() > 600, "{} distinct outputs", distinct.len());
    println!("1000 observations validated; {completed} closed by completion after the token budget");
}

#[test]
fn schemas_the_decoder_cannot_follow_are_refused_clearly() {
    for (schema, needle) in [
        (json!({"type": "object", "required": ["a"]}), "required property"),
        (json!({"type": "string", "minLength": 5, "maxLength": 2}), "maxLength"),
        (json!({"type": "widget"}), "type"),
        (json!({"enum": []}), "empty enum"),
        (json!(false), "accepts nothing"),
        (json!({"type": "integer", "multipleOf": 3}), "multipleOf"),
        (json!({"$ref": "#/defs/x"}), "$ref"),
        (
            json!({"type": "object", "properties": {"a": {"type": "integer"}}, "anyOf": [{"required": ["a"]}]}),
            "combining",
        ),
        (json!({"oneOf": [{"type": "number"}, {"type": "integer"}]}), "numeric branch"),
        (json!({"type": "string", "pattern": "(?=x)"}), "cannot be followed"),
        (json!({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 0.0005}), "no document"),
        (json!({"type": "integer", "minimum": 0.5, "maximum": 0.7}), "no document"),
        (json!({"type": "integer", "exclusiveMinimum": true}), "draft-4"),
    ] {
        let err = JsonSchemaGrammar::compile(&schema).expect_err("refused");
        assert!(err.to_string().contains(needle), "{schema}: {err}");
    }
}

#[test]
fn one_sided_bounds_long_patterns_and_tight_ranges_are_followed() {
    let policy = common::tiny(12);
    let table = TokenTable::new(policy.tokenizer()).expect("token table");
    let schemas = [
        json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1000000000}}, "required": ["n"]}),
        json!({"type": "object", "properties": {"n": {"type": "integer", "maximum": -123456789}}, "required": ["n"]}),
        json!({"type": "object", "properties": {"h": {"type": "string", "pattern": "^[0-9a-f]{80}$"}}, "required": ["h"]}),
        json!({"type": "object", "properties": {"x": {"type": "number", "minimum": 2, "exclusiveMinimum": 1.5, "maximum": 2.01}}, "required": ["x"]}),
    ];
    let prompt = policy.tokenizer().encode("<observation>").expect("encode");
    for schema in schemas {
        let grammar = JsonSchemaGrammar::compile(&schema).expect("compiles");
        let validator = jsonschema::validator_for(&schema).expect("valid schema");
        let params = SamplingParams { max_new_tokens: 24, temperature: 1.0, seed: 3, ..SamplingParams::default() };
        let prompts = vec![prompt.clone(); 5];
        let grammars = vec![&grammar; 5];
        for o in policy.generate_json(&prompts, &grammars, &table, &params).expect("generation") {
            let o = o.expect("a document");
            assert!(validator.is_valid(&o.value), "{schema}: {}", o.text);
        }
    }
}
