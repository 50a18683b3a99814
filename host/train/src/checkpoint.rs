//! A run directory and its checkpoints.
//!
//! ```text
//! RUN/
//!   config.json              the resolved settings of the run
//!   metrics.jsonl            the metrics stream
//!   checkpoints/
//!     step-00000060/         a policy checkpoint (Hugging Face layout, loads anywhere) plus
//!       optimizer.safetensors    AdamW's moments (and fp32 master weights under bf16)
//!       trainer-state.json       step, data position, schedule, seeds, config
//!       metrics.jsonl            the metrics up to this step
//!     latest                 the name of the newest complete checkpoint
//!   final/                   the last checkpoint's policy, for `--policy RUN/final`
//! ```
//!
//! A checkpoint is written whole into `checkpoints/.step-N.partial/`, every file synced, then
//! renamed into place, and only then does `latest` (itself written beside and renamed) point at
//! it. A crash at any moment leaves the previous checkpoint as the newest complete one; a failed
//! write (a full disk) removes the partial directory and reports the file that failed.
//!
//! Randomness: supervised training draws none from libtorch (no dropout); the data order of
//! epoch `e` is a permutation seeded by `(seed, e)`. The step, epoch and position in it are
//! therefore the whole random state, and a resumed run takes the same steps.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolsmith_policy::Policy;

use crate::TrainError;
use crate::optim::AdamW;

/// The trainer's part of a checkpoint.
pub const TRAINER_STATE: &str = "trainer-state.json";
/// The optimiser's moments.
pub const OPTIMIZER_STATE: &str = "optimizer.safetensors";
use crate::metrics::METRICS_FILE as METRICS;
const STATE_FORMAT: u32 = 1;

/// Where a run stands: everything besides weights and moments that a resume needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainerState {
    /// Format version of this file.
    pub format: u32,
    /// `sft`.
    pub kind: String,
    /// Optimiser steps done.
    pub step: u64,
    /// The epoch being read (0-based).
    pub epoch: u64,
    /// Sequences of that epoch's order already trained on.
    pub cursor: usize,
    /// Seed of the data order.
    pub seed: u64,
    /// BLAKE3 of the training sequences' ids: a resume refuses other data.
    pub data_hash: String,
    /// Steps the schedule spans.
    pub total_steps: u64,
    /// Seconds trained so far.
    pub elapsed_s: f64,
    /// The run's settings.
    pub config: Value,
}

impl TrainerState {
    /// A state at step 0.
    pub fn new(kind: &str, seed: u64, data_hash: String, total_steps: u64, config: Value) -> Self {
        TrainerState {
            format: STATE_FORMAT,
            kind: kind.into(),
            step: 0,
            epoch: 0,
            cursor: 0,
            seed,
            data_hash,
            total_steps,
            elapsed_s: 0.0,
            config,
        }
    }
}

/// A run directory.
#[derive(Debug, Clone)]
pub struct RunDir {
    root: PathBuf,
}

/// A checkpoint read back for resuming.
#[derive(Debug)]
pub struct Restored {
    /// Its directory.
    pub dir: PathBuf,
    /// The policy.
    pub policy: Policy,
    /// Where training stood.
    pub state: TrainerState,
}

impl RunDir {
    /// The run at `root` (created if missing).
    pub fn create(root: &Path) -> Result<Self, TrainError> {
        fs::create_dir_all(root.join("checkpoints")).map_err(|e| TrainError::io(root, e))?;
        Ok(RunDir { root: root.to_owned() })
    }

    /// The run at `root`, whether or not it exists yet (nothing is written).
    pub fn at(root: &Path) -> Self {
        RunDir { root: root.to_owned() }
    }

    /// The run's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `RUN/metrics.jsonl`.
    pub fn metrics(&self) -> PathBuf {
        self.root.join(METRICS)
    }

    /// `RUN/checkpoints`.
    pub fn checkpoints(&self) -> PathBuf {
        self.root.join("checkpoints")
    }

    /// `RUN/final`.
    pub fn final_policy(&self) -> PathBuf {
        self.root.join("final")
    }

    /// True when the run has a complete checkpoint to resume from.
    pub fn has_checkpoint(&self) -> bool {
        self.latest().is_some()
    }

    /// The newest complete checkpoint: the one `latest` names, or (if that file is missing or
    /// stale) the highest-numbered directory with a trainer state.
    pub fn latest(&self) -> Option<PathBuf> {
        let dir = self.checkpoints();
        if let Ok(name) = fs::read_to_string(dir.join("latest")) {
            let path = dir.join(name.trim());
            if path.join(TRAINER_STATE).is_file() {
                return Some(path);
            }
        }
        self.complete().pop()
    }

    /// Complete checkpoints, oldest first.
    fn complete(&self) -> Vec<PathBuf> {
        let mut found: Vec<PathBuf> = fs::read_dir(self.checkpoints())
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("step-"))
                    && p.join(TRAINER_STATE).is_file()
            })
            .collect();
        found.sort();
        found
    }

    /// Whether a run asked to `resume` can: true when it should restore the newest checkpoint,
    /// false when it starts fresh (a run killed before its first checkpoint starts over). A fresh
    /// start over an existing run is an error: its checkpoints would be overwritten.
    pub fn should_resume(&self, resume: bool) -> Result<bool, TrainError> {
        let found = self.has_checkpoint();
        match (resume, found) {
            (true, true) => Ok(true),
            (true, false) => {
                tracing::warn!(run = %self.root.display(), "no checkpoint to resume from yet; starting from the beginning");
                Ok(false)
            }
            (false, true) => Err(TrainError::Config(format!(
                "{} already holds a run; pass --resume to continue it or choose another --out",
                self.root.display()
            ))),
            (false, false) => Ok(false),
        }
    }

    /// Writes `policy` as the run's final policy (`RUN/final`), whole or not at all.
    pub fn publish(&self, policy: &Policy) -> Result<PathBuf, TrainError> {
        let final_dir = self.final_policy();
        let partial = self.root.join("final.partial");
        let _ = fs::remove_dir_all(&partial);
        // Adapters are folded into the final weights, so the final policy loads anywhere as a
        // plain model; `final/adapter` keeps them as PEFT saves them.
        policy.save_merged(&partial)?;
        if policy.lora().is_some() {
            policy.save_adapter(&partial.join("adapter"))?;
        }
        let _ = fs::remove_dir_all(&final_dir);
        fs::rename(&partial, &final_dir).map_err(|e| TrainError::io(&final_dir, e))?;
        Ok(final_dir)
    }

    /// Writes a checkpoint of `policy`, `optimizer` and `state` (and the run's metrics so far),
    /// atomically; keeps the newest `keep` checkpoints. Returns its directory.
    pub fn save(
        &self,
        policy: &Policy,
        optimizer: &AdamW,
        state: &TrainerState,
        keep: usize,
    ) -> Result<PathBuf, TrainError> {
        self.save_with(policy, optimizer, state, keep, |_| Ok(()))
    }

    /// [`RunDir::save`], with `extra` writing more files into the checkpoint before it is
    /// published (RL's tool registry snapshot): they are part of the same atomic write.
    pub fn save_with(
        &self,
        policy: &Policy,
        optimizer: &AdamW,
        state: &TrainerState,
        keep: usize,
        extra: impl FnOnce(&Path) -> Result<(), TrainError>,
    ) -> Result<PathBuf, TrainError> {
        let name = format!("step-{:08}", state.step);
        let dir = self.checkpoints();
        let partial = dir.join(format!(".{name}.partial"));
        let done = dir.join(&name);
        if partial.exists() {
            fs::remove_dir_all(&partial).map_err(|e| TrainError::io(&partial, e))?;
        }
        let written = (|| {
            policy.save(&partial)?;
            optimizer.save(&partial.join(OPTIMIZER_STATE))?;
            write_json(&partial.join(TRAINER_STATE), state)?;
            let metrics = self.metrics();
            if metrics.exists() {
                fs::copy(&metrics, partial.join(METRICS)).map_err(|e| TrainError::io(&partial.join(METRICS), e))?;
            }
            extra(&partial)?;
            sync_tree(&partial)
        })();
        if let Err(e) = written {
            // Nothing half-written stays behind; the previous checkpoint is still the latest.
            let _ = fs::remove_dir_all(&partial);
            return Err(e);
        }
        if done.exists() {
            fs::remove_dir_all(&done).map_err(|e| TrainError::io(&done, e))?;
        }
        fs::rename(&partial, &done).map_err(|e| TrainError::io(&done, e))?;
        let latest = dir.join("latest");
        let latest_partial = dir.join("latest.partial");
        fs::write(&latest_partial, format!("{name}\n")).map_err(|e| TrainError::io(&latest_partial, e))?;
        fs::rename(&latest_partial, &latest).map_err(|e| TrainError::io(&latest, e))?;
        sync_dir(&dir);
        let complete = self.complete();
        for old in complete.iter().take(complete.len().saturating_sub(keep.max(1))) {
            if let Err(e) = fs::remove_dir_all(old) {
                tracing::warn!(path = %old.display(), "cannot remove an old checkpoint: {e}");
            }
        }
        Ok(done)
    }

    /// Loads the newest checkpoint (policy on `options`' device, trainer state) and puts the
    /// run's metrics back to what they were at that step. Partial checkpoints of a crashed write
    /// are removed.
    pub fn restore(&self, options: toolsmith_policy::LoadOptions) -> Result<Restored, TrainError> {
        let dir = self
            .latest()
            .ok_or_else(|| TrainError::checkpoint(&self.checkpoints(), "no complete checkpoint to resume from"))?;
        for entry in fs::read_dir(self.checkpoints()).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with(".partial")) {
                tracing::warn!(path = %path.display(), "removing a checkpoint whose write did not finish");
                let _ = if path.is_dir() { fs::remove_dir_all(&path) } else { fs::remove_file(&path) };
            }
        }
        let state_path = dir.join(TRAINER_STATE);
        let text = fs::read_to_string(&state_path).map_err(|e| TrainError::io(&state_path, e))?;
        let state: TrainerState = serde_json::from_str(&text)
            .map_err(|e| TrainError::checkpoint(&state_path, format!("invalid trainer state: {e}")))?;
        if state.format != STATE_FORMAT {
            return Err(TrainError::checkpoint(&state_path, format!("format {} is not {STATE_FORMAT}", state.format)));
        }
        let policy = Policy::load(&dir, options)?;
        let saved_metrics = dir.join(METRICS);
        if saved_metrics.exists() {
            fs::copy(&saved_metrics, self.metrics()).map_err(|e| TrainError::io(&self.metrics(), e))?;
        } else if self.metrics().exists() {
            fs::remove_file(self.metrics()).map_err(|e| TrainError::io(&self.metrics(), e))?;
        }
        Ok(Restored { dir, policy, state })
    }
}

/// Writes `value` as pretty JSON beside `path` and renames it into place.
pub fn write_json(path: &Path, value: &impl Serialize) -> Result<(), TrainError> {
    let mut text = serde_json::to_string_pretty(value).map_err(|e| TrainError::Config(e.to_string()))?;
    text.push('\n');
    let partial = path.with_extension("json.partial");
    fs::write(&partial, text).map_err(|e| TrainError::io(&partial, e))?;
    fs::rename(&partial, path).map_err(|e| TrainError::io(path, e))
}

/// Syncs every file of `dir` and the directory itself, so a rename that follows publishes data
/// that is on disk.
fn sync_tree(dir: &Path) -> Result<(), TrainError> {
    for entry in fs::read_dir(dir).map_err(|e| TrainError::io(dir, e))? {
        let path = entry.map_err(|e| TrainError::io(dir, e))?.path();
        if path.is_file() {
            fs::File::open(&path).and_then(|f| f.sync_all()).map_err(|e| TrainError::io(&path, e))?;
        }
    }
    sync_dir(dir);
    Ok(())
}

fn sync_dir(dir: &Path) {
    // Directory fsync is advisory on some filesystems; a failure here loses nothing a crash
    // of the process (rather than the machine) would not.
    if let Ok(f) = fs::File::open(dir) {
        let _ = f.sync_all();
    }
}
