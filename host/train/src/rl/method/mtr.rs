//! MTR (models as tools): RL against simulated tools answered from their interfaces alone. The
//! reward tiers the answer's consistency with the reasoning and subtracts a capped penalty for
//! repeated calls; GRPO with a sequence-mean loss and KL 0.01, the episode advantage on every
//! token.

use std::collections::HashSet;

use toolsmith_agent::env::metrics::normalize;
use toolsmith_agent::{Mode, Tag, Trajectory};

use crate::TrainError;
use crate::rl::config::{RlConfig, SimulatorConfig};
use crate::rl::loss::Aggregation;
use crate::rl::method::{CreditAssignment, CreditContext, GroupView, MethodSpec, TurnCredit, episode_credit};
use crate::rl::reward::{EpisodeReward, RewardConfig, call_key, correct};

/// The table entry.
pub static METHOD: MethodSpec = MethodSpec {
    name: "mtr",
    aliases: &[],
    summary: "MTR: tiered answer-consistency reward minus a repetition penalty; GRPO with KL 0.01, on simulated tools.",
    mode: Mode::React,
    defaults,
    assign: &Mtr,
};

struct Mtr;

/// GRPO, n = 8, KL 0.01, rollouts on simulated tools.
fn defaults(base: RlConfig) -> RlConfig {
    RlConfig {
        loss: base.loss.grpo(0.01, Aggregation::SequenceMean),
        simulate: Some(SimulatorConfig::default()),
        ..base
    }
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

/// The tiered answer score (final and intermediate answers right and consistent > final right
/// only > intermediate right only > neither) minus a capped penalty per repeated call.
pub fn reward(trajectory: &Trajectory, golden: &[String], config: &RewardConfig) -> EpisodeReward {
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

impl CreditAssignment for Mtr {
    fn reward(&self, episode: &Trajectory, golden: &[String], config: &RlConfig) -> EpisodeReward {
        reward(episode, golden, &config.rewards)
    }

    fn credit(&self, group: &GroupView<'_>, context: &CreditContext<'_>) -> Result<Vec<Vec<TurnCredit>>, TrainError> {
        Ok(episode_credit(group, context.config.group_norm))
    }
}
