//! `toolsmith jobs`: the daemon's training jobs, over its HTTP API.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use indicatif::ProgressBar;
use serde_json::{Value, json};
use toolsmith_train::config::SftConfig;
use toolsmith_train::rl::{Method, RlConfig};
use toolsmith_train::{Init, RunConfig};

#[derive(Debug, Args)]
pub struct JobsArgs {
    /// The daemon's base URL.
    #[arg(long, env = "TOOLSMITH_SERVER", default_value = "http://127.0.0.1:8750", global = true)]
    pub server: String,
    /// A file holding the daemon's bearer token (or set TOOLSMITH_TOKEN).
    #[arg(long, value_name = "FILE", global = true)]
    pub token_file: Option<PathBuf>,
    #[command(subcommand)]
    pub command: JobsCommand,
}

#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// Queue a training job: `sft` or `rl`, with the same config files and presets as
    /// `toolsmith train`.
    Submit {
        /// `sft` or `rl`.
        kind: String,
        /// A config file (TOML or JSON; schema: `toolsmith train schema sft|rl`).
        #[arg(long, conflicts_with = "preset")]
        config: Option<PathBuf>,
        /// A preset (e.g. tiny-world).
        #[arg(long)]
        preset: Option<String>,
        /// RL: the method (picks the defaults).
        #[arg(long, value_parser = super::train::methods())]
        method: Option<String>,
        #[command(flatten)]
        overrides: Overrides,
        /// Then follow it like `jobs watch`.
        #[arg(long)]
        watch: bool,
    },
    /// Every job, oldest first.
    List,
    /// One job, as JSON.
    Show {
        /// The job's number.
        id: i64,
    },
    /// Cancel a queued job, or stop a running one after its step (with a checkpoint).
    Cancel {
        /// The job's number.
        id: i64,
    },
    /// Queue a cancelled or failed job again; it continues from its last checkpoint.
    Resume {
        /// The job's number.
        id: i64,
    },
    /// Follow a job's metrics until it ends (exit status 0 when it succeeded).
    Watch {
        /// The job's number.
        id: i64,
    },
}

struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Client {
    fn new(args: &JobsArgs) -> Result<Client> {
        let token = super::serve::read_token(args.token_file.as_deref())?;
        Ok(Client { http: reqwest::Client::new(), base: args.server.trim_end_matches('/').to_owned(), token })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(t) => request.bearer_auth(t),
            None => request,
        }
    }

    /// Sends and reads a JSON reply; an error reply becomes the server's message.
    async fn json(&self, request: reqwest::RequestBuilder) -> Result<Value> {
        let response = request.send().await.with_context(|| format!("cannot reach the daemon at {}", self.base))?;
        let status = response.status();
        let text = response.text().await.context("the daemon's reply was cut off")?;
        let body: Value = serde_json::from_str(&text).unwrap_or_else(|_| json!({"error": {"message": text.trim()}}));
        if !status.is_success() {
            let message = body["error"]["message"].as_str().unwrap_or("no message");
            bail!("the daemon answered {status}: {message}");
        }
        Ok(body)
    }
}

pub fn run(args: JobsArgs) -> Result<ExitCode> {
    let client = Client::new(&args)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start tokio")?;
    runtime.block_on(async move {
        match args.command {
            JobsCommand::Submit { kind, config, preset, method, overrides, watch } => {
                let mut config = job_config(&kind, config, preset, method, overrides)?;
                absolute_paths(&mut config);
                let job = client
                    .json(client.request(reqwest::Method::POST, "/jobs").json(&json!({"kind": kind, "config": config})))
                    .await?;
                let id = job["id"].as_i64().context("the daemon's reply has no job id")?;
                eprintln!("job {id} queued ({kind})");
                if watch {
                    return watch_job(&client, id).await;
                }
                println!("{id}");
                Ok(ExitCode::SUCCESS)
            }
            JobsCommand::List => {
                let body = client.json(client.request(reqwest::Method::GET, "/jobs")).await?;
                println!("{:>4}  {:<4} {:<10} {:>11}  error", "id", "kind", "state", "step");
                for job in body["jobs"].as_array().map(Vec::as_slice).unwrap_or_default() {
                    println!(
                        "{:>4}  {:<4} {:<10} {:>11}  {}",
                        job["id"],
                        job["kind"].as_str().unwrap_or("?"),
                        job["state"].as_str().unwrap_or("?"),
                        format!("{}/{}", job["step"], job["total"]),
                        job["error"].as_str().unwrap_or("")
                    );
                }
                Ok(ExitCode::SUCCESS)
            }
            JobsCommand::Show { id } => {
                let job = client.json(client.request(reqwest::Method::GET, &format!("/jobs/{id}"))).await?;
                super::print_json(&job)?;
                Ok(ExitCode::SUCCESS)
            }
            JobsCommand::Cancel { id } | JobsCommand::Resume { id } => {
                let verb = if matches!(args.command, JobsCommand::Cancel { .. }) { "cancel" } else { "resume" };
                let job = client.json(client.request(reqwest::Method::POST, &format!("/jobs/{id}/{verb}"))).await?;
                println!("job {id}: {}", job["state"].as_str().unwrap_or("?"));
                Ok(ExitCode::SUCCESS)
            }
            JobsCommand::Watch { id } => watch_job(&client, id).await,
        }
    })
}

/// Flags of `toolsmith train` a submission may set over its config or preset.
#[derive(Debug, Default, clap::Args)]
pub struct Overrides {
    /// The starting model: `tiny`, `smollm2-135m` or a checkpoint directory (on the daemon's
    /// machine), e.g. an SFT run's RUN/final.
    #[arg(long)]
    init: Option<String>,
    /// Seed of the run.
    #[arg(long)]
    seed: Option<u64>,
    /// RL: iterations.
    #[arg(long)]
    iterations: Option<u64>,
    /// Peak learning rate.
    #[arg(long)]
    lr: Option<f64>,
    /// Seed of the held-out world.
    #[arg(long)]
    eval_world: Option<u64>,
    /// No held-out evaluation (the job's checkpoints still reach the served policy).
    #[arg(long)]
    no_eval: bool,
}

/// The config a submission carries, resolved here the way `toolsmith train` resolves it.
fn job_config(
    kind: &str,
    file: Option<PathBuf>,
    preset: Option<String>,
    method: Option<String>,
    o: Overrides,
) -> Result<Value> {
    Ok(match kind {
        "sft" => {
            if method.is_some() || o.iterations.is_some() {
                bail!("--method and --iterations are for rl jobs");
            }
            let mut config = match (&preset, file) {
                (Some(p), _) => SftConfig::preset(p)?,
                (None, Some(f)) => SftConfig::from_file(&f)?,
                (None, None) => SftConfig::default(),
            };
            apply_overrides(&mut config, &o, preset.as_deref())?;
            serde_json::to_value(config)?
        }
        "rl" => {
            let method = method.as_deref().map(Method::parse_or_explain).transpose()?;
            let mut config = match (&preset, file) {
                (Some(p), _) => RlConfig::preset(p, method)?,
                (None, Some(f)) => RlConfig::from_file(&f)?,
                (None, None) => RlConfig::for_method(method.unwrap_or(Method::GAP)),
            };
            if let Some(v) = o.iterations {
                config.iterations = v;
            }
            apply_overrides(&mut config, &o, preset.as_deref())?;
            serde_json::to_value(config)?
        }
        other => bail!("no job kind {other:?}: sft or rl"),
    })
}

/// Applies a submission's flags to its config (SFT's or RL's), then checks it still suits its
/// preset.
fn apply_overrides(config: &mut impl RunConfig, o: &Overrides, preset: Option<&str>) -> Result<()> {
    if let Some(init) = &o.init {
        config.run_mut().init = Init::parse(init);
    }
    if let Some(seed) = o.seed {
        config.run_mut().seed = seed;
    }
    if let Some(lr) = o.lr {
        *config.lr_mut() = lr;
    }
    super::train::held_out(config.eval_mut(), o.no_eval, None, o.eval_world);
    if let Some(p) = preset {
        config.check_preset(p)?;
    }
    Ok(())
}

/// Follows `/jobs/{id}/metrics` (server-sent events) with a progress bar.
async fn watch_job(client: &Client, id: i64) -> Result<ExitCode> {
    let job = client.json(client.request(reqwest::Method::GET, &format!("/jobs/{id}"))).await?;
    let bar = ProgressBar::new(job["total"].as_u64().unwrap_or(0));
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} · {msg} · {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let say = |line: String| if bar.is_hidden() { eprintln!("{line}") } else { bar.println(line) };
    let mut response = client
        .request(reqwest::Method::GET, &format!("/jobs/{id}/metrics"))
        .send()
        .await
        .with_context(|| format!("cannot reach the daemon at {}", client.base))?;
    if !response.status().is_success() {
        bail!("the daemon answered {} for job {id}'s metrics", response.status());
    }
    let mut pending = String::new();
    let mut event = String::new();
    let mut data = String::new();
    while let Some(chunk) = response.chunk().await.context("the metrics stream broke")? {
        pending.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = pending.find('\n') {
            let line = pending[..end].trim_end_matches('\r').to_owned();
            pending.drain(..=end);
            if let Some(v) = line.strip_prefix("event:") {
                event = v.trim().to_owned();
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push_str(v.trim_start());
            } else if line.is_empty() && !data.is_empty() {
                let value: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
                if event == "end" {
                    bar.finish_and_clear();
                    let state = value["state"].as_str().unwrap_or("?");
                    println!("job {id} {state} at step {}/{}", value["step"], value["total"]);
                    if let Some(e) = value["error"].as_str() {
                        println!("error: {e}");
                    }
                    return Ok(if state == "succeeded" { ExitCode::SUCCESS } else { ExitCode::FAILURE });
                }
                show_record(&bar, &say, &value);
                (event, data) = (String::new(), String::new());
                if bar.length() == Some(0) {
                    // Submitted but not started when we began: the total is known now.
                    let job = client.json(client.request(reqwest::Method::GET, &format!("/jobs/{id}"))).await?;
                    bar.set_length(job["total"].as_u64().unwrap_or(0));
                }
            }
        }
    }
    bar.finish_and_clear();
    bail!("the metrics stream of job {id} ended before the job did (the daemon stopped?)")
}

fn show_record(bar: &ProgressBar, say: &impl Fn(String), record: &Value) {
    match record["kind"].as_str() {
        Some("train") => {
            bar.set_position(record["step"].as_u64().unwrap_or(0));
            let msg = format!(
                "loss {:.3} · lr {:.2e} · {:.0} tok/s",
                record["loss"].as_f64().unwrap_or(f64::NAN),
                record["lr"].as_f64().unwrap_or(f64::NAN),
                record["tokens_per_sec"].as_f64().unwrap_or(0.0)
            );
            if bar.is_hidden() {
                say(format!("step {}: {msg}", record["step"]));
            }
            bar.set_message(msg);
        }
        Some("iteration") => {
            bar.set_position(record["iteration"].as_u64().unwrap_or(0));
            let msg = format!(
                "reward {:.3} · EM {:.2} · KL {:.4}",
                record["reward"].as_f64().unwrap_or(f64::NAN),
                record["em"].as_f64().unwrap_or(f64::NAN),
                record["kl"].as_f64().unwrap_or(f64::NAN)
            );
            if bar.is_hidden() {
                say(format!("iteration {}: {msg}", record["iteration"]));
            }
            bar.set_message(msg);
        }
        Some("eval") => {
            let modes: Vec<String> = record["modes"]
                .as_object()
                .map(|m| m.iter().map(|(k, f)| format!("{k} EM {:.2}", f["em"].as_f64().unwrap_or(0.0))).collect())
                .unwrap_or_default();
            say(format!("held-out @ step {}: {}", record["step"], modes.join(" · ")));
        }
        _ => {}
    }
}

/// Makes the config's relative paths that exist here absolute: the daemon takes a relative path
/// from its state directory, not from where `jobs submit` ran, and would otherwise read another
/// file (or refuse one that is outside the directories it allows).
fn absolute_paths(config: &mut Value) {
    let absolute = |value: &mut Value| {
        if let Some(text) = value.as_str()
            && Path::new(text).is_relative()
            && Path::new(text).exists()
            && let Ok(path) = std::path::absolute(text)
        {
            *value = Value::String(path.to_string_lossy().into_owned());
        }
    };
    if let Some(files) = config.pointer_mut("/data/files").and_then(Value::as_array_mut) {
        files.iter_mut().for_each(absolute);
    }
    if let Some(init) = config.get_mut("init") {
        absolute(init);
    }
}
