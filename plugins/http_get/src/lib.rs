//! `http_get`: fetches a URL through the host's outgoing HTTP, which an operator grants per host
//! (`toolsmith tools grant http_get --http https://api.example.com`). Without a grant every
//! request is refused as `permission_denied`.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolsmith_sdk::{ToolError, http};

/// What to fetch.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// An `http` or `https` URL on a host granted to this tool.
    #[schemars(length(min = 1, max = 8192))]
    pub url: String,
    /// Extra request headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The name of a granted secret to send as `Authorization: Bearer <secret>`; the value never
    /// appears in the result.
    #[serde(default)]
    pub bearer_secret: Option<String>,
    /// Characters of the body to return (the rest is cut and `truncated` is set).
    #[serde(default = "default_max_chars")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub max_chars: usize,
}

fn default_max_chars() -> usize {
    20_000
}

/// The response.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Output {
    /// The HTTP status code.
    pub status: u16,
    /// The `content-type` header, if any.
    pub content_type: Option<String>,
    /// The body as text (lossy UTF-8), cut at `max_chars`.
    pub text: String,
    /// The body parsed, when it is JSON and was not cut.
    pub json: Option<Value>,
    /// Whether `text` was cut.
    pub truncated: bool,
}

/// Fetches `input.url` with `GET`.
pub fn fetch(input: Input) -> Result<Output, ToolError> {
    let mut request = http::get(&input.url);
    for (name, value) in &input.headers {
        request = request.header(name, value);
    }
    if let Some(secret) = &input.bearer_secret {
        let token = toolsmith_sdk::secret(secret)?;
        request = request.header("authorization", &format!("Bearer {token}"));
    }
    let response = request.send()?;
    let content_type = response.header("content-type").map(str::to_owned);
    let body = String::from_utf8_lossy(&response.body);
    let truncated = body.chars().count() > input.max_chars;
    let text: String = body.chars().take(input.max_chars).collect();
    let is_json = content_type.as_deref().is_some_and(|c| c.contains("json"));
    let json = if is_json && !truncated { serde_json::from_str(&text).ok() } else { None };
    Ok(Output { status: response.status, content_type, text, json, truncated })
}

toolsmith_sdk::tool! {
    name: "http_get",
    description: "Fetches a web page or API response with an HTTP GET and returns its status, \
                  content type and body text (JSON bodies also parsed). Only hosts an operator \
                  granted are reachable; others fail with permission_denied.",
    run: fetch,
    examples: [
        {"url": "http://127.0.0.1:8417/hello"}
            => {"status": 200, "content_type": "text/plain", "text": "hello from the loopback server",
                "json": null, "truncated": false},
    ],
    capabilities: {
        "http": [{"host": "*", "methods": ["GET"],
                  "description": "the hosts an operator grants; nothing is reachable until then"}],
        "secrets": [{"name": "*", "description": "the secret named by bearer_secret, if granted"}],
    },
}
