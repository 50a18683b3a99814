//! Recording tool calls: what a caller waits for. Four threads each record 2,500 calls of 50 tools
//! (a) one transaction per call through a shared registry, as `serve` did before, and (b) through
//! [`UsageLog`], which queues the record and commits batches on its own thread. Medians of 3.
//!
//! `cargo bench -p toolsmith-registry --bench usage`

use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::json;
use toolsmith_contract::Manifest;
use toolsmith_registry::{CallUsage, NewTool, Registry, UsageLog};

const THREADS: usize = 4;
const CALLS: usize = 2_500;
const TOOLS: usize = 50;

fn registry(dir: &std::path::Path) -> Registry {
    let mut registry = Registry::open(&dir.join("registry.db")).expect("open");
    let tools: Vec<NewTool> = (0..TOOLS)
        .map(|i| {
            NewTool::new(
                Manifest::from_value(json!({
                    "name": format!("tool_{i}"), "version": "1.0.0", "description": format!("Tool {i}."),
                    "input_schema": {"type": "object"}, "output_schema": {"type": "object"},
                }))
                .expect("manifest"),
            )
        })
        .collect();
    let vectors = (0..TOOLS).map(|i| (0..toolsmith_registry::DIM).map(|j| ((i + j) % 7) as f32).collect()).collect();
    registry.register_many_embedded(tools, vectors, false).expect("register");
    registry
}

fn call(t: usize, i: usize) -> CallUsage {
    let failure = i.is_multiple_of(10).then_some("timeout");
    CallUsage::new(format!("tool_{}", (t * 31 + i) % TOOLS), failure).with_reward(Some(1.0))
}

/// Seconds the callers spent, and seconds until everything was committed.
fn synchronous() -> (f64, f64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let shared = Arc::new(Mutex::new(registry(dir.path())));
    let started = Instant::now();
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let shared = shared.clone();
            std::thread::spawn(move || {
                for i in 0..CALLS {
                    let c = call(t, i);
                    let mut r = shared.lock().expect("lock");
                    r.record_call(&c.tool, c.failure.is_none(), c.reward).expect("record");
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().expect("thread"));
    let s = started.elapsed().as_secs_f64();
    (s, s)
}

fn batched() -> (f64, f64) {
    let dir = tempfile::tempdir().expect("tempdir");
    drop(registry(dir.path()));
    let log = UsageLog::open(&dir.path().join("registry.db")).expect("log");
    let started = Instant::now();
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let log = log.clone();
            std::thread::spawn(move || {
                for i in 0..CALLS {
                    log.record(call(t, i));
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().expect("thread"));
    let callers = started.elapsed().as_secs_f64();
    log.flush().expect("flush");
    let committed = started.elapsed().as_secs_f64();
    let total: i64 = Registry::open(&dir.path().join("registry.db"))
        .expect("open")
        .list(Default::default())
        .expect("list")
        .iter()
        .map(|t| t.stats.usage_count)
        .sum();
    assert_eq!(total as usize, THREADS * CALLS, "every call counted");
    (callers, committed)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("usage: bench");
        return;
    }
    let runs = |f: fn() -> (f64, f64)| {
        let r: Vec<(f64, f64)> = (0..3).map(|_| f()).collect();
        (median(r.iter().map(|x| x.0).collect()), median(r.iter().map(|x| x.1).collect()))
    };
    let sync = runs(synchronous);
    let batch = runs(batched);
    let n = (THREADS * CALLS) as f64;
    println!("| recording | callers' time | per call | all committed | calls/s committed |");
    println!("|---|---:|---:|---:|---:|");
    for (name, (callers, committed)) in [("a transaction per call", sync), ("UsageLog (batched)", batch)] {
        println!(
            "| {name} | {:.0} ms | {:.2} us | {:.0} ms | {:.0} |",
            callers * 1e3,
            callers / n * 1e6,
            committed * 1e3,
            n / committed
        );
    }
    println!("\ncallers wait {:.0}x less; committed {:.1}x sooner", sync.0 / batch.0, sync.1 / batch.1);
}
