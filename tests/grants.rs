//! Capability grants through the `toolsmith` binary: grant, call, show, revoke, against a real
//! HTTP server on loopback; a secret's value appears nowhere a user or the registry keeps.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};

use common::stdout_json;

const SECRET: &str = "sk-test-8d1f0b6a93c2e4f5";

/// Answers every request with 200 and the request's `authorization` header as its body.
fn server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut auth = String::new();
            let mut reader = BufReader::new(&mut stream);
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if line.to_ascii_lowercase().starts_with("authorization:") {
                    auth = line.trim_end().to_owned();
                }
            }
            let body = format!("seen {auth}");
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

fn toolsmith(registry: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_toolsmith"))
        .args(args)
        .env("TOOLSMITH_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache"))
        .env("TOOLSMITH_REGISTRY", registry)
        .env("TOOLSMITH_TEST_TOKEN", SECRET)
        .env("RUST_LOG", "debug")
        .output()
        .expect("run toolsmith")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn an_operator_grants_http_get_a_host_and_a_secret_then_revokes_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let registry = dir.path().join("registry.db");
    let port = server();
    let url = format!("http://127.0.0.1:{port}/");
    let args = format!(r#"{{"url": "{url}", "bearer_secret": "token"}}"#);
    let mut transcript = String::new();

    let out = toolsmith(&registry, &["call", "http_get", "--args", &args]);
    transcript += &text(&out);
    let e = &stdout_json(&out)["error"];
    assert_eq!(e["kind"], "permission_denied", "pure until granted: {e}");

    let host = format!("http://127.0.0.1:{port}");
    let out = toolsmith(
        &registry,
        &[
            "tools",
            "grant",
            "http_get",
            "--http",
            &host,
            "--private",
            "--secret",
            "token=env:TOOLSMITH_TEST_TOKEN",
            "--by",
            "ops",
        ],
    );
    transcript += &text(&out);
    assert!(out.status.success(), "{}", text(&out));

    let out = toolsmith(&registry, &["call", "http_get", "--args", &args, "--logs"]);
    transcript += &text(&out);
    assert!(out.status.success(), "{}", text(&out));
    let value = stdout_json(&out);
    assert_eq!(value["text"], "seen authorization: Bearer [redacted]", "the server got it, the result hides it");

    let out = toolsmith(&registry, &["tools", "show", "http_get"]);
    transcript += &text(&out);
    let shown = text(&out);
    assert!(shown.contains(&format!("grant http:{host}")) && shown.contains("by ops"), "{shown}");
    assert!(shown.contains("secret:token: from env:TOOLSMITH_TEST_TOKEN"), "{shown}");
    let out = toolsmith(&registry, &["tools", "show", "http_get", "--json"]);
    transcript += &text(&out);
    assert_eq!(stdout_json(&out)["grant_log"][0]["actor"], "ops");

    let out = toolsmith(&registry, &["tools", "revoke", "http_get", "--all", "--by", "ops"]);
    transcript += &text(&out);
    assert!(out.status.success(), "{}", text(&out));
    let out = toolsmith(&registry, &["call", "http_get", "--args", &args]);
    transcript += &text(&out);
    assert_eq!(stdout_json(&out)["error"]["kind"], "permission_denied");

    let out = toolsmith(&registry, &["tools", "export"]);
    transcript += &text(&out);
    let stored = std::fs::read(&registry).expect("registry file");
    assert!(!transcript.contains(SECRET), "the secret reached output or logs: {transcript}");
    assert!(!String::from_utf8_lossy(&stored).contains(SECRET), "the secret reached the registry");
}

#[test]
fn bad_grants_are_clear_errors_and_change_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let registry = dir.path().join("registry.db");
    for (args, says) in [
        (vec!["--http", "ftp://example.com"], "scheme"),
        (vec!["--dir", "docs=/no/such/dir"], "cannot open"),
        (vec!["--secret", "token=plain-value"], "env:VARIABLE"),
        (vec!["--secret", "token=file:relative/path"], "absolute"),
        (vec![], "nothing to grant"),
    ] {
        let mut full = vec!["tools", "grant", "http_get"];
        full.extend(args.iter().copied());
        let out = toolsmith(&registry, &full);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(text(&out).contains(says), "{args:?}: {}", text(&out));
    }
    let out = toolsmith(&registry, &["tools", "grant", "no_such_tool", "--env", "LANG"]);
    assert!(!out.status.success());
    let out = toolsmith(&registry, &["tools", "revoke", "http_get", "dir:docs"]);
    assert!(text(&out).contains("holds no grant"), "{}", text(&out));
    let out = toolsmith(&registry, &["tools", "show", "http_get"]);
    assert!(text(&out).contains("grants: none"), "{}", text(&out));
}

/// `toolsmith serve` over stdio: `tools/list` shows a tool's grants under `_meta`, and a call from
/// an MCP client gets the grant (read per call, so a revoke by the CLI applies at once).
#[test]
fn mcp_lists_grants_and_calls_apply_them() {
    use std::process::Stdio;
    let dir = tempfile::tempdir().expect("tempdir");
    let registry = dir.path().join("registry.db");
    let port = server();
    let host = format!("http://127.0.0.1:{port}");
    let out = toolsmith(&registry, &["tools", "grant", "http_get", "--http", &host, "--private", "--by", "ops"]);
    assert!(out.status.success(), "{}", text(&out));

    let mut child = Command::new(env!("CARGO_BIN_EXE_toolsmith"))
        .args(["serve", "--stdio"])
        .env("TOOLSMITH_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache"))
        .env("TOOLSMITH_REGISTRY", &registry)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("serve");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut send = |v: serde_json::Value| writeln!(stdin, "{v}").expect("send");
    let mut next =
        || -> serde_json::Value { serde_json::from_str(&lines.next().expect("a reply").expect("read")).expect("json") };
    send(serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}));
    next();
    send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    send(serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}));
    let listed = next();
    let tool = listed["result"]["tools"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["name"] == "http_get"))
        .cloned()
        .expect("http_get listed");
    let grants = &tool["_meta"]["toolsmith/grants"];
    assert_eq!(grants[0]["capability"], format!("http:{host}"), "{tool}");
    assert_eq!(grants[0]["granted_by"], "ops");
    assert!(tool["_meta"]["toolsmith/capabilities"]["http"].is_array(), "declared capabilities: {tool}");

    let call = |id: u64| {
        serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "http_get", "arguments": {"url": format!("{host}/")}}})
    };
    send(call(3));
    let ok = next();
    assert_eq!(ok["result"]["structuredContent"]["status"], 200, "{ok}");
    let out = toolsmith(&registry, &["tools", "revoke", "http_get", "--all"]);
    assert!(out.status.success(), "{}", text(&out));
    send(call(4));
    // A notification (the list changed with the grant) may come first.
    let denied = loop {
        let reply = next();
        if reply.get("id").is_some() {
            break reply;
        }
    };
    assert_eq!(denied["result"]["isError"], true, "{denied}");
    assert_eq!(denied["result"]["_meta"]["toolsmith/error"]["kind"], "permission_denied", "{denied}");
    drop(stdin);
    let _ = child.wait();
}
