//! What `toolsmith env serve` sustains: N concurrent OpenEnv sessions over WebSocket on
//! loopback, each running episodes of the bundled worlds with the oracle's turns (a scripted
//! client, so that no model time is measured), the tools being the worlds' search and the
//! bundled plugins in the sandbox.
//!
//! Prints, for 8, 32 and 128 sessions: episodes/s, turns/s, tool calls/s, p50/p99 step
//! latency, and memory per open session (RSS with N sessions open and idle, over N). Baseline, in
//! the same run: the same episodes run in process by the agent loop with the oracle as its
//! backend (no server, no protocol), as turns/s; the ratio is what the environment costs.
//!
//! `cargo bench -p toolsmith-env --bench env_serve`. Environment: `TOOLSMITH_BENCH_SESSIONS`
//! (default "8,32,128"), `TOOLSMITH_BENCH_SECONDS` (per point, default 10).

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message as Ws;
use toolsmith_agent::env::Corpus;
use toolsmith_agent::tools::{Executor, LocalTools};
use toolsmith_agent::{Agent, AgentConfig, Backend, Mode, Oracle};
use toolsmith_env::{ClientsOnly, EnvOptions, Environment};
use toolsmith_policy::Tokenizer;
use toolsmith_sandbox::{Limits, Sandbox, SandboxConfig, Toolbox};
use toolsmith_train::rl::{Method, sampler};

fn toolbox() -> Toolbox {
    let toolbox = Toolbox::new(Sandbox::new(SandboxConfig::default()).expect("sandbox"));
    for bundled in toolsmith_bundled::BUNDLED {
        toolbox.add_component(bundled.component).expect("bundled plugin");
    }
    toolbox
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

struct Point {
    sessions: usize,
    episodes: usize,
    turns: usize,
    calls: usize,
    seconds: f64,
    latencies_ms: Vec<f64>,
    errors: usize,
}

async fn ask<S>(ws: &mut S, msg: &Value) -> Result<Value, String>
where
    S: SinkExt<Ws> + StreamExt<Item = Result<Ws, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    ws.send(Ws::Text(msg.to_string().into())).await.map_err(|_| "send".to_string())?;
    loop {
        match ws.next().await {
            Some(Ok(Ws::Text(t))) => return serde_json::from_str(&t).map_err(|e| e.to_string()),
            Some(Ok(_)) => continue,
            _ => return Err("closed".into()),
        }
    }
}

/// `sessions` clients, each running episodes back to back for `seconds`.
async fn load(url: &str, oracle: Arc<Oracle>, sessions: usize, seconds: f64) -> Point {
    let episodes = Arc::new(AtomicUsize::new(0));
    let turns = Arc::new(AtomicUsize::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let mut handles = Vec::new();
    for client in 0..sessions {
        let (url, oracle) = (format!("{}/ws", url.replace("http://", "ws://")), oracle.clone());
        let (episodes, turns, calls, errors) = (episodes.clone(), turns.clone(), calls.clone(), errors.clone());
        handles.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let Ok((mut ws, _)) = tokio_tungstenite::connect_async(&url).await else {
                errors.fetch_add(1, Ordering::Relaxed);
                return latencies;
            };
            let mut seed = client as u64 * 1_000_003;
            while Instant::now() < deadline {
                seed += 1;
                let Ok(reset) = ask(&mut ws, &json!({"type": "reset", "data": {"seed": seed}})).await else {
                    errors.fetch_add(1, Ordering::Relaxed);
                    break;
                };
                let mut observation = reset["data"]["observation"].clone();
                for _ in 0..16 {
                    let messages: Vec<toolsmith_agent::Message> =
                        serde_json::from_value(observation["messages"].clone()).unwrap_or_default();
                    let text = match oracle.complete(&messages, &Default::default()).await {
                        Ok(c) => c.text,
                        Err(_) => "<answer>\\boxed{unknown}</answer>".into(),
                    };
                    calls.fetch_add(text.matches("<tool_call>").count(), Ordering::Relaxed);
                    let t = Instant::now();
                    let step = ask(&mut ws, &json!({"type": "step", "data": {"text": text}})).await;
                    latencies.push(t.elapsed().as_secs_f64() * 1e3);
                    turns.fetch_add(1, Ordering::Relaxed);
                    match step {
                        Ok(s) if s["type"] == "observation" => {
                            if s["data"]["done"] == true {
                                episodes.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                            observation = s["data"]["observation"].clone();
                        }
                        _ => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                    }
                }
            }
            let _ = ws.send(Ws::Text(json!({"type": "close"}).to_string().into())).await;
            latencies
        }));
    }
    let mut latencies_ms = Vec::new();
    for h in handles {
        latencies_ms.extend(h.await.unwrap_or_default());
    }
    latencies_ms.sort_by(f64::total_cmp);
    Point {
        sessions,
        episodes: episodes.load(Ordering::Relaxed),
        turns: turns.load(Ordering::Relaxed),
        calls: calls.load(Ordering::Relaxed),
        seconds: started.elapsed().as_secs_f64(),
        latencies_ms,
        errors: errors.load(Ordering::Relaxed),
    }
}

/// The baseline: the same kind of episodes in process, the oracle as the agent's backend.
async fn in_process(env: &Environment, oracle: Arc<Oracle>, parallel: usize, seconds: f64) -> (usize, f64) {
    let turns = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let tasks = common::all_tasks(env);
    let world = env.sampler().worlds()[0].tools.clone();
    let mut handles = Vec::new();
    for client in 0..parallel {
        let (oracle, turns, tasks, tools) = (oracle.clone(), turns.clone(), tasks.clone(), world.clone());
        let config = AgentConfig { mode: Mode::Gap, max_turns: 16, ..AgentConfig::default() };
        handles.push(tokio::spawn(async move {
            let agent = Agent::new(oracle, tools, config);
            let mut n = client;
            while Instant::now() < deadline {
                let task = &tasks[n % tasks.len()];
                n += parallel;
                let t = agent.run(&task.question).await;
                turns.fetch_add(t.turns(), Ordering::Relaxed);
            }
        }));
    }
    for h in handles {
        let _ = h.await;
    }
    (turns.load(Ordering::Relaxed), started.elapsed().as_secs_f64())
}

fn main() {
    let sessions: Vec<usize> = std::env::var("TOOLSMITH_BENCH_SESSIONS")
        .unwrap_or_else(|_| "8,32,128".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let seconds: f64 = std::env::var("TOOLSMITH_BENCH_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(10.0);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio");
    let dir = tempfile::tempdir().expect("tempdir");
    let toolbox = toolbox();
    let tools_for = move |corpus: Arc<Corpus>| -> Arc<dyn Executor> {
        Arc::new(LocalTools::new().with_corpus(corpus).with_toolbox(toolbox.clone(), Limits::default()))
    };
    let mut config = common::config(Method::GAP);
    config.worlds.tasks_per_family = 8;
    config.worlds.countries = 8;
    config.max_turns = 16;
    let prepared =
        sampler::Environment::prepare(config, dir.path(), &tools_for, |_| Ok(Arc::new(ClientsOnly))).expect("prepare");
    let tokenizer = prepared.builder.tokenizer().clone();
    let options = EnvOptions { max_sessions: 1024, ..EnvOptions::default() };
    let env = Arc::new(Environment::new(prepared.sampler, Some(tokenizer), options));
    let oracle =
        Arc::new(Oracle::new(&common::all_tasks(&env), Mode::Gap, Arc::new(Tokenizer::tiny().expect("tokenizer"))));
    let url = runtime.block_on(common::serve(env.clone()));
    println!("env serve: {} tasks, GAP, oracle turns over WebSocket, {seconds:.0} s per point", env.tasks().len());
    println!(
        "{:>9} {:>10} {:>9} {:>10} {:>9} {:>9} {:>7}",
        "sessions", "episodes/s", "turns/s", "calls/s", "p50 ms", "p99 ms", "errors"
    );
    let mut best_turns = 0.0_f64;
    for &n in &sessions {
        let p = runtime.block_on(load(&url, oracle.clone(), n, seconds));
        let turns_per_s = p.turns as f64 / p.seconds;
        best_turns = best_turns.max(turns_per_s);
        println!(
            "{:>9} {:>10.1} {:>9.1} {:>10.1} {:>9.2} {:>9.2} {:>7}",
            p.sessions,
            p.episodes as f64 / p.seconds,
            turns_per_s,
            p.calls as f64 / p.seconds,
            percentile(&p.latencies_ms, 0.5),
            percentile(&p.latencies_ms, 0.99),
            p.errors
        );
    }
    // Memory per open, idle session: N resets held open.
    let n = *sessions.iter().max().unwrap_or(&128);
    let before = rss_bytes();
    let held = runtime.block_on(async {
        let mut held = Vec::new();
        for i in 0..n {
            let ws_url = format!("{}/ws", url.replace("http://", "ws://"));
            if let Ok((mut ws, _)) = tokio_tungstenite::connect_async(&ws_url).await {
                let _ = ask(&mut ws, &json!({"type": "reset", "data": {"seed": i}})).await;
                held.push(ws);
            }
        }
        held
    });
    let after = rss_bytes();
    println!(
        "memory: {} open sessions add {:.1} MiB, {:.1} KiB per session (client sockets in the same process included)",
        held.len(),
        (after.saturating_sub(before)) as f64 / (1 << 20) as f64,
        (after.saturating_sub(before)) as f64 / 1024.0 / held.len().max(1) as f64
    );
    drop(held);
    let (turns, secs) = runtime.block_on(in_process(&env, oracle, 32, seconds));
    let baseline = turns as f64 / secs;
    println!("baseline: the agent loop in process with the oracle, 32 episodes at once: {baseline:.1} turns/s");
    println!(
        "ratio: env serve's best {best_turns:.1} turns/s is {:.2}x the in-process loop",
        best_turns / baseline.max(1e-9)
    );
    println!(
        "processes for 1,000 turns/s at this rate: {:.0} (each on cores like these; the trainer's engine samples apart)",
        (1000.0 / best_turns.max(1e-9)).ceil()
    );
}
