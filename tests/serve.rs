//! `toolsmith serve` end to end: a real third-party MCP client (the Python `mcp` SDK from PyPI,
//! in a virtual environment that `scripts/mcp-client-env.sh` creates and caches) over stdio and
//! streamable HTTP, and raw HTTP/stdio for the bad-input cases no well-behaved client produces.

mod common;

use common::{ACCEPT, HttpServer, JSON, Reply, Session, curl, sse_message, toolsmith};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The Python interpreter of the client's virtual environment (created once, then cached).
fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| common::client_from_script("mcp-client-env.sh", "PyPI for the MCP client's venv"))
}

/// Runs `tests/mcp/client.py` and returns its JSON report.
fn python_client(args: &[&str]) -> (Output, Value) {
    let out = Command::new(python())
        .arg(Path::new(ROOT).join("tests/mcp/client.py"))
        .args(args)
        .env("TOOLSMITH_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache"))
        .output()
        .expect("run the Python MCP client");
    let report = common::report_of(&out);
    (out, report)
}

fn assert_scenario_passed(out: &Output, report: &Value) {
    assert!(
        out.status.success() && report["ok"] == true,
        "the MCP client's checks failed: {}\nstderr: {}",
        serde_json::to_string_pretty(&report["failures"]).unwrap_or_default(),
        String::from_utf8_lossy(&out.stderr)
    );
    // The pieces the issue names, read back from what the client saw.
    assert_eq!(report["notifications"], json!(["notifications/tools/list_changed"]), "{report}");
    assert_eq!(report["steps"]["calculator"]["structuredContent"], json!({"value": 14.0}));
    assert_eq!(report["steps"]["create_and_execute_mcp"]["structuredContent"]["creation_success"], true);
    assert_eq!(report["steps"]["bad_args"]["kind"], "invalid_args");
    let found = report["steps"]["search_tools"]["names"].as_array().expect("names");
    assert!(found.contains(&json!("calculator")), "{found:?}");
}

#[test]
fn python_sdk_client_over_stdio() {
    let dir = tempfile::tempdir().expect("tempdir");
    let registry = dir.path().join("registry.db");
    let registry = registry.to_str().expect("utf-8");
    let bin = env!("CARGO_BIN_EXE_toolsmith");
    let (out, report) = python_client(&[
        "--min-pages",
        "3",
        "stdio",
        "--",
        bin,
        "--registry",
        registry,
        "serve",
        "--stdio",
        "--page-size",
        "2",
    ]);
    assert_scenario_passed(&out, &report);
    // The created tool is a node of the graph, visible to the next process.
    let listed = toolsmith().args(["--registry", registry, "tools", "show", "hypotenuse"]).output().expect("run");
    assert!(listed.status.success(), "{}", String::from_utf8_lossy(&listed.stderr));
    assert!(String::from_utf8_lossy(&listed.stdout).contains("(python)"));
}

#[test]
fn python_sdk_client_over_streamable_http_with_a_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "correct horse\n").expect("write token");
    let server = HttpServer::start(&["--page-size", "2", "--token-file", token_file.to_str().expect("utf-8")]);
    let (out, report) = python_client(&["--min-pages", "3", "http", &server.mcp(), "--token", "correct horse"]);
    assert_scenario_passed(&out, &report);

    // Without the token the client gets nowhere, and says why.
    let (out, report) = python_client(&["--timeout", "20", "http", &server.mcp(), "--token", "wrong"]);
    assert!(!out.status.success());
    assert!(report["failures"].to_string().contains("401"), "{report}");

    // The status API counts what happened, behind the same token; health is open.
    let status = curl(&server, &["-H", "Authorization: Bearer correct horse", &format!("{}/status", server.base)]);
    let status: Value = serde_json::from_str(&status.body).expect("status JSON");
    assert_eq!(status["status"], "ok");
    assert_eq!(status["tools"], 6, "5 bundled tools and the created one: {status}");
    assert!(status["calls_served"].as_u64().expect("count") >= 6, "{status}");
    assert_eq!(status["failures_by_kind"]["invalid_args"], 1, "{status}");
    assert!(status["uptime_s"].as_f64().expect("uptime") > 0.0);
    assert_eq!(curl(&server, &[&format!("{}/status", server.base)]).status, 401);
    assert_eq!(curl(&server, &[&format!("{}/health", server.base)]).body.trim(), "ok");
}

#[test]
fn http_bad_input_gets_clear_errors_and_the_server_stays_up() {
    let server = HttpServer::start(&["--max-request-kb", "64", "--concurrency", "2", "--timeout-ms", "60000"]);
    let mcp = server.mcp();
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;

    // Malformed JSON-RPC: a JSON-RPC parse error, not a dropped connection.
    let reply = curl(&server, &["-H", ACCEPT, "-H", JSON, "-d", "{not json", &mcp]);
    assert_eq!(reply.status, 400);
    let error: Value = serde_json::from_str(&reply.body).expect("a JSON-RPC error");
    assert_eq!(error["error"]["code"], -32700);
    let reply = curl(&server, &["-H", ACCEPT, "-H", JSON, "-d", r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#, &mcp]);
    assert_eq!(reply.status, 400);
    assert!(reply.body.contains("-32600") && reply.body.contains("batches"), "{}", reply.body);

    // Oversized: refused before it is read in full.
    let big = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"pad":"{}"}}}}"#, "x".repeat(100 << 10));
    let body_file = tempfile::NamedTempFile::new().expect("temp");
    std::fs::write(body_file.path(), big).expect("write");
    let at = format!("@{}", body_file.path().display());
    assert_eq!(curl(&server, &["-H", ACCEPT, "-H", JSON, "--data-binary", &at, &mcp]).status, 413);

    // DNS rebinding: a foreign Host or browser Origin is refused; loopback origins are fine.
    assert_eq!(curl(&server, &["-H", ACCEPT, "-H", JSON, "-H", "Host: evil.example", "-d", ping, &mcp]).status, 403);
    let foreign = curl(&server, &["-H", ACCEPT, "-H", JSON, "-H", "Origin: http://evil.example", "-d", ping, &mcp]);
    assert_eq!(foreign.status, 403);

    // A session still works: unknown methods and tools are errors the client can read.
    let session = Session::open(&server);
    let unknown_method = session.request(2, "tools/frobnicate", json!({}));
    assert_eq!(unknown_method["error"]["code"], -32601, "{unknown_method}");
    // An unknown tool is a protocol error (MCP 2025-11-25), with the suggestion in its data.
    let unknown_tool =
        session.request(3, "tools/call", json!({"name": "calculater", "arguments": {"expression": "1"}}));
    assert_eq!(unknown_tool["error"]["code"], -32602, "{unknown_tool}");
    assert_eq!(unknown_tool["error"]["data"]["error"]["kind"], "not_found");
    assert!(unknown_tool["error"]["data"]["error"]["hint"].as_str().expect("hint").contains("calculator"));

    // A slow tool: created through the meta tool, then called by a client that hangs up.
    let created = session.call(
        4,
        "create_and_execute_mcp",
        json!({"name": "spin", "description": "Adds up the integers below n, slowly.",
               "arguments": "n (int)", "returns": "the sum (int)",
               "code": "def spin(n: int) -> int:\n    total = 0\n    for i in range(n):\n        total += i\n    return total\n",
               "inputs": {"n": 10}}),
    );
    assert_eq!(created["structuredContent"]["creation_success"], true, "{created}");
    let slow = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                      "params": {"name": "spin", "arguments": {"n": 20_000_000}}});
    let header = format!("Mcp-Session-Id: {}", session.id);
    let hang_up = Command::new("curl")
        .args(["-sS", "--max-time", "0.5", "-H", ACCEPT, "-H", JSON, "-H", &header, "-d", &slow.to_string(), &mcp])
        .output()
        .expect("curl");
    assert!(!hang_up.status.success(), "the client gave up before the tool finished");
    // The abandoned call runs to its end and frees its slot.
    let in_flight = || {
        let status = curl(&server, &[&format!("{}/status", server.base)]);
        serde_json::from_str::<Value>(&status.body).map(|s| s["in_flight"].as_u64()).ok().flatten()
    };
    assert_eq!(in_flight(), Some(1), "the abandoned call is still running");
    let freed = (0..600).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        in_flight() == Some(0)
    });
    assert!(freed, "the abandoned call never finished");

    // A slow call does not hold up the others: start one, and a quick call returns first.
    let slow_call = {
        let (mcp, header, body) = (mcp.clone(), header.clone(), slow.to_string());
        std::thread::spawn(move || {
            Command::new("curl")
                .args(["-sS", "--max-time", "120", "-H", ACCEPT, "-H", JSON, "-H", &header, "-d", &body, &mcp])
                .output()
                .expect("curl")
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let quick = session.call(6, "calculator", json!({"expression": "6 * 7"}));
    assert_eq!(quick["structuredContent"], json!({"value": 42.0}));
    assert!(!slow_call.is_finished(), "the quick call waited for the slow one");
    let slow_reply = slow_call.join().expect("thread");
    let body = String::from_utf8_lossy(&slow_reply.stdout);
    let result = sse_message(&body, 5).expect("the slow call's response");
    assert_eq!(result["result"]["structuredContent"], json!({"result": 199_999_990_000_000_i64}));

    // Still healthy, and every call has finished (the abandoned one included).
    let status: Value = serde_json::from_str(&curl(&server, &[&format!("{}/status", server.base)]).body).expect("JSON");
    assert_eq!(status["status"], "ok");
    assert_eq!(status["failures_by_kind"]["not_found"], 1, "{status}");
}

#[test]
fn shutdown_finishes_running_calls() {
    let mut server = HttpServer::start(&["--timeout-ms", "60000"]);
    let session = Session::open(&server);
    let created = session.call(
        1,
        "create_and_execute_mcp",
        json!({"name": "spin", "description": "Adds up the integers below n, slowly.", "arguments": "n (int)",
               "code": "def spin(n: int) -> int:\n    return sum(i for i in range(n))\n", "inputs": {"n": 10}}),
    );
    assert_eq!(created["structuredContent"]["creation_success"], true, "{created}");
    let (mcp, header) = (server.mcp(), format!("Mcp-Session-Id: {}", session.id));
    let slow = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                      "params": {"name": "spin", "arguments": {"n": 15_000_000}}});
    let call = std::thread::spawn(move || {
        Command::new("curl")
            .args(["-sS", "--max-time", "120", "-H", ACCEPT, "-H", JSON, "-H", &header, "-d", &slow.to_string(), &mcp])
            .output()
            .expect("curl")
    });
    // Wait until the call is running, then ask the server to stop.
    let running = (0..200).any(|_| {
        std::thread::sleep(Duration::from_millis(25));
        let status = curl(&server, &[&format!("{}/status", server.base)]);
        serde_json::from_str::<Value>(&status.body).is_ok_and(|s| s["in_flight"] == 1)
    });
    assert!(running, "the call never showed as running");
    let pid = server.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().expect("kill").success());
    let reply = call.join().expect("thread");
    let body = String::from_utf8_lossy(&reply.stdout);
    let result = sse_message(&body, 2).unwrap_or_else(|| panic!("the running call was cut off: {body}"));
    assert_eq!(result["result"]["structuredContent"], json!({"result": 112_499_992_500_000_i64}));
    let exit = server.child.wait().expect("wait");
    assert!(exit.success(), "{exit:?}");
}

/// `toolsmith serve --stdio` on a fresh registry, spoken to line by line.
struct StdioServer {
    child: Child,
    stdin: std::process::ChildStdin,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
    _dir: tempfile::TempDir,
}

impl StdioServer {
    fn start(extra: &[&str]) -> StdioServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut child = toolsmith()
            .arg("--registry")
            .arg(dir.path().join("registry.db"))
            .args(["serve", "--stdio"])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start");
        let stdin = child.stdin.take().expect("stdin");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        StdioServer { child, stdin, lines, _dir: dir }
    }

    fn send(&mut self, line: impl std::fmt::Display) {
        writeln!(self.stdin, "{line}").and_then(|_| self.stdin.flush()).expect("write");
    }

    fn next(&mut self) -> Value {
        serde_json::from_str(&self.lines.next().expect("a line").expect("read")).expect("JSON")
    }

    /// Closes standard input and waits for the server to exit.
    fn finish(self) -> std::process::ExitStatus {
        let StdioServer { mut child, stdin, .. } = self;
        drop(stdin);
        child.wait().expect("wait")
    }
}

#[test]
fn stdio_answers_malformed_lines_and_goes_on() {
    let mut server = StdioServer::start(&[]);

    server.send("this is not JSON");
    assert_eq!(server.next()["error"]["code"], -32700);
    server.send(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#,
    );
    assert_eq!(server.next()["result"]["serverInfo"]["name"], "toolsmith");
    server.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    server.send(r#"[{"jsonrpc":"2.0","id":2,"method":"ping"}]"#);
    assert_eq!(server.next()["error"]["code"], -32600);
    server.send(r#"{"jsonrpc":"1.0","id":3,"method":"ping"}"#);
    let wrong_version = server.next();
    assert_eq!((wrong_version["id"].clone(), wrong_version["error"]["code"].clone()), (json!(3), json!(-32600)));
    server.send(
        r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"calculator","arguments":{"expression":"1+1"}}}"#,
    );
    let result = server.next();
    assert_eq!(result["id"], 4);
    assert_eq!(result["result"]["structuredContent"], json!({"value": 2.0}));
    let status = server.finish();
    assert!(status.success(), "closing standard input ends the server cleanly: {status:?}");
}

#[test]
fn a_public_address_needs_a_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = toolsmith()
        .arg("--registry")
        .arg(dir.path().join("registry.db"))
        .args(["serve", "--http", "0.0.0.0:0"])
        .env_remove("TOOLSMITH_TOKEN")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("without a bearer token"));
}

#[test]
fn candidate_admission_keeps_created_tools_out_of_the_list() {
    let mut server = StdioServer::start(&["--admission", "candidate"]);
    server.send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}));
    server.next();
    server.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    server.send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "create_and_execute_mcp",
        "arguments": {"name": "double_it", "description": "Doubles a number.", "arguments": "x (float)",
                      "code": "def double_it(x: float) -> float:\n    return 2 * x\n", "inputs": {"x": 21}}}}));
    let created = server.next();
    assert_eq!(created["result"]["structuredContent"]["creation_success"], true, "{created}");
    assert_eq!(created["result"]["structuredContent"]["execution_result"], 42.0);
    assert_eq!(created["result"]["_meta"]["toolsmith/admission"]["status"], "candidate", "{created}");
    server.send(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}));
    let listed = server.next();
    let names: Vec<&str> =
        listed["result"]["tools"].as_array().expect("tools").iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(!names.contains(&"double_it"), "{names:?}");
    // Creating with broken code is SEARL's result with the reason, not a protocol error.
    server.send(json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "create_and_execute_mcp",
        "arguments": {"name": "broken", "description": "Broken.", "code": "def broken(:\n"}}}));
    let broken = server.next();
    assert_eq!(broken["result"]["structuredContent"]["creation_success"], false, "{broken}");
    assert!(broken["result"]["structuredContent"]["error"].as_str().is_some_and(|e| e.contains("SyntaxError")));
    assert!(server.finish().success());
}

/// `serve --policy` makes the local policy an OpenAI-compatible peer: the HTTP backend gets what
/// the in-process policy generates, streaming adds up to the same text, bad bodies get 400s, and
/// an agent runs episodes against it.
#[test]
fn the_policy_endpoint_is_a_real_peer_for_the_openai_backend() {
    use toolsmith_agent::backend::{Backend, GenerateOptions, LocalBackend, Message, OpenAiBackend};

    let server = HttpServer::start(&["--policy", "tiny", "--model-name", "tiny"]);
    let messages = vec![Message::system("You answer questions."), Message::user("Where was Ada born?")];
    let options = GenerateOptions { max_tokens: 24, temperature: 0.0, stop: Vec::new(), ..GenerateOptions::default() };
    let runtime = tokio::runtime::Runtime::new().expect("tokio");
    let remote = OpenAiBackend::new(format!("{}/v1", server.base), "tiny", None);
    let got = runtime.block_on(remote.complete(&messages, &options)).expect("the endpoint answers");
    toolsmith_policy::set_threads(1);
    let policy = toolsmith_policy::Policy::tiny(0, toolsmith_policy::LoadOptions::default()).expect("tiny");
    let local = LocalBackend::new(policy, "tiny").complete_blocking(&messages, &options, None).expect("local");
    assert_eq!(got.text, local.text);
    assert_eq!(got.usage, local.usage);
    assert_eq!(got.usage.completion_tokens, 24, "an untrained model runs to the budget");
    assert_eq!(got.finish_reason, "length");

    // Streaming: the deltas add up to the same text, then [DONE].
    let body = json!({"model": "tiny", "messages": messages, "max_tokens": 24, "temperature": 0, "stream": true});
    let reply = curl(
        &server,
        &["-X", "POST", "-H", JSON, "--data", &body.to_string(), &format!("{}/v1/chat/completions", server.base)],
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(reply.headers.to_lowercase().contains("text/event-stream"), "{}", reply.headers);
    let data: Vec<&str> = reply.body.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(data.last(), Some(&"[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).expect("chunk")).collect();
    let streamed: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(streamed, local.text);
    assert_eq!(chunks.last().expect("chunks")["choices"][0]["finish_reason"], "length");

    // Bad input: clear 400s, and the server goes on.
    let url = format!("{}/v1/chat/completions", server.base);
    for bad in ["{not json", r#"{"messages": []}"#, r#"{"messages": [{"role": "wizard", "content": "x"}]}"#] {
        let reply = curl(&server, &["-X", "POST", "-H", JSON, "--data", bad, &url]);
        assert_eq!(reply.status, 400, "{bad}: {}", reply.body);
        let error: Value = serde_json::from_str(&reply.body).expect("JSON error");
        assert!(error["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{error}");
    }
    let models = curl(&server, &[&format!("{}/v1/models", server.base)]);
    assert!(models.body.contains("\"tiny\""), "{}", models.body);

    // A whole episode over HTTP: the untrained policy cannot answer, but every turn is served.
    let world = toolsmith_agent::env::World::generate(toolsmith_agent::env::WorldConfig::default());
    let corpus = std::sync::Arc::new(toolsmith_agent::env::Corpus::new(&world.documents()).expect("corpus"));
    let tools = std::sync::Arc::new(toolsmith_agent::tools::LocalTools::new().with_corpus(corpus));
    let config = toolsmith_agent::AgentConfig {
        mode: toolsmith_agent::Mode::React,
        max_turns: 2,
        generate: GenerateOptions { max_tokens: 16, ..GenerateOptions::default() },
        ..toolsmith_agent::AgentConfig::default()
    };
    let agent = toolsmith_agent::Agent::new(std::sync::Arc::new(remote), tools, config);
    let trajectory = runtime.block_on(agent.run(&world.tasks()[0].question));
    assert_eq!(trajectory.finish, toolsmith_agent::Finish::Budget, "{:?}", trajectory.finish);
    assert_eq!(trajectory.turns(), 2);
    assert!(trajectory.steps.iter().all(|s| s.prompt_tokens > 0 && s.response_tokens == 16));
}

/// A fresh tiny policy in `dir`/base: what the daemon serves and its jobs start from.
fn base_policy(dir: &Path) -> String {
    let base = dir.join("base");
    common::ok(&toolsmith().args(["policy", "init", "--seed", "3", "--out"]).arg(&base).output().expect("init"));
    base.to_str().expect("utf-8").to_owned()
}

/// A short SFT job from `init`: oracle traces of one small world, no held-out evaluation, a
/// checkpoint every 2 steps.
fn sft_job(init: &str, steps: u64) -> String {
    json!({"kind": "sft", "config": {
        "init": init, "seed": 3, "steps": steps, "lr": 3e-3,
        "batch_tokens": 2500, "micro_batch_tokens": 2500, "threads": 1, "device": "cpu",
        "eval": null, "checkpoint_every": 2, "tool_format": "brief",
        "data": {"worlds": {"seeds": [5], "countries": 2, "tasks_per_family": 1, "styles": ["react"]}},
    }})
    .to_string()
}

/// One request to the daemon's HTTP API, with the bearer token when there is one.
fn api(server: &HttpServer, method: &str, path: &str, body: Option<&str>, token: Option<&str>) -> Reply {
    let auth = token.map(|t| format!("Authorization: Bearer {t}"));
    let headers: Vec<&str> = [JSON].into_iter().chain(auth.as_deref()).collect();
    common::send(server, method, path, &headers, body)
}

fn json_of(reply: &Reply) -> Value {
    serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", reply.status, reply.body))
}

fn submit(server: &HttpServer, job: &str, token: Option<&str>) -> i64 {
    let reply = api(server, "POST", "/jobs", Some(job), token);
    assert_eq!(reply.status, 201, "{}", reply.body);
    json_of(&reply)["id"].as_i64().expect("id")
}

/// Polls a job until `done` holds (at most 5 minutes).
fn wait_for_job(server: &HttpServer, id: i64, token: Option<&str>, done: impl Fn(&Value) -> bool) -> Value {
    let started = std::time::Instant::now();
    loop {
        let job = json_of(&api(server, "GET", &format!("/jobs/{id}"), None, token));
        if done(&job) {
            return job;
        }
        assert_ne!(job["state"], "failed", "job {id} failed: {job}");
        assert!(started.elapsed() < Duration::from_secs(300), "job {id} is stuck: {job}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The optimiser step of the weights that answer a chat completion.
fn served_step(server: &HttpServer, token: Option<&str>) -> u64 {
    let body = json!({"messages": [{"role": "user", "content": "Where was Ada born?"}], "max_tokens": 1}).to_string();
    let reply = api(server, "POST", "/v1/chat/completions", Some(&body), token);
    assert_eq!(reply.status, 200, "{}", reply.body);
    json_of(&reply)["toolsmith"]["step"].as_u64().expect("the response names its checkpoint step")
}

/// Issue 16, as a user runs it: the daemon serves tools over MCP and the policy over HTTP, takes
/// an SFT job over HTTP, `toolsmith jobs watch` follows it to the end, and the served model
/// changes to each checkpoint while MCP calls go on with no failure.
#[test]
fn the_daemon_trains_the_policy_it_serves_while_tools_keep_answering() {
    use std::sync::atomic::{AtomicBool, Ordering};

    let dir = tempfile::tempdir().expect("tempdir");
    let base = base_policy(dir.path());
    let server = HttpServer::start_in(dir.path(), &["--policy", &base, "--model-name", "tiny"]);
    assert_eq!(served_step(&server, None), 0);
    let stop = AtomicBool::new(false);
    let (id, watched, (calls, failures), seen) = std::thread::scope(|scope| {
        let mcp = scope.spawn(|| {
            let session = Session::open(&server);
            let (mut calls, mut failures) = (0u64, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                calls += 1;
                let n = calls + 10;
                let result = session.call(n, "calculator", json!({"expression": format!("{n} * 2")}));
                if result["isError"] == true || result["structuredContent"]["value"] != json!((n * 2) as f64) {
                    failures.push(result);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            (calls, failures)
        });
        let chat = scope.spawn(|| {
            let mut seen = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                seen.push(served_step(&server, None));
                std::thread::sleep(Duration::from_millis(100));
            }
            seen
        });
        let id = submit(&server, &sft_job(&base, 6), None);
        // The CLI front follows the job's metrics stream to its end.
        let watched =
            toolsmith().args(["jobs", "--server", &server.base, "watch", &id.to_string()]).output().expect("watch");
        stop.store(true, Ordering::Relaxed);
        (id, watched, mcp.join().expect("mcp client"), chat.join().expect("chat client"))
    });
    let stdout = common::ok(&watched);
    assert!(stdout.contains(&format!("job {id} succeeded at step 6/6")), "{stdout}");

    let job = json_of(&api(&server, "GET", &format!("/jobs/{id}"), None, None));
    assert_eq!(
        (job["state"].as_str(), job["step"].as_u64(), job["runs"].as_u64()),
        (Some("succeeded"), Some(6), Some(1))
    );
    // Every answer came from a whole checkpoint, in order, ending on the last one.
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
    assert!(seen.iter().all(|s| [0, 2, 4, 6].contains(s)), "{seen:?}");
    assert_eq!(served_step(&server, None), 6);
    assert!(calls > 0 && failures.is_empty(), "{} of {calls} MCP calls failed: {failures:?}", failures.len());

    // The metrics stream of a finished job: every record, then the job.
    let stream = api(&server, "GET", &format!("/jobs/{id}/metrics"), None, None);
    assert!(stream.headers.to_lowercase().contains("text/event-stream"), "{}", stream.headers);
    let records: Vec<Value> = stream
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| v["kind"] == "train")
        .collect();
    assert_eq!(records.iter().map(|r| r["step"].as_u64().unwrap_or(0)).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5, 6]);
    assert!(stream.body.contains("event: end"), "{}", stream.body);

    let status = json_of(&api(&server, "GET", "/status", None, None));
    assert_eq!(status["training"]["queued"], 0, "{status}");
    assert!(status["calls_served"].as_u64().unwrap_or(0) >= calls, "{status}");
    let list = common::ok(&toolsmith().args(["jobs", "--server", &server.base, "list"]).output().expect("list"));
    assert!(list.lines().any(|l| l.contains("sft") && l.contains("succeeded") && l.contains("6/6")), "{list}");
}

/// `kill -9` of the daemon mid-job: the restarted daemon knows the job, resumes it from its last
/// checkpoint and finishes it with every step recorded once; nothing partial is left, the
/// registry passes `tools doctor`, and the API (behind the token) refuses bad requests clearly.
#[test]
fn a_daemon_killed_mid_job_resumes_it_from_its_last_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret\n").expect("token");
    let base = base_policy(dir.path());
    let args = ["--policy", &base, "--token-file", token_file.to_str().expect("utf-8")];
    let token = Some("s3cret");
    let server = HttpServer::start_in(dir.path(), &args);

    assert_eq!(api(&server, "GET", "/jobs", None, None).status, 401, "jobs are behind the token");
    for bad in [
        "{not json",
        r#"{"kind": "dpo"}"#,
        r#"{"kind": "sft", "config": {"stepz": 3}}"#,
        r#"{"kind": "sft", "config": {"lr": -1}}"#,
    ] {
        let reply = api(&server, "POST", "/jobs", Some(bad), token);
        assert_eq!(reply.status, 400, "{bad}: {}", reply.body);
        assert!(json_of(&reply)["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{}", reply.body);
    }
    assert_eq!(api(&server, "GET", "/jobs/99", None, token).status, 404);

    let id = submit(&server, &sft_job(&base, 10), token);
    wait_for_job(&server, id, token, |j| j["checkpoint"].is_string() && j["step"].as_u64().unwrap_or(0) >= 3);
    let mut server = server;
    server.child.kill().expect("SIGKILL");
    server.child.wait().expect("reap");
    drop(server);

    let server = HttpServer::start_in(dir.path(), &args);
    let job = wait_for_job(&server, id, token, |j| j["state"] != "queued" && j["state"] != "running");
    assert_eq!(
        (job["state"].as_str(), job["step"].as_u64(), job["runs"].as_u64()),
        (Some("succeeded"), Some(10), Some(2)),
        "{job}"
    );
    let run = dir.path().join("jobs").join(id.to_string());
    let steps: Vec<u64> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .expect("metrics")
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["kind"] == "train")
        .filter_map(|v| v["step"].as_u64())
        .collect();
    assert_eq!(steps, (1..=10).collect::<Vec<_>>());
    let partial: Vec<_> = std::fs::read_dir(run.join("checkpoints"))
        .expect("checkpoints")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("partial"))
        .collect();
    assert!(partial.is_empty(), "{partial:?}");
    assert_eq!(served_step(&server, token), 10);

    // Cancel and resume through the CLI front: a cancelled job continues from its checkpoint; a
    // finished one cannot.
    let config = dir.path().join("job.json");
    let job: Value = serde_json::from_str(&sft_job(&base, 4)).expect("job");
    std::fs::write(&config, job["config"].to_string()).expect("config");
    let jobs = |args: &[&str]| {
        toolsmith().args(["jobs", "--server", &server.base, "--token-file"]).arg(&token_file).args(args).output()
    };
    let submitted = common::ok(&jobs(&["submit", "sft", "--config", config.to_str().expect("utf-8")]).expect("submit"));
    let second: i64 = submitted.trim().parse().expect("submit prints the job's id");
    common::ok(&jobs(&["cancel", &second.to_string()]).expect("cancel"));
    let cancelled = wait_for_job(&server, second, token, |j| j["state"] != "queued" && j["state"] != "running");
    assert_eq!(cancelled["state"], "cancelled", "{cancelled}");
    // Queued again; the runner may already have claimed it.
    let resumed = common::ok(&jobs(&["resume", &second.to_string()]).expect("resume"));
    assert!(resumed.contains("queued") || resumed.contains("running"), "{resumed}");
    let done = wait_for_job(&server, second, token, |j| j["state"] != "queued" && j["state"] != "running");
    assert_eq!((done["state"].as_str(), done["step"].as_u64()), (Some("succeeded"), Some(4)), "{done}");
    assert_eq!(api(&server, "POST", &format!("/jobs/{id}/resume"), None, token).status, 409);
    drop(server);

    let doctor = toolsmith()
        .arg("--registry")
        .arg(dir.path().join("registry.db"))
        .args(["tools", "doctor"])
        .output()
        .expect("doctor");
    common::ok(&doctor);
}

/// An agent takes every tool of a world over MCP from one daemon (`eval --tools`): the corpus the
/// daemon serves (`serve --corpus`) is its search tool, the graph's plugins its other tools, and
/// tools it creates in SEARL mode are admitted to the daemon's graph. The oracle solves every
/// family through them as it does with local tools, and the policy endpoint answers beside them.
#[test]
fn an_agent_takes_its_tools_over_mcp_and_its_policy_over_http_from_one_daemon() {
    let dir = tempfile::tempdir().expect("tempdir");
    let world_dir = dir.path().join("world");
    let world = ["--seed", "7", "--countries", "2", "--tasks-per-family", "2"];
    let w = world_dir.to_str().expect("utf-8");
    common::ok(&toolsmith().args(["world", "generate"]).args(world).args(["--out", w]).output().expect("world"));
    let corpus = world_dir.join("corpus.jsonl");
    let corpus = corpus.to_str().expect("utf-8");
    let server = HttpServer::start_in(dir.path(), &["--corpus", corpus, "--policy", "tiny", "--model-name", "tiny"]);
    let mcp = server.mcp();
    // The client keeps its own registry: everything it runs goes through the daemon.
    let client_registry = dir.path().join("client.db");
    let eval = |extra: &[&str]| -> Value {
        let out = toolsmith()
            .arg("--registry")
            .arg(&client_registry)
            .args(["eval", "--tools", &mcp, "--json"])
            .args(world)
            .args(extra)
            .output()
            .expect("eval");
        serde_json::from_str(&common::ok(&out)).expect("one JSON object")
    };
    let status = |server: &HttpServer| json_of(&api(server, "GET", "/status", None, None));
    let before = status(&server)["calls_served"].as_u64().unwrap_or(0);

    let report = eval(&["--mode", "gap"]);
    assert_eq!(report["overall"]["em"], 1.0, "{report}");
    let tasks = std::fs::read_to_string(world_dir.join("tasks.jsonl")).expect("tasks").lines().count();
    assert_eq!(report["overall"]["tasks"], tasks, "{report}");
    let served = status(&server)["calls_served"].as_u64().unwrap_or(0) - before;
    assert!(served >= 10, "the oracle's calls ran on the daemon: {served}");

    // SEARL: the tools the agent creates become nodes of the daemon's graph.
    let report = eval(&["--mode", "searl", "--family", "numeric"]);
    assert_eq!(report["overall"]["em"], 1.0, "{report}");
    let listed = common::ok(
        &toolsmith()
            .arg("--registry")
            .arg(dir.path().join("registry.db"))
            .args(["tools", "list"])
            .output()
            .expect("list"),
    );
    assert!(listed.contains("sum_integers"), "{listed}");

    // The policy over HTTP with the tools over MCP: the untrained model answers nothing, but
    // every episode runs to its end without a backend error.
    let policy = format!("{}/v1", server.base);
    let report =
        eval(&["--policy", &policy, "--model", "tiny", "--limit", "2", "--max-turns", "2", "--max-tokens", "8"]);
    assert_eq!(report["overall"]["tasks"], 2, "{report}");
    assert_eq!(report["overall"]["backend_errors"], 0, "{report}");

    // Bad input: no server there, or a corpus beside the server's tools.
    let out = toolsmith().args(["eval", "--tools", "http://127.0.0.1:9/mcp", "--limit", "1"]).output().expect("eval");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("cannot connect to the MCP server"), "{stderr}");
    let out = toolsmith().args(["eval", "--tools", &mcp, "--corpus", corpus]).output().expect("eval");
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--corpus"));

    // Behind a bearer token: the client sends the one in --tools-token-file, and a wrong one is
    // refused when connecting.
    let (right, wrong) = (dir.path().join("token"), dir.path().join("wrong"));
    std::fs::write(&right, "correct horse\n").expect("write token");
    std::fs::write(&wrong, "wrong horse\n").expect("write token");
    let guarded = HttpServer::start(&["--corpus", corpus, "--token-file", right.to_str().expect("utf-8")]);
    let with = |token: &Path| {
        toolsmith()
            .arg("--registry")
            .arg(&client_registry)
            .args(["eval", "--tools", &guarded.mcp(), "--json", "--limit", "3", "--tools-token-file"])
            .arg(token)
            .args(world)
            .output()
            .expect("eval")
    };
    let report: Value = serde_json::from_str(&common::ok(&with(&right))).expect("one JSON object");
    assert_eq!(report["overall"]["em"], 1.0, "{report}");
    let refused = with(&wrong);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("cannot connect to the MCP server"), "{stderr}");
}
