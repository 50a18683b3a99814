//! Each method's reward of an episode, from its trajectory and the golden answers.
//!
//! Where a paper names a reward term but not its size (SEARL's dense rewards and penalties, MTR's
//! tiers), the size is a field of [`RewardConfig`] whose default says what was chosen and why.
//! The rewards never look at a trajectory's text beyond what the trace grammar parses: what
//! counts is what the runtime did (calls, verdicts, created tools) and the final answer.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use toolsmith_agent::env::metrics::{exact_match, normalize};
use toolsmith_agent::runner::StepRecord;
use toolsmith_agent::tools::CREATE_TOOL;
use toolsmith_agent::{Finish, Tag, Trajectory};

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

/// GAP: 1 for an exact answer, else 0 (the paper relies on SFT for the format and uses no format
/// reward; an episode that never answers scores 0).
pub fn gap(trajectory: &Trajectory, golden: &[String]) -> EpisodeReward {
    let outcome = f64::from(u8::from(correct(trajectory, golden)));
    EpisodeReward { total: outcome, outcome, steps: Vec::new() }
}

/// MemPO's trajectory reward: 1 iff the answer is right and every turn was well-formed.
pub fn mempo(trajectory: &Trajectory, golden: &[String]) -> EpisodeReward {
    let well_formed = trajectory.steps.iter().all(|s| s.errors.is_empty());
    let outcome = f64::from(u8::from(correct(trajectory, golden) && well_formed));
    EpisodeReward { total: outcome, outcome, steps: Vec::new() }
}

/// A call's identity for spotting repeats: tool name and canonical arguments.
fn call_key(name: &str, arguments: &serde_json::Value) -> String {
    // serde_json's maps are ordered by key, so equal arguments print equally.
    format!("{name}\u{0}{arguments}")
}

/// Whether a `create_and_execute_mcp` call created its tool.
fn creation_succeeded(result: &serde_json::Value) -> bool {
    result.get("creation_success").and_then(serde_json::Value::as_bool).unwrap_or(false)
}

/// SEARL's per-turn reward: planning, creation, execution and format rewards, minus redundant-call
/// and failed-creation penalties. `seen` holds the calls of earlier turns.
fn searl_step(step: &StepRecord, seen: &mut HashSet<String>, config: &RewardConfig) -> f64 {
    let turn = toolsmith_agent::trace::parse(&step.text);
    let mut r = 0.0;
    if matches!(turn.plan(), Some(Ok(_))) {
        r += config.planning;
    }
    r += if step.errors.is_empty() { config.format } else { -config.format };
    if !step.calls.is_empty() && step.calls.iter().all(|c| c.ok()) {
        r += config.execution;
    }
    for call in &step.calls {
        if call.name == CREATE_TOOL {
            if creation_succeeded(&call.result) {
                r += config.creation;
            } else {
                r -= config.failed_creation;
            }
        }
        if !seen.insert(call_key(&call.name, &call.arguments)) {
            r -= config.redundant_call;
        }
    }
    r
}

/// SEARL: `R = R_orm + sum_t r_t`, with the outcome `R_orm` (1 for a right answer) added to the
/// last turn's reward so the discounted returns of earlier turns carry it.
pub fn searl(trajectory: &Trajectory, golden: &[String], config: &RewardConfig) -> EpisodeReward {
    let mut seen = HashSet::new();
    let mut steps: Vec<f64> = trajectory.steps.iter().map(|s| searl_step(s, &mut seen, config)).collect();
    let outcome = f64::from(u8::from(correct(trajectory, golden)));
    match steps.last_mut() {
        Some(last) => *last += outcome,
        None => steps.push(outcome),
    }
    EpisodeReward { total: steps.iter().sum(), outcome, steps }
}

/// The answer the reasoning stated before the final one: the last `<think>` or `<reflection>` of
/// the answering turn, or of the turn before it (MTR's "intermediate prediction").
fn intermediate(trajectory: &Trajectory) -> Option<String> {
    let turns: Vec<_> = trajectory.steps.iter().rev().take(2).map(|s| toolsmith_agent::trace::parse(&s.text)).collect();
    turns.iter().find_map(|t| t.contents(Tag::Think).chain(t.contents(Tag::Reflection)).last().map(str::to_string))
}

/// Whether `text` states one of the golden answers (its normalised form, as whole words).
fn states(text: &str, golden: &[String]) -> bool {
    let text = format!(" {} ", normalize(text));
    golden.iter().map(|g| normalize(g)).any(|g| !g.is_empty() && text.contains(&format!(" {g} ")))
}

/// MTR: the tiered answer score (final and intermediate answers right and consistent > final
/// right only > intermediate right only > neither) minus a capped penalty per repeated call.
pub fn mtr(trajectory: &Trajectory, golden: &[String], config: &RewardConfig) -> EpisodeReward {
    let final_right = correct(trajectory, golden);
    let middle_right = intermediate(trajectory).is_some_and(|t| states(&t, golden));
    let outcome = match (final_right, middle_right) {
        (true, true) => config.mtr_consistent,
        (true, false) => config.mtr_final_only,
        (false, true) => config.mtr_intermediate_only,
        (false, false) => 0.0,
    };
    let mut seen = HashSet::new();
    let repeats = trajectory
        .steps
        .iter()
        .flat_map(|s| &s.calls)
        .filter(|c| !seen.insert(call_key(&c.name, &c.arguments)))
        .count();
    let penalty = (repeats as f64 * config.mtr_repeat).min(config.mtr_repeat_cap);
    EpisodeReward { total: outcome - penalty, outcome, steps: Vec::new() }
}
