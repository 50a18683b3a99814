//! Group-relative advantages: each task's `n` episodes are scored against each other, so no value
//! network is needed (GRPO). The pieces the four methods combine:
//!
//! - [`group_advantages`]: GRPO's `(r - mean) / (std + eps)` (sample or population std) or Dr.
//!   GRPO's `r - mean`.
//! - [`informative`]: DAPO's dynamic sampling keeps only groups whose rewards differ (a group of
//!   equal rewards has zero advantage everywhere and only dilutes the batch).
//! - [`returns_to_go`]: discounted return from each step on, for step-level credit.
//! - [`overlong_penalty`]: DAPO's soft length penalty for responses near the limit.

use serde::{Deserialize, Serialize};

/// How a group's rewards are normalised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum GroupNorm {
    /// `(r - mean) / (std + eps)`, with the sample standard deviation (GRPO, DAPO).
    MeanStd,
    /// `(r - mean) / (std + eps)`, with the population standard deviation (1/N: SEARL's
    /// equations 4 and 6). Differs from `mean-std` by `sqrt((n - 1) / n)`, which matters for the
    /// small tool-anchored step groups, where n is often 2 or 3.
    MeanStdPopulation,
    /// `r - mean` (Dr. GRPO: dividing by the std up-weights groups that are nearly all right or
    /// all wrong).
    Mean,
}

/// Added to the standard deviation so a group of near-equal rewards does not divide by ~0.
pub const STD_EPS: f64 = 1e-6;

/// Mean and sample standard deviation (n - 1 in the denominator, as `torch.std`); the std of a
/// single value is 0.
pub fn mean_std(values: &[f64]) -> (f64, f64) {
    let (mean, squares) = mean_squares(values);
    let n = values.len();
    (mean, if n > 1 { (squares / (n - 1) as f64).sqrt() } else { 0.0 })
}

/// Mean and the sum of squared deviations from it; both 0 for no values.
fn mean_squares(values: &[f64]) -> (f64, f64) {
    if values.is_empty() {
        return (0.0, 0.0);
    }
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    (mean, values.iter().map(|v| (v - mean).powi(2)).sum())
}

/// The advantage of each episode of a group from its reward. Rewards within 1e-9 of each other
/// are equal (sums of the same step rewards in another order differ by rounding): their
/// advantages are exactly 0, not rounding noise, which the normalisation would scale and Adam
/// would turn into a full-size step.
pub fn group_advantages(rewards: &[f64], norm: GroupNorm) -> Vec<f64> {
    if !informative(rewards) {
        return vec![0.0; rewards.len()];
    }
    let (mean, std) = match norm {
        GroupNorm::MeanStdPopulation => {
            let (mean, squares) = mean_squares(rewards);
            (mean, (squares / rewards.len() as f64).sqrt())
        }
        GroupNorm::MeanStd | GroupNorm::Mean => mean_std(rewards),
    };
    rewards
        .iter()
        .map(|r| match norm {
            GroupNorm::MeanStd | GroupNorm::MeanStdPopulation => (r - mean) / (std + STD_EPS),
            GroupNorm::Mean => r - mean,
        })
        .collect()
}

/// Whether a group teaches anything: false when every value is the same (within 1e-9). DAPO's
/// dynamic sampling asks it of the episodes' accuracy (their outcomes), not of shaped totals: an
/// all-wrong group whose lengths differ would otherwise stay and teach only brevity.
pub fn informative(rewards: &[f64]) -> bool {
    let (lo, hi) = rewards.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &r| (lo.min(r), hi.max(r)));
    rewards.len() > 1 && hi - lo > 1e-9
}

/// DAPO's dynamic sampling: whether a group is kept, judged on its episodes' accuracy (the
/// method's outcome) rather than on shaped totals.
pub fn keeps_group(rewards: &[crate::rl::reward::EpisodeReward]) -> bool {
    informative(&rewards.iter().map(|r| r.outcome).collect::<Vec<_>>())
}

/// `G_t = r_t + gamma * G_{t+1}` for each step `t`.
pub fn returns_to_go(step_rewards: &[f64], gamma: f64) -> Vec<f64> {
    let mut out = vec![0.0; step_rewards.len()];
    let mut next = 0.0;
    for (t, r) in step_rewards.iter().enumerate().rev() {
        next = r + gamma * next;
        out[t] = next;
    }
    out
}

/// DAPO's soft overlong punishment of a response of `length` tokens when at most `max_length`
/// are allowed and the last `cache` of them are a buffer: 0 up to `max_length - cache`, then a
/// linear ramp down to -1 at `max_length`, and -1 beyond.
pub fn overlong_penalty(length: usize, max_length: usize, cache: usize) -> f64 {
    let free = max_length.saturating_sub(cache);
    if length <= free {
        0.0
    } else if length <= max_length {
        (free as f64 - length as f64) / cache.max(1) as f64
    } else {
        -1.0
    }
}

/// SEARL's tool-anchored step advantages for one task's group.
///
/// `step_rewards[i][t]` is episode `i`'s reward at step `t` and `anchors[i][t]` the tool its step
/// `t` invoked, if any. As SEARL merges near-duplicate tools before grouping, a tool created in
/// this iteration is anchored by the name the tool graph would merge it into
/// (`TrainingGraph::merged_names`, mapped by the method's credit), so two rollouts' names for
/// one tool are one anchor. Each step's return-to-go
/// `R_t = sum_k gamma^(k-t) r_k` is compared with the returns of every step, in any episode of the
/// group, anchored on the same tool: `A_S = (R_t - mean) / (std + eps)` (or `R_t - mean`).
/// Steps with no anchor get 0. With `single_vanishing` a tool used by a single step in the whole
/// group gets 0 too (there is nothing to compare it with); without it, such a step keeps its raw
/// return (SEARL's ablation).
pub fn searl_step_advantages(
    step_rewards: &[Vec<f64>],
    anchors: &[Vec<Option<String>>],
    gamma: f64,
    norm: GroupNorm,
    single_vanishing: bool,
) -> Vec<Vec<f64>> {
    let returns: Vec<Vec<f64>> = step_rewards.iter().map(|r| returns_to_go(r, gamma)).collect();
    let mut out: Vec<Vec<f64>> = returns.iter().map(|r| vec![0.0; r.len()]).collect();
    let mut groups: std::collections::BTreeMap<&str, Vec<(usize, usize)>> = std::collections::BTreeMap::new();
    for (i, episode) in anchors.iter().enumerate() {
        for (t, anchor) in episode.iter().enumerate().take(returns[i].len()) {
            if let Some(tool) = anchor {
                groups.entry(tool.as_str()).or_default().push((i, t));
            }
        }
    }
    for members in groups.values() {
        if members.len() == 1 {
            let (i, t) = members[0];
            out[i][t] = if single_vanishing { 0.0 } else { returns[i][t] };
            continue;
        }
        let values: Vec<f64> = members.iter().map(|&(i, t)| returns[i][t]).collect();
        for (&(i, t), a) in members.iter().zip(group_advantages(&values, norm)) {
            out[i][t] = a;
        }
    }
    out
}

/// MemPO's memory advantages for one task's group: `rewards[i][t]` is episode `i`'s memory
/// reward at step `t`, `None` for a turn that wrote no `<mem>`. The memories of every step of
/// every episode are one pool, normalised together; turns without a memory are not in the pool
/// and get 0.
pub fn memory_advantages(rewards: &[Vec<Option<f64>>], norm: GroupNorm) -> Vec<Vec<f64>> {
    let pooled: Vec<f64> = rewards.iter().flatten().flatten().copied().collect();
    let mut advantages = group_advantages(&pooled, norm).into_iter();
    rewards.iter().map(|r| r.iter().map(|m| m.and_then(|_| advantages.next()).unwrap_or(0.0)).collect()).collect()
}

/// MemPO's measure of how well a memory supports the answer: the geometric mean of the gold
/// answer's token probabilities given it, `exp(mean log p)` (length-invariant, so a long answer is
/// not punished for its length). 0 for an empty answer.
pub fn answer_probability(answer_logprobs: &[f64]) -> f64 {
    if answer_logprobs.is_empty() {
        return 0.0;
    }
    (answer_logprobs.iter().sum::<f64>() / answer_logprobs.len() as f64).exp()
}
