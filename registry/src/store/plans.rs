//! Plans: the dependency graphs of agents' plans, projected onto tools as weighted edges.

use std::collections::{BTreeSet, HashMap};

use rusqlite::TransactionBehavior;
use serde::{Deserialize, Serialize};

use super::Registry;
use super::links::{add_edge, resolve};
use crate::RegistryError;

/// One step of a plan: a call of `tool` that needs the results of the steps in `depends_on`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanStep {
    /// The step's id within its plan.
    pub id: String,
    /// The tool the step calls (or an alias of it).
    pub tool: String,
    /// Ids of the steps whose results this one needs.
    #[serde(default)]
    pub depends_on: Vec<String>,
}

/// What [`Registry::record_plan`] did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RecordedPlan {
    /// Tool-level edges strengthened, as (from, to) canonical names.
    pub edges: Vec<(String, String)>,
    /// Tools the plan used that the registry does not know.
    pub unknown: Vec<String>,
}

impl Registry {
    /// Adds the tool-level projection of a plan's dependency graph: for every step and each step
    /// it depends on, the edge (dependency's tool -> step's tool) gains `weight` once per plan.
    pub fn record_plan(&mut self, steps: &[PlanStep], weight: f64) -> Result<RecordedPlan, RegistryError> {
        if !weight.is_finite() || weight < 0.0 {
            return Err(RegistryError::Invalid(format!("plan weight must be finite and >= 0, got {weight}")));
        }
        let by_id: HashMap<&str, &PlanStep> = steps.iter().map(|s| (s.id.as_str(), s)).collect();
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut recorded = RecordedPlan::default();
        let mut unknown = BTreeSet::new();
        let mut pairs = BTreeSet::new();
        let mut lookup = |tool: &str| -> Result<Option<(i64, String)>, RegistryError> {
            let r = resolve(&tx, tool)?;
            if r.is_none() {
                unknown.insert(tool.to_string());
            }
            Ok(r)
        };
        for step in steps {
            let Some(to) = lookup(&step.tool)? else { continue };
            for dep in &step.depends_on {
                let from_step = by_id.get(dep.as_str()).ok_or_else(|| {
                    RegistryError::Invalid(format!("step `{}` depends on unknown step `{dep}`", step.id))
                })?;
                let Some(from) = lookup(&from_step.tool)? else { continue };
                if from.0 != to.0 {
                    pairs.insert((from, to.clone()));
                }
            }
        }
        for ((src, src_name), (dst, dst_name)) in pairs {
            add_edge(&tx, src, dst, 1, weight)?;
            recorded.edges.push((src_name, dst_name));
        }
        tx.commit()?;
        recorded.edges.sort();
        recorded.unknown = unknown.into_iter().collect();
        Ok(recorded)
    }
}
