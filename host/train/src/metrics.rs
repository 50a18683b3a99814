//! The metrics stream: one JSON object per line in `RUN/metrics.jsonl`, appended and flushed as
//! each step ends, so a crashed run keeps everything up to its last step and `tail -f` (or the
//! daemon) can follow a live one.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::TrainError;

/// The stream's file name, in a run and in each checkpoint.
pub const METRICS_FILE: &str = "metrics.jsonl";

/// A training step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    /// Optimiser steps done (1 after the first).
    pub step: u64,
    /// Passes over the data so far (fractional).
    pub epoch: f64,
    /// Mean loss per trained token of the step's batch.
    pub loss: f64,
    /// Learning rate of the step.
    pub lr: f64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Tokens in the step's batch (all, trained or not).
    pub tokens: usize,
    /// Trained (assistant) tokens in the batch.
    pub trained_tokens: usize,
    /// Tokens per second of the step (forward, backward and update).
    pub tokens_per_sec: f64,
    /// Seconds since the run started (resumed runs continue the count).
    pub elapsed_s: f64,
}

/// One mode's held-out figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModeFigures {
    /// Exact match.
    pub em: f64,
    /// Token F1.
    pub f1: f64,
    /// Turns per task.
    pub turns: f64,
    /// Share of turns with a format problem (syntax, plan, tool-call JSON, or neither a call
    /// nor an answer).
    pub format_error_rate: f64,
    /// Share of tasks answered at all.
    pub answered: f64,
    /// Share of tasks whose oracle trace, in this mode, fits the turn budget: the most EM the
    /// budget allows (a plan cut off by `max_tokens` is a format error, however right). None
    /// where unknown (runs recorded before it was, or a tokenizer that failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceiling: Option<f64>,
    /// Tasks evaluated.
    pub tasks: usize,
    /// EM by task family.
    pub families: BTreeMap<String, f64>,
    /// Token F1 by task family: partial progress on a family (some objectives of a
    /// multi-objective question right) that its EM does not show. Empty in runs recorded before.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub family_f1: BTreeMap<String, f64>,
}

/// A held-out evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalMetrics {
    /// Optimiser steps done when it ran (0: before training).
    pub step: u64,
    /// Figures by mode.
    pub modes: BTreeMap<String, ModeFigures>,
    /// Mean EM over the modes.
    pub em: f64,
    /// Seconds the evaluation took.
    pub seconds: f64,
}

/// One iteration's figures in RL (a line of `metrics.jsonl`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IterationMetrics {
    /// Iterations done (1 after the first).
    pub iteration: u64,
    /// Mean episode reward of the groups trained on.
    pub reward: f64,
    /// Exact-match rate of every episode sampled (exact calls, for tool-call tasks).
    pub em: f64,
    /// Groups trained on, and groups dropped by dynamic sampling.
    pub groups: usize,
    /// Groups dropped because every episode had the same reward.
    pub dropped: usize,
    /// Episodes sampled.
    pub episodes: usize,
    /// Mean turns per episode.
    pub turns: f64,
    /// Mean tokens the policy wrote per episode.
    pub response_tokens: f64,
    /// Largest context plus response of a turn, mean over episodes.
    pub peak_tokens: f64,
    /// Share of the sampled turns that the turn budget (`max_tokens`) cut off. A budget that
    /// cuts the policy's longer plans teaches it shorter ones, whatever the reward says.
    #[serde(default)]
    pub cut_turns: f64,
    /// Mean KL to the reference per trained token (k3), in the update's last epoch; 0 when the
    /// method has no KL term (no reference is scored).
    pub kl: f64,
    /// Mean KL per trained token to the policy that sampled this iteration's rollouts (k3), in
    /// the update's last epoch: how far the update moved, for every method.
    #[serde(default)]
    pub sampler_kl: f64,
    /// Share of trained tokens whose ratio was clipped, in the update's last epoch.
    pub clip_fraction: f64,
    /// Mean entropy of the policy on trained tokens.
    pub entropy: f64,
    /// The surrogate loss of the last epoch.
    pub loss: f64,
    /// Gradient norm before clipping, last epoch.
    pub grad_norm: f64,
    /// Learning rate.
    pub lr: f64,
    /// Calls creating a tool (`create_and_execute_mcp`).
    pub created_calls: usize,
    /// Calls of tools earlier iterations created and the graph admitted (SEARL's reuse).
    pub reused_calls: usize,
    /// Calls of every other tool (search, plugins).
    #[serde(default)]
    pub other_calls: usize,
    /// Tools the graph admitted after this iteration's rollouts.
    #[serde(default)]
    pub admitted: usize,
    /// Tools in the graph after the iteration (0 without a graph).
    #[serde(default)]
    pub graph_tools: usize,
    /// Rollout tokens per second (generated tokens over rollout wall time).
    pub rollout_tokens_per_sec: f64,
    /// With rollouts on an engine: the mean absolute difference, per sampled token, between the
    /// engine's log-prob and the trainer's (how off-policy the engine's samples are).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_logprob_gap: Option<f64>,
    /// Seconds the iteration took, and the rollouts in it.
    pub seconds: f64,
    /// Seconds of rollouts.
    pub rollout_seconds: f64,
    /// Seconds since the run started.
    pub elapsed_s: f64,
}

/// A resume that changed run-defining settings, as the caller allowed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResumeRecord {
    /// Units done when the run resumed.
    pub step: u64,
    /// The settings that differ from the checkpoint's (dotted paths).
    pub changed: Vec<String>,
}

/// A line of the stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    /// A training step.
    Train(StepMetrics),
    /// A held-out evaluation.
    Eval(EvalMetrics),
    /// An RL iteration.
    Iteration(IterationMetrics),
    /// A resume with changed settings.
    Resumed(ResumeRecord),
}

impl Record {
    /// The unit a record belongs to (the step or iteration it ended, the step an evaluation ran
    /// at, the step a run resumed at).
    pub fn step(&self) -> u64 {
        match self {
            Record::Train(m) => m.step,
            Record::Eval(e) => e.step,
            Record::Iteration(m) => m.iteration,
            Record::Resumed(r) => r.step,
        }
    }

    /// The record's figures without the `kind` tag.
    pub fn figures(&self) -> Option<serde_json::Value> {
        match self {
            Record::Train(m) => serde_json::to_value(m).ok(),
            Record::Eval(e) => serde_json::to_value(e).ok(),
            Record::Iteration(m) => serde_json::to_value(m).ok(),
            Record::Resumed(r) => serde_json::to_value(r).ok(),
        }
    }

    pub(crate) fn set_elapsed(&mut self, elapsed_s: f64) {
        match self {
            Record::Train(m) => m.elapsed_s = elapsed_s,
            Record::Iteration(m) => m.elapsed_s = elapsed_s,
            Record::Eval(_) | Record::Resumed(_) => {}
        }
    }
}

/// Appends records to a metrics file.
#[derive(Debug)]
pub struct MetricsWriter {
    path: PathBuf,
    file: File,
}

impl MetricsWriter {
    /// Opens `path` for appending (created if missing).
    pub fn append(path: &Path) -> Result<Self, TrainError> {
        let file = OpenOptions::new().create(true).append(true).open(path).map_err(|e| TrainError::io(path, e))?;
        Ok(MetricsWriter { path: path.to_owned(), file })
    }

    /// Writes one record as a line and flushes it.
    pub fn write(&mut self, record: &Record) -> Result<(), TrainError> {
        let mut line = serde_json::to_string(record).map_err(|e| TrainError::Config(e.to_string()))?;
        line.push('\n');
        self.file.write_all(line.as_bytes()).map_err(|e| TrainError::io(&self.path, e))?;
        self.file.flush().map_err(|e| TrainError::io(&self.path, e))
    }
}

/// Reads a metrics file; a torn last line (a crash mid-write) is ignored, any other bad line is
/// an error naming it.
pub fn read(path: &Path) -> Result<Vec<Record>, TrainError> {
    let text = std::fs::read_to_string(path).map_err(|e| TrainError::io(path, e))?;
    let lines: Vec<&str> = text.lines().collect();
    let mut records = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(line) {
            Ok(r) => records.push(r),
            Err(_) if i + 1 == lines.len() && !text.ends_with('\n') => {}
            Err(e) => {
                return Err(TrainError::Data {
                    path: path.to_owned(),
                    line: i + 1,
                    message: format!("not a metrics record: {e}"),
                });
            }
        }
    }
    Ok(records)
}
