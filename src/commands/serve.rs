//! `toolsmith serve`: the tool graph over MCP (stdio and/or streamable HTTP) with a status API.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use toolsmith_daemon::http::{HttpOptions, HttpServer};
use toolsmith_daemon::{Admission, Daemon, ServeOptions, mcp};
use toolsmith_sandbox::Limits;

use toolsmith_agent::backend::LocalBackend;
use toolsmith_agent::env::Corpus;
use toolsmith_daemon::chat::{Served, served_router};
use toolsmith_daemon::jobs::{JobInputs, Jobs, jobs_router};

use super::Env;

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Serve MCP on standard input and output (for clients that spawn the server).
    #[arg(long)]
    pub stdio: bool,
    /// Serve MCP over streamable HTTP at http://ADDR/mcp, with /status and /health beside it.
    /// The default when --stdio is not given: 127.0.0.1:8750.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// A file holding the bearer token HTTP clients must send (required off loopback). The
    /// TOOLSMITH_TOKEN environment variable works too; a file keeps it out of `ps`.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Also accept this Host header (a name, or name:port), e.g. when behind a proxy.
    #[arg(long = "allow-host", value_name = "HOST")]
    pub allow_hosts: Vec<String>,
    /// Also accept browsers from this origin (scheme://host or scheme://host:port, `:*` for any port).
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    pub allow_origins: Vec<String>,
    /// Calls that may run at once [default: number of cores].
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// create_and_execute_mcp calls that may run at once, in a pool apart from the calls' (so
    /// endless creations never take an ordinary call's slot).
    #[arg(long, default_value_t = 1)]
    pub create_concurrency: usize,
    /// Milliseconds a call waits for a free slot before it is answered `busy`.
    #[arg(long, default_value_t = 10_000)]
    pub slot_wait_ms: u64,
    /// Open MCP sessions over HTTP at most; one more closes the longest-idle one.
    #[arg(long, default_value_t = 256)]
    pub max_sessions: usize,
    /// Tools per tools/list page.
    #[arg(long, default_value_t = 100)]
    pub page_size: usize,
    /// What create_and_execute_mcp does with a tool that works.
    #[arg(long, value_enum, default_value = "register")]
    pub admission: AdmissionArg,
    /// Deadline of one call in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,
    /// Memory cap of one call in MiB.
    #[arg(long, default_value_t = 64)]
    pub memory_mb: usize,
    /// Largest HTTP request body in KiB.
    #[arg(long, default_value_t = 4096)]
    pub max_request_kb: usize,
    /// Seconds shutdown waits for running calls.
    #[arg(long, default_value_t = 30)]
    pub drain_secs: u64,
    /// Also serve this policy (a checkpoint directory, or `tiny`) as an OpenAI-compatible
    /// endpoint: POST /v1/chat/completions (streaming included) and GET /v1/models.
    #[arg(long, value_name = "DIR")]
    pub policy: Option<String>,
    /// The model name the endpoint reports [default: the directory's name].
    #[arg(long)]
    pub model_name: Option<String>,
    /// Also serve this JSON-lines corpus ({title, text}, e.g. a `world generate` corpus.jsonl) as
    /// the `search` tool, so agents can take every tool of a world over MCP.
    #[arg(long, value_name = "FILE")]
    pub corpus: Option<PathBuf>,
    /// Where training jobs keep their database (jobs.db) and run directories (jobs/ID)
    /// [default: the registry's directory]. Jobs are served over HTTP only.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Let job configs read data files and checkpoints under this directory too (by default
    /// only the state directory's; relative paths start there).
    #[arg(long = "allow-dir", value_name = "DIR")]
    pub allow_dirs: Vec<PathBuf>,
    /// Largest data file a job may read, in MiB.
    #[arg(long, default_value_t = toolsmith_daemon::jobs::DEFAULT_MAX_DATA_BYTES >> 20)]
    pub max_data_mb: u64,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum AdmissionArg {
    /// Register it in the tool graph at once.
    Register,
    /// Keep it as a candidate of this server's run.
    Candidate,
}

pub fn run(env: &Env, args: ServeArgs) -> Result<ExitCode> {
    let registry = env.registry()?;
    let toolbox = env.toolbox_maybe_python("Python tools and create_and_execute_mcp are")?;
    let defaults = ServeOptions::default();
    let options = ServeOptions {
        concurrency: args.concurrency.unwrap_or(defaults.concurrency),
        create_concurrency: args.create_concurrency,
        slot_wait: Duration::from_millis(args.slot_wait_ms),
        page_size: args.page_size,
        admission: match args.admission {
            AdmissionArg::Register => Admission::Register,
            AdmissionArg::Candidate => Admission::Candidate,
        },
        limits: Limits {
            timeout: Duration::from_millis(args.timeout_ms),
            memory_bytes: args.memory_mb.saturating_mul(1 << 20),
            ..Limits::default()
        },
        corpus: match &args.corpus {
            Some(p) => Some(Arc::new(
                Corpus::load_jsonl(p).with_context(|| format!("cannot read the corpus {}", p.display()))?,
            )),
            None => None,
        },
        ..defaults
    };
    let served = match &args.policy {
        Some(p) => Some((super::agent::load_policy(p)?, p.clone())),
        None => None,
    }
    .map(|(policy, p)| {
        let name = args.model_name.clone().unwrap_or_else(|| {
            Path::new(&p).file_name().map_or_else(|| p.clone(), |n| n.to_string_lossy().into_owned())
        });
        (Served::new(LocalBackend::new(policy, &p)), name)
    });
    let registry_dir = registry.path().parent().map(Path::to_path_buf).unwrap_or_default();
    let daemon = Daemon::new(registry, toolbox, options)?;
    let token = read_token(args.token_file.as_deref())?;
    let http = match (args.stdio, args.http) {
        (true, None) => None,
        (_, addr) => Some(addr.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8750)))),
    };
    let jobs = match http {
        Some(_) => {
            let state = args.state_dir.clone().unwrap_or(registry_dir);
            let jobs = Jobs::open(&state, daemon.clone(), served.as_ref().map(|(s, _)| s.clone()))
                .with_context(|| format!("cannot open the training jobs in {}", state.display()))?;
            let mut inputs = JobInputs::new(&state).max_data_bytes(args.max_data_mb.saturating_mul(1 << 20));
            // The served checkpoint is one the operator named: jobs may start from it (and must,
            // for the served policy to follow them).
            if let Some(policy) = args.policy.as_deref().map(Path::new).filter(|p| p.is_dir()) {
                inputs = inputs.allow(policy);
            }
            for dir in &args.allow_dirs {
                if !dir.is_dir() {
                    bail!("--allow-dir {}: not a directory", dir.display());
                }
                inputs = inputs.allow(dir);
            }
            Some(jobs.with_inputs(inputs))
        }
        None => None,
    };
    let mut extra = served.map(|(s, name)| served_router(s, name));
    let with_chat = extra.is_some();
    if let Some(jobs) = &jobs {
        extra = Some(extra.unwrap_or_default().merge(jobs_router(jobs.clone())));
    }
    let drain = Duration::from_secs(args.drain_secs);

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start tokio")?;
    let runner = match &jobs {
        Some(jobs) => Some(jobs.spawn_runner().context("cannot start the job runner")?),
        None => None,
    };
    let stop_jobs = jobs.clone();
    runtime.block_on(async move {
        let _watcher = daemon.spawn_watcher();
        let http_task = match http {
            Some(addr) => {
                let options = HttpOptions {
                    token,
                    allowed_hosts: args.allow_hosts,
                    allowed_origins: args.allow_origins,
                    max_body_bytes: args.max_request_kb.saturating_mul(1024),
                    drain_timeout: drain,
                    max_sessions: args.max_sessions,
                    extra_routes: extra,
                    ..HttpOptions::new(addr)
                };
                let server = HttpServer::bind(daemon.clone(), options).await?;
                let local = server.local_addr()?;
                // Scripts (and the tests) read this line to find the port.
                eprintln!("toolsmith serve: MCP on http://{local}/mcp, status on http://{local}/status");
                if with_chat {
                    eprintln!("toolsmith serve: chat completions on http://{local}/v1/chat/completions");
                }
                eprintln!("toolsmith serve: training jobs on http://{local}/jobs");
                let stop = async move {
                    shutdown_signal().await;
                    // The running job stops after its step with a checkpoint and stays queued.
                    if let Some(jobs) = stop_jobs {
                        jobs.stop();
                    }
                };
                Some(tokio::spawn(server.serve(stop)))
            }
            None => None,
        };
        if args.stdio {
            let stdio = mcp::serve_stdio(daemon.clone());
            tokio::select! {
                done = stdio => done?,
                _ = shutdown_signal() => {}
            }
            // The client is gone (or we were told to stop): finish running calls, then stop
            // every transport.
            daemon.drain(drain).await;
        }
        if let Some(task) = http_task {
            task.await.context("the HTTP server task failed")??;
        }
        // The last calls' usage statistics are committed before the process exits.
        if let Err(e) = daemon.flush_usage() {
            tracing::warn!("cannot record the last calls' usage: {e}");
        }
        anyhow::Ok(())
    })?;
    if let Some(runner) = runner {
        if let Some(jobs) = &jobs {
            jobs.stop();
        }
        if runner.join().is_err() {
            tracing::error!("the job runner panicked");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The bearer token from `--token-file`, or else `TOOLSMITH_TOKEN` (the server's and the clients').
pub fn read_token(file: Option<&Path>) -> Result<Option<String>> {
    let token = match file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the token file {}", path.display()))?
                .trim()
                .to_owned(),
        ),
        None => std::env::var("TOOLSMITH_TOKEN").ok().map(|t| t.trim().to_owned()),
    };
    if token.as_deref() == Some("") {
        bail!("the bearer token is empty");
    }
    Ok(token)
}

/// Ctrl-C or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
    tracing::info!("shutdown requested");
}
