//! A tool that reaches out on a leash: the bundled `http_get` against a loopback server this
//! section starts, refused until granted the host, then refused a host it was not granted.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use toolsmith_contract::capabilities::{Grants, HostPattern, HttpGrant};
use toolsmith_sandbox::{Limits, Tool, Toolbox};

/// Prints `tools that reach out, on a leash (capability grants):` and three calls of `http_get`.
pub(super) fn section(toolbox: &Toolbox) -> Result<()> {
    println!("\ntools that reach out, on a leash (capability grants):");
    let port = loopback_server()?;
    let bundled = toolsmith_bundled::get("http_get").context("http_get is bundled")?;
    let tool = toolbox.load_component(bundled.component).map_err(|e| anyhow::anyhow!("http_get: {e}"))?;
    let url = format!("http://127.0.0.1:{port}/hello");
    println!("  a loopback server listens on 127.0.0.1:{port}; http_get is granted nothing yet:");
    call(toolbox, &tool, json!({"url": url}));
    let host = format!("http://127.0.0.1:{port}");
    println!("  $ toolsmith tools grant http_get --http {host} --private   (loopback is a private address)");
    let grants = Grants {
        http: vec![HttpGrant { pattern: HostPattern::parse(&host)?, methods: vec!["GET".into()], allow_private: true }],
        ..Grants::default()
    };
    let granted = tool.with_grants(grants);
    call(toolbox, &granted, json!({"url": url}));
    println!("  the grant names one host; any other stays out of reach:");
    call(toolbox, &granted, json!({"url": format!("http://localhost:{port}/hello")}));
    Ok(())
}

fn call(toolbox: &Toolbox, tool: &Tool, args: Value) {
    println!("  $ toolsmith call http_get --args '{args}'");
    match toolbox.call_tool(tool, &args, Limits::default()) {
        Ok(out) => println!("  {}", out.value),
        Err(e) => println!("  {}", e.to_envelope()),
    }
}

/// Serves `hello from the loopback server` to every request, for the life of the process.
fn loopback_server() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot listen on loopback")?;
    let port = listener.local_addr()?.port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(&mut stream);
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                line.clear();
            }
            let body = "hello from the loopback server";
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    Ok(port)
}
