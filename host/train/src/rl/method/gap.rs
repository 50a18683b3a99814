//! GAP (graph-based agent planning): plans are dependency graphs whose independent calls run in
//! parallel. The reward is the exact match alone (the paper relies on SFT for the format), or
//! optionally the share of a multi-objective answer's objectives right; every token of an episode
//! carries its group-normalised advantage; training follows DAPO.

use toolsmith_agent::{Mode, Trajectory};

use crate::TrainError;
use crate::rl::config::RlConfig;
use crate::rl::loss::{Aggregation, LossConfig};
use crate::rl::method::{CreditAssignment, CreditContext, GroupView, MethodSpec, TurnCredit, episode_credit};
use crate::rl::reward::{EpisodeReward, RewardConfig, answer_score};

/// The table entry.
pub static METHOD: MethodSpec = MethodSpec {
    name: "gap",
    aliases: &[],
    summary: "GAP: graph plans with parallel calls; binary exact-match reward; DAPO.",
    mode: Mode::Gap,
    defaults,
    assign: &Gap,
};

struct Gap;

/// DAPO as GAP trains with it: clip-higher, token mean, no KL, dynamic sampling, overlong
/// shaping over the last quarter of the budget.
fn defaults(base: RlConfig) -> RlConfig {
    RlConfig {
        loss: LossConfig {
            clip_low: 0.2,
            clip_high: 0.28,
            kl_coef: 0.0,
            aggregation: Aggregation::TokenMean,
            ..base.loss
        },
        dynamic_sampling: true,
        overlong_cache: base.max_tokens / 4,
        ..base
    }
}

/// 1 for an exact answer, else 0 (an episode that never answers scores 0); with
/// [`RewardConfig::objective_credit`], a multi-objective answer's share of objectives right.
pub fn reward(trajectory: &Trajectory, golden: &[String], config: &RewardConfig) -> EpisodeReward {
    let outcome = answer_score(trajectory, golden, config.objective_credit);
    EpisodeReward { total: outcome, outcome, steps: Vec::new() }
}

impl CreditAssignment for Gap {
    fn reward(&self, episode: &Trajectory, golden: &[String], config: &RlConfig) -> EpisodeReward {
        reward(episode, golden, &config.rewards)
    }

    fn credit(&self, group: &GroupView<'_>, context: &CreditContext<'_>) -> Result<Vec<Vec<TurnCredit>>, TrainError> {
        Ok(episode_credit(group, context.config.group_norm))
    }
}
