//! The trainer core that supervised fine-tuning and RL both drive.
//!
//! A run is a number of units (an SFT optimiser step, an RL iteration). What every run does the
//! same way lives here: setting up fresh or resumed (with the checks that keep a resume honest),
//! the loop (evaluate before, write each unit's record, evaluate and checkpoint on the run's
//! cadence, stop cleanly on cancel, evaluate, checkpoint and publish at the end), the guarded
//! update (a non-finite loss or gradient norm is refused before anything changes, then clipping,
//! then AdamW) and the one event type a caller maps. What a unit does is each trainer's `Unit`:
//! [`crate::sft`] takes a batch of sequences, [`crate::rl`] samples groups and updates on them.
//!
//! A resumed run must be the run that was started: its kind, its data (by hash) and every
//! run-defining setting must match the checkpoint's. Only the settings a run may legitimately
//! change between sessions (its length, its evaluation and checkpoint cadence, threads, device
//! and gradient checkpointing: each config's `RESUMABLE` and `RESUMABLE_IN_ANY_RUN`) are free; anything else is an error that names the
//! fields, unless the caller resumes with [`Resume::AllowingChanges`], which is recorded in the
//! metrics stream.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use serde_json::Value;
use toolsmith_policy::Policy;
use toolsmith_policy::tch::Tensor;

use crate::TrainError;
use crate::checkpoint::{OPTIMIZER_STATE, Restored, RunDir, TrainerState, write_json};
use crate::heldout::HeldOut;
use crate::metrics::{EvalMetrics, MetricsWriter, Record, ResumeRecord};
use crate::optim::{AdamW, AdamWConfig, Schedule};
use crate::settings::RunConfig;

/// What a run reports as it goes.
#[derive(Debug)]
pub enum Event<'a> {
    /// The data is ready (supervised runs).
    Data {
        /// Sequences.
        sequences: usize,
        /// Tokens in all.
        tokens: usize,
        /// Tokens in the loss.
        trained_tokens: usize,
        /// The longest sequence.
        longest: usize,
    },
    /// Training starts (at a unit above 0 when resumed).
    Started {
        /// Units done (steps or iterations).
        step: u64,
        /// Units in all.
        total: u64,
    },
    /// A unit ended: its record ([`Record::Train`] or [`Record::Iteration`]).
    Step(&'a Record),
    /// A held-out evaluation starts.
    EvalStarted {
        /// Units done.
        step: u64,
    },
    /// A held-out evaluation ended.
    Eval(&'a EvalMetrics),
    /// A checkpoint was written.
    Checkpoint {
        /// Units done.
        step: u64,
        /// Its directory.
        dir: &'a Path,
    },
}

/// Whether a run continues from its newest checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Resume {
    /// Start fresh; a directory that already holds a run is refused.
    #[default]
    No,
    /// Continue from the newest checkpoint (or start fresh if there is none yet); the run's
    /// settings must be the ones it was started with.
    Yes,
    /// As `Yes`, and run-defining settings may differ from the checkpoint's; the changed fields
    /// are written to the metrics stream.
    AllowingChanges,
}

impl Resume {
    /// Whether to resume at all.
    pub fn wanted(self) -> bool {
        self != Resume::No
    }
}

impl From<bool> for Resume {
    fn from(resume: bool) -> Self {
        if resume { Resume::Yes } else { Resume::No }
    }
}

/// What one unit of a run does; the core calls it in order.
pub(crate) trait Unit {
    /// Does unit `core.state().step + 1` and returns its record (the core sets `elapsed_s`,
    /// writes it and counts the unit).
    fn unit(&mut self, core: &mut Core) -> Result<Record, TrainError>;

    /// Writes what the unit's checkpoints carry besides policy, optimiser and state (RL's tool
    /// graph), into the checkpoint's directory before it is published.
    fn extra(&self, _dir: &Path) -> Result<(), TrainError> {
        Ok(())
    }

    /// Runs before the first unit of a session and after every unit (RL pushes the weights to
    /// its engine).
    fn sync(&mut self, _core: &Core) -> Result<(), TrainError> {
        Ok(())
    }
}

/// How a run is set up; see [`Core::new`].
pub(crate) struct Setup<'a, C: RunConfig> {
    /// The run's settings, written to `RUN/config.json` and compared on resume.
    pub config: &'a C,
    /// Seed recorded in the state.
    pub seed: u64,
    /// BLAKE3 of the data (sequences, or the task pool), and what it is, for the error.
    pub data: (String, &'static str),
    /// Units in all.
    pub units: u64,
    /// The learning-rate schedule, over optimiser updates.
    pub schedule: Schedule,
    /// AdamW's settings.
    pub optimizer: AdamWConfig,
    /// Held-out evaluation every this many units (0: before and after only).
    pub eval_every: u64,
    /// A checkpoint every this many units.
    pub checkpoint_every: u64,
    /// Checkpoints kept.
    pub keep_checkpoints: usize,
    /// Held-out evaluation.
    pub heldout: Option<HeldOut>,
    /// How the run resumes.
    pub resume: Resume,
}

/// The state every run shares, and its loop.
pub struct Core {
    run: RunDir,
    policy: Arc<Mutex<Policy>>,
    optimizer: AdamW,
    state: TrainerState,
    schedule: Schedule,
    heldout: Option<HeldOut>,
    metrics: MetricsWriter,
    cancel: Arc<AtomicBool>,
    units: u64,
    eval_every: u64,
    checkpoint_every: u64,
    keep_checkpoints: usize,
    /// Whether the updates draw dropout masks (LoRA dropout above 0).
    dropout: bool,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core").field("run", &self.run).field("state", &self.state).finish_non_exhaustive()
    }
}

impl Core {
    /// A run in `run` training `policy`: fresh, or (with `resumed`, the checkpoint's state and
    /// directory) continuing where the checkpoint left off, after checking that it is the same
    /// run.
    pub(crate) fn new<C: RunConfig>(
        run: RunDir,
        policy: Policy,
        resumed: Option<(TrainerState, PathBuf)>,
        setup: Setup<'_, C>,
    ) -> Result<Self, TrainError> {
        let mut policy = trainable(policy, setup.config)?;
        if resumed.is_none() {
            // The policy's step counts this run's updates (the optimiser's bias correction reads
            // it on resume), not those of the checkpoint it started from.
            policy.state_mut().step = 0;
        }
        let config = serde_json::to_value(setup.config).map_err(|e| TrainError::Config(e.to_string()))?;
        let mut optimizer = AdamW::new(policy.trained_variables(), setup.optimizer);
        let (hash, what) = setup.data;
        let mut changed = Vec::new();
        let state = match resumed {
            Some((state, dir)) => {
                changed = check_settings::<C>(&state, &dir, &config, setup.resume)?;
                if state.data_hash != hash {
                    return Err(TrainError::checkpoint(
                        &dir,
                        format!("{what} differ from what this run was trained on (hash differs); resume with the same"),
                    ));
                }
                // The updates applied, as the policy recorded them (an RL iteration whose groups
                // were all dropped applies none).
                optimizer.load(&dir.join(OPTIMIZER_STATE), policy.state().step)?;
                TrainerState { total_steps: setup.units, config, ..state }
            }
            None => {
                let metrics = run.metrics();
                if metrics.exists() {
                    std::fs::remove_file(&metrics).map_err(|e| TrainError::io(&metrics, e))?;
                }
                TrainerState::new(C::KIND, setup.seed, hash, setup.units, config)
            }
        };
        write_json(&run.root().join("config.json"), setup.config)?;
        let mut metrics = MetricsWriter::append(&run.metrics())?;
        if !changed.is_empty() {
            tracing::warn!(fields = %changed.join(", "), "resuming with changed settings, as allowed");
            metrics.write(&Record::Resumed(ResumeRecord { step: state.step, changed }))?;
        }
        Ok(Core {
            run,
            policy: Arc::new(Mutex::new(policy)),
            optimizer,
            state,
            schedule: setup.schedule,
            heldout: setup.heldout,
            metrics,
            cancel: Arc::new(AtomicBool::new(false)),
            units: setup.units,
            eval_every: setup.eval_every,
            checkpoint_every: setup.checkpoint_every,
            keep_checkpoints: setup.keep_checkpoints,
            dropout: setup.config.run().lora.as_ref().is_some_and(|l| l.dropout > 0.0),
        })
    }

    /// The policy being trained (shared with evaluation and rollouts).
    pub fn policy(&self) -> Arc<Mutex<Policy>> {
        self.policy.clone()
    }

    /// Locks the policy.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Policy> {
        toolsmith_contract::sync::lock(&self.policy)
    }

    /// Set it to stop the run after the current unit (with a checkpoint).
    pub fn cancel_flag(&self) -> Arc<AtomicBool> {
        self.cancel.clone()
    }

    /// Where training stands.
    pub fn state(&self) -> &TrainerState {
        &self.state
    }

    /// Where training stands, for a unit to record its data position.
    pub(crate) fn state_mut(&mut self) -> &mut TrainerState {
        &mut self.state
    }

    /// The learning-rate schedule.
    pub fn schedule(&self) -> Schedule {
        self.schedule
    }

    /// The optimiser.
    pub(crate) fn optimizer_mut(&mut self) -> &mut AdamW {
        &mut self.optimizer
    }

    /// Applies the gradients accumulated for a loss of `loss`: refused (the gradients dropped,
    /// nothing changed) when the loss or the gradient norm is not finite; otherwise the gradient
    /// is clipped to `max_grad_norm` and AdamW steps at `lr`. Returns the norm before clipping.
    pub(crate) fn apply(&mut self, loss: f64, max_grad_norm: f64, lr: f64) -> Result<f64, TrainError> {
        let step = self.optimizer.steps() + 1;
        if !loss.is_finite() {
            self.optimizer.zero_grad();
            return Err(TrainError::NonFinite { step, what: "loss", value: loss });
        }
        let grad_norm = self.optimizer.clip_grad_norm(max_grad_norm);
        if !grad_norm.is_finite() {
            self.optimizer.zero_grad();
            return Err(TrainError::NonFinite { step, what: "gradient norm", value: grad_norm });
        }
        self.optimizer.step(lr);
        let updates = self.optimizer.steps();
        self.lock().state_mut().step = updates;
        Ok(grad_norm)
    }

    /// Trains to the last unit; returns the directory of the final policy.
    pub(crate) fn run(
        &mut self,
        unit: &mut dyn Unit,
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> Result<PathBuf, TrainError> {
        on_event(Event::Started { step: self.state.step, total: self.units });
        if self.state.step == 0 && self.heldout.as_ref().is_some_and(HeldOut::before) {
            self.evaluate(on_event)?;
        }
        let started = Instant::now();
        let elapsed_before = self.state.elapsed_s;
        if self.state.step < self.units {
            unit.sync(self)?;
        }
        while self.state.step < self.units {
            if self.cancel.load(Ordering::Relaxed) {
                self.checkpoint(unit, on_event)?;
                return Err(TrainError::Cancelled);
            }
            // Dropout draws from libtorch's one global generator, which no checkpoint holds:
            // seeded from the run's seed and the unit, and held through it, the masks of a
            // resumed run are those of an uninterrupted one.
            let generator = self.dropout.then(|| toolsmith_policy::seeded(unit_seed(self.state.seed, self.state.step)));
            let mut record = unit.unit(self)?;
            drop(generator);
            unit.sync(self)?;
            self.state.step += 1;
            self.state.elapsed_s = elapsed_before + started.elapsed().as_secs_f64();
            record.set_elapsed(self.state.elapsed_s);
            self.metrics.write(&record)?;
            on_event(Event::Step(&record));
            let last = self.state.step == self.units;
            if self.eval_every > 0 && self.state.step.is_multiple_of(self.eval_every) && !last {
                self.evaluate(on_event)?;
            }
            if self.state.step.is_multiple_of(self.checkpoint_every) && !last {
                self.checkpoint(unit, on_event)?;
            }
        }
        self.evaluate(on_event)?;
        let dir = self.checkpoint(unit, on_event)?;
        let final_dir = self.run.publish(&self.lock())?;
        tracing::info!(checkpoint = %dir.display(), "training finished");
        Ok(final_dir)
    }

    fn evaluate(&mut self, on_event: &mut dyn FnMut(Event<'_>)) -> Result<(), TrainError> {
        let Some(heldout) = &self.heldout else { return Ok(()) };
        on_event(Event::EvalStarted { step: self.state.step });
        let figures = heldout.evaluate(&self.policy, self.state.step);
        self.metrics.write(&Record::Eval(figures.clone()))?;
        on_event(Event::Eval(&figures));
        Ok(())
    }

    fn checkpoint(&mut self, unit: &dyn Unit, on_event: &mut dyn FnMut(Event<'_>)) -> Result<PathBuf, TrainError> {
        let dir = {
            let policy = toolsmith_contract::sync::lock(&self.policy);
            self.run.save_with(&policy, &self.optimizer, &self.state, self.keep_checkpoints, |dir| unit.extra(dir))?
        };
        on_event(Event::Checkpoint { step: self.state.step, dir: &dir });
        Ok(dir)
    }
}

/// The settings a resume of any run may change: how it is watched, where it runs, and whether it
/// recomputes activations (the same gradients).
pub(crate) const RESUMABLE_IN_ANY_RUN: &[&str] =
    &["eval", "eval_every", "checkpoint_every", "keep_checkpoints", "threads", "device", "gradient_checkpointing"];

/// The global generator's seed for unit `step` of a run seeded `seed`.
fn unit_seed(seed: u64, step: u64) -> u64 {
    seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ step
}

/// The policy a run trains: with LoRA adapters (fresh, or the checkpoint's when resuming; on
/// the top `trainable_layers` only, when set), or frozen below its `trainable_layers` (checked
/// against the model before anything is written).
pub(crate) fn trainable<C: RunConfig>(mut policy: Policy, config: &C) -> Result<Policy, TrainError> {
    let settings = config.run();
    let wanted = match (settings.lora.as_ref(), settings.trainable_layers) {
        (Some(lora), Some(n)) => Some(lora.on_top_layers(n, policy.layer_count())?),
        (lora, _) => lora.cloned(),
    };
    match (wanted.as_ref(), policy.lora()) {
        (Some(wanted), Some(has)) if wanted.normalized()? != has.normalized()? => {
            return Err(TrainError::Config(format!(
                "the checkpoint's LoRA adapters ({has:?}) are not the ones configured ({wanted:?})"
            )));
        }
        (Some(wanted), None) => policy.add_lora(wanted, settings.seed)?,
        (None, Some(_)) => {
            return Err(TrainError::Config("the checkpoint carries LoRA adapters but the run has no lora".into()));
        }
        _ => {}
    }
    if wanted.is_none() {
        policy.set_trainable_layers(settings.trainable_layers)?;
    }
    Ok(policy)
}

/// A run opened: its directory, the device and precision to load on, and its newest checkpoint
/// when resuming.
pub(crate) struct Opened {
    /// The run directory.
    pub run: RunDir,
    /// Where and how to load policies.
    pub options: toolsmith_policy::LoadOptions,
    /// The checkpoint to continue from.
    pub restored: Option<Restored>,
}

/// The start of every run: libtorch's threads, the device and precision, the run directory (not
/// created yet: a run refused before its first write leaves nothing behind), and (when `resume`
/// asks for it and there is one) the newest checkpoint, checked to be this run's (its kind and
/// run-defining settings; see [`check_settings`]) before anything else is loaded.
pub(crate) fn open<C: RunConfig>(out: &Path, resume: Resume, config: &C) -> Result<Opened, TrainError> {
    let threads = config.run().threads;
    if threads > 0 {
        toolsmith_policy::set_threads(threads);
    }
    let options = config.run().load_options()?;
    let run = RunDir::at(out);
    if !run.should_resume(resume.wanted())? {
        return Ok(Opened { run, options, restored: None });
    }
    let restored = run.restore(options)?;
    let settings = serde_json::to_value(config).map_err(|e| TrainError::Config(e.to_string()))?;
    check_settings::<C>(&restored.state, &restored.dir, &settings, resume)?;
    Ok(Opened { run, options, restored: Some(restored) })
}

/// Checks that a checkpoint's `state` belongs to a run of `C`'s kind with these settings: the
/// fields outside `C::RESUMABLE` and [`RESUMABLE_IN_ANY_RUN`] that differ are an error unless `resume` allows changes; they are
/// returned. The saved settings are read through `C` first, so a field this version added (absent
/// from an older checkpoint) counts as its default, not as a change.
fn check_settings<C: RunConfig>(
    state: &TrainerState,
    dir: &Path,
    config: &Value,
    resume: Resume,
) -> Result<Vec<String>, TrainError> {
    let kind = C::KIND;
    let resumable: Vec<&str> = C::RESUMABLE.iter().chain(RESUMABLE_IN_ANY_RUN).copied().collect();
    if state.kind != kind {
        return Err(TrainError::checkpoint(
            dir,
            format!("a {} checkpoint, not a {kind} run's; start from it with --init instead", state.kind),
        ));
    }
    let saved = serde_json::from_value::<C>(state.config.clone())
        .ok()
        .and_then(|c| serde_json::to_value(c).ok())
        .unwrap_or_else(|| state.config.clone());
    let mut changed = changed_fields(&saved, config, &resumable);
    // `device` may change, but with precision `auto` another device may be another precision
    // (bf16 on CUDA, f32 on a CPU without bf16), and the optimiser's state would not fit.
    let auto = |v: &Value| v.get("precision").and_then(Value::as_str) == Some("auto");
    if saved.get("device") != config.get("device") && (auto(&saved) || auto(config)) {
        changed.push("device (with precision auto, the precision follows the device)".into());
    }
    if !changed.is_empty() && resume != Resume::AllowingChanges {
        return Err(TrainError::checkpoint(
            dir,
            format!(
                "the run was started with other settings: {} changed; resume with the settings it was started with \
                 (its config.json), or allow the change explicitly (--allow-config-change)",
                changed.join(", ")
            ),
        ));
    }
    Ok(changed)
}

/// The run-defining fields (dotted paths into nested settings) that differ between the saved
/// settings and the new ones; the fields in `free` (dotted paths too) and everything below them
/// are ignored.
pub fn changed_fields(saved: &Value, now: &Value, free: &[&str]) -> Vec<String> {
    fn walk(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
        match (a, b) {
            (Value::Object(a), Value::Object(b)) => {
                let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
                for k in keys {
                    let child = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                    match (a.get(k), b.get(k)) {
                        (Some(x), Some(y)) => walk(&child, x, y, out),
                        _ => out.push(child),
                    }
                }
            }
            _ if a != b => out.push(path.to_string()),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk("", saved, now, &mut out);
    out.retain(|f| !free.iter().any(|p| f == p || f.strip_prefix(p).is_some_and(|rest| rest.starts_with('.'))));
    out
}

/// A `[rows, t]` float tensor of each row's values, zero-padded (or cut) to `t`.
pub(crate) fn padded_rows<'a>(rows: impl ExactSizeIterator<Item = &'a [f64]>, t: i64) -> Tensor {
    let n = rows.len();
    let t_len = usize::try_from(t).unwrap_or(0);
    let mut flat = vec![0_f32; n * t_len];
    for (slot, values) in flat.chunks_mut(t_len.max(1)).zip(rows) {
        for (s, &v) in slot.iter_mut().zip(values) {
            *s = v as f32;
        }
    }
    Tensor::from_slice(&flat).view([n as i64, t])
}
