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
//!
//! With [`BatchConfig::join_every`] set (the daemon's endpoints), batching is continuous: the
//! running batch pauses every `join_every` tokens, requests that arrived meanwhile join it, and
//! finished ones leave, so a new request waits for a few tokens, not for the longest answer in
//! flight. A paused sequence resumes from the prefix cache (its keys and values are kept, only the
//! last token is fed again, and a sampled one draws what it would have drawn uninterrupted).

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use toolsmith_policy::constrain::TokenTable;
use toolsmith_policy::{
    FinishReason, Generation, Policy, PrefixCache, SamplingParams, Tokenizer, TurnConstraint, TurnGrammar, TurnMatcher,
};

use super::{Backend, BackendError, BoxFuture, ChatTemplate, Completion, GenerateOptions, Message};

/// What a request asks the policy to continue.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// A conversation, through the chat template with the assistant's turn opened.
    Chat(Vec<Message>),
    /// Text as it is (no template, no special tokens).
    Text(String),
    /// Token ids as they are.
    Ids(Vec<i64>),
}

/// A finished request: the generation, the template's end-of-turn token, and the step of the
/// weights that finished it.
type Finished = (Generation, Option<i64>, u64);

type Reply = tokio::sync::oneshot::Sender<Result<Finished, BackendError>>;

/// Where a streaming request's text goes, piece by piece, as it becomes final.
pub type TextStream = tokio::sync::mpsc::UnboundedSender<String>;

struct Job {
    prompt: Prompt,
    stream: Option<TextStream>,
    options: GenerateOptions,
    /// What the turn may be (tool calls, a JSON document); `None` decodes freely.
    grammar: Option<Arc<TurnGrammar>>,
    reply: Reply,
}

/// A local policy that decodes concurrent requests as batches.
#[derive(Debug, Clone)]
pub struct BatchedBackend {
    queue: Sender<Job>,
    /// Requests in the running batch, as the continuous worker last counted them.
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
    label: String,
    /// The worker's prefix cache, shared so that [`Backend::release_memory`] can empty it while
    /// the worker waits for requests.
    prefix: Arc<Mutex<PrefixCache>>,
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
    /// Continuous batching: the running batch admits new requests every this many tokens (0:
    /// each batch decodes to its end first, which suits rollouts that start together).
    pub join_every: usize,
}

impl Default for BatchConfig {
    fn default() -> Self {
        // A few milliseconds: far below one turn's decoding, long enough for requests that
        // arrive together (a group's first turns) to share a batch.
        BatchConfig {
            max_batch: 64,
            window: Duration::from_millis(5),
            prefix_cache_bytes: super::PREFIX_CACHE_BYTES,
            join_every: 0,
        }
    }
}

impl BatchConfig {
    /// Settings for `episodes` agent loops of `policy` that run side by side (rollout groups, a
    /// held-out evaluation), each of up to `max_turns` turns of `max_tokens`: a turn's requests
    /// wait up to 100 ms for each other (an episode's tool calls take milliseconds, a turn's
    /// decoding seconds, and a bigger batch costs less per row), and the prefix cache holds every
    /// episode's conversation, so no turn prefills its episode's history again.
    pub fn for_episodes(episodes: usize, max_turns: usize, max_tokens: usize, policy: &Policy) -> Self {
        // The system prompt with its tool listing, then each turn's answer and observation (both
        // estimated generously; an entry that does not fit is prefilled again).
        let tokens = max_turns.saturating_mul(max_tokens + 256).saturating_add(1024).min(policy.context_len());
        let bytes = episodes.saturating_mul(tokens).saturating_mul(policy.kv_bytes_per_token());
        BatchConfig {
            max_batch: episodes.max(1),
            window: Duration::from_millis(100),
            prefix_cache_bytes: bytes.max(super::PREFIX_CACHE_BYTES),
            join_every: 0,
        }
    }
}

impl BatchedBackend {
    /// A backend over `policy` (shared, e.g. with a trainer that updates it between rollouts);
    /// its worker thread ends when the last clone is dropped.
    pub fn new(policy: Arc<Mutex<Policy>>, label: impl Into<String>, config: BatchConfig) -> Self {
        let (queue, jobs) = channel();
        let prefix = Arc::new(Mutex::new(PrefixCache::new(config.prefix_cache_bytes)));
        let cache = prefix.clone();
        let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = in_flight.clone();
        std::thread::Builder::new()
            .name("toolsmith-batch".into())
            .spawn(move || {
                if config.join_every == 0 {
                    worker(&policy, &jobs, &cache, config)
                } else {
                    continuous(&policy, &jobs, &cache, config, &counter)
                }
            })
            .map(drop)
            .unwrap_or_else(|e| tracing::error!("cannot start the batching worker: {e}"));
        BatchedBackend { queue, in_flight, label: label.into(), prefix }
    }

    /// Bytes of keys and values the prefix cache holds now.
    pub fn cached_bytes(&self) -> usize {
        toolsmith_contract::sync::lock(&self.prefix).bytes()
    }

    /// A completion, with the step of the weights that finished it (a served policy is swapped
    /// between chunks of continuous batching).
    pub async fn complete_with_step(
        &self,
        messages: &[Message],
        options: &GenerateOptions,
    ) -> Result<(Completion, u64), BackendError> {
        let (g, end_of_turn, step) = self.generate(Prompt::Chat(messages.to_vec()), options).await?;
        let prompt_tokens = g.prompt_ids.len();
        Ok((Completion::from_generation(g, prompt_tokens, end_of_turn), step))
    }

    /// Continues any prompt (`/v1/completions`): the generation, the chat template's end-of-turn
    /// token and the step of the weights that finished it.
    pub async fn generate(
        &self,
        prompt: Prompt,
        options: &GenerateOptions,
    ) -> Result<(Generation, Option<i64>, u64), BackendError> {
        self.generate_streaming(prompt, options, None).await
    }

    /// [`BatchedBackend::complete_with_step`], sending the answer's text to `stream` as it
    /// becomes final (after each pause of continuous batching; at the end otherwise).
    pub async fn complete_streaming(
        &self,
        messages: &[Message],
        options: &GenerateOptions,
        stream: TextStream,
    ) -> Result<(Completion, u64), BackendError> {
        let (g, end_of_turn, step) =
            self.generate_streaming(Prompt::Chat(messages.to_vec()), options, Some(stream)).await?;
        let prompt_tokens = g.prompt_ids.len();
        Ok((Completion::from_generation(g, prompt_tokens, end_of_turn), step))
    }

    /// [`BatchedBackend::generate`], optionally streaming the text.
    pub async fn generate_streaming(
        &self,
        prompt: Prompt,
        options: &GenerateOptions,
        stream: Option<TextStream>,
    ) -> Result<(Generation, Option<i64>, u64), BackendError> {
        self.generate_under(prompt, options, None, stream).await
    }

    /// [`BatchedBackend::generate_streaming`] under a grammar of the whole turn (tool calls,
    /// structured output): every token is one the grammar allows. A request whose caller stops
    /// waiting (the future is dropped: a client hung up) leaves the running batch at its next
    /// pause and costs nothing more.
    pub async fn generate_under(
        &self,
        prompt: Prompt,
        options: &GenerateOptions,
        grammar: Option<Arc<TurnGrammar>>,
        stream: Option<TextStream>,
    ) -> Result<(Generation, Option<i64>, u64), BackendError> {
        self.submit(prompt, options, grammar, stream)?.wait().await
    }

    /// Queues a request now and returns its answer to await: several submitted one after the
    /// other decode side by side (a request's `n` choices). Dropping the [`Pending`] withdraws it.
    pub fn submit(
        &self,
        prompt: Prompt,
        options: &GenerateOptions,
        grammar: Option<Arc<TurnGrammar>>,
        stream: Option<TextStream>,
    ) -> Result<Pending, BackendError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = Job { prompt, stream, options: options.clone(), grammar, reply };
        self.queue.send(job).map_err(|_| BackendError::Join("the batching worker has stopped".into()))?;
        Ok(Pending(answer))
    }

    /// Requests the worker holds now (queued or decoding) that someone still waits for.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A submitted request's answer. Dropping it (a client hung up) withdraws the request: it
/// leaves the running batch at the next pause.
#[derive(Debug)]
pub struct Pending(tokio::sync::oneshot::Receiver<Result<Finished, BackendError>>);

impl Pending {
    /// The generation, the chat template's end-of-turn token and the step of the weights that
    /// finished it.
    pub async fn wait(self) -> Result<(Generation, Option<i64>, u64), BackendError> {
        self.0.await.map_err(|_| BackendError::Join("the batching worker dropped a request".into()))?
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
        Box::pin(async move { self.complete_with_step(messages, options).await.map(|(c, _)| c) })
    }

    /// Empties the prefix cache (after the batch being decoded, if one is) and gives the freed
    /// memory back to the system.
    fn release_memory(&self) {
        toolsmith_contract::sync::lock(&self.prefix).clear();
        toolsmith_policy::memory::release_free_memory();
    }
}

fn worker(policy: &Mutex<Policy>, jobs: &Receiver<Job>, prefix: &Mutex<PrefixCache>, config: BatchConfig) {
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
            decode(&policy, same, &mut toolsmith_contract::sync::lock(prefix));
        }
    }
}

/// A request's prompt as token ids.
fn encode(policy: &Policy, template: &ChatTemplate, prompt: &Prompt) -> Result<Vec<i64>, BackendError> {
    let tokenizer = policy.tokenizer();
    let ids = match prompt {
        Prompt::Chat(messages) => template.encode(tokenizer, messages, true)?.ids,
        Prompt::Text(text) => tokenizer.encode(text)?,
        Prompt::Ids(ids) => ids.clone(),
    };
    let vocab = policy.config().common().vocab_size;
    if ids.is_empty() || ids.iter().any(|&id| id < 0 || id >= vocab) {
        return Err(BackendError::Template(format!("the prompt must be token ids in 0..{vocab}, at least one")));
    }
    Ok(ids)
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
        match encode(policy, &template, &job.prompt) {
            Ok(ids) if ids.len() >= context => {
                let _ = job.reply.send(Err(BackendError::ContextFull { prompt: ids.len(), context }));
            }
            Ok(ids) => ready.push((job, ids)),
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
    let step = policy.state().step;
    let decoded = if ready.iter().any(|(j, _)| j.grammar.is_some()) {
        match TokenTable::new(tokenizer) {
            Ok(table) => {
                let rows = ready.iter().map(|(j, _)| j.grammar.clone().map(TurnMatcher::new)).collect();
                let mut constraint = TurnConstraint::new(&table, tokenizer.eos_ids(), rows);
                let drawn = vec![0; prompts.len()];
                policy.generate_resumable_with(&prompts, &params, &seeds, &drawn, prefix, Some(&mut constraint))
            }
            Err(e) => Err(e),
        }
    } else {
        policy.generate_with_prefix(&prompts, &params, Some(&seeds), None, prefix)
    };
    match decoded {
        Ok((generations, stats)) => {
            tracing::debug!(
                rows = prompts.len(),
                prompt_tokens = stats.prompt_tokens,
                generated = stats.generated_tokens,
                prefill_s = stats.prefill_secs,
                decode_s = stats.decode_secs,
                cache_hits = prefix.stats().hits,
                cache_reused_tokens = prefix.stats().reused_tokens,
                cache_entries = prefix.len(),
                cache_mib = prefix.bytes() >> 20,
                "decoded a batch"
            );
            for ((job, _), g) in ready.into_iter().zip(generations) {
                if let Some(stream) = &job.stream
                    && !g.text.is_empty()
                {
                    let _ = stream.send(g.text.clone());
                }
                let _ = job.reply.send(Ok((g, end_of_turn, step)));
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

/// A request in the running batch of [`continuous`].
struct Running {
    options: GenerateOptions,
    /// The turn's progress through its grammar, if it has one.
    matcher: Option<TurnMatcher>,
    stream: Option<TextStream>,
    reply: Reply,
    prompt: Vec<i64>,
    output: Vec<i64>,
    logprobs: Vec<f64>,
    /// New tokens it may have (its `max_tokens`, within the context).
    budget: usize,
    finish: Option<FinishReason>,
    /// Bytes of the text already streamed.
    sent: usize,
}

impl Running {
    fn answer(self, answer: Result<Finished, BackendError>) {
        let _ = self.reply.send(answer);
    }

    /// Takes in a chunk's tokens and whether they finished the answer.
    fn extend(&mut self, output: &[i64], logprobs: &[f64], reason: FinishReason, params: &SamplingParams) {
        let before = self.output.len();
        self.output.extend_from_slice(output);
        self.logprobs.extend_from_slice(logprobs);
        // A chunk sees only its own tokens: the loop stop looks at the whole output, token by
        // token, and ends it where one uninterrupted generation would have.
        let looped = (before + 1..=self.output.len()).find(|&n| params.ends_in_loop(&self.output[..n]));
        if let Some(n) = looped {
            self.output.truncate(n);
            self.logprobs.truncate(n);
            self.finish = Some(FinishReason::Length);
        } else if reason != FinishReason::Length {
            self.finish = Some(reason);
        } else if self.output.len() >= self.budget {
            self.finish = Some(FinishReason::Length);
        }
    }

    /// Streams what has become final and answers the request if it is finished (an end token,
    /// the budget, or a stop string, which may span chunks); the request back while it runs on.
    fn settle(mut self, tokenizer: &Tokenizer, end_of_turn: Option<i64>, step: u64) -> Option<Self> {
        let text = match decoded(tokenizer, &mut self) {
            Ok(t) => t,
            Err(e) => {
                self.answer(Err(BackendError::Join(format!("cannot decode the output: {e}"))));
                return None;
            }
        };
        let stop = first_stop(&text, &self.options.stop);
        let finish = if stop.is_some() { Some(FinishReason::StopString) } else { self.finish };
        if let Some(stream) = &self.stream {
            let end = match (finish, stop) {
                (_, Some(at)) => at,
                (Some(_), None) => text.len(),
                (None, None) => streamable(&text, &self.options.stop),
            };
            if let Some(piece) = text.get(self.sent..end).filter(|p| !p.is_empty()) {
                let _ = stream.send(piece.to_string());
                self.sent = end;
            }
        }
        let Some(finish_reason) = finish else { return Some(self) };
        let mut text = text;
        if let Some(at) = stop {
            text.truncate(at);
        }
        let (prompt_ids, output_ids, logprobs) = (self.prompt, self.output, self.logprobs);
        let generation = Generation { prompt_ids, output_ids, text, finish_reason, logprobs };
        let _ = self.reply.send(Ok((generation, end_of_turn, step)));
        None
    }
}

/// How much of an unfinished answer's text is final: not a trailing partial character (decoded
/// as U+FFFD until its last byte arrives) nor what could be the start of a stop string.
fn streamable(text: &str, stops: &[String]) -> usize {
    let whole = text.trim_end_matches('\u{FFFD}').len();
    let hold = stops.iter().map(|s| s.len().saturating_sub(1)).max().unwrap_or(0);
    let mut end = whole.saturating_sub(hold);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    end
}

/// What requests must share to decode in one chunk: everything but the seed and the budget.
fn sampling_key(options: &GenerateOptions) -> GenerateOptions {
    GenerateOptions { seed: 0, max_tokens: 0, ..options.clone() }
}

/// The first stop string in `text`, as a byte offset.
fn first_stop(text: &str, stops: &[String]) -> Option<usize> {
    stops.iter().filter(|s| !s.is_empty()).filter_map(|s| text.find(s.as_str())).min()
}

/// The output's text; once it holds a stop string, the output (ids and log-probs) ends at the
/// token that completed it, as in one uninterrupted generation (a stop string that straddles a
/// pause is only seen here, after the chunk ran on).
fn decoded(tokenizer: &Tokenizer, r: &mut Running) -> Result<String, String> {
    let stops = &r.options.stop;
    let text = tokenizer.decode(&r.output).map_err(|e| e.to_string())?;
    if first_stop(&text, stops).is_none() {
        return Ok(text);
    }
    // The shortest prefix that holds a stop string (longer ones all do): a binary search.
    let (mut lo, mut hi) = (1, r.output.len());
    while lo < hi {
        let mid = (lo + hi) / 2;
        let prefix = tokenizer.decode(&r.output[..mid]).map_err(|e| e.to_string())?;
        if first_stop(&prefix, stops).is_some() { hi = mid } else { lo = mid + 1 }
    }
    r.output.truncate(lo);
    r.logprobs.truncate(lo);
    tokenizer.decode(&r.output).map_err(|e| e.to_string())
}

/// Continuous batching: decodes the running requests `join_every` tokens at a time, admitting
/// what arrived in between and answering what finished.
fn continuous(
    policy: &Mutex<Policy>,
    jobs: &Receiver<Job>,
    prefix: &Mutex<PrefixCache>,
    config: BatchConfig,
    in_flight: &std::sync::atomic::AtomicUsize,
) {
    let mut running: Vec<Running> = Vec::new();
    // Every token's text, for constrained requests: built when the first one arrives, and again
    // only if a swap brings another tokenizer.
    let mut table: Option<(String, Arc<TokenTable>)> = None;
    loop {
        // A request nobody waits for any more (the client hung up) leaves now.
        running.retain(|r| {
            let waited = !r.reply.is_closed();
            if !waited {
                tracing::debug!(tokens = r.output.len(), "a request's client left; it leaves the batch");
            }
            waited
        });
        in_flight.store(running.len(), std::sync::atomic::Ordering::Relaxed);
        let mut arrived = Vec::new();
        if running.is_empty() {
            match jobs.recv() {
                Ok(job) => arrived.push(job),
                Err(_) => return,
            }
            let deadline = Instant::now() + config.window;
            while let Ok(job) = jobs.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                arrived.push(job);
            }
        }
        while running.len() + arrived.len() < config.max_batch.max(1) {
            match jobs.try_recv() {
                Ok(job) => arrived.push(job),
                Err(_) => break,
            }
        }
        let policy = toolsmith_contract::sync::lock(policy);
        let tokenizer = policy.tokenizer();
        let template = match ChatTemplate::of(tokenizer) {
            Ok(t) => t,
            Err(e) => {
                let message = e.to_string();
                for job in arrived {
                    let _ = job.reply.send(Err(BackendError::Template(message.clone())));
                }
                for r in running.drain(..) {
                    r.answer(Err(BackendError::Template(message.clone())));
                }
                continue;
            }
        };
        let context = policy.context_len();
        if arrived.iter().any(|j| j.grammar.is_some())
            && table.as_ref().is_none_or(|(hash, _)| hash != tokenizer.hash())
        {
            match TokenTable::new(tokenizer) {
                Ok(t) => table = Some((tokenizer.hash().to_string(), Arc::new(t))),
                Err(e) => {
                    let message = format!("cannot index the vocabulary for constrained decoding: {e}");
                    tracing::error!("{message}");
                    let (constrained, free): (Vec<Job>, Vec<Job>) =
                        arrived.into_iter().partition(|j| j.grammar.is_some());
                    for job in constrained {
                        let _ = job.reply.send(Err(BackendError::Join(message.clone())));
                    }
                    arrived = free;
                }
            }
        }
        for job in arrived {
            if job.reply.is_closed() {
                continue;
            }
            match encode(&policy, &template, &job.prompt) {
                Ok(ids) if ids.len() >= context => {
                    let _ = job.reply.send(Err(BackendError::ContextFull { prompt: ids.len(), context }));
                }
                Ok(ids) => {
                    let budget = job.options.max_tokens.min(context - ids.len());
                    running.push(Running {
                        options: job.options,
                        matcher: job.grammar.map(TurnMatcher::new),
                        stream: job.stream,
                        reply: job.reply,
                        prompt: ids,
                        output: Vec::new(),
                        logprobs: Vec::new(),
                        budget,
                        finish: (budget == 0).then_some(FinishReason::Length),
                        sent: 0,
                    });
                }
                Err(e) => {
                    let _ = job.reply.send(Err(e));
                }
            }
        }
        in_flight.store(running.len(), std::sync::atomic::Ordering::Relaxed);
        // One chunk for each group of requests with the same sampling settings (budgets and seeds
        // are each request's own).
        let mut failed: Vec<Option<String>> = vec![None; running.len()];
        let mut keys: Vec<GenerateOptions> = Vec::new();
        for r in running.iter().filter(|r| r.finish.is_none()) {
            let key = sampling_key(&r.options);
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        for key in keys {
            let group: Vec<usize> = (0..running.len())
                .filter(|&i| running[i].finish.is_none() && sampling_key(&running[i].options) == key)
                .collect();
            let left = group.iter().map(|&i| running[i].budget - running[i].output.len()).min().unwrap_or(1);
            // The key's `max_tokens` is 0 (it groups requests of any budget), so the chunk is set here.
            let params = SamplingParams { max_new_tokens: left.min(config.join_every).max(1), ..key.sampling(0) };
            let prompts: Vec<Vec<i64>> =
                group.iter().map(|&i| running[i].prompt.iter().chain(&running[i].output).copied().collect()).collect();
            // Each request samples with its own seed, past the tokens it has drawn in earlier
            // chunks: what it would draw alone.
            let seeds: Vec<u64> = group.iter().map(|&i| running[i].options.seed).collect();
            let drawn: Vec<usize> = group.iter().map(|&i| running[i].output.len()).collect();
            // A group with a constrained request decodes under one constraint, its free rows
            // unmasked; the matchers come back advanced for the next chunk.
            let mut constraint = match &table {
                Some((_, table)) if group.iter().any(|&i| running[i].matcher.is_some()) => {
                    let rows = group.iter().map(|&i| running[i].matcher.take()).collect();
                    Some(TurnConstraint::new(table, tokenizer.eos_ids(), rows))
                }
                _ => None,
            };
            let decoded = policy.generate_resumable_with(
                &prompts,
                &params,
                &seeds,
                &drawn,
                &mut toolsmith_contract::sync::lock(prefix),
                constraint.as_mut().map(|c| c as &mut dyn toolsmith_policy::Constraint),
            );
            for (&i, m) in group.iter().zip(constraint.map(TurnConstraint::into_rows).unwrap_or_default()) {
                running[i].matcher = m;
            }
            match decoded {
                Ok((generations, _)) => {
                    for (&i, g) in group.iter().zip(generations) {
                        running[i].extend(&g.output_ids, &g.logprobs, g.finish_reason, &params);
                    }
                }
                Err(e) => {
                    for &i in &group {
                        failed[i] = Some(format!("batched generation failed: {e}"));
                    }
                }
            }
        }
        // Answer what finished: an end token, the budget, or a stop string (one may span chunks).
        let step = policy.state().step;
        let end_of_turn = template.end_of_turn(tokenizer).ok().flatten();
        let mut still = Vec::with_capacity(running.len());
        for (r, failure) in running.into_iter().zip(failed) {
            match failure {
                Some(message) => r.answer(Err(BackendError::Join(message))),
                None => still.extend(r.settle(tokenizer, end_of_turn, step)),
            }
        }
        running = still;
    }
}
