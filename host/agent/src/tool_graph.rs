//! The agent and the tool graph: retrieval of tools for the question and the plan's tasks
//! (hybrid BM25 + embeddings, expanded along the graph), and what a finished trajectory teaches
//! the graph (plan edges, candidate tools).

use std::sync::{Arc, Mutex};

use toolsmith_contract::{Manifest, ToolKind};
use toolsmith_registry::{CallUsage, Candidate, NewTool, RecordedPlan, Registry, RegistryError, SearchRequest, SortBy};

use crate::backend::BoxFuture;
use crate::runner::{Retriever, Trajectory};
use crate::tools::Executor;

/// Retrieves from a registry (searches run on a blocking thread).
#[derive(Debug, Clone)]
pub struct RegistryRetriever {
    registry: Arc<Mutex<Registry>>,
}

impl RegistryRetriever {
    /// A retriever over a registry that training or the daemon may be writing to at the same time.
    pub fn new(registry: Arc<Mutex<Registry>>) -> Self {
        RegistryRetriever { registry }
    }
}

impl Retriever for RegistryRetriever {
    fn retrieve<'a>(&'a self, queries: &'a [String], k: usize) -> BoxFuture<'a, Vec<Manifest>> {
        let registry = self.registry.clone();
        let queries = queries.to_vec();
        Box::pin(async move {
            let found = tokio::task::spawn_blocking(move || -> Result<Vec<Manifest>, RegistryError> {
                let mut r = toolsmith_contract::sync::lock(&registry);
                let hits = r.search(&SearchRequest::new(queries).k(k).expand(true))?;
                hits.iter().map(|h| r.get(&h.name).map(|t| t.manifest)).collect()
            })
            .await;
            match found {
                Ok(Ok(tools)) => tools,
                Ok(Err(e)) => {
                    tracing::warn!("tool retrieval failed: {e}");
                    Vec::new()
                }
                Err(e) => {
                    tracing::warn!("tool retrieval task failed: {e}");
                    Vec::new()
                }
            }
        })
    }
}

/// The names of the agent-written (Python) tools in `registry`: those admitted from agents'
/// creations, which no plugin directory holds.
pub fn python_tools(registry: &Registry) -> Result<Vec<String>, RegistryError> {
    let tools = registry.list(SortBy::Name)?;
    Ok(tools.into_iter().filter(|t| t.manifest.kind == ToolKind::Python).map(|t| t.name).collect())
}

/// Installs the tools called `names`, as `registry` stores them (manifest and code), into each of
/// `executors`, so that an agent which retrieves one can call it. A tool that cannot be installed
/// is a warning: the agent goes on without it.
pub fn install_tools(
    registry: &Mutex<Registry>,
    names: &[String],
    executors: &[&dyn Executor],
) -> Result<(), RegistryError> {
    for name in names {
        let (manifest, blob) = {
            let registry = toolsmith_contract::sync::lock(registry);
            let record = registry.get(name)?;
            let blob = match &record.blob_hash {
                Some(h) => registry.blob(h)?,
                None => None,
            };
            (record.manifest, blob)
        };
        for executor in executors {
            if let Err(e) = executor.install(&manifest, blob.as_deref()) {
                tracing::warn!(tool = %name, "a tool of the graph cannot be installed: {}", e.message);
            }
        }
    }
    Ok(())
}

/// Stores the tools a trajectory created as candidates of `run` (admitted later by the
/// best-reward filter, [`Registry::register_best`]). Returns how many.
pub fn record_candidates(
    registry: &mut Registry,
    run: &str,
    iteration: i64,
    task: &str,
    trajectory: &Trajectory,
    reward: f64,
) -> Result<usize, RegistryError> {
    let created = trajectory.created_tools();
    if created.is_empty() {
        return Ok(0);
    }
    let summary = serde_json::to_string(trajectory).unwrap_or_default();
    for tool in &created {
        let mut manifest = tool.manifest.clone();
        manifest.provenance.created_by_run = Some(run.to_string());
        registry.add_candidate(&Candidate {
            run: run.to_string(),
            iteration,
            task: task.to_string(),
            trajectory: summary.clone(),
            reward,
            tool: NewTool::new(manifest).with_blob(tool.to_blob()),
        })?;
    }
    Ok(created.len())
}

/// Teaches the graph a trajectory's plan: each dependency between tasks becomes a weighted edge
/// between the tools that carried them out (tools the registry does not know are skipped and
/// reported).
pub fn record_plan(
    registry: &mut Registry,
    trajectory: &Trajectory,
    reward: f64,
) -> Result<RecordedPlan, RegistryError> {
    let steps = trajectory.plan_steps();
    if steps.len() < 2 || reward <= 0.0 {
        return Ok(RecordedPlan::default());
    }
    registry.record_plan(&steps, reward)
}

/// A trajectory's calls as usage statistics: every call counts, a failure keeps its error kind,
/// and the episode's `reward` goes once to each tool it used (so a tool's mean reward is the mean
/// over the episodes that used it, not over its calls).
pub fn call_usage(trajectory: &Trajectory, reward: Option<f64>) -> Vec<CallUsage> {
    let mut rewarded = std::collections::HashSet::new();
    trajectory
        .calls()
        .map(|call| {
            let failure = (!call.ok()).then(|| {
                call.result
                    .pointer("/error/kind")
                    .and_then(serde_json::Value::as_str)
                    .map(str::to_string)
                    .or_else(|| serde_json::to_value(call.verdict).ok()?.as_str().map(str::to_string))
                    .unwrap_or_else(|| "failed".into())
            });
            let reward = reward.filter(|_| rewarded.insert(call.name.as_str()));
            CallUsage { tool: call.name.clone(), failure, reward }
        })
        .collect()
}
