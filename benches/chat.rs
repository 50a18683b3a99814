//! The served policy under concurrent clients: `toolsmith serve --http --policy P`, then 1 and 8
//! clients each sending non-streaming `/v1/chat/completions` requests one after another (greedy,
//! a fixed number of new tokens). Continuous batching decodes concurrent requests together, so 8
//! clients should get far more tokens per second than one. Prints tokens/s, p50 latency, errors
//! and the ratio.
//!
//! `cargo bench --bench chat` (release). Environment: `TOOLSMITH_BENCH_POLICY` (default
//! `smollm2-135m`), `TOOLSMITH_BENCH_REQUESTS` (per client, default 4), `TOOLSMITH_BENCH_TOKENS`
//! (per request, default 32).

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::HttpServer;

use serde_json::{Value, json};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// One request: (completion tokens, seconds), or an error.
fn ask(base: &str, question: &str, tokens: usize) -> Result<(usize, f64), String> {
    let body = json!({
        "messages": [{"role": "user", "content": question}],
        "max_tokens": tokens, "temperature": 0,
    });
    let started = Instant::now();
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "600", "-H", "Content-Type: application/json", "-d", &body.to_string()])
        .arg(format!("{base}/v1/chat/completions"))
        .output()
        .map_err(|e| e.to_string())?;
    let reply: Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&out.stdout)))?;
    let n = reply["usage"]["completion_tokens"].as_u64().ok_or_else(|| format!("no usage: {reply}"))?;
    Ok((n as usize, started.elapsed().as_secs_f64()))
}

struct Run {
    clients: usize,
    tokens: usize,
    errors: usize,
    wall: f64,
    p50: f64,
}

fn run(base: &str, clients: usize, requests: usize, tokens: usize) -> Run {
    let started = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let base = base.to_string();
            std::thread::spawn(move || {
                (0..requests)
                    .map(|r| ask(&base, &format!("Question {r} from client {c}: where was Ada born?"), tokens))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let results: Vec<Result<(usize, f64), String>> =
        threads.into_iter().flat_map(|t| t.join().expect("client thread")).collect();
    let wall = started.elapsed().as_secs_f64();
    let mut latencies: Vec<f64> = results.iter().filter_map(|r| r.as_ref().ok().map(|x| x.1)).collect();
    latencies.sort_by(f64::total_cmp);
    for e in results.iter().filter_map(|r| r.as_ref().err()) {
        eprintln!("request failed: {e}");
    }
    Run {
        clients,
        tokens: results.iter().filter_map(|r| r.as_ref().ok().map(|x| x.0)).sum(),
        errors: results.iter().filter(|r| r.is_err()).count(),
        wall,
        p50: latencies.get(latencies.len() / 2).copied().unwrap_or(f64::NAN),
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("chat: bench");
        return;
    }
    let policy = std::env::var("TOOLSMITH_BENCH_POLICY").unwrap_or_else(|_| "smollm2-135m".into());
    let requests = env_or("TOOLSMITH_BENCH_REQUESTS", 4);
    let tokens = env_or("TOOLSMITH_BENCH_TOKENS", 32);
    let server = HttpServer::start(&["--policy", &policy]);
    // Warm-up: the first request pays for lazy initialisation.
    ask(&server.base, "warm up", 4).expect("warm-up request");
    std::thread::sleep(Duration::from_millis(200));
    println!("policy {policy}, {requests} requests per client, {tokens} new tokens each (greedy)");
    println!("| clients | requests | errors | wall s | tokens/s | p50 s | throughput vs 1 client |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mut base_rate = None;
    for clients in [1, 8] {
        let r = run(&server.base, clients, requests, tokens);
        let rate = r.tokens as f64 / r.wall;
        let ratio = rate / *base_rate.get_or_insert(rate);
        println!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.2} | {:.2}x |",
            r.clients,
            r.clients * requests,
            r.errors,
            r.wall,
            rate,
            r.p50,
            ratio
        );
        if r.errors > 0 {
            std::process::exit(1);
        }
    }
}
