//! `toolsmith env serve` over real HTTP and WebSocket: episodes driven by a scripted client,
//! rewards equal to the method's, and every way a client can go wrong.

mod common;

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message as Ws;
use toolsmith_agent::Mode;
use toolsmith_env::EnvOptions;
use toolsmith_train::rl::Method;

use common::{Scripted, config, environment, serve};

async fn post(url: &str, body: Value) -> (u16, Value) {
    let r = reqwest::Client::new().post(url).json(&body).send().await.expect("post");
    let status = r.status().as_u16();
    (status, r.json().await.expect("json"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_episode_runs_to_the_methods_reward() {
    let dir = tempfile::tempdir().expect("tempdir");
    let env = environment(config(Method::GAP), dir.path(), EnvOptions::default());
    let url = serve(env.clone()).await;
    let script = Scripted::new(&env, Mode::Gap);
    let task = common::all_tasks(&env).into_iter().find(|t| t.solution.is_some()).expect("a task");

    let (status, reset) = post(&format!("{url}/reset"), json!({"task_id": task.id, "world": 0})).await;
    assert_eq!(status, 200, "{reset}");
    assert_eq!(reset["reward"], Value::Null);
    assert_eq!(reset["done"], false);
    let id = reset["observation"]["episode_id"].as_str().expect("episode_id").to_string();
    let messages = reset["observation"]["messages"].as_array().expect("messages");
    assert_eq!(messages[0]["role"], "system");
    assert!(messages[0]["content"].as_str().expect("system").contains("Tools:"), "the listing is in the prompt");
    assert_eq!(messages[1]["content"], task.question);
    assert!(!reset["observation"]["tools"].as_array().expect("tools").is_empty());

    let mut observation = reset["observation"].clone();
    let mut last = Value::Null;
    for _ in 0..8 {
        let text = script.turn(&observation).await;
        let (status, step) = post(&format!("{url}/step"), json!({"episode_id": id, "action": {"text": text}})).await;
        assert_eq!(status, 200, "{step}");
        observation = step["observation"].clone();
        last = step;
        if last["done"] == true {
            break;
        }
        assert_eq!(last["reward"], 0.0, "no reward before the end");
        assert!(!observation["observation"].as_str().unwrap_or_default().is_empty(), "the calls' results come back");
    }
    assert_eq!(last["done"], true, "the oracle answers within the budget: {last}");
    // The oracle is right, so GAP's reward is the outcome's 1.
    assert_eq!(last["reward"], 1.0, "{last}");
    assert_eq!(last["observation"]["result"]["correct"], true);

    let state: Value =
        reqwest::get(format!("{url}/state?episode_id={id}")).await.expect("state").json().await.expect("json");
    assert_eq!(state["done"], true);
    assert_eq!(state["task_id"], task.id);

    // A step after the end is refused, and names the episode.
    let (status, body) = post(&format!("{url}/step"), json!({"episode_id": id, "action": {"text": "more"}})).await;
    assert_eq!(status, 409, "{body}");
    assert!(body["detail"].as_str().expect("detail").contains("has ended"));
    let (_, closed) = post(&format!("{url}/close"), json!({"episode_id": id})).await;
    assert_eq!(closed["closed"], true);
    assert_eq!(env.open_sessions(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_errors_and_leave_the_episode_as_it_was() {
    let dir = tempfile::tempdir().expect("tempdir");
    let env = environment(config(Method::GAP), dir.path(), EnvOptions { max_sessions: 2, ..EnvOptions::default() });
    let url = serve(env.clone()).await;

    let (status, body) = post(&format!("{url}/step"), json!({"episode_id": "nobody", "action": {"text": "x"}})).await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = post(&format!("{url}/reset"), json!({"task_id": "no-such-task"})).await;
    assert_eq!(status, 422, "{body}");
    let (status, body) = post(&format!("{url}/reset"), json!({"seed": -1})).await;
    assert_eq!(status, 422, "{body}");
    let raw = reqwest::Client::new()
        .post(format!("{url}/reset"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .expect("post");
    assert_eq!(raw.status().as_u16(), 422);

    let (_, reset) = post(&format!("{url}/reset"), json!({"seed": 3})).await;
    let id = reset["observation"]["episode_id"].as_str().expect("id").to_string();
    for (action, says) in [
        (json!({"txt": "x"}), "unknown action field"),
        (json!({"text": 5}), "text must be a string"),
        (json!({"ids": [1, 2, 99_999_999]}), "outside the vocabulary"),
        (json!({"ids": [1, 2], "logprobs": [0.0]}), "2 ids but 1 logprobs"),
        (json!({"text": "a", "ids": [1]}), "not both"),
        (json!({"type": "dance"}), "unknown action type"),
    ] {
        let (status, body) = post(&format!("{url}/step"), json!({"episode_id": id, "action": action})).await;
        assert_eq!(status, 422, "{action}: {body}");
        assert!(body["detail"].as_str().expect("detail").contains(says), "{action}: {body}");
    }
    let (status, body) = post(&format!("{url}/step"), json!({"action": {"text": "x"}})).await;
    assert_eq!(status, 422, "a turn over HTTP names its episode: {body}");
    // None of that took a turn: the episode is where reset left it.
    let state: Value =
        reqwest::get(format!("{url}/state?episode_id={id}")).await.expect("state").json().await.expect("json");
    assert_eq!(state["step_count"], 0);
    assert_eq!(state["done"], false);

    // A turn of token ids is decoded with the environment's tokenizer and taken.
    let ids = toolsmith_policy::Tokenizer::tiny().expect("tokenizer").encode("<think>hm</think>").expect("encode");
    let (status, body) = post(&format!("{url}/step"), json!({"episode_id": id, "action": {"ids": ids}})).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["observation"]["observation"].as_str().is_some());

    // The table is capped.
    let (status, _) = post(&format!("{url}/reset"), json!({})).await;
    assert_eq!(status, 200);
    let (status, body) = post(&format!("{url}/reset"), json!({})).await;
    assert_eq!(status, 503, "{body}");
    assert!(body["detail"].as_str().expect("detail").contains("--max-sessions"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_sessions_are_apart_and_end_with_their_connection() {
    let dir = tempfile::tempdir().expect("tempdir");
    let env = environment(config(Method::GAP), dir.path(), EnvOptions::default());
    let url = serve(env.clone()).await;
    let script = Scripted::new(&env, Mode::Gap);
    let ws_url = url.replace("http://", "ws://") + "/ws";
    let tasks = common::all_tasks(&env);

    async fn ask(
        ws: &mut (impl SinkExt<Ws> + StreamExt<Item = Result<Ws, tokio_tungstenite::tungstenite::Error>> + Unpin),
        msg: Value,
    ) -> Value {
        let _ = ws.send(Ws::Text(msg.to_string().into())).await;
        loop {
            match ws.next().await.expect("a reply").expect("frame") {
                Ws::Text(t) => return serde_json::from_str(&t).expect("json"),
                _ => continue,
            }
        }
    }

    let (mut a, _) = tokio_tungstenite::connect_async(&ws_url).await.expect("connect a");
    let (mut b, _) = tokio_tungstenite::connect_async(&ws_url).await.expect("connect b");
    let ra = ask(&mut a, json!({"type": "reset", "data": {"task_id": tasks[0].id}})).await;
    let rb = ask(&mut b, json!({"type": "reset", "data": {"task_id": tasks[1].id}})).await;
    assert_eq!(ra["type"], "observation", "{ra}");
    assert_eq!(ra["data"]["observation"]["question"], tasks[0].question);
    assert_eq!(rb["data"]["observation"]["question"], tasks[1].question);
    assert_eq!(env.open_sessions(), 2);

    // A turn on one connection moves its episode only.
    let text = script.turn(&ra["data"]["observation"]).await;
    let step = ask(&mut a, json!({"type": "step", "data": {"text": text}})).await;
    assert_eq!(step["type"], "observation", "{step}");
    let sa = ask(&mut a, json!({"type": "state"})).await;
    let sb = ask(&mut b, json!({"type": "state"})).await;
    assert_eq!(sa["data"]["step_count"], 1);
    assert_eq!(sb["data"]["step_count"], 0);

    // Errors keep the socket open, in OpenEnv's codes.
    assert_eq!(ask(&mut a, json!({"type": "bogus"})).await["data"]["code"], "UNKNOWN_TYPE");
    let _ = a.send(Ws::Text("not json".into())).await;
    let reply: Value = match a.next().await.expect("reply").expect("frame") {
        Ws::Text(t) => serde_json::from_str(&t).expect("json"),
        other => panic!("{other:?}"),
    };
    assert_eq!(reply["data"]["code"], "INVALID_JSON");
    assert_eq!(ask(&mut a, json!({"type": "step", "data": {"bad": 1}})).await["data"]["code"], "VALIDATION_ERROR");

    // MCP over the socket lists the episodes' tools and calls them.
    let listed = ask(&mut a, json!({"type": "mcp", "data": {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}})).await;
    let names: Vec<&str> = listed["data"]["result"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"search"), "{names:?}");
    let called = ask(
        &mut a,
        json!({"type": "step", "data": {"type": "call_tool", "tool_name": "search", "arguments": {"query": tasks[0].question}}}),
    )
    .await;
    assert_eq!(called["data"]["observation"]["result"]["isError"], false, "{called}");

    // A client that goes away mid-episode leaves nothing behind; `close` too.
    drop(b);
    let _ = a.send(Ws::Text(json!({"type": "close"}).to_string().into())).await;
    for _ in 0..50 {
        if env.open_sessions() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(env.open_sessions(), 0, "both sessions ended with their connections");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_episodes_are_closed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = EnvOptions { idle_timeout: Duration::from_millis(200), ..EnvOptions::default() };
    let env = environment(config(Method::GAP), dir.path(), options);
    let url = serve(env.clone()).await;
    let (_, reset) = post(&format!("{url}/reset"), json!({})).await;
    let id = reset["observation"]["episode_id"].as_str().expect("id").to_string();
    assert_eq!(env.open_sessions(), 1);
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(env.open_sessions(), 0, "the reaper closed the idle episode");
    let (status, _) = post(&format!("{url}/step"), json!({"episode_id": id, "action": {"text": "x"}})).await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_routes_openenv_validate_checks_answer_as_it_expects() {
    let dir = tempfile::tempdir().expect("tempdir");
    let env = environment(config(Method::GAP), dir.path(), EnvOptions::default());
    let url = serve(env).await;
    let get = |path: &str| {
        let url = format!("{url}{path}");
        async move { reqwest::get(url).await.expect("get").json::<Value>().await.expect("json") }
    };
    assert_eq!(get("/health").await["status"], "healthy");
    let openapi = get("/openapi.json").await;
    assert!(openapi["info"]["version"].as_str().expect("version").starts_with("1."));
    for path in ["/reset", "/step", "/state"] {
        assert!(openapi["paths"].get(path).is_some(), "{path}");
    }
    let schema = get("/schema").await;
    for part in ["action", "observation", "state"] {
        assert!(schema[part].is_object(), "{part}");
    }
    assert!(get("/metadata").await["name"].is_string());
    let (status, body) = post(&format!("{url}/mcp"), json!({})).await;
    assert_eq!((status, body["jsonrpc"].as_str()), (200, Some("2.0")));
    assert_eq!(body["error"]["code"], -32600);
    let (_, body) = post(&format!("{url}/mcp"), json!({"jsonrpc": "2.0", "id": 2, "method": "nope"})).await;
    assert_eq!(body["error"]["code"], -32601);
}
