//! Generation with a key/value cache over a batch of prompts of different lengths: prompts are
//! left-padded, an attention mask hides the padding and rotary positions start at each prompt's
//! first real token, so every row decodes as if it were alone.
//!
//! A call runs in phases: the prompts are checked, each row's sampler is started, prefixes are
//! taken from a [`PrefixCache`] where one is given (`prefill.rs`), the prompts are prefilled, and
//! the decode loop draws, streams and feeds back one token per row and step (`decode.rs`, with
//! each row in `sequence.rs` and the draws in `sample.rs`).

mod decode;
mod prefill;
mod sample;
mod sequence;

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::prefix::PrefixCache;
use crate::sampling::SamplingParams;
use crate::{Policy, PolicyError};
use decode::Decoding;
use prefill::{Layout, PromptBatch};
use sample::logits_rows;
use sequence::Sequence;

/// Why a sequence stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-sequence token of the tokenizer (kept in `output_ids`).
    Eos,
    /// One of `stop_token_ids` (kept in `output_ids`).
    StopToken,
    /// One of `stop_strings` (the text ends before it; `output_ids` end with the token that
    /// completed it).
    StopString,
    /// `max_new_tokens` reached.
    Length,
    /// A [`Constraint`] reported the output complete (or allowed no token at all).
    Constraint,
}

/// Restricts which tokens each sequence may produce (constrained decoding). Sampling draws from
/// the constrained distribution: tokens the cheap [`Constraint::mask`] leaves are checked exactly
/// with [`Constraint::allows`], and a rejected token is removed before drawing again.
pub trait Constraint {
    /// Sets logits of tokens that cannot follow to -inf (a fast, possibly loose filter).
    fn mask(&mut self, sequence: usize, logits: &mut [f32]);
    /// Whether `token` may follow (exact).
    fn allows(&mut self, sequence: usize, token: i64) -> bool;
    /// Commits `token`; true when the sequence's output is complete.
    fn advance(&mut self, sequence: usize, token: i64) -> bool;
}

/// One generated continuation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Generation {
    /// The prompt, as given.
    pub prompt_ids: Vec<i64>,
    /// The tokens generated after it.
    pub output_ids: Vec<i64>,
    /// The output's text (ending before a stop string that ended it).
    pub text: String,
    /// Why it stopped.
    pub finish_reason: FinishReason,
    /// Log-probability of each output token under the tempered distribution it was sampled from
    /// (`softmax(logits / temperature)`, before top-p, top-k and the repetition penalty; greedy
    /// decoding scores the untempered one): the behaviour log-probs RL needs, which the trainer
    /// rescores at the same temperature.
    pub logprobs: Vec<f64>,
}

/// Timing of one `generate` call.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GenerationStats {
    /// Tokens in every prompt together.
    pub prompt_tokens: usize,
    /// Tokens generated in every sequence together.
    pub generated_tokens: usize,
    /// Seconds spent running the prompts through the model.
    pub prefill_secs: f64,
    /// Seconds spent in the decode loop.
    pub decode_secs: f64,
}

impl GenerationStats {
    /// Generated tokens per second of the whole call.
    pub fn tokens_per_sec(&self) -> f64 {
        self.generated_tokens as f64 / (self.prefill_secs + self.decode_secs).max(1e-9)
    }
}

/// A streamed token: sequence index in the batch, the token, and the text it adds.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent<'a> {
    /// The sequence's index in the batch.
    pub sequence: usize,
    /// The token drawn.
    pub token_id: i64,
    /// New text. Text that may be the start of a stop string, or an incomplete UTF-8 character,
    /// is held back until it is known, so the streamed text always equals the final one.
    pub text: &'a str,
}

/// What one call asks for: every public form of [`Policy::generate`] fills a different subset.
/// The callback and the constraint have lifetimes of their own, as they had as arguments.
struct Request<'a, 'f, 'c> {
    prompts: &'a [Vec<i64>],
    params: &'a SamplingParams,
    /// A seed per prompt instead of `params.seed + i`.
    seeds: Option<&'a [u64]>,
    on_token: Option<&'a mut (dyn FnMut(TokenEvent<'_>) + 'f)>,
    constraint: Option<&'a mut (dyn Constraint + 'c)>,
    /// Keys and values of earlier sequences to start from, and to keep these in.
    prefix: Option<&'a mut PrefixCache>,
    /// Draws each row's sampler has already made (an answer resumed under continuous batching).
    drawn: Option<&'a [usize]>,
}

impl<'a> Request<'a, '_, '_> {
    /// `prompts` under `params`, with nothing else.
    fn new(prompts: &'a [Vec<i64>], params: &'a SamplingParams) -> Self {
        Self { prompts, params, seeds: None, on_token: None, constraint: None, prefix: None, drawn: None }
    }
}

impl Policy {
    /// Generates continuations of token-id prompts. `on_token` is called for each new token.
    pub fn generate(
        &self,
        prompts: &[Vec<i64>],
        params: &SamplingParams,
        on_token: Option<&mut dyn FnMut(TokenEvent<'_>)>,
    ) -> Result<(Vec<Generation>, GenerationStats), PolicyError> {
        self.generate_with(prompts, params, on_token, None)
    }

    /// [`Policy::generate`] with a seed of its own for each prompt (instead of `seed + i`): the
    /// prompts of independent requests decoded as one batch draw what each would draw alone.
    pub fn generate_seeded(
        &self,
        prompts: &[Vec<i64>],
        params: &SamplingParams,
        seeds: &[u64],
    ) -> Result<(Vec<Generation>, GenerationStats), PolicyError> {
        if seeds.len() != prompts.len() {
            return Err(PolicyError::Sampling(format!("{} seeds for {} prompts", seeds.len(), prompts.len())));
        }
        self.generate_inner(Request { seeds: Some(seeds), ..Request::new(prompts, params) })
    }

    /// [`Policy::generate`] (with a seed per prompt when `seeds` is given, as
    /// [`Policy::generate_seeded`]) reusing the keys and values of earlier sequences in `prefix`:
    /// each prompt prefills only what follows its longest cached prefix, and every sequence is
    /// kept there afterwards for the next call. What is sampled is what an uncached call
    /// samples; the logits differ by rounding only.
    pub fn generate_with_prefix(
        &self,
        prompts: &[Vec<i64>],
        params: &SamplingParams,
        seeds: Option<&[u64]>,
        on_token: Option<&mut dyn FnMut(TokenEvent<'_>)>,
        prefix: &mut PrefixCache,
    ) -> Result<(Vec<Generation>, GenerationStats), PolicyError> {
        if let Some(seeds) = seeds
            && seeds.len() != prompts.len()
        {
            return Err(PolicyError::Sampling(format!("{} seeds for {} prompts", seeds.len(), prompts.len())));
        }
        self.generate_inner(Request { seeds, on_token, prefix: Some(prefix), ..Request::new(prompts, params) })
    }

    /// [`Policy::generate_with_prefix`] for continuous batching, where a request's answer is
    /// decoded over several calls. Row `i` continues an answer that has already drawn
    /// `drawn[i]` tokens (its prompt ends with them): its sampler starts past those draws, so
    /// the tokens are those one uninterrupted call draws (its keys and values are found in
    /// `prefix`, so it feeds only its last token again).
    pub fn generate_resumable(
        &self,
        prompts: &[Vec<i64>],
        params: &SamplingParams,
        seeds: &[u64],
        drawn: &[usize],
        prefix: &mut PrefixCache,
    ) -> Result<(Vec<Generation>, GenerationStats), PolicyError> {
        self.generate_resumable_with(prompts, params, seeds, drawn, prefix, None)
    }

    /// [`Policy::generate_resumable`], optionally under a [`Constraint`] (continuous batching of
    /// constrained requests: the constraint carries each row's progress from one call to the next).
    pub fn generate_resumable_with(
        &self,
        prompts: &[Vec<i64>],
        params: &SamplingParams,
        seeds: &[u64],
        drawn: &[usize],
        prefix: &mut PrefixCache,
        constraint: Option<&mut dyn Constraint>,
    ) -> Result<(Vec<Generation>, GenerationStats), PolicyError> {
        if seeds.len() != prompts.len() || drawn.len() != prompts.len() {
            return Err(PolicyError::Sampling(format!(
                "{} seeds and {} draw counts for {} prompts",
                seeds.len(),
                drawn.len(),
                prompts.len()
            )));
        }
        self.generate_inner(Request {
            seeds: Some(seeds),
            constraint,
            prefix: Some(prefix),
            drawn: Some(drawn),
            ..Request::new(prompts, params)
        })
    }

    /// [`Policy::generate`] under a [`Constraint`]. Log-probs are those of the unconstrained
    /// model (what the network assigned), so scoring the output later gives the same numbers.
    pub fn generate_with(
        &self,
        prompts: &[Vec<i64>],
        params: &SamplingParams,
        on_token: Option<&mut dyn FnMut(TokenEvent<'_>)>,
        constraint: Option<&mut dyn Constraint>,
    ) -> Result<(Vec<Generation>, GenerationStats), PolicyError> {
        self.generate_inner(Request { on_token, constraint, ..Request::new(prompts, params) })
    }

    /// Generates from text prompts (encoded without special tokens; add a chat format yourself).
    pub fn generate_text(
        &self,
        prompts: &[&str],
        params: &SamplingParams,
        on_token: Option<&mut dyn FnMut(TokenEvent<'_>)>,
    ) -> Result<(Vec<Generation>, GenerationStats), PolicyError> {
        let ids = prompts.iter().map(|p| self.tokenizer().encode(p)).collect::<Result<Vec<_>, _>>()?;
        self.generate(&ids, params, on_token)
    }

    /// The one body behind every public form: checks, the prefill (from the prefix cache where
    /// one is given), the decode loop, and the outputs.
    fn generate_inner(
        &self,
        mut request: Request<'_, '_, '_>,
    ) -> Result<(Vec<Generation>, GenerationStats), PolicyError> {
        let (prompts, params) = (request.prompts, request.params);
        params.validate()?;
        let vocab = self.model().spec().vocab_size;
        check_prompts(prompts, vocab)?;
        let mut stats = GenerationStats {
            prompt_tokens: prompts.iter().map(Vec::len).sum(),
            generated_tokens: 0,
            prefill_secs: 0.0,
            decode_secs: 0.0,
        };
        if prompts.is_empty() || params.max_new_tokens == 0 {
            return Ok((prompts.iter().map(|p| Generation::unstarted(p)).collect(), stats));
        }
        let seqs = Sequence::start(&request);
        let fused = self.fused_weights();
        let fused = Some(&fused);
        if let Some(cache) = request.prefix.as_deref_mut() {
            self.prefill_shared_beginning(prompts, cache)?;
        }
        let reuse = self.reusable_prefixes(prompts, request.prefix.as_deref_mut());
        let layout = Layout::new(prompts, &reuse, params.max_new_tokens);
        let pad = self.tokenizer().pad_id();

        let _guard = tch::no_grad_guard();
        let batch = PromptBatch::new(prompts, &layout, pad, self.model().device());
        let started = Instant::now();
        let (cache, logits) = self.prefill(prompts, &layout, &batch, &reuse, request.prefix.as_deref_mut(), fused);
        let rows = logits_rows(&logits, vocab)?;
        stats.prefill_secs = started.elapsed().as_secs_f64();

        let decode_started = Instant::now();
        let mut decoding = Decoding::new(seqs, cache, rows, batch, &layout, pad, params);
        decoding.run(self, &mut request, fused, &mut stats)?;
        stats.decode_secs = decode_started.elapsed().as_secs_f64();
        if let Some(store) = request.prefix {
            decoding.store_running(store);
        }
        decoding.into_generations(self.tokenizer()).map(|out| (out, stats))
    }
}

impl Generation {
    /// `prompt` with nothing generated (no tokens were asked for).
    fn unstarted(prompt: &[i64]) -> Self {
        Generation {
            prompt_ids: prompt.to_vec(),
            output_ids: Vec::new(),
            text: String::new(),
            finish_reason: FinishReason::Length,
            logprobs: Vec::new(),
        }
    }
}

/// Refuses an empty prompt, or one with a token outside the vocabulary of `vocab` ids.
fn check_prompts(prompts: &[Vec<i64>], vocab: i64) -> Result<(), PolicyError> {
    for (i, prompt) in prompts.iter().enumerate() {
        if prompt.is_empty() {
            return Err(PolicyError::Sampling(format!("prompt {i} is empty")));
        }
        if let Some(&bad) = prompt.iter().find(|&&id| id < 0 || id >= vocab) {
            return Err(PolicyError::Sampling(format!(
                "prompt {i} has token id {bad}, outside the vocabulary (0..{vocab})"
            )));
        }
    }
    Ok(())
}
