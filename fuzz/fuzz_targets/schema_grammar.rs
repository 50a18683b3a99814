//! Any JSON Schema either compiles to a grammar for constrained decoding or is refused: never a
//! panic. A grammar that compiles accepts its own shortest completion, and any text fed to a
//! matcher is taken or refused without a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use toolsmith_policy::constrain::JsonSchemaGrammar;

fuzz_target!(|data: &[u8]| {
    // The first line is the schema; the rest is text to feed its matcher.
    let (schema, text) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(schema) = serde_json::from_slice::<serde_json::Value>(schema) else { return };
    let Ok(grammar) = JsonSchemaGrammar::compile(&schema) else { return };
    let start = grammar.matcher();
    let done = start.after(&start.completion()).expect("the completion is accepted");
    assert!(done.is_complete());
    if let Ok(text) = std::str::from_utf8(text) {
        let mut matcher = grammar.matcher();
        let _ = matcher.feed_str(text);
    }
});
