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

/// The tiny policy in f32, shared as the backends take it.
fn tiny(seed: u64) -> Arc<Mutex<Policy>> {
    let options = LoadOptions { precision: Some(toolsmith_policy::Precision::F32), ..Default::default() };
    Arc::new(Mutex::new(Policy::tiny(seed, options).expect("tiny policy")))
}

fn options(i: usize) -> GenerateOptions {
    GenerateOptions { max_tokens: 6 + 5 * i, temperature: 0.0, ..GenerateOptions::default() }
}

fn ids(c: &Completion) -> Vec<i64> {
    c.tokens.as_ref().map(|t| t.output_ids.clone()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_join_a_running_batch_and_answer_as_alone() {
    let policy = tiny(3);
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
    assert!(chars.len() > 16, "the tiny model writes something: {:?}", full.text);
    // Across a word boundary, so across two tokens: the end of one word and the next's start.
    let space = chars.iter().enumerate().skip(1).find(|(_, c)| **c == ' ').map(|(i, _)| i).expect("two words");
    let stop: String = chars[space - 2..space + 2].iter().collect();
    let cut = full.text.find(&stop).expect("the stop string occurs");
    let with_stop = GenerateOptions { stop: vec![stop.clone()], ..long.clone() };
    let config = BatchConfig { join_every: 1, ..BatchConfig::default() };
    let tokenwise = BatchedBackend::new(policy.clone(), "tiny", config);
    let (got, _) = tokenwise.complete_with_step(&[Message::user(QUESTIONS[0])], &with_stop).await.expect("stop");
    assert_eq!(got.text, full.text[..cut], "stop {stop:?}");
    assert_eq!(got.finish_reason, "stop");
    // The ids end at the token that completed the stop string, as decoding alone does.
    let alone_stopped = alone.complete(&[Message::user(QUESTIONS[0])], &with_stop).await.expect("alone");
    assert_eq!(ids(&got), ids(&alone_stopped));
    assert_eq!(got.tokens.as_ref().map(|t| t.logprobs.len()), Some(ids(&got).len()));
    // With pauses every 3 tokens too.
    let (paused, _) = batched.complete_with_step(&[Message::user(QUESTIONS[0])], &with_stop).await.expect("stop");
    assert_eq!((paused.text.as_str(), ids(&paused)), (&full.text[..cut], ids(&alone_stopped)));

    // Streamed, the pieces add up to the answer (cut at a stop string), none sent twice.
    let stream = |options: GenerateOptions| {
        let tokenwise = &tokenwise;
        async move {
            let (pieces, mut received) = tokio::sync::mpsc::unbounded_channel();
            let (c, _) =
                tokenwise.complete_streaming(&[Message::user(QUESTIONS[0])], &options, pieces).await.expect("streamed");
            let mut all = Vec::new();
            while let Ok(piece) = received.try_recv() {
                all.push(piece);
            }
            (c.text, all)
        }
    };
    let (text, pieces) = stream(long.clone()).await;
    assert_eq!((text.as_str(), pieces.concat()), (full.text.as_str(), full.text.clone()));
    assert!(pieces.len() > 1 && pieces.iter().all(|p| !p.is_empty()), "{pieces:?}");
    let (text, pieces) = stream(with_stop.clone()).await;
    assert_eq!((text.as_str(), pieces.concat()), (&full.text[..cut], full.text[..cut].to_string()));

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

/// What rollouts do between an iteration's decoding and its update: the backend's cache is
/// emptied and its memory released; the next turn is prefilled whole and answers the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_memory_empties_the_prefix_cache_and_changes_no_answer() {
    let policy = tiny(5);
    let alone = LocalBackend::shared(policy.clone(), "tiny");
    let config = BatchConfig { prefix_cache_bytes: 64 << 20, ..BatchConfig::default() };
    let batched = BatchedBackend::new(policy.clone(), "tiny", config);
    let first = vec![Message::user(QUESTIONS[0])];
    let (answer, _) = batched.complete_with_step(&first, &options(1)).await.expect("first turn");
    assert!(batched.cached_bytes() > 0, "the first turn's keys and values are kept");

    batched.release_memory();
    assert_eq!(batched.cached_bytes(), 0);
    let second =
        vec![Message::user(QUESTIONS[0]), Message::assistant(answer.text.clone()), Message::user(QUESTIONS[1])];
    let (again, _) = batched.complete_with_step(&second, &options(2)).await.expect("second turn");
    let expected = alone.complete(&second, &options(2)).await.expect("alone");
    assert_eq!((ids(&again), again.text), (ids(&expected), expected.text.clone()));
    // The default (a backend that keeps nothing) is a no-op.
    alone.release_memory();
    assert_eq!(alone.complete(&second, &options(2)).await.expect("alone again").text, expected.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_greedy_answer_ends_where_it_starts_to_loop_across_pauses_too() {
    use toolsmith_policy::FinishReason;
    use toolsmith_policy::sampling::loops;
    let policy = tiny(3);
    let free = GenerateOptions { max_tokens: 160, temperature: 0.0, stop: Vec::new(), ..GenerateOptions::default() };
    let stopping = GenerateOptions { stop_loops: true, ..free.clone() };
    let whole = BatchedBackend::new(policy.clone(), "tiny", BatchConfig::default());
    let mut looped = 0;
    for text in ["<think>the the the the the", "<tool_call>{\"name\": \"search\"", "hi"] {
        let prompt = Prompt::Text(text.into());
        let (long, _, _) = whole.generate(prompt.clone(), &free).await.expect("free");
        let Some(first) = (1..=long.output_ids.len()).find(|&n| loops(&long.output_ids[..n])) else { continue };
        looped += 1;
        // Decoded to its end, and in chunks of 5 tokens (continuous batching), whose own outputs
        // are each too short to show the loop: both stop at the same token.
        for join_every in [0, 5] {
            let backend =
                BatchedBackend::new(policy.clone(), "tiny", BatchConfig { join_every, ..BatchConfig::default() });
            let (g, _, _) = backend.generate(prompt.clone(), &stopping).await.expect("stopping");
            assert_eq!(g.output_ids, long.output_ids[..first], "{text:?}, pauses every {join_every}");
            assert_eq!(g.finish_reason, FinishReason::Length);
        }
    }
    assert!(looped > 0, "no prompt made the tiny model loop: the test needs one that does");
}

/// A sampled answer decoded in chunks (a pause after every token) draws what it draws alone:
/// each chunk's sampler starts past the tokens already drawn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sampled_answer_decoded_in_chunks_draws_what_it_draws_alone() {
    let policy = tiny(3);
    let alone = LocalBackend::shared(policy.clone(), "tiny");
    let sampled = GenerateOptions { max_tokens: 40, temperature: 1.0, seed: 11, ..GenerateOptions::default() };
    let sampled_alone = alone.complete(&[Message::user(QUESTIONS[3])], &sampled).await.expect("alone");
    assert!(ids(&sampled_alone).len() > 10, "{:?}", sampled_alone.text);
    let tokenwise =
        BatchedBackend::new(policy.clone(), "tiny", BatchConfig { join_every: 1, ..BatchConfig::default() });
    let (chunked, _) = tokenwise.complete_with_step(&[Message::user(QUESTIONS[3])], &sampled).await.expect("chunked");
    assert_eq!((ids(&chunked), chunked.text), (ids(&sampled_alone), sampled_alone.text));
}
