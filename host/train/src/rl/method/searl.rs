//! SEARL (self-evolving agents with a tool graph): dense behaviour rewards per turn (planning,
//! format, execution, creation; penalties for redundant calls and failed creations) plus the
//! outcome, and two advantages: the episode's `A_E` against its group and a tool-anchored step
//! advantage `A_S` that compares every turn anchored on the same tool across the group, combined
//! as `A = A_E + lambda * A_S` on the turn's tokens. The tool graph grows during training.

use std::collections::HashSet;

use toolsmith_agent::runner::StepRecord;
use toolsmith_agent::tools::CREATE_TOOL;
use toolsmith_agent::{Mode, Trajectory};

use crate::TrainError;
use crate::rl::advantage::GroupNorm;
use crate::rl::config::RlConfig;
use crate::rl::loss::Aggregation;
use crate::rl::method::{
    CreditAssignment, CreditContext, GroupView, MethodSpec, TurnCredit, add_step_credit, episode_credit,
};
use crate::rl::reward::{EpisodeReward, RewardConfig, call_key, correct};
use crate::rl::training_graph::GraphConfig;

/// The table entry.
pub static METHOD: MethodSpec = MethodSpec {
    name: "searl",
    aliases: &[],
    summary: "SEARL: dense behaviour rewards; episode plus tool-anchored step advantages; the tool graph grows with the best rollouts' tools.",
    mode: Mode::Searl,
    defaults,
    assign: &Searl,
};

struct Searl;

/// Symmetric clip, KL 0.001 (its released training script), sampling at 0.7 / 0.98 with
/// repetition penalty 1.05 (its Table 2), the population std of its equations 4 and 6, the tool
/// graph on. The paper gives its dense rewards no size; ours are 0.025 each, a quarter of
/// [`RewardConfig`]'s defaults: at 0.1 a well-formed turn whose calls execute earns 0.2, so five
/// turns of calling paid nearly a right answer's 1, and on SmolLM2 turns rose while answers fell
/// (held-out EM +0.00 ± 0.16 over 3 seeds, against +0.06 ± 0.06 at a quarter; BENCHMARKS.md).
fn defaults(base: RlConfig) -> RlConfig {
    let quarter = 0.25;
    let rewards = RewardConfig {
        planning: base.rewards.planning * quarter,
        creation: base.rewards.creation * quarter,
        execution: base.rewards.execution * quarter,
        format: base.rewards.format * quarter,
        ..base.rewards
    };
    RlConfig {
        rewards,
        loss: base.loss.grpo(0.001, Aggregation::TokenMean),
        group_norm: GroupNorm::MeanStdPopulation,
        temperature: 0.7,
        top_p: 0.98,
        repetition_penalty: 1.05,
        graph: Some(GraphConfig::default()),
        ..base
    }
}

/// Whether a `create_and_execute_mcp` call created its tool.
fn creation_succeeded(result: &serde_json::Value) -> bool {
    result.get("creation_success").and_then(serde_json::Value::as_bool).unwrap_or(false)
}

/// A turn's reward: planning, creation, execution and format rewards, minus redundant-call and
/// failed-creation penalties. `seen` holds the calls of earlier turns; `listed` the tools the
/// episode's listing named: writing one of those again earns no creation reward (calling it
/// would have done), so creating never pays more than reusing what the graph holds.
fn step_reward(step: &StepRecord, seen: &mut HashSet<String>, listed: &[String], config: &RewardConfig) -> f64 {
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
                let name = call.arguments.get("name").and_then(serde_json::Value::as_str);
                if !name.is_some_and(|n| listed.iter().any(|l| l == n)) {
                    r += config.creation;
                }
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

/// `R = R_orm + sum_t r_t`, with the outcome `R_orm` (1 for a right answer) added to the last
/// turn's reward so the discounted returns of earlier turns carry it.
pub fn reward(trajectory: &Trajectory, golden: &[String], config: &RewardConfig) -> EpisodeReward {
    let mut seen = HashSet::new();
    let mut steps: Vec<f64> =
        trajectory.steps.iter().map(|s| step_reward(s, &mut seen, &trajectory.tools, config)).collect();
    let outcome = f64::from(u8::from(correct(trajectory, golden)));
    match steps.last_mut() {
        Some(last) => *last += outcome,
        None => steps.push(outcome),
    }
    EpisodeReward { total: steps.iter().sum(), outcome, steps }
}

/// The anchor of each turn: the tool it invoked that is not the host's search (a created tool by
/// its name, or a registered tool); the first such call of the turn. The credit then maps a
/// created tool's name to the one the graph would merge it into.
pub fn anchors(episode: &Trajectory) -> Vec<Option<String>> {
    episode
        .steps
        .iter()
        .map(|s| {
            s.calls.iter().find(|c| c.name != "search").map(|c| match &c.created {
                Some(tool) => tool.manifest.name.as_str().to_string(),
                None => c.name.clone(),
            })
        })
        .collect()
}

impl CreditAssignment for Searl {
    fn reward(&self, episode: &Trajectory, golden: &[String], config: &RlConfig) -> EpisodeReward {
        reward(episode, golden, &config.rewards)
    }

    fn credit(&self, group: &GroupView<'_>, context: &CreditContext<'_>) -> Result<Vec<Vec<TurnCredit>>, TrainError> {
        let mut credit = episode_credit(group, context.config.group_norm);
        // Near-duplicate created tools anchor on the tool they merge into.
        let merged = |name: String| context.merged.get(&name).cloned().unwrap_or(name);
        let anchors: Vec<Vec<Option<String>>> =
            group.episodes.iter().map(|e| anchors(e).into_iter().map(|a| a.map(&merged)).collect()).collect();
        add_step_credit(&mut credit, group, &anchors, context.config);
        Ok(credit)
    }
}
