//! The agent loop with a scripted policy: failed calls and retries bind to the right plan tasks,
//! MemPO's context keeps only the question, the latest memory and the last step, parse errors
//! come back as observations, and the turn budget holds.

use std::sync::{Arc, Mutex};

use toolsmith_agent::backend::{Backend, BackendError, BoxFuture, Completion, GenerateOptions, Message, Role, Usage};
use toolsmith_agent::env::{Corpus, Document};
use toolsmith_agent::tools::{LocalTools, Verdict};
use toolsmith_agent::{Agent, AgentConfig, Finish, Mode};

/// Plays fixed turns and remembers what it was shown.
#[derive(Debug)]
struct Scripted {
    turns: Vec<&'static str>,
    seen: Mutex<Vec<Vec<Message>>>,
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
        Box::pin(async move {
            let mut seen = self.seen.lock().expect("lock");
            let text = self.turns.get(seen.len()).copied().unwrap_or("<think>out of script</think>");
            seen.push(messages.to_vec());
            Ok(Completion {
                text: text.into(),
                usage: Usage { prompt_tokens: 10, completion_tokens: 5 },
                finish_reason: "stop".into(),
                tokens: None,
                raw: None,
            })
        })
    }
}

fn tools() -> Arc<LocalTools> {
    let docs = vec![
        Document { title: "Ada".into(), text: "Ada was born in London.".into() },
        Document { title: "Alan".into(), text: "Alan was born in Maida Vale.".into() },
    ];
    Arc::new(LocalTools::new().with_corpus(Arc::new(Corpus::new(&docs).expect("corpus"))))
}

fn agent(mode: Mode, turns: Vec<&'static str>, max_turns: usize) -> (Agent, Arc<Scripted>) {
    let backend = Arc::new(Scripted { turns, seen: Mutex::new(Vec::new()) });
    let config = AgentConfig { mode, max_turns, ..AgentConfig::default() };
    (Agent::new(backend.clone(), tools(), config), backend)
}

#[tokio::test]
async fn retries_bind_to_the_task_they_carry_out() {
    let (agent, _) = agent(
        Mode::Gap,
        vec![
            "<plan>\nTask 1: find Ada - Dependencies: none\nTask 2: find Alan - Dependencies: none\nTask 3: compare - Dependencies: Task 1, Task 2\n</plan>\n<tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"\"}}</tool_call>\n<tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"Ada\"}}</tool_call>",
            "<tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"Alan\"}}</tool_call>",
            "<tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"London\"}}</tool_call>",
            "<answer>\\boxed{different cities}</answer>",
        ],
        8,
    );
    let t = agent.run("Were Ada and Alan born in the same city?").await;
    assert_eq!(t.finish, Finish::Answered);
    assert_eq!(t.answer.as_deref(), Some("different cities"));
    let first = &t.steps[0].calls;
    assert_eq!(first[0].verdict, Verdict::InvalidArgs, "{}", first[0].result);
    assert_eq!(first[0].task, None, "a failed call carries out nothing");
    assert_eq!(first[1].task.as_deref(), Some("1"));
    assert_eq!(t.steps[1].calls[0].task.as_deref(), Some("2"), "the retry is task 2's call");
    assert_eq!(t.steps[2].calls[0].task.as_deref(), Some("3"));
    let steps = t.plan_steps();
    assert_eq!(steps.len(), 3);
    assert!(t.steps[0].observation.contains("invalid_args"), "{}", t.steps[0].observation);
    assert_eq!((t.total_tokens(), t.peak_tokens()), (60, 15));
}

#[tokio::test]
async fn memory_mode_sees_only_the_question_the_latest_memory_and_the_last_step() {
    let (agent, backend) = agent(
        Mode::Mem,
        vec![
            "<mem>nothing yet</mem><tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"Ada\"}}</tool_call>",
            "<mem>Ada: London</mem><tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"Alan\"}}</tool_call>",
            "<think>no memory this turn</think><tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"Alan\"}}</tool_call>",
            "<answer>London; Maida Vale</answer>",
        ],
        8,
    );
    let t = agent.run("Where were Ada and Alan born?").await;
    assert_eq!(t.turns(), 4);
    let seen = backend.seen.lock().expect("lock");
    // Turn 3 sees: system, question, turn 2 and its observation; not turn 1.
    let third = &seen[2];
    assert_eq!(
        third.iter().map(|m| m.role).collect::<Vec<_>>(),
        [Role::System, Role::User, Role::Assistant, Role::User]
    );
    assert!(third[2].content.contains("Ada: London") && !third.iter().any(|m| m.content.contains("nothing yet")));
    // Turn 4: the last step has no memory, so the latest one travels with the question.
    let fourth = &seen[3];
    assert!(
        fourth[1].content.starts_with("Where were Ada and Alan born?")
            && fourth[1].content.contains("<mem>Ada: London</mem>")
    );
    assert!(fourth[2].content.contains("no memory this turn"));
    // One supervised example per turn, each as the model saw it.
    let examples = t.examples();
    assert_eq!(examples.len(), 4);
    assert_eq!(examples[2].len(), third.len() + 1);
}

#[tokio::test]
async fn bad_turns_become_observations_and_the_budget_holds() {
    let (agent, backend) = agent(
        Mode::React,
        vec![
            "<tool_call>{not json}</tool_call>",
            "<plan>Task 1: a - Dependencies: Task 2\nTask 2: b - Dependencies: Task 1</plan>",
            "<tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"Ada\"}}</tool_call><tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"Alan\"}}</tool_call>",
            "just words",
        ],
        4,
    );
    let t = agent.run("Where was Ada born?").await;
    assert_eq!(t.finish, Finish::Budget);
    assert_eq!(t.turns(), 4);
    assert!(t.steps[0].observation.contains("error"), "{}", t.steps[0].observation);
    assert!(t.steps[1].errors.iter().any(|e| e.contains("cycle")), "{:?}", t.steps[1].errors);
    assert_eq!(t.steps[2].calls.len(), 1, "react runs one call per turn");
    assert!(t.steps[2].errors.iter().any(|e| e.contains("one call per turn")));
    assert!(t.steps[3].observation.contains("write a <tool_call> or an <answer>"));
    assert_eq!(backend.seen.lock().expect("lock").len(), 4);
}
