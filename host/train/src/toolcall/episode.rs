//! One episode of a tool-call task: the served prompt, the policy's turns, and between them the
//! observations of its calls.
//!
//! A call that is a golden call of its turn is answered with the golden result, so a chained
//! task's second turn sees the value its ground truth was built on; any other call is answered
//! from the tool's output schema, seeded by the call (the episode is wrong already, and the same
//! call always gets the same answer). The episode ends at a turn without calls, or after the
//! task's last golden turn.

use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Value, json};
use toolsmith_agent::backend::{Backend, GenerateOptions, Message};
use toolsmith_agent::function_calling::observation_text;
use toolsmith_agent::runner::StepRecord;
use toolsmith_agent::tools::Verdict;
use toolsmith_agent::{CallRecord, Finish, Mode, Trajectory};

use super::score::{Predicted, call_exact};
use super::tasks::call_seed;
use super::{CallTask, values};

/// The calls of a turn's text, and whether its format held (every tag closed, every call JSON).
pub fn parse_turn(text: &str) -> (Vec<Predicted>, bool) {
    let turn = toolsmith_agent::trace::parse(text);
    let mut ok = turn.errors.is_empty();
    let mut calls = Vec::new();
    for c in turn.tool_calls() {
        match c {
            Ok(c) => calls.push(Predicted { name: c.name, arguments: Value::Object(c.arguments) }),
            Err(_) => ok = false,
        }
    }
    (calls, ok)
}

/// What turn `turn`'s calls return.
pub fn results(task: &CallTask, turn: usize, calls: &[Predicted]) -> Vec<Value> {
    let golden = task.turns.get(turn).map(Vec::as_slice).unwrap_or_default();
    let seen = task.observations.get(turn).map(Vec::as_slice).unwrap_or_default();
    calls
        .iter()
        .map(|c| {
            let Some(tool) = task.tool(&c.name) else {
                return json!({"error": {"kind": "unknown_tool", "message": format!("no tool named `{}` is listed", c.name)}});
            };
            if let Some(i) = golden.iter().position(|g| call_exact(Some(tool), g, c))
                && let Some(r) = seen.get(i)
            {
                return r.clone();
            }
            let args = c.arguments.as_object().cloned().unwrap_or_default();
            let mut rng = StdRng::seed_from_u64(call_seed(&c.name, &args));
            values::output(&tool.output_schema, &mut rng).unwrap_or_else(|e| json!({"error": e.to_string()}))
        })
        .collect()
}

/// The observation turn's text for `calls` and their results.
pub fn observation(calls: &[Predicted], results: &[Value]) -> String {
    calls.iter().zip(results).map(|(c, r)| observation_text(&c.name, r)).collect::<Vec<_>>().join("\n")
}

/// Whether an episode goes on after turn `turn` made `calls`.
pub fn continues(task: &CallTask, turn: usize, calls: &[Predicted]) -> bool {
    !calls.is_empty() && turn + 1 < task.turns.len()
}

/// An episode's calls turn by turn, and whether every turn kept the format.
pub fn calls_of(trajectory: &Trajectory) -> (Vec<Vec<Predicted>>, bool) {
    let mut ok = true;
    let turns = trajectory
        .steps
        .iter()
        .map(|s| {
            let (calls, fine) = parse_turn(&s.text);
            ok &= fine;
            calls
        })
        .collect();
    (turns, ok)
}

fn empty(question: &str, system: String, backend: String) -> Trajectory {
    Trajectory {
        question: question.to_string(),
        mode: Mode::React,
        backend,
        steps: Vec::new(),
        plan: None,
        answer: None,
        finish: Finish::Answered,
        tools: Vec::new(),
        system,
        wall_ms: 0.0,
    }
}

/// An episode that could not run (it scores 0 and trains nothing).
pub fn failed(question: &str, why: &str) -> Trajectory {
    Trajectory { finish: Finish::BackendError(why.to_string()), ..empty(question, String::new(), String::new()) }
}

/// Runs `task` on `backend`.
pub async fn run(backend: &dyn Backend, task: &CallTask, options: &GenerateOptions) -> Trajectory {
    let started = std::time::Instant::now();
    let system = task.system();
    let mut trajectory = empty(&task.request, system.clone(), backend.name());
    trajectory.tools = task.tools.iter().map(|t| t.name.clone()).collect();
    for turn in 0..task.turns.len().max(1) {
        let messages: Vec<Message> =
            toolsmith_agent::runner::context(Mode::React.context(), &system, &task.request, &trajectory.steps);
        let t0 = std::time::Instant::now();
        let completion = match backend.complete(&messages, options).await {
            Ok(c) => c,
            Err(e) => {
                trajectory.finish = Finish::BackendError(e.to_string());
                break;
            }
        };
        let (calls, _) = parse_turn(&completion.text);
        let results = results(task, turn, &calls);
        let go_on = continues(task, turn, &calls);
        trajectory.steps.push(StepRecord {
            text: completion.text.clone(),
            prompt_tokens: completion.usage.prompt_tokens,
            response_tokens: completion.usage.completion_tokens,
            calls: calls
                .iter()
                .zip(&results)
                .map(|(c, r)| CallRecord {
                    name: c.name.clone(),
                    arguments: c.arguments.clone(),
                    result: r.clone(),
                    verdict: Verdict::Valid,
                    latency_ms: 0.0,
                    started_ms: 0.0,
                    level: 0,
                    task: None,
                    created: None,
                })
                .collect(),
            observation: observation(&calls, &results),
            errors: Vec::new(),
            model_ms: t0.elapsed().as_secs_f64() * 1e3,
            system: (turn == 0).then(|| system.clone()),
            tokens: completion.tokens,
            raw: None,
        });
        if !go_on {
            if calls.is_empty() {
                trajectory.answer = Some(completion.text);
            }
            break;
        }
    }
    trajectory.wall_ms = started.elapsed().as_secs_f64() * 1e3;
    trajectory
}
