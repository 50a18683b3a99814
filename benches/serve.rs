//! Load test of `toolsmith serve` over streamable HTTP on loopback: N concurrent MCP clients
//! (rmcp's own client, one session each) each make M `calculator` calls. Prints throughput,
//! p50/p99 latency and errors for 1 client and for 8, and the ratio between them. Exits non-zero
//! on any error.
//!
//! Then, on a daemon that also serves a policy, one client's calls while the daemon is idle and
//! while it trains an SFT job on the same cores (`TOOLSMITH_BENCH_TRAINING=0` skips this part).
//!
//! `cargo bench --bench serve` (release). Environment: `TOOLSMITH_BENCH_CLIENTS` (default "1,8"),
//! `TOOLSMITH_BENCH_CALLS` (per client, default 500), `TOOLSMITH_BENCH_CONCURRENCY` (the
//! server's call slots, default: cores).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use serde_json::json;

/// No run may take longer than this; what is left counts as errors.
const BUDGET: Duration = Duration::from_secs(300);

struct Server {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server(concurrency: Option<&str>, extra: &[&str], dir: tempfile::TempDir) -> Server {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_toolsmith"));
    cmd.arg("--registry").arg(dir.path().join("registry.db")).args(["serve", "--http", "127.0.0.1:0"]).args(extra);
    if let Some(c) = concurrency {
        cmd.args(["--concurrency", c]);
    }
    let mut child = cmd.stderr(Stdio::piped()).stdout(Stdio::null()).spawn().expect("start toolsmith serve");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let url = loop {
        let line = lines.next().expect("server exited before listening").expect("read server stderr");
        if let Some(rest) = line.split("MCP on ").nth(1) {
            break rest.split(',').next().expect("url").trim().to_owned();
        }
    };
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Server { child, url, _dir: dir }
}

struct Run {
    clients: usize,
    calls: usize,
    errors: usize,
    wall: Duration,
    latencies: Vec<Duration>,
}

async fn client(url: String, calls: usize) -> (Vec<Duration>, usize) {
    let mut latencies = Vec::with_capacity(calls);
    let mut errors = 0;
    let service = match ().serve(StreamableHttpClientTransport::from_uri(url)).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("client could not connect: {e}");
            return (latencies, calls);
        }
    };
    for i in 0..calls {
        let args = json!({"expression": format!("{i} * 2 + sqrt(16)")});
        let request =
            CallToolRequestParams::new("calculator").with_arguments(args.as_object().cloned().unwrap_or_default());
        let started = Instant::now();
        match service.call_tool(request).await {
            Ok(result) if result.is_error != Some(true) => {
                let value = result.structured_content.as_ref().and_then(|v| v["value"].as_f64());
                if value == Some(i as f64 * 2.0 + 4.0) {
                    latencies.push(started.elapsed());
                } else {
                    errors += 1;
                }
            }
            Ok(result) => {
                eprintln!("call failed: {:?}", result.content);
                errors += 1;
            }
            Err(e) => {
                eprintln!("call error: {e}");
                errors += 1;
            }
        }
    }
    let _ = service.cancel().await;
    (latencies, errors)
}

async fn run(url: &str, clients: usize, calls: usize) -> Run {
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients).map(|_| tokio::spawn(client(url.to_owned(), calls))).collect();
    let mut latencies = Vec::new();
    let mut errors = 0;
    for task in tasks {
        match tokio::time::timeout(BUDGET.saturating_sub(started.elapsed()), task).await {
            Ok(Ok((l, e))) => {
                latencies.extend(l);
                errors += e;
            }
            _ => errors += calls,
        }
    }
    Run { clients, calls: clients * calls, errors, wall: started.elapsed(), latencies }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` asks for a list of benchmarks
    }
    let clients: Vec<usize> = std::env::var("TOOLSMITH_BENCH_CLIENTS")
        .unwrap_or_else(|_| "1,8".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let calls: usize = std::env::var("TOOLSMITH_BENCH_CALLS").ok().and_then(|s| s.parse().ok()).unwrap_or(500);
    let concurrency = std::env::var("TOOLSMITH_BENCH_CONCURRENCY").ok();
    let server = start_server(concurrency.as_deref(), &[], tempfile::tempdir().expect("temp dir"));
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio");

    // Warm-up: compile caches, sessions, the first registry read.
    let _ = runtime.block_on(run(&server.url, 1, 20));
    let runs: Vec<Run> = clients.iter().map(|&c| runtime.block_on(run(&server.url, c, calls))).collect();

    println!("toolsmith serve, streamable HTTP on loopback, calculator calls");
    println!("| clients | calls | errors | wall s | calls/s | p50 ms | p99 ms | throughput vs 1 client |");
    println!("|---|---|---|---|---|---|---|---|");
    let base = runs.iter().find(|r| r.clients == 1).map(|r| r.calls as f64 / r.wall.as_secs_f64());
    let mut failed = false;
    for mut r in runs {
        r.latencies.sort();
        let throughput = r.calls as f64 / r.wall.as_secs_f64();
        let ratio = base.map(|b| format!("{:.2}x", throughput / b)).unwrap_or_else(|| "-".into());
        println!(
            "| {} | {} | {} | {:.2} | {:.0} | {:.2} | {:.2} | {} |",
            r.clients,
            r.calls,
            r.errors,
            r.wall.as_secs_f64(),
            throughput,
            percentile(&r.latencies, 0.5),
            percentile(&r.latencies, 0.99),
            ratio
        );
        failed |= r.errors > 0;
    }
    if let Some(rss) = peak_rss_mib(server.child.id()) {
        println!("server peak RSS: {rss:.0} MiB");
    }
    drop(server);
    if std::env::var("TOOLSMITH_BENCH_TRAINING").as_deref() != Ok("0") {
        failed |= while_training(&runtime, concurrency.as_deref(), calls);
    }
    if failed {
        eprintln!("errors during the load test");
        std::process::exit(1);
    }
}

/// One client's calls on an idle daemon, then while it trains an SFT job; true on any error.
fn while_training(runtime: &tokio::runtime::Runtime, concurrency: Option<&str>, calls: usize) -> bool {
    let dir = tempfile::tempdir().expect("temp dir");
    let base = dir.path().join("base");
    let init = Command::new(env!("CARGO_BIN_EXE_toolsmith"))
        .args(["policy", "init", "--seed", "3", "--out"])
        .arg(&base)
        .output()
        .expect("policy init");
    assert!(init.status.success(), "policy init failed");
    let base = base.to_str().expect("utf-8").to_owned();
    let server = start_server(concurrency, &["--policy", &base], dir);
    let root = server.url.trim_end_matches("/mcp").to_owned();
    let http = reqwest::Client::new();
    let _ = runtime.block_on(run(&server.url, 1, 20));
    let mut idle = runtime.block_on(run(&server.url, 1, calls));
    let job = json!({"kind": "sft", "config": {
        "init": base, "steps": 10_000, "batch_tokens": 2500, "micro_batch_tokens": 2500, "device": "cpu",
        "eval": null, "checkpoint_every": 50, "tool_format": "brief",
        "data": {"worlds": {"seeds": [5], "countries": 2, "tasks_per_family": 1, "styles": ["react"]}}}});
    let training = runtime.block_on(async {
        let job: serde_json::Value = http.post(format!("{root}/jobs")).json(&job).send().await?.json().await?;
        // Measure once the trainer is past its data preparation and taking steps.
        for _ in 0..600 {
            let status: serde_json::Value = http.get(format!("{root}/status")).send().await?.json().await?;
            if status["training"]["running"]["step"].as_u64().unwrap_or(0) >= 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let measured = run(&server.url, 1, calls).await;
        let after: serde_json::Value = http.get(format!("{root}/status")).send().await?.json().await?;
        let _ = http.post(format!("{root}/jobs/{}/cancel", job["id"])).send().await?;
        Ok::<_, reqwest::Error>((measured, after["training"]["running"]["step"].as_u64().unwrap_or(0)))
    });
    let (mut busy, steps) = match training {
        Ok(r) => r,
        Err(e) => {
            eprintln!("the training job could not be driven: {e}");
            return true;
        }
    };
    idle.latencies.sort();
    busy.latencies.sort();
    println!("\none client's calculator calls on a daemon serving a policy, idle and while it trains");
    println!("| daemon | calls | errors | p50 ms | p99 ms | p50 vs idle |");
    println!("|---|---|---|---|---|---|");
    let idle_p50 = percentile(&idle.latencies, 0.5);
    for (name, r) in [("idle", &idle), ("training (SFT, same cores)", &busy)] {
        println!(
            "| {name} | {} | {} | {:.2} | {:.2} | {:.2}x |",
            r.calls,
            r.errors,
            percentile(&r.latencies, 0.5),
            percentile(&r.latencies, 0.99),
            percentile(&r.latencies, 0.5) / idle_p50
        );
    }
    println!("the job had taken {steps} steps when the calls ended");
    idle.errors + busy.errors > 0
}
