//! The scheduler's parallelism: k independent calls to a tool that sleeps 50 ms, run one per turn
//! (ReAct) and as one level (GAP). Prints the ratio sequential / parallel per k (ideal: k, or the
//! concurrency cap when k exceeds it). Medians of 5 runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolsmith_agent::Scheduler;
use toolsmith_agent::backend::BoxFuture;
use toolsmith_agent::tools::{Executor, ToolResult};
use toolsmith_contract::Manifest;

const SLEEP_MS: u64 = 50;

#[derive(Debug)]
struct Sleep;

impl Executor for Sleep {
    fn manifests(&self) -> Vec<Manifest> {
        Vec::new()
    }

    fn call<'a>(&'a self, _name: &'a str, _args: &'a Value) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(SLEEP_MS)).await;
            ToolResult { value: Ok(json!({})), created: None }
        })
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio");
    let tools: Arc<dyn Executor> = Arc::new(Sleep);
    let scheduler = Scheduler { concurrency: 8, timeout: Duration::from_secs(10) };
    println!("{:>4} {:>14} {:>14} {:>8}", "k", "sequential ms", "parallel ms", "ratio");
    for k in [1, 2, 4, 8, 16] {
        let calls = || (0..k).map(|i| ("sleep".to_string(), json!({"i": i}))).collect::<Vec<_>>();
        let (mut seq, mut par) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            let t = Instant::now();
            runtime.block_on(async {
                for c in calls() {
                    scheduler.run_level(&tools, vec![c], 0).await;
                }
            });
            seq.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            runtime.block_on(scheduler.run_level(&tools, calls(), 0));
            par.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let (s, p) = (median(seq), median(par));
        println!("{k:>4} {s:>14.1} {p:>14.1} {:>8.2}", s / p);
    }
    println!("(one call sleeps {SLEEP_MS} ms; concurrency cap {})", scheduler.concurrency);
}
