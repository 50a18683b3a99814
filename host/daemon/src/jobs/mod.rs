//! Training jobs in the daemon: a queue stored in SQLite, one runner thread, live progress.
//!
//! - A job is an SFT or RL run with the same config as `toolsmith train sft|rl` (JSON, checked
//!   against the config's schema and rules when submitted). Its run directory is
//!   `STATE/jobs/<id>/`, laid out exactly like `--out` of `toolsmith train`.
//! - One job runs at a time; the others wait in submission order. Jobs and their states live in
//!   `STATE/jobs.db`, so a restarted daemon knows every job. A job found `running` at start
//!   belonged to a daemon that died: it is queued again and resumes from its last checkpoint (the
//!   trainer writes checkpoints whole or not at all).
//! - After each checkpoint the served policy (when there is one) is swapped to it, and tools an
//!   RL run admitted to its tool graph are registered in the daemon's registry, which tells MCP
//!   clients with `notifications/tools/list_changed`.
//! - Cancelling a running job stops it after the current step with a checkpoint; resuming a
//!   cancelled or failed job queues it again from that checkpoint. A daemon told to stop does
//!   the same to its running job but leaves it queued for the next start.
//!
//! The rooms: `store` keeps the table, `runner` trains (progress, cancellation), `publish` hands
//! checkpoints on (weights, tools), `queue` is the [`Jobs`] handle, `api` the HTTP routes and
//! `inputs` what a config may read. This file holds the types they share.

use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

mod api;
mod inputs;
mod publish;
mod queue;
mod runner;
mod store;

pub use api::jobs_router;
pub use inputs::{DEFAULT_MAX_DATA_BYTES, JobInputs};
pub use queue::Jobs;
pub(crate) use queue::StatusSource;
pub use store::{JOBS_FILE, LOCK_FILE};

/// A fieldless enum whose variants are named by serde alone (`rename_all = "snake_case"`): the
/// one spelling each variant has in SQLite, over HTTP and in messages.
trait Spelled: Serialize + DeserializeOwned {
    /// The variant's name.
    fn spelling(&self) -> String {
        // A unit variant always serializes to a string; the round-trip test pins every one.
        match serde_json::to_value(self) {
            Ok(Value::String(name)) => name,
            _ => String::new(),
        }
    }

    /// The variant named `text`; `None` for a name no variant has.
    fn from_spelling(text: &str) -> Option<Self> {
        serde_json::from_value(Value::String(text.to_owned())).ok()
    }
}

/// Which trainer a job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobKind {
    /// `toolsmith train sft`.
    Sft,
    /// `toolsmith train rl`.
    Rl,
}

impl Spelled for JobKind {}

impl std::fmt::Display for JobKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.spelling())
    }
}

/// Where a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Waiting for the runner.
    Queued,
    /// Training now.
    Running,
    /// Finished; its final policy is in `RUN/final`.
    Succeeded,
    /// Stopped by an error (kept in `error`); it can be resumed.
    Failed,
    /// Cancelled; it can be resumed from its last checkpoint.
    Cancelled,
}

impl JobState {
    /// True when the job will not change again unless someone resumes it.
    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Failed | JobState::Cancelled)
    }
}

impl Spelled for JobState {}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.spelling())
    }
}

/// A job as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// Its number, from 1.
    pub id: i64,
    /// SFT or RL.
    pub kind: JobKind,
    /// Where it is.
    pub state: JobState,
    /// The trainer's config, as submitted (defaults filled in).
    pub config: Value,
    /// The run directory.
    pub dir: PathBuf,
    /// Steps (RL: iterations) done, as of the last report.
    pub step: u64,
    /// Steps in all (0 until the trainer starts).
    pub total: u64,
    /// The newest checkpoint's directory.
    pub checkpoint: Option<PathBuf>,
    /// Why it failed.
    pub error: Option<String>,
    /// Times the runner started it (more than 1 after a resume or a daemon restart).
    pub runs: u64,
    /// Unix milliseconds.
    pub created_at: i64,
    /// Unix milliseconds of the latest start.
    pub started_at: Option<i64>,
    /// Unix milliseconds of the end.
    pub finished_at: Option<i64>,
}

/// What the jobs API refuses, or what fails underneath it.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// No such job.
    #[error("no job {0}")]
    NotFound(i64),
    /// The submission is not a usable job.
    #[error("{0}")]
    Invalid(String),
    /// The job is not in a state that allows this.
    #[error("job {id} is {state}: {why}")]
    Conflict {
        /// The job.
        id: i64,
        /// Its state.
        state: JobState,
        /// What cannot be done.
        why: &'static str,
    },
    /// Another daemon runs the jobs of this state directory.
    #[error("another daemon runs the jobs in {0}; stop it, or give this one another --state-dir")]
    Locked(PathBuf),
    /// The jobs database failed.
    #[error("jobs database {path}: {source}")]
    Store {
        /// The database file.
        path: PathBuf,
        /// The cause.
        source: rusqlite::Error,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// The running job, as the runner last heard of it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Live {
    /// The job.
    pub id: i64,
    /// SFT or RL.
    pub kind: Option<JobKind>,
    /// Steps (RL: iterations) done.
    pub step: u64,
    /// Steps in all.
    pub total: u64,
    /// What it is doing (`preparing`, `training`, `evaluating`).
    pub phase: String,
    /// The newest step's (or iteration's) figures.
    pub last: Option<Value>,
    /// The newest checkpoint's step.
    pub checkpoint_step: Option<u64>,
    /// The served policy's step, after the newest swap.
    pub served_step: Option<u64>,
}

/// What `/status` says about training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobsStatus {
    /// The running job.
    pub running: Option<Live>,
    /// Jobs waiting.
    pub queued: usize,
}

/// The JSON body of `POST /jobs`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Submission {
    /// `sft` or `rl`.
    pub kind: JobKind,
    /// The trainer's config (the same fields as its config file).
    #[serde(default = "empty_object")]
    pub config: Value,
}

fn empty_object() -> Value {
    json!({})
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [JobKind; 2] = [JobKind::Sft, JobKind::Rl];
    const STATES: [JobState; 5] =
        [JobState::Queued, JobState::Running, JobState::Succeeded, JobState::Failed, JobState::Cancelled];

    /// The names existing `jobs.db` files and API clients use; the exhaustive matches make a
    /// new variant fail here until its name is pinned (and added to the lists above).
    fn stored_kind(kind: JobKind) -> &'static str {
        match kind {
            JobKind::Sft => "sft",
            JobKind::Rl => "rl",
        }
    }

    fn stored_state(state: JobState) -> &'static str {
        match state {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    fn round_trips<T: Spelled + std::fmt::Display + std::fmt::Debug + PartialEq + Copy>(variant: T, name: &str) {
        assert_eq!(variant.spelling(), name);
        assert_eq!(variant.to_string(), name);
        assert_eq!(serde_json::to_value(variant).ok(), Some(json!(name)));
        assert_eq!(T::from_spelling(name), Some(variant));
        assert_eq!(serde_json::from_value::<T>(json!(name)).ok(), Some(variant));
    }

    #[test]
    fn every_variant_round_trips_under_its_stored_name() {
        for kind in KINDS {
            round_trips(kind, stored_kind(kind));
        }
        for state in STATES {
            round_trips(state, stored_state(state));
        }
    }

    #[test]
    fn names_no_variant_has_are_refused() {
        for name in ["", "Sft", "SFT", "ppo"] {
            assert_eq!(JobKind::from_spelling(name), None, "{name:?}");
        }
        for name in ["", "Queued", "RUNNING", "canceled", "done"] {
            assert_eq!(JobState::from_spelling(name), None, "{name:?}");
        }
    }

    #[test]
    fn a_conflict_names_the_state_as_stored() {
        let e = JobError::Conflict { id: 3, state: JobState::Succeeded, why: "only cancelled or failed jobs resume" };
        assert_eq!(e.to_string(), "job 3 is succeeded: only cancelled or failed jobs resume");
    }
}
