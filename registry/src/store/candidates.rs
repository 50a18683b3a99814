//! The candidate pool: tools created during an iteration, admitted by the reward of their trajectory.

use std::collections::BTreeMap;

use rusqlite::{TransactionBehavior, params};
use serde::Serialize;
use toolsmith_contract::Manifest;

use super::blobs::put_blob;
use super::register::{NewTool, Registered, check_new};
use super::rows::manifest_json;
use super::{Registry, now_ms};
use crate::RegistryError;

/// A tool created during an iteration, waiting for [`Registry::register_best`].
#[derive(Debug, Clone)]
pub struct Candidate {
    /// The run (training or evaluation) that created it.
    pub run: String,
    /// The run's iteration.
    pub iteration: i64,
    /// The task the trajectory worked on.
    pub task: String,
    /// The trajectory (episode) that wrote the tool; its tools are admitted together.
    pub trajectory: String,
    /// The trajectory's reward.
    pub reward: f64,
    /// The tool itself.
    pub tool: NewTool,
}

/// A candidate admitted by [`Registry::register_best`].
#[derive(Debug, Clone, Serialize)]
pub struct Admitted {
    /// The task its trajectory worked on.
    pub task: String,
    /// The best trajectory of that task.
    pub trajectory: String,
    /// That trajectory's reward.
    pub reward: f64,
    /// What registering it did.
    pub outcome: Registered,
}

/// A candidate and what became of it: `pending`, `admitted` or `rejected`.
#[derive(Debug, Clone, Serialize)]
pub struct CandidateStatus {
    /// The task its trajectory worked on.
    pub task: String,
    /// The trajectory that wrote it.
    pub trajectory: String,
    /// That trajectory's reward.
    pub reward: f64,
    /// The tool's name.
    pub tool: String,
    /// `pending`, `admitted` or `rejected`.
    pub status: String,
}

/// One row of the candidate pool as stored: what a new candidate and an imported one both write.
pub(crate) struct CandidateRow<'a> {
    pub run: &'a str,
    pub iteration: i64,
    pub task: &'a str,
    pub trajectory: &'a str,
    pub reward: f64,
    pub manifest: &'a Manifest,
    pub blob_hash: Option<&'a str>,
    pub created_at: i64,
    pub status: &'a str,
}

/// Writes one candidate row; its blob, if any, is already stored.
pub(crate) fn insert_candidate(tx: &rusqlite::Transaction<'_>, row: &CandidateRow<'_>) -> Result<(), RegistryError> {
    tx.execute(
        "INSERT INTO candidates (run, iteration, task, trajectory, reward, manifest, blob_hash, created_at, status) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        params![
            row.run,
            row.iteration,
            row.task,
            row.trajectory,
            row.reward,
            manifest_json(row.manifest),
            row.blob_hash,
            row.created_at,
            row.status
        ],
    )?;
    Ok(())
}

impl Registry {
    /// Puts a tool created during an iteration into the candidate pool.
    pub fn add_candidate(&mut self, c: &Candidate) -> Result<i64, RegistryError> {
        check_new(&c.tool.manifest)?;
        if !c.reward.is_finite() {
            return Err(RegistryError::Invalid(format!("candidate reward must be finite, got {}", c.reward)));
        }
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let hash = c.tool.blob.as_deref().map(|b| put_blob(&tx, b)).transpose()?;
        insert_candidate(
            &tx,
            &CandidateRow {
                run: &c.run,
                iteration: c.iteration,
                task: &c.task,
                trajectory: &c.trajectory,
                reward: c.reward,
                manifest: &c.tool.manifest,
                blob_hash: hash.as_deref(),
                created_at: now_ms(),
                status: "pending",
            },
        )?;
        let id = tx.last_insert_rowid();
        tx.commit()?;
        Ok(id)
    }

    /// SEARL E.1: for each task of the iteration, admits only the tools of its highest-reward
    /// trajectory (ties go to the earliest), merging near-duplicates; the rest are rejected.
    pub fn register_best(&mut self, run: &str, iteration: i64) -> Result<Vec<Admitted>, RegistryError> {
        let pending = self.pending(run, iteration)?;
        let best = best_trajectories(&pending);
        let winners: Vec<&Pending> =
            pending.iter().filter(|p| best.get(p.task.as_str()).is_some_and(|(t, _)| *t == p.trajectory)).collect();
        let tools = winners.iter().map(|p| self.candidate_tool(p)).collect::<Result<Vec<_>, _>>()?;
        let outcomes = self.register_many(tools, true)?;
        self.settle(run, iteration, winners.iter().map(|p| p.id))?;
        Ok(winners
            .into_iter()
            .zip(outcomes)
            .map(|(p, outcome)| Admitted {
                task: p.task.clone(),
                trajectory: p.trajectory.clone(),
                reward: p.reward,
                outcome,
            })
            .collect())
    }

    /// The iteration's pending candidates, in the order they were added.
    fn pending(&self, run: &str, iteration: i64) -> Result<Vec<Pending>, RegistryError> {
        let mut stmt = self.conn.prepare(
            "SELECT id, task, trajectory, reward, manifest, blob_hash FROM candidates \
             WHERE run = ?1 AND iteration = ?2 AND status = 'pending' ORDER BY id",
        )?;
        let rows = stmt
            .query_map(params![run, iteration], |r| {
                Ok(Pending {
                    id: r.get(0)?,
                    task: r.get(1)?,
                    trajectory: r.get(2)?,
                    reward: r.get(3)?,
                    manifest: r.get(4)?,
                    blob_hash: r.get(5)?,
                })
            })?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    /// The tool a candidate holds, with its blob.
    fn candidate_tool(&self, p: &Pending) -> Result<NewTool, RegistryError> {
        let manifest: Manifest = serde_json::from_str(&p.manifest)
            .map_err(|e| RegistryError::Invalid(format!("candidate {}: stored manifest unreadable: {e}", p.id)))?;
        let blob = match &p.blob_hash {
            Some(h) => Some(self.conn.query_row("SELECT bytes FROM blobs WHERE hash = ?1", [h], |r| r.get(0))?),
            None => None,
        };
        Ok(NewTool { manifest, blob })
    }

    /// Marks `admitted` as admitted and the iteration's other pending candidates as rejected.
    fn settle(&mut self, run: &str, iteration: i64, admitted: impl Iterator<Item = i64>) -> Result<(), RegistryError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute(
            "UPDATE candidates SET status = 'rejected' WHERE run = ?1 AND iteration = ?2 AND status = 'pending'",
            params![run, iteration],
        )?;
        for id in admitted {
            tx.execute("UPDATE candidates SET status = 'admitted' WHERE id = ?1", [id])?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Candidates of an iteration with their status, for inspection.
    pub fn candidates(&self, run: &str, iteration: i64) -> Result<Vec<CandidateStatus>, RegistryError> {
        let mut stmt = self.conn.prepare(
            "SELECT task, trajectory, reward, json_extract(manifest, '$.name'), status FROM candidates \
             WHERE run = ?1 AND iteration = ?2 ORDER BY id",
        )?;
        let rows = stmt
            .query_map(params![run, iteration], |r| {
                Ok(CandidateStatus {
                    task: r.get(0)?,
                    trajectory: r.get(1)?,
                    reward: r.get(2)?,
                    tool: r.get(3)?,
                    status: r.get(4)?,
                })
            })?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }
}

/// A pending candidate's row.
struct Pending {
    id: i64,
    task: String,
    trajectory: String,
    reward: f64,
    manifest: String,
    blob_hash: Option<String>,
}

/// Each task's best trajectory and its reward: the first to reach the task's highest reward.
fn best_trajectories(pending: &[Pending]) -> BTreeMap<&str, (&str, f64)> {
    let mut best: BTreeMap<&str, (&str, f64)> = BTreeMap::new();
    for p in pending {
        match best.get(p.task.as_str()) {
            Some((_, r)) if *r >= p.reward => {}
            _ => {
                best.insert(&p.task, (&p.trajectory, p.reward));
            }
        }
    }
    best
}
