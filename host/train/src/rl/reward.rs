//! What the methods' rewards share: the sizes of their terms, the reward of an episode, and
//! whether it answered right. Each method's reward itself is in its file under
//! [`crate::rl::method`].
//!
//! Where a paper names a reward term but not its size (SEARL's dense rewards and penalties, MTR's
//! tiers), the size is a field of [`RewardConfig`] whose default says what was chosen and why.
//! The rewards never look at a trajectory's text beyond what the trace grammar parses: what
//! counts is what the runtime did (calls, verdicts, created tools) and the final answer.

use serde::{Deserialize, Serialize};
use toolsmith_agent::env::metrics::{exact_match, objective_credit};
use toolsmith_agent::{Finish, Trajectory};

/// Sizes of the reward terms the papers name without a number.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RewardConfig {
    /// SEARL: reward of a turn whose plan parses into tasks. By default 0.1 (small beside the
    /// outcome's 1, so behaviour never outweighs a right answer).
    pub planning: f64,
    /// SEARL: reward per tool created in the registration format (`creation_success`). By default 0.1.
    pub creation: f64,
    /// SEARL: reward of a turn whose calls all executed and returned valid output. By default 0.1.
    pub execution: f64,
    /// SEARL: reward of a well-formed turn (and its negative for a malformed one). By default 0.1.
    pub format: f64,
    /// SEARL: penalty per call repeating an earlier call of the episode (same tool, same
    /// arguments). By default 0.2 ("strict negative penalties" deter redundant calls).
    pub redundant_call: f64,
    /// SEARL: penalty per failed creation. By default 0.3.
    pub failed_creation: f64,
    /// MTR: the answer score when final and intermediate answers agree and are right. By default 1.
    pub mtr_consistent: f64,
    /// MTR: when the final answer is right but the reasoning never stated it. By default 0.6.
    pub mtr_final_only: f64,
    /// MTR: when only an intermediate answer was right. By default 0.3.
    pub mtr_intermediate_only: f64,
    /// MTR: penalty per repeated call (same tool, same arguments). By default 0.1.
    pub mtr_repeat: f64,
    /// MTR: the repetition penalty's cap, so a right answer's reward stays positive. By default 0.5.
    pub mtr_repeat_cap: f64,
    /// GAP: a multi-objective answer earns the share of its objectives answered right
    /// ([`objective_credit`]) instead of all or nothing. Off by default, as in the paper (binary
    /// exact match); under binary match a policy that answers only the first of several listed
    /// questions loses nothing it could have kept (BENCHMARKS.md, multi-objective tasks).
    pub objective_credit: bool,
}

impl Default for RewardConfig {
    fn default() -> Self {
        RewardConfig {
            planning: 0.1,
            creation: 0.1,
            execution: 0.1,
            format: 0.1,
            redundant_call: 0.2,
            failed_creation: 0.3,
            mtr_consistent: 1.0,
            mtr_final_only: 0.6,
            mtr_intermediate_only: 0.3,
            mtr_repeat: 0.1,
            mtr_repeat_cap: 0.5,
            objective_credit: false,
        }
    }
}

/// An episode's reward: the total the group compares, and per-step rewards for step credit.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct EpisodeReward {
    /// What the group's advantage is computed from.
    pub total: f64,
    /// The outcome part (1 for a right answer in GAP, SEARL and MemPO; MTR's answer score).
    pub outcome: f64,
    /// Per-turn rewards (SEARL's dense rewards and penalties, the outcome added to the last turn);
    /// their sum is `total`. Empty for the methods without step credit.
    pub steps: Vec<f64>,
}

/// Whether the episode answered and its final answer is an exact match.
pub fn correct(trajectory: &Trajectory, golden: &[String]) -> bool {
    trajectory.finish == Finish::Answered && trajectory.answer.as_deref().is_some_and(|a| exact_match(a, golden) == 1.0)
}

/// The answer's score: 1 for an exact match, else 0; with `partial`, a multi-objective answer's
/// share of objectives right. An episode that never answers scores 0.
pub fn answer_score(trajectory: &Trajectory, golden: &[String], partial: bool) -> f64 {
    match trajectory.answer.as_deref() {
        Some(answer) if partial && trajectory.finish == Finish::Answered => objective_credit(answer, golden),
        _ => f64::from(u8::from(correct(trajectory, golden))),
    }
}

/// A call's identity for spotting repeats: tool name and canonical arguments.
pub(crate) fn call_key(name: &str, arguments: &serde_json::Value) -> String {
    // serde_json's maps are ordered by key, so equal arguments print equally.
    format!("{name}\u{0}{arguments}")
}
