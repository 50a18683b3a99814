//! `toolsmith serve --http` left running, tried as an attacker would: cross-site requests from a
//! web page, job configs that name files outside the state directory (or a FIFO, a directory, a
//! huge file), endless tool creations, unclosed sessions, malformed JSON-RPC, reserved names and
//! callers' mistakes counted against a tool. Each case gets a clear refusal and changes nothing;
//! the same requests from a well-behaved client (no `Origin`, a JSON body) still work.

mod common;

use std::time::Duration;

use common::{ACCEPT, HttpServer, JSON, Reply, Session, send};
use serde_json::{Value, json};

fn json_of(reply: &Reply) -> Value {
    serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", reply.status, reply.body))
}

fn jobs(server: &HttpServer) -> Vec<Value> {
    json_of(&send(server, "GET", "/jobs", &[], None))["jobs"].as_array().cloned().unwrap_or_default()
}

/// Every state-changing route refuses a browser's cross-site request, token or not, and a body
/// that is not JSON; nothing is queued or swapped. A foreign `Host` is refused too, and every
/// answer says `nosniff`.
#[test]
fn cross_site_requests_change_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = HttpServer::start_in(dir.path(), &["--policy", "tiny", "--model-name", "tiny"]);
    let job = json!({"kind": "sft", "config": {"steps": 1, "eval": null}}).to_string();
    let swap = json!({"model_path": dir.path()}).to_string();
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let routes: [(&str, &str); 4] =
        [("/jobs", &job), ("/update_weights_from_disk", &swap), ("/mcp", ping), ("/jobs/1/cancel", "{}")];
    let foreign: [(&[&str], u16); 5] = [
        (&[JSON, "Origin: http://evil.example"], 403),
        (&[JSON, "Origin: null"], 403),
        (&[JSON, "Sec-Fetch-Site: cross-site"], 403),
        (&["Content-Type: text/plain"], 415),
        (&[], 415),
    ];
    for (path, body) in routes {
        for (headers, status) in foreign {
            let headers = [headers, &[ACCEPT]].concat();
            let reply = send(&server, "POST", path, &headers, Some(body));
            assert_eq!(reply.status, status, "POST {path} with {headers:?}: {}", reply.body);
            assert!(json_of(&reply)["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{}", reply.body);
        }
    }
    let host = send(&server, "POST", "/jobs", &[JSON, "Host: evil.example"], Some(&job));
    assert_eq!(host.status, 403);
    assert!(jobs(&server).is_empty(), "a cross-site request queued a job");

    // The same requests from a client that is not a browser, or from an allowed origin, work.
    let queued = send(&server, "POST", "/jobs", &[JSON, "Origin: http://localhost:3000"], Some(&job));
    assert_eq!(queued.status, 201, "{}", queued.body);
    let id = json_of(&queued)["id"].as_i64().expect("id");
    let cancel = send(&server, "POST", &format!("/jobs/{id}/cancel"), &[], None);
    assert!(cancel.status == 200 || cancel.status == 409, "{} {}", cancel.status, cancel.body);
    let other = dir.path().join("other");
    common::ok(
        &common::toolsmith().args(["policy", "init", "--seed", "4", "--out"]).arg(&other).output().expect("init"),
    );
    let swap = json!({"model_path": other}).to_string();
    let swapped = send(&server, "POST", "/update_weights_from_disk", &[JSON], Some(&swap));
    assert_eq!((swapped.status, json_of(&swapped)["success"].as_bool()), (200, Some(true)), "{}", swapped.body);
    let cli =
        common::toolsmith().args(["jobs", "--server", &server.base, "list"]).output().expect("toolsmith jobs list");
    assert!(common::ok(&cli).contains("sft"));

    for reply in [send(&server, "GET", "/status", &[], None), host, send(&server, "GET", "/jobs/99", &[], None)] {
        assert!(reply.headers.to_ascii_lowercase().contains("x-content-type-options: nosniff"), "{}", reply.headers);
    }
}

/// Job configs name only files under the state directory (or `--allow-dir`), checked when the
/// job is submitted: `/etc/...`, `../`, a symlink out, a FIFO, a directory and an oversized file
/// are each a 400 that names the field, a missing file reads like a forbidden one, and nothing
/// is queued. An allowed directory works.
#[test]
fn job_paths_stay_inside_the_allowed_directories() {
    let state = tempfile::tempdir().expect("state");
    let allowed = tempfile::tempdir().expect("allowed");
    let outside = tempfile::tempdir().expect("outside");
    let secret = outside.path().join("secret.jsonl");
    std::fs::write(&secret, "{}\n").expect("write");
    std::os::unix::fs::symlink(&secret, state.path().join("link.jsonl")).expect("symlink");
    let fifo = state.path().join("fifo.jsonl");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo").success());
    std::fs::create_dir(state.path().join("adir")).expect("mkdir");
    std::fs::write(state.path().join("big.jsonl"), vec![b'\n'; (1 << 20) + 1]).expect("write");
    let chat = r#"{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}"#;
    std::fs::write(allowed.path().join("chats.jsonl"), format!("{chat}\n")).expect("write");
    let allow = allowed.path().to_str().expect("utf-8");
    let server = HttpServer::start_in(state.path(), &["--allow-dir", allow, "--max-data-mb", "1"]);

    let submit = |files: Value, init: Option<&str>| {
        let mut config = json!({"steps": 1, "eval": null, "data": {"files": files}});
        if let Some(init) = init {
            config["init"] = json!(init);
        }
        send(&server, "POST", "/jobs", &[JSON], Some(&json!({"kind": "sft", "config": config}).to_string()))
    };
    let refused = |files: Value, init: Option<&str>, field: &str, says: &str| {
        let reply = submit(files.clone(), init);
        assert_eq!(reply.status, 400, "{files} {init:?}: {}", reply.body);
        let message = json_of(&reply)["error"]["message"].as_str().expect("message").to_owned();
        assert!(message.starts_with(field) && message.contains(says), "{files} {init:?}: {message}");
        message
    };
    let unreadable = "is not a file this server reads";
    let forbidden = refused(json!([secret]), None, "data.files[0]", unreadable);
    let missing_path = state.path().join("missing.jsonl");
    let missing = refused(json!([missing_path]), None, "data.files[0]", unreadable);
    assert_eq!(
        forbidden.replace(secret.to_str().expect("utf-8"), "PATH"),
        missing.replace(missing_path.to_str().expect("utf-8"), "PATH"),
        "a missing file and a forbidden one must read alike"
    );
    assert!(!forbidden.contains("No such file") && !forbidden.contains("ermission"), "{forbidden}");
    refused(json!(["/etc/passwd"]), None, "data.files[0]", unreadable);
    refused(json!(["../../../../../../../../etc/passwd"]), None, "data.files[0]", unreadable);
    refused(json!([allowed.path().join("chats.jsonl"), "link.jsonl"]), None, "data.files[1]", unreadable);
    refused(json!(["fifo.jsonl"]), None, "data.files[0]", "not a regular file");
    refused(json!(["adir"]), None, "data.files[0]", "a directory");
    refused(json!(["big.jsonl"]), None, "data.files[0]", "over this server's cap of 1 MiB");
    refused(json!([]), Some("/etc"), "init", unreadable);
    refused(json!([]), Some("adir/../../"), "init", unreadable);
    assert!(jobs(&server).is_empty(), "a refused job was queued");

    // A file under --allow-dir is taken, as the path it resolved to.
    let taken = submit(json!([allowed.path().join("chats.jsonl")]), None);
    assert_eq!(taken.status, 201, "{}", taken.body);
    let real = allowed.path().canonicalize().expect("real").join("chats.jsonl");
    assert_eq!(json_of(&taken)["config"]["data"]["files"][0], json!(real));
}

/// Two creations that never end hold only the creation pool: an ordinary call still runs at
/// once, and the creation that finds no slot is answered `busy` with a retry hint within the
/// slot wait instead of queueing for the whole deadline.
#[test]
fn endless_creations_never_starve_calls() {
    let server = HttpServer::start(&["--concurrency", "1", "--timeout-ms", "5000", "--slot-wait-ms", "800"]);
    let endless = |name: &str| {
        json!({"name": name, "description": "Never returns.", "arguments": "n (int)", "returns": "nothing",
               "code": format!("def {name}(n: int) -> int:\n    while True:\n        pass\n"), "inputs": {"n": 1}})
    };
    let mut outcomes: Vec<(Value, Duration)> = std::thread::scope(|scope| {
        let server = &server;
        let creations: Vec<_> = ["spin_one", "spin_two"]
            .into_iter()
            .map(|name| {
                let args = endless(name);
                let creation = scope.spawn(move || {
                    let session = Session::open(server);
                    let started = std::time::Instant::now();
                    (session.call(10, "create_and_execute_mcp", args), started.elapsed())
                });
                // The first creation holds the pool's slot before the second asks for it.
                std::thread::sleep(Duration::from_millis(300));
                creation
            })
            .collect();
        let session = Session::open(server);
        for id in 0..3 {
            let quick = session.call(id, "calculator", json!({"expression": "6 * 7"}));
            assert_eq!(quick["structuredContent"], json!({"value": 42.0}), "{quick}");
        }
        creations.into_iter().map(|c| c.join().expect("creation thread")).collect()
    });
    outcomes.sort_by_key(|(reply, _)| reply["isError"] == true);
    let (ran, (busy, waited)) = (&outcomes[0].0, &outcomes[1]);
    assert_eq!(ran["structuredContent"]["creation_success"], false, "{ran}");
    assert_eq!(busy["isError"], true, "{busy}");
    let error = &busy["_meta"]["toolsmith/error"];
    assert_eq!(error["kind"], "busy", "{busy}");
    assert!(error["hint"].as_str().is_some_and(|h| h.contains("retry")), "{busy}");
    assert!(*waited < Duration::from_secs(4), "the refused creation waited {waited:?}");
}

/// Sessions are capped: past `--max-sessions`, opening one closes the longest-idle one, whose
/// client then gets 404 (and would initialize again); the others keep working.
#[test]
fn sessions_are_capped_and_the_longest_idle_closes() {
    let server = HttpServer::start(&["--max-sessions", "3"]);
    let sessions: Vec<Session> = (0..3).map(|_| Session::open(&server)).collect();
    // The first is used again, so the second is now the longest idle.
    assert!(sessions[0].request(1, "ping", json!({}))["result"].is_object());
    let newest = Session::open(&server);
    let gone = sessions[1].post(&json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}).to_string());
    assert_eq!(gone.status, 404, "{}", gone.body);
    for session in [&sessions[0], &sessions[2], &newest] {
        assert!(session.request(3, "ping", json!({}))["result"].is_object());
    }
}

/// Malformed JSON-RPC gets the codes the specification gives, as JSON; a bogus cursor is
/// refused; meta tool names cannot be taken; an unknown tool is a protocol error; a caller's bad
/// arguments do not lower the tool's success rate.
#[test]
fn protocol_errors_reserved_names_and_true_statistics() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = HttpServer::start_in(dir.path(), &[]);
    let session = Session::open(&server);
    for id in ["{}", "1.5", "true", "null", "[1]"] {
        let reply = session.post(&format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#));
        assert_eq!(reply.status, 400, "id {id}: {}", reply.body);
        assert_eq!(json_of(&reply)["error"]["code"], -32600, "id {id}: {}", reply.body);
    }
    for params in [json!({}), json!({"name": 7}), json!({"name": "calculator", "arguments": [1]}), json!([])] {
        let body = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": params});
        let reply = session.post(&body.to_string());
        assert_eq!(json_of(&reply)["error"]["code"], -32602, "{params}: {}", reply.body);
    }
    let cursor = session.request(5, "tools/list", json!({"cursor": "calculator"}));
    assert_eq!(cursor["error"]["code"], -32602, "{cursor}");
    let unknown = session.request(6, "tools/call", json!({"name": "calculater", "arguments": {}}));
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    assert_eq!(unknown["error"]["data"]["error"]["kind"], "not_found");

    for (id, name) in [(7, "search_tools"), (8, "create_and_execute_mcp")] {
        let taken = session.call(
            id,
            "create_and_execute_mcp",
            json!({"name": name, "description": "Shadows a meta tool.", "arguments": "x (int)", "returns": "x",
                   "code": format!("def {name}(x: int) -> int:\n    return x\n"), "inputs": {"x": 1}}),
        );
        assert_eq!(taken["isError"], true, "{taken}");
        assert_eq!(taken["_meta"]["toolsmith/error"]["kind"], "invalid_args", "{taken}");
        assert_eq!(taken["_meta"]["toolsmith/error"]["pointer"], "/name", "{taken}");
        assert!(taken.get("structuredContent").is_none(), "{taken}");
    }

    for id in 10..13 {
        let bad = session.call(id, "calculator", json!({"expression": 1}));
        assert_eq!(bad["_meta"]["toolsmith/error"]["kind"], "invalid_args", "{bad}");
        // The error is in the content too, as text and as JSON.
        let blocks: Vec<&str> =
            bad["content"].as_array().expect("content").iter().filter_map(|c| c["text"].as_str()).collect();
        let parsed: Value = serde_json::from_str(blocks[1]).expect("a JSON text block");
        assert_eq!(parsed["error"], bad["_meta"]["toolsmith/error"]);
    }
    let good = session.call(13, "calculator", json!({"expression": "1 + 1"}));
    assert_eq!(good["structuredContent"], json!({"value": 2.0}));
    let stats = (0..50)
        .find_map(|_| {
            std::thread::sleep(Duration::from_millis(100));
            let tool = json_of(&send(&server, "GET", "/graph/tools/calculator", &[ACCEPT], None));
            let stats = tool["stats"].clone();
            (stats["calls"] == 4).then_some(stats)
        })
        .expect("the calls were recorded");
    assert_eq!((stats["successes"].as_i64(), stats["failures"].as_i64()), (Some(1), Some(0)), "{stats}");
    assert_eq!(stats["failures_by_kind"]["invalid_args"], 3, "{stats}");
    // No tool took a meta tool's name.
    let list = common::toolsmith()
        .arg("--registry")
        .arg(dir.path().join("registry.db"))
        .args(["tools", "list"])
        .output()
        .expect("tools list");
    let list = common::ok(&list);
    assert!(!list.contains("search_tools") && !list.contains("create_and_execute"), "{list}");
    assert!(list.lines().any(|l| l.starts_with("calculator") && l.contains("100%")), "{list}");
}

/// The bearer scheme is case-insensitive (RFC 9110); the token is not.
#[test]
fn the_bearer_scheme_is_case_insensitive() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "Secret\n").expect("token");
    let server = HttpServer::start(&["--token-file", token_file.to_str().expect("utf-8")]);
    for (header, status) in [
        ("Authorization: Bearer Secret", 200),
        ("Authorization: bearer Secret", 200),
        ("authorization: BEARER Secret", 200),
        ("Authorization: Bearer secret", 401),
        ("Authorization: Basic Secret", 401),
    ] {
        assert_eq!(send(&server, "GET", "/status", &[header], None).status, status, "{header}");
    }
}
