//! Native tool calls: the trace grammar as OpenAI `tools`/`tool_calls` and back, and whole
//! episodes against a scripted OpenAI-compatible stub that calls the bundled world's tools
//! natively (ReAct and GAP), refuses `tools` (auto falls back to text), or is strict about it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use toolsmith_agent::backend::native::{from_native, to_native};
use toolsmith_agent::backend::openai::refuses_tools;
use toolsmith_agent::backend::{Backend, GenerateOptions, Message, OpenAiBackend, ToolCallStyle};
use toolsmith_agent::env::{Corpus, Family, Task, World, WorldConfig};
use toolsmith_agent::runner::observation;
use toolsmith_agent::tools::{Executor, LocalTools, Verdict};
use toolsmith_agent::trace;
use toolsmith_agent::{Agent, AgentConfig, CallRecord, Finish, Mode};

fn record(name: &str, arguments: Value, result: Value) -> CallRecord {
    CallRecord {
        name: name.into(),
        arguments,
        result,
        verdict: Verdict::Valid,
        latency_ms: 1.0,
        started_ms: 0.0,
        level: 0,
        task: None,
        created: None,
    }
}

/// A GAP episode's context: the plan with two parallel calls (and a malformed third, kept as
/// text), their observations and the malformed call's error; then the next level.
#[test]
fn a_gap_conversation_becomes_tool_calls_and_tool_messages() {
    let plan_turn = "<think>Two lookups, independent.</think>\n<plan>\nTask 1: find Ada - Dependencies: none\nTask 2: find Alan - Dependencies: none\n</plan>\n<tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"Ada\"}}</tool_call>\n<tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"Alan\", \"k\": 2}}</tool_call>\n<tool_call>{\"name\": \"search\", \"arguments\": </tool_call>";
    let turn = trace::parse(plan_turn);
    let errors: Vec<String> = turn.tool_calls().into_iter().filter_map(Result::err).map(|e| e.to_string()).collect();
    assert_eq!(errors.len(), 1, "the third call is malformed");
    let ada = json!({"results": [{"title": "Ada", "text": "Ada was born in London."}]});
    let alan = json!({"results": [{"title": "Alan", "text": "Alan was born in Maida Vale."}]});
    let observed = observation(
        &[
            record("search", json!({"query": "Ada"}), ada.clone()),
            record("search", json!({"query": "Alan"}), alan.clone()),
        ],
        &errors,
    );
    let second = "<tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"London\"}}</tool_call>";
    let london = json!({"results": []});
    let messages = vec![
        Message::system("You answer questions with tools."),
        Message::user("Were Ada and Alan born in the same city?"),
        Message::assistant(plan_turn),
        Message::user(&observed),
        Message::assistant(second),
        Message::user(observation(&[record("search", json!({"query": "London"}), london.clone())], &[])),
    ];
    let error_line = format!("<observation>{{\"error\": {}}}</observation>", Value::String(errors[0].clone()));
    assert_eq!(
        Value::Array(to_native(&messages)),
        json!([
            {"role": "system", "content": "You answer questions with tools."},
            {"role": "user", "content": "Were Ada and Alan born in the same city?"},
            {
                "role": "assistant",
                "content": "<think>Two lookups, independent.</think>\n<plan>\nTask 1: find Ada - Dependencies: none\nTask 2: find Alan - Dependencies: none\n</plan>\n<tool_call>{\"name\": \"search\", \"arguments\": </tool_call>",
                "tool_calls": [
                    {"id": "call_0_0", "type": "function", "function": {"name": "search", "arguments": "{\"query\":\"Ada\"}"}},
                    {"id": "call_0_1", "type": "function", "function": {"name": "search", "arguments": "{\"k\":2,\"query\":\"Alan\"}"}},
                ],
            },
            {"role": "tool", "tool_call_id": "call_0_0", "content": ada.to_string()},
            {"role": "tool", "tool_call_id": "call_0_1", "content": alan.to_string()},
            {"role": "user", "content": error_line},
            {
                "role": "assistant",
                "content": null,
                "tool_calls": [
                    {"id": "call_1_0", "type": "function", "function": {"name": "search", "arguments": "{\"query\":\"London\"}"}},
                ],
            },
            {"role": "tool", "tool_call_id": "call_1_0", "content": london.to_string()},
        ])
    );
}

/// MemPO: the memory is the assistant's content; the question and its carried memory stay a
/// user message.
#[test]
fn memory_stays_in_the_assistant_content() {
    let result = json!({"results": [{"title": "Ada", "text": "Ada was born in London."}]});
    let messages = vec![
        Message::system("sys"),
        Message::user("Where was Ada born?\n<mem>nothing yet</mem>"),
        Message::assistant(
            "<mem>Looking Ada up.</mem>\n<tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"Ada\"}}</tool_call>",
        ),
        Message::user(observation(&[record("search", json!({"query": "Ada"}), result.clone())], &[])),
    ];
    assert_eq!(
        Value::Array(to_native(&messages)),
        json!([
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "Where was Ada born?\n<mem>nothing yet</mem>"},
            {
                "role": "assistant",
                "content": "<mem>Looking Ada up.</mem>",
                "tool_calls": [{"id": "call_0_0", "type": "function", "function": {"name": "search", "arguments": "{\"query\":\"Ada\"}"}}],
            },
            {"role": "tool", "tool_call_id": "call_0_0", "content": result.to_string()},
        ])
    );
}

/// Turns that ran nothing, and user messages that are not the runtime's observations, are sent
/// as they are; a ReAct turn's extra call (not run) still gets its `tool` answer.
#[test]
fn other_turns_are_sent_as_written() {
    let malformed = "<think>hm</think>\n<tool_call>{\"name\": \"search\"</tool_call>";
    let messages = vec![
        Message::assistant(malformed),
        Message::user("<observation>{\"error\": \"tool call at byte 18: not JSON\"}</observation>"),
        Message::assistant("<tool_call>{\"name\": \"search\", \"arguments\": {}}</tool_call>"),
        Message::user("not an observation"),
    ];
    assert_eq!(
        Value::Array(to_native(&messages)),
        json!([
            {"role": "assistant", "content": malformed},
            {"role": "user", "content": "<observation>{\"error\": \"tool call at byte 18: not JSON\"}</observation>"},
            {"role": "assistant", "content": "<tool_call>{\"name\": \"search\", \"arguments\": {}}</tool_call>"},
            {"role": "user", "content": "not an observation"},
        ])
    );

    let two = "<tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"a\"}}</tool_call><tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"b\"}}</tool_call>";
    let error = "react mode runs one call per turn; 1 calls were not run".to_string();
    let messages = vec![
        Message::assistant(two),
        Message::user(observation(&[record("search", json!({"query": "a"}), json!(1))], &[error])),
    ];
    let native = to_native(&messages);
    assert_eq!(native.len(), 4, "{native:?}");
    assert_eq!(native[1], json!({"role": "tool", "tool_call_id": "call_0_0", "content": "1"}));
    assert_eq!(native[2], json!({"role": "tool", "tool_call_id": "call_0_1", "content": "{\"error\":\"not run\"}"}));
    assert_eq!(native[3]["role"], "user");
    assert!(native[3]["content"].as_str().is_some_and(|c| c.contains("1 calls were not run")));
}

/// A response's content and native calls become one grammar turn the agent parses; arguments
/// that are not a JSON object are written so that the agent reports a malformed call.
#[test]
fn a_response_becomes_one_grammar_turn() {
    let message = json!({
        "role": "assistant",
        "content": "<plan>\nTask 1: a - Dependencies: none\nTask 2: b - Dependencies: none\n</plan>",
        "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "search", "arguments": "{\"query\": \"a </tool_call> b\"}"}},
            {"id": "y", "type": "function", "function": {"name": "search", "arguments": "{\"query\": \"b\"}"}},
            {"id": "z", "type": "function", "function": {"name": "search", "arguments": "{\"query\": "}},
        ],
    });
    let text = from_native(&message);
    assert_eq!(
        text,
        "<plan>\nTask 1: a - Dependencies: none\nTask 2: b - Dependencies: none\n</plan>\n<tool_call>{\"name\": \"search\", \"arguments\": {\"query\":\"a <\\/tool_call> b\"}}</tool_call>\n<tool_call>{\"name\": \"search\", \"arguments\": {\"query\":\"b\"}}</tool_call>\n<tool_call>{\"name\": \"search\", \"arguments\": \"{\\\"query\\\": \"}</tool_call>"
    );
    let turn = trace::parse(&text);
    assert!(turn.plan().is_some_and(|p| p.is_ok()));
    let calls = turn.tool_calls();
    assert_eq!(calls.len(), 3);
    let first = calls[0].as_ref().expect("first call");
    assert_eq!(first.arguments["query"], "a </tool_call> b", "the escape is the same JSON text");
    assert_eq!(calls[1].as_ref().expect("second call").arguments["query"], "b");
    let error = calls[2].as_ref().expect_err("the third call's arguments are not an object").to_string();
    assert!(error.contains("\"arguments\" of `search` must be an object"), "{error}");

    // Content as text parts, and no content at all.
    let parts = json!({"content": [{"type": "text", "text": "<think>a</think>"}, {"type": "text", "text": "<answer>\\boxed{b}</answer>"}]});
    assert_eq!(from_native(&parts), "<think>a</think><answer>\\boxed{b}</answer>");
    let bare = json!({"content": null, "tool_calls": [{"function": {"name": "now", "arguments": ""}}]});
    assert_eq!(from_native(&bare), "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>");
}

/// What the agent stores of a native turn converts back to the same calls.
#[test]
fn native_turns_round_trip() {
    let message = json!({
        "content": "<mem>so far: nothing</mem>",
        "tool_calls": [{"id": "q", "type": "function", "function": {"name": "search", "arguments": "{\"query\":\"Ada\"}"}}],
    });
    let text = from_native(&message);
    let messages = vec![
        Message::assistant(&text),
        Message::user(observation(&[record("search", json!({"query": "Ada"}), json!([]))], &[])),
    ];
    let native = to_native(&messages);
    assert_eq!(native[0]["content"], message["content"]);
    assert_eq!(native[0]["tool_calls"][0]["function"], message["tool_calls"][0]["function"]);
}

#[test]
fn refusals_of_tools_are_told_from_other_errors() {
    assert!(refuses_tools(400, r#"{"error": {"message": "\"tools\" is not supported by this model"}}"#));
    assert!(refuses_tools(400, r#"{"error": "tool_choice auto requires --enable-auto-tool-choice"}"#));
    assert!(refuses_tools(422, r#"{"detail": "extra fields not permitted"}"#));
    assert!(refuses_tools(404, "Unknown field"));
    assert!(!refuses_tools(400, r#"{"error": "maximum context length is 2048 tokens"}"#));
    assert!(!refuses_tools(401, r#"{"error": "invalid api key"}"#));
    assert!(!refuses_tools(500, "tool parser crashed"));
}

/// An OpenAI-compatible endpoint that plays a script: `reply(index, request)` is the status and
/// body of the `index`th request. It records every request body.
struct Stub {
    url: String,
    requests: Arc<Mutex<Vec<Value>>>,
}

type Reply = Box<dyn Fn(usize, &Value) -> (u16, Value) + Send>;

impl Stub {
    fn start(reply: Reply) -> Stub {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}/v1", listener.local_addr().expect("address"));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        // Detached: it blocks in accept until the test process ends.
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let Some((path, body)) = read_request(&stream) else { continue };
                let (status, answer) = if path == "/v1/chat/completions" {
                    let mut seen = seen.lock().expect("lock");
                    let index = seen.len();
                    seen.push(body.clone());
                    reply(index, &body)
                } else {
                    (404, json!({"error": {"message": format!("no route {path}")}}))
                };
                write_response(stream, status, &answer);
            }
        });
        Stub { url, requests }
    }

    fn requests(&self) -> Vec<Value> {
        self.requests.lock().expect("lock").clone()
    }
}

/// One HTTP/1.1 request: its path and JSON body.
fn read_request(stream: &TcpStream) -> Option<(String, Value)> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let path = line.split_whitespace().nth(1)?.to_string();
    let mut length = 0;
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).ok()?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().ok()?;
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((path, serde_json::from_slice(&body).unwrap_or(Value::Null)))
}

fn write_response(mut stream: TcpStream, status: u16, body: &Value) {
    let body = body.to_string();
    let head = format!(
        "HTTP/1.1 {status} Scripted\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    // A client that went away is the test's failure to report, not the stub's.
    let _ = stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body.as_bytes()));
}

/// A chat-completions answer with `message` as its only choice.
fn answer(message: Value, finish_reason: &str) -> (u16, Value) {
    (
        200,
        json!({
            "id": "chatcmpl-stub",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10},
        }),
    )
}

fn native_calls(content: Option<&str>, calls: &[(&str, Value)]) -> (u16, Value) {
    let tool_calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            json!({"id": format!("chatcmpl-call-{i}"), "type": "function", "function": {"name": name, "arguments": args.to_string()}})
        })
        .collect();
    answer(json!({"role": "assistant", "content": content, "tool_calls": tool_calls}), "tool_calls")
}

fn final_answer(text: &str) -> (u16, Value) {
    answer(json!({"role": "assistant", "content": format!("<answer>\\boxed{{{text}}}</answer>")}), "stop")
}

fn world() -> (World, Arc<dyn Executor>) {
    let world = World::generate(WorldConfig::default());
    let corpus = Arc::new(Corpus::new(&world.documents()).expect("corpus"));
    (world, Arc::new(LocalTools::new().with_corpus(corpus)))
}

fn agent(url: &str, style: ToolCallStyle, mode: Mode, tools: Arc<dyn Executor>) -> Agent {
    let backend = OpenAiBackend::new(url, "stub", None).with_tool_calls(style);
    Agent::new(Arc::new(backend), tools, AgentConfig { mode, max_turns: 4, ..AgentConfig::default() })
}

fn queries(task: &Task) -> Vec<String> {
    task.solution.as_ref().expect("a generated task has a solution").steps.iter().map(|s| s.query.clone()).collect()
}

/// The messages of a request with the given role.
fn with_role<'a>(request: &'a Value, role: &str) -> Vec<&'a Value> {
    request["messages"].as_array().into_iter().flatten().filter(|m| m["role"] == role).collect()
}

fn assert_lists_tools(request: &Value) {
    let names: Vec<&str> =
        request["tools"].as_array().into_iter().flatten().filter_map(|t| t["function"]["name"].as_str()).collect();
    assert!(names.contains(&"search"), "{request}");
    assert!(request["tools"][0]["type"] == "function" && request["tool_choice"] == "auto", "{request}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_react_episode_calls_the_worlds_tools_natively() {
    let (world, tools) = world();
    let task = world.tasks().into_iter().find(|t| t.family == Family::SingleHop).expect("a single-hop task");
    let query = queries(&task)[0].clone();
    let golden = task.golden_answers[0].clone();
    let stub = Stub::start(Box::new(move |i, _| match i {
        0 => native_calls(None, &[("search", json!({"query": query}))]),
        _ => final_answer(&golden),
    }));
    let t = agent(&stub.url, ToolCallStyle::Native, Mode::React, tools).run(&task.question).await;
    assert_eq!(t.finish, Finish::Answered, "{:?}", t.steps);
    assert_eq!(t.answer.as_deref(), Some(task.golden_answers[0].as_str()));
    assert_eq!(t.turns(), 2);
    let call = &t.steps[0].calls[0];
    assert!(call.ok(), "{}", call.result);
    assert!(call.result.to_string().contains(&task.golden_answers[0]), "the search found the answer: {}", call.result);
    assert!(t.steps[0].text.starts_with("<tool_call>{\"name\": \"search\""), "{}", t.steps[0].text);

    let requests = stub.requests();
    assert_eq!(requests.len(), 2);
    requests.iter().for_each(assert_lists_tools);
    let assistant = with_role(&requests[1], "assistant");
    assert_eq!(assistant.len(), 1);
    assert_eq!(assistant[0]["content"], Value::Null);
    assert_eq!(assistant[0]["tool_calls"][0]["id"], "call_0_0");
    assert_eq!(assistant[0]["tool_calls"][0]["function"]["name"], "search");
    let tool = with_role(&requests[1], "tool");
    assert_eq!(tool.len(), 1);
    assert_eq!(tool[0]["tool_call_id"], "call_0_0");
    let content: Value = serde_json::from_str(tool[0]["content"].as_str().expect("text")).expect("JSON");
    assert_eq!(content, call.result, "the tool message holds the call's result");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gap_episode_plans_then_runs_a_level_of_native_calls() {
    let (world, tools) = world();
    let task = world
        .tasks()
        .into_iter()
        .find(|t| {
            t.family == Family::MultiHopParallel
                && t.solution
                    .as_ref()
                    .is_some_and(|s| s.steps.len() == 2 && s.steps.iter().all(|s| s.depends_on.is_empty()))
        })
        .expect("a task of two independent lookups");
    let steps = task.solution.clone().expect("solution").steps;
    let plan = format!(
        "<think>Two independent lookups.</think>\n<plan>\nTask 1: {} - Dependencies: none\nTask 2: {} - Dependencies: none\n</plan>",
        steps[0].description, steps[1].description
    );
    let golden = task.golden_answers[0].clone();
    let (q1, q2) = (steps[0].query.clone(), steps[1].query.clone());
    let content = plan.clone();
    let stub = Stub::start(Box::new(move |i, _| match i {
        0 => native_calls(Some(&content), &[("search", json!({"query": q1})), ("search", json!({"query": q2}))]),
        _ => final_answer(&golden),
    }));
    let t = agent(&stub.url, ToolCallStyle::Native, Mode::Gap, tools).run(&task.question).await;
    assert_eq!(t.finish, Finish::Answered, "{:?}", t.steps);
    assert_eq!(t.answer.as_deref(), Some(task.golden_answers[0].as_str()));
    assert_eq!(t.plan.as_ref().map(|p| p.tasks().len()), Some(2), "the plan in the content was read");
    let calls = &t.steps[0].calls;
    assert_eq!(calls.len(), 2, "both calls ran in one level");
    assert!(calls.iter().all(|c| c.ok() && c.level == 0), "{calls:?}");
    assert_eq!(calls.iter().map(|c| c.task.as_deref()).collect::<Vec<_>>(), vec![Some("1"), Some("2")]);

    let requests = stub.requests();
    assert_eq!(requests.len(), 2);
    requests.iter().for_each(assert_lists_tools);
    let assistant = with_role(&requests[1], "assistant");
    assert_eq!(assistant[0]["content"], plan.as_str(), "the plan is sent back as the content");
    let ids: Vec<&Value> = assistant[0]["tool_calls"].as_array().expect("calls").iter().map(|c| &c["id"]).collect();
    assert_eq!(ids, [&json!("call_0_0"), &json!("call_0_1")]);
    let tool = with_role(&requests[1], "tool");
    assert_eq!(tool.iter().map(|m| &m["tool_call_id"]).collect::<Vec<_>>(), ids);
    for (message, call) in tool.iter().zip(calls) {
        let content: Value = serde_json::from_str(message["content"].as_str().expect("text")).expect("JSON");
        assert_eq!(content, call.result);
    }
    assert!(with_role(&requests[1], "user").len() == 1, "no error observations: only the question");
}

/// The backend records what the model returned, and reports `tool_calls` as an end of turn.
#[tokio::test(flavor = "multi_thread")]
async fn the_completion_keeps_the_models_message() {
    let (_, tools) = world();
    let stub =
        Stub::start(Box::new(|_, _| native_calls(Some("<think>look</think>"), &[("search", json!({"query": "x"}))])));
    let backend = OpenAiBackend::new(&stub.url, "stub", None).with_tool_calls(ToolCallStyle::Native);
    let c = backend
        .complete_with_tools(&[Message::user("q")], &tools.manifests(), &GenerateOptions::default())
        .await
        .expect("a turn");
    assert_eq!(c.finish_reason, "stop");
    assert_eq!(
        c.text,
        "<think>look</think>\n<tool_call>{\"name\": \"search\", \"arguments\": {\"query\":\"x\"}}</tool_call>"
    );
    let raw = c.raw.expect("the message is kept");
    assert_eq!(raw["tool_calls"][0]["function"]["arguments"], "{\"query\":\"x\"}");
    assert_eq!(c.usage.prompt_tokens, 100);
}

/// A stub that refuses `tools` as servers without tool support do.
fn refusing(golden: String, query: String) -> Reply {
    Box::new(move |_, request| {
        if request.get("tools").is_some() {
            return (400, json!({"error": {"message": "\"tools\" is not supported", "type": "invalid_request_error"}}));
        }
        let called = request["messages"].as_array().is_some_and(|m| m.len() > 2);
        if called {
            final_answer(&golden)
        } else {
            let call = json!({"name": "search", "arguments": {"query": query}});
            answer(json!({"role": "assistant", "content": format!("<tool_call>{call}</tool_call>")}), "stop")
        }
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn auto_falls_back_to_text_when_the_endpoint_refuses_tools() {
    let (world, tools) = world();
    let task = world.tasks().into_iter().find(|t| t.family == Family::SingleHop).expect("a single-hop task");
    let stub = Stub::start(refusing(task.golden_answers[0].clone(), queries(&task)[0].clone()));
    let t = agent(&stub.url, ToolCallStyle::Auto, Mode::React, tools.clone()).run(&task.question).await;
    assert_eq!(t.finish, Finish::Answered, "{:?}", t.steps);
    assert_eq!(t.answer.as_deref(), Some(task.golden_answers[0].as_str()));
    assert!(t.steps[0].calls[0].ok());
    let requests = stub.requests();
    let carried: Vec<bool> = requests.iter().map(|r| r.get("tools").is_some()).collect();
    assert_eq!(carried, [true, false, false], "one refusal, then text for good");
    assert!(requests[2]["messages"].as_array().expect("messages").iter().all(|m| m["role"] != "tool"));

    // Native means native: the refusal is the episode's error.
    let stub = Stub::start(refusing(task.golden_answers[0].clone(), queries(&task)[0].clone()));
    let t = agent(&stub.url, ToolCallStyle::Native, Mode::React, tools).run(&task.question).await;
    assert!(matches!(&t.finish, Finish::BackendError(e) if e.contains("400")), "{:?}", t.finish);
    assert_eq!(stub.requests().len(), 1);
}
