//! What a job's checkpoints publish: the served policy's new weights (a hot swap) and the tools an
//! RL run admitted to its tool graph, registered in the daemon's registry (which tells MCP
//! clients with `notifications/tools/list_changed`).

use std::path::Path;

use toolsmith_contract::ToolKind;
use toolsmith_registry::{NewTool, Registered, Registry, SortBy};

use crate::Daemon;
use crate::openai::Served;

/// Where a job's results go. Cheap to clone.
#[derive(Clone, Debug)]
pub(super) struct Publisher {
    daemon: Daemon,
    served: Option<Served>,
}

impl Publisher {
    /// Publishes tools to `daemon`'s registry and weights to `served`, when there is one.
    pub(super) fn new(daemon: Daemon, served: Option<Served>) -> Publisher {
        Publisher { daemon, served }
    }

    /// Swaps the served policy to the weights in `dir` for job `id`; the step served now, or
    /// `None` when there is no served policy or it keeps its weights.
    pub(super) fn swap(&self, id: i64, dir: &Path) -> Option<u64> {
        let served = self.served.as_ref()?;
        match served.swap(dir) {
            Ok(step) => {
                tracing::info!(id, step, dir = %dir.display(), "served policy swapped");
                Some(step)
            }
            Err(e) => {
                tracing::warn!(id, dir = %dir.display(), "the served policy keeps its weights: {e}");
                None
            }
        }
    }

    /// Registers the agent-written tools of the checkpoint's tool graph in the daemon's registry
    /// (an unchanged tool is left alone, so this repeats safely); returns how many changed it.
    pub(super) fn publish_tools(&self, checkpoint: &Path) -> Result<usize, String> {
        let snapshot = checkpoint.join(toolsmith_train::rl::training_graph::REGISTRY_FILE);
        if !snapshot.is_file() {
            return Ok(0);
        }
        // Read from a copy: opening a registry writes beside it, and a checkpoint stays as written.
        let scratch = tempfile::tempdir().map_err(|e| e.to_string())?;
        let copy = scratch.path().join("registry.db");
        std::fs::copy(&snapshot, &copy).map_err(|e| format!("{}: {e}", snapshot.display()))?;
        let trained = Registry::open(&copy).map_err(|e| e.to_string())?;
        let tools = agent_written(&trained)?;
        if tools.is_empty() {
            return Ok(0);
        }
        let outcomes = self.daemon.register_blocking(tools).map_err(|e| e.to_string())?;
        Ok(outcomes.iter().filter(|o| !matches!(o, Registered::Unchanged { .. })).count())
    }
}

/// The Python tools of a trained registry, with their code, ready to register elsewhere.
fn agent_written(trained: &Registry) -> Result<Vec<NewTool>, String> {
    let mut tools = Vec::new();
    for record in trained.list(SortBy::Name).map_err(|e| e.to_string())? {
        if record.manifest.kind != ToolKind::Python {
            continue;
        }
        let mut tool = NewTool::new(record.manifest.clone());
        if let Some(hash) = &record.blob_hash
            && let Some(blob) = trained.blob(hash).map_err(|e| e.to_string())?
        {
            tool = tool.with_blob(blob);
        }
        tools.push(tool);
    }
    Ok(tools)
}
