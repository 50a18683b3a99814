//! RL building blocks against numbers worked out by hand.

use serde_json::{Value, json};
use toolsmith_agent::Trajectory;
use toolsmith_policy::tch::{Kind, Tensor};
use toolsmith_train::rl::advantage::{
    GroupNorm, answer_probability, group_advantages, informative, memory_advantages, overlong_penalty, returns_to_go,
    searl_step_advantages,
};
use toolsmith_train::rl::loss::{Aggregation, LossConfig, LossInputs, k3, policy_loss, token_weights};
use toolsmith_train::rl::reward::{self, RewardConfig};

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

fn assert_all_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!(close(*g, *w, tol), "{got:?} vs {want:?}");
    }
}

#[test]
fn grpo_and_dr_grpo_group_advantages() {
    // Mean 0.5; sample std sqrt(4 * 0.25 / 3) = 0.57735.
    let r = [1.0, 0.0, 0.0, 1.0];
    assert_all_close(&group_advantages(&r, GroupNorm::MeanStd), &[0.866025, -0.866025, -0.866025, 0.866025], 1e-5);
    assert_all_close(&group_advantages(&r, GroupNorm::Mean), &[0.5, -0.5, -0.5, 0.5], 1e-12);
    // Equal rewards: zero advantage, no division by zero.
    assert_all_close(&group_advantages(&[0.3; 4], GroupNorm::MeanStd), &[0.0; 4], 1e-12);
    // One episode: nothing to compare with.
    assert_all_close(&group_advantages(&[1.0], GroupNorm::MeanStd), &[0.0], 1e-12);
}

#[test]
fn dynamic_sampling_keeps_groups_whose_rewards_differ() {
    assert!(!informative(&[1.0, 1.0, 1.0]));
    assert!(!informative(&[0.0; 8]));
    assert!(informative(&[0.0, 0.0, 1.0]));
    assert!(!informative(&[1.0]));
}

#[test]
fn discounted_returns_to_go() {
    // G3 = 2, G2 = 0 + 0.5 * 2 = 1, G1 = 1 + 0.5 * 1 = 1.5, G0 = 0 + 0.5 * 1.5 = 0.75.
    assert_all_close(&returns_to_go(&[0.0, 1.0, 0.0, 2.0], 0.5), &[0.75, 1.5, 1.0, 2.0], 1e-12);
    assert!(returns_to_go(&[], 0.9).is_empty());
}

#[test]
fn dapo_soft_overlong_penalty() {
    // 100 allowed, the last 20 a buffer: free up to 80, then a ramp to -1 at 100.
    assert_eq!(overlong_penalty(80, 100, 20), 0.0);
    assert!(close(overlong_penalty(90, 100, 20), -0.5, 1e-12));
    assert!(close(overlong_penalty(100, 100, 20), -1.0, 1e-12));
    assert_eq!(overlong_penalty(101, 100, 20), -1.0);
}

#[test]
fn aggregation_weights() {
    let trained = [2, 4, 0];
    assert_all_close(&token_weights(&trained, Aggregation::TokenMean, 0), &[1.0 / 6.0, 1.0 / 6.0, 0.0], 1e-12);
    // Two sequences with tokens: each sequence's mean, then the mean of the two.
    assert_all_close(&token_weights(&trained, Aggregation::SequenceMean, 0), &[0.25, 0.125, 0.0], 1e-12);
    // Dr. GRPO: a constant normaliser of 10 tokens.
    assert_all_close(&token_weights(&trained, Aggregation::SequenceSumConstant, 10), &[0.05, 0.05, 0.0], 1e-12);
}

fn row(values: &[f64]) -> Tensor {
    Tensor::from_slice(values).to_kind(Kind::Float).view([1, values.len() as i64])
}

/// One sequence of three tokens; the first is the prompt. Token 1's ratio is 1.5, token 2's 0.5.
fn example(advantage: f64) -> (Tensor, Tensor, Tensor, Tensor, Tensor) {
    let old = row(&[0.0, 0.4_f64.ln(), 0.8_f64.ln()]);
    let current = row(&[0.0, 0.6_f64.ln(), 0.4_f64.ln()]).set_requires_grad(true);
    let mask = row(&[0.0, 1.0, 1.0]);
    let advantages = row(&[advantage; 3]);
    let weights = row(&token_weights(&[2], Aggregation::TokenMean, 0).repeat(3));
    (current, old, mask, advantages, weights)
}

#[test]
fn clipped_surrogate_by_hand() {
    let config = LossConfig { clip_low: 0.2, clip_high: 0.28, kl_coef: 0.0, aggregation: Aggregation::TokenMean };
    // A = +1: token 1 is clipped at 1.28 (no gradient), token 2 keeps its ratio 0.5 (the
    // clipped 0.8 would be larger). Loss = -(1.28 + 0.5) / 2 = -0.89.
    let (current, old, mask, adv, w) = example(1.0);
    let inputs = LossInputs { mask: &mask, old_logprobs: &old, ref_logprobs: None, advantages: &adv, weights: &w };
    let (loss, stats) = policy_loss(&current, &inputs, &config);
    assert!(close(loss.double_value(&[]), -0.89, 1e-6), "{}", loss.double_value(&[]));
    assert!(close(stats.clip_fraction(), 0.5, 1e-9));
    assert!(close(stats.ratio(), 1.0, 1e-6));
    loss.backward();
    // d/dlogp of -w * ratio * A is -w * ratio = -0.5 * 0.5 on token 2; 0 on the clipped token.
    let grad = Vec::<f64>::try_from(current.grad().view([-1]).to_kind(Kind::Double)).expect("grad");
    assert_all_close(&grad, &[0.0, 0.0, -0.25], 1e-6);

    // A = -1: token 1 keeps -1.5 (lower than the clipped -1.28), token 2 is clipped at -0.8.
    let (current, old, mask, adv, w) = example(-1.0);
    let inputs = LossInputs { mask: &mask, old_logprobs: &old, ref_logprobs: None, advantages: &adv, weights: &w };
    let (loss, stats) = policy_loss(&current, &inputs, &config);
    assert!(close(loss.double_value(&[]), 1.15, 1e-6), "{}", loss.double_value(&[]));
    assert!(close(stats.clip_fraction(), 0.5, 1e-9));
    loss.backward();
    let grad = Vec::<f64>::try_from(current.grad().view([-1]).to_kind(Kind::Double)).expect("grad");
    assert_all_close(&grad, &[0.0, 0.75, 0.0], 1e-6);
}

#[test]
fn k3_kl_by_hand() {
    // Policy 0.5, reference 0.25: log(ref / cur) = ln 0.5; k3 = 0.5 - ln 0.5 - 1 = 0.193147.
    let kl = k3(&row(&[0.5_f64.ln()]), &row(&[0.25_f64.ln()]));
    assert!(close(kl.double_value(&[0, 0]), 0.5 - 0.5_f64.ln() - 1.0, 1e-6));
    // Equal distributions: zero.
    assert!(close(k3(&row(&[0.3_f64.ln()]), &row(&[0.3_f64.ln()])).double_value(&[0, 0]), 0.0, 1e-7));

    // In the loss: coefficient 0.1 on the token-mean KL, added to the surrogate.
    let config = LossConfig { kl_coef: 0.1, ..LossConfig::default() };
    let (current, old, mask, adv, w) = example(0.0);
    let reference = row(&[0.0, 0.3_f64.ln(), 0.4_f64.ln()]);
    let inputs =
        LossInputs { mask: &mask, old_logprobs: &old, ref_logprobs: Some(&reference), advantages: &adv, weights: &w };
    let (loss, stats) = policy_loss(&current, &inputs, &config);
    // Token 1: ref/cur = 0.5 -> 0.193147; token 2: equal -> 0.
    let want_kl = 0.5 - 0.5_f64.ln() - 1.0;
    assert!(close(stats.kl(), want_kl / 2.0, 1e-6));
    assert!(close(loss.double_value(&[]), 0.1 * want_kl / 2.0, 1e-6));
}

#[test]
fn searl_tool_anchored_step_advantages_with_single_vanishing() {
    // Two episodes, gamma 0.5. Episode 0: [0.1, 0.2, 1.0] -> returns [0.45, 0.7, 1.0];
    // episode 1: [0.1, -0.2] -> returns [0.0, -0.2].
    let rewards = vec![vec![0.1, 0.2, 1.0], vec![0.1, -0.2]];
    let tool = |s: &str| Some(s.to_string());
    let anchors = vec![vec![tool("search"), tool("sum"), None], vec![tool("search"), tool("lookup")]];
    let a = searl_step_advantages(&rewards, &anchors, 0.5, GroupNorm::Mean, true);
    // `search` is used twice: returns 0.45 and 0.0, mean 0.225. `sum` and `lookup` are single:
    // they vanish. The answer turn has no anchor.
    assert_all_close(&a[0], &[0.225, 0.0, 0.0], 1e-12);
    assert_all_close(&a[1], &[-0.225, 0.0], 1e-12);
    // Normalised by the sample std of (0.45, 0.0) = 0.318198: +-0.707107.
    let a = searl_step_advantages(&rewards, &anchors, 0.5, GroupNorm::MeanStd, true);
    assert!(close(a[0][0], 0.707105, 1e-5) && close(a[1][0], -0.707105, 1e-5), "{a:?}");
    // Without single vanishing a lone step keeps its raw return.
    let a = searl_step_advantages(&rewards, &anchors, 0.5, GroupNorm::Mean, false);
    assert_all_close(&a[0], &[0.225, 0.7, 0.0], 1e-12);
    assert_all_close(&a[1], &[-0.225, -0.2], 1e-12);
}

#[test]
fn mempo_memory_advantages_pool_every_mem_of_the_group() {
    // Three memories over two episodes: rewards 0.2, 0.4 and 0.9, mean 0.5.
    let a = memory_advantages(&[vec![0.2, 0.4], vec![0.9]], GroupNorm::Mean);
    assert_all_close(&a[0], &[-0.3, -0.1], 1e-12);
    assert_all_close(&a[1], &[0.4], 1e-12);
    // The answer's probability given a memory: the geometric mean of its token probabilities.
    let p = answer_probability(&[0.5_f64.ln(), 0.125_f64.ln()]);
    assert!(close(p, 0.25, 1e-12), "{p}");
    assert_eq!(answer_probability(&[]), 0.0);
}

fn call(name: &str, arguments: Value, verdict: &str, result: Value) -> Value {
    json!({"name": name, "arguments": arguments, "result": result, "verdict": verdict,
           "latency_ms": 1.0, "started_ms": 0.0, "level": 0})
}

fn step(text: &str, calls: Vec<Value>, errors: &[&str]) -> Value {
    json!({"text": text, "prompt_tokens": 10, "response_tokens": 5, "calls": calls,
           "observation": "", "errors": errors, "model_ms": 1.0})
}

fn trajectory(steps: Vec<Value>, answer: Option<&str>) -> Trajectory {
    serde_json::from_value(json!({
        "question": "q", "mode": "searl", "backend": "test", "steps": steps, "plan": null,
        "answer": answer, "finish": if answer.is_some() { "answered" } else { "budget" },
        "tools": [], "system": "", "wall_ms": 1.0
    }))
    .expect("a trajectory")
}

#[test]
fn searl_rewards_by_hand() {
    let golden = vec!["Paris".to_string()];
    let search = || call("search", json!({"query": "capital"}), "valid", json!({"results": []}));
    let created = call("create_and_execute_mcp", json!({"name": "f"}), "valid", json!({"creation_success": true}));
    let failed = call("create_and_execute_mcp", json!({"name": "g"}), "failed", json!({"creation_success": false}));
    let t = trajectory(
        vec![
            // A plan that parses (+0.1), well-formed (+0.1), one valid call (+0.1).
            step(
                "<plan>\nTask 1: find the capital - Dependencies: none\n</plan><tool_call>{}</tool_call>",
                vec![search()],
                &[],
            ),
            // The same search again (-0.2), and a tool created (+0.1): all calls valid (+0.1), format +0.1.
            step("<tool_call>{}</tool_call>", vec![search(), created], &[]),
            // A failed creation (-0.3), malformed (-0.1), not all calls valid.
            step("<tool_call>", vec![failed], &["unclosed <tool_call>"]),
            // The answer: format +0.1, outcome +1.
            step("<answer>Paris</answer>", vec![], &[]),
        ],
        Some("Paris"),
    );
    let r = reward::searl(&t, &golden, &RewardConfig::default());
    assert_all_close(&r.steps, &[0.3, 0.1, -0.4, 1.1], 1e-12);
    assert!(close(r.total, 1.1, 1e-12) && r.outcome == 1.0, "{r:?}");

    // GAP: the outcome alone; a wrong or missing answer is 0.
    assert_eq!(reward::gap(&t, &golden).total, 1.0);
    assert_eq!(
        reward::gap(&trajectory(vec![step("<answer>Rome</answer>", vec![], &[])], Some("Rome")), &golden).total,
        0.0
    );
    assert_eq!(reward::gap(&trajectory(vec![step("<think>x</think>", vec![], &[])], None), &golden).total, 0.0);
    // MemPO: right answer but a malformed turn on the way: 0.
    assert_eq!(reward::mempo(&t, &golden).total, 0.0);
}

#[test]
fn mtr_tiers_and_repetition_penalty_by_hand() {
    let golden = vec!["Paris".to_string()];
    let config = RewardConfig::default();
    let search = || call("search", json!({"query": "capital"}), "valid", json!({"results": []}));
    let answer = |think: &str, answer: &str| {
        trajectory(
            vec![
                step("<tool_call>{}</tool_call>", vec![search()], &[]),
                step(&format!("<think>{think}</think><answer>{answer}</answer>"), vec![], &[]),
            ],
            Some(answer),
        )
    };
    // Reasoning and answer agree and are right.
    assert!(close(reward::mtr(&answer("so it is Paris.", "Paris"), &golden, &config).total, 1.0, 1e-12));
    // The answer is right, the reasoning never said it.
    assert!(close(reward::mtr(&answer("done", "Paris"), &golden, &config).total, 0.6, 1e-12));
    // The reasoning found it, the answer is wrong.
    assert!(close(reward::mtr(&answer("Paris it is", "Rome"), &golden, &config).total, 0.3, 1e-12));
    assert_eq!(reward::mtr(&answer("hmm", "Rome"), &golden, &config).total, 0.0);
    // Seven identical calls: six repeats at 0.1, capped at 0.5.
    let repeated = trajectory(
        vec![
            step("<tool_call>{}</tool_call>", (0..7).map(|_| search()).collect(), &[]),
            step("<think>Paris</think><answer>Paris</answer>", vec![], &[]),
        ],
        Some("Paris"),
    );
    assert!(close(reward::mtr(&repeated, &golden, &config).total, 0.5, 1e-12));
}

fn tiny_rl(
    out: &std::path::Path,
    iterations: u64,
    resume: bool,
) -> Result<toolsmith_train::rl::RlTrainer, toolsmith_train::TrainError> {
    tiny_rl_with(out, iterations, resume, toolsmith_train::rl::Method::Searl)
}

fn tiny_rl_with(
    out: &std::path::Path,
    iterations: u64,
    resume: bool,
    method: toolsmith_train::rl::Method,
) -> Result<toolsmith_train::rl::RlTrainer, toolsmith_train::TrainError> {
    use std::sync::Arc;
    use toolsmith_agent::env::Corpus;
    use toolsmith_agent::tools::{Executor, LocalTools};
    use toolsmith_train::config::{EvalConfig, WorldsData};
    use toolsmith_train::rl::{RlConfig, RlTrainer};
    let tools = |corpus: Arc<Corpus>| -> Arc<dyn Executor> { Arc::new(LocalTools::new().with_corpus(corpus)) };
    let base = RlConfig::for_method(method);
    let config = RlConfig {
        worlds: WorldsData { seeds: vec![5, 6], countries: 2, tasks_per_family: 1, styles: vec![method.mode()] },
        eval: Some(EvalConfig {
            world_seed: 77,
            countries: 2,
            tasks_per_family: 1,
            modes: vec![method.mode()],
            max_turns: 2,
            max_tokens: 16,
            parallel: 2,
        }),
        iterations,
        tasks_per_iteration: 2,
        group_size: 3,
        max_turns: 2,
        max_tokens: 24,
        lr: 1e-3,
        threads: 1,
        device: "cpu".into(),
        checkpoint_every: 1,
        ..base
    };
    RlTrainer::prepare(config, out, resume, &tools)
}

#[test]
fn an_rl_run_trains_checkpoints_and_resumes() {
    use toolsmith_train::metrics::{Record, read};
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("run");
    let before = {
        let trainer = tiny_rl(&out, 2, false).expect("prepare");
        let p = trainer.policy();
        let policy = p.lock().expect("policy");
        policy.var_store().variables().values().map(|t| t.abs().sum(Kind::Double).double_value(&[])).sum::<f64>()
    };
    let mut trainer = tiny_rl(&out, 2, false).expect("prepare");
    trainer.run(&mut |_| {}).expect("trains");
    let records = read(&out.join("metrics.jsonl")).expect("metrics");
    let iterations: Vec<_> =
        records.iter().filter_map(|r| if let Record::Iteration(m) = r { Some(m.clone()) } else { None }).collect();
    assert_eq!(iterations.len(), 2);
    for m in &iterations {
        // Two tasks of three episodes each; SEARL's format rewards make rewards differ.
        assert_eq!(m.episodes, 6, "{m:?}");
        assert!(m.groups >= 1 && m.loss.is_finite() && m.kl >= 0.0, "{m:?}");
        assert!(m.entropy > 0.0, "{m:?}");
    }
    assert_eq!(records.iter().filter(|r| matches!(r, Record::Eval(_))).count(), 2);
    // The weights moved.
    let after = {
        let p = trainer.policy();
        let policy = p.lock().expect("policy");
        policy.var_store().variables().values().map(|t| t.abs().sum(Kind::Double).double_value(&[])).sum::<f64>()
    };
    assert!((after - before).abs() > 1e-6, "{before} -> {after}");
    assert!(out.join("final/config.json").exists());
    // A second run in the same directory must resume or go elsewhere.
    let err = tiny_rl(&out, 3, false).expect_err("refused").to_string();
    assert!(err.contains("--resume"), "{err}");
    // Resumed with one more iteration: it continues from the checkpoint of iteration 2.
    let mut resumed = tiny_rl(&out, 3, true).expect("resume");
    assert_eq!(resumed.state().step, 2);
    resumed.run(&mut |_| {}).expect("resumes");
    let records = read(&out.join("metrics.jsonl")).expect("metrics");
    let numbers: Vec<u64> =
        records.iter().filter_map(|r| if let Record::Iteration(m) = r { Some(m.iteration) } else { None }).collect();
    assert_eq!(numbers, vec![1, 2, 3]);
    // SEARL's tool graph: the run's registry, a snapshot in every checkpoint, sound after resume.
    let latest = std::fs::read_to_string(out.join("checkpoints/latest")).expect("latest");
    assert!(out.join("checkpoints").join(latest.trim()).join("registry.db").exists());
    let mut registry = toolsmith_registry::Registry::open(&out.join("registry.db")).expect("registry");
    assert!(registry.get("search").is_ok(), "the world's tools seed the graph");
    let report = registry.doctor().expect("doctor");
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    let last = read(&out.join("metrics.jsonl"))
        .expect("metrics")
        .into_iter()
        .filter_map(|r| if let Record::Iteration(m) = r { Some(m) } else { None })
        .next_back()
        .expect("an iteration");
    assert!(last.graph_tools >= 1, "{last:?}");
}

#[test]
fn mtr_rollouts_call_simulated_tools_while_evaluation_uses_the_real_ones() {
    use serde_json::json;
    use toolsmith_contract::ToolKind;
    use toolsmith_train::metrics::{Record, read};
    use toolsmith_train::rl::Method;
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("run");
    let mut trainer = tiny_rl_with(&out, 1, false, Method::Mtr).expect("prepare");
    let tools = trainer.training_tools(0).expect("a training world");
    let manifests = tools.manifests();
    assert!(manifests.iter().any(|m| m.name.as_str() == "search"), "{manifests:?}");
    assert!(manifests.iter().all(|m| m.kind == ToolKind::Simulated), "{manifests:?}");
    // The frozen starting policy answers under the tool's output schema: a made-up result that
    // validates, not the corpus's articles.
    let runtime = tokio::runtime::Runtime::new().expect("tokio");
    let answer = runtime.block_on(tools.call("search", &json!({"query": "anything"})));
    let value = answer.value.expect("a simulated result validates");
    assert!(value.get("results").is_some_and(serde_json::Value::is_array), "{value}");
    trainer.run(&mut |_| {}).expect("trains");
    let records = read(&out.join("metrics.jsonl")).expect("metrics");
    assert_eq!(records.iter().filter(|r| matches!(r, Record::Iteration(_))).count(), 1);
    assert_eq!(records.iter().filter(|r| matches!(r, Record::Eval(_))).count(), 2);
    assert!(!out.join("registry.db").exists(), "MTR grows no tool graph");
}
