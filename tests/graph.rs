//! The live tool-graph page: its API against a running daemon (true usage counts, checkpoint
//! snapshots, bad requests), the static export, and the page itself in headless Chromium
//! (rendering, search, details, a tool admitted during the test, and agent-written markup that
//! must stay text).

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{HttpServer, Reply, Session, curl, ok, toolsmith};
use serde_json::{Value, json};

fn get(server: &HttpServer, path: &str, headers: &[&str]) -> Reply {
    let url = format!("{}{path}", server.base);
    let mut args: Vec<&str> = Vec::new();
    for h in headers {
        args.extend(["-H", h]);
    }
    args.push(&url);
    curl(server, &args)
}

fn json_of(reply: &Reply) -> Value {
    serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", reply.status, reply.body))
}

/// Polls `check` on `/graph.json` until it holds (10 s at most).
fn wait_for_graph(server: &HttpServer, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let started = Instant::now();
    loop {
        let graph = json_of(&get(server, "/graph.json", &[]));
        if check(&graph) {
            return graph;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{what} never happened: {graph}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn node<'a>(graph: &'a Value, name: &str) -> &'a Value {
    graph["nodes"].as_array().and_then(|n| n.iter().find(|n| n["name"] == name)).unwrap_or(&Value::Null)
}

/// A tool whose description and code carry markup an attacker would hope a page renders.
fn hostile_tool() -> Value {
    json!({
        "name": "add_one_hostile",
        "description": "Adds one. <script>window.__xss=1</script> \"><img src=x onerror=\"window.__xss=2\"> \
                        <a href=\"javascript:window.__xss=3\">click</a>",
        "arguments": "x (float)",
        "code": "def add_one_hostile(x: float) -> float:\n    \
                 # </pre><script>window.__xss=4</script><img src=x onerror=window.__xss=5>\n    \
                 return x + 1\n",
        "inputs": {"x": 41},
    })
}

/// Writes a registry holding `tools` (bundled tool names) and snapshots it where a training job
/// keeps its checkpoint's graph.
fn checkpoint_graph(state: &Path, job: u64, step: u64, tools: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("registry.db");
    ok(&toolsmith().arg("--registry").arg(&path).args(["tools", "list"]).output().expect("seed"));
    let names: Vec<String> = {
        let registry = toolsmith_registry::Registry::open(&path).expect("open");
        registry.list(Default::default()).expect("list").into_iter().map(|t| t.name).collect()
    };
    for name in names.iter().skip(tools) {
        ok(&toolsmith().arg("--registry").arg(&path).args(["tools", "remove", name]).output().expect("remove"));
    }
    let at = state.join(format!("jobs/{job}/checkpoints/step-{step:08}"));
    std::fs::create_dir_all(&at).expect("checkpoint dir");
    toolsmith_registry::Registry::open(&path).expect("open").snapshot(&at.join("registry.db")).expect("snapshot");
}

#[test]
fn the_graph_api_counts_every_call_and_answers_bad_requests_clearly() {
    let dir = tempfile::tempdir().expect("tempdir");
    checkpoint_graph(dir.path(), 7, 2, 2);
    checkpoint_graph(dir.path(), 7, 4, 3);
    std::fs::create_dir_all(dir.path().join("jobs/7/checkpoints/step-00000006")).expect("dir");
    std::fs::write(dir.path().join("jobs/7/checkpoints/step-00000006/registry.db"), b"garbage, not SQLite at all")
        .expect("corrupt snapshot");
    let server = HttpServer::start_in(dir.path(), &[]);

    let page = get(&server, "/graph", &[]);
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.headers.to_ascii_lowercase().contains("content-security-policy: default-src 'none'; script-src 'sha256-")
    );
    assert!(page.body.contains("<canvas id=\"graph\""));

    // Calls through MCP: three that work, one with bad arguments.
    let session = Session::open(&server);
    for (i, expression) in ["1+1", "2*3", "10/4"].iter().enumerate() {
        let result = session.call(i as u64 + 1, "calculator", json!({"expression": expression}));
        assert_eq!(result["isError"], false, "{result}");
    }
    let bad = session.call(9, "calculator", json!({"expression": 5}));
    assert_eq!(bad["isError"], true, "{bad}");
    let graph = wait_for_graph(&server, "four calculator calls", |g| node(g, "calculator")["calls"] == 4);
    // Bad arguments are the caller's mistake, not a failure of the tool.
    assert_eq!(node(&graph, "calculator")["failures"], 0);
    assert_eq!(graph["format"], 1);
    assert_eq!(graph["source"], json!({"kind": "live"}));
    assert!(graph["stats"]["tools"].as_i64().is_some_and(|n| n >= 4), "{graph}");

    let details = json_of(&get(&server, "/graph/tools/calculator", &[]));
    assert_eq!(details["stats"]["calls"], 4);
    assert_eq!(details["stats"]["failures_by_kind"], json!({"invalid_args": 1}));
    assert_eq!(details["kind"], "plugin");
    assert!(details["input_schema"]["properties"]["expression"].is_object(), "{details}");
    // The CLI reads the same registry and agrees with the page.
    let registry = dir.path().join("registry.db");
    let shown = ok(&toolsmith()
        .arg("--registry")
        .arg(&registry)
        .args(["tools", "show", "calculator", "--json"])
        .output()
        .expect("tools show"));
    let shown: Value = serde_json::from_str(&shown).expect("json");
    assert_eq!(shown["tool"]["stats"]["usage_count"], 4, "{shown}");

    // Server-sent events: a call made while a page listens reaches it.
    let events = Command::new("curl")
        .args(["-sS", "-N", "--max-time", "8", &format!("{}/graph/events", server.base)])
        .stdout(Stdio::piped())
        .spawn()
        .expect("curl events");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(session.call(10, "calculator", json!({"expression": "7-2"}))["isError"], false);
    let streamed = events.wait_with_output().expect("events");
    let text = String::from_utf8_lossy(&streamed.stdout);
    let calls: Vec<i64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .filter_map(|e| e["calls"].as_i64())
        .collect();
    assert!(text.contains("event: graph") && calls.last().is_some_and(|&c| c >= 5), "{text}");

    // Search runs the hybrid retrieval; bad searches are 400s that say why.
    let found = json_of(&get(&server, "/graph/search?q=evaluate%20an%20arithmetic%20expression&k=3", &[]));
    assert_eq!(found["hits"][0]["name"], "calculator", "{found}");
    for bad in ["/graph/search", "/graph/search?q=%20", "/graph/search?q=x&k=0", "/graph/search?q=x&k=many"] {
        let reply = get(&server, bad, &[]);
        assert_eq!(reply.status, 400, "{bad}: {}", reply.body);
        assert!(json_of(&reply)["error"].as_str().is_some_and(|e| !e.is_empty()));
    }
    let long = format!("/graph/search?q={}", "a".repeat(1001));
    assert_eq!(get(&server, &long, &[]).status, 400);

    // Unknown tools and pages: 404, as JSON for the API and as a page for a browser.
    let missing = get(&server, "/graph/tools/no_such_tool", &[]);
    assert_eq!(missing.status, 404);
    assert!(json_of(&missing)["error"].as_str().is_some_and(|e| e.contains("no_such_tool")));
    let missing = get(&server, "/graph/tools/%3Cscript%3Ealert(1)%3C%2Fscript%3E", &["Accept: text/html"]);
    assert_eq!(missing.status, 404);
    assert!(missing.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;") && !missing.body.contains("<script>"));
    assert_eq!(get(&server, "/graph/no/such/page", &[]).status, 404);
    let linked = get(&server, "/graph/tools/calculator", &["Accept: text/html"]);
    assert_eq!(linked.status, 303);
    assert!(linked.headers.to_ascii_lowercase().contains("location: /graph#tool=calculator"), "{}", linked.headers);

    // Checkpoint snapshots: listed, stepped through, and a corrupt one is an error, not a panic.
    let listed = json_of(&get(&server, "/graph/checkpoints", &[]));
    let steps: Vec<(Value, Value, Value)> = listed["checkpoints"]
        .as_array()
        .expect("checkpoints")
        .iter()
        .map(|c| (c["job"].clone(), c["step"].clone(), c["tools"].clone()))
        .collect();
    assert_eq!(
        steps,
        [(json!("7"), json!(2), json!(2)), (json!("7"), json!(4), json!(3)), (json!("7"), json!(6), json!(0))]
    );
    let at_two = json_of(&get(&server, "/graph.json?job=7&step=2", &[]));
    assert_eq!(at_two["source"], json!({"kind": "checkpoint", "job": "7", "step": 2}));
    assert_eq!(at_two["stats"]["tools"], 2);
    let at_four = json_of(&get(&server, "/graph.json?job=7&step=4", &[]));
    assert_eq!(at_four["stats"]["tools"], 3);
    let name = at_four["nodes"][0]["name"].as_str().expect("a node");
    assert_eq!(json_of(&get(&server, &format!("/graph/tools/{name}?job=7&step=4"), &[]))["name"], name);
    let corrupt = get(&server, "/graph.json?job=7&step=6", &[]);
    assert_eq!(corrupt.status, 500, "{}", corrupt.body);
    assert!(json_of(&corrupt)["error"].as_str().is_some_and(|e| e.contains("registry")), "{}", corrupt.body);
    assert_eq!(get(&server, "/graph.json?job=7&step=3", &[]).status, 404);
    assert_eq!(get(&server, "/graph.json?job=7", &[]).status, 400);
    assert_eq!(get(&server, "/graph.json?job=7&step=two", &[]).status, 400);
    // DNS rebinding: a page whose name points here is not answered.
    let rebound = get(&server, "/graph.json", &["Host: attacker.example"]);
    assert_eq!(rebound.status, 403, "{}", rebound.body);
    assert_eq!(get(&server, "/status", &["Host: attacker.example:80"]).status, 403);
    assert_eq!(get(&server, "/graph.json", &["Host: localhost"]).status, 200);
    // The server is still up after all of that.
    assert_eq!(get(&server, "/health", &[]).body.trim(), "ok");
}

#[test]
fn the_page_needs_the_token_and_a_browser_keeps_it_in_a_cookie() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret\n").expect("token");
    let server = HttpServer::start_in(dir.path(), &["--token-file", token_file.to_str().expect("utf-8")]);
    for path in ["/graph", "/graph.json", "/graph/events", "/graph/tools/calculator", "/graph?token=wrong"] {
        assert_eq!(get(&server, path, &[]).status, 401, "{path}");
    }
    let page = get(&server, "/graph?token=s3cret", &[]);
    assert_eq!(page.status, 200);
    let port = server.base.rsplit(':').next().expect("port");
    let name = format!("toolsmith_token_{port}");
    let hex: String = "s3cret".bytes().map(|b| format!("{b:02x}")).collect();
    let cookie = page.headers.lines().find(|l| l.to_ascii_lowercase().starts_with("set-cookie:")).expect("a cookie");
    assert!(
        cookie.contains(&format!("{name}={hex}")) && cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let with_cookie = format!("Cookie: {name}={hex}");
    assert_eq!(get(&server, "/graph.json", &[&with_cookie]).status, 200);
    assert_eq!(get(&server, "/graph.json", &[&format!("Cookie: {name}=6e6f7065")]).status, 401);
    // The cookie is the graph page's only: the API and MCP still need the header.
    assert_eq!(get(&server, "/status", &[&with_cookie]).status, 401);
    // Another port's cookie, or a cookie from before the token changed, does not get in; a fresh
    // ?token= still does.
    assert_eq!(get(&server, "/graph.json", &[&format!("Cookie: toolsmith_token_1={hex}")]).status, 401);
    let stale = format!("Cookie: {name}=6f6c64");
    assert_eq!(get(&server, "/graph?token=s3cret", &[&stale]).status, 200);
    assert_eq!(get(&server, "/graph.json", &["Authorization: Bearer s3cret"]).status, 200);
}

#[test]
fn evaluations_count_their_calls_and_the_static_page_holds_the_graph() {
    let dir = tempfile::tempdir().expect("tempdir");
    let registry = dir.path().join("registry.db");
    let run = |args: &[&str]| toolsmith().arg("--registry").arg(&registry).args(args).output().expect("run");
    ok(&run(&["tools", "list"]));
    let out = dir.path().join("eval.json");
    ok(&run(&["eval", "--mode", "react", "--limit", "6", "--out", out.to_str().expect("utf-8")]));
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&out).expect("report")).expect("json");
    let searches: Vec<usize> = report["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| {
            let steps = r["trajectory"]["steps"].as_array().cloned().unwrap_or_default();
            steps
                .iter()
                .flat_map(|s| s["calls"].as_array().cloned().unwrap_or_default())
                .filter(|c| c["name"] == "search")
                .count()
        })
        .collect();
    let calls: usize = searches.iter().sum();
    assert!(calls >= 6, "the oracle searches at least once per task: {searches:?}");
    let shown: Value = serde_json::from_str(&ok(&run(&["tools", "show", "search", "--json"]))).expect("json");
    assert_eq!(shown["tool"]["stats"]["usage_count"], calls as i64, "{shown}");
    let episodes = searches.iter().filter(|&&n| n > 0).count() as i64;
    assert_eq!(shown["tool"]["stats"]["reward_count"], episodes, "one reward per episode that used the tool");

    let page = dir.path().join("graph.html");
    ok(&run(&["tools", "graph", "--html", page.to_str().expect("utf-8")]));
    let text = std::fs::read_to_string(&page).expect("page");
    let data = toolsmith_daemon::graph::static_data(&text).expect("the page carries its data");
    let search = data["graph"]["nodes"].as_array().expect("nodes").iter().find(|n| n["name"] == "search").cloned();
    assert_eq!(search.expect("search node")["calls"], calls as i64);
    assert!(data["details"]["calculator"]["input_schema"].is_object());
}

/// Evaluates `js` in the page until it returns true (10 s at most).
fn wait_until(tab: &headless_chrome::Tab, what: &str, js: &str) {
    let started = Instant::now();
    loop {
        let value = tab.evaluate(js, false).ok().and_then(|r| r.value);
        if value == Some(Value::Bool(true)) {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{what}: `{js}` stayed {value:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn eval_string(tab: &headless_chrome::Tab, js: &str) -> String {
    let value = tab.evaluate(js, false).expect("evaluate").value.unwrap_or(Value::Null);
    value.as_str().map(str::to_string).unwrap_or_else(|| value.to_string())
}

#[test]
fn the_page_renders_searches_updates_live_and_keeps_agent_text_as_text() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = HttpServer::start_in(dir.path(), &[]);
    let session = Session::open(&server);
    assert_eq!(session.call(1, "calculator", json!({"expression": "6*7"}))["isError"], false);
    wait_for_graph(&server, "a calculator call", |g| node(g, "calculator")["calls"] == 1);

    let browser = common::browser(Duration::from_secs(120));
    let tab = browser.new_tab().expect("tab");
    // Any dialog (alert, confirm) is an injected script running: note it and dismiss it.
    tab.evaluate("0", false).expect("page context");
    tab.navigate_to(&format!("{}/graph", server.base)).expect("navigate").wait_until_navigated().expect("loaded");
    tab.evaluate("window.alert = window.confirm = window.prompt = () => { window.__xss = 'dialog'; }", false)
        .expect("trap dialogs");
    wait_until(&tab, "the page draws the graph", "document.body.dataset.state === 'ready'");
    let nodes: usize = eval_string(&tab, "document.getElementById('graph').dataset.nodes").parse().expect("count");
    let tools = json_of(&get(&server, "/graph.json", &[]))["nodes"].as_array().expect("nodes").len();
    assert_eq!(nodes, tools);
    assert!(
        eval_string(&tab, "document.querySelectorAll('#tool-list li[data-name]').length").parse::<usize>().expect("n")
            >= 4
    );

    // Search with the box: the hits are listed and marked.
    let search = tab.wait_for_element("#search").expect("search box");
    search.click().expect("focus");
    tab.type_str("evaluate an arithmetic expression").expect("type");
    tab.press_key("Enter").expect("enter");
    wait_until(&tab, "search hits", "(document.body.dataset.hits || '').split(',').includes('calculator')");

    // Open a tool's details from the list.
    tab.wait_for_element("#tool-list li[data-name='calculator']").expect("list item").click().expect("click");
    wait_until(&tab, "details open", "document.getElementById('details-name').textContent === 'calculator'");
    let meta = eval_string(&tab, "document.getElementById('details').textContent");
    assert!(meta.contains("expression"), "the input schema is shown: {meta}");

    // A tool admitted while the page is open appears without a reload.
    let generation = eval_string(&tab, "document.body.dataset.generation");
    let created = session.call(2, "create_and_execute_mcp", hostile_tool());
    assert_eq!(created["structuredContent"]["creation_success"], true, "{created}");
    wait_until(
        &tab,
        "the new tool appears",
        &format!(
            "document.body.dataset.generation !== '{generation}' && \
             document.querySelector(\"#tool-list li[data-name='add_one_hostile']\") !== null && \
             Number(document.getElementById('graph').dataset.nodes) === {}",
            tools + 1
        ),
    );

    // Its markup stays text: shown literally, never run.
    tab.evaluate("window.toolsmith.select('add_one_hostile')", false).expect("select");
    wait_until(&tab, "hostile details", "document.getElementById('details-name').textContent === 'add_one_hostile'");
    wait_until(&tab, "its code", "(document.getElementById('details-code') || {}).textContent !== undefined");
    let description = eval_string(&tab, "document.getElementById('details-description').textContent");
    assert!(
        description.contains("<script>window.__xss=1</script>") && description.contains("onerror"),
        "{description}"
    );
    let code = eval_string(&tab, "document.getElementById('details-code').textContent");
    assert!(code.contains("<script>window.__xss=4</script>"), "{code}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(eval_string(&tab, "String(window.__xss)"), "undefined", "agent-written markup ran");
    let injected = "document.querySelectorAll('img, a[href^=\"javascript\"], #details script').length";
    assert_eq!(eval_string(&tab, injected), "0");

    // A link to a tool opens the page with that tool selected.
    tab.navigate_to(&format!("{}/graph/tools/calculator", server.base))
        .expect("navigate")
        .wait_until_navigated()
        .expect("loaded");
    wait_until(&tab, "the linked tool opens", "document.getElementById('details-name').textContent === 'calculator'");
    tab.evaluate("window.toolsmith.search('add one')", false).expect("search");
    wait_until(&tab, "hits", "(document.body.dataset.hits || '').length > 0");

    let png = tab
        .capture_screenshot(headless_chrome::protocol::cdp::Page::CaptureScreenshotFormatOption::Png, None, None, true)
        .expect("screenshot");
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("graph-page.png");
    std::fs::write(&shot, &png).expect("write screenshot");
    if let Some(copy) = std::env::var_os("TOOLSMITH_SCREENSHOT") {
        std::fs::write(copy, &png).expect("write the screenshot copy");
    }
    assert!(png.len() > 10_000, "a rendered page, not a blank one");
}

/// A page left open does not hold the server at shutdown, and the calls made just before are
/// counted.
#[test]
fn an_open_page_does_not_hold_shutdown_and_the_last_calls_are_counted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = HttpServer::start_in(dir.path(), &[]);
    let events = Command::new("curl")
        .args(["-sS", "-N", "--max-time", "60", &format!("{}/graph/events", server.base)])
        .stdout(Stdio::piped())
        .spawn()
        .expect("curl events");
    std::thread::sleep(Duration::from_millis(500));
    let session = Session::open(&server);
    for id in 1..=3 {
        assert_eq!(session.call(id, "calculator", json!({"expression": "1+2"}))["isError"], false);
    }
    let pid = server.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().expect("kill").success());
    let started = Instant::now();
    let exit = loop {
        if let Some(status) = server.child.try_wait().expect("wait") {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "the server did not stop with a page open");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "{exit:?}");
    let streamed = events.wait_with_output().expect("events");
    assert!(String::from_utf8_lossy(&streamed.stdout).contains("event: graph"), "the stream opened with the state");
    let shown = ok(&toolsmith()
        .arg("--registry")
        .arg(dir.path().join("registry.db"))
        .args(["tools", "show", "calculator", "--json"])
        .output()
        .expect("tools show"));
    let shown: Value = serde_json::from_str(&shown).expect("json");
    assert_eq!(shown["tool"]["stats"]["usage_count"], 3, "{shown}");
}
