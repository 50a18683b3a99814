//! Tools taken over MCP: an [`Executor`] whose tools are another server's (`toolsmith serve`'s
//! tool graph, or any MCP server speaking streamable HTTP), so an agent can run against a daemon
//! that other agents, and training, share.
//!
//! The listing is read when connecting and again whenever the server announces
//! `notifications/tools/list_changed` (a tool created or admitted by training appears without a
//! reconnect). Arguments and results are checked by the server; a failed call comes back as the
//! server's structured error, which the agent reads exactly as it would a local one.

use std::sync::{Arc, RwLock};

use rmcp::model::{CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation, Tool as McpTool};
use rmcp::service::{NotificationContext, Peer, RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ServiceExt};
use serde_json::Value;
use toolsmith_contract::{ErrorKind, Manifest, StructuredError};

use crate::backend::BoxFuture;
use crate::tools::{Executor, ToolResult};

/// Why an MCP server's tools cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// The session could not be set up.
    #[error("cannot connect to the MCP server {url}: {message}")]
    Connect {
        /// The server's URL.
        url: String,
        /// What failed.
        message: String,
    },
    /// The server's tool list could not be read.
    #[error("cannot list the tools of {url}: {message}")]
    List {
        /// The server's URL.
        url: String,
        /// What failed.
        message: String,
    },
}

/// The tools of one MCP server, as seen by one client session.
pub struct McpTools {
    url: String,
    /// Kept alive: dropping the running service closes the session.
    service: RunningService<RoleClient, Listener>,
    listing: Arc<RwLock<Listing>>,
}

impl std::fmt::Debug for McpTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tools = toolsmith_contract::sync::read(&self.listing).manifests.len();
        f.debug_struct("McpTools").field("url", &self.url).field("tools", &tools).finish()
    }
}

#[derive(Default)]
struct Listing {
    manifests: Vec<Manifest>,
    /// Names left out of the listing (still callable: the server decides what exists).
    hidden: Vec<String>,
}

/// Rereads the listing when the server says it changed.
struct Listener {
    listing: Arc<RwLock<Listing>>,
}

impl ClientHandler for Listener {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("toolsmith-agent", env!("CARGO_PKG_VERSION")),
        )
    }

    async fn on_tool_list_changed(&self, context: NotificationContext<RoleClient>) {
        match context.peer.list_all_tools().await {
            Ok(tools) => {
                let mut listing = toolsmith_contract::sync::write(&self.listing);
                let hidden = std::mem::take(&mut listing.hidden);
                *listing = Listing::of(&tools, hidden);
                tracing::info!(tools = listing.manifests.len(), "the MCP server's tools changed");
            }
            Err(e) => tracing::warn!("cannot reread the MCP server's tools: {e}"),
        }
    }
}

impl Listing {
    fn of(tools: &[McpTool], hidden: Vec<String>) -> Listing {
        let mut listing = Listing { hidden, ..Listing::default() };
        for tool in tools {
            let Ok(value) = serde_json::to_value(tool) else { continue };
            match Manifest::from_mcp_tool(&value) {
                Ok(m) if listing.hidden.iter().any(|h| h == m.name.as_str()) => {}
                Ok(m) => listing.manifests.push(m),
                Err(e) => tracing::warn!(tool = %tool.name, "skipping a tool the server lists: {e}"),
            }
        }
        // The order a local executor lists its tools in (and training's prompts showed): the
        // corpus search first, the other tools by name, the tool-creating tool last.
        listing.manifests.sort_by_key(|m| {
            let name = m.name.as_str();
            (name != crate::env::corpus::SEARCH_TOOL, name == crate::tools::CREATE_TOOL, name.to_string())
        });
        listing
    }
}

impl McpTools {
    /// Connects to the streamable-HTTP MCP server at `url` (e.g. `http://127.0.0.1:8750/mcp`),
    /// sending `token` as a bearer token when given, and reads its tools. Tools named in `hide`
    /// are left out of the listing the agent shows its policy (e.g. the daemon's `search_tools`,
    /// which an agent retrieving on its own does not need).
    pub async fn connect(url: &str, token: Option<String>, hide: Vec<String>) -> Result<McpTools, McpError> {
        let mut config = StreamableHttpClientTransportConfig::with_uri(url);
        if let Some(token) = token {
            config = config.auth_header(token);
        }
        let listing = Arc::new(RwLock::new(Listing { hidden: hide.clone(), ..Listing::default() }));
        let listener = Listener { listing: listing.clone() };
        let service = listener
            .serve(StreamableHttpClientTransport::from_config(config))
            .await
            .map_err(|e| McpError::Connect { url: url.to_string(), message: e.to_string() })?;
        let tools = service
            .peer()
            .list_all_tools()
            .await
            .map_err(|e| McpError::List { url: url.to_string(), message: e.to_string() })?;
        *toolsmith_contract::sync::write(&listing) = Listing::of(&tools, hide);
        Ok(McpTools { url: url.to_string(), service, listing })
    }

    fn peer(&self) -> &Peer<RoleClient> {
        self.service.peer()
    }
}

impl Executor for McpTools {
    fn manifests(&self) -> Vec<Manifest> {
        toolsmith_contract::sync::read(&self.listing).manifests.clone()
    }

    fn call<'a>(&'a self, name: &'a str, args: &'a Value) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move {
            let Value::Object(arguments) = args.clone() else {
                let e = StructuredError::new(ErrorKind::InvalidArgs, name, "the arguments must be a JSON object");
                return ToolResult::of(Err(e));
            };
            let request = CallToolRequestParams::new(name.to_string()).with_arguments(arguments);
            let result = match self.peer().call_tool(request).await {
                Ok(result) => result,
                Err(e) => return ToolResult::of(Err(protocol_error(name, e))),
            };
            if result.is_error == Some(true) {
                let text: Vec<String> =
                    result.content.iter().filter_map(|c| c.as_text().map(|t| t.text.clone())).collect();
                let error = error_of(result.meta.as_ref().map(|m| &m.0), result.structured_content.as_ref(), &text)
                    // Another server's error: its text is all there is.
                    .unwrap_or_else(|| StructuredError::new(ErrorKind::ToolError, name, text.join("\n")));
                return ToolResult::of(Err(error));
            }
            let structured = result.structured_content.unwrap_or(Value::Null);
            // A manifest's output is an object, so toolsmith's results come through unwrapped.
            let value = match structured {
                Value::Null => {
                    // A server without structured results: its text, parsed when it is JSON.
                    let text: String =
                        result.content.iter().filter_map(|c| c.as_text().map(|t| t.text.clone())).collect();
                    serde_json::from_str(&text).unwrap_or(Value::String(text))
                }
                other => other,
            };
            ToolResult::of(Ok(value))
        })
    }
}

/// The structured error of an error result: under `_meta` as `toolsmith/error` (what toolsmith
/// servers send), in a JSON text block `{"error": ...}`, or as the `structuredContent` older
/// toolsmith servers sent.
fn error_of(
    meta: Option<&serde_json::Map<String, Value>>,
    structured: Option<&Value>,
    text: &[String],
) -> Option<StructuredError> {
    let parse = |v: &Value| serde_json::from_value::<StructuredError>(v.clone()).ok();
    meta.and_then(|m| m.get("toolsmith/error"))
        .and_then(parse)
        .or_else(|| {
            text.iter()
                .filter_map(|t| serde_json::from_str::<Value>(t).ok())
                .find_map(|v| v.get("error").and_then(parse))
        })
        .or_else(|| structured.and_then(|s| s.get("error")).and_then(parse))
}

/// A call the server answered with a JSON-RPC error: for an unknown tool (MCP's `-32602`)
/// toolsmith servers put the structured `not_found` error, with its suggestions, in `data`.
fn protocol_error(name: &str, error: rmcp::ServiceError) -> StructuredError {
    if let rmcp::ServiceError::McpError(data) = &error
        && let Some(found) = data
            .data
            .as_ref()
            .and_then(|d| d.get("error"))
            .and_then(|e| serde_json::from_value::<StructuredError>(e.clone()).ok())
    {
        return found;
    }
    StructuredError::new(ErrorKind::ToolError, name, format!("the MCP call failed: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn structured_errors_are_read_from_meta_text_or_old_content() {
        let error = json!({"kind": "invalid_args", "tool": "calc", "message": "bad"});
        let meta = json!({"toolsmith/error": error}).as_object().cloned();
        let from_meta = error_of(meta.as_ref(), None, &[]).expect("from _meta");
        assert_eq!(from_meta.kind, ErrorKind::InvalidArgs);
        let text = vec!["invalid_args in tool `calc`: bad".to_string(), json!({"error": error}).to_string()];
        assert_eq!(error_of(None, None, &text), Some(from_meta.clone()));
        assert_eq!(error_of(None, Some(&json!({"error": error})), &[]), Some(from_meta));
        assert_eq!(error_of(None, None, &["plain words".to_string()]), None);
    }

    fn tool(name: &str) -> McpTool {
        serde_json::from_value(json!({
            "name": name, "description": format!("{name} does things"),
            "inputSchema": {"type": "object"}, "outputSchema": {"type": "object"},
            "_meta": {"toolsmith/kind": "plugin", "toolsmith/version": "1.0.0"},
        }))
        .expect("an MCP tool")
    }

    /// The listing hides what it was told to and lists in the local executor's order (what the
    /// policy's prompts were trained on), whatever order the server sent.
    #[test]
    fn a_listing_hides_names_and_keeps_the_local_order() {
        let names = [crate::tools::CREATE_TOOL, "search_tools", "add", "search", "answer"];
        let tools: Vec<McpTool> = names.iter().map(|n| tool(n)).collect();
        let listing = Listing::of(&tools, vec!["search_tools".into()]);
        let listed: Vec<&str> = listing.manifests.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(listed, ["search", "add", "answer", crate::tools::CREATE_TOOL]);
        assert_eq!(listing.manifests[1].kind, toolsmith_contract::ToolKind::Plugin);
    }
}
