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

use super::{CallReply, Daemon, DaemonError, ListError};

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
        let page = self.daemon.list_tools(cursor.as_deref()).await.map_err(|e| match e {
            ListError::BadCursor(_) => McpError::invalid_params(e.to_string(), None),
            ListError::Registry(_) => McpError::internal_error(e.to_string(), None),
        })?;
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
        if !reply.is_error {
            let mut result = CallToolResult::structured(reply.structured);
            result.content = vec![ContentBlock::text(reply.text)];
            result.meta = reply.meta.map(rmcp::model::MetaObject::from);
            return Ok(result.into());
        }
        // MCP (2025-11-25) makes an unknown tool a protocol error, and everything else a
        // tool's result with `isError` that the model reads and corrects.
        if reply.unknown_tool {
            return Err(McpError::invalid_params(reply.text, Some(reply.structured)));
        }
        Ok(error_result(reply).into())
    }
}

/// A failed call as MCP's result: the error in `content` (its text, then the structured error as
/// a JSON text block for clients that only show text) and under `_meta` as `toolsmith/error`.
/// No `structuredContent`: clients check it against the tool's `outputSchema` even on an error
/// (the TypeScript SDK does), and an error envelope does not match a tool's output.
fn error_result(reply: CallReply) -> CallToolResult {
    let json = serde_json::to_string(&reply.structured).unwrap_or_default();
    let mut meta = reply.meta.unwrap_or_default();
    if let Some(error) = reply.structured.get("error") {
        meta.insert(ERROR_META.into(), error.clone());
    }
    let mut result = CallToolResult::error(vec![ContentBlock::text(reply.text), ContentBlock::text(json)]);
    result.meta = Some(rmcp::model::MetaObject::from(meta));
    result
}

/// Where an error result's structured error sits in `_meta`.
pub const ERROR_META: &str = "toolsmith/error";

/// Serves MCP over standard input and output until the client closes it (or the daemon shuts
/// down); calls still running then are finished first.
pub async fn serve_stdio(daemon: Daemon) -> Result<(), DaemonError> {
    serve_lines(daemon, tokio::io::stdin(), tokio::io::stdout()).await
}

/// Serves MCP over a line-delimited stream. Lines that are not JSON-RPC messages get a JSON-RPC
/// error (`-32700` parse error, `-32600` invalid request) instead of silence, and the session
/// goes on.
pub async fn serve_lines<R, W>(daemon: Daemon, input: R, output: W) -> Result<(), DaemonError>
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    let token = daemon.shutdown_token();
    let (ours, theirs) = tokio::io::duplex(1 << 16);
    let (from_server, mut to_server) = tokio::io::split(ours);
    let (lines_tx, mut lines_rx) = tokio::sync::mpsc::channel::<String>(64);

    // Everything written to `output` goes through one task, a whole line at a time.
    let writer = tokio::spawn(async move {
        let mut output = output;
        while let Some(line) = lines_rx.recv().await {
            if output.write_all(line.as_bytes()).await.is_err() || output.write_all(b"\n").await.is_err() {
                break;
            }
            let _ = output.flush().await;
        }
    });
    let server_out = lines_tx.clone();
    let relay_out = tokio::spawn(async move {
        let mut lines = BufReader::new(from_server).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if server_out.send(line).await.is_err() {
                break;
            }
        }
    });
    let relay_in = tokio::spawn(async move {
        let mut lines = BufReader::new(input).lines();
        loop {
            let line = match lines.next_line().await {
                Ok(Some(line)) => line,
                Ok(None) => break,
                Err(e) => {
                    // Not UTF-8 (or a broken pipe): say so and read on.
                    let _ = lines_tx.send(rpc_error(Value::Null, -32700, &format!("unreadable input: {e}"))).await;
                    continue;
                }
            };
            if line.trim().is_empty() {
                continue;
            }
            match check_message(&line) {
                Ok(()) => {
                    if to_server.write_all(line.as_bytes()).await.is_err() || to_server.write_all(b"\n").await.is_err()
                    {
                        break;
                    }
                }
                Err(reply) => {
                    tracing::warn!("rejected a malformed message on standard input");
                    if lines_tx.send(reply).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to_server.shutdown().await;
    });

    let running = McpHandler::new(daemon.clone()).serve(theirs).await.map_err(|e| DaemonError::Io {
        context: "MCP handshake on standard input".into(),
        source: std::io::Error::other(e),
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
    relay_in.abort();
    let _ = relay_out.await;
    let _ = writer.await;
    Ok(())
}

/// `Ok` for something shaped like a JSON-RPC 2.0 message; otherwise the error reply to send.
pub(super) fn check_message(line: &str) -> Result<(), String> {
    let value: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => return Err(rpc_error(Value::Null, -32700, &format!("parse error: {e}"))),
    };
    let Some(object) = value.as_object() else {
        let what = if value.is_array() { "batches are not supported by MCP" } else { "a message must be an object" };
        return Err(rpc_error(Value::Null, -32600, &format!("invalid request: {what}")));
    };
    // MCP narrows JSON-RPC's ids to strings and integers; any other id cannot be echoed back.
    let id = match object.get("id") {
        None => Value::Null,
        Some(id) if id.is_string() || id.is_i64() || id.is_u64() || id.is_null() => id.clone(),
        Some(other) => {
            let what = format!("invalid request: \"id\" must be a string or an integer, not {other}");
            return Err(rpc_error(Value::Null, -32600, &what));
        }
    };
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(rpc_error(id, -32600, "invalid request: \"jsonrpc\" must be \"2.0\""));
    }
    let method = object.get("method").and_then(Value::as_str);
    let is_response = object.contains_key("result") || object.contains_key("error");
    if method.is_none() && !is_response {
        return Err(rpc_error(id, -32600, "invalid request: no \"method\" (or \"result\"/\"error\")"));
    }
    if method.is_some() && object.get("id").is_some_and(Value::is_null) {
        return Err(rpc_error(Value::Null, -32600, "invalid request: a request's \"id\" must not be null"));
    }
    if let Some(method) = method
        && let Err(why) = check_params(method, object.get("params"))
    {
        return Err(rpc_error(id, -32602, &format!("invalid params of {method}: {why}")));
    }
    Ok(())
}

/// The shape MCP gives a request's `params`, for the requests whose malformed params the
/// protocol library would otherwise report as an unknown method.
fn check_params(method: &str, params: Option<&Value>) -> Result<(), String> {
    let Some(params) = params else {
        return if method == "tools/call" {
            Err("\"params\" with the tool's \"name\" is required".into())
        } else {
            Ok(())
        };
    };
    let Some(params) = params.as_object() else {
        return Err(format!("\"params\" must be an object, not {params}"));
    };
    match method {
        "tools/call" => {
            if !params.get("name").is_some_and(Value::is_string) {
                return Err("\"name\" must be the tool's name, a string".into());
            }
            if params.get("arguments").is_some_and(|a| !a.is_object() && !a.is_null()) {
                return Err("\"arguments\" must be an object".into());
            }
        }
        "tools/list" if params.get("cursor").is_some_and(|c| !c.is_string() && !c.is_null()) => {
            return Err("\"cursor\" must be a string".into());
        }
        _ => {}
    }
    Ok(())
}

fn rpc_error(id: Value, code: i64, message: &str) -> String {
    serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}).to_string()
}

#[cfg(test)]
mod tests {
    use super::check_message;

    #[test]
    fn malformed_lines_get_json_rpc_errors() {
        assert!(check_message(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#).is_ok());
        assert!(check_message(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#).is_ok());
        let parse = check_message("not json").unwrap_err();
        assert!(parse.contains("-32700"), "{parse}");
        let batch = check_message("[1, 2]").unwrap_err();
        assert!(batch.contains("-32600") && batch.contains("batches"), "{batch}");
        let version = check_message(r#"{"jsonrpc":"1.0","id":7,"method":"ping"}"#).unwrap_err();
        assert!(version.contains("-32600") && version.contains("\"id\":7"), "{version}");
        let nothing = check_message(r#"{"jsonrpc":"2.0","id":8}"#).unwrap_err();
        assert!(nothing.contains("method"), "{nothing}");
        for id in ["{}", "1.5", "true", "[1]", "null"] {
            let bad = check_message(&format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#)).unwrap_err();
            assert!(bad.contains("-32600") && bad.contains("\"id\":null"), "{id}: {bad}");
        }
        assert!(check_message(r#"{"jsonrpc":"2.0","id":"a","method":"ping"}"#).is_ok());
        for params in [r#"{}"#, r#"{"name":3}"#, r#"{"name":"x","arguments":[1]}"#, r#"[1]"#] {
            let bad = check_message(&format!(r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{params}}}"#))
                .unwrap_err();
            assert!(bad.contains("-32602") && bad.contains("\"id\":9"), "{params}: {bad}");
        }
        let no_params = check_message(r#"{"jsonrpc":"2.0","id":9,"method":"tools/call"}"#).unwrap_err();
        assert!(no_params.contains("-32602"), "{no_params}");
        let cursor = check_message(r#"{"jsonrpc":"2.0","id":9,"method":"tools/list","params":{"cursor":5}}"#);
        assert!(cursor.unwrap_err().contains("-32602"));
        assert!(check_message(r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"x"}}"#).is_ok());
    }
}
