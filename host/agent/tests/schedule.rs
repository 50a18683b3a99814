//! The scheduler: calls of a level overlap (up to the cap), levels never overlap, so no task
//! starts before the tasks it depends on have finished; slow calls time out as data.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use toolsmith_agent::Scheduler;
use toolsmith_agent::backend::BoxFuture;
use toolsmith_agent::plan::{Plan, Task};
use toolsmith_agent::tools::{Executor, ToolResult, Verdict};
use toolsmith_contract::Manifest;

/// A tool that sleeps for `ms` milliseconds and logs when each call ran.
#[derive(Debug, Default)]
struct Sleepy {
    log: Mutex<Vec<(String, Instant, Instant)>>,
}

impl Executor for Sleepy {
    fn manifests(&self) -> Vec<Manifest> {
        Vec::new()
    }

    fn call<'a>(&'a self, _name: &'a str, args: &'a Value) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move {
            let start = Instant::now();
            tokio::time::sleep(Duration::from_millis(args["ms"].as_u64().unwrap_or(10))).await;
            let id = args["id"].as_str().unwrap_or_default().to_string();
            self.log.lock().expect("log").push((id.clone(), start, Instant::now()));
            ToolResult { value: Ok(json!({"done": id})), created: None }
        })
    }
}

fn random_plan(rng: &mut StdRng, n: usize) -> Plan {
    let tasks = (0..n)
        .map(|i| {
            let deps = (0..i).filter(|_| rng.random_bool(0.3)).map(|d| d.to_string()).collect();
            Task { id: i.to_string(), description: format!("task {i}"), depends_on: deps }
        })
        .collect();
    Plan::new(tasks).expect("acyclic: dependencies point backwards")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dependencies_are_never_violated_and_inputs_arrive() {
    let mut rng = StdRng::seed_from_u64(4);
    for round in 0..8 {
        let plan = random_plan(&mut rng, 3 + round);
        let sleepy = Arc::new(Sleepy::default());
        let tools: Arc<dyn Executor> = sleepy.clone();
        let scheduler = Scheduler { concurrency: 3, timeout: Duration::from_secs(5) };
        let records = scheduler
            .run_plan(&plan, &tools, |task, inputs| {
                // Every dependency's result is handed to the task.
                assert_eq!(inputs.len(), task.depends_on.len(), "task {}", task.id);
                ("sleep".to_string(), json!({"id": task.id, "ms": 5 + (task.id.len() * 3) as u64}))
            })
            .await;
        assert_eq!(records.len(), plan.tasks().len());
        assert!(records.iter().all(|r| r.verdict == Verdict::Valid));
        let log = sleepy.log.lock().expect("log");
        let times = |id: &str| log.iter().find(|(i, ..)| i == id).map(|(_, s, e)| (*s, *e)).expect("ran");
        for task in plan.tasks() {
            let (start, _) = times(&task.id);
            for dep in &task.depends_on {
                let (_, end) = times(dep);
                assert!(start >= end, "round {round}: {} started before {dep} finished", task.id);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_call_times_out_and_the_others_finish() {
    let tools: Arc<dyn Executor> = Arc::new(Sleepy::default());
    let scheduler = Scheduler { concurrency: 4, timeout: Duration::from_millis(200) };
    let calls = vec![
        ("sleep".to_string(), json!({"id": "fast", "ms": 5})),
        ("sleep".to_string(), json!({"id": "slow", "ms": 5_000})),
    ];
    let records = scheduler.run_level(&tools, calls, 0).await;
    assert_eq!(records[0].verdict, Verdict::Valid);
    assert_eq!(records[1].verdict, Verdict::Timeout);
    assert_eq!(records[1].result["error"]["kind"], "timeout", "{}", records[1].result);
    assert!(records[1].latency_ms < 2_000.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cap_bounds_how_many_calls_run_at_once() {
    let sleepy = Arc::new(Sleepy::default());
    let tools: Arc<dyn Executor> = sleepy.clone();
    let scheduler = Scheduler { concurrency: 2, timeout: Duration::from_secs(5) };
    let calls = (0..6).map(|i| ("sleep".to_string(), json!({"id": i.to_string(), "ms": 40}))).collect();
    scheduler.run_level(&tools, calls, 0).await;
    let log = sleepy.log.lock().expect("log");
    for (id, start, _) in log.iter() {
        let running = log.iter().filter(|(_, s, e)| s <= start && e > start).count();
        assert!(running <= 2, "{running} calls were running when {id} started");
    }
}
