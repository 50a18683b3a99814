//! `toolsmith env`: Toolsmith as the environment of other trainers. `env serve` is an OpenEnv
//! server (TRL's GRPOTrainer, SkyRL, torchforge); `env atropos` an Atropos rollout handler
//! (verl's Atropos recipe). Both take `train rl`'s settings, so an episode is scored exactly as
//! `train rl` would score it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use toolsmith_agent::backend::{Backend, BatchConfig, BatchedBackend, CompletionsBackend};
use toolsmith_agent::env::{Corpus, load_tasks};
use toolsmith_agent::tools::LocalTools;
use toolsmith_daemon::http::HttpOptions;
use toolsmith_env::atropos::{AtroposClient, AtroposOptions};
use toolsmith_env::openenv::EnvServer;
use toolsmith_env::{ClientsOnly, EnvOptions, Environment};
use toolsmith_sandbox::Toolbox;
use toolsmith_train::TrainError;
use toolsmith_train::rl::sampler;

use super::Env;
use super::train::{RlArgs, progress_bar, resolve_rl, tools_for};

#[derive(Debug, Subcommand)]
pub enum EnvCommand {
    /// Serve episodes as an OpenEnv environment over HTTP and WebSocket (/ws, /reset, /step,
    /// /state, /mcp): a client sends the model's turns, the environment runs their calls and
    /// answers observations and the method's reward.
    Serve(Box<ServeArgs>),
    /// Sample groups on an engine, score and credit them with the method, and post them to an
    /// Atropos API for a trainer to pull.
    Atropos(Box<AtroposArgs>),
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The method, worlds, budgets and seeds, as `train rl` takes them (`--out` holds the SEARL
    /// sessions' tool graph).
    #[command(flatten)]
    pub rl: RlArgs,
    /// Where to listen.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8760")]
    pub http: SocketAddr,
    /// A file holding the bearer token clients must send (required off loopback); or set
    /// TOOLSMITH_TOKEN.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Also accept this Host header.
    #[arg(long = "allow-host", value_name = "HOST")]
    pub allow_hosts: Vec<String>,
    /// Also accept browsers (and their WebSockets) from this origin.
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    pub allow_origins: Vec<String>,
    /// Episodes open at once at most.
    #[arg(long, default_value_t = 256)]
    pub max_sessions: usize,
    /// Seconds an episode may sit untouched before it is closed.
    #[arg(long, default_value_t = 600)]
    pub idle_secs: u64,
    /// Seconds one step (the turn's tool calls) may take.
    #[arg(long, default_value_t = 120)]
    pub step_secs: u64,
    /// A JSON-lines task set ({question, golden_answers}) in place of the generated worlds.
    #[arg(long, value_name = "FILE")]
    pub tasks: Option<PathBuf>,
    /// The corpus ({title, text}) the task set's search tool searches.
    #[arg(long, value_name = "FILE", requires = "tasks")]
    pub corpus: Option<PathBuf>,
    /// Largest request body in KiB.
    #[arg(long, default_value_t = 4096)]
    pub max_request_kb: usize,
}

#[derive(Debug, Args)]
pub struct AtroposArgs {
    /// The method, worlds, budgets, seeds and the engine (`--engine URL`; without one the
    /// starting policy samples here), as `train rl` takes them.
    #[command(flatten)]
    pub rl: RlArgs,
    /// The Atropos API.
    #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:8000")]
    pub api: String,
    /// The name to register under.
    #[arg(long, default_value = "toolsmith")]
    pub name: String,
    /// This environment's weight among the API's.
    #[arg(long, default_value_t = 1.0)]
    pub weight: f64,
    /// Wait before sampling while the API's queue holds this many groups.
    #[arg(long, default_value_t = 64)]
    pub max_queue: usize,
    /// Drop a group the trainer has moved this many steps past before it could be posted.
    #[arg(long, default_value_t = 4)]
    pub max_staleness: u64,
    /// The first iteration (its seeds are `train rl`'s iteration of that number).
    #[arg(long, default_value_t = 0)]
    pub start_iteration: u64,
    /// Seconds to keep retrying while the API is unreachable.
    #[arg(long, default_value_t = 600)]
    pub give_up_secs: u64,
}

pub fn run(env: &Env, cmd: EnvCommand) -> Result<ExitCode> {
    match cmd {
        EnvCommand::Serve(args) => serve(env, *args),
        EnvCommand::Atropos(args) => atropos(env, *args),
    }
}

fn serve(env: &Env, args: ServeArgs) -> Result<ExitCode> {
    let config = resolve_rl(&args.rl)?;
    let toolbox: OnceLock<Option<Toolbox>> = OnceLock::new();
    let tools_for = tools_for(env, &toolbox);
    let spinner = super::tools::spinner("preparing the policy and the worlds");
    let prepared = sampler::Environment::prepare(config, &args.rl.run.out, &tools_for, |_| Ok(Arc::new(ClientsOnly)));
    spinner.finish_and_clear();
    let mut prepared = prepared.context("cannot set up the environment")?;
    if let Some(path) = &args.tasks {
        let tasks = load_tasks(path).with_context(|| format!("cannot read tasks from {}", path.display()))?;
        if tasks.is_empty() {
            bail!("{} holds no tasks", path.display());
        }
        let tools = match &args.corpus {
            Some(c) => {
                let corpus =
                    Corpus::load_jsonl(c).with_context(|| format!("cannot read the corpus {}", c.display()))?;
                tools_for(Arc::new(corpus))
            }
            None => Arc::new(LocalTools::new()),
        };
        prepared = prepared.with_tasks(tasks, tools);
    }
    let tokenizer = toolsmith_contract::sync::lock(&prepared.policy).tokenizer().clone();
    let options = EnvOptions {
        max_sessions: args.max_sessions,
        idle_timeout: Duration::from_secs(args.idle_secs),
        step_timeout: Duration::from_secs(args.step_secs),
        seed: prepared.sampler.config().run.seed,
    };
    let environment = Arc::new(Environment::new(prepared.sampler, Some(tokenizer), options));
    let http = HttpOptions {
        token: super::serve::read_token(args.token_file.as_deref())?,
        allowed_hosts: args.allow_hosts,
        allowed_origins: args.allow_origins,
        max_body_bytes: args.max_request_kb.saturating_mul(1024),
        ..HttpOptions::new(args.http)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start tokio")?;
    runtime.block_on(async move {
        let method = environment.sampler().config().method;
        let tasks = environment.tasks().len();
        let server = EnvServer::bind(environment, http).await?;
        let local = server.local_addr()?;
        // Scripts (and the tests) read this line to find the port.
        eprintln!("toolsmith env serve: OpenEnv on http://{local} (ws://{local}/ws), {method} over {tasks} tasks");
        server.serve(super::serve::shutdown_signal()).await?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

fn atropos(env: &Env, args: AtroposArgs) -> Result<ExitCode> {
    let config = resolve_rl(&args.rl)?;
    let toolbox: OnceLock<Option<Toolbox>> = OnceLock::new();
    let tools_for = tools_for(env, &toolbox);
    let iterations = config.iterations;
    let group_size = config.group_size;
    let engine = config.engine.clone();
    let batching = (config.tasks_per_iteration + config.oversample) * config.group_size;
    let (max_turns, max_tokens) = (config.max_turns, config.max_tokens);
    let spinner = super::tools::spinner("preparing the policy and the worlds");
    let prepared = sampler::Environment::prepare(config, &args.rl.run.out, &tools_for, |policy| {
        let locked = toolsmith_contract::sync::lock(policy);
        let backend: Arc<dyn Backend> = match &engine {
            Some(e) => {
                let key = e.api_key_env.as_ref().and_then(|v| std::env::var(v).ok()).filter(|k| !k.is_empty());
                Arc::new(
                    CompletionsBackend::new(&e.url, &e.model, key, locked.tokenizer().clone())
                        .map_err(|err| TrainError::Agent(format!("engine {}: {err}", e.url)))?
                        .with_context(locked.context_len()),
                )
            }
            None => {
                let config = BatchConfig::for_episodes(batching, max_turns, max_tokens, &locked);
                Arc::new(BatchedBackend::new(policy.clone(), "atropos", config))
            }
        };
        Ok(backend)
    });
    spinner.finish_and_clear();
    let prepared = prepared.context("cannot set up the environment")?;
    let options = AtroposOptions {
        url: args.api.clone(),
        name: args.name,
        weight: args.weight,
        max_token_length: toolsmith_contract::sync::lock(&prepared.policy).context_len(),
        max_queue: args.max_queue,
        max_staleness: args.max_staleness,
        give_up: Duration::from_secs(args.give_up_secs),
        ..AtroposOptions::default()
    };
    let mut client = AtroposClient::new(options, group_size)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start tokio")?;
    let bar = progress_bar("iteration");
    bar.set_length(iterations);
    let posted = runtime.block_on(toolsmith_env::atropos::run(
        &prepared,
        &mut client,
        args.start_iteration,
        iterations,
        |iteration, groups, posted| {
            bar.set_position(iteration + 1 - args.start_iteration);
            tracing::info!(iteration, groups, posted, "posted an iteration's groups");
        },
    ))?;
    bar.finish_and_clear();
    eprintln!("toolsmith env atropos: posted {posted} groups to {} ({} dropped as stale)", args.api, client.stale);
    Ok(ExitCode::SUCCESS)
}
