//! Continuous batching (the daemon's endpoints): requests that arrive while a batch decodes join
//! it at the next pause, and each answer is the one the policy gives the request alone (greedy),
//! stop strings that straddle a pause included.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use toolsmith_agent::backend::{
    Backend, BatchConfig, BatchedBackend, Completion, GenerateOptions, LocalBackend, Message, Prompt,
};
use toolsmith_policy::{LoadOptions, Policy};

const QUESTIONS: [&str; 6] = [
    "Where was Ada born?",
    "What is two plus two?",
    "Name a river in the north.",
    "Which tool converts miles to kilometres?",
    "Summarise the last observation.",
    "Who founded the city of Keltis?",
];

fn options(i: usize) -> GenerateOptions {
    GenerateOptions { max_tokens: 6 + 5 * i, temperature: 0.0, ..GenerateOptions::default() }
}

fn ids(c: &Completion) -> Vec<i64> {
    c.tokens.as_ref().map(|t| t.output_ids.clone()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_join_a_running_batch_and_answer_as_alone() {
    let policy = Arc::new(Mutex::new(Policy::tiny(3, LoadOptions::default()).expect("tiny policy")));
    let alone = LocalBackend::shared(policy.clone(), "tiny");
    let mut expected = Vec::new();
    for (i, q) in QUESTIONS.iter().enumerate() {
        expected.push(alone.complete(&[Message::user(*q)], &options(i)).await.expect("alone"));
    }

    let config = BatchConfig { join_every: 3, ..BatchConfig::default() };
    let batched = Arc::new(BatchedBackend::new(policy.clone(), "tiny", config));
    // Staggered: later requests arrive while earlier ones are being decoded.
    let tasks: Vec<_> = QUESTIONS
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let batched = batched.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(15 * i as u64)).await;
                batched.complete_with_step(&[Message::user(*q)], &options(i)).await
            })
        })
        .collect();
    for (i, task) in tasks.into_iter().enumerate() {
        let (got, step) = task.await.expect("task").expect("batched");
        assert_eq!(ids(&got), ids(&expected[i]), "request {i}");
        assert_eq!(got.text, expected[i].text, "request {i}");
        assert_eq!((got.usage, got.finish_reason.as_str()), (expected[i].usage, expected[i].finish_reason.as_str()));
        assert_eq!(step, 0);
    }

    // A stop string that starts in one chunk and ends in the next still stops the answer there.
    let long = GenerateOptions { max_tokens: 24, temperature: 0.0, ..GenerateOptions::default() };
    let full = alone.complete(&[Message::user(QUESTIONS[0])], &long).await.expect("alone");
    let chars: Vec<char> = full.text.chars().collect();
    assert!(chars.len() > 12, "the tiny model writes something: {:?}", full.text);
    let stop: String = chars[5..9].iter().collect();
    let cut = full.text.find(&stop).expect("the stop string occurs");
    let with_stop = GenerateOptions { stop: vec![stop.clone()], ..long.clone() };
    let config = BatchConfig { join_every: 1, ..BatchConfig::default() };
    let tokenwise = BatchedBackend::new(policy.clone(), "tiny", config);
    let (got, _) = tokenwise.complete_with_step(&[Message::user(QUESTIONS[0])], &with_stop).await.expect("stop");
    assert_eq!(got.text, full.text[..cut], "stop {stop:?}");
    assert_eq!(got.finish_reason, "stop");

    // Raw token ids (`/v1/completions`, an engine's rollouts) continue exactly like the chat turn
    // they encode; ids outside the vocabulary are refused.
    let (chat, _) = batched.complete_with_step(&[Message::user(QUESTIONS[2])], &options(2)).await.expect("chat");
    let prompt = {
        let policy = policy.lock().expect("policy");
        toolsmith_agent::backend::local::prompt_ids(&policy, &[Message::user(QUESTIONS[2])]).expect("prompt ids")
    };
    let (raw, _, _) = batched.generate(Prompt::Ids(prompt.clone()), &options(2)).await.expect("ids");
    assert_eq!((raw.prompt_ids, raw.output_ids), (prompt, ids(&chat)));
    assert!(batched.generate(Prompt::Ids(vec![-1]), &options(0)).await.is_err());
    assert!(batched.generate(Prompt::Ids(Vec::new()), &options(0)).await.is_err());

    // A prompt longer than the context is refused, and the worker goes on.
    let huge = "word ".repeat(50_000);
    assert!(batched.complete_with_step(&[Message::user(huge)], &options(0)).await.is_err());
    let (again, _) = batched.complete_with_step(&[Message::user(QUESTIONS[1])], &options(1)).await.expect("again");
    assert_eq!(ids(&again), ids(&expected[1]));
}
