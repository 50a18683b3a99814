//! Supervised fine-tuning: token-exact sequences with observation masking, token-budget batches
//! with micro-batched gradient accumulation, AdamW under a warm-up + cosine schedule, held-out
//! evaluation before, during and after, and checkpoints that resume to the same loss curve.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use toolsmith_agent::Mode;
use toolsmith_agent::env::{Corpus, World};
use toolsmith_agent::oracle::{Oracle, synthesize};
use toolsmith_policy::tch::{Kind, Tensor};
use toolsmith_policy::{LoadOptions, Policy, Precision, TokenSequence};

use crate::TrainError;
use crate::chat::{Chat, read_chats};
use crate::checkpoint::{RunDir, TrainerState, write_json};
use crate::config::SftConfig;
use crate::heldout::{HeldOut, ToolsFor};
use crate::metrics::{EvalMetrics, MetricsWriter, Record, StepMetrics};
use crate::optim::{AdamW, Schedule};
use crate::sequence::{SequenceBuilder, TrainSequence};

/// What a run reports as it goes.
#[derive(Debug)]
pub enum Event<'a> {
    /// The data is ready.
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
    /// Training starts (at a step above 0 when resumed).
    Started {
        /// Steps done.
        step: u64,
        /// Steps in all.
        total: u64,
    },
    /// A step ended.
    Step(&'a StepMetrics),
    /// A held-out evaluation starts.
    EvalStarted {
        /// Steps done.
        step: u64,
    },
    /// A held-out evaluation ended.
    Eval(&'a EvalMetrics),
    /// A checkpoint was written.
    Checkpoint {
        /// Steps done.
        step: u64,
        /// Its directory.
        dir: &'a Path,
    },
}

/// The device and precision a config asks for.
pub fn load_options(config: &SftConfig) -> Result<LoadOptions, TrainError> {
    load_options_for(&config.device, &config.precision)
}

/// The device and precision named by `device` and `precision` (`auto` for either).
pub fn load_options_for(device: &str, precision: &str) -> Result<LoadOptions, TrainError> {
    let device = toolsmith_policy::parse_device(device)?;
    let precision = match precision {
        "auto" => match device {
            toolsmith_policy::tch::Device::Cpu => Precision::F32,
            _ => Precision::Bf16,
        },
        other => Precision::parse(other)?,
    };
    Ok(LoadOptions { device, precision: Some(precision) })
}

/// The starting policy: a fresh tiny model (with the configured context) or a checkpoint.
pub fn init_policy(config: &SftConfig, options: LoadOptions) -> Result<Policy, TrainError> {
    if config.init != "tiny" {
        return Ok(Policy::load(Path::new(&config.init), options)?);
    }
    let mut tiny: serde_json::Value = serde_json::from_str(toolsmith_policy::TINY_CONFIG)
        .map_err(|e| TrainError::Config(format!("tiny config: {e}")))?;
    tiny["max_position_embeddings"] = serde_json::Value::from(config.tiny_context);
    let mut tokenizer_config = toolsmith_policy::tokenizer::tiny_tokenizer_config();
    tokenizer_config["model_max_length"] = serde_json::Value::from(config.tiny_context);
    Ok(Policy::init(
        tiny,
        toolsmith_policy::TINY_TOKENIZER.as_bytes().to_vec(),
        Some(tokenizer_config),
        config.seed,
        options,
    )?)
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
        let tasks = world.tasks();
        let corpus = Arc::new(Corpus::new(&world.documents()).map_err(|e| TrainError::Agent(e.to_string()))?);
        let oracle = Oracle::new(&tasks, Mode::Gap, tokenizer.clone());
        let examples =
            runtime.block_on(synthesize(&oracle, tools_for(corpus), &tasks, &worlds.styles, config.tool_format, || {}));
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

/// A supervised run.
pub struct SftTrainer {
    config: SftConfig,
    run: RunDir,
    policy: Arc<Mutex<Policy>>,
    optimizer: AdamW,
    data: Vec<TrainSequence>,
    state: TrainerState,
    schedule: Schedule,
    heldout: Option<HeldOut>,
    metrics: MetricsWriter,
    cancel: Arc<AtomicBool>,
}

impl std::fmt::Debug for SftTrainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SftTrainer").field("run", &self.run).field("state", &self.state).finish_non_exhaustive()
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

impl SftTrainer {
    /// A run in `out` from `policy` (fresh, or restored with `state` when resuming) on `data`.
    /// `config` is written to `RUN/config.json`.
    pub fn new(
        config: SftConfig,
        out: &Path,
        policy: Policy,
        data: Vec<TrainSequence>,
        heldout: Option<HeldOut>,
        resumed: Option<(TrainerState, PathBuf)>,
    ) -> Result<Self, TrainError> {
        config.validate()?;
        if data.is_empty() {
            return Err(TrainError::Config("no training sequences".into()));
        }
        let run = RunDir::create(out)?;
        let hash = data_hash(&data);
        let per_epoch = {
            let order = order(config.seed, 0, data.len());
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
        let config_json = serde_json::to_value(&config).map_err(|e| TrainError::Config(e.to_string()))?;
        let mut optimizer = AdamW::new(policy.var_store().variables().into_iter().collect(), config.optimizer);
        let state = match resumed {
            Some((state, dir)) => {
                if state.data_hash != hash {
                    return Err(TrainError::checkpoint(
                        &dir,
                        "the training data differs from the data this run was trained on (hash differs); resume with the same data",
                    ));
                }
                optimizer.load(&dir.join(crate::checkpoint::OPTIMIZER_STATE), state.step)?;
                TrainerState { total_steps: total, config: config_json, ..state }
            }
            None => {
                let metrics = run.metrics();
                if metrics.exists() {
                    std::fs::remove_file(&metrics).map_err(|e| TrainError::io(&metrics, e))?;
                }
                TrainerState::new("sft", config.seed, hash, total, config_json)
            }
        };
        write_json(&run.root().join("config.json"), &config)?;
        let metrics = MetricsWriter::append(&run.metrics())?;
        Ok(SftTrainer {
            config,
            run,
            policy: Arc::new(Mutex::new(policy)),
            optimizer,
            data,
            state,
            schedule,
            heldout,
            metrics,
            cancel: Arc::new(AtomicBool::new(false)),
        })
    }

    /// The policy (shared with evaluation).
    pub fn policy(&self) -> Arc<Mutex<Policy>> {
        self.policy.clone()
    }

    /// Set it to stop the run after the current step (with a checkpoint).
    pub fn cancel_flag(&self) -> Arc<AtomicBool> {
        self.cancel.clone()
    }

    /// Where training stands.
    pub fn state(&self) -> &TrainerState {
        &self.state
    }

    /// The training sequences.
    pub fn sequences(&self) -> &[TrainSequence] {
        &self.data
    }

    /// The learning-rate schedule.
    pub fn schedule(&self) -> Schedule {
        self.schedule
    }

    /// The next `steps` batches, as sequence indices in the order the step feeds them to the
    /// model, without training (for a reference implementation to take the same steps).
    pub fn batch_plan(&self, steps: u64) -> Vec<Vec<usize>> {
        let mut walk = self.walk();
        (0..steps).map(|_| self.arrange(walk.next(&self.data, self.config.batch_tokens))).collect()
    }

    fn walk(&self) -> Walk {
        Walk::at(self.state.seed, self.state.epoch, self.state.cursor, self.data.len())
    }

    /// A batch in the order it is fed: longest first, so similar lengths share micro-batches
    /// (less padding).
    fn arrange(&self, mut batch: Vec<usize>) -> Vec<usize> {
        batch.sort_by_key(|&i| std::cmp::Reverse(self.data[i].len()));
        batch
    }

    fn lock(&self) -> MutexGuard<'_, Policy> {
        self.policy.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Trains to the last step; returns the directory of the final policy.
    pub fn run(&mut self, on_event: &mut dyn FnMut(Event<'_>)) -> Result<PathBuf, TrainError> {
        let tokens: usize = self.data.iter().map(TrainSequence::len).sum();
        let trained_tokens: usize = self.data.iter().map(TrainSequence::trained_tokens).sum();
        let longest = self.data.iter().map(TrainSequence::len).max().unwrap_or(0);
        on_event(Event::Data { sequences: self.data.len(), tokens, trained_tokens, longest });
        on_event(Event::Started { step: self.state.step, total: self.schedule.total });
        if self.state.step == 0 {
            self.evaluate(on_event)?;
        }
        let started = Instant::now();
        let elapsed_before = self.state.elapsed_s;
        let mut walk = self.walk();
        while self.state.step < self.schedule.total {
            if self.cancel.load(Ordering::Relaxed) {
                self.checkpoint(on_event)?;
                return Err(TrainError::Cancelled);
            }
            let batch = self.arrange(walk.next(&self.data, self.config.batch_tokens));
            let step_started = Instant::now();
            let (loss, grad_norm, lr, batch_tokens, batch_trained) = self.step(&batch)?;
            (self.state.epoch, self.state.cursor) = (walk.epoch, walk.cursor);
            self.state.step += 1;
            self.state.elapsed_s = elapsed_before + started.elapsed().as_secs_f64();
            let seconds = step_started.elapsed().as_secs_f64();
            let metrics = StepMetrics {
                step: self.state.step,
                epoch: self.state.epoch as f64 + self.state.cursor as f64 / self.data.len() as f64,
                loss,
                lr,
                grad_norm,
                tokens: batch_tokens,
                trained_tokens: batch_trained,
                tokens_per_sec: batch_tokens as f64 / seconds.max(1e-9),
                elapsed_s: self.state.elapsed_s,
            };
            self.metrics.write(&Record::Train(metrics.clone()))?;
            on_event(Event::Step(&metrics));
            let last = self.state.step == self.schedule.total;
            if self.config.eval_every > 0 && self.state.step.is_multiple_of(self.config.eval_every) && !last {
                self.evaluate(on_event)?;
            }
            if self.state.step.is_multiple_of(self.config.checkpoint_every) && !last {
                self.checkpoint(on_event)?;
            }
        }
        self.evaluate(on_event)?;
        let dir = self.checkpoint(on_event)?;
        let final_dir = self.run.publish(&self.lock())?;
        tracing::info!(checkpoint = %dir.display(), "training finished");
        Ok(final_dir)
    }

    /// One optimiser step on the sequences `batch`: (loss, grad norm, lr, tokens, trained tokens).
    fn step(&mut self, batch: &[usize]) -> Result<(f64, f64, f64, usize, usize), TrainError> {
        let sequences: Vec<TokenSequence> = batch.iter().map(|&i| self.data[i].tokens.clone()).collect();
        let tokens: usize = sequences.iter().map(|s| s.ids.len()).sum();
        let trained: usize = sequences.iter().map(|s| s.loss_mask.iter().skip(1).filter(|&&m| m).count()).sum();
        // Per-token loss weights: the first assistant turn's tokens count `first_turn_weight`
        // times (the objective is the weighted mean; the reported loss stays the plain mean).
        let first = self.config.first_turn_weight;
        // Built only when the first turn is weighted; the plain mean needs none.
        let weights: Vec<Vec<f32>> = if first == 1.0 {
            Vec::new()
        } else {
            batch
                .iter()
                .map(|&i| {
                    let s = &self.data[i];
                    let mut w = vec![1.0_f32; s.tokens.ids.len()];
                    if let Some(turn) = s.turns.first() {
                        for slot in &mut w[turn.clone()] {
                            *slot = first as f32;
                        }
                    }
                    w
                })
                .collect()
        };
        let weighted: f64 = sequences
            .iter()
            .zip(&weights)
            .map(|(s, w)| {
                s.loss_mask.iter().zip(w).skip(1).filter(|(m, _)| **m).map(|(_, &w)| f64::from(w)).sum::<f64>()
            })
            .sum();
        let step = self.state.step;
        let lr = self.schedule.lr(step);
        let micro = self.config.micro_batch_tokens;
        let policy = self.policy.lock().unwrap_or_else(|p| p.into_inner());
        self.optimizer.zero_grad();
        let denominator = trained.max(1) as f64;
        let mut plain = 0.0;
        let objective = policy.accumulate_gradients(&sequences, micro, false, |scores, range| {
            let nll = -(&scores.logprobs * &scores.mask);
            if first == 1.0 {
                return nll.sum(Kind::Float) / denominator;
            }
            plain += nll.detach().sum(Kind::Double).double_value(&[]) / denominator;
            let t = scores.logprobs.size()[1];
            let t_len = t as usize;
            let mut flat = vec![0_f32; range.len() * t_len];
            for (row, w) in flat.chunks_mut(t_len).zip(&weights[range]) {
                for (slot, &v) in row.iter_mut().zip(w) {
                    *slot = v;
                }
            }
            let w = Tensor::from_slice(&flat).view([-1, t]).to_device(scores.logprobs.device());
            (nll * w).sum(Kind::Float) / weighted.max(1e-9)
        })?;
        let loss = if first == 1.0 { objective } else { plain };
        if !loss.is_finite() {
            self.optimizer.zero_grad();
            return Err(TrainError::NonFinite { step: step + 1, what: "loss", value: loss });
        }
        let grad_norm = self.optimizer.clip_grad_norm(self.config.max_grad_norm);
        if !grad_norm.is_finite() {
            self.optimizer.zero_grad();
            return Err(TrainError::NonFinite { step: step + 1, what: "gradient norm", value: grad_norm });
        }
        self.optimizer.step(lr);
        drop(policy);
        self.lock().state_mut().step = step + 1;
        Ok((loss, grad_norm, lr, tokens, trained))
    }

    fn evaluate(&mut self, on_event: &mut dyn FnMut(Event<'_>)) -> Result<(), TrainError> {
        let Some(heldout) = &self.heldout else { return Ok(()) };
        on_event(Event::EvalStarted { step: self.state.step });
        let figures = heldout.evaluate(&self.policy, self.state.step);
        self.metrics.write(&Record::Eval(figures.clone()))?;
        on_event(Event::Eval(&figures));
        Ok(())
    }

    fn checkpoint(&mut self, on_event: &mut dyn FnMut(Event<'_>)) -> Result<PathBuf, TrainError> {
        let dir = {
            let policy = self.lock();
            self.run.save(&policy, &self.optimizer, &self.state, self.config.keep_checkpoints)?
        };
        on_event(Event::Checkpoint { step: self.state.step, dir: &dir });
        Ok(dir)
    }
}

/// Everything `toolsmith train sft` does after reading its settings: policy (fresh or restored),
/// data, held-out set, trainer.
pub fn prepare(
    config: SftConfig,
    out: &Path,
    resume: bool,
    tools_for: &ToolsFor<'_>,
) -> Result<SftTrainer, TrainError> {
    config.validate()?;
    if config.threads > 0 {
        toolsmith_policy::set_threads(config.threads);
    }
    let options = load_options(&config)?;
    let run = RunDir::create(out)?;
    let (policy, resumed) = if run.should_resume(resume)? {
        let restored = run.restore(options)?;
        (restored.policy, Some((restored.state, restored.dir)))
    } else {
        (init_policy(&config, options)?, None)
    };
    let builder = SequenceBuilder::for_policy(&policy)?;
    let chats = load_chats(&config, tools_for)?;
    let data = build_sequences(&builder, &chats)?;
    let heldout = config.eval.clone().map(|e| HeldOut::new(e, config.tool_format, tools_for)).transpose()?;
    SftTrainer::new(config, out, policy, data, heldout, resumed)
}
