//! Helpers shared by the binary's end-to-end tests.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use serde_json::{Value, json};

/// Asserts the command succeeded and returns its stdout, showing both streams when it did not.
pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The command's stdout as JSON, showing both streams when it is not.
pub fn stdout_json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The binary under test, with a component cache shared by the tests.
pub fn toolsmith() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_toolsmith"));
    cmd.env("TOOLSMITH_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache"));
    cmd
}

/// A server on an ephemeral loopback port; killed on drop.
pub struct HttpServer {
    pub child: Child,
    pub base: String,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl HttpServer {
    pub fn start(extra: &[&str]) -> HttpServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut server = HttpServer::start_in(dir.path(), extra);
        server._dir = Some(dir);
        server
    }

    /// A server whose registry (and training jobs) live in `dir`, which outlives it.
    pub fn start_in(dir: &Path, extra: &[&str]) -> HttpServer {
        let mut child = toolsmith()
            .arg("--registry")
            .arg(dir.join("registry.db"))
            .args(["serve", "--http", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start toolsmith serve");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let base = loop {
            let line = lines.next().expect("the server exited before listening").expect("stderr");
            if let Some(rest) = line.split("MCP on ").nth(1) {
                break rest.split("/mcp").next().expect("url").to_owned();
            }
        };
        // Kept for a failing test's output.
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                if line.contains("ERROR") || line.contains("WARN") {
                    eprintln!("server: {line}");
                }
            }
        });
        HttpServer { child, base, _dir: None }
    }

    pub fn mcp(&self) -> String {
        format!("{}/mcp", self.base)
    }
}

pub struct Reply {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

/// Runs `scripts/NAME`, a script that installs a pinned client (a Python venv, an npm package)
/// into a cache, and returns the path it prints last (the interpreter or the client to run).
/// `needs` says what the install needs, for the failure message.
pub fn client_from_script(name: &str, needs: &str) -> std::path::PathBuf {
    let out = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts").join(name))
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run scripts/{name}: {e}"));
    assert!(out.status.success(), "scripts/{name} failed: it needs {needs}");
    let text = String::from_utf8_lossy(&out.stdout);
    std::path::PathBuf::from(text.lines().last().unwrap_or_else(|| panic!("scripts/{name} printed no path")).trim())
}

/// The JSON report a test client printed on stdout (it prints one whether its checks passed or
/// not); a client that printed none fails the test with both of its streams.
pub fn report_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the client printed no report ({e})\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// One request to the server with extra headers; `body` is sent as given (curl calls it
/// `application/x-www-form-urlencoded` unless a header names another type).
pub fn send(server: &HttpServer, method: &str, path: &str, headers: &[&str], body: Option<&str>) -> Reply {
    let url = format!("{}{path}", server.base);
    let mut args = vec!["-X", method];
    for h in headers {
        args.extend(["-H", h]);
    }
    if let Some(body) = body {
        args.extend(["--data-binary", body]);
    }
    args.push(&url);
    curl(server, &args)
}

/// One HTTP exchange with curl (present wherever the setup script ran).
pub fn curl(_server: &HttpServer, args: &[&str]) -> Reply {
    let out = Command::new("curl").args(["-sS", "-D", "-", "--max-time", "60"]).args(args).output().expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (headers, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = headers.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    Reply { status, headers: headers.to_owned(), body: body.to_owned() }
}

/// A raw MCP session over HTTP: initialize, then JSON-RPC requests with the session id.
pub struct Session<'a> {
    server: &'a HttpServer,
    pub id: String,
}

pub const ACCEPT: &str = "Accept: application/json, text/event-stream";
pub const JSON: &str = "Content-Type: application/json";

impl<'a> Session<'a> {
    pub fn open(server: &'a HttpServer) -> Session<'a> {
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}});
        let reply = curl(server, &["-H", ACCEPT, "-H", JSON, "-d", &init.to_string(), &server.mcp()]);
        assert_eq!(reply.status, 200, "{}{}", reply.headers, reply.body);
        let id = reply
            .headers
            .lines()
            .find_map(|l| l.to_ascii_lowercase().strip_prefix("mcp-session-id:").map(|_| l[15..].trim().to_owned()))
            .expect("a session id");
        let session = Session { server, id };
        let done = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        session.post(&done.to_string());
        session
    }

    pub fn post(&self, body: &str) -> Reply {
        let header = format!("Mcp-Session-Id: {}", self.id);
        let version = "Mcp-Protocol-Version: 2025-06-18";
        curl(self.server, &["-H", ACCEPT, "-H", JSON, "-H", &header, "-H", version, "-d", body, &self.server.mcp()])
    }

    /// A request's JSON-RPC response (from a JSON body or the SSE stream).
    pub fn request(&self, id: u64, method: &str, params: Value) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let reply = self.post(&body.to_string());
        sse_message(&reply.body, id)
            .unwrap_or_else(|| panic!("no response to {method}: {}{}", reply.headers, reply.body))
    }

    pub fn call(&self, id: u64, tool: &str, args: Value) -> Value {
        self.request(id, "tools/call", json!({"name": tool, "arguments": args}))["result"].clone()
    }
}

pub fn sse_message(body: &str, id: u64) -> Option<Value> {
    let messages =
        body.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim).chain(std::iter::once(body.trim()));
    messages.filter_map(|m| serde_json::from_str::<Value>(m).ok()).find(|m| m["id"] == id)
}

/// Headless Chromium from the distribution (setup installs Debian's), 1400x900, with a clear
/// failure when it is missing.
pub fn browser(idle: std::time::Duration) -> headless_chrome::Browser {
    let found = ["chromium", "chromium-browser", "google-chrome"].iter().find_map(|name| {
        let out = Command::new("which").arg(name).output().ok()?;
        out.status.success().then(|| std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    });
    let path = found
        .expect("headless Chromium is needed for the graph page: run ./scripts/setup.sh (installs Debian's chromium)");
    let options = headless_chrome::LaunchOptions::default_builder()
        .path(Some(path))
        .sandbox(false)
        .window_size(Some((1400, 900)))
        .idle_browser_timeout(idle)
        .build()
        .expect("launch options");
    headless_chrome::Browser::new(options).expect("start Chromium")
}
