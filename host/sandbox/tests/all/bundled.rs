//! The bundled plugins on real inputs.

use serde_json::json;
use toolsmith_sandbox::ErrorKind;

use crate::{call, toolbox};

#[test]
fn every_example_of_every_bundled_tool_reproduces() {
    let mut checked = 0;
    for bundled in toolsmith_bundled::BUNDLED {
        let tool = toolbox().get(bundled.name).expect("registered");
        assert!(!tool.manifest.examples.is_empty(), "{} has no example", bundled.name);
        for example in &tool.manifest.examples {
            let out = call(bundled.name, example.input.clone())
                .unwrap_or_else(|e| panic!("{} example {} failed: {e}", bundled.name, example.input));
            assert_eq!(out.value, example.output, "{} on {}", bundled.name, example.input);
            checked += 1;
        }
    }
    assert!(checked >= 12, "only {checked} examples");
}

#[test]
fn calculator_follows_mathematical_precedence() {
    for (expression, expected) in [
        ("1 + 2 * 3", 7.0),
        ("(1 + 2) * 3", 9.0),
        ("2 ^ 3 ^ 2", 512.0),
        ("-2 ^ 2", -4.0),
        ("2 ** -2", 0.25),
        ("17 % 5 + 10 / 4", 4.5),
        ("sqrt(2) ^ 2", 2.0000000000000004),
        ("round(log(1000, 10))", 3.0),
        ("max(3, 9, 4) - min(3, 9, 4)", 6.0),
        ("hypot(3, 4)", 5.0),
        ("1.5e3 + .5", 1500.5),
    ] {
        let out = call("calculator", json!({ "expression": expression })).expect(expression);
        assert_eq!(out.value["value"], expected, "{expression}");
    }
}

#[test]
fn calculator_errors_are_tool_errors_with_codes() {
    for (expression, code) in [
        ("1 +", "invalid_expression"),
        ("nope(1)", "unknown_function"),
        ("x * 2", "unknown_name"),
        ("1 / 0", "not_finite"),
        ("sqrt(1, 2)", "wrong_arity"),
    ] {
        let e = call("calculator", json!({ "expression": expression })).expect_err(expression);
        assert_eq!(e.kind, ErrorKind::ToolError, "{expression}");
        assert_eq!(e.code.as_deref(), Some(code), "{expression}: {e}");
    }
}

#[test]
fn text_operations() {
    let out =
        call("text", json!({"operation": "find", "text": "a1b22c333", "pattern": "\\d+", "limit": 2})).expect("find");
    assert_eq!(
        out.value["matches"],
        json!([{"text": "1", "start": 1, "end": 2}, {"text": "22", "start": 3, "end": 5}])
    );
    let out =
        call("text", json!({"operation": "replace", "text": "aaa", "pattern": "a", "replacement": "b", "limit": 2}))
            .expect("replace");
    assert_eq!(out.value, json!({"text": "bba", "replacements": 2}));
    let out = call("text", json!({"operation": "split", "text": "  one two\tthree "})).expect("split");
    assert_eq!(out.value["parts"], json!(["one", "two", "three"]));
    let out = call("text", json!({"operation": "case", "text": "make it camel", "to": "camel"})).expect("case");
    assert_eq!(out.value["text"], "makeItCamel");
    let out = call("text", json!({"operation": "count", "text": "héllo"})).expect("count");
    assert_eq!(out.value["counts"]["chars"], 5);
    assert_eq!(out.value["counts"]["bytes"], 6);
    let e = call("text", json!({"operation": "find", "text": "x", "pattern": "("})).expect_err("bad regex");
    assert_eq!(e.code.as_deref(), Some("invalid_pattern"));
    let e = call("text", json!({"operation": "shout", "text": "x"})).expect_err("unknown operation");
    assert_eq!(e.kind, ErrorKind::InvalidArgs);
}

#[test]
fn units_convert_across_dimensions() {
    for (value, from, to, expected) in [
        (json!(1), "mi", "km", 1.609344),
        (json!(32), "°F", "°C", 0.0),
        (json!(1), "lb", "g", 453.59237),
        (json!(2), "h", "min", 120.0),
        (json!(1), "GB", "MB", 1000.0),
        (json!(1), "byte", "bit", 8.0),
        (json!("2 * 1024"), "KiB", "MiB", 2.0),
    ] {
        let out = call("units", json!({"value": value, "from": from, "to": to})).expect(from);
        assert_eq!(out.value["value"], expected, "{value} {from} -> {to}");
    }
    let e = call("units", json!({"value": 1, "from": "parsec", "to": "m"})).expect_err("unknown unit");
    assert_eq!(e.code.as_deref(), Some("unknown_unit"));
    let e = call("units", json!({"value": -500, "from": "°C", "to": "K"})).expect_err("below zero");
    assert_eq!(e.code.as_deref(), Some("below_absolute_zero"));
}

#[test]
fn units_composes_calculator_through_the_host() {
    let out = call("units", json!({"value": "(3 + 2) * 1000", "from": "m", "to": "km"})).expect("compose");
    assert_eq!(out.value["value"], 5.0);
    // The callee's failure reaches the caller as a tool error carrying the callee's kind.
    let e = call("units", json!({"value": "1 +", "from": "m", "to": "km"})).expect_err("bad expression");
    assert_eq!(e.kind, ErrorKind::ToolError);
    assert_eq!(e.code.as_deref(), Some("tool_error"));
    assert!(e.message.contains("invalid_expression"), "{}", e.message);
}

#[test]
fn json_query_selects_with_jsonpath() {
    let doc =
        json!({"people": [{"name": "Ada", "age": 36}, {"name": "Alan", "age": 41}, {"name": "Grace", "age": 85}]});
    let out = call("json_query", json!({"document": doc, "query": "$.people[?@.age > 40].name"})).expect("query");
    assert_eq!(out.value["matches"], json!(["Alan", "Grace"]));
    assert_eq!(out.value["count"], 2);
    let out = call("json_query", json!({"document": doc, "query": "$..age"})).expect("descendants");
    assert_eq!(out.value["count"], 3);
    let e = call("json_query", json!({"document": doc, "query": "$[?"})).expect_err("bad query");
    assert_eq!(e.code.as_deref(), Some("invalid_query"));
}

#[test]
fn schema_violations_carry_the_json_pointer() {
    let e = call("calculator", json!({"expression": 5})).expect_err("wrong type");
    assert_eq!(e.kind, ErrorKind::InvalidArgs);
    assert_eq!(e.pointer.as_deref(), Some("/expression"));
    assert_eq!(e.expected.as_deref(), Some("type string"));
    let e = call("units", json!({"value": 1, "from": "m"})).expect_err("missing");
    assert_eq!(e.pointer.as_deref(), Some(""));
    assert!(e.hint.as_deref().is_some_and(|h| h.contains("\"to\"")), "{e:?}");
    let e = call("calculator", json!({"expression": "1", "precision": 3})).expect_err("unknown field");
    assert!(e.hint.as_deref().is_some_and(|h| h.contains("precision")), "{e:?}");
    let e = call("calculator", json!({"expression": ""})).expect_err("too short");
    assert_eq!(e.pointer.as_deref(), Some("/expression"));
}

#[test]
fn unknown_tools_are_not_found_with_a_suggestion() {
    let e = call("calculater", json!({})).expect_err("typo");
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert_eq!(e.hint.as_deref(), Some("did you mean `calculator`?"));
}

#[test]
fn manifests_map_to_mcp_and_openai() {
    for tool in toolbox().tools() {
        let m = &tool.manifest;
        let mcp = m.to_mcp_tool();
        assert_eq!(mcp["name"], m.name.as_str());
        assert_eq!(mcp["inputSchema"]["type"], "object");
        assert_eq!(mcp["outputSchema"], m.output_schema);
        assert_eq!(toolsmith_sandbox::Manifest::from_mcp_tool(&mcp).expect("round trip"), *m);
        let f = m.to_openai_function();
        assert_eq!(f["function"]["parameters"], m.input_schema);
    }
}
