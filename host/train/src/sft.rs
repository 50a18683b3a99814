//! Supervised fine-tuning: token-exact sequences with observation masking, token-budget batches
//! with micro-batched gradient accumulation, AdamW under a warm-up + cosine schedule, held-out
//! evaluation before, during and after, and checkpoints that resume to the same loss curve.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use toolsmith_agent::Mode;
use toolsmith_agent::env::{Corpus, Task, World};
use toolsmith_agent::oracle::{Oracle, install_own_tools, synthesize};
use toolsmith_policy::tch::Kind;
use toolsmith_policy::{LoadOptions, Policy, ScoreOptions, TokenSequence};

use crate::TrainError;
use crate::checkpoint::{RunDir, TrainerState};
use crate::config::SftConfig;
use crate::conversation::{Chat, read_chats};
use crate::heldout::{HeldOut, ToolsFor};
use crate::metrics::{Record, StepMetrics};
use crate::optim::Schedule;
pub use crate::run::Event;
use crate::run::{Core, Opened, Resume, Setup, Unit, open, padded_rows, trainable};
use crate::sequence::{SequenceBuilder, TrainSequence};

/// The starting policy: a fresh tiny model (with the configured context) or a checkpoint.
pub fn init_policy(config: &SftConfig, options: LoadOptions) -> Result<Policy, TrainError> {
    config.run.init.load(config.run.seed, options, Some(config.tiny_context))
}

/// Where a conversation came from, for error messages: a file and line, or a world's traces and
/// the trace's number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The file (or `world-SEED traces`).
    pub path: PathBuf,
    /// 1-based line (or trace number).
    pub line: usize,
}

/// Reads the training conversations of `config`: its files, or oracle traces of its worlds
/// (synthesised with the tools `tools_for` gives over each world's corpus).
pub fn load_chats(config: &SftConfig, tools_for: &ToolsFor<'_>) -> Result<Vec<(Source, Chat)>, TrainError> {
    let mut chats = Vec::new();
    if !config.data.files.is_empty() {
        for file in &config.data.files {
            for (line, chat) in read_chats(file)? {
                chats.push((Source { path: file.clone(), line }, chat));
            }
        }
        return Ok(chats);
    }
    let worlds = &config.data.worlds;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| TrainError::Agent(format!("cannot start tokio: {e}")))?;
    let tokenizer = Arc::new(toolsmith_policy::Tokenizer::tiny()?);
    for &seed in &worlds.seeds {
        let world = World::generate(worlds.world(seed));
        let tasks = world.tasks_counted(&worlds.family_tasks);
        let corpus = Arc::new(Corpus::new(&world.documents()).map_err(|e| TrainError::Agent(e.to_string()))?);
        let oracle = Oracle::new(&tasks, Mode::Gap, tokenizer.clone());
        let chosen = reusing(seed, tasks.len(), config.data.reuse);
        let examples = if chosen.is_empty() {
            runtime.block_on(synthesize(
                &oracle,
                tools_for(corpus),
                &tasks,
                &worlds.styles,
                config.run.tool_format,
                || {},
            ))
        } else {
            // The chosen tasks' SEARL traces run where the tools they write are installed already.
            let listed = tools_for(corpus.clone());
            runtime.block_on(install_own_tools(listed.as_ref(), &tasks)).map_err(|e| {
                TrainError::Agent(format!("world {seed}: data.reuse cannot install the tools agents write: {e}"))
            })?;
            let (reused, written): (Vec<_>, Vec<_>) = tasks.iter().enumerate().partition(|(i, _)| chosen.contains(i));
            let reused: Vec<Task> = reused.into_iter().map(|(_, t)| t.clone()).collect();
            let written: Vec<Task> = written.into_iter().map(|(_, t)| t.clone()).collect();
            let others: Vec<Mode> = worlds.styles.iter().copied().filter(|&m| m != Mode::Searl).collect();
            let tools = tools_for(corpus);
            let format = config.run.tool_format;
            runtime.block_on(async {
                let mut examples = synthesize(&oracle, tools.clone(), &tasks, &others, format, || {}).await;
                examples.extend(synthesize(&oracle, tools, &written, &[Mode::Searl], format, || {}).await);
                examples.extend(synthesize(&oracle, listed, &reused, &[Mode::Searl], format, || {}).await);
                examples
            })
        };
        for (i, e) in examples.iter().enumerate() {
            if !e.correct {
                return Err(TrainError::Agent(format!(
                    "world {seed}: the oracle's {} trace of {} is wrong; the world and its solutions disagree",
                    e.style, e.id
                )));
            }
            let source = Source { path: PathBuf::from(format!("world-{seed} traces")), line: i + 1 };
            chats.push((source, Chat::from_messages(&e.messages)));
        }
    }
    Ok(chats)
}

/// Indices of the `reuse` share of a world's `n` tasks (a choice seeded by the world's seed).
fn reusing(seed: u64, n: usize, reuse: f64) -> Vec<usize> {
    let mut all: Vec<usize> = (0..n).collect();
    all.shuffle(&mut StdRng::seed_from_u64(seed ^ 0x5EA1));
    all.truncate((reuse * n as f64).round() as usize);
    all
}

/// Builds every conversation's sequence; the first that does not fit is an error naming it.
pub fn build_sequences(builder: &SequenceBuilder, chats: &[(Source, Chat)]) -> Result<Vec<TrainSequence>, TrainError> {
    chats
        .iter()
        .map(|(source, chat)| {
            builder.build(chat).map_err(|e| TrainError::Data {
                path: source.path.clone(),
                line: source.line,
                message: e.to_string(),
            })
        })
        .collect()
}

/// A walk through the data, epoch by epoch, each in its own seeded order.
struct Walk {
    seed: u64,
    epoch: u64,
    cursor: usize,
    order: Vec<usize>,
}

impl Walk {
    fn at(seed: u64, epoch: u64, cursor: usize, n: usize) -> Self {
        Walk { seed, epoch, cursor, order: order(seed, epoch, n) }
    }

    /// The next batch of at most `budget` tokens (an epoch's end closes a batch).
    fn next(&mut self, data: &[TrainSequence], budget: usize) -> Vec<usize> {
        if self.cursor >= self.order.len() {
            self.epoch += 1;
            self.cursor = 0;
            self.order = order(self.seed, self.epoch, self.order.len());
        }
        let batch = next_batch(data, &self.order, self.cursor, budget);
        self.cursor += batch.len();
        batch
    }
}

/// BLAKE3 of the sequences' ids and masks.
fn data_hash(data: &[TrainSequence]) -> String {
    let mut h = blake3::Hasher::new();
    for s in data {
        h.update(&(s.tokens.ids.len() as u64).to_le_bytes());
        for (&id, &m) in s.tokens.ids.iter().zip(&s.tokens.loss_mask) {
            h.update(&id.to_le_bytes());
            h.update(&[u8::from(m)]);
        }
    }
    h.finalize().to_hex().to_string()
}

/// The data order of `epoch`.
fn order(seed: u64, epoch: u64, n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut StdRng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ epoch));
    order
}

/// Sequences `order[cursor..]` that fit in `budget` tokens (at least one), without crossing the
/// epoch's end.
fn next_batch(data: &[TrainSequence], order: &[usize], cursor: usize, budget: usize) -> Vec<usize> {
    let mut batch = Vec::new();
    let mut tokens = 0;
    for &i in &order[cursor..] {
        let n = data[i].len();
        if !batch.is_empty() && tokens + n > budget {
            break;
        }
        batch.push(i);
        tokens += n;
    }
    batch
}

/// What one supervised step does: the next batch of the walk through the data.
struct SftUnit {
    config: SftConfig,
    data: Vec<TrainSequence>,
    walk: Walk,
}

/// A supervised run.
#[derive(Debug)]
pub struct SftTrainer {
    core: Core,
    unit: SftUnit,
}

impl std::fmt::Debug for SftUnit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SftUnit").field("sequences", &self.data.len()).finish_non_exhaustive()
    }
}

/// The core's accessors (`policy`, `cancel_flag`, `state`, `schedule`) are the trainer's.
impl std::ops::Deref for SftTrainer {
    type Target = Core;

    fn deref(&self) -> &Core {
        &self.core
    }
}

impl SftTrainer {
    /// A run in `out` from `policy` (fresh, or restored with `state` when resuming) on `data`.
    /// `config` is written to `RUN/config.json`; a resumed run must have been started with the
    /// same data and run-defining settings (see [`crate::run`]).
    pub fn new(
        config: SftConfig,
        out: &Path,
        policy: Policy,
        data: Vec<TrainSequence>,
        heldout: Option<HeldOut>,
        resumed: Option<(TrainerState, PathBuf)>,
        resume: Resume,
    ) -> Result<Self, TrainError> {
        config.validate()?;
        if data.is_empty() {
            return Err(TrainError::Config("no training sequences".into()));
        }
        let run = RunDir::create(out)?;
        let per_epoch = {
            let order = order(config.run.seed, 0, data.len());
            let (mut cursor, mut batches) = (0, 0u64);
            while cursor < order.len() {
                cursor += next_batch(&data, &order, cursor, config.batch_tokens).len();
                batches += 1;
            }
            batches
        };
        let total = config.steps.unwrap_or_else(|| (config.epochs * per_epoch as f64).ceil().max(1.0) as u64);
        let schedule = Schedule {
            peak: config.lr,
            warmup: (config.warmup_ratio * total as f64).round() as u64,
            total,
            min_ratio: config.min_lr_ratio,
        };
        let setup = Setup {
            config: &config,
            seed: config.run.seed,
            data: (data_hash(&data), "the training data"),
            units: total,
            schedule,
            optimizer: config.optimizer,
            eval_every: config.run.eval_every,
            checkpoint_every: config.checkpoint_every,
            keep_checkpoints: config.run.keep_checkpoints,
            heldout,
            resume,
        };
        let core = Core::new(run, policy, resumed, setup)?;
        let state = core.state();
        let walk = Walk::at(state.seed, state.epoch, state.cursor, data.len());
        Ok(SftTrainer { core, unit: SftUnit { config, data, walk } })
    }

    /// The training sequences.
    pub fn sequences(&self) -> &[TrainSequence] {
        &self.unit.data
    }

    /// The next `steps` batches, as sequence indices in the order the step feeds them to the
    /// model, without training (for a reference implementation to take the same steps).
    pub fn batch_plan(&self, steps: u64) -> Vec<Vec<usize>> {
        let state = self.core.state();
        let mut walk = Walk::at(state.seed, state.epoch, state.cursor, self.unit.data.len());
        (0..steps).map(|_| self.unit.arrange(walk.next(&self.unit.data, self.unit.config.batch_tokens))).collect()
    }

    /// Trains to the last step; returns the directory of the final policy.
    pub fn run(&mut self, on_event: &mut dyn FnMut(Event<'_>)) -> Result<PathBuf, TrainError> {
        let data = &self.unit.data;
        on_event(Event::Data {
            sequences: data.len(),
            tokens: data.iter().map(TrainSequence::len).sum(),
            trained_tokens: data.iter().map(TrainSequence::trained_tokens).sum(),
            longest: data.iter().map(TrainSequence::len).max().unwrap_or(0),
        });
        self.core.run(&mut self.unit, on_event)
    }
}

impl SftUnit {
    /// A batch in the order it is fed: longest first, so similar lengths share micro-batches
    /// (less padding).
    fn arrange(&self, mut batch: Vec<usize>) -> Vec<usize> {
        batch.sort_by_key(|&i| std::cmp::Reverse(self.data[i].len()));
        batch
    }

    /// Per-token loss weights: the first assistant turn's tokens count `first_turn_weight` times
    /// (the objective is the weighted mean; the reported loss stays the plain mean). `None` when
    /// the first turn is not weighted: the plain mean needs none.
    fn weights(&self, batch: &[usize]) -> Option<Vec<Vec<f64>>> {
        let first = self.config.first_turn_weight;
        (first != 1.0).then(|| {
            batch
                .iter()
                .map(|&i| {
                    let s = &self.data[i];
                    let mut w = vec![1.0; s.tokens.ids.len()];
                    if let Some(turn) = s.turns.first() {
                        w[turn.clone()].fill(first);
                    }
                    w
                })
                .collect()
        })
    }
}

impl Unit for SftUnit {
    fn unit(&mut self, core: &mut Core) -> Result<Record, TrainError> {
        let started = Instant::now();
        let next = self.walk.next(&self.data, self.config.batch_tokens);
        let batch = self.arrange(next);
        let sequences: Vec<TokenSequence> = batch.iter().map(|&i| self.data[i].tokens.clone()).collect();
        let tokens: usize = sequences.iter().map(|s| s.ids.len()).sum();
        let trained: usize = sequences.iter().map(|s| s.loss_mask.iter().skip(1).filter(|&&m| m).count()).sum();
        let weights = self.weights(&batch);
        let weighted: f64 = match &weights {
            Some(weights) => sequences
                .iter()
                .zip(weights)
                .map(|(s, w)| s.loss_mask.iter().zip(w).skip(1).filter(|(m, _)| **m).map(|(_, &w)| w).sum::<f64>())
                .sum(),
            None => trained as f64,
        };
        let step = core.state().step;
        let lr = core.schedule().lr(step);
        let denominator = trained.max(1) as f64;
        let mut plain = 0.0;
        core.optimizer_mut().zero_grad();
        let objective = {
            let policy = core.lock();
            policy.accumulate_gradients(
                &sequences,
                self.config.micro_batch_tokens,
                &ScoreOptions::default().recomputing(self.config.run.gradient_checkpointing),
                |scores, range| {
                    let nll = -(&scores.logprobs * &scores.mask);
                    let Some(weights) = &weights else { return nll.sum(Kind::Float) / denominator };
                    plain += nll.detach().sum(Kind::Double).double_value(&[]) / denominator;
                    let t = scores.logprobs.size()[1];
                    let w =
                        padded_rows(weights[range].iter().map(Vec::as_slice), t).to_device(scores.logprobs.device());
                    (nll * w).sum(Kind::Float) / weighted.max(1e-9)
                },
            )?
        };
        let loss = if weights.is_some() { plain } else { objective };
        let grad_norm = core.apply(loss, self.config.run.max_grad_norm, lr)?;
        let state = core.state_mut();
        (state.epoch, state.cursor) = (self.walk.epoch, self.walk.cursor);
        let seconds = started.elapsed().as_secs_f64();
        Ok(Record::Train(StepMetrics {
            step: step + 1,
            epoch: state.epoch as f64 + state.cursor as f64 / self.data.len() as f64,
            loss,
            lr,
            grad_norm,
            tokens,
            trained_tokens: trained,
            tokens_per_sec: tokens as f64 / seconds.max(1e-9),
            elapsed_s: 0.0,
        }))
    }
}

/// Everything `toolsmith train sft` does after reading its settings: policy (fresh or restored),
/// data, held-out set, trainer.
pub fn prepare(
    config: SftConfig,
    out: &Path,
    resume: impl Into<Resume>,
    tools_for: &ToolsFor<'_>,
) -> Result<SftTrainer, TrainError> {
    let resume = resume.into();
    config.validate()?;
    let Opened { options, restored, .. } = open(out, resume, &config)?;
    let (policy, resumed) = match restored {
        Some(r) => (r.policy, Some((r.state, r.dir))),
        None => (init_policy(&config, options)?, None),
    };
    // Checked here as well as by the core: a model too small for `trainable_layers` is refused
    // before the data is synthesised and before the run directory exists.
    let policy = trainable(policy, &config)?;
    let builder = SequenceBuilder::for_policy(&policy)?;
    let chats = load_chats(&config, tools_for)?;
    let data = build_sequences(&builder, &chats)?;
    let heldout = config.eval.clone().map(|e| HeldOut::new(e, config.run.tool_format, tools_for)).transpose()?;
    SftTrainer::new(config, out, policy, data, heldout, resumed, resume)
}
