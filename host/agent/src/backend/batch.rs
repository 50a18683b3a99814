//! The local policy behind a batching queue: turns requested by concurrent episodes (a group of
//! rollouts of one task, several groups at once) are decoded together as one batch.
//!
//! Each episode runs its own agent loop on the async runtime; when it needs a turn it queues the
//! request and awaits the answer, so its tool calls overlap with other episodes' decoding. One
//! worker thread owns the decoding: it takes every queued request (waiting a short window for
//! requests that arrive together, as a group's first turns do), groups those with the same
//! sampling settings, and decodes each group as one left-padded batch with a seed per request
//! (the seed it would have alone; padding changes its logits only by rounding). The worker keeps
//! each episode's keys and values between its turns, so a turn prefills only the observation and
//! the new turn's header.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use toolsmith_policy::{Policy, PrefixCache};

use super::{Backend, BackendError, BoxFuture, ChatTemplate, Completion, GenerateOptions, Message};

struct Job {
    messages: Vec<Message>,
    options: GenerateOptions,
    reply: tokio::sync::oneshot::Sender<Result<Completion, BackendError>>,
}

/// A local policy that decodes concurrent requests as batches.
#[derive(Debug, Clone)]
pub struct BatchedBackend {
    queue: Sender<Job>,
    label: String,
}

/// How the worker batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchConfig {
    /// Requests decoded together at most.
    pub max_batch: usize,
    /// How long the worker waits for more requests after the first of a batch.
    pub window: Duration,
    /// Bytes of keys and values kept between turns, so that an episode's next turn prefills
    /// only its new tokens (0: no prefix cache).
    pub prefix_cache_bytes: usize,
}

impl Default for BatchConfig {
    fn default() -> Self {
        // A few milliseconds: far below one turn's decoding, long enough for requests that
        // arrive together (a group's first turns) to share a batch.
        BatchConfig { max_batch: 64, window: Duration::from_millis(5), prefix_cache_bytes: super::PREFIX_CACHE_BYTES }
    }
}

impl BatchedBackend {
    /// A backend over `policy` (shared, e.g. with a trainer that updates it between rollouts);
    /// its worker thread ends when the last clone is dropped.
    pub fn new(policy: Arc<Mutex<Policy>>, label: impl Into<String>, config: BatchConfig) -> Self {
        let (queue, jobs) = channel();
        std::thread::Builder::new()
            .name("toolsmith-batch".into())
            .spawn(move || worker(&policy, &jobs, config))
            .map(drop)
            .unwrap_or_else(|e| tracing::error!("cannot start the batching worker: {e}"));
        BatchedBackend { queue, label: label.into() }
    }
}

impl Backend for BatchedBackend {
    fn name(&self) -> String {
        format!("local:{}", self.label)
    }

    fn complete<'a>(
        &'a self,
        messages: &'a [Message],
        options: &'a GenerateOptions,
    ) -> BoxFuture<'a, Result<Completion, BackendError>> {
        Box::pin(async move {
            let (reply, answer) = tokio::sync::oneshot::channel();
            let job = Job { messages: messages.to_vec(), options: options.clone(), reply };
            self.queue.send(job).map_err(|_| BackendError::Join("the batching worker has stopped".into()))?;
            answer.await.map_err(|_| BackendError::Join("the batching worker dropped a request".into()))?
        })
    }
}

fn worker(policy: &Mutex<Policy>, jobs: &Receiver<Job>, config: BatchConfig) {
    let mut prefix = PrefixCache::new(config.prefix_cache_bytes);
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        let deadline = Instant::now() + config.window;
        while batch.len() < config.max_batch {
            let left = deadline.saturating_duration_since(Instant::now());
            match jobs.recv_timeout(left) {
                Ok(job) => batch.push(job),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
            }
        }
        // Requests with the same settings (all but the seed) decode together.
        while !batch.is_empty() {
            let key = GenerateOptions { seed: 0, ..batch[0].options.clone() };
            let (same, rest): (Vec<Job>, Vec<Job>) =
                batch.into_iter().partition(|j| GenerateOptions { seed: 0, ..j.options.clone() } == key);
            batch = rest;
            let policy = toolsmith_contract::sync::lock(policy);
            decode(&policy, same, &mut prefix);
        }
    }
}

/// Decodes one batch of requests with the same settings and answers each.
fn decode(policy: &Policy, jobs: Vec<Job>, prefix: &mut PrefixCache) {
    let tokenizer = policy.tokenizer();
    let template = match ChatTemplate::of(tokenizer) {
        Ok(t) => t,
        Err(e) => {
            let message = e.to_string();
            for job in jobs {
                let _ = job.reply.send(Err(BackendError::Template(message.clone())));
            }
            return;
        }
    };
    let context = policy.context_len();
    // Each request's prompt; a request that cannot be encoded or does not fit is answered now.
    let mut ready: Vec<(Job, Vec<i64>)> = Vec::with_capacity(jobs.len());
    for job in jobs {
        match template.encode(tokenizer, &job.messages, true) {
            Ok(e) if e.ids.len() >= context => {
                let _ = job.reply.send(Err(BackendError::ContextFull { prompt: e.ids.len(), context }));
            }
            Ok(e) => ready.push((job, e.ids)),
            Err(e) => {
                let _ = job.reply.send(Err(e));
            }
        }
    }
    let Some((first, _)) = ready.first() else { return };
    let options = first.options.clone();
    let longest = ready.iter().map(|(_, p)| p.len()).max().unwrap_or(0);
    // The batch shares one budget; the longest prompt bounds it within the context. Each
    // request's seed is passed on its own.
    let params = options.sampling(context - longest);
    let prompts: Vec<Vec<i64>> = ready.iter().map(|(_, p)| p.clone()).collect();
    let seeds: Vec<u64> = ready.iter().map(|(j, _)| j.options.seed).collect();
    let end_of_turn = template.end_of_turn(tokenizer).ok().flatten();
    match policy.generate_with_prefix(&prompts, &params, Some(&seeds), None, prefix) {
        Ok((generations, _)) => {
            for ((job, prompt), g) in ready.into_iter().zip(generations) {
                let _ = job.reply.send(Ok(Completion::from_generation(g, prompt.len(), end_of_turn)));
            }
        }
        Err(e) => {
            let message = e.to_string();
            for (job, _) in ready {
                let _ = job.reply.send(Err(BackendError::Join(format!("batched generation failed: {message}"))));
            }
        }
    }
}
