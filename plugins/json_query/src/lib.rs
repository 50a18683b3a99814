//! `json_query`: selects values from a JSON document with a JSONPath query (RFC 9535), via the
//! `serde_json_path` crate. Each match comes with its normalized path.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolsmith_sdk::ToolError;

/// A document and a query.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// Any JSON value.
    pub document: Value,
    /// A JSONPath query (RFC 9535), e.g. `$.store.book[?@.price < 10].title`.
    #[schemars(length(min = 1, max = 4096))]
    pub query: String,
}

/// The matches, in document order.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Output {
    /// The matched values.
    pub matches: Vec<Value>,
    /// The normalized path of each match, e.g. `$['store']['book'][0]['title']`.
    pub paths: Vec<String>,
    /// How many values matched.
    pub count: usize,
}

/// Runs `input.query` against `input.document`.
pub fn query(input: Input) -> Result<Output, ToolError> {
    let path = serde_json_path::JsonPath::parse(&input.query).map_err(|e| {
        ToolError::new("invalid_query", format!("`{}` is not a valid JSONPath query: {e}", input.query))
    })?;
    let located = path.query_located(&input.document);
    let (mut matches, mut paths) = (Vec::new(), Vec::new());
    for node in located {
        paths.push(node.location().to_string());
        matches.push(node.node().clone());
    }
    Ok(Output { count: matches.len(), matches, paths })
}

toolsmith_sdk::tool! {
    name: "json_query",
    description: "Selects values from a JSON document with a JSONPath query (RFC 9535: $.a.b, \
                  [*], [0:2], ..name, filters like [?@.price < 10]) and returns the matches with \
                  their paths.",
    run: query,
    examples: [
        {"document": {"store": {"book": [{"title": "A", "price": 8}, {"title": "B", "price": 12}]}},
         "query": "$.store.book[?@.price < 10].title"}
            => {"matches": ["A"], "paths": ["$['store']['book'][0]['title']"], "count": 1},
        {"document": {"a": [1, 2, 3]}, "query": "$.a[1:]"}
            => {"matches": [2, 3], "paths": ["$['a'][1]", "$['a'][2]"], "count": 2},
    ],
}
