//! Tool calling from interfaces (`toolsmith train tools`): a fine-grained, schema-aware reward
//! (right tool; each golden argument right under a type-aware comparison; no invented
//! arguments; the call format kept; irrelevance respected: see [`crate::toolcall::score`]) with
//! GRPO's episode advantage on every token and no KL term, as ToolRL trains small models (it
//! found the KL penalty held them back; with LoRA the only cheap reference would be the base
//! model, not the SFT policy RL starts from). Its tasks
//! carry their ground truth as the golden answer (a [`CallTask`] as JSON), so it trains on
//! `train tools`' tasks only; `RlConfig::validate` refuses it on worlds.

use toolsmith_agent::{Mode, Trajectory};

use crate::TrainError;
use crate::rl::config::RlConfig;
use crate::rl::loss::Aggregation;
use crate::rl::method::{CreditAssignment, CreditContext, GroupView, MethodSpec, TurnCredit, episode_credit};
use crate::rl::reward::EpisodeReward;
use crate::toolcall::CallTask;
use crate::toolcall::episode::calls_of;
use crate::toolcall::score;

/// The table entry.
pub static METHOD: MethodSpec = MethodSpec {
    name: "toolcall",
    aliases: &["tools"],
    summary: "Tool calls from interfaces: fine-grained name/argument/format reward; GRPO without KL (train tools).",
    mode: Mode::React,
    defaults,
    assign: &ToolCall,
};

struct ToolCall;

/// GRPO without KL, token mean (calls are short). No dynamic sampling: it compares exact
/// outcomes, and a group whose episodes are all inexact still ranks them by partial credit.
fn defaults(base: RlConfig) -> RlConfig {
    RlConfig { loss: base.loss.grpo(0.0, Aggregation::TokenMean), dynamic_sampling: false, ..base }
}

/// The episode's reward; `outcome` is 1 for an exact episode, else 0 (what dynamic sampling and
/// the accuracy curves read). A golden answer that is not a task scores 0.
pub fn reward(trajectory: &Trajectory, golden: &[String]) -> EpisodeReward {
    let Some(task) = CallTask::from_golden(golden) else {
        return EpisodeReward { total: 0.0, outcome: 0.0, steps: Vec::new() };
    };
    let (turns, format_ok) = calls_of(trajectory);
    let (total, exact) = score::reward(&task, &turns, format_ok);
    EpisodeReward { total, outcome: if exact { 1.0 } else { 0.0 }, steps: Vec::new() }
}

impl CreditAssignment for ToolCall {
    fn reward(&self, episode: &Trajectory, golden: &[String], _config: &RlConfig) -> EpisodeReward {
        reward(episode, golden)
    }

    fn credit(&self, group: &GroupView<'_>, context: &CreditContext<'_>) -> Result<Vec<Vec<TurnCredit>>, TrainError> {
        Ok(episode_credit(group, context.config.group_norm))
    }
}
