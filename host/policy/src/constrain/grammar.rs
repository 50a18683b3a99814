//! A compiled schema, checked to admit a complete document, that matchers start from.

use std::sync::Arc;

use serde_json::Value;

use super::matcher::JsonMatcher;
use super::schema::{ANY_DEPTH, Node, any_value, compile, free_object, unsupported};
use crate::PolicyError;

/// A compiled schema to start matchers from.
#[derive(Debug, Clone)]
pub struct JsonSchemaGrammar {
    root: Arc<Node>,
}

impl JsonSchemaGrammar {
    /// Compiles `schema`, refusing schemas it cannot follow to a complete document.
    pub fn compile(schema: &Value) -> Result<Self, PolicyError> {
        let grammar = JsonSchemaGrammar { root: compile(schema, 0)? };
        // Some constraint sets compile but admit no document of the machine's shape (a number
        // range with no 3-decimal value, a pattern longer than its cap): find out now.
        let start = grammar.matcher();
        let suffix = start.completion();
        let closes = start.after(&suffix).is_some_and(|m| m.is_complete());
        if !closes {
            return Err(unsupported(format!("no document satisfies {schema} within the generation caps")));
        }
        Ok(grammar)
    }

    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`): free keys, values of
    /// any type nested a few levels deep.
    pub fn any_object() -> Self {
        JsonSchemaGrammar { root: free_object(any_value(ANY_DEPTH)) }
    }

    /// A matcher at the start of a document.
    pub fn matcher(&self) -> JsonMatcher {
        JsonMatcher::start(self.root.clone())
    }
}
