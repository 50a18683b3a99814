//! JSON-Schema-constrained decoding over the policy's tokenizer: at each step only tokens whose
//! text keeps the output a valid prefix of a document that validates are allowed, so the output
//! always validates (MTR's ToolActor needs observations that match a tool's output schema).
//!
//! The schema is compiled to a character-level machine. Supported: objects (properties in
//! declared order, optional ones may be skipped), arrays (`minItems`/`maxItems`), strings
//! (`minLength`/`maxLength`, `pattern` through a DFA where the regex compiles), integers and
//! numbers (`minimum`/`maximum`, exclusive bounds), `enum`, `const`, booleans, null, `anyOf`,
//! `oneOf` and type lists. Output is compact (no whitespace); strings use printable ASCII without
//! escapes. Lengths are capped so every output ends: when a generation runs out of tokens,
//! [`JsonMatcher::completion`] closes it with the shortest valid suffix.
//!
//! By idea: the schema compiler (`schema.rs`, with `pattern.rs` and `number.rs`), the character
//! machine (`machine.rs`, `completion.rs`) and the [`JsonMatcher`] over it, the compiled
//! [`JsonSchemaGrammar`], the [`TokenTable`] that maps tokens to text, and the [`JsonConstraint`]
//! that ties them to generation.

mod completion;
mod constraint;
mod grammar;
mod machine;
mod matcher;
mod number;
mod pattern;
mod schema;
mod tokens;

pub use constraint::{JsonConstraint, JsonOutput};
pub use grammar::JsonSchemaGrammar;
pub use matcher::JsonMatcher;
pub use schema::{DEFAULT_MAX_ITEMS, DEFAULT_MAX_STRING};
pub use tokens::TokenTable;

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn accepts(schema: Value, text: &str) -> bool {
        let g = JsonSchemaGrammar::compile(&schema).expect("compiles");
        let mut m = g.matcher();
        m.feed_str(text) && m.is_complete()
    }

    #[test]
    fn documents_follow_the_schema() {
        let s = json!({"type": "object", "properties": {
            "a": {"type": "integer", "minimum": 10, "maximum": 20},
            "b": {"type": "string", "maxLength": 3},
            "c": {"type": "boolean"}
        }, "required": ["a", "c"]});
        assert!(accepts(s.clone(), r#"{"a":15,"b":"xy","c":true}"#));
        assert!(accepts(s.clone(), r#"{"a":10,"c":false}"#));
        assert!(!accepts(s.clone(), r#"{"a":9,"c":false}"#));
        assert!(!accepts(s.clone(), r#"{"a":21,"c":false}"#));
        assert!(!accepts(s.clone(), r#"{"a":15,"b":"long","c":true}"#));
        assert!(!accepts(s.clone(), r#"{"c":true}"#));
        assert!(!accepts(s, r#"{"a":15}"#));
        let p = json!({"type": "string", "pattern": "^[A-Z]{2}-[0-9]+$"});
        assert!(accepts(p.clone(), r#""AB-12""#));
        assert!(!accepts(p, r#""ab-12""#));
        let n = json!({"type": "number", "exclusiveMinimum": 0, "maximum": 1});
        assert!(accepts(n.clone(), "0.5"));
        assert!(!accepts(n.clone(), "0"));
        assert!(!accepts(n, "1.5"));
    }

    #[test]
    fn completion_closes_any_prefix_validly() {
        let s = json!({"type": "object", "properties": {
            "items": {"type": "array", "items": {"type": "string", "pattern": "^id-[0-9]{3}$"}, "minItems": 2},
            "score": {"type": "number", "minimum": -5, "maximum": 5},
            "kind": {"enum": ["alpha", "beta"]}
        }, "required": ["items", "score", "kind"]});
        let g = JsonSchemaGrammar::compile(&s).expect("compiles");
        for prefix in [
            "",
            "{",
            r#"{"items":["id-"#,
            r#"{"items":["id-123","#,
            r#"{"items":["id-123","id-456"],"kind":"beta","score":-"#,
        ] {
            let mut m = g.matcher();
            assert!(m.feed_str(prefix), "{prefix}");
            let text = format!("{prefix}{}", m.completion());
            let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert!(value["items"].as_array().is_some_and(|a| a.len() >= 2), "{text}");
            assert!(value["kind"] == "alpha" || value["kind"] == "beta", "{text}");
        }
    }
}
