//! `toolsmith train tools`: teach a small policy the user's tools from their interfaces (SFT on
//! generated tasks, then RL with the `toolcall` method), and measure it on tools it never saw.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::ProgressBar;
use serde_json::{Map, Value};
use toolsmith_agent::tools::{Executor, LocalTools};
use toolsmith_sandbox::Limits;
use toolsmith_train::metrics::Record;
use toolsmith_train::toolcall::Interface;
use toolsmith_train::toolcall::pipeline::{self, Inputs, Observations, Row, ToolsConfig, ToolsEvent};
use toolsmith_train::toolcall::tasks::{Observer, SchemaObserver};
use toolsmith_train::{DeviceChoice, Event, Init};

use super::Env;

#[derive(Debug, Args)]
pub struct ToolsArgs {
    /// The run directory: the tasks (data/), the SFT and RL runs (sft/, rl/), the evaluations
    /// (eval.json). Running again on it skips the stages that finished.
    #[arg(long)]
    pub out: PathBuf,
    /// tiny-tools (the tiny policy: seconds, for tests) or smol-tools (SmolLM2-135M-Instruct with
    /// rank-16 LoRA).
    #[arg(long, default_value = "smol-tools", conflicts_with = "config")]
    pub preset: String,
    /// A config file (JSON; schema: `toolsmith train schema tools`). Flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Teach the tools of these files (manifests, OpenAI function lists, MCP tools/list results;
    /// JSON or JSON lines) instead of the registry's.
    #[arg(long = "tools", value_name = "FILE")]
    pub tools: Vec<PathBuf>,
    /// Teach the registry's tools (the one `--registry` names, or the default): its plugins and
    /// Python tools answer the generated calls themselves.
    #[arg(long = "from-registry", conflicts_with = "tools")]
    pub from_registry: bool,
    /// Only these of the registry's tools (repeatable).
    #[arg(long = "tool", value_name = "NAME", requires = "from_registry")]
    pub only: Vec<String>,
    /// The starting model: `smollm2-135m`, `tiny` or a checkpoint directory.
    #[arg(long)]
    pub init: Option<String>,
    /// Seed of the run (tasks, weights of a tiny model, data order, sampling).
    #[arg(long)]
    pub seed: Option<u64>,
    /// auto, cpu, cuda or cuda:N.
    #[arg(long, value_parser = DeviceChoice::parse)]
    pub device: Option<DeviceChoice>,
    /// CPU threads for libtorch (0: its default).
    #[arg(long)]
    pub threads: Option<usize>,
    /// LoRA rank.
    #[arg(long)]
    pub lora_rank: Option<i64>,
    /// SFT optimiser steps.
    #[arg(long)]
    pub sft_steps: Option<u64>,
    /// RL iterations (0: SFT only).
    #[arg(long)]
    pub rl_iterations: Option<u64>,
    /// Do not evaluate the starting policy.
    #[arg(long)]
    pub no_base_eval: bool,
    /// What answers interfaces without a real tool: `schema` (a value of the output schema,
    /// seeded by the call) or `actor` (MTR's ToolActor: the starting policy decoding under the
    /// output schema).
    #[arg(long, value_parser = ["schema", "actor"])]
    pub observations: Option<String>,
}

fn resolve(args: &ToolsArgs) -> Result<ToolsConfig> {
    let saved = args.out.join("tools.json");
    let mut config = match &args.config {
        Some(file) => {
            let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
            serde_json::from_str(&text).with_context(|| format!("{} is not a train tools config", file.display()))?
        }
        None if saved.exists() => {
            let text = std::fs::read_to_string(&saved).with_context(|| format!("cannot read {}", saved.display()))?;
            serde_json::from_str(&text).with_context(|| format!("{} is not a train tools config", saved.display()))?
        }
        None => ToolsConfig::preset(&args.preset)?,
    };
    if let Some(init) = &args.init {
        config.run.init = Init::parse(init);
    }
    if let Some(seed) = args.seed {
        config.run.seed = seed;
        config.interface_seed = seed;
    }
    if let Some(d) = args.device {
        config.run.device = d;
    }
    if let Some(t) = args.threads {
        config.run.threads = t;
    }
    if let Some(r) = args.lora_rank {
        config.run.set_lora_rank(r);
    }
    if let Some(s) = args.sft_steps {
        config.sft_steps = s;
    }
    if let Some(i) = args.rl_iterations {
        config.rl_iterations = i;
    }
    if args.no_base_eval {
        config.eval_base = false;
    }
    match args.observations.as_deref() {
        Some("actor") => config.observations = Observations::Actor,
        Some(_) => config.observations = Observations::Schema,
        None => {}
    }
    Ok(config)
}

/// Answers calls with the real tools (the pipeline asks it only about tools marked real).
struct ExecutorObserver {
    tools: Arc<dyn Executor>,
    runtime: tokio::runtime::Runtime,
}

impl Observer for ExecutorObserver {
    fn observe(&self, tool: &Interface, arguments: &Map<String, Value>) -> std::result::Result<Value, String> {
        let args = Value::Object(arguments.clone());
        let result = self.runtime.block_on(self.tools.call(&tool.name, &args));
        result.value.map_err(|e| format!("{}: {}", e.kind, e.message))
    }
}

fn observer(tools: Arc<dyn Executor>) -> Result<ExecutorObserver> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    Ok(ExecutorObserver { tools, runtime })
}

/// The user's interfaces and what answers them.
fn own_tools(env: &Env, args: &ToolsArgs) -> Result<(Vec<Interface>, Option<ExecutorObserver>)> {
    if !args.tools.is_empty() {
        let mut out = Vec::new();
        for file in &args.tools {
            let label = file.display().to_string();
            let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {label}"))?;
            let definitions = toolsmith_registry::read_definitions(&label, &text)
                .map_err(toolsmith_registry::RegistryError::Definitions)?;
            out.extend(definitions.iter().map(|d| Interface::from_manifest(&d.tool.manifest, false)));
        }
        if out.is_empty() {
            bail!("no tool definitions in the --tools files");
        }
        return Ok((out, None));
    }
    if !args.from_registry {
        return Ok((Vec::new(), None));
    }
    let registry = env.registry()?;
    let records = registry.list(toolsmith_registry::SortBy::Name)?;
    let records: Vec<_> = records.into_iter().filter(|r| args.only.is_empty() || args.only.contains(&r.name)).collect();
    if let Some(missing) = args.only.iter().find(|n| !records.iter().any(|r| &r.name == *n)) {
        bail!("--tool {missing}: the registry has no such tool");
    }
    if records.is_empty() {
        bail!("the registry has no tools to teach: add some with `toolsmith tools add`");
    }
    let toolbox = env.toolbox_maybe_python("Python tools of the registry are")?;
    let tools = LocalTools::new().with_toolbox(toolbox, Limits::default());
    let mut interfaces = Vec::new();
    for r in &records {
        let blob = match &r.blob_hash {
            Some(h) => registry.blob(h)?,
            None => None,
        };
        let real = blob.is_some() && tools.install(&r.manifest, blob.as_deref()).is_ok();
        interfaces.push(Interface::from_manifest(&r.manifest, real));
    }
    Ok((interfaces, Some(observer(Arc::new(tools))?)))
}

/// The bundled plugins of the default toolbox (pure ones: `http_get` needs grants and is not
/// among them), held out of training as real tools.
fn real_tools(env: &Env) -> Result<(Vec<Interface>, ExecutorObserver)> {
    let toolbox = env.toolbox()?;
    let tools = LocalTools::new().with_toolbox(toolbox, Limits::default());
    let interfaces = tools.manifests().iter().map(|m| Interface::from_manifest(m, true)).collect();
    Ok((interfaces, observer(Arc::new(tools))?))
}

pub fn run(env: &Env, args: ToolsArgs) -> Result<ExitCode> {
    let config = resolve(&args)?;
    std::fs::create_dir_all(&args.out).with_context(|| format!("cannot create {}", args.out.display()))?;
    std::fs::write(args.out.join("tools.json"), serde_json::to_string_pretty(&config)?)?;
    let (own, own_observer) = own_tools(env, &args)?;
    // With the user's tools, the bundled plugins are theirs to teach or not; without, they are
    // the real tools the run is measured on and never trained on.
    let (real, real_observer) =
        if own.is_empty() { real_tools(env).map(|(r, o)| (r, Some(o)))? } else { (Vec::new(), None) };
    let inputs = Inputs {
        own,
        own_observer: own_observer.as_ref().map_or(&SchemaObserver as &dyn Observer, |o| o as &dyn Observer),
        real,
        real_observer: real_observer.as_ref().map_or(&SchemaObserver as &dyn Observer, |o| o as &dyn Observer),
    };
    let bar = super::train::progress_bar("step");
    let say = |line: String| if bar.is_hidden() { eprintln!("{line}") } else { bar.println(line) };
    let cancel = Arc::new(AtomicBool::new(false));
    super::train::stop_on_ctrl_c(cancel.clone());
    let mut on_event = |e: ToolsEvent<'_>| on_event(&bar, &say, e);
    let outcome = pipeline::run(&config, &inputs, &args.out, &mut on_event, Some(cancel));
    bar.finish_and_clear();
    let outcome = match outcome {
        Err(toolsmith_train::TrainError::Cancelled) => {
            eprintln!("stopped with a checkpoint; run the same command again to continue");
            return Ok(ExitCode::from(130));
        }
        other => other?,
    };
    println!("{}", table(&outcome.rows));
    println!("adapter: {}", outcome.adapter.display());
    println!("serve it: toolsmith serve --http 127.0.0.1:8000 --policy {}", outcome.adapter.display());
    println!("evaluations: {}", args.out.join(pipeline::EVAL_FILE).display());
    Ok(ExitCode::SUCCESS)
}

fn on_event(bar: &ProgressBar, say: &dyn Fn(String), e: ToolsEvent<'_>) {
    match e {
        ToolsEvent::Stage(s) => {
            bar.set_position(0);
            bar.set_message(format!("{s}…"));
            say(format!("== {s}"));
        }
        ToolsEvent::Tasks { set, count, skipped, short } => {
            say(format!("tasks: {set}: {count}"));
            for s in skipped {
                say(format!("  skipped {}: {}", s.tool, s.why));
            }
            for s in short {
                say(format!("  short: {s}"));
            }
        }
        ToolsEvent::Train(Event::Started { step, total }) => {
            bar.set_length(total);
            bar.set_position(step);
            bar.reset_eta();
        }
        ToolsEvent::Train(Event::Step(Record::Train(m))) => {
            bar.set_position(m.step);
            bar.set_message(format!("sft loss {:.3} · {:.0} tok/s", m.loss, m.tokens_per_sec));
        }
        ToolsEvent::Train(Event::Step(Record::Iteration(m))) => {
            bar.set_position(m.iteration);
            bar.set_message(format!("rl reward {:.3} · exact {:.2}", m.reward, m.em));
        }
        ToolsEvent::Train(_) => {}
        ToolsEvent::Evaluated { done, total } => {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        }
        ToolsEvent::Row(row) => say(format!(
            "{} on {}{}: {}",
            row.policy,
            row.set,
            if row.constrained { " (constrained)" } else { "" },
            toolsmith_train::toolcall::eval::summary(&row.report)
        )),
    }
}

/// The evaluations as a Markdown table: a row per policy, set and decoding; a column per family.
pub fn table(rows: &[Row]) -> String {
    let families = toolsmith_train::toolcall::CallFamily::ALL;
    let mut s = String::from("| policy | set | decoding |");
    for f in families {
        s.push_str(&format!(" {} |", f.name()));
    }
    s.push_str(" all |\n|---|---|---|");
    s.push_str(&"---:|".repeat(families.len() + 1));
    s.push('\n');
    for r in rows {
        s.push_str(&format!("| {} | {} | {} |", r.policy, r.set, if r.constrained { "constrained" } else { "free" }));
        for f in families {
            match r.report.families.get(f.name()) {
                Some(a) => s.push_str(&format!(" {:.2} |", a.rate())),
                None => s.push_str(" – |"),
            }
        }
        s.push_str(&format!(" {:.2} |\n", r.report.overall.rate()));
    }
    s
}
