//! `toolsmith serve` in miniature: a real MCP session (rmcp on the server side) over an in-memory
//! pipe, speaking exactly what `serve --stdio` speaks.

use anyhow::Result;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines, ReadHalf, WriteHalf};
use toolsmith_daemon::{Daemon, ServeOptions, mcp};

use super::Env;

/// Prints ``MCP (`toolsmith serve --stdio`), one session over a pipe:`` and one line per
/// exchange of the session.
pub(super) fn section(env: &Env) -> Result<()> {
    let toolbox = env.toolbox_maybe_python("Python tools are")?;
    let daemon = Daemon::new(env.registry()?, toolbox, ServeOptions::default())?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    println!("\nMCP (`toolsmith serve --stdio`), one session over a pipe:");
    runtime.block_on(session(daemon))?;
    println!("  serve it: toolsmith serve --stdio | --http 127.0.0.1:8750 (docs/guide/serving-mcp.md)");
    Ok(())
}

/// The client's end of the pipe: JSON-RPC messages out, one reply per line back.
struct Client {
    out: WriteHalf<DuplexStream>,
    replies: Lines<BufReader<ReadHalf<DuplexStream>>>,
}

impl Client {
    /// Sends `message`; a request (it has an `id`) waits for its reply, a notification gets `null`.
    async fn exchange(&mut self, message: Value) -> Result<Value> {
        self.out.write_all(format!("{message}\n").as_bytes()).await?;
        if message.get("id").is_none() {
            return Ok(Value::Null);
        }
        let line = self.replies.next_line().await?.ok_or_else(|| anyhow::anyhow!("the server closed the session"))?;
        Ok(serde_json::from_str(&line)?)
    }
}

/// Serves `daemon` on one end of a pipe and drives the session from the other.
async fn session(daemon: Daemon) -> Result<()> {
    let (client, server) = tokio::io::duplex(1 << 16);
    let (server_in, server_out) = tokio::io::split(server);
    let session = tokio::spawn(mcp::serve_lines(daemon, server_in, server_out));
    let (client_in, out) = tokio::io::split(client);
    let mut client = Client { out, replies: BufReader::new(client_in).lines() };
    handshake(&mut client).await?;
    call_tools(&mut client).await?;
    // Closing our side ends the session, as closing standard input ends `serve --stdio`.
    client.out.shutdown().await?;
    session.await??;
    Ok(())
}

/// `initialize`, `notifications/initialized` and `tools/list`.
async fn handshake(client: &mut Client) -> Result<()> {
    let init = client
        .exchange(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "quickstart", "version": "0"}}}))
        .await?;
    println!(
        "  initialize        -> {} {}, protocol {}",
        init["result"]["serverInfo"]["name"].as_str().unwrap_or("?"),
        init["result"]["serverInfo"]["version"].as_str().unwrap_or("?"),
        init["result"]["protocolVersion"].as_str().unwrap_or("?")
    );
    client.exchange(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await?;
    let list = client.exchange(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})).await?;
    let names: Vec<&str> =
        list["result"]["tools"].as_array().into_iter().flatten().filter_map(|t| t["name"].as_str()).collect();
    println!("  tools/list        -> {}", names.join(", "));
    Ok(())
}

/// `tools/call` three times: the graph searched, a tool called well, then with a missing argument.
async fn call_tools(client: &mut Client) -> Result<()> {
    let found =
        client.exchange(call(3, "search_tools", json!({"query": "convert a distance between units", "k": 2}))).await?;
    let found: Vec<String> = found["result"]["structuredContent"]["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| format!("{} ({:.2})", t["name"].as_str().unwrap_or("?"), t["score"].as_f64().unwrap_or(0.0)))
        .collect();
    println!("  search_tools      -> {}", found.join(", "));
    let ok = client.exchange(call(4, "units", json!({"value": 5, "from": "mi", "to": "km"}))).await?;
    println!("  units 5 mi -> km  -> {}", ok["result"]["structuredContent"]);
    let bad = client.exchange(call(5, "units", json!({"value": 5, "from": "mi"}))).await?;
    println!(
        "  bad arguments     -> isError {}, kind {}",
        bad["result"]["isError"], bad["result"]["_meta"]["toolsmith/error"]["kind"]
    );
    Ok(())
}

/// A `tools/call` request.
fn call(id: u64, name: &str, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": arguments}})
}
