//! `toolsmith serve --policy` speaks OpenAI function calling: tools in, `tool_calls` out (plain
//! and streamed), structured output, the rest of the request honoured or refused, client text
//! kept as text, and hung-up clients leaving the batch. The model is the untrained tiny policy:
//! what it writes is noise, so every assertion is one the protocol or the grammar guarantees.
//! The official `openai` SDK and the `openai-agents` framework run against the same server in
//! `the_openai_sdks_use_the_served_policy_as_an_agent`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::HttpServer;
use serde_json::{Value, json};

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city now.",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "math.factorial", "description": "n!", "strict": true,
            "parameters": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 20}},
                           "required": ["n"], "additionalProperties": false}}},
    ])
}

fn ask() -> Value {
    json!([{"role": "user", "content": "What is the weather in Oslo, and what is 5 factorial?"}])
}

struct Client {
    runtime: tokio::runtime::Runtime,
    http: reqwest::Client,
    url: String,
}

impl Client {
    fn new(server: &HttpServer) -> Client {
        Client {
            runtime: tokio::runtime::Runtime::new().expect("tokio"),
            http: reqwest::Client::new(),
            url: format!("{}/v1/chat/completions", server.base),
        }
    }

    /// Status and JSON body.
    fn post(&self, body: &Value) -> (u16, Value) {
        self.runtime.block_on(async {
            let reply = self.http.post(&self.url).json(body).send().await.expect("POST");
            let status = reply.status().as_u16();
            (status, reply.json().await.expect("a JSON body"))
        })
    }

    /// The `data:` payloads of a streamed answer, `[DONE]` excluded (and required).
    fn stream(&self, body: &Value) -> Vec<Value> {
        let text = self.runtime.block_on(async {
            let reply = self.http.post(&self.url).json(body).send().await.expect("POST");
            assert_eq!(reply.status().as_u16(), 200);
            reply.text().await.expect("body")
        });
        let data: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
        assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
        data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).expect("each chunk is JSON")).collect()
    }
}

/// Asserts `call` names a listed tool and its arguments validate against that tool's parameters.
fn assert_valid_call(call: &Value) {
    assert_eq!(call["type"], "function", "{call}");
    assert!(call["id"].as_str().is_some_and(|id| !id.is_empty()), "{call}");
    let name = call["function"]["name"].as_str().expect("a name");
    let tools = tools();
    let tool = tools.as_array().expect("tools").iter().find(|t| t["function"]["name"] == name);
    let tool = tool.unwrap_or_else(|| panic!("`{name}` is not a listed tool"));
    let arguments: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().expect("arguments are a string")).expect("JSON");
    let validator = jsonschema::validator_for(&tool["function"]["parameters"]).expect("schema");
    assert!(validator.is_valid(&arguments), "{name}({arguments}) does not validate");
}

#[test]
fn tools_in_tool_calls_out() {
    let server = HttpServer::start(&["--policy", "tiny", "--model-name", "tiny"]);
    let client = Client::new(&server);
    let forced = json!({"model": "anything", "messages": ask(), "tools": tools(), "temperature": 0, "seed": 7,
                        "max_tokens": 200, "parallel_tool_calls": false,
                        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}});
    let (status, reply) = client.post(&forced);
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["model"], "tiny", "the served model answers, not the name asked for");
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{reply}");
    let calls = choice["message"]["tool_calls"].as_array().expect("tool_calls");
    assert_eq!(calls.len(), 1, "parallel_tool_calls false: one call, {reply}");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_valid_call(&calls[0]);
    assert!(choice["message"]["content"].is_null(), "a forced call has no text: {reply}");

    // Streamed: the name first, then arguments that add up to the same call for the same seed.
    let mut streamed = forced.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let chunks = client.stream(&streamed);
    let deltas: Vec<&Value> = chunks.iter().filter_map(|c| c["choices"].get(0)).map(|c| &c["delta"]).collect();
    let pieces: Vec<&Value> = deltas.iter().filter_map(|d| d["tool_calls"].get(0)).collect();
    let first = pieces.first().expect("a streamed call");
    assert_eq!(first["index"], 0);
    assert_eq!(first["id"], first["id"].as_str().map_or(Value::Null, |s| json!(s)));
    assert_eq!(first["function"]["name"], "get_weather", "{first}");
    let arguments: String = pieces.iter().filter_map(|p| p["function"]["arguments"].as_str()).collect();
    assert_eq!(arguments, calls[0]["function"]["arguments"].as_str().expect("arguments"));
    let finishes: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .map(|c| &c["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finishes, [&json!("tool_calls")]);
    let usage = chunks.last().expect("chunks");
    assert_eq!(usage["choices"], json!([]), "the usage chunk comes last");
    assert_eq!(usage["usage"]["completion_tokens"], reply["usage"]["completion_tokens"]);

    // `required` with parallel calls, sampled, three choices: every call of every choice valid.
    let required = json!({"messages": ask(), "tools": tools(), "tool_choice": "required", "n": 3,
                          "temperature": 1.0, "seed": 11, "max_tokens": 120});
    let (status, reply) = client.post(&required);
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["choices"].as_array().map(Vec::len), Some(3));
    for choice in reply["choices"].as_array().expect("choices") {
        let calls = choice["message"]["tool_calls"].as_array().expect("required: calls");
        assert!(!calls.is_empty(), "{choice}");
        calls.iter().for_each(assert_valid_call);
    }
    assert!(reply.pointer("/toolsmith/invalid_tool_calls").is_none(), "{reply}");

    // `none`: the call tag cannot be written; `auto`: whatever comes back is well formed.
    let none = json!({"messages": ask(), "tools": tools(), "tool_choice": "none", "temperature": 1.0,
                      "seed": 3, "max_tokens": 64, "logprobs": true});
    let (status, reply) = client.post(&none);
    assert_eq!(status, 200, "{reply}");
    let message = &reply["choices"][0]["message"];
    assert!(message.get("tool_calls").is_none(), "{reply}");
    assert!(!message["content"].as_str().unwrap_or_default().contains("<tool_call>"), "{reply}");
    let logprobs = reply["choices"][0]["logprobs"]["content"].as_array().expect("logprobs");
    assert!(!logprobs.is_empty() && logprobs.iter().all(|l| l["logprob"].as_f64().is_some_and(|p| p <= 0.0)));
    let auto = json!({"messages": ask(), "tools": tools(), "temperature": 1.0, "seed": 5, "max_tokens": 64});
    let (status, reply) = client.post(&auto);
    assert_eq!(status, 200, "{reply}");
    for call in reply["choices"][0]["message"]["tool_calls"].as_array().into_iter().flatten() {
        assert_valid_call(call);
    }

    // A second turn carries the call and its result back.
    let follow_up = json!({"tools": tools(), "tool_choice": "none", "max_tokens": 8, "messages": [
        {"role": "developer", "content": [{"type": "text", "text": "Answer briefly."}]},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": null, "tool_calls": calls},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "{\"celsius\": 3}"},
    ]});
    let (status, reply) = client.post(&follow_up);
    assert_eq!(status, 200, "{reply}");
    assert!(reply["choices"][0]["message"]["content"].is_string(), "{reply}");
}

#[test]
fn structured_output_and_bad_requests() {
    let server = HttpServer::start(&["--policy", "tiny", "--model-name", "tiny"]);
    let client = Client::new(&server);
    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 10}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user"]}}, "required": ["name", "age", "role"]});
    let body = json!({"messages": ask(), "temperature": 1.0, "seed": 2, "max_tokens": 60,
                      "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": true}}});
    let (status, reply) = client.post(&body);
    assert_eq!(status, 200, "{reply}");
    let content: Value =
        serde_json::from_str(reply["choices"][0]["message"]["content"].as_str().expect("content")).expect("JSON");
    assert!(jsonschema::validator_for(&schema).expect("schema").is_valid(&content), "{content}");
    let body = json!({"messages": ask(), "temperature": 1.0, "seed": 2, "max_tokens": 60,
                      "response_format": {"type": "json_object"}});
    let (status, reply) = client.post(&body);
    assert_eq!(status, 200, "{reply}");
    let content: Value =
        serde_json::from_str(reply["choices"][0]["message"]["content"].as_str().expect("content")).expect("JSON");
    assert!(content.is_object(), "{content}");

    let bad = [
        (json!({"messages": ask(), "frobnicate": true}), "frobnicate"),
        (json!({"messages": ask(), "n": 1000}), "n is 1000"),
        (json!({"messages": ask(), "logit_bias": {"1": 5}}), "logit_bias"),
        (json!({"messages": ask(), "top_p": 1.5}), "top_p"),
        (json!({"messages": ask(), "max_tokens": 0}), "max_tokens"),
        (json!({"messages": ask(), "stop": ""}), "stop"),
        (json!({"messages": ask(), "repetition_penalty": -1}), "repetition_penalty"),
        (json!({"messages": ask(), "tools": [tools()[0], tools()[0]]}), "tools[1]"),
        (
            json!({"messages": ask(), "tools": tools(), "tool_choice": {"type": "function", "function": {"name": "fly"}}}),
            "fly",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c9", "content": "1"}]}),
            "c9",
        ),
        (
            json!({"messages": ask(), "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"a": {"type": "string", "not": {"const": "x"}}}}}}}),
            "not",
        ),
    ];
    for (body, named) in bad {
        let (status, reply) = client.post(&body);
        assert_eq!(status, 400, "{body}: {reply}");
        let message = reply["error"]["message"].as_str().expect("a message");
        assert!(message.contains(named), "{body}: {message}");
    }
    // The server is still serving.
    assert_eq!(client.post(&json!({"messages": ask(), "max_tokens": 2})).0, 200);
}

/// `count` once it reads 0, or after a minute.
fn settled(count: impl Fn() -> u64) -> u64 {
    let started = Instant::now();
    let mut left = count();
    while left > 0 && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(200));
        left = count();
    }
    left
}

/// Four long streams whose clients hang up after a second leave the continuous batch: the policy
/// is idle again in seconds, not after their 2,048 tokens each.
#[test]
fn a_client_that_hangs_up_stops_costing() {
    let server = HttpServer::start(&["--policy", "tiny", "--model-name", "tiny"]);
    let client = Client::new(&server);
    let status_url = format!("{}/policy/status", server.base);
    let in_flight = |client: &Client| -> u64 {
        client.runtime.block_on(async {
            let reply = client.http.get(&status_url).send().await.expect("GET");
            reply.json::<Value>().await.expect("JSON")["in_flight"].as_u64().expect("in_flight")
        })
    };
    let body = json!({"messages": ask(), "max_tokens": 2000, "temperature": 1.0, "stream": true, "stop": ["never"]});
    client.runtime.block_on(async {
        let mut streams = Vec::new();
        for _ in 0..4 {
            let reply = client.http.post(&client.url).json(&body).send().await.expect("POST");
            streams.push(reply);
        }
        // Read a little of each, then hang up.
        for s in &mut streams {
            let chunk = s.chunk().await.expect("a chunk");
            assert!(chunk.is_some());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    });
    let left = settled(|| in_flight(&client));
    assert_eq!(left, 0, "the dropped streams still decode");
    // The same for a request that is not streamed: its client times out and hangs up.
    client.runtime.block_on(async {
        let quick = reqwest::Client::builder().timeout(Duration::from_millis(500)).build().expect("client");
        let plain = json!({"messages": ask(), "max_tokens": 2000, "temperature": 1.0, "stop": ["never"]});
        assert!(quick.post(&client.url).json(&plain).send().await.is_err(), "it times out");
    });
    let left = settled(|| in_flight(&client));
    assert_eq!(left, 0, "the abandoned request still decodes");
}

/// The pinned venv of the official `openai` SDK and the `openai-agents` framework.
fn sdk_python() -> PathBuf {
    common::client_from_script("openai-client-env.sh", "PyPI for the OpenAI clients' venv")
}

#[test]
fn the_openai_sdks_use_the_served_policy_as_an_agent() {
    let python = sdk_python();
    let server = HttpServer::start(&["--policy", "tiny", "--model-name", "tiny"]);
    let out = Command::new(&python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai/client.py"))
        .args(["--base-url", &format!("{}/v1", server.base), "--model", "tiny", "--timeout", "300"])
        .output()
        .expect("run the client");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "report: {report}\nstderr: {}", String::from_utf8_lossy(&out.stderr));
}

/// `toolsmith eval` drives the served policy through the OpenAI API both ways: native tool calls
/// (the request carries `tools`, the answers come back as `tool_calls`) and the text grammar.
/// The untrained policy answers nothing, but every turn of every episode is served and recorded.
#[test]
fn eval_runs_against_the_served_policy_in_both_call_styles() {
    let server = HttpServer::start(&["--policy", "tiny", "--model-name", "tiny"]);
    let dir = tempfile::tempdir().expect("tempdir");
    for style in ["native", "text"] {
        let out = dir.path().join(format!("{style}.json"));
        let url = format!("{}/v1", server.base);
        let args = [
            "eval",
            "--policy",
            &url,
            "--model",
            "tiny",
            "--tool-calls",
            style,
            "--mode",
            "react",
            "--limit",
            "2",
            "--max-turns",
            "2",
            "--max-tokens",
            "48",
            "--json",
            "--out",
        ];
        let report: Value =
            serde_json::from_str(&common::ok(&common::toolsmith().args(args).arg(&out).output().expect("run eval")))
                .expect("one JSON object");
        assert_eq!(report["overall"]["tasks"], 2, "{style}: {report}");
        assert_eq!(report["overall"]["backend_errors"], 0, "{style}: every turn is served: {report}");
        let saved = std::fs::read_to_string(&out).expect("episodes");
        // Each turn keeps the message the endpoint returned beside its grammar text.
        assert!(saved.contains("\"raw\""), "{style}: {saved:.600}");
    }
}
