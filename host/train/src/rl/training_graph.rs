//! SEARL's tool graph while training: each run has its own registry (`RUN/registry.db`), seeded
//! with the tools of the training worlds. Episodes retrieve from it; after each iteration the
//! tools rollouts created are candidates, the best rollout's per task are admitted (near-duplicates
//! merged), plans become reward-weighted edges, and calls update usage and reward statistics.
//! Admitted tools are installed in the executors, so later iterations can call what earlier ones
//! wrote. Each checkpoint carries a snapshot of the registry; resuming restores it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use toolsmith_agent::Trajectory;
use toolsmith_agent::graph::{
    RegistryRetriever, call_usage, install_tools, python_tools, record_candidates, record_plan,
};
use toolsmith_agent::runner::Retriever;
use toolsmith_agent::tools::{CREATE_TOOL, Executor};
use toolsmith_contract::Manifest;
use toolsmith_registry::{NewTool, Registered, Registry};

use crate::TrainError;
use crate::rl::reward::EpisodeReward;

/// The registry's file name, in the run directory and in each checkpoint.
pub const REGISTRY_FILE: &str = "registry.db";

/// The run's name in the registry's candidate table.
const RUN: &str = "rl";

/// The tool graph's settings (SEARL).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct GraphConfig {
    /// Tools retrieved per query (the question, then each planned sub-task). By default 5.
    pub top_k: usize,
    /// Admit the best rollout's created tools after each iteration. By default true.
    pub admit: bool,
}

impl Default for GraphConfig {
    fn default() -> Self {
        GraphConfig { top_k: 5, admit: true }
    }
}

/// What one iteration taught the graph.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct GraphUpdate {
    /// Created tools that ran, from each group's best rollouts.
    pub candidates: usize,
    /// Of them, admitted as new tools or new versions.
    pub admitted: usize,
    /// Of them, merged into a near-duplicate already in the graph.
    pub merged: usize,
    /// Plan edges recorded (new or reinforced).
    pub edges: usize,
    /// Tools in the graph after the iteration.
    pub tools: usize,
}

/// The run's registry.
#[derive(Debug, Clone)]
pub struct TrainingGraph {
    registry: Arc<Mutex<Registry>>,
    path: PathBuf,
}

fn registry_error(path: &Path, e: impl std::fmt::Display) -> TrainError {
    TrainError::checkpoint(path, format!("tool registry: {e}"))
}

fn remove_registry(path: &Path) -> Result<(), TrainError> {
    let mut index = path.as_os_str().to_owned();
    index.push(".index");
    let index = PathBuf::from(index);
    if index.exists() {
        std::fs::remove_dir_all(&index).map_err(|e| TrainError::io(&index, e))?;
    }
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        let file = PathBuf::from(file);
        if file.exists() {
            std::fs::remove_file(&file).map_err(|e| TrainError::io(&file, e))?;
        }
    }
    Ok(())
}

impl TrainingGraph {
    /// A fresh registry at `path` (any old one is replaced) holding `tools`: the manifests the
    /// training worlds' executors run, except `create_and_execute_mcp`, which is always listed.
    pub fn create(path: &Path, tools: &[Manifest]) -> Result<Self, TrainError> {
        remove_registry(path)?;
        let mut registry = Registry::open(path).map_err(|e| registry_error(path, e))?;
        let seed: Vec<NewTool> =
            tools.iter().filter(|m| m.name.as_str() != CREATE_TOOL).map(|m| NewTool::new(m.clone())).collect();
        registry.register_many(seed, false).map_err(|e| registry_error(path, e))?;
        // Seeded already: the command line must not add the bundled plugins when it opens this
        // registry (`toolsmith tools list --registry RUN/registry.db`).
        registry.set_meta("seeded", "training").map_err(|e| registry_error(path, e))?;
        Ok(TrainingGraph { registry: Arc::new(Mutex::new(registry)), path: path.to_path_buf() })
    }

    /// The registry at `path` put back to the snapshot in `checkpoint` (what the graph was when
    /// that checkpoint was written; later changes are dropped with the iterations that made
    /// them).
    pub fn restore(path: &Path, checkpoint: &Path) -> Result<Self, TrainError> {
        let snapshot = checkpoint.join(REGISTRY_FILE);
        if !snapshot.exists() {
            return Err(TrainError::checkpoint(
                checkpoint,
                "no tool registry snapshot in this checkpoint (the run was started without the tool graph: resume with --no-graph)",
            ));
        }
        remove_registry(path)?;
        let partial = path.with_extension("db.partial");
        std::fs::copy(&snapshot, &partial).map_err(|e| TrainError::io(&partial, e))?;
        std::fs::rename(&partial, path).map_err(|e| TrainError::io(path, e))?;
        let registry = Registry::open(path).map_err(|e| registry_error(path, e))?;
        Ok(TrainingGraph { registry: Arc::new(Mutex::new(registry)), path: path.to_path_buf() })
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        toolsmith_contract::sync::lock(&self.registry)
    }

    /// Where the registry lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Retrieval from the graph, for the agents of the next rollouts.
    pub fn retriever(&self) -> Arc<dyn Retriever> {
        Arc::new(RegistryRetriever::new(self.registry.clone()))
    }

    /// Installs every tool the graph admitted (Python tools, with their code) into each of
    /// `executors`; returns how many tools. Called on resume, when the executors start empty of
    /// them.
    pub fn install_all(&self, executors: &[&dyn Executor]) -> Result<usize, TrainError> {
        let names = self.admitted_names()?;
        self.install(&names, executors)?;
        Ok(names.len())
    }

    /// Installs the tools called `names`, as the registry stores them, into each of `executors`.
    /// A tool that cannot be installed is a warning: the run goes on without it.
    fn install(&self, names: &[String], executors: &[&dyn Executor]) -> Result<(), TrainError> {
        install_tools(&self.registry, names, executors).map_err(|e| registry_error(&self.path, e))
    }

    /// Learns from an iteration's groups, each `(task key, episodes, rewards)`: candidates, the
    /// best-reward admission, plan edges and call statistics. Newly admitted tools are installed
    /// into each of `executors`.
    ///
    /// Only rollouts that answered right (`outcome > 0`) and reach the highest total reward among
    /// the group's right ones are candidates: the registry's admission picks the best
    /// *candidate*, so a lower-reward rollout's tools would otherwise be admitted whenever the
    /// best rollout wrote none, and a group that failed altogether would still add tools (SEARL's
    /// shaped totals are above 0 for a well-formed wrong answer).
    pub fn learn(
        &self,
        iteration: u64,
        groups: &[(&str, &[Trajectory], &[EpisodeReward])],
        admit: bool,
        executors: &[&dyn Executor],
    ) -> Result<GraphUpdate, TrainError> {
        let err = |e| registry_error(&self.path, e);
        let iteration = iteration as i64;
        let mut update = GraphUpdate::default();
        let mut fresh = Vec::new();
        {
            let mut registry = self.lock();
            for (task, episodes, rewards) in groups {
                let right = |r: &&EpisodeReward| r.outcome > 0.0 && r.total.is_finite();
                let best = rewards.iter().filter(right).map(|r| r.total).fold(f64::NEG_INFINITY, f64::max);
                for (episode, reward) in episodes.iter().zip(rewards.iter()) {
                    if !(right(&reward) && reward.total >= best) {
                        continue;
                    }
                    let reward = reward.total;
                    update.candidates +=
                        record_candidates(&mut registry, RUN, iteration, task, episode, reward).map_err(err)?;
                }
            }
            if admit && update.candidates > 0 {
                for admitted in registry.register_best(RUN, iteration).map_err(err)? {
                    match admitted.outcome {
                        Registered::Added { name } | Registered::Updated { name } => {
                            update.admitted += 1;
                            fresh.push(name);
                        }
                        Registered::Merged { .. } => update.merged += 1,
                        Registered::Unchanged { .. } => {}
                    }
                }
            }
            // One transaction for the iteration's calls; calls of tools the graph does not hold
            // (a creation, a typo) are not its statistics and are skipped.
            let mut usage = Vec::new();
            for (_, episodes, rewards) in groups {
                for (episode, reward) in episodes.iter().zip(rewards.iter().map(|r| r.total)) {
                    if !reward.is_finite() {
                        continue;
                    }
                    update.edges += record_plan(&mut registry, episode, reward).map_err(err)?.edges.len();
                    usage.extend(call_usage(episode, Some(reward)));
                }
            }
            registry.record_calls(&usage).map_err(err)?;
            update.tools = registry.len().map_err(err)?;
        }
        self.install(&fresh, executors)?;
        Ok(update)
    }

    /// The name each tool the `episodes` created would merge into if the graph admitted it now
    /// (near-duplicates of held tools, or of each other, share one; see
    /// [`Registry::merged_names`]); names that merge nowhere are left out. SEARL merges the
    /// iteration's created tools before it forms its step groups.
    pub fn merged_names<'a>(
        &self,
        episodes: impl IntoIterator<Item = &'a Trajectory>,
    ) -> Result<HashMap<String, String>, TrainError> {
        let created: Vec<(&str, &str)> = episodes
            .into_iter()
            .flat_map(Trajectory::calls)
            .filter_map(|c| c.created.as_ref())
            .map(|tool| (tool.manifest.name.as_str(), tool.manifest.description.as_str()))
            .collect();
        let names = self.lock().merged_names(&created).map_err(|e| registry_error(&self.path, e))?;
        Ok(created
            .iter()
            .zip(names)
            .filter(|((name, _), into)| name != into)
            .map(|((name, _), into)| (name.to_string(), into))
            .collect())
    }

    /// Names of the tools the graph admitted from rollouts (agent-written Python tools).
    pub fn admitted_names(&self) -> Result<Vec<String>, TrainError> {
        python_tools(&self.lock()).map_err(|e| registry_error(&self.path, e))
    }

    /// Writes the registry's snapshot into a checkpoint directory being written.
    pub fn snapshot(&self, checkpoint: &Path) -> Result<(), TrainError> {
        let target = checkpoint.join(REGISTRY_FILE);
        if target.exists() {
            std::fs::remove_file(&target).map_err(|e| TrainError::io(&target, e))?;
        }
        self.lock().snapshot(&target).map_err(|e| registry_error(&target, e))
    }
}
