//! Running calls: a level of independent calls runs concurrently (up to a cap), each with its own
//! timeout; a plan runs level by level, so no task starts before the tasks it depends on finish.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::Semaphore;
use toolsmith_contract::{ErrorKind, StructuredError};
use toolsmith_sandbox::python::create::PythonTool;

use crate::plan::{Plan, Task};
use crate::tools::{Executor, Verdict};

/// One call as the trace records it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CallRecord {
    /// The tool the agent called, as it wrote the name.
    pub name: String,
    /// The arguments the agent wrote.
    pub arguments: Value,
    /// The result, or the error envelope the agent saw.
    pub result: Value,
    /// How the call's schemas judged it: a success, or which kind of failure.
    pub verdict: Verdict,
    /// Milliseconds from start to finish.
    pub latency_ms: f64,
    /// Milliseconds from the start of its level to its start (queueing behind the cap).
    pub started_ms: f64,
    /// The execution level it ran in.
    pub level: usize,
    /// The plan task it carried out, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// A tool it created (`create_and_execute_mcp`): a candidate of the trajectory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<PythonTool>,
}

impl CallRecord {
    /// Whether the call returned a valid result, which is what counts as a success in the
    /// statistics.
    pub fn ok(&self) -> bool {
        self.verdict == Verdict::Valid
    }
}

/// The scheduler's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheduler {
    /// Calls running at once at most.
    pub concurrency: usize,
    /// How long one call may run before it is cut off with a `timeout` error.
    pub timeout: Duration,
}

impl Default for Scheduler {
    fn default() -> Self {
        Scheduler { concurrency: 8, timeout: Duration::from_secs(30) }
    }
}

impl Scheduler {
    /// Runs independent calls concurrently; records come back in the calls' order.
    pub async fn run_level(
        &self,
        tools: &Arc<dyn Executor>,
        calls: Vec<(String, Value)>,
        level: usize,
    ) -> Vec<CallRecord> {
        let semaphore = Arc::new(Semaphore::new(self.concurrency.clamp(1, Semaphore::MAX_PERMITS)));
        let level_start = Instant::now();
        let futures = calls.into_iter().map(|(name, arguments)| {
            let semaphore = semaphore.clone();
            let tools = tools.clone();
            async move {
                // The semaphore is never closed, so acquiring only waits.
                let _permit = semaphore.acquire_owned().await.ok();
                let started = Instant::now();
                let outcome = tokio::time::timeout(self.timeout, tools.call(&name, &arguments)).await;
                let latency_ms = started.elapsed().as_secs_f64() * 1e3;
                let (value, created) = match outcome {
                    Ok(r) => (r.value, r.created),
                    Err(_) => (
                        Err(StructuredError::new(
                            ErrorKind::Timeout,
                            &name,
                            format!("no result within {:.1} s", self.timeout.as_secs_f64()),
                        )
                        .with_hint("simplify the call or split the work")),
                        None,
                    ),
                };
                let verdict = Verdict::of(&value);
                let result = match value {
                    Ok(v) => v,
                    Err(e) => e.to_envelope(),
                };
                CallRecord {
                    name,
                    arguments,
                    result,
                    verdict,
                    latency_ms,
                    started_ms: (started - level_start).as_secs_f64() * 1e3,
                    level,
                    task: None,
                    created,
                }
            }
        });
        join_all(futures).await
    }

    /// Runs a plan whose tasks are calls: `bind` turns a task and the results of the tasks it
    /// depends on into a call. Levels run one after another; each level's calls run concurrently.
    pub async fn run_plan<F>(&self, plan: &Plan, tools: &Arc<dyn Executor>, mut bind: F) -> Vec<CallRecord>
    where
        F: FnMut(&Task, &HashMap<String, Value>) -> (String, Value),
    {
        let mut results: HashMap<String, Value> = HashMap::new();
        let mut records = Vec::new();
        for (level, indices) in plan.levels().into_iter().enumerate() {
            let tasks: Vec<&Task> = indices.iter().map(|&i| &plan.tasks()[i]).collect();
            let calls = tasks
                .iter()
                .map(|t| {
                    let inputs: HashMap<String, Value> =
                        t.depends_on.iter().filter_map(|d| results.get(d).map(|v| (d.clone(), v.clone()))).collect();
                    bind(t, &inputs)
                })
                .collect();
            let level_records = self.run_level(tools, calls, level).await;
            for (task, mut record) in tasks.iter().zip(level_records) {
                results.insert(task.id.clone(), record.result.clone());
                record.task = Some(task.id.clone());
                records.push(record);
            }
        }
        records
    }
}
