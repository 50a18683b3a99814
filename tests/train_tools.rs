//! `toolsmith train tools` end to end on the tiny policy (seconds): two Python tools of the
//! user's registry become training tasks whose results the tools themselves computed, the run
//! leaves a PEFT adapter, and the adapter served by `serve --policy` calls those tools through
//! `/v1/chat/completions` while MCP runs the call it chose. The tiny model's words are noise, so
//! what is asserted is what the pipeline, the protocol and the grammar guarantee.

mod common;

use std::path::Path;
use std::process::Output;

use common::{HttpServer, Session, ok, toolsmith};
use serde_json::{Value, json};

fn run_in(registry: &Path, args: &[&str]) -> Output {
    toolsmith().arg("--registry").arg(registry).args(args).output().expect("run toolsmith")
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

fn create(registry: &Path, dir: &Path, name: &str, description: &str, arguments: &str, code: &str, inputs: &str) {
    let file = dir.join(format!("{name}.py"));
    std::fs::write(&file, code).expect("write");
    let file = file.to_str().expect("utf-8");
    ok(&run_in(
        registry,
        &[
            "create",
            "--name",
            name,
            "--description",
            description,
            "--arguments",
            arguments,
            "--code",
            file,
            "--inputs",
            inputs,
            "--admit",
        ],
    ));
}

#[test]
fn your_tools_are_taught_served_and_called_over_openai_and_mcp() {
    let dir = tempfile::tempdir().expect("tempdir");
    // `HttpServer::start_in` serves the registry at DIR/registry.db.
    let registry = dir.path().join("registry.db");
    create(
        &registry,
        dir.path(),
        "circle_area",
        "Computes the area of a circle from its radius.",
        "r (float): the radius",
        "def circle_area(r: float) -> float:\n    import math\n    return math.pi * r * r\n",
        r#"{"r": 2}"#,
    );
    create(
        &registry,
        dir.path(),
        "shout",
        "Turns a text into upper case.",
        "text (str): what to shout",
        "def shout(text: str) -> str:\n    return text.upper()\n",
        r#"{"text": "hi"}"#,
    );
    let run = dir.path().join("run");
    let run_s = run.to_str().expect("utf-8");
    let args = [
        "train",
        "tools",
        "--preset",
        "tiny-tools",
        "--from-registry",
        "--tool",
        "circle_area",
        "--tool",
        "shout",
        "--out",
        run_s,
    ];
    let stdout = ok(&run_in(&registry, &args));
    assert!(stdout.contains("| policy | set | decoding |"), "{stdout}");

    // The tasks about the user's tools carry what the tools computed: circle_area's golden result
    // is pi r^2 for the golden radius.
    let train = lines(&run.join("data/train.jsonl"));
    let own: Vec<&Value> = train.iter().filter(|t| t["id"].as_str().is_some_and(|i| i.starts_with("own-"))).collect();
    assert!(!own.is_empty(), "no tasks of the user's tools");
    let mut checked = 0;
    for t in &own {
        if t["family"] != "single" || t["turns"][0][0]["name"] != "circle_area" {
            continue;
        }
        let r = t["turns"][0][0]["arguments"]["r"].as_f64().expect("a radius");
        let area = t["observations"][0][0]["result"].as_f64().expect("the tool's result");
        assert!((area - std::f64::consts::PI * r * r).abs() < 1e-9 * area.abs().max(1.0), "{t}");
        checked += 1;
    }
    assert!(checked > 0, "no single-call task of circle_area: {own:?}");
    for name in ["circle_area", "shout"] {
        assert!(own.iter().any(|t| t.to_string().contains(name)), "no task names {name}");
    }

    // Every evaluation row is there: three policies x (yours, synthetic) x two decodings.
    let eval: Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("eval.json")).expect("eval.json")).expect("JSON");
    let rows = eval["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 12, "{eval}");
    assert!(rows.iter().any(|r| r["set"] == "yours" && r["policy"] == "rl" && r["constrained"] == true));
    let adapter = run.join("rl/final");
    assert!(adapter.join("adapter/adapter_config.json").is_file(), "the result carries its PEFT adapter");

    // Run again: every stage is done, nothing is trained twice.
    let before = std::fs::read_to_string(run.join("sft/metrics.jsonl")).expect("metrics");
    ok(&run_in(&registry, &args));
    assert_eq!(std::fs::read_to_string(run.join("sft/metrics.jsonl")).expect("metrics"), before);

    // Serve the adapter with the registry; the client lists the user's tools as OpenAI functions.
    let server =
        HttpServer::start_in(dir.path(), &["--policy", adapter.to_str().expect("utf-8"), "--model-name", "mine"]);
    let exported: Value =
        serde_json::from_str(&ok(&run_in(&registry, &["tools", "export", "--format", "openai"]))).expect("JSON");
    let functions: Vec<Value> = exported
        .as_array()
        .expect("a list")
        .iter()
        .filter(|f| ["circle_area", "shout"].contains(&f["function"]["name"].as_str().unwrap_or_default()))
        .cloned()
        .collect();
    assert_eq!(functions.len(), 2);
    let body = json!({"model": "mine", "tools": functions, "tool_choice": "required", "max_tokens": 64,
        "messages": [{"role": "user", "content": "What is the area of a circle of radius 3?"}]});
    let url = format!("{}/v1/chat/completions", server.base);
    let (status, reply) = tokio::runtime::Runtime::new().expect("tokio").block_on(async {
        let reply = reqwest::Client::new().post(&url).json(&body).send().await.expect("POST");
        let status = reply.status().as_u16();
        (status, reply.json::<Value>().await.expect("a JSON body"))
    });
    assert_eq!(status, 200, "{reply}");
    let call = &reply["choices"][0]["message"]["tool_calls"][0];
    let name = call["function"]["name"].as_str().expect("a tool call").to_string();
    let arguments: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().expect("arguments")).expect("JSON");
    let schema = &functions.iter().find(|f| f["function"]["name"] == name.as_str()).expect("a listed tool")["function"]
        ["parameters"];
    assert!(jsonschema::validator_for(schema).expect("schema").is_valid(&arguments), "{arguments}");

    // The client runs the call it was given over MCP, on the same server.
    let session = Session::open(&server);
    let result = session.call(1, &name, arguments.clone());
    assert_ne!(result["isError"], true, "{result}");
    let value = &result["structuredContent"]["result"];
    match name.as_str() {
        "circle_area" => {
            let r = arguments["r"].as_f64().expect("r");
            assert!((value.as_f64().expect("a number") - std::f64::consts::PI * r * r).abs() < 1e-6, "{result}");
        }
        _ => assert_eq!(value.as_str(), arguments["text"].as_str().map(str::to_uppercase).as_deref(), "{result}"),
    }
}

#[test]
fn interfaces_that_cannot_be_sampled_are_reported_and_bad_runs_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let registry = dir.path().join("registry.db");
    let file = dir.path().join("tools.json");
    let good = json!({"type": "function", "function": {"name": "get_tide", "description": "Gets the tide table of a harbour.",
        "parameters": {"type": "object", "properties": {"harbour": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["harbour"]}}});
    let negated = json!({"type": "function", "function": {"name": "no_strings", "description": "Takes anything but a string.",
        "parameters": {"type": "object", "properties": {"x": {"not": {"type": "string"}}}, "required": ["x"]}}});
    let recursive = json!({"type": "function", "function": {"name": "tree", "description": "Walks a tree.",
        "parameters": {"type": "object", "properties": {"root": {"$ref": "#/$defs/node"}}, "required": ["root"],
        "$defs": {"node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["kids"]}}}}});
    std::fs::write(&file, json!([good, negated, recursive]).to_string()).expect("write");
    let run = dir.path().join("run");
    let out = run_in(
        &registry,
        &[
            "train",
            "tools",
            "--preset",
            "tiny-tools",
            "--tools",
            file.to_str().expect("utf-8"),
            "--rl-iterations",
            "0",
            "--no-base-eval",
            "--observations",
            "actor",
            "--out",
            run.to_str().expect("utf-8"),
        ],
    );
    ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("skipped no_strings") && stderr.contains("`not` cannot be sampled"), "{stderr}");
    assert!(stderr.contains("skipped tree") && stderr.contains("recursive"), "{stderr}");
    let train = std::fs::read_to_string(run.join("data/train.jsonl")).expect("tasks");
    assert!(train.contains("get_tide") && !train.contains("no_strings") && !train.contains("\"tree\""));
    // The interfaces have no tool behind them: the ToolActor (the tiny policy under the output
    // schema, here any object) answered their calls.
    let tide: Vec<Value> = lines(&run.join("data/train.jsonl"))
        .into_iter()
        .filter(|t| t["family"] == "single" && t["turns"][0][0]["name"] == "get_tide")
        .collect();
    assert!(!tide.is_empty() && tide.iter().all(|t| t["observations"][0][0].is_object()), "{tide:?}");
    // Without RL the adapter is SFT's.
    assert!(run.join("sft/final/adapter/adapter_config.json").is_file());
    assert!(!run.join("rl").exists());

    // Only unsampleable tools: refused, naming each.
    std::fs::write(&file, json!([negated]).to_string()).expect("write");
    let out = run_in(
        &registry,
        &[
            "train",
            "tools",
            "--preset",
            "tiny-tools",
            "--tools",
            file.to_str().expect("utf-8"),
            "--out",
            dir.path().join("run2").to_str().expect("utf-8"),
        ],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no tool's arguments can be sampled") && stderr.contains("no_strings"), "{stderr}");

    // A tool the registry does not have; the toolcall method outside `train tools`.
    let out = run_in(
        &registry,
        &["train", "tools", "--from-registry", "--tool", "nope", "--out", run.to_str().expect("utf-8")],
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("the registry has no such tool"), "{out:?}");
    let out = run_in(
        &registry,
        &["train", "rl", "--method", "toolcall", "--out", dir.path().join("rl").to_str().expect("utf-8")],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("train tools"), "{}", String::from_utf8_lossy(&out.stderr));
}
