//! Function calling through the served endpoint, on held-out world questions: how many of the
//! policy's calls parse and validate with and without the grammar, how often the called tool and
//! its arguments are the oracle's first call, what the grammar costs per generated token against
//! free decoding of the same prompt (goal: at most 1.2x), and how soon a streamed answer starts.
//!
//! Three arms per question, greedy, the same prompt text: `free` (no `tools` in the request, the
//! listing the endpoint would write given as the system prompt, the answer read by the endpoint's
//! own parser), `auto` (tools, calls decoded under the grammar once the model opens one) and
//! `required` (the turn opens with a call under the grammar).
//!
//! `cargo bench --bench tool_calls` (release). Environment: `TOOLSMITH_BENCH_POLICY` (default
//! `smollm2-135m`; a checkpoint directory for a trained one), `TOOLSMITH_BENCH_QUESTIONS`
//! (default 24), `TOOLSMITH_BENCH_TOKENS` (per answer, default 96), `TOOLSMITH_BENCH_WORLD` (the
//! held-out world's seed, default 1000).

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use common::HttpServer;
use serde_json::{Value, json};
use toolsmith_agent::env::{Corpus, World, WorldConfig};
use toolsmith_agent::tools::{Executor, LocalTools};
use toolsmith_agent::{Mode, Oracle, trace};
use toolsmith_daemon::chat::{calls, request};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// One answer: the body, wall seconds.
fn post(url: &str, body: &Value) -> (Value, f64) {
    let started = Instant::now();
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "600", "-H", "Content-Type: application/json", "-d", &body.to_string(), url])
        .output()
        .expect("run curl");
    let reply = serde_json::from_slice(&out.stdout).expect("the endpoint answers JSON");
    (reply, started.elapsed().as_secs_f64())
}

/// Seconds to the first chunk with content or a call, and to the first call.
fn first_chunks(url: &str, body: &Value) -> (f64, Option<f64>) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let started = Instant::now();
    let mut child = Command::new("curl")
        .args(["-sS", "-N", "--max-time", "600", "-H", "Content-Type: application/json", "-d", &body.to_string(), url])
        .stdout(Stdio::piped())
        .spawn()
        .expect("run curl");
    let (mut first, mut call) = (None, None);
    let stdout = child.stdout.take().expect("stdout");
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        let Some(data) = line.strip_prefix("data: ") else { continue };
        if data == "[DONE]" {
            break;
        }
        let Ok(chunk) = serde_json::from_str::<Value>(data) else { continue };
        let delta = &chunk["choices"][0]["delta"];
        let t = started.elapsed().as_secs_f64();
        if delta["content"].as_str().is_some_and(|c| !c.is_empty()) || delta.get("tool_calls").is_some() {
            first.get_or_insert(t);
        }
        if delta.get("tool_calls").is_some() {
            call.get_or_insert(t);
        }
    }
    let _ = child.wait();
    (first.unwrap_or(f64::NAN), call)
}

#[derive(Default)]
struct Arm {
    questions: usize,
    blocks: usize,
    valid: usize,
    /// Questions whose first valid call names the oracle's tool, and with its arguments too.
    tool_right: usize,
    args_right: usize,
    tokens: u64,
    seconds: f64,
    first: Vec<f64>,
    first_call: Vec<f64>,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("tool_calls: bench");
        return;
    }
    let policy = std::env::var("TOOLSMITH_BENCH_POLICY").unwrap_or_else(|_| "smollm2-135m".into());
    let questions = env_or("TOOLSMITH_BENCH_QUESTIONS", 24) as usize;
    let tokens = env_or("TOOLSMITH_BENCH_TOKENS", 96);
    let seed = env_or("TOOLSMITH_BENCH_WORLD", 1000);
    let world = World::generate(WorldConfig { seed, ..WorldConfig::default() });
    let corpus = Arc::new(Corpus::new(&world.documents()).expect("corpus"));
    let local = LocalTools::new().with_corpus(corpus);
    let functions: Vec<Value> = local.manifests().iter().map(|m| m.to_openai_function()).collect();
    let listing = request::parse(
        json!({"messages": [{"role": "user", "content": "?"}], "tools": functions}).to_string().as_bytes(),
    )
    .expect("the world's tools are a valid request");
    let tool_defs = listing.tools.clone();
    let system =
        format!("You answer questions with tools. Think in <think>...</think>. {}", request::tool_section(&tool_defs));
    let tokenizer = Arc::new(toolsmith_policy::Tokenizer::tiny().expect("tokenizer"));
    let tasks: Vec<_> = world.tasks().into_iter().filter(|t| t.solution.is_some()).collect();
    // Every family in turn, so a short run still covers them.
    let step = (tasks.len() / questions.max(1)).max(1);
    let picked: Vec<_> = tasks.iter().step_by(step).take(questions).cloned().collect();
    let oracle = Oracle::new(&picked, Mode::React, tokenizer);

    let server = HttpServer::start(&["--policy", &policy]);
    let url = format!("{}/v1/chat/completions", server.base);
    post(&url, &json!({"messages": [{"role": "user", "content": "warm up"}], "max_tokens": 4}));
    let mut arms: Vec<(&str, Arm)> =
        vec![("free", Arm::default()), ("auto", Arm::default()), ("required", Arm::default())];
    for task in &picked {
        let reference = oracle
            .turns(task, |_| true)
            .first()
            .and_then(|t| trace::parse(t).tool_calls().into_iter().find_map(Result::ok));
        for (name, arm) in &mut arms {
            let body = match *name {
                "free" => {
                    json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": task.question}],
                                 "stop": ["<observation>"], "max_tokens": tokens, "temperature": 0})
                }
                choice => json!({"messages": [{"role": "user", "content": task.question}], "tools": functions,
                                 "tool_choice": choice, "max_tokens": tokens, "temperature": 0}),
            };
            let (reply, seconds) = post(&url, &body);
            let text = reply["choices"][0]["message"]["content"].as_str().unwrap_or_default();
            let (calls, invalid): (Vec<calls::Call>, usize) = if *name == "free" {
                let (_, c, bad) = calls::parse_turn(&tool_defs, "c", text);
                (c, bad.len())
            } else {
                let c = reply["choices"][0]["message"]["tool_calls"].as_array().cloned().unwrap_or_default();
                let c = c
                    .iter()
                    .enumerate()
                    .map(|(i, c)| calls::Call {
                        index: i,
                        id: String::new(),
                        name: c["function"]["name"].as_str().unwrap_or_default().into(),
                        arguments: c["function"]["arguments"].as_str().unwrap_or_default().into(),
                    })
                    .collect();
                (c, reply.pointer("/toolsmith/invalid_tool_calls").and_then(Value::as_array).map_or(0, Vec::len))
            };
            arm.questions += 1;
            arm.blocks += calls.len() + invalid;
            arm.valid += calls.len();
            arm.tokens += reply["usage"]["completion_tokens"].as_u64().unwrap_or(0);
            arm.seconds += seconds;
            if let (Some(first), Some(want)) = (calls.first(), &reference)
                && first.name == want.name
            {
                arm.tool_right += 1;
                let got: Value = serde_json::from_str(&first.arguments).unwrap_or(Value::Null);
                if got == Value::Object(want.arguments.clone()) {
                    arm.args_right += 1;
                }
            }
            let (first, call) = first_chunks(&url, &body);
            arm.first.push(first);
            arm.first_call.extend(call);
        }
    }
    println!("policy {policy}, {questions} held-out questions of world {seed}, up to {tokens} tokens each (greedy)");
    println!(
        "| arm | call blocks | parse and validate | right tool | right tool and arguments | ms per token | vs free | first chunk s (p50) | first call s (p50) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let free_cost = arms[0].1.seconds / arms[0].1.tokens.max(1) as f64;
    for (name, arm) in &mut arms {
        let cost = arm.seconds / arm.tokens.max(1) as f64;
        let q = arm.questions.max(1) as f64;
        println!(
            "| {name} | {} | {:.2} | {:.2} | {:.2} | {:.1} | {:.2}x | {:.2} | {:.2} |",
            arm.blocks,
            if arm.blocks == 0 { f64::NAN } else { arm.valid as f64 / arm.blocks as f64 },
            arm.tool_right as f64 / q,
            arm.args_right as f64 / q,
            cost * 1e3,
            cost / free_cost,
            median(&mut arm.first),
            median(&mut arm.first_call),
        );
    }
}
