//! GiGPO (group-in-group policy optimisation): the episode advantage of GRPO plus a step-level
//! advantage among turns that acted from the same state. Episodes of a group start from the
//! same question and often pass through the same states (the same observations so far); the
//! turns taken from one such anchor state form a step group, and each turn's discounted return
//! is compared with the others of its group: `A = A_E + omega * A_S`. A state seen once gets no
//! step advantage. The reward is the exact match.
//!
//! The state of turn `t` is what the environment showed before it: the observations of turns
//! `0..t` (the question is the group's, so every first turn shares a state).

use toolsmith_agent::{Mode, Trajectory};

use crate::TrainError;
use crate::rl::config::{RlConfig, StepCredit};
use crate::rl::loss::Aggregation;
use crate::rl::method::{
    CreditAssignment, CreditContext, GroupView, MethodSpec, TurnCredit, add_step_credit, episode_credit, gap,
};
use crate::rl::reward::EpisodeReward;

/// The table entry.
pub static METHOD: MethodSpec = MethodSpec {
    name: "gigpo",
    aliases: &[],
    summary: "GiGPO: exact-match reward; episode plus anchor-state step advantages (omega 1, gamma 0.95).",
    mode: Mode::React,
    defaults,
    assign: &GiGpo,
};

struct GiGpo;

/// The paper's settings: omega 1 and gamma 0.95 (`step_credit`), KL 0.01, token mean.
fn defaults(base: RlConfig) -> RlConfig {
    RlConfig {
        loss: base.loss.grpo(0.01, Aggregation::TokenMean),
        step_credit: StepCredit { lambda: 1.0, gamma: 0.95, single_vanishing: true },
        ..base
    }
}

/// Each turn's anchor state: the observations before it, joined.
pub fn states(episode: &Trajectory) -> Vec<Option<String>> {
    let mut seen = String::new();
    episode
        .steps
        .iter()
        .map(|s| {
            let state = seen.clone();
            seen.push_str(&s.observation);
            seen.push('\u{0}');
            Some(state)
        })
        .collect()
}

impl CreditAssignment for GiGpo {
    fn reward(&self, episode: &Trajectory, golden: &[String], config: &RlConfig) -> EpisodeReward {
        // The outcome on the last turn, so earlier turns' discounted returns carry it.
        let mut r = gap::reward(episode, golden, &config.rewards);
        r.steps = vec![0.0; episode.steps.len()];
        match r.steps.last_mut() {
            Some(last) => *last = r.total,
            None => r.steps.push(r.total),
        }
        r
    }

    fn credit(&self, group: &GroupView<'_>, context: &CreditContext<'_>) -> Result<Vec<Vec<TurnCredit>>, TrainError> {
        let mut credit = episode_credit(group, context.config.group_norm);
        let anchors: Vec<Vec<Option<String>>> = group.episodes.iter().map(states).collect();
        add_step_credit(&mut credit, group, &anchors, context.config);
        Ok(credit)
    }
}
