//! `toolsmith world`, `toolsmith eval` and `toolsmith run`: the bundled offline world, evaluation
//! of a policy on a task set, and one readable trace.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use toolsmith_agent::backend::{Backend, BatchConfig, BatchedBackend, GenerateOptions, OpenAiBackend, ToolCallStyle};
use toolsmith_agent::env::corpus::search_manifest;
use toolsmith_agent::env::metrics::{exact_match, f1};
use toolsmith_agent::env::{self, Corpus, Task, World, WorldConfig};
use toolsmith_agent::eval::{Report, evaluate_all, peak_by_objectives};
use toolsmith_agent::graph::{
    RegistryRetriever, call_usage, install_tools, python_tools, record_candidates, record_plan,
};
use toolsmith_agent::mcp::McpTools;
use toolsmith_agent::tools::{Executor, LocalTools};
use toolsmith_agent::{Agent, AgentConfig, Mode, Oracle, Scheduler, ToolFormat, Trajectory};
use toolsmith_policy::{LoadOptions, Policy, Tokenizer};
use toolsmith_sandbox::Limits;

use super::Env;

#[derive(Debug, Subcommand)]
pub enum WorldCommand {
    /// Write the world's corpus and tasks as JSON lines (corpus.jsonl, tasks.jsonl, the same tasks
    /// reworded in tasks-reworded.jsonl, world.json).
    Generate {
        #[command(flatten)]
        world: WorldArgs,
        #[arg(long)]
        out: PathBuf,
    },
    /// Write the oracle's traces for every task in each style as JSON lines of chat messages
    /// (supervised data: system, question, assistant turns and observations).
    Traces {
        #[command(flatten)]
        world: WorldArgs,
        /// Styles to write (repeatable): react, gap, mem, searl [default: all].
        #[arg(long = "style")]
        styles: Vec<String>,
        #[arg(long)]
        out: PathBuf,
        /// Also write the assistant turns as plain-text paragraphs (for tokenizer training),
        /// the first N tasks of each family per style.
        #[arg(long, value_name = "FILE")]
        text: Option<PathBuf>,
        #[arg(long, default_value_t = 2)]
        text_per_family: usize,
        /// How system prompts list tools: compact, json or brief (what the policy will see).
        #[arg(long, default_value = "compact")]
        tool_format: String,
    },
}

/// The bundled world's size (used when no --tasks file is given).
#[derive(Debug, Clone, Args)]
pub struct WorldArgs {
    /// Seed of the generator.
    #[arg(long, default_value_t = WorldConfig::default().seed)]
    pub seed: u64,
    /// Countries, 2 to 400 (cities, people and companies scale with it).
    #[arg(long, default_value_t = WorldConfig::default().countries)]
    pub countries: usize,
    /// Tasks per family.
    #[arg(long, default_value_t = WorldConfig::default().tasks_per_family)]
    pub tasks_per_family: usize,
    /// Ask the world's questions in other words than the generator's templates (which training
    /// uses): the same tasks and answers, sentence frames no trace has seen.
    #[arg(long)]
    pub reworded: bool,
}

impl WorldArgs {
    fn config(&self) -> WorldConfig {
        WorldConfig { seed: self.seed, countries: self.countries, tasks_per_family: self.tasks_per_family }
    }
}

/// Which policy acts, and how.
#[derive(Debug, Clone, Args)]
pub struct PolicyArgs {
    /// `oracle` (correct traces for the bundled world), `tiny` (an untrained tiny model), a
    /// checkpoint directory, or an OpenAI-compatible base URL such as http://127.0.0.1:8000/v1.
    #[arg(long, default_value = "oracle")]
    pub policy: String,
    /// The model name sent to an OpenAI-compatible endpoint.
    #[arg(long, default_value = "default")]
    pub model: String,
    /// Environment variable holding the endpoint's API key.
    #[arg(long, default_value = "OPENAI_API_KEY")]
    pub api_key_env: String,
    /// How an OpenAI-compatible endpoint's model calls tools: native (the request's `tools`,
    /// the response's `tool_calls`, converted to and from the agent's trace grammar in every
    /// mode), text (the grammar's `<tool_call>` blocks in the content only, as models trained on
    /// the agent's traces write them) or auto (native, falling back to text for the rest of the
    /// run when the endpoint refuses `tools`). Other policies ignore it.
    #[arg(long, value_name = "STYLE", default_value = "auto")]
    pub tool_calls: String,
    /// react, gap, mem or searl. `eval` takes it more than once and runs the modes side by side
    /// (a local policy's turns of every mode decode in the same batches).
    #[arg(long = "mode", value_name = "MODE", default_value = "gap")]
    pub modes: Vec<String>,
    /// Turn budget per task.
    #[arg(long, default_value_t = 12)]
    pub max_turns: usize,
    /// Tokens per turn at most.
    #[arg(long, default_value_t = 512)]
    pub max_tokens: usize,
    /// Sampling temperature (0 is greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Tool calls running at once.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Deadline of one tool call, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,
    /// List only tools retrieved from the tool graph for the question and the plan's tasks (the
    /// graph's agent-written tools, e.g. those an RL run admitted, are installed to run here).
    #[arg(long)]
    pub retrieve: bool,
    /// How the system prompt lists tools: compact (one line each), json (OpenAI functions) or
    /// brief (compact with descriptions cut to their first clause, for small models).
    #[arg(long, default_value = "compact")]
    pub tool_format: String,
    /// A JSON-lines task set ({question, golden_answers}) [default: the bundled world].
    #[arg(long)]
    pub tasks: Option<PathBuf>,
    /// A JSON-lines corpus ({title, text}) for the search tool [default: the bundled world's].
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// Take every tool over MCP from this server instead of running them here, e.g.
    /// http://127.0.0.1:8750/mcp (`toolsmith serve --http`, whose `--corpus` is then the search
    /// tool's). Its `search_tools` is not listed to the policy; `--retrieve` retrieves here.
    #[arg(long, value_name = "URL", conflicts_with = "corpus")]
    pub tools: Option<String>,
    /// A file holding the MCP server's bearer token [default: $TOOLSMITH_TOKEN, if set].
    #[arg(long, value_name = "FILE", requires = "tools")]
    pub tools_token_file: Option<PathBuf>,
    #[command(flatten)]
    pub world: WorldArgs,
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Only these families (repeatable): single_hop, multi_hop_sequential, multi_hop_parallel,
    /// multi_objective, numeric, custom.
    #[arg(long = "family")]
    pub families: Vec<String>,
    /// Evaluate the first N tasks only.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Episodes running at once, over every mode; with a local policy their turns are decoded
    /// as one batch.
    #[arg(long, default_value_t = 16)]
    pub parallel: usize,
    /// Print the figures as one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Write the figures and every trajectory as JSON here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Record plans as tool-graph edges and created tools as candidates of this run.
    #[arg(long, value_name = "RUN")]
    pub record: Option<String>,
    /// With --record: admit the best candidate of each created tool (the registration step)
    /// before recording plans, so edges reach the new tools.
    #[arg(long, requires = "record")]
    pub admit: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The question.
    pub question: String,
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Print the trajectory as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn world(env: &Env, cmd: WorldCommand) -> Result<ExitCode> {
    match cmd {
        WorldCommand::Traces { world, styles, out, text, text_per_family, tool_format } => {
            let Some(format) = ToolFormat::parse(&tool_format) else {
                bail!("unknown tool format `{tool_format}`: use compact, json or brief");
            };
            traces(env, &world, &styles, format, &out, text.as_deref(), text_per_family)
        }
        WorldCommand::Generate { world, out } => {
            let w = World::generate(world.config());
            env::write_world(&w, &out).with_context(|| format!("cannot write the world to {}", out.display()))?;
            println!("wrote {} documents and {} tasks to {}", w.documents().len(), w.tasks().len(), out.display());
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn traces(
    env: &Env,
    world: &WorldArgs,
    styles: &[String],
    tool_format: ToolFormat,
    out: &Path,
    text: Option<&Path>,
    per_family: usize,
) -> Result<ExitCode> {
    let styles: Vec<Mode> = if styles.is_empty() {
        Mode::ALL.to_vec()
    } else {
        styles.iter().map(|s| Mode::parse(s).with_context(|| format!("unknown style `{s}`"))).collect::<Result<_>>()?
    };
    if world.reworded {
        bail!("reworded questions are kept out of training: traces use the generator's templates");
    }
    let w = World::generate(world.config());
    let tasks = w.tasks();
    let corpus = Arc::new(Corpus::new(&w.documents())?);
    let toolbox = env.toolbox_maybe_python("tool creation in SEARL traces is")?;
    let tools = Arc::new(LocalTools::new().with_corpus(corpus).with_toolbox(toolbox, Limits::default()));
    let oracle = Oracle::new(&tasks, Mode::Gap, tiny_tokenizer()?);
    let bar = ProgressBar::new((tasks.len() * styles.len()) as u64).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} traces").unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start tokio")?;
    let examples =
        runtime
            .block_on(toolsmith_agent::oracle::synthesize(&oracle, tools, &tasks, &styles, tool_format, || bar.inc(1)));
    bar.finish_and_clear();
    let wrong = examples.iter().filter(|e| !e.correct).count();
    if wrong > 0 {
        bail!("{wrong} oracle traces are wrong: the world and its solutions disagree");
    }
    env::write_jsonl(out, &examples)?;
    println!("wrote {} traces ({} styles) to {}", examples.len(), styles.len(), out.display());
    if let Some(path) = text {
        let mut paragraphs = Vec::new();
        let mut taken: std::collections::HashMap<(Mode, toolsmith_agent::env::Family), usize> = Default::default();
        // A MemPO episode's later parts repeat its first one's question: take the first only.
        for e in examples.iter().filter(|e| e.part == 0 || e.style != Mode::Mem) {
            let n = taken.entry((e.style, e.family)).or_default();
            if *n >= per_family {
                continue;
            }
            *n += 1;
            paragraphs.extend(e.messages.iter().skip(1).map(|m| m.content.trim().to_string()));
        }
        std::fs::write(path, paragraphs.join("\n\n") + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
        println!("wrote {} paragraphs to {}", paragraphs.len(), path.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn tiny_tokenizer() -> Result<Arc<Tokenizer>> {
    Ok(Arc::new(Tokenizer::tiny()?))
}

/// Tasks and corpus: the user's files or the bundled world.
fn load_env(args: &PolicyArgs) -> Result<(Vec<Task>, Arc<Corpus>)> {
    let world = World::generate(args.world.config());
    let tasks = match &args.tasks {
        Some(_) if args.world.reworded => {
            bail!("--reworded rewords the generated world's questions, not a --tasks file")
        }
        Some(p) => env::load_tasks(p).with_context(|| format!("cannot read tasks from {}", p.display()))?,
        None if args.world.reworded => world.reworded_tasks(),
        None => world.tasks(),
    };
    let corpus = match &args.corpus {
        Some(p) => Corpus::load_jsonl(p).with_context(|| format!("cannot read the corpus {}", p.display()))?,
        None => Corpus::new(&world.documents())?,
    };
    Ok((tasks, Arc::new(corpus)))
}

/// `tiny` (an untrained tiny model), a named policy (`smollm2-135m`) or a checkpoint directory,
/// on the default device.
pub fn load_policy(spec: &str) -> Result<Policy> {
    if spec == "tiny" {
        return Ok(Policy::tiny(0, LoadOptions::default())?);
    }
    let dir = toolsmith_policy::locate(spec)?;
    let bar = super::tools::spinner(&format!("loading {spec}"));
    let policy = Policy::load(&dir, LoadOptions::default());
    bar.finish_and_clear();
    policy.with_context(|| format!("cannot load the policy in {spec}"))
}

/// The policy's backend for `episodes` agent loops running at once; the oracle answers `mode`'s
/// traces.
fn backend(
    args: &PolicyArgs,
    mode: Mode,
    tasks: &[Task],
    episodes: usize,
) -> Result<(Arc<dyn Backend>, Option<Tokenizer>)> {
    let p = args.policy.as_str();
    // Checked for every policy: a misspelt style must not pass unnoticed until a URL is given.
    let Some(style) = ToolCallStyle::parse(&args.tool_calls) else {
        bail!("unknown --tool-calls `{}`: use native, text or auto", args.tool_calls);
    };
    if p == "oracle" {
        return Ok((Arc::new(Oracle::new(tasks, mode, tiny_tokenizer()?)), None));
    }
    if p.starts_with("http://") || p.starts_with("https://") {
        let key = std::env::var(&args.api_key_env).ok().filter(|k| !k.is_empty());
        return Ok((Arc::new(OpenAiBackend::new(p, &args.model, key).with_tool_calls(style)), None));
    }
    let policy = load_policy(p).context("expected oracle, tiny, a checkpoint directory or a URL")?;
    // Episodes running at once (`eval --parallel`) have their turns decoded as one batch, each
    // with its own seed and its keys and values kept between turns.
    let batching = BatchConfig::for_episodes(episodes, args.max_turns, args.max_tokens, &policy);
    let tokenizer = policy.tokenizer().clone();
    Ok((Arc::new(BatchedBackend::new(Arc::new(Mutex::new(policy)), p, batching)), Some(tokenizer)))
}

/// The agents of `toolsmith eval` or `run`, one per mode; the local policy's tokenizer; the
/// registry when retrieval is on.
struct Agents {
    agents: Vec<Agent>,
    tokenizer: Option<Tokenizer>,
    registry: Option<SharedRegistry>,
}

type SharedRegistry = Arc<Mutex<toolsmith_registry::Registry>>;

/// One agent per `--mode`, over the same tools and (but for the oracle, whose answers are a
/// mode's) the same backend, so that a local policy is loaded once and batches every mode's turns.
fn agents(
    env: &Env,
    runtime: &tokio::runtime::Runtime,
    args: &PolicyArgs,
    tasks: &[Task],
    corpus: Arc<Corpus>,
    episodes: usize,
) -> Result<Agents> {
    let mut modes: Vec<Mode> = Vec::with_capacity(args.modes.len());
    for name in &args.modes {
        let Some(mode) = Mode::parse(name) else {
            bail!("unknown mode `{name}`: use react, gap, mem or searl");
        };
        if modes.contains(&mode) {
            bail!("mode `{name}` is given twice");
        }
        modes.push(mode);
    }
    let Some(&first) = modes.first() else { bail!("no mode given") };
    let Some(tool_format) = ToolFormat::parse(&args.tool_format) else {
        bail!("unknown tool format `{}`: use compact, json or brief", args.tool_format);
    };
    let tools: Arc<dyn Executor> = match &args.tools {
        Some(url) => {
            let token = super::serve::read_token(args.tools_token_file.as_deref())?;
            let hide = vec![toolsmith_daemon::SEARCH_TOOL.to_string()];
            Arc::new(runtime.block_on(McpTools::connect(url, token, hide))?)
        }
        None => {
            let toolbox = env.toolbox_maybe_python("create_and_execute_mcp is")?;
            let limits = Limits { timeout: Duration::from_millis(args.timeout_ms), ..Limits::default() };
            Arc::new(LocalTools::new().with_corpus(corpus).with_toolbox(toolbox, limits))
        }
    };
    let registry = if args.retrieve { Some(open_registry(env)?) } else { None };
    // The graph's agent-written tools run here when retrieved (a server's tools are its own).
    if let (Some(registry), None) = (&registry, &args.tools) {
        let names = python_tools(&toolsmith_contract::sync::lock(registry))?;
        install_tools(registry, &names, &[tools.as_ref()])?;
        if !names.is_empty() {
            tracing::info!("{} agent-written tools of the graph installed: {}", names.len(), names.join(", "));
        }
    }
    let (shared, tokenizer) = match args.policy.as_str() {
        "oracle" => (None, None),
        _ => {
            let (b, t) = backend(args, first, tasks, episodes)?;
            (Some(b), t)
        }
    };
    let mut agents = Vec::with_capacity(modes.len());
    for mode in modes {
        let config = AgentConfig {
            mode,
            max_turns: args.max_turns,
            generate: GenerateOptions {
                max_tokens: args.max_tokens,
                temperature: args.temperature,
                // A greedy turn that repeats itself exactly is lost: end it there.
                stop_loops: true,
                ..GenerateOptions::default()
            },
            scheduler: Scheduler {
                concurrency: args.concurrency.clamp(1, 1024),
                timeout: Duration::from_millis(args.timeout_ms.saturating_add(1000)),
            },
            tool_format,
            ..AgentConfig::default()
        };
        let backend = match &shared {
            Some(b) => b.clone(),
            None => backend(args, mode, tasks, episodes)?.0,
        };
        let mut agent = Agent::new(backend, tools.clone(), config);
        if let Some(r) = &registry {
            agent = agent.with_retriever(Arc::new(RegistryRetriever::new(r.clone())));
        }
        agents.push(agent);
    }
    Ok(Agents { agents, tokenizer, registry })
}

/// The registry, with the host's search tool as a node of the graph: retrievable, and an end of
/// plan edges.
fn open_registry(env: &Env) -> Result<Arc<Mutex<toolsmith_registry::Registry>>> {
    let mut r = env.registry()?;
    if r.resolve("search")?.is_none() {
        r.register(toolsmith_registry::NewTool::new(search_manifest()), false)?;
    }
    Ok(Arc::new(Mutex::new(r)))
}

/// Counts finished episodes' calls in the registry's usage statistics (one transaction): the
/// registry this command opened, else the configured one if it exists (an evaluation does not
/// create a registry just to count in it). `reward` is the episode's, when it was scored.
fn record_usage<'a>(
    env: &Env,
    registry: Option<&Arc<Mutex<toolsmith_registry::Registry>>>,
    episodes: impl Iterator<Item = (&'a Trajectory, Option<f64>)>,
) -> Result<()> {
    let usage: Vec<_> = episodes.flat_map(|(t, reward)| call_usage(t, reward)).collect();
    if usage.is_empty() {
        return Ok(());
    }
    let registry = match registry {
        Some(r) => r.clone(),
        None if env.registry.clone().unwrap_or_else(toolsmith_registry::Registry::default_path).is_file() => {
            open_registry(env)?
        }
        None => return Ok(()),
    };
    let recorded = toolsmith_contract::sync::lock(&registry).record_calls(&usage).context("cannot record the calls")?;
    tracing::debug!(recorded = recorded.recorded, unknown = recorded.unknown, "calls recorded in the tool graph");
    Ok(())
}

pub fn eval(env: &Env, args: EvalArgs) -> Result<ExitCode> {
    let (mut tasks, corpus) = load_env(&args.policy)?;
    if !args.families.is_empty() {
        tasks.retain(|t| args.families.iter().any(|f| f == t.family.name()));
    }
    if let Some(n) = args.limit {
        tasks.truncate(n);
    }
    if tasks.is_empty() {
        bail!("no tasks to evaluate");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start tokio")?;
    let Agents { agents, tokenizer, mut registry } =
        agents(env, &runtime, &args.policy, &tasks, corpus, args.parallel)?;
    if args.record.is_some() && registry.is_none() {
        registry = Some(open_registry(env)?);
    }
    let bar = ProgressBar::new((tasks.len() * agents.len()) as u64).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} episodes · {msg} · {elapsed} (eta {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut solved = 0usize;
    let mut done = 0usize;
    let agent_refs: Vec<&Agent> = agents.iter().collect();
    let reports = runtime.block_on(evaluate_all(&agent_refs, &tasks, args.parallel, |r| {
        done += 1;
        solved += (r.em > 0.0) as usize;
        bar.set_message(format!("EM {:.3}", solved as f64 / done as f64));
        bar.inc(1);
    }));
    bar.finish_and_clear();
    let results = || reports.iter().flat_map(|r| &r.results);
    // The evaluation stands even when its calls cannot be counted (a registry locked or too new).
    if let Err(e) = record_usage(env, registry.as_ref(), results().map(|r| (&r.trajectory, Some(r.em)))) {
        tracing::warn!("the calls were not counted in the tool graph: {e:#}");
    }
    if let (Some(run), Some(registry)) = (&args.record, &registry) {
        let mut r = toolsmith_contract::sync::lock(registry);
        let mut candidates = 0;
        for result in results() {
            candidates += record_candidates(&mut r, run, 0, &result.id, &result.trajectory, result.em)?;
        }
        let admitted = if args.admit { r.register_best(run, 0)?.len() } else { 0 };
        let mut edges = std::collections::BTreeSet::new();
        for result in results() {
            edges.extend(record_plan(&mut r, &result.trajectory, result.em)?.edges);
        }
        let shown: Vec<String> = edges.iter().take(6).map(|(a, b)| format!("{a} -> {b}")).collect();
        eprintln!(
            "run {run}: {candidates} candidate tools, {admitted} admitted; plan edges: {}",
            if shown.is_empty() { "none".to_string() } else { shown.join(", ") }
        );
    }
    // One mode: its report as it is; several: an object keyed by mode.
    if let Some(out) = &args.out {
        let text = match reports.as_slice() {
            [one] => serde_json::to_string_pretty(one)?,
            many => serde_json::to_string_pretty(&by_mode(many))?,
        };
        std::fs::write(out, text).with_context(|| format!("cannot write {}", out.display()))?;
    }
    if args.json {
        match reports.iter().map(Report::summary).collect::<Vec<_>>().as_slice() {
            [one] => super::print_json(one)?,
            many => super::print_json(&by_mode(many))?,
        }
    } else {
        for (i, report) in reports.iter().enumerate() {
            if i > 0 {
                println!();
            }
            print!("{}", report.table());
            if let Some(t) = &tokenizer {
                print_ceiling(&tasks, report.mode, t, args.policy.max_tokens);
            }
            let peaks = peak_by_objectives(report);
            if peaks.len() > 1 {
                let row: Vec<String> = peaks.iter().map(|(k, v)| format!("{k}: {v:.0}")).collect();
                println!("peak tokens per step by objectives · {}", row.join(" · "));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Notes, under a mode's table, the share of the tasks whose oracle trace fits the turn budget in
/// the policy's tokens, when it is below 1: the budget, not the policy, then bounds the EM.
fn print_ceiling(tasks: &[Task], mode: Mode, tokenizer: &Tokenizer, max_tokens: usize) {
    if let Some((ceiling, longest)) = toolsmith_train::heldout::budget_fit(tasks, mode, tokenizer, max_tokens)
        && ceiling < 1.0
    {
        println!(
            "ceiling {ceiling:.2}: the oracle's own turns fit --max-tokens {max_tokens} on {:.0}% of the tasks \
             (the longest needs {longest})",
            100.0 * ceiling
        );
    }
}

/// Reports keyed by their mode's name.
fn by_mode(reports: &[Report]) -> BTreeMap<&'static str, &Report> {
    reports.iter().map(|r| (r.mode.name(), r)).collect()
}

pub fn run(env: &Env, args: RunArgs) -> Result<ExitCode> {
    let (tasks, corpus) = load_env(&args.policy)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start tokio")?;
    if args.policy.modes.len() > 1 {
        bail!("`run` answers in one mode: give --mode once");
    }
    let Agents { agents, registry, .. } = agents(env, &runtime, &args.policy, &tasks, corpus, 1)?;
    let Some(agent) = agents.first() else { bail!("no mode given") };
    let trajectory = runtime.block_on(agent.run(&args.question));
    let reward = tasks
        .iter()
        .find(|t| t.question == args.question)
        .map(|task| exact_match(trajectory.answer.as_deref().unwrap_or_default(), &task.golden_answers));
    if let Err(e) = record_usage(env, registry.as_ref(), std::iter::once((&trajectory, reward))) {
        tracing::warn!("the calls were not counted in the tool graph: {e:#}");
    }
    if args.json {
        super::print_json(&trajectory)?;
    } else {
        print_trace(&trajectory);
        if let Some(task) = tasks.iter().find(|t| t.question == args.question) {
            let answer = trajectory.answer.clone().unwrap_or_default();
            println!(
                "golden: {} · EM {:.0} · F1 {:.2}",
                task.golden_answers.join(" | "),
                exact_match(&answer, &task.golden_answers),
                f1(&answer, &task.golden_answers)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn clip(text: &str, n: usize) -> String {
    let one_line = text.replace('\n', " ");
    if one_line.chars().count() <= n { one_line } else { one_line.chars().take(n).collect::<String>() + "…" }
}

/// One trace, readably: each turn's text, its calls with verdicts and latencies, the answer.
pub fn print_trace(t: &Trajectory) {
    println!("question: {}", t.question);
    println!("mode {} · backend {} · tools: {}", t.mode, t.backend, t.tools.join(", "));
    for (i, step) in t.steps.iter().enumerate() {
        println!(
            "\n── turn {} · {} prompt + {} response tokens · {:.0} ms",
            i + 1,
            step.prompt_tokens,
            step.response_tokens,
            step.model_ms
        );
        for line in step.text.lines() {
            println!("   {line}");
        }
        for call in &step.calls {
            println!(
                "   → {}({}) [{:?}, level {}, {:.1} ms] {}",
                call.name,
                clip(&call.arguments.to_string(), 60),
                call.verdict,
                call.level,
                call.latency_ms,
                clip(&call.result.to_string(), 100)
            );
        }
        for e in &step.errors {
            println!("   ! {e}");
        }
    }
    println!(
        "\nanswer: {} · {:?} · {} turns · TT {} · PT {} · {:.0} ms",
        t.answer.as_deref().unwrap_or("(none)"),
        t.finish,
        t.turns(),
        t.total_tokens(),
        t.peak_tokens(),
        t.wall_ms
    );
}
