//! Rollouts from an external engine, token in and token out: a real HTTP server (`toolsmith
//! serve`'s completions endpoint over a real policy) samples the episodes, the trainer pushes its
//! weights to it and scores exactly the ids the engine returned.

#[path = "../../train/tests/common/mod.rs"]
mod common;

use std::sync::{Arc, Mutex};

use serde_json::Value;
use toolsmith_agent::backend::{CompletionsBackend, GenerateOptions, LocalBackend};
use toolsmith_agent::env::{Corpus, World, WorldConfig};
use toolsmith_agent::tools::{Executor, LocalTools};
use toolsmith_agent::{Agent, AgentConfig, Mode, Trajectory};
use toolsmith_daemon::chat::chat_router;
use toolsmith_policy::tch;
use toolsmith_policy::{LoadOptions, LoraConfig, Policy, Precision};

/// f32: these tests are about tokens and weights agreeing exactly, not about precision.
fn f32() -> LoadOptions {
    LoadOptions { precision: Some(Precision::F32), ..Default::default() }
}
use toolsmith_train::metrics::{Record, read};
use toolsmith_train::rl::config::EngineConfig;
use toolsmith_train::rl::config::OldLogprobs;
use toolsmith_train::rl::episode::episode_sequences;
use toolsmith_train::rl::{Method, RlConfig, RlTrainer};
use toolsmith_train::sequence::SequenceBuilder;
use toolsmith_train::{DeviceChoice, PrecisionChoice, RunSettings};

/// Serves a tiny policy of `seed` on a free port; returns its base URL and the served policy.
fn engine(runtime: &tokio::runtime::Runtime, seed: u64) -> (String, Arc<Mutex<Policy>>) {
    let policy = Arc::new(Mutex::new(Policy::tiny(seed, f32()).expect("tiny")));
    let app = chat_router(LocalBackend::shared(policy.clone(), "tiny"), "policy");
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind");
    let addr = listener.local_addr().expect("addr");
    runtime.spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/v1"), policy)
}

fn max_scoring_difference(policy: &Policy, episodes: &[Trajectory]) -> (usize, f64) {
    let builder = SequenceBuilder::for_policy(policy).expect("builder");
    let (mut scored, mut max_diff) = (0, 0.0_f64);
    for trajectory in episodes {
        for seq in episode_sequences(&builder, trajectory).expect("sequences") {
            let (n, diff) = common::rescore(policy, &seq, 1.0);
            scored += n;
            max_diff = max_diff.max(diff);
        }
    }
    (scored, max_diff)
}

#[test]
fn an_engine_samples_what_the_trainer_scores_once_the_weights_are_pushed() {
    tch::set_num_threads(1);
    let runtime = tokio::runtime::Runtime::new().expect("tokio");
    let (url, served) = engine(&runtime, 7);
    // The trainer's policy has other weights than the engine starts with.
    let policy = Policy::tiny(0, f32()).expect("tiny");
    let engine = CompletionsBackend::new(&url, "policy", None, policy.tokenizer().clone()).expect("engine");
    let world = World::generate(WorldConfig { seed: 3, countries: 2, tasks_per_family: 1 });
    let corpus = Arc::new(Corpus::new(&world.documents()).expect("corpus"));
    let tools: Arc<dyn Executor> = Arc::new(LocalTools::new().with_corpus(corpus));
    let run = |seed: u64| -> Vec<Trajectory> {
        let config = AgentConfig {
            mode: Mode::React,
            max_turns: 3,
            generate: GenerateOptions { max_tokens: 40, temperature: 1.0, seed, ..GenerateOptions::default() },
            ..AgentConfig::default()
        };
        let agent = Agent::new(Arc::new(engine.clone()), tools.clone(), config);
        world.tasks().iter().take(3).map(|t| runtime.block_on(agent.run(&t.question))).collect()
    };

    // Before the push the engine samples from its own weights: the trainer's scores disagree.
    let before = run(1);
    let (_, stale) = max_scoring_difference(&policy, &before);
    assert!(stale > 1e-2, "the engine's weights differ, yet the scores agree to {stale:.2e}");

    let dir = tempfile::tempdir().expect("tempdir");
    policy.save(&dir.path().join("weights")).expect("save");
    let reply = runtime.block_on(engine.update_weights(&dir.path().join("weights"))).expect("push");
    assert_eq!(reply["success"], Value::Bool(true), "{reply}");

    let after = run(2);
    let turns: usize = after.iter().map(|t| t.steps.len()).sum();
    let (scored, max_diff) = max_scoring_difference(&policy, &after);
    println!("{turns} turns sampled by the engine, {scored} tokens scored: max |trainer - engine| = {max_diff:.2e}");
    assert!(turns >= 3 && scored > 60, "{turns} turns, {scored} tokens");
    assert!(max_diff < 1e-3, "max abs log-prob difference {max_diff}");

    // A checkpoint of another tokenizer is refused and the served weights stay.
    std::fs::write(dir.path().join("weights/tokenizer.json"), b"{}").expect("overwrite");
    assert!(runtime.block_on(engine.update_weights(&dir.path().join("weights"))).is_err());
    drop(served);
}

/// GAP for `iterations` on two tasks of world 5, sampled on `engine`.
fn gap_on_engine(iterations: u64, engine: EngineConfig) -> RlConfig {
    RlConfig {
        worlds: toolsmith_train::config::WorldsData {
            seeds: vec![5],
            countries: 2,
            tasks_per_family: 1,
            styles: vec![Mode::Gap],
            ..Default::default()
        },
        eval: None,
        iterations,
        tasks_per_iteration: 2,
        group_size: 2,
        max_turns: 2,
        max_tokens: 16,
        dynamic_sampling: false,
        overlong_cache: 4,
        lr: 1e-3,
        engine: Some(engine),
        run: RunSettings {
            threads: 1,
            device: DeviceChoice::Cpu,
            precision: PrecisionChoice::Fixed(toolsmith_policy::Precision::F32),
            ..RlConfig::for_method(Method::GAP).run.clone()
        },
        ..RlConfig::for_method(Method::GAP)
    }
}

#[test]
fn an_rl_run_samples_on_the_engine_and_pushes_every_update() {
    tch::set_num_threads(1);
    let runtime = tokio::runtime::Runtime::new().expect("tokio");
    let (url, served) = engine(&runtime, 7);
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("run");
    let config = gap_on_engine(2, EngineConfig { url, ..EngineConfig::default() });
    let tools = |corpus: Arc<Corpus>| -> Arc<dyn Executor> { Arc::new(LocalTools::new().with_corpus(corpus)) };
    let mut trainer = RlTrainer::prepare(config, &out, false, &tools).expect("prepare");
    trainer.run(&mut |_| {}).expect("trains");
    let iterations = read(&out.join("metrics.jsonl"))
        .expect("metrics")
        .into_iter()
        .filter(|r| matches!(r, Record::Iteration(_)))
        .count();
    assert_eq!(iterations, 2);
    // The engine now serves exactly the trained weights.
    let trained = trainer.policy();
    let trained = trained.lock().expect("policy");
    let served = served.lock().expect("served");
    assert_eq!(served.state().step, trained.state().step);
    let (a, b) = (trained.var_store().variables(), served.var_store().variables());
    for (name, t) in &a {
        let diff = (t - &b[name]).abs().max().double_value(&[]);
        assert!(diff == 0.0, "{name} differs by {diff}");
    }
    // The weights were pushed before every rollout: the trainer's rescoring agrees with the
    // engine's log-probs, and the gap is recorded.
    for gap in gaps(&out) {
        assert!(gap.is_some_and(|g| g < 1e-3), "{gap:?}");
    }
}

fn gaps(run: &std::path::Path) -> Vec<Option<f64>> {
    read(&run.join("metrics.jsonl"))
        .expect("metrics")
        .into_iter()
        .filter_map(|r| if let Record::Iteration(m) = r { Some(m.engine_logprob_gap) } else { None })
        .collect()
}

#[test]
fn an_engine_that_lags_the_trainer_is_measured_and_corrected() {
    tch::set_num_threads(1);
    let runtime = tokio::runtime::Runtime::new().expect("tokio");
    // The engine serves other weights than the trainer's and is never updated.
    let (url, _served) = engine(&runtime, 7);
    let tools = |corpus: Arc<Corpus>| -> Arc<dyn Executor> { Arc::new(LocalTools::new().with_corpus(corpus)) };
    for old_logprobs in [OldLogprobs::Recompute, OldLogprobs::Tis] {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("run");
        let engine = EngineConfig { url: url.clone(), push_weights: false, old_logprobs, ..EngineConfig::default() };
        let config = gap_on_engine(1, engine);
        let mut trainer = RlTrainer::prepare(config, &out, false, &tools).expect("prepare");
        trainer.run(&mut |_| {}).expect("trains on the engine's samples");
        // The engine's log-probs are another model's: the gap is large and recorded; the update
        // used the trainer's own (and, with TIS, weights capped at 2), so it stayed finite.
        let gaps = gaps(&out);
        assert_eq!(gaps.len(), 1);
        assert!(gaps[0].is_some_and(|g| g > 1e-2), "{old_logprobs:?}: {gaps:?}");
    }
}

#[test]
fn the_engine_refuses_bad_requests_and_keeps_serving() {
    let runtime = tokio::runtime::Runtime::new().expect("tokio");
    let (url, served) = engine(&runtime, 7);
    let client = reqwest::Client::new();
    let post = |path: &str, body: &str| -> (u16, Value) {
        runtime.block_on(async {
            let response = client
                .post(format!("{url}{path}"))
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .expect("send");
            let status = response.status().as_u16();
            (status, response.json().await.unwrap_or(Value::Null))
        })
    };
    let vocab = served.lock().expect("served").config().common().vocab_size;
    for (body, why) in [
        ("{not json", "invalid request body"),
        (&format!(r#"{{"prompt": [1, {vocab}]}}"#) as &str, "token ids"),
        (r#"{"prompt": []}"#, "token ids"),
        (r#"{"prompt": [1, 2], "temperature": 7}"#, "temperature"),
    ] {
        let (status, reply) = post("/completions", body);
        assert_eq!(status, 400, "{body}: {reply}");
        assert!(reply["error"]["message"].as_str().is_some_and(|m| m.contains(why)), "{body}: {reply}");
    }
    let root = url.trim_end_matches("/v1");
    let missing = runtime.block_on(
        client
            .post(format!("{root}/update_weights_from_disk"))
            .json(&serde_json::json!({"model_path": "/nonexistent/checkpoint"}))
            .send(),
    );
    assert_eq!(missing.expect("send").status().as_u16(), 400);
    // Still serving, token ids and log-probs, naming the step that answered.
    let (status, reply) =
        post("/completions", r#"{"prompt": [1, 2, 3], "max_tokens": 4, "return_token_ids": true, "logprobs": true}"#);
    assert_eq!(status, 200, "{reply}");
    let ids = reply["choices"][0]["token_ids"].as_array().expect("token ids").len();
    let logprobs = reply["choices"][0]["logprobs"]["token_logprobs"].as_array().expect("log-probs").len();
    assert!(ids >= 1 && ids == logprobs, "{reply}");
    assert_eq!(reply["toolsmith"]["step"], Value::from(0), "{reply}");
}

/// Logits of a fixed prompt.
fn logits(policy: &Policy) -> tch::Tensor {
    let ids = [5_i64, 17, 99, 3, 42, 8];
    let input = tch::Tensor::from_slice(&ids).view([1, 6]);
    let positions = tch::Tensor::arange(6, (tch::Kind::Int64, tch::Device::Cpu)).unsqueeze(0);
    let model = policy.model();
    tch::no_grad(|| {
        model.logits(&model.forward(&input, &positions, &toolsmith_policy::decoder::AttentionMask::Causal, None))
    })
}

/// A LoRA adapter on the base in `base`, with nonzero `B` (as after training), at `step`.
fn adapted(base: &std::path::Path, step: u64) -> Policy {
    let mut policy = Policy::load(base, f32()).expect("base");
    let config = LoraConfig {
        rank: 4,
        alpha: 8.0,
        dropout: 0.0,
        target_modules: vec!["q_proj".into(), "v_proj".into()],
        layers_to_transform: None,
    };
    policy.add_lora(&config, 1).expect("lora");
    // Deterministic without libtorch's global generator, which tests running at once share.
    for (name, mut var) in policy.trained_variables() {
        if name.contains("lora_B") {
            let values = tch::Tensor::arange(var.numel() as i64, (tch::Kind::Float, tch::Device::Cpu))
                * (0.37 * (step as f64 + 1.0));
            tch::no_grad(|| var.copy_(&(values.sin().view(var.size().as_slice()) * 0.05)));
        }
    }
    policy.state_mut().step = step;
    policy
}

#[test]
fn the_served_policy_swaps_lora_adapters_without_reloading_its_base() {
    tch::set_num_threads(1);
    let runtime = tokio::runtime::Runtime::new().expect("tokio");
    let (url, served) = engine(&runtime, 0);
    let tokenizer = served.lock().expect("served").tokenizer().clone();
    let engine = CompletionsBackend::new(&url, "policy", None, tokenizer).expect("engine");
    let base_storage = |p: &Policy| p.var_store().variables()["model.embed_tokens.weight"].data_ptr() as usize;
    let before = base_storage(&served.lock().expect("served"));
    let dir = tempfile::tempdir().expect("tempdir");
    // Adapters are trained on a copy of the served base (a second `tiny(0)` built while other
    // tests draw from libtorch's generator is not guaranteed to be the same model).
    let (served_base, foreign_base) = (dir.path().join("served-base"), dir.path().join("foreign-base"));
    served.lock().expect("served").save(&served_base).expect("save base");
    Policy::tiny(1, f32()).expect("tiny").save(&foreign_base).expect("save base");

    // An adapter alone (PEFT's files): swapped in, the base's tensors untouched.
    let trained = adapted(&served_base, 3);
    trained.save_adapter(&dir.path().join("adapter")).expect("save adapter");
    let reply = runtime.block_on(engine.update_weights(&dir.path().join("adapter"))).expect("swap");
    assert_eq!(reply["toolsmith"]["step"], 3, "{reply}");
    {
        let served = served.lock().expect("served");
        assert!(served.lora().is_some());
        assert_eq!(base_storage(&served), before, "the base was reloaded");
        assert!((logits(&served) - logits(&trained)).abs().max().double_value(&[]) < 1e-6);
    }
    // A training checkpoint (base + adapter) of the same base: the adapter alone is swapped.
    let later = adapted(&served_base, 5);
    later.save(&dir.path().join("checkpoint")).expect("save checkpoint");
    let reply = runtime.block_on(engine.update_weights(&dir.path().join("checkpoint"))).expect("swap");
    assert_eq!(reply["toolsmith"]["step"], 5, "{reply}");
    {
        let served = served.lock().expect("served");
        assert_eq!(base_storage(&served), before, "the base was reloaded");
        assert!((logits(&served) - logits(&later)).abs().max().double_value(&[]) < 1e-6);
    }
    // An adapter trained on another base is refused; the served adapter stays.
    adapted(&foreign_base, 9).save_adapter(&dir.path().join("foreign")).expect("save adapter");
    let err = runtime.block_on(engine.update_weights(&dir.path().join("foreign"))).expect_err("another base");
    assert!(err.to_string().contains("another base"), "{err}");
    let served = served.lock().expect("served");
    assert_eq!(served.state().step, 5);
    assert!((logits(&served) - logits(&later)).abs().max().double_value(&[]) < 1e-6);
}
