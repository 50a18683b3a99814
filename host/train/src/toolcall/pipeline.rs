//! `toolsmith train tools`: interfaces in, an adapter that calls them out.
//!
//! 1. **Tasks.** Synthetic interfaces of the training split plus the user's tools make the
//!    training tasks; held-out sets are made from the held-out split (domains and parameter names
//!    training never sees), from real tools the run is not trained on, and from the user's tools
//!    with other values. Everything is written to `RUN/data/` as JSON lines.
//! 2. **SFT** on the tasks' golden conversations (`RUN/sft`).
//! 3. **RL** from the SFT checkpoint with the `toolcall` method (`RUN/rl`).
//! 4. **Evaluation**: exact-call accuracy by family of the base, SFT and RL policies on every
//!    held-out set, with and without schema-constrained decoding (`RUN/eval.json`; what each
//!    policy wrote in `RUN/eval/POLICY-SET-DECODING.jsonl`).
//!
//! Each stage that finished is kept: running the command again on the same directory skips it
//! (its final checkpoint is there) and resumes the stage that was interrupted.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use toolsmith_agent::tools::{Executor, LocalTools};
use toolsmith_policy::Policy;

use super::eval::{Decoding, Report, evaluate};
use super::synthetic::{self, Split};
use super::tasks::{Generated, Mix, Observer, SchemaObserver, Skipped, generate};
use super::{CallTask, Interface, write_lines, write_tasks};
use crate::config::{DataConfig, SftConfig};
use crate::rl::{Method, RlConfig, RlTrainer};
use crate::settings::{Init, RunSettings};
use crate::{Event, Resume, TrainError, sft};

/// The command's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ToolsConfig {
    /// Seed of the synthetic interfaces (both splits).
    pub interface_seed: u64,
    /// Synthetic interfaces of the training split.
    pub train_interfaces: usize,
    /// Synthetic interfaces of the held-out split.
    pub heldout_interfaces: usize,
    /// Training tasks per family over the synthetic interfaces.
    pub train_tasks: Mix,
    /// Training tasks per family over the user's tools (none without them).
    pub own_tasks: Mix,
    /// Held-out tasks per family of each held-out set.
    pub heldout_tasks: Mix,
    /// SFT optimiser steps.
    pub sft_steps: u64,
    /// SFT peak learning rate.
    pub sft_lr: f64,
    /// Tokens per SFT step.
    pub sft_batch_tokens: usize,
    /// RL iterations (0: no RL).
    pub rl_iterations: u64,
    /// Tasks per RL iteration.
    pub rl_tasks: usize,
    /// Episodes per task.
    pub rl_group: usize,
    /// RL learning rate.
    pub rl_lr: f64,
    /// Tokens per turn, in RL and in evaluation.
    pub max_tokens: usize,
    /// Prompts per evaluation batch.
    pub eval_batch: usize,
    /// Evaluate the starting policy too.
    pub eval_base: bool,
    /// What answers interfaces no real tool stands behind (synthetic ones, a file's): `schema`
    /// (a value of the output schema, seeded by the call) or `actor` (MTR's ToolActor: the
    /// starting policy decoding under the output schema; slower, a policy's idea of a result).
    pub observations: Observations,
    /// What every run sets: the starting model, seed, device, threads, LoRA.
    #[serde(flatten)]
    pub run: RunSettings,
}

impl Default for ToolsConfig {
    fn default() -> Self {
        ToolsConfig::preset("smol-tools").unwrap_or_else(|_| unreachable!("the default preset exists"))
    }
}

impl ToolsConfig {
    /// `tiny-tools` (the tiny policy, seconds: tests) or `smol-tools` (SmolLM2-135M-Instruct with
    /// rank-16 LoRA on every linear layer; see docs/guide/train-tools.md for its timing).
    pub fn preset(name: &str) -> Result<ToolsConfig, TrainError> {
        let mut run = RunSettings { threads: 2, ..RunSettings::default() };
        match name {
            "tiny-tools" => {
                run.init = Init::Tiny;
                run.set_lora_rank(4);
                Ok(ToolsConfig {
                    interface_seed: 1,
                    train_interfaces: 40,
                    heldout_interfaces: 12,
                    train_tasks: Mix::each(6),
                    own_tasks: Mix::each(4),
                    heldout_tasks: Mix::each(3),
                    sft_steps: 6,
                    sft_lr: 2e-3,
                    sft_batch_tokens: 4096,
                    rl_iterations: 2,
                    rl_tasks: 3,
                    rl_group: 2,
                    rl_lr: 1e-4,
                    max_tokens: 24,
                    eval_batch: 16,
                    eval_base: true,
                    observations: Observations::Schema,
                    run,
                })
            }
            "smol-tools" => {
                run.init = Init::Named("smollm2-135m".into());
                run.set_lora_rank(16);
                // Adapters on the top 10 of 30 layers: the backward pass stops there, about 2x
                // the step rate of adapters on every layer here (335 tokens/s with all 30).
                run.trainable_layers = Some(10);
                Ok(ToolsConfig {
                    interface_seed: 1,
                    train_interfaces: 120,
                    heldout_interfaces: 36,
                    // Irrelevance and choice are where small models fail (they call something);
                    // chained tasks are two turns each. About one pass over 1,120 tasks (the first
                    // version passed twice over 720; docs/experiments has both).
                    train_tasks: Mix { single: 260, choice: 300, parallel: 180, chained: 160, irrelevant: 220 },
                    own_tasks: Mix::each(40),
                    heldout_tasks: Mix::each(20),
                    sft_steps: 110,
                    sft_lr: 1e-3,
                    sft_batch_tokens: 4096,
                    // An iteration of 32 short episodes takes 10-15 s here; 8 left the policy
                    // where SFT had put it.
                    rl_iterations: 24,
                    rl_tasks: 8,
                    rl_group: 4,
                    rl_lr: 2e-4,
                    max_tokens: 96,
                    eval_batch: 16,
                    eval_base: true,
                    // The ToolActor decodes up to 96 tokens per result: about 900 results at
                    // SmolLM2's speed here would outlast the rest of the preset.
                    observations: Observations::Schema,
                    run,
                })
            }
            other => Err(TrainError::Config(format!("unknown preset {other:?} (tiny-tools, smol-tools)"))),
        }
    }
}

/// What answers calls of interfaces without a real tool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Observations {
    /// A value of the output schema, seeded by the call.
    #[default]
    Schema,
    /// The ToolActor: the starting policy under the output schema's grammar.
    Actor,
}

/// MTR's ToolActor as an observer: the frozen starting policy, decoding greedily under the
/// tool's output schema, so every observation validates.
struct ActorObserver {
    actor: toolsmith_agent::simulate::ToolActor,
}

impl Observer for ActorObserver {
    fn observe(
        &self,
        tool: &Interface,
        arguments: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<serde_json::Value, String> {
        let manifest = tool.manifest()?;
        self.actor.simulate_blocking(&manifest, &serde_json::Value::Object(arguments.clone())).map_err(|e| e.message)
    }
}

/// Real tools by their observer, the others by the simulated one.
struct ByKind<'a> {
    real: &'a dyn Observer,
    simulated: &'a dyn Observer,
}

impl Observer for ByKind<'_> {
    fn observe(
        &self,
        tool: &Interface,
        arguments: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<serde_json::Value, String> {
        if tool.real { self.real.observe(tool, arguments) } else { self.simulated.observe(tool, arguments) }
    }
}

/// The user's tools and the real tools evaluated but never trained on.
#[allow(missing_debug_implementations)] // observers: nothing to show
pub struct Inputs<'a> {
    /// Tools to teach (the registry's, or a file's); may be empty.
    pub own: Vec<Interface>,
    /// What the real ones among them return (those marked [`Interface::real`]; the others are
    /// answered as [`ToolsConfig::observations`] says).
    pub own_observer: &'a dyn Observer,
    /// Real tools held out of training (the bundled plugins in the benchmark).
    pub real: Vec<Interface>,
    /// What they return.
    pub real_observer: &'a dyn Observer,
}

/// What a stage reports.
#[derive(Debug)]
pub enum ToolsEvent<'a> {
    /// A stage starts.
    Stage(&'a str),
    /// A set of tasks was made.
    Tasks {
        /// Its name.
        set: &'a str,
        /// How many.
        count: usize,
        /// Tools skipped, with why.
        skipped: &'a [Skipped],
        /// Families that came out short.
        short: &'a [String],
    },
    /// An SFT or RL event.
    Train(Event<'a>),
    /// Evaluation progress: tasks done of all.
    Evaluated {
        /// Done.
        done: usize,
        /// In all.
        total: usize,
    },
    /// A finished evaluation row.
    Row(&'a Row),
}

/// One evaluation: a policy on a set under a decoding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// `base`, `sft` or `rl`.
    pub policy: String,
    /// The set: `synthetic` (held-out split), `real` (tools not trained on) or `yours`.
    pub set: String,
    /// Whether calls were decoded under the grammar.
    pub constrained: bool,
    /// Accuracy by family.
    pub report: Report,
}

/// What the command leaves.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Outcome {
    /// The adapter to serve (RL's, or SFT's without RL).
    pub adapter: PathBuf,
    /// Every evaluation.
    pub rows: Vec<Row>,
    /// Tools skipped because their schemas cannot be sampled.
    pub skipped: Vec<Skipped>,
}

/// The file the evaluations are written to.
pub const EVAL_FILE: &str = "eval.json";

fn tasks_or_refuse(set: &str, generated: Result<Generated, super::tasks::TaskError>) -> Result<Generated, TrainError> {
    generated.map_err(|e| TrainError::Config(format!("{set}: {e}")))
}

/// Runs the whole command in `out`.
pub fn run(
    config: &ToolsConfig,
    inputs: &Inputs<'_>,
    out: &Path,
    on_event: &mut dyn FnMut(ToolsEvent<'_>),
    cancel: Option<Arc<std::sync::atomic::AtomicBool>>,
) -> Result<Outcome, TrainError> {
    let data = out.join("data");
    std::fs::create_dir_all(&data).map_err(|e| TrainError::io(&data, e))?;
    on_event(ToolsEvent::Stage("tasks"));
    let s = config.interface_seed;
    let train_pool = synthetic::interfaces(Split::Train, config.train_interfaces, s);
    let heldout_pool = synthetic::interfaces(Split::HeldOut, config.heldout_interfaces, s.wrapping_add(1));
    synthetic::check_disjoint(&train_pool, &heldout_pool).map_err(TrainError::Config)?;
    // The user's and the real tools are held out of the synthetic sets' irrelevant requests'
    // listings; the synthetic training split asks for held-in tools only.
    let elsewhere = synthetic::interfaces(Split::Train, config.train_interfaces, s.wrapping_add(2));
    let actor;
    let simulated: &dyn Observer = match config.observations {
        Observations::Schema => &SchemaObserver,
        Observations::Actor => {
            let policy = load(config, &config.run.init)?;
            let params = toolsmith_policy::SamplingParams {
                max_new_tokens: 96,
                seed: config.run.seed,
                ..toolsmith_policy::SamplingParams::default()
            };
            let frozen = Arc::new(std::sync::Mutex::new(policy));
            actor = ActorObserver { actor: toolsmith_agent::simulate::ToolActor::new(frozen, params)? };
            &actor
        }
    };
    let own_observer = ByKind { real: inputs.own_observer, simulated };
    let real_observer = ByKind { real: inputs.real_observer, simulated };
    let mut skipped = Vec::new();
    let mut train: Vec<CallTask> = Vec::new();
    let mut sets: Vec<(&str, Vec<CallTask>)> = Vec::new();
    let report = |set: &'static str, g: &Generated, on_event: &mut dyn FnMut(ToolsEvent<'_>)| {
        on_event(ToolsEvent::Tasks { set, count: g.tasks.len(), skipped: &g.skipped, short: &g.short });
    };
    let g = tasks_or_refuse(
        "synthetic training tasks",
        generate(&train_pool, &elsewhere, config.train_tasks, s, simulated, "train"),
    )?;
    report("train", &g, on_event);
    train.extend(g.tasks);
    if !inputs.own.is_empty() {
        let g = tasks_or_refuse(
            "your tools",
            generate(&inputs.own, &train_pool, config.own_tasks, s ^ 0x0A, &own_observer, "own"),
        )?;
        report("own", &g, on_event);
        skipped.extend(g.skipped.clone());
        train.extend(g.tasks);
        let g = tasks_or_refuse(
            "your tools (held out)",
            generate(&inputs.own, &heldout_pool, config.heldout_tasks, s ^ 0x0B, &own_observer, "yours"),
        )?;
        report("yours", &g, on_event);
        sets.push(("yours", g.tasks));
    }
    let g = tasks_or_refuse(
        "synthetic held-out tasks",
        generate(&heldout_pool, &train_pool, config.heldout_tasks, s ^ 0x0C, simulated, "heldout"),
    )?;
    report("synthetic", &g, on_event);
    sets.push(("synthetic", g.tasks));
    if !inputs.real.is_empty() {
        let g = tasks_or_refuse(
            "real tools",
            generate(&inputs.real, &heldout_pool, config.heldout_tasks, s ^ 0x0D, &real_observer, "real"),
        )?;
        report("real", &g, on_event);
        skipped.extend(g.skipped.clone());
        sets.push(("real", g.tasks));
    }
    // Shuffled once, seeded: SFT reads the file in order within its own shuffling, RL draws.
    {
        use rand::SeedableRng;
        use rand::seq::SliceRandom;
        train.shuffle(&mut rand::rngs::StdRng::seed_from_u64(s ^ 0x5F));
    }
    let train_file = data.join("train.jsonl");
    write_tasks(&train_file, &train)?;
    let chats = data.join("sft.jsonl");
    let mut text = String::new();
    for t in &train {
        let messages: Vec<serde_json::Value> =
            t.chat().iter().map(|m| serde_json::json!({"role": m.role, "content": m.content})).collect();
        text.push_str(&serde_json::json!({"messages": messages}).to_string());
        text.push('\n');
    }
    std::fs::write(&chats, text).map_err(|e| TrainError::io(&chats, e))?;
    for (name, tasks) in &sets {
        write_tasks(&data.join(format!("heldout-{name}.jsonl")), tasks)?;
    }

    let no_tools = |_| -> Arc<dyn Executor> { Arc::new(LocalTools::new()) };
    let sft_dir = out.join("sft");
    let sft_final = sft_dir.join("final");
    if !sft_final.exists() {
        on_event(ToolsEvent::Stage("sft"));
        let sft_config = SftConfig {
            data: DataConfig { files: vec![chats.clone()], ..DataConfig::default() },
            steps: Some(config.sft_steps),
            lr: config.sft_lr,
            batch_tokens: config.sft_batch_tokens,
            micro_batch_tokens: config.sft_batch_tokens.min(4096),
            eval: None,
            checkpoint_every: config.sft_steps.div_ceil(4).max(1),
            run: config.run.clone(),
            ..SftConfig::default()
        };
        let mut trainer = sft::prepare(sft_config, &sft_dir, Resume::Yes, &no_tools)?;
        if let Some(c) = &cancel {
            watch(c.clone(), trainer.cancel_flag());
        }
        trainer.run(&mut |e| on_event(ToolsEvent::Train(e)))?;
    }
    let mut adapter = sft_final.clone();
    if config.rl_iterations > 0 {
        let rl_dir = out.join("rl");
        let rl_final = rl_dir.join("final");
        if !rl_final.exists() {
            on_event(ToolsEvent::Stage("rl"));
            let base = RlConfig::for_method(Method::TOOLCALL);
            let rl_config = RlConfig {
                call_tasks: Some(train_file.clone()),
                eval: None,
                iterations: config.rl_iterations,
                tasks_per_iteration: config.rl_tasks,
                group_size: config.rl_group,
                max_turns: 2,
                max_tokens: config.max_tokens,
                lr: config.rl_lr,
                checkpoint_every: config.rl_iterations.div_ceil(4).max(1),
                run: RunSettings { init: Init::Dir(sft_final.clone()), ..config.run.clone() },
                ..base
            };
            let mut trainer = RlTrainer::prepare(rl_config, &rl_dir, Resume::Yes, &no_tools)?;
            if let Some(c) = &cancel {
                watch(c.clone(), trainer.cancel_flag());
            }
            trainer.run(&mut |e| on_event(ToolsEvent::Train(e)))?;
        }
        adapter = rl_final;
    }

    on_event(ToolsEvent::Stage("eval"));
    let mut policies: Vec<(&str, Init)> = Vec::new();
    if config.eval_base {
        policies.push(("base", config.run.init.clone()));
    }
    policies.push(("sft", Init::Dir(sft_final)));
    if config.rl_iterations > 0 {
        policies.push(("rl", Init::Dir(adapter.clone())));
    }
    let eval_dir = out.join("eval");
    std::fs::create_dir_all(&eval_dir).map_err(|e| TrainError::io(&eval_dir, e))?;
    let total = 2 * policies.len() * sets.iter().map(|(_, t)| t.len()).sum::<usize>();
    let mut done = 0;
    let mut rows = Vec::new();
    for (name, init) in policies {
        let policy = load(config, &init)?;
        for (set, tasks) in &sets {
            for constrained in [false, true] {
                let decoding = Decoding { constrained, max_tokens: config.max_tokens, batch: config.eval_batch };
                let counted = std::cell::Cell::new(done);
                let (report, transcripts) = evaluate(&policy, tasks, decoding, &|n| {
                    counted.set(counted.get() + n);
                })?;
                let decoded = if constrained { "constrained" } else { "free" };
                let file = out.join("eval").join(format!("{name}-{set}-{decoded}.jsonl"));
                write_lines(&file, &transcripts)?;
                done = counted.get();
                on_event(ToolsEvent::Evaluated { done, total });
                let row = Row { policy: name.into(), set: (*set).into(), constrained, report };
                on_event(ToolsEvent::Row(&row));
                rows.push(row);
            }
        }
    }
    let outcome = Outcome { adapter, rows, skipped };
    let path = out.join(EVAL_FILE);
    let json = serde_json::to_string_pretty(&outcome).map_err(|e| TrainError::Config(e.to_string()))?;
    std::fs::write(&path, json).map_err(|e| TrainError::io(&path, e))?;
    Ok(outcome)
}

/// Forwards a cancel flag to a stage's trainer.
fn watch(from: Arc<std::sync::atomic::AtomicBool>, to: Arc<std::sync::atomic::AtomicBool>) {
    use std::sync::atomic::Ordering;
    std::thread::spawn(move || {
        while !to.load(Ordering::Relaxed) {
            if from.load(Ordering::Relaxed) {
                to.store(true, Ordering::Relaxed);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    });
}

fn load(config: &ToolsConfig, init: &Init) -> Result<Policy, TrainError> {
    let run = RunSettings { init: init.clone(), ..config.run.clone() };
    let options = run.load_options()?;
    init.load(config.run.seed, options, None)
}
