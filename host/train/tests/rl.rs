//! RL building blocks against numbers worked out by hand.

use serde_json::{Value, json};
use toolsmith_agent::Trajectory;
use toolsmith_policy::tch::{Kind, Tensor};
use toolsmith_train::rl::advantage::{
    GroupNorm, answer_probability, group_advantages, informative, memory_advantages, overlong_penalty, returns_to_go,
    searl_step_advantages,
};
use toolsmith_train::rl::loss::{Aggregation, LossConfig, LossInputs, k3, policy_loss, token_weights};
use toolsmith_train::rl::method;
use toolsmith_train::rl::reward::RewardConfig;
use toolsmith_train::{DeviceChoice, PrecisionChoice, RunSettings};

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
    // Population std (SEARL's equation 4): sqrt(4 * 0.25 / 4) = 0.5.
    assert_all_close(&group_advantages(&r, GroupNorm::MeanStdPopulation), &[1.0, -1.0, -1.0, 1.0], 1e-5);
    // Equal rewards: zero advantage, no division by zero.
    assert_all_close(&group_advantages(&[0.3; 4], GroupNorm::MeanStd), &[0.0; 4], 1e-12);
    // One episode: nothing to compare with.
    assert_all_close(&group_advantages(&[1.0], GroupNorm::MeanStd), &[0.0], 1e-12);
    // Equal up to rounding (-0.1 - 0.1 against 0.1 - 0.3): exactly 0, where (r - mean) / (std +
    // eps) gave +-1.1e-11 for Adam to turn into a step.
    let rounded = [-0.1 - 0.1, 0.1 - 0.3, -0.1 - 0.1];
    assert_ne!(rounded[0], rounded[1]);
    for norm in [GroupNorm::MeanStd, GroupNorm::MeanStdPopulation, GroupNorm::Mean] {
        assert_eq!(group_advantages(&rounded, norm), vec![0.0; 3], "{norm:?}");
    }
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
    let episodes = [0, 1, 2];
    let weights = |aggregation, constant| token_weights(&trained, &episodes, aggregation, constant);
    assert_all_close(&weights(Aggregation::TokenMean, 0), &[1.0 / 6.0, 1.0 / 6.0, 0.0], 1e-12);
    // Two episodes with tokens: each episode's mean, then the mean of the two.
    assert_all_close(&weights(Aggregation::SequenceMean, 0), &[0.25, 0.125, 0.0], 1e-12);
    // Dr. GRPO: a constant normaliser of 10 tokens.
    assert_all_close(&weights(Aggregation::SequenceSumConstant, 10), &[0.05, 0.05, 0.0], 1e-12);
    // A MemPO episode is a sequence per turn: episode 7's two turns (2 and 4 tokens) are one
    // response of 6 tokens, weighted as episode 3's single turn of 2, not as two responses.
    let (trained, episodes) = ([2, 4, 2, 0], [7, 7, 3, 3]);
    let weights = |aggregation, constant| token_weights(&trained, &episodes, aggregation, constant);
    assert_all_close(&weights(Aggregation::SequenceMean, 0), &[1.0 / 12.0, 1.0 / 12.0, 0.25, 0.0], 1e-12);
    assert_all_close(&weights(Aggregation::SequenceSumConstant, 10), &[0.05, 0.05, 0.05, 0.0], 1e-12);
    assert_all_close(&weights(Aggregation::TokenMean, 0), &[0.125, 0.125, 0.125, 0.0], 1e-12);
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
    let weights = row(&token_weights(&[2], &[0], Aggregation::TokenMean, 0).repeat(3));
    (current, old, mask, advantages, weights)
}

#[test]
fn clipped_surrogate_by_hand() {
    let config = LossConfig {
        clip_low: 0.2,
        clip_high: 0.28,
        kl_coef: 0.0,
        aggregation: Aggregation::TokenMean,
        ..LossConfig::default()
    };
    // A = +1: token 1 is clipped at 1.28 (no gradient), token 2 keeps its ratio 0.5 (the
    // clipped 0.8 would be larger). Loss = -(1.28 + 0.5) / 2 = -0.89.
    let (current, old, mask, adv, w) = example(1.0);
    let inputs = LossInputs {
        mask: &mask,
        old_logprobs: &old,
        ref_logprobs: None,
        advantages: &adv,
        weights: &w,
        importance: None,
    };
    let (loss, stats) = policy_loss(&current, &inputs, &config);
    assert!(close(loss.double_value(&[]), -0.89, 1e-6), "{}", loss.double_value(&[]));
    assert!(close(stats.clip_fraction(), 0.5, 1e-9));
    assert!(close(stats.ratio(), 1.0, 1e-6));
    // Drift from the sampler, k3 per token: 0.4/0.6 - ln(0.4/0.6) - 1 and 0.8/0.4 - ln 2 - 1,
    // measured though the loss has no KL term.
    let drift = (0.4 / 0.6 - (0.4_f64 / 0.6).ln() - 1.0 + 1.0 - 2.0_f64.ln()) / 2.0;
    assert!(close(stats.drift(), drift, 1e-6), "{} vs {drift}", stats.drift());
    assert_eq!(stats.kl_sum, 0.0);
    loss.backward();
    // d/dlogp of -w * ratio * A is -w * ratio = -0.5 * 0.5 on token 2; 0 on the clipped token.
    let grad = Vec::<f64>::try_from(current.grad().view([-1]).to_kind(Kind::Double)).expect("grad");
    assert_all_close(&grad, &[0.0, 0.0, -0.25], 1e-6);

    // A = -1: token 1 keeps -1.5 (lower than the clipped -1.28), token 2 is clipped at -0.8.
    let (current, old, mask, adv, w) = example(-1.0);
    let inputs = LossInputs {
        mask: &mask,
        old_logprobs: &old,
        ref_logprobs: None,
        advantages: &adv,
        weights: &w,
        importance: None,
    };
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
    let inputs = LossInputs {
        mask: &mask,
        old_logprobs: &old,
        ref_logprobs: Some(&reference),
        advantages: &adv,
        weights: &w,
        importance: None,
    };
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
    // By the population std, as SEARL's equation 6 (0.225): +-1. SEARL's defaults take it; the
    // other methods keep GRPO's sample std.
    let a = searl_step_advantages(&rewards, &anchors, 0.5, GroupNorm::MeanStdPopulation, true);
    assert!(close(a[0][0], 1.0, 1e-5) && close(a[1][0], -1.0, 1e-5), "{a:?}");
    use toolsmith_train::rl::{Method, RlConfig};
    assert_eq!(RlConfig::for_method(Method::SEARL).group_norm, GroupNorm::MeanStdPopulation);
    assert_eq!(RlConfig::for_method(Method::GAP).group_norm, GroupNorm::MeanStd);
    // Without single vanishing a lone step keeps its raw return.
    let a = searl_step_advantages(&rewards, &anchors, 0.5, GroupNorm::Mean, false);
    assert_all_close(&a[0], &[0.225, 0.7, 0.0], 1e-12);
    assert_all_close(&a[1], &[-0.225, -0.2], 1e-12);
}

#[test]
fn mempo_memory_advantages_pool_every_mem_of_the_group() {
    // Three memories over two episodes: rewards 0.2, 0.4 and 0.9, mean 0.5.
    let a = memory_advantages(&[vec![Some(0.2), Some(0.4)], vec![Some(0.9)]], GroupNorm::Mean);
    assert_all_close(&a[0], &[-0.3, -0.1], 1e-12);
    assert_all_close(&a[1], &[0.4], 1e-12);
    // The answer's probability given a memory: the geometric mean of its token probabilities.
    let p = answer_probability(&[0.5_f64.ln(), 0.125_f64.ln()]);
    assert!(close(p, 0.25, 1e-12), "{p}");
    assert_eq!(answer_probability(&[]), 0.0);
}

#[test]
fn mempo_turns_without_a_memory_stay_out_of_the_pool() {
    // Memories 0.2, 0.6 and 1.0 (mean 0.6) and two turns that wrote none. Were those counted as
    // 0, the mean would be 0.36 and every advantage would shift; they get no memory term.
    let rewards = [vec![Some(0.2), None], vec![Some(0.6), None, Some(1.0)]];
    let a = memory_advantages(&rewards, GroupNorm::Mean);
    assert_all_close(&a[0], &[-0.4, 0.0], 1e-12);
    assert_all_close(&a[1], &[0.0, 0.0, 0.4], 1e-12);
    // GRPO's normalisation over the same pool: std of (0.2, 0.6, 1.0) is 0.4.
    let a = memory_advantages(&rewards, GroupNorm::MeanStd);
    assert_all_close(&a[0], &[-1.0, 0.0], 1e-5);
    assert_all_close(&a[1], &[0.0, 0.0, 1.0], 1e-5);
    // A group with no memory at all has no memory advantage.
    assert_all_close(&memory_advantages(&[vec![None, None]], GroupNorm::MeanStd)[0], &[0.0, 0.0], 0.0);
}

#[test]
fn k3_is_bounded_and_k1_k2_by_hand() {
    use toolsmith_train::rl::loss::{K3_BOUND, KlEstimator, kl};
    // log p - log ref = 25 (the reference finds the token e^25 times less likely): unclamped k3
    // would be e^-25 + 25 - 1 = 24; the other way round, e^25 - 26 = 7.2e10. Both are bounded.
    let (cur, reference) = (row(&[0.0, -25.0]), row(&[-25.0, 0.0]));
    let k = Vec::<f64>::try_from(kl(&cur, &reference, KlEstimator::K3).view([-1]).to_kind(Kind::Double)).expect("k3");
    assert_all_close(&k, &[K3_BOUND, K3_BOUND], 1e-6);
    // k1 = log-ratio, k2 = log-ratio^2 / 2, unbounded.
    let (cur, reference) = (row(&[0.5_f64.ln()]), row(&[0.25_f64.ln()]));
    let k1 = kl(&cur, &reference, KlEstimator::K1).double_value(&[0, 0]);
    let k2 = kl(&cur, &reference, KlEstimator::K2).double_value(&[0, 0]);
    assert!(close(k1, 2.0_f64.ln(), 1e-6) && close(k2, 0.5 * 2.0_f64.ln().powi(2), 1e-6), "{k1} {k2}");
    // In the loss one runaway token costs at most kl_coef * 10 * its weight.
    let config = LossConfig { kl_coef: 0.5, ..LossConfig::default() };
    let (current, old, mask, adv, w) = example(0.0);
    let far = row(&[0.0, 0.5_f64.ln() - 30.0, 0.4_f64.ln()]);
    let inputs = LossInputs {
        mask: &mask,
        old_logprobs: &old,
        ref_logprobs: Some(&far),
        advantages: &adv,
        weights: &w,
        importance: None,
    };
    let (loss, stats) = policy_loss(&current, &inputs, &config);
    assert!(close(stats.kl_sum, K3_BOUND, 1e-5), "{stats:?}");
    assert!(close(loss.double_value(&[]), 0.5 * K3_BOUND / 2.0, 1e-5), "{}", loss.double_value(&[]));
}

#[test]
fn truncated_importance_weights_scale_the_policy_term() {
    // As clipped_surrogate_by_hand's A = +1 case (-(1.28 + 0.5) / 2), with token 1 weighted 0.5
    // and token 2 weighted 2 (a capped TIS weight): -(0.5 * 1.28 + 2 * 0.5) / 2 = -0.82.
    let config = LossConfig { clip_low: 0.2, clip_high: 0.28, ..LossConfig::default() };
    let (current, old, mask, adv, w) = example(1.0);
    let importance = row(&[0.0, 0.5, 2.0]);
    let inputs = LossInputs {
        mask: &mask,
        old_logprobs: &old,
        ref_logprobs: None,
        advantages: &adv,
        weights: &w,
        importance: Some(&importance),
    };
    let (loss, _) = policy_loss(&current, &inputs, &config);
    assert!(close(loss.double_value(&[]), -0.82, 1e-6), "{}", loss.double_value(&[]));
}

#[test]
fn dynamic_sampling_judges_groups_by_accuracy_not_shaped_totals() {
    use toolsmith_train::rl::advantage::keeps_group;
    use toolsmith_train::rl::reward::EpisodeReward;
    let r = |outcome: f64, penalty: f64| EpisodeReward { total: outcome + penalty, outcome, steps: Vec::new() };
    // All wrong, lengths differ (an overlong penalty on one): the totals differ but the group
    // only teaches brevity; DAPO drops it.
    assert!(!keeps_group(&[r(0.0, 0.0), r(0.0, -0.5), r(0.0, 0.0)]));
    // All right, one of them overlong: dropped too.
    assert!(!keeps_group(&[r(1.0, -1.0), r(1.0, 0.0)]));
    // Right and wrong: kept.
    assert!(keeps_group(&[r(1.0, 0.0), r(0.0, 0.0)]));
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
    let r = method::searl::reward(&t, &golden, &RewardConfig::default());
    assert_all_close(&r.steps, &[0.3, 0.1, -0.4, 1.1], 1e-12);
    assert!(close(r.total, 1.1, 1e-12) && r.outcome == 1.0, "{r:?}");
    // SEARL's own defaults take a quarter of each step term (the format penalty with it; the
    // repeat and failed-creation penalties whole): five planned, well-formed turns of valid new
    // calls that never answer earn 5 x 0.075 = 0.375, not 1.5, well below a right answer's 1.
    let searl = toolsmith_train::rl::RlConfig::for_method(toolsmith_train::rl::Method::SEARL).rewards;
    let r = method::searl::reward(&t, &golden, &searl);
    assert_all_close(&r.steps, &[0.075, -0.125, -0.325, 1.025], 1e-12);
    let calling = |i: usize| {
        let search = call("search", json!({"query": format!("capital {i}")}), "valid", json!({"results": []}));
        step(
            "<plan>\nTask 1: find the capital - Dependencies: none\n</plan><tool_call>{}</tool_call>",
            vec![search],
            &[],
        )
    };
    let stalling = trajectory((0..5).map(calling).collect(), None);
    assert!(close(method::searl::reward(&stalling, &golden, &searl).total, 0.375, 1e-12));
    assert!(close(method::searl::reward(&stalling, &golden, &RewardConfig::default()).total, 1.5, 1e-12));
    // Writing again a tool the listing names (one the graph admitted) earns no creation reward:
    // the second turn's 0.1 becomes 0.0 at full rewards, -0.125 becomes -0.15 at SEARL's.
    let mut listed = t.clone();
    listed.tools = vec!["search".into(), "f".into()];
    assert_all_close(
        &method::searl::reward(&listed, &golden, &RewardConfig::default()).steps,
        &[0.3, 0.0, -0.4, 1.1],
        1e-12,
    );
    assert_all_close(&method::searl::reward(&listed, &golden, &searl).steps, &[0.075, -0.15, -0.325, 1.025], 1e-12);

    // GAP: the outcome alone; a wrong or missing answer is 0.
    let binary = RewardConfig::default();
    assert_eq!(method::gap::reward(&t, &golden, &binary).total, 1.0);
    assert_eq!(
        method::gap::reward(
            &trajectory(vec![step("<answer>Rome</answer>", vec![], &[])], Some("Rome")),
            &golden,
            &binary
        )
        .total,
        0.0
    );
    assert_eq!(
        method::gap::reward(&trajectory(vec![step("<think>x</think>", vec![], &[])], None), &golden, &binary).total,
        0.0
    );
    // With objective credit, answering one of three listed questions earns a third (binary: 0);
    // an exact answer still earns 1, and an episode that never answers 0.
    let partial = RewardConfig { objective_credit: true, ..RewardConfig::default() };
    let three = vec!["2535928; Quilu; Rosne".to_string()];
    let first_only = trajectory(vec![step("<answer>2535928</answer>", vec![], &[])], Some("2535928"));
    assert_eq!(method::gap::reward(&first_only, &three, &binary).total, 0.0);
    let r = method::gap::reward(&first_only, &three, &partial);
    assert!(close(r.total, 1.0 / 3.0, 1e-12) && r.outcome == r.total, "{r:?}");
    let all =
        trajectory(vec![step("<answer>Rosne; 2535928; quilu</answer>", vec![], &[])], Some("Rosne; 2535928; quilu"));
    assert_eq!(method::gap::reward(&all, &three, &partial).total, 1.0);
    let unanswered = trajectory(vec![step("<think>x</think>", vec![], &[])], None);
    assert_eq!(method::gap::reward(&unanswered, &three, &partial).total, 0.0);
    // MemPO: right answer but a malformed turn on the way: 0.
    assert_eq!(method::mempo::reward(&t, &golden).total, 0.0);
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
    assert!(close(method::mtr::reward(&answer("so it is Paris.", "Paris"), &golden, &config).total, 1.0, 1e-12));
    // The answer is right, the reasoning never said it.
    assert!(close(method::mtr::reward(&answer("done", "Paris"), &golden, &config).total, 0.6, 1e-12));
    // The reasoning found it, the answer is wrong.
    assert!(close(method::mtr::reward(&answer("Paris it is", "Rome"), &golden, &config).total, 0.3, 1e-12));
    assert_eq!(method::mtr::reward(&answer("hmm", "Rome"), &golden, &config).total, 0.0);
    // Seven identical calls: six repeats at 0.1, capped at 0.5.
    let repeated = trajectory(
        vec![
            step("<tool_call>{}</tool_call>", (0..7).map(|_| search()).collect(), &[]),
            step("<think>Paris</think><answer>Paris</answer>", vec![], &[]),
        ],
        Some("Paris"),
    );
    assert!(close(method::mtr::reward(&repeated, &golden, &config).total, 0.5, 1e-12));
}

/// Test methods whose rewards an untrained tiny model's episodes do (or only seem to) differ on.
/// Under the papers' rewards every episode of a random model scores the same (every turn
/// malformed, no answer): its advantages are all 0 and no gradient flows, so the tests that an
/// update trains what it should, and only that, use these.
mod probes {
    use toolsmith_agent::{Mode, Trajectory};
    use toolsmith_train::TrainError;
    use toolsmith_train::rl::RlConfig;
    use toolsmith_train::rl::method::{
        CreditAssignment, CreditContext, GroupView, Method, MethodSpec, TurnCredit, episode_credit,
    };
    use toolsmith_train::rl::reward::EpisodeReward;

    fn sampled(episode: &Trajectory) -> Vec<i64> {
        episode.steps.iter().filter_map(|s| s.tokens.as_ref()).flat_map(|t| t.output_ids.iter().copied()).collect()
    }

    fn grpo(group: &GroupView<'_>, context: &CreditContext<'_>) -> Result<Vec<Vec<TurnCredit>>, TrainError> {
        Ok(episode_credit(group, context.config.group_norm))
    }

    fn unchanged(config: RlConfig) -> RlConfig {
        config
    }

    /// The share of even ids among the tokens the episode sampled: it differs between episodes.
    struct EvenTokens;

    impl CreditAssignment for EvenTokens {
        fn reward(&self, episode: &Trajectory, _: &[String], _: &RlConfig) -> EpisodeReward {
            let ids = sampled(episode);
            let even = ids.iter().filter(|&&id| id % 2 == 0).count() as f64 / ids.len().max(1) as f64;
            EpisodeReward { total: even, outcome: even, steps: Vec::new() }
        }

        fn credit(&self, g: &GroupView<'_>, c: &CreditContext<'_>) -> Result<Vec<Vec<TurnCredit>>, TrainError> {
            grpo(g, c)
        }
    }

    /// 0.1 + 0.2 or 0.3 by the parity of the sum of the sampled ids: equal but for rounding.
    struct RoundingOnly;

    impl CreditAssignment for RoundingOnly {
        fn reward(&self, episode: &Trajectory, _: &[String], _: &RlConfig) -> EpisodeReward {
            let total = if sampled(episode).iter().sum::<i64>() % 2 == 0 { 0.1 + 0.2 } else { 0.3 };
            EpisodeReward { total, outcome: total, steps: Vec::new() }
        }

        fn credit(&self, g: &GroupView<'_>, c: &CreditContext<'_>) -> Result<Vec<Vec<TurnCredit>>, TrainError> {
            grpo(g, c)
        }
    }

    static EVEN_TOKENS: MethodSpec = MethodSpec {
        name: "even-tokens",
        aliases: &[],
        summary: "A test's: the share of even token ids sampled.",
        mode: Mode::React,
        defaults: unchanged,
        assign: &EvenTokens,
    };

    static ROUNDING_ONLY: MethodSpec = MethodSpec {
        name: "rounding-only",
        aliases: &[],
        summary: "A test's: rewards equal up to rounding.",
        mode: Mode::React,
        defaults: unchanged,
        assign: &RoundingOnly,
    };

    pub const EVEN: Method = Method::from_spec(&EVEN_TOKENS);
    pub const ROUNDING: Method = Method::from_spec(&ROUNDING_ONLY);
}

fn tiny_rl(
    out: &std::path::Path,
    iterations: u64,
    resume: bool,
) -> Result<toolsmith_train::rl::RlTrainer, toolsmith_train::TrainError> {
    tiny_rl_with(out, iterations, resume, toolsmith_train::rl::Method::SEARL, |_| {})
}

fn tiny_rl_with(
    out: &std::path::Path,
    iterations: u64,
    resume: impl Into<toolsmith_train::Resume>,
    method: toolsmith_train::rl::Method,
    edit: impl FnOnce(&mut toolsmith_train::rl::RlConfig),
) -> Result<toolsmith_train::rl::RlTrainer, toolsmith_train::TrainError> {
    use std::sync::Arc;
    use toolsmith_agent::env::Corpus;
    use toolsmith_agent::tools::{Executor, LocalTools};
    use toolsmith_train::config::{EvalConfig, WorldsData};
    use toolsmith_train::rl::{RlConfig, RlTrainer};
    let tools = |corpus: Arc<Corpus>| -> Arc<dyn Executor> { Arc::new(LocalTools::new().with_corpus(corpus)) };
    let base = RlConfig::for_method(method);
    let mut config = RlConfig {
        worlds: WorldsData {
            seeds: vec![5, 6],
            countries: 2,
            tasks_per_family: 1,
            styles: vec![method.mode()],
            ..WorldsData::default()
        },
        eval: Some(EvalConfig {
            world_seed: 77,
            countries: 2,
            tasks_per_family: 1,
            modes: vec![method.mode()],
            max_turns: 2,
            max_tokens: 16,
            parallel: 2,
            before: true,
        }),
        iterations,
        tasks_per_iteration: 2,
        group_size: 3,
        max_turns: 2,
        max_tokens: 24,
        lr: 1e-3,
        checkpoint_every: 1,
        run: RunSettings { threads: 1, device: DeviceChoice::Cpu, ..base.run.clone() },
        ..base
    };
    // The method's overlong buffer, scaled to this short budget.
    config.overlong_cache = config.overlong_cache.min(config.max_tokens / 4);
    edit(&mut config);
    RlTrainer::prepare(config, out, resume, &tools)
}

#[test]
fn an_update_moves_the_weights_where_rewards_differ_and_not_for_rounding() {
    let dir = tempfile::tempdir().expect("tempdir");
    let weights = |trainer: &toolsmith_train::rl::RlTrainer| -> Vec<(String, Tensor)> {
        let p = trainer.policy();
        let policy = p.lock().expect("policy");
        let mut all: Vec<_> = policy.var_store().variables().into_iter().collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all.into_iter().map(|(n, t)| (n, t.copy())).collect()
    };
    let mut moved = Vec::new();
    for method in [probes::EVEN, probes::ROUNDING] {
        let out = dir.path().join(method.name());
        let mut trainer = tiny_rl_with(&out, 1, false, method, |c| {
            c.eval = None;
            // A KL term too: at the first step it must be exactly 0 as well.
            c.loss.kl_coef = 0.1;
        })
        .expect("prepare");
        let before = weights(&trainer);
        trainer.run(&mut |_| {}).expect("trains");
        let after = weights(&trainer);
        let largest =
            before.iter().zip(&after).map(|((_, a), (_, b))| (a - b).abs().max().double_value(&[])).fold(0.0, f64::max);
        moved.push(largest);
    }
    // Rewards that differ move the weights by about the learning rate (Adam's first step);
    // rewards equal up to rounding leave them bit for bit.
    assert!(moved[0] > 1e-4, "{moved:?}");
    assert_eq!(moved[1], 0.0, "{moved:?}");
}

#[test]
fn a_resumed_run_repeats_the_updates_of_an_uninterrupted_one() {
    use toolsmith_train::metrics::{IterationMetrics, Record, read};
    // With rewards that differ, so that every iteration moves the weights: one run of three
    // iterations, and one stopped after the first and resumed from its checkpoint.
    let dir = tempfile::tempdir().expect("tempdir");
    let iterations = |out: &std::path::Path| -> Vec<IterationMetrics> {
        read(&out.join("metrics.jsonl"))
            .expect("metrics")
            .into_iter()
            .filter_map(|r| if let Record::Iteration(m) = r { Some(m) } else { None })
            .collect()
    };
    let quiet = |c: &mut toolsmith_train::rl::RlConfig| c.eval = None;
    let straight = dir.path().join("straight");
    tiny_rl_with(&straight, 3, false, probes::EVEN, quiet).expect("prepare").run(&mut |_| {}).expect("trains");
    let stopped = dir.path().join("stopped");
    tiny_rl_with(&stopped, 1, false, probes::EVEN, quiet).expect("prepare").run(&mut |_| {}).expect("trains");
    let mut resumed = tiny_rl_with(&stopped, 3, true, probes::EVEN, quiet).expect("resume");
    assert_eq!(resumed.state().step, 1);
    resumed.run(&mut |_| {}).expect("resumes");
    let (a, b) = (iterations(&straight), iterations(&stopped));
    assert_eq!(a.len(), 3);
    assert_eq!(b.len(), 3);
    // A cut turn wrote the whole 24-token budget, so the cut ones alone cannot outnumber what
    // was written; the untrained tiny model rarely stops on its own.
    for m in &a {
        assert!(m.cut_turns > 0.0 && m.cut_turns <= 1.0, "{m:?}");
        assert!(m.cut_turns * m.turns * 24.0 <= m.response_tokens + 1e-9, "{m:?}");
    }
    for (x, y) in a.iter().zip(&b) {
        assert!(x.grad_norm > 0.0, "{x:?}");
        for (name, u, v) in [
            ("reward", x.reward, y.reward),
            ("loss", x.loss, y.loss),
            ("kl", x.kl, y.kl),
            ("grad_norm", x.grad_norm, y.grad_norm),
        ] {
            assert!((u - v).abs() <= 1e-6 * u.abs().max(1e-3), "iteration {}: {name} {u} vs {v}", x.iteration);
        }
    }
}

#[test]
fn before_the_first_step_the_policy_matches_its_reference_bit_for_bit() {
    use toolsmith_train::metrics::{Record, read};
    // The reference's log-probs and the trained ones come from the same micro-batches, so before
    // any step the KL between them is exactly 0 however the batch is split. Scored in another
    // order (other padding) they differed by rounding (KL 3e-7), and Adam turned that noise into
    // a full-size step, different in every process.
    let dir = tempfile::tempdir().expect("tempdir");
    for tokens in [256, 1024, 8192] {
        let out = dir.path().join(format!("mb-{tokens}"));
        let mut trainer = tiny_rl_with(&out, 1, false, toolsmith_train::rl::Method::SEARL, |c| {
            c.eval = None;
            c.micro_batch_tokens = tokens;
        })
        .expect("prepare");
        trainer.run(&mut |_| {}).expect("trains");
        let records = read(&out.join("metrics.jsonl")).expect("metrics");
        let kl: Vec<f64> =
            records.iter().filter_map(|r| if let Record::Iteration(m) = r { Some(m.kl) } else { None }).collect();
        assert_eq!(kl, vec![0.0], "{tokens}-token micro-batches");
    }
}

#[test]
fn an_rl_run_trains_checkpoints_and_resumes() {
    use toolsmith_train::metrics::{Record, read};
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("run");
    let mut trainer = tiny_rl(&out, 2, false).expect("prepare");
    trainer.run(&mut |_| {}).expect("trains");
    let records = read(&out.join("metrics.jsonl")).expect("metrics");
    let iterations: Vec<_> =
        records.iter().filter_map(|r| if let Record::Iteration(m) = r { Some(m.clone()) } else { None }).collect();
    assert_eq!(iterations.len(), 2);
    for m in &iterations {
        // Two tasks of three episodes each (that an update moves the weights where rewards
        // differ is `an_update_moves_the_weights_where_rewards_differ_and_not_for_rounding`:
        // SEARL's rewards for a random model's episodes are all the same).
        assert_eq!(m.episodes, 6, "{m:?}");
        assert!(m.groups >= 1 && m.loss.is_finite() && m.kl >= 0.0, "{m:?}");
        // One epoch: the trainer scores exactly what the sampler sampled, with the same weights.
        assert!((0.0..1e-3).contains(&m.sampler_kl), "{m:?}");
        assert!(m.entropy > 0.0, "{m:?}");
    }
    assert_eq!(records.iter().filter(|r| matches!(r, Record::Eval(_))).count(), 2);
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
    let mut trainer = tiny_rl_with(&out, 1, false, Method::MTR, |_| {}).expect("prepare");
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

#[test]
fn a_resume_with_other_run_defining_settings_is_refused_unless_allowed() {
    use toolsmith_train::Resume;
    use toolsmith_train::metrics::{Record, read};
    use toolsmith_train::rl::Method;
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("run");
    let no_eval = |c: &mut toolsmith_train::rl::RlConfig| c.eval = None;
    tiny_rl_with(&out, 1, false, Method::GAP, no_eval).expect("prepare").run(&mut |_| {}).expect("trains");
    // Another method, learning rate, group size and clip range: each named.
    let err = tiny_rl_with(&out, 2, true, Method::SEARL, no_eval).expect_err("another method").to_string();
    assert!(err.contains("method") && err.contains("--allow-config-change"), "{err}");
    let changed = |c: &mut toolsmith_train::rl::RlConfig| {
        c.eval = None;
        c.lr = 5e-4;
        c.group_size = 4;
        c.loss.clip_high = 0.3;
    };
    let err = tiny_rl_with(&out, 2, true, Method::GAP, changed).expect_err("changed settings").to_string();
    for field in ["lr", "group_size", "loss.clip_high"] {
        assert!(err.contains(field), "{field}: {err}");
    }
    // A checkpoint written before a setting existed (here `trainable_layers` and
    // `loss.kl_estimator`) reads it as its default, which is no change.
    let latest = std::fs::read_to_string(out.join("checkpoints/latest")).expect("latest");
    let state_file = out.join("checkpoints").join(latest.trim()).join("trainer-state.json");
    let mut state: Value = serde_json::from_str(&std::fs::read_to_string(&state_file).expect("state")).expect("json");
    let config = state["config"].as_object_mut().expect("a config");
    config.remove("trainable_layers");
    config["loss"].as_object_mut().expect("loss").remove("kl_estimator");
    std::fs::write(&state_file, serde_json::to_string(&state).expect("json")).expect("write");
    // A longer run, another evaluation or checkpoint cadence: allowed.
    let longer = |c: &mut toolsmith_train::rl::RlConfig| {
        c.eval = None;
        c.checkpoint_every = 3;
    };
    drop(tiny_rl_with(&out, 2, true, Method::GAP, longer).expect("a longer run resumes"));
    // Allowed explicitly: it resumes, and the metrics say what changed.
    let mut resumed = tiny_rl_with(&out, 2, Resume::AllowingChanges, Method::GAP, changed).expect("allowed");
    resumed.run(&mut |_| {}).expect("trains");
    let records = read(&out.join("metrics.jsonl")).expect("metrics");
    let noted: Vec<_> =
        records.iter().filter_map(|r| if let Record::Resumed(r) = r { Some(r) } else { None }).collect();
    assert_eq!(noted.len(), 1, "{records:?}");
    assert_eq!(noted[0].step, 1);
    assert_eq!(noted[0].changed, vec!["group_size", "loss.clip_high", "lr"]);
}

fn task(golden: &str) -> toolsmith_agent::env::Task {
    serde_json::from_value(json!({"question": "What is the capital?", "golden_answers": [golden]})).expect("a task")
}

/// A tiny policy, its sequence builder and `method`'s settings (with `norm`), for credit tests.
fn credit_fixture(
    method: toolsmith_train::rl::Method,
    norm: GroupNorm,
) -> (
    std::sync::Mutex<toolsmith_policy::Policy>,
    toolsmith_train::sequence::SequenceBuilder,
    toolsmith_train::rl::RlConfig,
) {
    let policy = toolsmith_policy::Policy::tiny(0, Default::default()).expect("tiny policy");
    let builder = toolsmith_train::sequence::SequenceBuilder::for_policy(&policy).expect("builder");
    let config =
        toolsmith_train::rl::RlConfig { group_norm: norm, ..toolsmith_train::rl::RlConfig::for_method(method) };
    (std::sync::Mutex::new(policy), builder, config)
}

/// `assign`'s credit of the group in `view`, with no tools merged.
fn credit_of(
    assign: &dyn toolsmith_train::rl::method::CreditAssignment,
    view: &toolsmith_train::rl::method::GroupView<'_>,
    config: &toolsmith_train::rl::RlConfig,
    policy: &std::sync::Mutex<toolsmith_policy::Policy>,
    builder: &toolsmith_train::sequence::SequenceBuilder,
) -> Vec<Vec<toolsmith_train::rl::method::TurnCredit>> {
    let context = toolsmith_train::rl::method::CreditContext { config, policy, builder, merged: &Default::default() };
    assign.credit(view, &context).expect("credit")
}

/// A sequence of 10 tokens whose turn 0 is tokens 3..6 and turn 1 tokens 7..10.
fn two_turns() -> toolsmith_train::rl::episode::EpisodeSequence {
    use toolsmith_train::rl::episode::{EpisodeSequence, TurnSpan};
    let mut mask = vec![false; 10];
    mask[3..6].fill(true);
    mask[7..10].fill(true);
    EpisodeSequence {
        tokens: toolsmith_policy::TokenSequence { ids: (1..=10).collect(), loss_mask: mask },
        behaviour: vec![0.0; 10],
        turns: vec![TurnSpan { step: 0, range: 3..6 }, TurnSpan { step: 1, range: 7..10 }],
    }
}

fn no_mem(_: &[i64]) -> Result<Option<std::ops::Range<usize>>, toolsmith_train::TrainError> {
    Ok(None)
}

#[test]
fn gap_credit_with_dapo_overlong_filtering_by_hand() {
    use toolsmith_train::rl::Method;
    use toolsmith_train::rl::method::{GroupView, token_advantages};
    let (policy, builder, config) = credit_fixture(Method::GAP, GroupNorm::MeanStd);
    let golden = task("Paris");
    let ep = |answer: &str| {
        trajectory(
            vec![
                step("<tool_call>{}</tool_call>", vec![], &[]),
                step(&format!("<answer>{answer}</answer>"), vec![], &[]),
            ],
            Some(answer),
        )
    };
    let episodes = vec![ep("Paris"), ep("Rome"), ep("Rome"), ep("Paris")];
    let assign = Method::GAP.spec().assign;
    let rewards: Vec<_> = episodes.iter().map(|e| assign.reward(e, &golden.golden_answers, &config)).collect();
    let view = GroupView { task: &golden, episodes: &episodes, rewards: &rewards };
    let credit = credit_of(assign, &view, &config, &policy, &builder);
    // Binary EM 1, 0, 0, 1: mean 0.5, sample std 0.57735, A = +-0.866025 on every turn.
    for (i, sign) in [1.0, -1.0, -1.0, 1.0].into_iter().enumerate() {
        for turn in &credit[i] {
            assert!(close(turn.turn, sign * 0.866025, 1e-5) && turn.memory == 0.0, "{i}: {turn:?}");
        }
    }
    // Episode 0's sequence with its second turn cut by the budget: the cut turn leaves the loss
    // mask (so the token-mean denominator and the KL), the first keeps A_E.
    let mut seq = two_turns();
    let a = token_advantages(&mut seq, &credit[0], |s| s == 1, no_mem).expect("advantages");
    let want = [0.0, 0.0, 0.0, 0.866025, 0.866025, 0.866025, 0.0, 0.0, 0.0, 0.0];
    assert_all_close(&a, &want, 1e-5);
    let trained: Vec<usize> = seq.tokens.loss_mask.iter().enumerate().filter(|(_, m)| **m).map(|(i, _)| i).collect();
    assert_eq!(trained, vec![3, 4, 5]);
    assert_eq!(token_weights(&[trained.len()], &[0], Aggregation::TokenMean, 0), vec![1.0 / 3.0]);
}

#[test]
fn searl_credit_is_the_episode_plus_lambda_times_the_tool_anchored_step_advantage() {
    use toolsmith_train::rl::Method;
    use toolsmith_train::rl::method::{CreditContext, GroupView, token_advantages};
    use toolsmith_train::rl::reward::EpisodeReward;
    let (policy, builder, mut config) = credit_fixture(Method::SEARL, GroupNorm::Mean);
    let golden = task("Paris");
    let f = || call("f", json!({"x": 1}), "valid", json!({"y": 2}));
    let ep = |answer: &str| {
        trajectory(
            vec![step("<tool_call>{}</tool_call>", vec![f()], &[]), step("<answer>x</answer>", vec![], &[])],
            Some(answer),
        )
    };
    let episodes = vec![ep("Paris"), ep("Rome")];
    // Step rewards by hand: totals 1.3 and 0.3 (A_E = +-0.5 with Dr. GRPO's mean).
    let rewards = vec![
        EpisodeReward { total: 1.3, outcome: 1.0, steps: vec![0.2, 1.1] },
        EpisodeReward { total: 0.3, outcome: 0.0, steps: vec![0.2, 0.1] },
    ];
    let view = GroupView { task: &golden, episodes: &episodes, rewards: &rewards };
    let assign = Method::SEARL.spec().assign;
    // Both first turns are anchored on `f`: returns (gamma 0.5) 0.2 + 0.5 * 1.1 = 0.75 and
    // 0.2 + 0.5 * 0.1 = 0.25, mean 0.5, so A_S = +-0.25; the answers have no anchor (A_S 0).
    let credit = credit_of(assign, &view, &config, &policy, &builder);
    let turns = |i: usize| credit[i].iter().map(|t| t.turn).collect::<Vec<_>>();
    assert_all_close(&turns(0), &[0.75, 0.5], 1e-12);
    assert_all_close(&turns(1), &[-0.75, -0.5], 1e-12);
    // lambda 2 doubles the step part only.
    config.step_credit.lambda = 2.0;
    let credit = credit_of(assign, &view, &config, &policy, &builder);
    assert_all_close(&credit[0].iter().map(|t| t.turn).collect::<Vec<_>>(), &[1.0, 0.5], 1e-12);
    let mut seq = two_turns();
    let a = token_advantages(&mut seq, &credit[0], |_| false, no_mem).expect("advantages");
    assert_all_close(&a, &[0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.5, 0.5, 0.5], 1e-12);

    // The second episode calls `g` instead: each tool is alone in its step group, so there is
    // no step advantage (single vanishing), only A_E. When the graph would merge `g` into `f`
    // (near-duplicates), both anchor on `f` again and the step advantages return.
    let g = || call("g", json!({"x": 1}), "valid", json!({"y": 2}));
    let other = trajectory(
        vec![step("<tool_call>{}</tool_call>", vec![g()], &[]), step("<answer>x</answer>", vec![], &[])],
        Some("Rome"),
    );
    let episodes = vec![ep("Paris"), other];
    let view = GroupView { task: &golden, episodes: &episodes, rewards: &rewards };
    let apart = credit_of(assign, &view, &config, &policy, &builder);
    assert_all_close(&apart[0].iter().map(|t| t.turn).collect::<Vec<_>>(), &[0.5, 0.5], 1e-12);
    assert_all_close(&apart[1].iter().map(|t| t.turn).collect::<Vec<_>>(), &[-0.5, -0.5], 1e-12);
    let merged: std::collections::HashMap<String, String> = [("g".to_string(), "f".to_string())].into();
    let together = assign
        .credit(&view, &CreditContext { config: &config, policy: &policy, builder: &builder, merged: &merged })
        .expect("credit");
    assert_all_close(&together[0].iter().map(|t| t.turn).collect::<Vec<_>>(), &[1.0, 0.5], 1e-12);
    assert_all_close(&together[1].iter().map(|t| t.turn).collect::<Vec<_>>(), &[-1.0, -0.5], 1e-12);
}

#[test]
fn mtr_credit_follows_its_composite_reward() {
    use toolsmith_train::rl::Method;
    use toolsmith_train::rl::method::GroupView;
    let (policy, builder, config) = credit_fixture(Method::MTR, GroupNorm::Mean);
    let golden = task("Paris");
    let search = || call("search", json!({"query": "capital"}), "valid", json!({"results": []}));
    let ep = |calls: usize, think: &str, answer: &str| {
        trajectory(
            vec![
                step("<tool_call>{}</tool_call>", (0..calls).map(|_| search()).collect(), &[]),
                step(&format!("<think>{think}</think><answer>{answer}</answer>"), vec![], &[]),
            ],
            Some(answer),
        )
    };
    // Consistent and right 1.0; right but unstated 0.6 minus two repeats 0.2 = 0.4; the
    // reasoning right only 0.3; neither 0.
    let episodes =
        vec![ep(1, "so Paris", "Paris"), ep(3, "done", "Paris"), ep(1, "Paris", "Rome"), ep(1, "hmm", "Rome")];
    let assign = Method::MTR.spec().assign;
    let rewards: Vec<_> = episodes.iter().map(|e| assign.reward(e, &golden.golden_answers, &config)).collect();
    assert_all_close(&rewards.iter().map(|r| r.total).collect::<Vec<_>>(), &[1.0, 0.4, 0.3, 0.0], 1e-12);
    let view = GroupView { task: &golden, episodes: &episodes, rewards: &rewards };
    let credit = credit_of(assign, &view, &config, &policy, &builder);
    // Mean 0.425.
    for (i, want) in [0.575, -0.025, -0.125, -0.425].into_iter().enumerate() {
        assert!(credit[i].iter().all(|t| close(t.turn, want, 1e-12) && t.memory == 0.0), "{i}: {:?}", credit[i]);
    }
}

#[test]
fn mempo_credit_puts_the_memory_term_on_mem_tokens_only() {
    use toolsmith_train::rl::Method;
    use toolsmith_train::rl::episode::{EpisodeSequence, TurnSpan, mem_span};
    use toolsmith_train::rl::method::{GroupView, TurnCredit, token_advantages};
    let (policy, builder, mut config) = credit_fixture(Method::MEMPO, GroupNorm::Mean);
    let golden = task("Paris");
    let episodes = vec![
        trajectory(
            vec![
                step("<mem>the capital is Paris</mem><tool_call>{}</tool_call>", vec![], &[]),
                step("<answer>Paris</answer>", vec![], &[]),
            ],
            Some("Paris"),
        ),
        trajectory(
            vec![
                step("<tool_call>{}</tool_call>", vec![], &[]),
                step("<mem>nothing found</mem><answer>Rome</answer>", vec![], &[]),
            ],
            Some("Rome"),
        ),
    ];
    let assign = Method::MEMPO.spec().assign;
    let rewards: Vec<_> = episodes.iter().map(|e| assign.reward(e, &golden.golden_answers, &config)).collect();
    let view = GroupView { task: &golden, episodes: &episodes, rewards: &rewards };
    let credit = credit_of(assign, &view, &config, &policy, &builder);
    // Episode advantages +-0.5 on every turn; the two memories form the pool (their advantages
    // are opposite); the turns without a memory get no memory term.
    assert!(credit[0].iter().all(|t| close(t.turn, 0.5, 1e-12)), "{credit:?}");
    assert!(credit[1].iter().all(|t| close(t.turn, -0.5, 1e-12)), "{credit:?}");
    assert_eq!((credit[0][1].memory, credit[1][0].memory), (0.0, 0.0));
    let (m0, m1) = (credit[0][0].memory, credit[1][1].memory);
    assert!(m0 != 0.0 && close(m0 + m1, 0.0, 1e-12), "{m0} {m1}");
    // `lambda` weighs the memory term (0: the paper's ablation, GRPO with memory); the
    // trajectory part stays.
    for (lambda, scale) in [(0.5, 0.5), (0.0, 0.0)] {
        config.step_credit.lambda = lambda;
        let weighed = credit_of(assign, &view, &config, &policy, &builder);
        assert!(close(weighed[0][0].memory, scale * m0, 1e-12) && weighed[1][1].memory == scale * m1, "{weighed:?}");
        assert!(weighed[0].iter().all(|t| close(t.turn, 0.5, 1e-12)), "{weighed:?}");
    }

    // Assembled: the `<mem>` block's tokens carry turn + memory, the rest of the turn the turn's.
    let guard = policy.lock().expect("policy");
    let tokenizer = guard.tokenizer();
    let ids =
        tokenizer.encode("<think>plan</think><mem>the capital is Paris</mem><tool_call>{}</tool_call>").expect("ids");
    let n = ids.len();
    let mut seq = EpisodeSequence {
        tokens: toolsmith_policy::TokenSequence {
            ids: [vec![1, 2], ids.clone()].concat(),
            loss_mask: [vec![false; 2], vec![true; n]].concat(),
        },
        behaviour: vec![0.0; n + 2],
        turns: vec![TurnSpan { step: 0, range: 2..n + 2 }],
    };
    let credit = [TurnCredit { turn: 0.5, memory: 0.25 }];
    let a = token_advantages(&mut seq, &credit, |_| false, |ids| Ok(mem_span(tokenizer, ids)?)).expect("advantages");
    let span = mem_span(tokenizer, &ids).expect("decodes").expect("a memory");
    assert_eq!(tokenizer.decode(&ids[span.clone()]).expect("decodes"), "<mem>the capital is Paris</mem>");
    for (i, &v) in a.iter().enumerate().skip(2) {
        let want = if span.contains(&(i - 2)) { 0.75 } else { 0.5 };
        assert!(close(v, want, 1e-12), "token {i}: {v}");
    }
}

#[test]
fn mem_span_skips_memories_inside_think_and_keeps_utf8_characters_whole() {
    use toolsmith_train::rl::episode::mem_span;
    let policy = toolsmith_policy::Policy::tiny(0, Default::default()).expect("tiny policy");
    let tokenizer = policy.tokenizer();
    let span_text = |text: &str| {
        let ids = tokenizer.encode(text).expect("ids");
        mem_span(tokenizer, &ids).expect("decodes").map(|r| tokenizer.decode(&ids[r]).expect("decodes"))
    };
    // A `<mem>` the model only thinks about is not its memory.
    assert_eq!(
        span_text("<think>maybe <mem>draft</mem> later</think><mem>final</mem><answer>x</answer>").as_deref(),
        Some("<mem>final</mem>")
    );
    // Characters of several bytes, split over byte-level tokens, before and inside the block.
    assert_eq!(span_text("😀é Zürich <mem>Zürich 😀 café</mem> done").as_deref(), Some("<mem>Zürich 😀 café</mem>"));
    // No closed block, or one only inside `<think>`: none.
    assert_eq!(span_text("<mem>never closed"), None);
    assert_eq!(span_text("<think><mem>x</mem></think><answer>y</answer>"), None);
    // Of several, the last closed one (the agent keeps the last); MemPO scores the same block's
    // text, so its reward and its advantage are about one memory.
    for (text, span, mem) in [
        ("<mem>first</mem> then <mem> second </mem><answer>y</answer>", "<mem> second </mem>", "second"),
        ("<mem>kept</mem><tool_call>{}</tool_call><mem>cut off", "<mem>kept</mem>", "kept"),
    ] {
        assert_eq!(span_text(text).as_deref(), Some(span), "{text}");
        assert_eq!(toolsmith_train::rl::episode::mem_text(text), Some(mem), "{text}");
    }
    assert_eq!(toolsmith_train::rl::episode::mem_text("<think><mem>x</mem></think><mem>open"), None);
}

#[test]
fn mempo_scores_the_gold_answer_tokens_not_the_tags() {
    use toolsmith_agent::backend::Message;
    use toolsmith_train::rl::method::mempo::golden_tokens;
    let (policy, builder, _) = credit_fixture(toolsmith_train::rl::Method::MEMPO, GroupNorm::Mean);
    let guard = policy.lock().expect("policy");
    let tokenizer = guard.tokenizer();
    for golden in ["Paris", "1896", "Zürich 😀"] {
        let messages =
            [Message::system("s"), Message::user("q"), Message::assistant(format!("<answer>{golden}</answer>"))];
        let encoded = builder.encode(&messages).expect("encodes");
        let (_, answer) = encoded.assistant.last().cloned().expect("an answer turn");
        let range = golden_tokens(tokenizer, &encoded.ids, answer.clone(), golden);
        assert!(answer.start <= range.start && range.end <= answer.end && range.len() < answer.len(), "{range:?}");
        assert_eq!(tokenizer.decode(&encoded.ids[range]).expect("decodes").trim(), golden);
        // An answer the turn does not hold: the whole turn, as before.
        assert_eq!(golden_tokens(tokenizer, &encoded.ids, answer.clone(), "Rome"), answer);
    }
}

#[test]
fn gigpo_adds_a_step_advantage_among_turns_from_the_same_state() {
    use toolsmith_train::rl::Method;
    use toolsmith_train::rl::method::GroupView;
    let gigpo = Method::parse("gigpo").expect("registered by one line in METHODS");
    let (policy, builder, config) = credit_fixture(gigpo, GroupNorm::Mean);
    assert_eq!(config.step_credit.gamma, 0.95);
    let golden = task("Paris");
    let ep = |observation: &str, answer: &str| {
        let mut t = trajectory(
            vec![
                step("<tool_call>{}</tool_call>", vec![], &[]),
                step(&format!("<answer>{answer}</answer>"), vec![], &[]),
            ],
            Some(answer),
        );
        t.steps[0].observation = observation.into();
        t
    };
    let assign = gigpo.spec().assign;
    let credit_of = |episodes: &[Trajectory]| {
        let rewards: Vec<_> = episodes.iter().map(|e| assign.reward(e, &golden.golden_answers, &config)).collect();
        let view = GroupView { task: &golden, episodes, rewards: &rewards };
        let credit = credit_of(assign, &view, &config, &policy, &builder);
        credit.iter().map(|turns| turns.iter().map(|t| t.turn).collect::<Vec<_>>()).collect::<Vec<_>>()
    };
    // A_E = +-0.5. Both first turns act from the question alone: returns 0.95 * 1 and 0, mean
    // 0.475, A_S = +-0.475. The second turns saw different observations: states of one, no A_S.
    let credit = credit_of(&[ep("A", "Paris"), ep("B", "Rome")]);
    assert_all_close(&credit[0], &[0.975, 0.5], 1e-12);
    assert_all_close(&credit[1], &[-0.975, -0.5], 1e-12);
    // The same observation: the second turns share a state too (returns 1 and 0: A_S = +-0.5).
    let credit = credit_of(&[ep("A", "Paris"), ep("A", "Rome")]);
    assert_all_close(&credit[0], &[0.975, 1.0], 1e-12);
    assert_all_close(&credit[1], &[-0.975, -1.0], 1e-12);
}

#[test]
fn rl_with_mini_batches_steps_once_per_mini_batch_and_spans_the_schedule() {
    use toolsmith_train::metrics::{Record, read};
    // Two iterations of six episodes, two epochs, cosine to 0: with one mini-batch 4 steps, with
    // two 8, and the schedule spans all of them (the last step is number 7 of 8, not 3 of 4).
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |mini_batches: usize| -> (u64, f64) {
        let out = dir.path().join(format!("mini-{mini_batches}"));
        let mut trainer = tiny_rl_with(&out, 2, false, probes::EVEN, |c| {
            c.eval = None;
            c.epochs = 2;
            c.mini_batches = mini_batches;
            c.min_lr_ratio = 0.0;
        })
        .expect("prepare");
        trainer.run(&mut |_| {}).expect("trains");
        let steps = trainer.policy().lock().expect("policy").state().step;
        let last_lr = read(&out.join("metrics.jsonl"))
            .expect("metrics")
            .iter()
            .filter_map(|r| if let Record::Iteration(m) = r { Some(m.lr) } else { None })
            .next_back()
            .expect("an iteration");
        (steps, last_lr)
    };
    let cosine = |step: f64, total: f64| 1e-3 * 0.5 * (1.0 + (std::f64::consts::PI * step / total).cos());
    let (steps, lr) = run(1);
    assert_eq!(steps, 4);
    assert!((lr - cosine(3.0, 4.0)).abs() < 1e-12, "{lr}");
    let (steps, lr) = run(2);
    assert_eq!(steps, 8);
    assert!((lr - cosine(7.0, 8.0)).abs() < 1e-12, "{lr}");
    // Zero mini-batches cannot train.
    let err = match tiny_rl_with(&dir.path().join("none"), 1, false, probes::EVEN, |c| c.mini_batches = 0) {
        Ok(_) => panic!("zero mini-batches were accepted"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("mini_batches"), "{err}");
}

#[test]
fn rl_with_trainable_layers_moves_only_the_top_layers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("run");
    let top_two = |c: &mut toolsmith_train::rl::RlConfig| {
        c.eval = None;
        c.run.trainable_layers = Some(2);
    };
    let mut trainer = tiny_rl_with(&out, 1, false, probes::EVEN, top_two).expect("prepare");
    trainer.run(&mut |_| {}).expect("trains");
    // The reference in the precision the trainer loaded it in: inference's default may round
    // the fresh weights to bf16 where training keeps f32, and every frozen weight would differ.
    let options = toolsmith_train::RunSettings::default().load_options().expect("options");
    let start = toolsmith_policy::Policy::tiny(0, options).expect("tiny");
    let (before, p) = (start.var_store().variables(), trainer.policy());
    let after = p.lock().expect("policy").var_store().variables();
    let mut moved_top = false;
    for (name, w) in &before {
        let moved = (w - &after[name]).abs().max().double_value(&[]) > 0.0;
        if name.starts_with("model.layers.2.") || name.starts_with("model.layers.3.") {
            moved_top |= moved;
        } else if !name.starts_with("model.norm.") {
            assert!(!moved, "{name} is frozen yet moved");
        }
    }
    assert!(moved_top, "the top two layers did not train");
}

#[test]
fn only_the_listed_settings_may_change_on_resume() {
    use toolsmith_train::run::changed_fields;
    let saved = json!({"lr": 1e-4, "iterations": 2, "engine": {"url": "http://a", "old_logprobs": "recompute"}, "loss": {"clip_high": 0.2}});
    let free = ["iterations", "engine.url"];
    // The engine's address and the run's length may change; how its log-probs are used may not.
    let moved = json!({"lr": 1e-4, "iterations": 9, "engine": {"url": "http://b", "old_logprobs": "tis"}, "loss": {"clip_high": 0.2}});
    assert_eq!(changed_fields(&saved, &moved, &free), vec!["engine.old_logprobs"]);
    // From rollouts in process to an engine (or back) is a change of the run.
    let local = json!({"lr": 1e-4, "iterations": 2, "engine": null, "loss": {"clip_high": 0.2}});
    assert_eq!(changed_fields(&local, &saved, &free), vec!["engine"]);
    // A prefix of a name is not its parent: `engine.url` frees neither `engine.urls` nor `engine`.
    let near = json!({"engine": {"urls": 1}});
    assert_eq!(changed_fields(&near, &json!({"engine": {"urls": 2}}), &free), vec!["engine.urls"]);
    assert_eq!(changed_fields(&saved, &saved, &free), Vec::<String>::new());
}

#[test]
fn rl_with_lora_trains_the_adapters_against_the_base_as_reference() {
    use toolsmith_train::metrics::{Record, read};
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("run");
    let lora = |c: &mut toolsmith_train::rl::RlConfig| {
        c.eval = None;
        c.run.precision = PrecisionChoice::Fixed(toolsmith_policy::Precision::F32);
        c.lr = 1e-2;
        c.loss.kl_coef = 0.5;
        c.epochs = 2;
        c.run.lora = Some(toolsmith_policy::LoraConfig {
            rank: 4,
            alpha: 8.0,
            dropout: 0.0,
            target_modules: vec!["all-linear".into()],
            layers_to_transform: None,
        });
    };
    let mut trainer = tiny_rl_with(&out, 2, false, probes::EVEN, lora).expect("prepare");
    trainer.run(&mut |_| {}).expect("trains");
    let p = trainer.policy();
    let policy = p.lock().expect("policy");
    assert!(policy.lora().is_some());
    // The base under the adapters never moved.
    let start = toolsmith_policy::Policy::tiny(
        0,
        toolsmith_policy::LoadOptions { precision: Some(toolsmith_policy::Precision::F32), ..Default::default() },
    )
    .expect("tiny");
    let before = start.var_store().variables();
    for (name, w) in policy.var_store().variables() {
        assert_eq!((w - &before[&name]).abs().max().double_value(&[]), 0.0, "{name} is frozen yet moved");
    }
    // The adapters did, and the KL to the base (adapters off) is measured from the second
    // iteration on (the first update starts at the base: B is zero).
    let moved =
        policy.trained_variables().iter().any(|(n, v)| n.contains("lora_B") && v.abs().max().double_value(&[]) > 0.0);
    assert!(moved, "the adapters did not train");
    let kls: Vec<(f64, f64)> = read(&out.join("metrics.jsonl"))
        .expect("metrics")
        .iter()
        .filter_map(|r| if let Record::Iteration(m) = r { Some((m.kl, m.sampler_kl)) } else { None })
        .collect();
    assert_eq!(kls.len(), 2);
    assert!(kls.iter().all(|(k, _)| k.is_finite() && *k >= 0.0), "{kls:?}");
    // Two epochs per update: the second scores the batch after the first's step, so the policy
    // has moved from the one that sampled it (from the second iteration on: with B at zero the
    // first gradients are ~1e-5, too small to show in f32).
    assert!(kls.iter().all(|(_, drift)| drift.is_finite() && *drift >= 0.0), "{kls:?}");
    assert!(kls[1].1 > 0.0, "{kls:?}");
    // The reference is the trained policy with its adapters off: exactly the starting model.
    drop(policy);
    let sequence = toolsmith_policy::TokenSequence::completion(&[5, 6, 7, 8], &[9, 10, 11]);
    let score = |p: &toolsmith_policy::Policy| {
        p.score(std::slice::from_ref(&sequence), false).expect("score").logprobs.to_kind(Kind::Double)
    };
    let mut policy = p.lock().expect("policy");
    policy.set_adapters_enabled(false);
    assert_eq!((score(&policy) - score(&start)).abs().max().double_value(&[]), 0.0);
    policy.set_adapters_enabled(true);
}

#[test]
fn smol_presets_keep_their_methods_settings_and_fit_their_budget() {
    use toolsmith_train::rl::{Method, RlConfig};
    // `toolcall` trains on `train tools`' tasks, whose presets are that command's.
    let err = RlConfig::preset("smol-toolcall", None).expect_err("no world preset").to_string();
    assert!(err.contains("train tools --preset smol-tools"), "{err}");
    for method in Method::all().filter(|m| *m != Method::TOOLCALL) {
        let name = format!("smol-{}", method.name());
        let preset = RlConfig::preset(&name, None).expect("preset");
        let own = RlConfig::for_method(method);
        // The method's own choices survive the preset: its mode, rewards, loss, graph, simulator.
        assert_eq!(preset.method, method);
        assert_eq!(preset.worlds.styles, own.worlds.styles, "{name}");
        assert_eq!(preset.rewards, own.rewards, "{name}");
        assert_eq!(preset.loss, own.loss, "{name}");
        assert_eq!(preset.graph.is_some(), own.graph.is_some(), "{name}");
        assert_eq!(preset.simulate.is_some(), own.simulate.is_some(), "{name}");
        assert_eq!(preset.eval.as_ref().map(|e| e.modes.clone()), own.eval.map(|e| e.modes), "{name}");
        // Sized for SmolLM2 on two cores, and held out from its training worlds.
        assert_eq!(preset.run.trainable_layers, Some(8));
        assert!(!preset.families.is_empty() && preset.families.len() < 5, "{name}");
        // Ten iterations of 32 episodes fit the 30 minutes with two evaluations (BENCHMARKS.md).
        assert!(preset.iterations * (preset.tasks_per_iteration * preset.group_size) as u64 <= 10 * 32, "{name}");
        assert!(preset.overlong_cache <= preset.max_tokens);
        preset.validate().expect("valid");
        // With --method it must agree.
        assert!(RlConfig::preset(&name, Some(method)).is_ok());
        let other = Method::all().find(|m| *m != method).expect("another method");
        let err = RlConfig::preset(&name, Some(other)).expect_err("disagreeing method").to_string();
        assert!(err.contains(&format!("not {}", other.name())), "{err}");
    }
    assert!(RlConfig::preset("smol-world", None).is_err());
    let custom = RlConfig { families: vec![toolsmith_agent::env::Family::Custom], ..RlConfig::default() };
    let err = custom.validate().expect_err("no such tasks").to_string();
    assert!(err.contains("no custom tasks"), "{err}");
}

#[test]
fn a_new_turn_budget_keeps_the_overlong_window_share() {
    use toolsmith_train::rl::{Method, RlConfig};
    // GAP: a quarter of the default 160 is 40; of 512, 128; of 32, 8 (before, 40 stayed and a
    // budget under 40 was refused).
    let gap = RlConfig::for_method(Method::GAP);
    assert_eq!((gap.max_tokens, gap.overlong_cache), (160, 40));
    for (max_tokens, window) in [(512, 128), (32, 8), (160, 40)] {
        let config = gap.clone().with_max_tokens(max_tokens);
        assert_eq!((config.max_tokens, config.overlong_cache), (max_tokens, window));
        config.validate().expect("valid");
    }
    // The preset's 32 of 128, at 192: 48. A method without the window keeps none.
    let preset = RlConfig::preset("smol-gap", None).expect("preset").with_max_tokens(192);
    assert_eq!(preset.overlong_cache, 48);
    assert_eq!(RlConfig::for_method(Method::SEARL).with_max_tokens(512).overlong_cache, 0);
    // A file that sets the budget and not the window gets the window's share of its budget; one
    // that sets both keeps its own.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("rl.json");
    std::fs::write(&file, r#"{"method": "gap", "max_tokens": 32}"#).expect("write");
    assert_eq!(RlConfig::from_file(&file).expect("config").overlong_cache, 8);
    std::fs::write(&file, r#"{"method": "gap", "max_tokens": 512, "overlong_cache": 10}"#).expect("write");
    assert_eq!(RlConfig::from_file(&file).expect("config").overlong_cache, 10);
}

#[test]
fn oversampling_needs_dynamic_sampling() {
    use toolsmith_train::rl::{Method, RlConfig};
    // GAP samples dynamically: extra tasks in its first draw are fine.
    let gap = RlConfig { oversample: 2, ..RlConfig::for_method(Method::GAP) };
    gap.validate().expect("valid");
    // SEARL does not: nothing would ever drop the surplus groups.
    let searl = RlConfig { oversample: 2, ..RlConfig::for_method(Method::SEARL) };
    let err = searl.validate().expect_err("no dynamic sampling").to_string();
    assert!(err.contains("oversample") && err.contains("dynamic_sampling"), "{err}");
    // Left out of a config file, it is 0, and a config without it serialises without it.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("rl.json");
    std::fs::write(&file, r#"{"method": "gap"}"#).expect("write");
    let config = RlConfig::from_file(&file).expect("config");
    assert_eq!(config.oversample, 0);
    assert!(!serde_json::to_string(&config).expect("json").contains("oversample"));
    std::fs::write(&file, r#"{"method": "searl", "oversample": 1}"#).expect("write");
    assert!(RlConfig::from_file(&file).is_err());
}
