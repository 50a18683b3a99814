//! The daemon as an operator runs it: the policy served over HTTP, an SFT job submitted to
//! `/jobs`, its progress in `/status`, and the served weights swapped at each checkpoint.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use serde_json::{Value, json};
use toolsmith_agent::backend::LocalBackend;
use toolsmith_daemon::chat::{Served, served_router};
use toolsmith_daemon::http::{HttpOptions, HttpServer};
use toolsmith_daemon::jobs::{Jobs, jobs_router};
use toolsmith_daemon::{Daemon, ServeOptions};
use toolsmith_policy::{LoadOptions, Policy};

use super::{Env, clear_dir};

/// Prints ``training in the daemon (`toolsmith serve --http ADDR --policy DIR`, then `toolsmith jobs`):``,
/// then what an HTTP client sees of one job, from submission to the swapped weights.
pub(super) fn section(env: &Env) -> Result<()> {
    println!("\ntraining in the daemon (`toolsmith serve --http ADDR --policy DIR`, then `toolsmith jobs`):");
    let state = env.policy_dir().with_file_name("quickstart-daemon");
    clear_dir(&state)?;
    let base = state.join("base");
    Policy::tiny(3, LoadOptions::default())?.save(&base)?;
    let served = Served::new(LocalBackend::new(Policy::load(&base, LoadOptions::default())?, "base"));
    let daemon = Daemon::new(env.registry()?, env.toolbox()?, ServeOptions::default())?;
    let jobs = Jobs::open(&state, daemon.clone(), Some(served.clone()))?;
    let runner = jobs.spawn_runner()?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = runtime.block_on(operate(daemon, served, &jobs, &base));
    // The runner stops and is joined whatever the client saw, so no job outlives the quickstart.
    jobs.stop();
    if runner.join().is_err() {
        tracing::error!("the quickstart's job runner panicked");
    }
    result?;
    println!("  try it: toolsmith jobs submit sft --preset tiny-world --watch   (docs/guide/jobs.md)");
    Ok(())
}

/// Serves the policy and the jobs on a local port and drives one job through them as a client.
async fn operate(daemon: Daemon, served: Served, jobs: &Jobs, base: &Path) -> Result<()> {
    let routes = served_router(served, "base").merge(jobs_router(jobs.clone()));
    let options = HttpOptions { extra_routes: Some(routes), ..HttpOptions::new(([127, 0, 0, 1], 0).into()) };
    let server = HttpServer::bind(daemon, options).await?;
    let client = Client { http: reqwest::Client::new(), base_url: format!("http://{}", server.local_addr()?) };
    let stop = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.serve(async move {
        let _ = stop.1.await;
    }));
    println!("  before            -> chat completions answered by step {}", client.chat().await?["toolsmith"]["step"]);
    let id = client.submit(base).await?;
    let done = client.watch(id).await?;
    println!(
        "  job {id}             -> {} at step {}/{}; run directory {}",
        done["state"].as_str().unwrap_or("?"),
        done["step"],
        done["total"],
        done["dir"].as_str().unwrap_or("?")
    );
    println!(
        "  after             -> chat completions answered by step {} (swapped in, no restart)",
        client.chat().await?["toolsmith"]["step"]
    );
    let _ = stop.0.send(());
    serving.await??;
    Ok(())
}

/// What an operator's HTTP client does with the daemon.
struct Client {
    http: reqwest::Client,
    base_url: String,
}

impl Client {
    /// One short chat completion; its `toolsmith.step` says which weights answered.
    async fn chat(&self) -> Result<Value> {
        let body = json!({"messages": [{"role": "user", "content": "Where was Ada born?"}], "max_tokens": 4});
        Ok(self.http.post(format!("{}/v1/chat/completions", self.base_url)).json(&body).send().await?.json().await?)
    }

    /// Submits a four-step SFT job from the checkpoint at `base`; returns its id.
    async fn submit(&self, base: &Path) -> Result<i64> {
        let job = json!({"kind": "sft", "config": {
            "init": base, "steps": 4, "lr": 3e-3, "batch_tokens": 2500, "micro_batch_tokens": 2500,
            "device": "cpu", "eval": null, "checkpoint_every": 2, "tool_format": "brief",
            "data": {"worlds": {"seeds": [5], "countries": 2, "tasks_per_family": 1, "styles": ["react"]}}}});
        let submitted: Value =
            self.http.post(format!("{}/jobs", self.base_url)).json(&job).send().await?.json().await?;
        let id = submitted["id"].as_i64().ok_or_else(|| anyhow::anyhow!("no job id: {submitted}"))?;
        println!("  POST /jobs        -> job {id} {}", submitted["state"].as_str().unwrap_or("?"));
        Ok(id)
    }

    /// Polls job `id` until it leaves the queue and the runner, printing each new step `/status`
    /// reports; returns the finished job.
    async fn watch(&self, id: i64) -> Result<Value> {
        let mut shown = 0;
        loop {
            let job: Value = self.http.get(format!("{}/jobs/{id}", self.base_url)).send().await?.json().await?;
            if job["state"] != "queued" && job["state"] != "running" {
                return Ok(job);
            }
            let status: Value = self.http.get(format!("{}/status", self.base_url)).send().await?.json().await?;
            let live = &status["training"]["running"];
            let step = live["step"].as_u64().unwrap_or(0);
            if step > shown {
                shown = step;
                println!(
                    "  GET /status       -> job {id} step {step}/{} loss {:.2}, served weights at step {}",
                    live["total"],
                    live["last"]["loss"].as_f64().unwrap_or(f64::NAN),
                    live["served_step"]
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
