//! `toolsmith train sft`, `toolsmith train rl` and `toolsmith train report`: supervised
//! fine-tuning, group-relative RL, and a run's curves.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use toolsmith_agent::env::Corpus;
use toolsmith_agent::tools::{Executor, LocalTools};
use toolsmith_sandbox::{Limits, Toolbox};
use toolsmith_train::config::SftConfig;
use toolsmith_train::metrics::EvalMetrics;
use toolsmith_train::metrics::Record;
use toolsmith_train::rl::{Method, RlConfig, RlTrainer};
use toolsmith_train::{DeviceChoice, Event, Init, Resume, RunConfig, metrics, report, sft};

use super::Env;

#[derive(Debug, Subcommand)]
pub enum TrainCommand {
    /// Supervised fine-tuning on chat traces, with observation masking and held-out evaluation.
    Sft(Box<SftArgs>),
    /// Group-relative RL from a checkpoint: rollouts in groups, each method's rewards and
    /// advantages, clipped updates with KL to the starting policy, held-out evaluation.
    Rl(Box<RlArgs>),
    /// Teach the policy your tools from their interfaces (MTR): tasks generated from the
    /// registry's tools (`--from-registry`), a file's (`--tools`) and synthetic ones, SFT then RL
    /// with a fine-grained call reward, a LoRA adapter that `serve --policy` serves with
    /// `tool_calls`, and exact-call accuracy on tools it never saw.
    Tools(Box<super::train_tools::ToolsArgs>),
    /// Draw a run's loss and held-out curves (SVG) and print its summary.
    Report {
        /// The run directory (`--out` of `train sft`).
        run: PathBuf,
        /// Where to write the picture [default: RUN/report.svg].
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Print the JSON Schema of the `train sft` (or `train rl`) config file.
    Schema {
        /// `sft`, `rl` or `tools`.
        #[arg(default_value = "sft")]
        kind: String,
    },
}

/// The flags both trainers take (their configs' fields of the same names).
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The run directory: config, metrics, checkpoints, and the final policy in RUN/final.
    #[arg(long)]
    pub out: PathBuf,
    /// A config file (TOML or JSON; schema: `toolsmith train schema sft|rl`). Flags override it.
    #[arg(long, conflicts_with = "preset")]
    pub config: Option<PathBuf>,
    /// A preset: tiny-world (the tiny policy on 24 small training worlds, held-out world 1000);
    /// smol-world (SmolLM2-135M fine-tuned in bf16 on 16 training worlds, 10 held-out questions
    /// per family and mode); RL: smol-gap, smol-searl, smol-mem, smol-mtr (from a smol-world
    /// checkpoint given as --init).
    #[arg(long)]
    pub preset: Option<String>,
    /// The starting model: `tiny` (fresh), `smollm2-135m` (fetched by setup) or a checkpoint
    /// directory (e.g. an SFT run's RUN/final).
    #[arg(long, value_parser = parse_init)]
    pub init: Option<Init>,
    /// Seeds of the generated training worlds (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub train_worlds: Vec<u64>,
    /// Peak learning rate.
    #[arg(long)]
    pub lr: Option<f64>,
    /// Seed of the run: the tiny model's weights, the data order, task draws and sampling.
    #[arg(long)]
    pub seed: Option<u64>,
    /// auto, cpu, cuda or cuda:N.
    #[arg(long, value_parser = DeviceChoice::parse)]
    pub device: Option<DeviceChoice>,
    /// CPU threads for libtorch (0: its default).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Held-out evaluation every N steps (RL: iterations), besides before and after.
    #[arg(long)]
    pub eval_every: Option<u64>,
    /// Tasks per family of the held-out world.
    #[arg(long)]
    pub eval_tasks: Option<usize>,
    /// Seed of the held-out world (a world of another seed than the training ones: new names,
    /// new facts).
    #[arg(long)]
    pub eval_world: Option<u64>,
    /// No held-out evaluation.
    #[arg(long)]
    pub no_eval: bool,
    /// A checkpoint every N steps (RL: iterations).
    #[arg(long)]
    pub checkpoint_every: Option<u64>,
    /// Train only the top N decoder layers (embeddings, head and lower layers frozen).
    #[arg(long)]
    pub trainable_layers: Option<usize>,
    /// Train LoRA adapters of this rank instead of the weights (the config's `lora` table sets
    /// alpha, dropout and target modules; by default alpha 2 x rank on every linear layer).
    #[arg(long, conflicts_with = "trainable_layers")]
    pub lora_rank: Option<i64>,
    /// Gradient checkpointing: recompute each trained layer's activations in the backward pass
    /// instead of keeping them (less memory, one more forward pass of the trained layers).
    #[arg(long)]
    pub gradient_checkpointing: bool,
    /// Continue the run in --out from its last checkpoint.
    #[arg(long)]
    pub resume: bool,
    /// With --resume: accept settings that differ from the run's (recorded in its metrics);
    /// without it, a resume that changes a run-defining setting is refused.
    #[arg(long, requires = "resume")]
    pub allow_config_change: bool,
}

impl RunArgs {
    fn resume(&self) -> Resume {
        match (self.resume, self.allow_config_change) {
            (false, _) => Resume::No,
            (true, false) => Resume::Yes,
            (true, true) => Resume::AllowingChanges,
        }
    }
}

/// `--method`'s values, from the trainer's table of methods.
pub(super) fn methods() -> clap::builder::PossibleValuesParser {
    Method::all()
        .map(|m| clap::builder::PossibleValue::new(m.name()).aliases(m.spec().aliases).help(m.spec().summary))
        .collect::<Vec<_>>()
        .into()
}

/// `--init`'s values: every string is one (a name, `tiny`, or a directory).
fn parse_init(spec: &str) -> Result<Init, std::convert::Infallible> {
    Ok(Init::parse(spec))
}

/// Applies the [`RunArgs`] flags given to a config (SFT's or RL's).
fn apply_run_flags(config: &mut impl RunConfig, flags: &RunArgs) {
    if let Some(lr) = flags.lr {
        *config.lr_mut() = lr;
    }
    if let Some(every) = flags.checkpoint_every {
        *config.checkpoint_every_mut() = every;
    }
    held_out(config.eval_mut(), flags.no_eval, flags.eval_tasks, flags.eval_world);
    let run = config.run_mut();
    if let Some(init) = &flags.init {
        run.init = init.clone();
    }
    if let Some(seed) = flags.seed {
        run.seed = seed;
    }
    if let Some(device) = flags.device {
        run.device = device;
    }
    if let Some(threads) = flags.threads {
        run.threads = threads;
    }
    if let Some(every) = flags.eval_every {
        run.eval_every = every;
    }
    if flags.trainable_layers.is_some() {
        run.trainable_layers = flags.trainable_layers;
    }
    if flags.gradient_checkpointing {
        run.gradient_checkpointing = true;
    }
    if let Some(rank) = flags.lora_rank {
        run.set_lora_rank(rank);
    }
}

#[derive(Debug, Args)]
pub struct RlArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// The method (each starts from its paper's settings).
    #[arg(long, value_parser = methods())]
    pub method: Option<String>,
    /// Iterations.
    #[arg(long)]
    pub iterations: Option<u64>,
    /// Episodes per task.
    #[arg(long)]
    pub group_size: Option<usize>,
    /// Tasks per iteration.
    #[arg(long)]
    pub tasks_per_iteration: Option<usize>,
    /// Tasks drawn beyond --tasks-per-iteration in dynamic sampling's first round (their groups
    /// share its batches and often spare a refill; the surplus is dropped).
    #[arg(long)]
    pub oversample: Option<usize>,
    /// Turns per episode at most.
    #[arg(long)]
    pub max_turns: Option<usize>,
    /// Tokens per turn at most (DAPO's overlong window keeps its share of the budget).
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// List every tool of the world instead of retrieving from the run's growing tool graph
    /// (on by default for SEARL).
    #[arg(long)]
    pub no_graph: bool,
    /// Sample rollouts on an external engine's OpenAI-compatible completions endpoint (vLLM,
    /// SGLang, `toolsmith serve --policy`), e.g. http://127.0.0.1:8000/v1; the weights are pushed
    /// to it after every update.
    #[arg(long, value_name = "URL")]
    pub engine: Option<String>,
    /// The model name the engine serves [default: policy].
    #[arg(long, requires = "engine")]
    pub engine_model: Option<String>,
    /// Do not push the weights to the engine after each update (an engine without
    /// `/update_weights_from_disk`, such as vLLM, reloaded some other way).
    #[arg(long, requires = "engine")]
    pub no_push_weights: bool,
}

#[derive(Debug, Args)]
pub struct SftArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// JSON-lines chat files (repeatable) [default: oracle traces of generated worlds].
    #[arg(long = "data")]
    pub data: Vec<PathBuf>,
    /// Passes over the data.
    #[arg(long)]
    pub epochs: Option<f64>,
    /// Optimiser steps (overrides --epochs).
    #[arg(long)]
    pub steps: Option<u64>,
    /// Tokens per optimiser step.
    #[arg(long)]
    pub batch_tokens: Option<usize>,
    /// Padded tokens per forward/backward pass (bounds memory).
    #[arg(long)]
    pub micro_batch_tokens: Option<usize>,
    /// Loss weight of each conversation's first assistant turn (1: the plain token mean).
    #[arg(long)]
    pub first_turn_weight: Option<f64>,
}

pub fn run(env: &Env, cmd: TrainCommand) -> Result<ExitCode> {
    match cmd {
        TrainCommand::Sft(args) => sft_command(env, *args),
        TrainCommand::Report { run, out } => report_command(&run, out),
        TrainCommand::Rl(args) => rl_command(env, *args),
        TrainCommand::Tools(args) => super::train_tools::run(env, *args),
        TrainCommand::Schema { kind } => {
            match kind.as_str() {
                "sft" => super::print_json(&toolsmith_train::config::schema())?,
                "rl" => super::print_json(&toolsmith_train::rl::config::schema())?,
                "tools" => super::print_json(&toolsmith_train::config::schema_of::<
                    toolsmith_train::toolcall::pipeline::ToolsConfig,
                >())?,
                other => bail!("no config schema {other:?}: sft, rl or tools"),
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Settings: the saved run's (when resuming), a preset or a file, then the flags on top.
fn resolve(args: &SftArgs) -> Result<SftConfig> {
    let saved = args.run.out.join("config.json");
    let mut config = match (&args.run.preset, &args.run.config) {
        (Some(p), _) => SftConfig::preset(p)?,
        (None, Some(file)) => SftConfig::from_file(file)?,
        (None, None) if args.run.resume && saved.exists() => SftConfig::from_file(&saved)?,
        (None, None) => SftConfig::default(),
    };
    if !args.data.is_empty() {
        config.data.files = args.data.clone();
    }
    if !args.run.train_worlds.is_empty() {
        config.data.worlds.seeds = args.run.train_worlds.clone();
    }
    macro_rules! set {
        ($($flag:ident => $field:ident),*) => {$(if let Some(v) = args.$flag.clone() { config.$field = v; })*};
    }
    set!(epochs => epochs, batch_tokens => batch_tokens, micro_batch_tokens => micro_batch_tokens,
         first_turn_weight => first_turn_weight);
    apply_run_flags(&mut config, &args.run);
    if let Some(steps) = args.steps {
        config.steps = Some(steps);
    } else if args.epochs.is_some() {
        config.steps = None;
    }
    if let Some(preset) = &args.run.preset {
        config.check_preset(preset)?;
    }
    config.validate()?;
    Ok(config)
}

fn sft_command(env: &Env, args: SftArgs) -> Result<ExitCode> {
    let config = resolve(&args)?;
    let toolbox: OnceLock<Option<Toolbox>> = OnceLock::new();
    let tools_for = tools_for(env, &toolbox);
    let spinner = super::tools::spinner("preparing the policy and the data");
    let trainer = sft::prepare(config, &args.run.out, args.run.resume(), &tools_for);
    spinner.finish_and_clear();
    let mut trainer = trainer.with_context(|| format!("cannot start the run in {}", args.run.out.display()))?;
    let bar = progress_bar("step");
    // Lines above the bar, or plain lines when there is no terminal (the bar is hidden).
    let say = |line: String| if bar.is_hidden() { eprintln!("{line}") } else { bar.println(line) };
    let mut on_event = |event: Event<'_>| match event {
        Event::Data { sequences, tokens, trained_tokens, longest } => say(format!(
            "data: {sequences} sequences, {tokens} tokens (longest {longest}), {trained_tokens} trained ({:.1}% assistant tokens)",
            100.0 * trained_tokens as f64 / tokens.max(1) as f64
        )),
        Event::Started { step, total } => {
            bar.set_length(total);
            bar.set_position(step);
            bar.reset_eta();
            if step > 0 {
                say(format!("resumed at step {step} of {total}"));
            }
        }
        Event::Step(Record::Train(m)) => {
            bar.set_position(m.step);
            bar.set_message(format!(
                "loss {:.3} · lr {:.2e} · |g| {:.2} · {:.0} tok/s",
                m.loss, m.lr, m.grad_norm, m.tokens_per_sec
            ));
        }
        Event::EvalStarted { step } => bar.set_message(format!("held-out evaluation at step {step}…")),
        Event::Eval(e) => say(eval_line(e)),
        Event::Checkpoint { step, dir } => {
            tracing::info!(step, dir = %dir.display(), "checkpoint");
        }
        Event::Step(_) => {}
    };
    stop_on_ctrl_c(trainer.cancel_flag());
    let result = trainer.run(&mut on_event);
    bar.finish_and_clear();
    finish(result, || format!("step {}", trainer.state().step), &args.run.out)
}

/// The held-out flags over a config's evaluation settings.
pub(super) fn held_out(
    eval: &mut Option<toolsmith_train::config::EvalConfig>,
    off: bool,
    tasks_per_family: Option<usize>,
    world: Option<u64>,
) {
    if off {
        *eval = None;
    }
    if let (Some(n), Some(eval)) = (tasks_per_family, eval.as_mut()) {
        eval.tasks_per_family = n;
    }
    if let (Some(seed), Some(eval)) = (world, eval.as_mut()) {
        eval.world_seed = seed;
    }
}

/// A training progress bar counting `unit`s (hidden when stderr is not a terminal).
pub(crate) fn progress_bar(unit: &str) -> ProgressBar {
    let template = format!("{{bar:30}} {unit} {{pos}}/{{len}} · {{msg}} · {{elapsed}} (eta {{eta}})");
    ProgressBar::new(0)
        .with_style(ProgressStyle::with_template(&template).unwrap_or_else(|_| ProgressStyle::default_bar()))
}

/// How a run ended: a summary and the final policy, or where a cancelled run stopped.
fn finish(
    result: Result<PathBuf, toolsmith_train::TrainError>,
    stopped_at: impl FnOnce() -> String,
    out: &Path,
) -> Result<ExitCode> {
    if let Err(toolsmith_train::TrainError::Cancelled) = result {
        eprintln!("stopped at {} with a checkpoint; continue with --resume --out {}", stopped_at(), out.display());
        return Ok(ExitCode::from(130));
    }
    let final_dir = result.context("training failed")?;
    let records = metrics::read(&out.join(metrics::METRICS_FILE))?;
    print!("{}", report::summary(&records));
    // The policy was trained on prompts in the run's tool listing: evaluate it on the same.
    let format = std::fs::read_to_string(out.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|c| c.get("tool_format").and_then(|f| f.as_str()).map(str::to_owned))
        .filter(|f| f != "compact")
        .map(|f| format!(" --tool-format {f}"))
        .unwrap_or_default();
    println!("policy: {} (e.g. toolsmith eval --policy {}{format})", final_dir.display(), final_dir.display());
    println!("curves: toolsmith train report {}", out.display());
    Ok(ExitCode::SUCCESS)
}

/// The tools an agent gets over a corpus: search, the bundled plugins and the Python guest. The
/// sandbox and the guest load only when something first needs tools.
pub(crate) fn tools_for<'a>(
    env: &'a Env,
    toolbox: &'a OnceLock<Option<Toolbox>>,
) -> impl Fn(Arc<Corpus>) -> Arc<dyn Executor> + 'a {
    move |corpus: Arc<Corpus>| -> Arc<dyn Executor> {
        let toolbox = toolbox.get_or_init(|| {
            env.toolbox_maybe_python("create_and_execute_mcp (SEARL traces and evaluation) is")
                .map_err(|e| tracing::warn!("the bundled plugins are unavailable: {e:#}"))
                .ok()
        });
        let tools = LocalTools::new().with_corpus(corpus);
        Arc::new(match toolbox {
            Some(t) => tools.with_toolbox(t.clone(), Limits::default()),
            None => tools,
        })
    }
}

/// RL settings: the saved run's (when resuming), a preset or a file, then the flags on top.
pub(crate) fn resolve_rl(args: &RlArgs) -> Result<RlConfig> {
    let saved = args.run.out.join("config.json");
    let method = match &args.method {
        Some(m) => Some(Method::parse_or_explain(m)?),
        None => None,
    };
    let mut config = match (&args.run.preset, &args.run.config) {
        (Some(p), _) => RlConfig::preset(p, method)?,
        (None, Some(file)) => RlConfig::from_file(file)?,
        (None, None) if args.run.resume && saved.exists() => RlConfig::from_file(&saved)?,
        (None, None) => RlConfig::for_method(method.unwrap_or(Method::GAP)),
    };
    if let Some(m) = method
        && m != config.method
    {
        bail!(
            "--method {} disagrees with the config's method; the method picks the defaults, so set it in one place",
            args.method.as_deref().unwrap_or_default()
        );
    }
    if !args.run.train_worlds.is_empty() {
        config.worlds.seeds = args.run.train_worlds.clone();
    }
    macro_rules! set {
        ($($flag:ident => $field:ident),*) => {$(if let Some(v) = args.$flag.clone() { config.$field = v; })*};
    }
    set!(iterations => iterations, group_size => group_size, tasks_per_iteration => tasks_per_iteration,
         oversample => oversample, max_turns => max_turns);
    if let Some(max_tokens) = args.max_tokens {
        config = config.with_max_tokens(max_tokens);
    }
    apply_run_flags(&mut config, &args.run);
    if args.no_graph {
        config.graph = None;
    }
    if let Some(preset) = &args.run.preset {
        config.check_preset(preset)?;
    }
    if let Some(url) = &args.engine {
        let engine = config.engine.get_or_insert_with(Default::default);
        engine.url = url.clone();
        if let Some(model) = &args.engine_model {
            engine.model = model.clone();
        }
        if args.no_push_weights {
            engine.push_weights = false;
        }
    }
    config.validate()?;
    Ok(config)
}

fn rl_command(env: &Env, args: RlArgs) -> Result<ExitCode> {
    let config = resolve_rl(&args)?;
    let toolbox: OnceLock<Option<Toolbox>> = OnceLock::new();
    let tools_for = tools_for(env, &toolbox);
    let spinner = super::tools::spinner("preparing the policy and the training worlds");
    let trainer = RlTrainer::prepare(config, &args.run.out, args.run.resume(), &tools_for);
    spinner.finish_and_clear();
    let mut trainer = trainer.with_context(|| format!("cannot start the run in {}", args.run.out.display()))?;
    let bar = progress_bar("iteration");
    let say = |line: String| if bar.is_hidden() { eprintln!("{line}") } else { bar.println(line) };
    let mut on_event = |event: Event<'_>| match event {
        Event::Started { step: iteration, total } => {
            bar.set_length(total);
            bar.set_position(iteration);
            bar.reset_eta();
            if iteration > 0 {
                say(format!("resumed at iteration {iteration} of {total}"));
            }
        }
        Event::Step(Record::Iteration(m)) => {
            bar.set_position(m.iteration);
            let mut line = format!(
                "reward {:.3} · EM {:.2} · KL {:.4} (to the sampler {:.4}) · clip {:.3} · entropy {:.2} · {} groups ({} dropped) · {:.0} tok/s",
                m.reward,
                m.em,
                m.kl,
                m.sampler_kl,
                m.clip_fraction,
                m.entropy,
                m.groups,
                m.dropped,
                m.rollout_tokens_per_sec
            );
            if m.graph_tools > 0 {
                line.push_str(&format!(
                    " · graph {} tools (+{}) · calls created {} reused {}",
                    m.graph_tools, m.admitted, m.created_calls, m.reused_calls
                ));
            }
            if bar.is_hidden() {
                say(format!("iteration {}: {line}", m.iteration));
            }
            bar.set_message(line);
        }
        Event::EvalStarted { step } => bar.set_message(format!("held-out evaluation at iteration {step}…")),
        Event::Eval(e) => say(eval_line(e)),
        Event::Checkpoint { step, dir } => tracing::info!(iteration = step, dir = %dir.display(), "checkpoint"),
        Event::Step(_) | Event::Data { .. } => {}
    };
    stop_on_ctrl_c(trainer.cancel_flag());
    let result = trainer.run(&mut on_event);
    bar.finish_and_clear();
    finish(result, || format!("iteration {}", trainer.state().step), &args.run.out)
}

/// The first Ctrl-C stops training after the current step, with a checkpoint; a second one
/// ends the process at once.
pub(crate) fn stop_on_ctrl_c(cancel: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
        runtime.block_on(async {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("\nstopping after this step (Ctrl-C again to quit now)");
                cancel.store(true, Ordering::Relaxed);
            }
            if tokio::signal::ctrl_c().await.is_ok() {
                std::process::exit(130);
            }
        });
    });
}

fn eval_line(e: &EvalMetrics) -> String {
    let modes: Vec<String> = e
        .modes
        .iter()
        .map(|(m, f)| {
            let ceiling = match f.ceiling {
                Some(c) if c < 1.0 => format!(" (at most {c:.2} in budget)"),
                _ => String::new(),
            };
            format!("{m} EM {:.2}{ceiling} fmt-err {:.2} turns {:.1}", f.em, f.format_error_rate, f.turns)
        })
        .collect();
    format!("held-out @ step {}: {} ({:.0} s)", e.step, modes.join(" · "), e.seconds)
}

fn report_command(run: &Path, out: Option<PathBuf>) -> Result<ExitCode> {
    let path = run.join(metrics::METRICS_FILE);
    let records = metrics::read(&path).with_context(|| format!("cannot read the metrics of {}", run.display()))?;
    if records.is_empty() {
        bail!("{} has no metrics yet", path.display());
    }
    let out = out.unwrap_or_else(|| run.join("report.svg"));
    report::draw(&records, &out)?;
    print!("{}", report::summary(&records));
    println!("curves: {}", out.display());
    Ok(ExitCode::SUCCESS)
}
