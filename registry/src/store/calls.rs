//! Calls: usage, failure and reward statistics of tools.

use std::collections::HashMap;

use rusqlite::{Connection, TransactionBehavior, params};
use serde::{Deserialize, Serialize};

use super::links::resolve;
use super::{Registry, now_ms};
use crate::RegistryError;

/// One call of a tool, for its usage statistics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallUsage {
    /// The tool (or an alias of it).
    pub tool: String,
    /// The error kind (`timeout`, `invalid_args`, ...) when the call failed.
    pub failure: Option<String>,
    /// The reward of the episode the call was part of, counted once per episode and tool.
    pub reward: Option<f64>,
}

impl CallUsage {
    /// A call of `tool` that succeeded, or failed with `failure`.
    pub fn new(tool: impl Into<String>, failure: Option<&str>) -> CallUsage {
        CallUsage { tool: tool.into(), failure: failure.map(str::to_string), reward: None }
    }

    /// With the reward of its episode.
    pub fn with_reward(mut self, reward: Option<f64>) -> CallUsage {
        self.reward = reward;
        self
    }
}

/// What [`Registry::record_calls`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RecordedCalls {
    /// Calls counted.
    pub recorded: usize,
    /// Calls of tools the registry does not know, skipped.
    pub unknown: usize,
}

impl Registry {
    /// Counts a call of `name` and, if given, the reward of the trajectory it was part of.
    pub fn record_call(&mut self, name: &str, success: bool, reward: Option<f64>) -> Result<(), RegistryError> {
        if resolve(&self.conn, name)?.is_none() {
            return Err(RegistryError::NotFound(name.to_string()));
        }
        let failure = (!success).then(|| "failed".to_string());
        self.record_calls(&[CallUsage { tool: name.to_string(), failure, reward }])?;
        Ok(())
    }

    /// Counts many calls in one transaction (see [`crate::UsageLog`] for a batching writer).
    /// Calls of tools the registry does not know (a typo, a tool created but not admitted) are
    /// not its statistics: they are skipped and counted in the result.
    pub fn record_calls(&mut self, calls: &[CallUsage]) -> Result<RecordedCalls, RegistryError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let recorded = record_calls(&tx, calls)?;
        tx.commit()?;
        Ok(recorded)
    }
}

/// Counts `calls` inside the caller's transaction (shared with the batching [`crate::UsageLog`]).
pub(crate) fn record_calls(tx: &Connection, calls: &[CallUsage]) -> Result<RecordedCalls, RegistryError> {
    let mut recorded = RecordedCalls::default();
    let now = now_ms();
    let mut ids: HashMap<&str, Option<i64>> = HashMap::new();
    let mut update = tx.prepare_cached(
        "UPDATE tools SET usage_count = usage_count + 1, success_count = success_count + ?2, \
         failure_count = failure_count + ?3, reward_sum = reward_sum + ?4, reward_count = reward_count + ?5, \
         last_used_at = ?6 WHERE id = ?1",
    )?;
    let mut failed = tx.prepare_cached(
        "INSERT INTO failures (tool, kind, count) VALUES (?1, ?2, 1) \
         ON CONFLICT (tool, kind) DO UPDATE SET count = count + 1",
    )?;
    for call in calls {
        let id = match ids.get(call.tool.as_str()) {
            Some(id) => *id,
            None => {
                let id = resolve(tx, &call.tool)?.map(|(id, _)| id);
                ids.insert(&call.tool, id);
                id
            }
        };
        let Some(id) = id else {
            recorded.unknown += 1;
            continue;
        };
        let reward = call.reward.filter(|r| r.is_finite());
        let failure = call.failure.as_deref();
        // A caller's mistake is kept by kind but is not the tool's failure.
        let callers = failure.and_then(toolsmith_contract::ErrorKind::parse).is_some_and(|k| k.is_callers());
        update.execute(params![
            id,
            failure.is_none() as i64,
            (failure.is_some() && !callers) as i64,
            reward.unwrap_or(0.0),
            reward.is_some() as i64,
            now
        ])?;
        if let Some(kind) = failure {
            failed.execute(params![id, kind])?;
        }
        recorded.recorded += 1;
    }
    Ok(recorded)
}
