//! The MCP face of the daemon: an `rmcp` server handler, one per session, all sharing a
//! [`Daemon`].

use rmcp::ErrorData as McpError;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, InitializeResult,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer};
use rmcp::{ServerHandler, ServiceExt};
use serde_json::Value;

use super::{Daemon, DaemonError};

/// Serves a [`Daemon`] to one MCP client.
#[derive(Debug, Clone)]
pub struct McpHandler {
    daemon: Daemon,
}

impl McpHandler {
    /// A handler for one session.
    pub fn new(daemon: Daemon) -> McpHandler {
        McpHandler { daemon }
    }
}

const INSTRUCTIONS: &str = "Toolsmith serves a graph of sandboxed tools. Find tools for a task with \
    `search_tools` rather than reading the whole list; call them with tools/call. A failed call \
    returns isError with a structured error (kind, JSON pointer, expected, got, hint): fix the \
    arguments and retry. Create a missing tool with `create_and_execute_mcp`.";

impl ServerHandler for McpHandler {
    fn get_info(&self) -> InitializeResult {
        let capabilities = ServerCapabilities::builder().enable_tools().enable_tool_list_changed().build();
        InitializeResult::new(capabilities)
            .with_server_info(Implementation::new("toolsmith", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        tracing::info!(client = ?context.peer.peer_info().map(|i| i.client_info.name.clone()), "client initialized");
        self.daemon.add_peer(context.peer);
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let cursor = request.and_then(|r| r.cursor);
        let page = self
            .daemon
            .list_tools(cursor.as_deref())
            .await
            .map_err(|e| McpError::internal_error(format!("cannot read the tool graph: {e}"), None))?;
        let mut result = ListToolsResult::with_all_items(page.tools);
        result.next_cursor = page.next_cursor;
        Ok(result)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let args = Value::Object(request.arguments.unwrap_or_default());
        let reply = self.daemon.call(&request.name, args).await;
        let mut result = if reply.is_error {
            CallToolResult::structured_error(reply.structured)
        } else {
            CallToolResult::structured(reply.structured)
        };
        result.content = vec![ContentBlock::text(reply.text)];
        result.meta = reply.meta.map(rmcp::model::MetaObject::from);
        Ok(result.into())
    }
}

/// Serves MCP over standard input and output until the client closes it (or the daemon shuts
/// down); calls still running then are finished first.
pub async fn serve_stdio(daemon: Daemon) -> Result<(), DaemonError> {
    let token = daemon.shutdown_token();
    let running = McpHandler::new(daemon.clone()).serve(rmcp::transport::stdio()).await.map_err(|e| {
        DaemonError::Io { context: "MCP handshake on standard input".into(), source: std::io::Error::other(e) }
    })?;
    let closer = running.cancellation_token();
    tokio::select! {
        quit = running.waiting() => {
            if let Err(e) = quit {
                tracing::warn!("the stdio session ended abnormally: {e}");
            }
        }
        _ = token.cancelled() => closer.cancel(),
    }
    Ok(())
}
