//! `toolsmith env atropos` against atroposlib's real API server on loopback: the groups a
//! consumer pulls are, token for token, what the trainer's own sampler and credit give for the
//! same seeds; a PyTorch GRPO step on a pulled batch lowers its loss; a restarted API gets every
//! group once; a full queue holds the handler back; an API that stays down is a clear error.
//!
//! Needs the Atropos venv (scripts/openenv-clients-env.sh) and, for the PyTorch step, the TRL venv
//! (scripts/trl-env.sh); both are created on first use.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolsmith_agent::backend::{Backend, CompletionsBackend, LocalBackend};
use toolsmith_daemon::chat::chat_router;
use toolsmith_env::atropos::{self, AtroposClient, AtroposOptions, IGNORED, ScoredData, scored_groups};
use toolsmith_policy::{LoadOptions, Policy, Precision};
use toolsmith_train::rl::RlConfig;
use toolsmith_train::rl::config::EngineConfig;
use toolsmith_train::rl::sampler;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The interpreter of a venv a script makes (its last line on stdout).
fn venv(script: &str) -> PathBuf {
    let out = Command::new(repo_root().join("scripts").join(script))
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run scripts/{script}: {e}"));
    assert!(out.status.success(), "scripts/{script} failed (it needs PyPI)");
    let text = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(text.lines().last().expect("a path").trim())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// atroposlib's API server (`run-api`), in-memory, on `port`.
struct Api {
    child: Child,
    url: String,
}

impl Api {
    fn start(python: &Path, port: u16) -> Api {
        let mut child = Command::new(python)
            .args(["-c", &format!("import uvicorn; uvicorn.run('atroposlib.api:app', host='127.0.0.1', port={port}, log_level='warning')")])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the Atropos API");
        let stderr = child.stderr.take().expect("stderr");
        std::thread::spawn(move || for _ in BufReader::new(stderr).lines() {});
        let url = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        while reqwest::blocking::get(format!("{url}/status")).is_err() {
            assert!(started.elapsed() < Duration::from_secs(60), "the Atropos API did not start");
            std::thread::sleep(Duration::from_millis(200));
        }
        Api { child, url }
    }

    /// What a trainer does first: register with a batch of `batch_size` sequences, then ask for
    /// a batch once (which tells the API the trainer started, so environments may register).
    fn register_trainer(&self, batch_size: usize) {
        let http = reqwest::blocking::Client::new();
        let reply = http
            .post(format!("{}/register", self.url))
            .json(&json!({
                "wandb_group": "test", "wandb_project": "test", "batch_size": batch_size, "max_token_len": 2048,
                "checkpoint_dir": "/nonexistent", "save_checkpoint_interval": 10, "starting_step": 0, "num_steps": 100
            }))
            .send()
            .expect("register");
        assert!(reply.status().is_success());
        let _ = self.batch();
    }

    /// A trainer's pull: the groups of one batch, or none.
    fn batch(&self) -> Option<Vec<Value>> {
        let reply: Value = reqwest::blocking::get(format!("{}/batch", self.url)).expect("batch").json().expect("json");
        reply["batch"].as_array().cloned()
    }

    fn status(&self) -> Value {
        reqwest::blocking::get(format!("{}/status", self.url)).expect("status").json().expect("json")
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn f32() -> LoadOptions {
    LoadOptions { precision: Some(Precision::F32), ..Default::default() }
}

/// A tiny policy served as an OpenAI-compatible engine (token ids and log-probs out).
fn engine(runtime: &tokio::runtime::Runtime) -> String {
    let policy = Arc::new(Mutex::new(Policy::tiny(7, f32()).expect("tiny")));
    let app = chat_router(LocalBackend::shared(policy, "tiny"), "policy");
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind");
    let addr = listener.local_addr().expect("addr");
    runtime.spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/v1")
}

/// The probe method on the engine: 2 tasks of 2 episodes per iteration, every group kept.
fn run_config(engine: &str) -> RlConfig {
    let mut config = common::config(common::even::method());
    config.engine = Some(EngineConfig { url: engine.into(), push_weights: false, ..EngineConfig::default() });
    config.dynamic_sampling = false;
    config.max_turns = 2;
    config.max_tokens = 16;
    config.temperature = 1.0;
    config.run.init = toolsmith_train::Init::Tiny;
    config
}

/// The run set up as `env atropos` sets it up: episodes from the engine.
fn prepared(config: RlConfig, dir: &Path) -> sampler::Environment {
    let url = config.engine.as_ref().expect("engine").url.clone();
    sampler::Environment::prepare(config, dir, &common::tools, |policy| {
        let tokenizer = toolsmith_contract::sync::lock(policy).tokenizer().clone();
        let backend: Arc<dyn Backend> =
            Arc::new(CompletionsBackend::new(&url, "policy", None, tokenizer).expect("engine backend"));
        Ok(backend)
    })
    .expect("prepare")
}

fn options(api: &str) -> AtroposOptions {
    AtroposOptions { url: api.into(), retry: Duration::from_millis(100), ..AtroposOptions::default() }
}

/// The groups the trainer's sampler and credit give for iterations `0..iterations`.
fn expected(runtime: &tokio::runtime::Runtime, config: RlConfig, iterations: u64) -> Vec<ScoredData> {
    let dir = tempfile::tempdir().expect("tempdir");
    let env = prepared(config, dir.path());
    let mut all = Vec::new();
    for iteration in 0..iterations {
        let sampled = runtime.block_on(env.sampler.sample(iteration));
        let credited = env.sampler.credited(&sampled.kept, &env.policy, &env.builder).expect("credit");
        all.extend(scored_groups(&sampled.kept, &credited, env.sampler.config().method.name(), iteration));
    }
    all
}

fn key(group: &Value) -> (u64, String) {
    let o = &group["group_overrides"];
    (o["iteration"].as_u64().expect("iteration"), format!("{}/{}", o["world"], o["task_id"].as_str().expect("task")))
}

#[test]
fn pulled_batches_are_the_trainers_groups_token_for_token() {
    toolsmith_policy::tch::set_num_threads(1);
    let python = venv("openenv-clients-env.sh");
    let runtime = tokio::runtime::Runtime::new().expect("tokio");
    let engine = engine(&runtime);
    let config = run_config(&engine);
    let api = Api::start(&python, free_port());
    // A batch is one iteration: 2 groups of 2 sequences.
    api.register_trainer(4);

    let dir = tempfile::tempdir().expect("tempdir");
    let env = prepared(config.clone(), dir.path());
    let mut client = AtroposClient::new(options(&api.url), config.group_size).expect("client");
    let posted = runtime.block_on(atropos::run(&env, &mut client, 0, 2, |_, _, _| {})).expect("run");
    assert_eq!(posted, 4, "2 iterations of 2 groups");

    let mut pulled = Vec::new();
    while let Some(batch) = api.batch() {
        pulled.extend(batch);
    }
    assert_eq!(pulled.len(), 4, "every group once");
    pulled.sort_by_key(key);
    let mut want = expected(&runtime, config, 2);
    want.sort_by_key(|g| key(&serde_json::to_value(g).expect("json")));
    let mut nonzero = 0;
    for (got, want) in pulled.iter().zip(&want) {
        let got: ScoredData = serde_json::from_value(got.clone()).expect("a ScoredData");
        assert_eq!(got.tokens, want.tokens, "tokens of {:?}", want.group_overrides);
        assert_eq!(got.masks, want.masks);
        assert_eq!(got.scores, want.scores);
        assert_eq!(got.advantages, want.advantages);
        // The engine's log-probs of the same tokens, computed again for the second run: equal to
        // rounding (its matrix products are not bitwise repeatable across batches).
        for (g, w) in got.inference_logprobs.iter().flatten().zip(want.inference_logprobs.iter().flatten()) {
            assert!((g - w).abs() < 1e-5, "engine log-probs {g} and {w}");
        }
        for ((tokens, mask), advantages) in got.tokens.iter().zip(&got.masks).zip(&got.advantages) {
            assert_eq!(tokens.len(), mask.len());
            assert!(mask.contains(&IGNORED), "the prompt is outside the loss");
            for ((&t, &m), &a) in tokens.iter().zip(mask).zip(advantages) {
                assert!(m == IGNORED || m == t, "a mask holds the token id or -100");
                if m == IGNORED {
                    assert_eq!(a, 0.0, "no advantage outside the loss");
                } else if a != 0.0 {
                    nonzero += 1;
                }
            }
        }
    }
    assert!(nonzero > 0, "the probe's rewards differ, so some advantages are not 0");

    // A consumer's PyTorch GRPO step on what it pulled lowers the loss it should.
    let batch = dir.path().join("batch.json");
    std::fs::write(&batch, serde_json::to_vec(&pulled).expect("json")).expect("write");
    let torch = venv("trl-env.sh");
    let out = Command::new(&torch)
        .arg(repo_root().join("tests/atropos/grpo_step.py"))
        .arg("--batch")
        .arg(&batch)
        .output()
        .expect("run grpo_step.py");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    assert!(out.status.success(), "{report}");
    assert!(report["loss_after"].as_f64() < report["loss_before"].as_f64(), "{report}");
}

#[test]
fn a_restarted_api_gets_each_group_once_and_a_full_queue_waits() {
    toolsmith_policy::tch::set_num_threads(1);
    let python = venv("openenv-clients-env.sh");
    let runtime = tokio::runtime::Runtime::new().expect("tokio");
    let engine = engine(&runtime);
    let config = run_config(&engine);
    let port = free_port();
    let api = Api::start(&python, port);
    api.register_trainer(4);
    let url = api.url.clone();

    let dir = tempfile::tempdir().expect("tempdir");
    let env = Arc::new(prepared(config.clone(), dir.path()));
    let client = Arc::new(tokio::sync::Mutex::new(
        AtroposClient::new(AtroposOptions { max_queue: 2, ..options(&url) }, config.group_size).expect("client"),
    ));
    let run = |first: u64, n: u64| {
        let (env, client) = (env.clone(), client.clone());
        runtime.spawn(async move {
            let mut client = client.lock().await;
            atropos::run(&env, &mut client, first, n, |_, _, _| {}).await
        })
    };

    // Two iterations with room for one: the second waits until the trainer pulls.
    let handle = run(0, 2);
    let started = Instant::now();
    while api.status()["queue_size"].as_u64() != Some(2) {
        assert!(started.elapsed() < Duration::from_secs(120), "the first iteration's groups never arrived");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(api.status()["queue_size"], 2, "the handler waits while the queue is full");
    assert!(!handle.is_finished());
    assert_eq!(api.batch().map(|b| b.len()), Some(2));
    runtime.block_on(handle).expect("join").expect("the second iteration runs once there is room");

    // The API goes away between posts and comes back empty: the handler registers again and
    // posts the next iteration's groups once each.
    while api.batch().is_some() {}
    api.stop();
    let handle = run(2, 1);
    std::thread::sleep(Duration::from_secs(1));
    assert!(!handle.is_finished(), "the handler waits for the API");
    let api = Api::start(&python, port);
    api.register_trainer(4);
    runtime.block_on(handle).expect("join").expect("posts after the restart");
    let batch = api.batch().expect("the groups of iteration 2");
    assert_eq!(batch.len(), 2);
    assert!(batch.iter().all(|g| g["group_overrides"]["iteration"] == 2));
    assert!(api.batch().is_none(), "nothing was posted twice");
    assert_eq!(api.status()["queue_size"], 0);

    // An API that stays down is a clear error, not a hang.
    api.stop();
    let mut gone =
        AtroposClient::new(AtroposOptions { give_up: Duration::from_millis(500), ..options(&url) }, config.group_size)
            .expect("client");
    let err = runtime.block_on(atropos::run(&env, &mut gone, 3, 1, |_, _, _| {})).expect_err("the API is down");
    assert!(err.to_string().contains("unreachable"), "{err}");
}
