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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use serde_json::json;
    use toolsmith_agent::backend::{Backend, BackendError, BoxFuture, Completion, GenerateOptions, Message, Usage};

    use super::*;
    use crate::rl::Method;
    use crate::toolcall::{CallFamily, GoldenCall, Interface};

    /// A backend that answers each turn with the next scripted text, and keeps the prompts.
    #[derive(Debug)]
    struct Scripted {
        turns: Mutex<Vec<String>>,
        prompts: Mutex<Vec<Vec<Message>>>,
    }

    impl Backend for Scripted {
        fn name(&self) -> String {
            "scripted".into()
        }

        fn complete<'a>(
            &'a self,
            messages: &'a [Message],
            _options: &'a GenerateOptions,
        ) -> BoxFuture<'a, Result<Completion, BackendError>> {
            self.prompts.lock().expect("lock").push(messages.to_vec());
            let text = self.turns.lock().expect("lock").remove(0);
            Box::pin(async move {
                Ok(Completion { text, usage: Usage::default(), finish_reason: "stop".into(), tokens: None, raw: None })
            })
        }
    }

    fn chained() -> CallTask {
        let tool = |name: &str, param: &str, out: &str| Interface {
            name: name.into(),
            description: format!("{name}."),
            parameters: json!({"type": "object", "properties": {param: {"type": "string"}}, "required": [param]}),
            output_schema: json!({"type": "object", "properties": {out: {"type": "string"}}, "required": [out]}),
            real: false,
            examples: Vec::new(),
        };
        let args = |k: &str, v: &str| json!({k: v}).as_object().cloned().unwrap_or_default();
        CallTask {
            id: "c".into(),
            family: CallFamily::Chained,
            request: "Find the harbour of Lisbon, then its tide.".into(),
            tools: vec![tool("harbour_of", "city", "harbour"), tool("tide_at", "harbour", "tide")],
            turns: vec![
                vec![GoldenCall { name: "harbour_of".into(), arguments: args("city", "Lisbon") }],
                vec![GoldenCall { name: "tide_at".into(), arguments: args("harbour", "Doca") }],
            ],
            observations: vec![vec![json!({"harbour": "Doca"})], vec![json!({"tide": "high"})]],
            answer: "High.".into(),
        }
    }

    fn episode(task: &CallTask, turns: &[&str]) -> (Trajectory, Vec<Vec<Message>>) {
        let backend =
            Scripted { turns: Mutex::new(turns.iter().map(|t| (*t).to_string()).collect()), prompts: Mutex::default() };
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("tokio");
        let trajectory = runtime.block_on(crate::toolcall::episode::run(&backend, task, &GenerateOptions::default()));
        (trajectory, backend.prompts.into_inner().expect("lock"))
    }

    #[test]
    fn a_chained_episode_sees_the_golden_result_and_is_rewarded_through_the_table() {
        let task = chained();
        let golden = task.to_task().golden_answers;
        let first = r#"<tool_call>{"name": "harbour_of", "arguments": {"city": "lisbon"}}</tool_call>"#;
        let second = r#"<tool_call>{"name": "tide_at", "arguments": {"harbour": "Doca"}}</tool_call>"#;
        let (trajectory, prompts) = episode(&task, &[first, second]);
        assert_eq!(trajectory.steps.len(), 2);
        // The second turn was prompted with the golden observation of the first call.
        let seen = &prompts[1].last().expect("a prompt").content;
        assert!(seen.contains(r#""harbour":"Doca""#), "{seen}");
        let spec = Method::parse("toolcall").expect("registered").spec();
        let r = spec.assign.reward(&trajectory, &golden, &RlConfig::for_method(Method::TOOLCALL));
        assert_eq!((r.total, r.outcome), (1.0, 1.0));

        // A wrong second argument: exact fails; turn 1 scores 1, turn 2 0.25: 0.8 x 1.25 / 2 = 0.5.
        let wrong = r#"<tool_call>{"name": "tide_at", "arguments": {"harbour": "Cais"}}</tool_call>"#;
        let (trajectory, _) = episode(&task, &[first, wrong]);
        let r = reward(&trajectory, &golden);
        assert!((r.total - 0.5).abs() < 1e-12 && r.outcome == 0.0, "{r:?}");

        // No call at all: the episode ends after one turn and scores 0; an unclosed call 0 - 0.2.
        let (trajectory, _) = episode(&task, &["I would rather not."]);
        assert_eq!(trajectory.steps.len(), 1);
        assert_eq!(reward(&trajectory, &golden).total, 0.0);
        let (trajectory, _) = episode(&task, &[r#"<tool_call>{"name": "harbour_of""#]);
        assert!((reward(&trajectory, &golden).total + 0.2).abs() < 1e-12);
        // A golden answer that is not a task scores 0 rather than failing the run.
        assert_eq!(reward(&trajectory, &["Lisbon".to_string()]).total, 0.0);
    }

    #[test]
    fn the_method_is_refused_on_worlds_and_worlds_are_refused_to_it() {
        let on_worlds = RlConfig::for_method(Method::TOOLCALL);
        assert!(on_worlds.validate().is_err_and(|e| e.to_string().contains("train tools")));
        let gap_on_calls = RlConfig { call_tasks: Some("t.jsonl".into()), ..RlConfig::for_method(Method::GAP) };
        assert!(gap_on_calls.validate().is_err_and(|e| e.to_string().contains("only method toolcall")));
    }
}
