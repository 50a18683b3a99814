//! Generation with a key/value cache over a batch of prompts of different lengths: prompts are
//! left-padded, an attention mask hides the padding and rotary positions start at each prompt's
//! first real token, so every row decodes as if it were alone.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::decoder::{AttentionMask, KvCache};
use crate::prefix::PrefixCache;
use crate::sampling::{Sampler, SamplingParams, log_prob};
use crate::{Policy, PolicyError};

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
    pub prompt_ids: Vec<i64>,
    pub output_ids: Vec<i64>,
    pub text: String,
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
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_secs: f64,
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
    pub sequence: usize,
    pub token_id: i64,
    /// New text. Text that may be the start of a stop string, or an incomplete UTF-8 character,
    /// is held back until it is known, so the streamed text always equals the final one.
    pub text: &'a str,
}

struct Sequence {
    prompt: Vec<i64>,
    output: Vec<i64>,
    logprobs: Vec<f64>,
    seen: Vec<i64>,
    sampler: Sampler,
    finish: Option<FinishReason>,
    /// Text emitted to the stream so far.
    streamed: usize,
    stop_at: Option<usize>,
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
        self.generate_inner(prompts, params, Some(seeds), None, None, None, None)
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
        self.generate_inner(prompts, params, seeds, on_token, None, Some(prefix), None)
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
        self.generate_inner(prompts, params, Some(seeds), None, constraint, Some(prefix), Some(drawn))
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
        self.generate_inner(prompts, params, None, on_token, constraint, None, None)
    }

    // The one body behind every public form, each of which fills a different subset.
    #[allow(clippy::too_many_arguments)]
    fn generate_inner(
        &self,
        prompts: &[Vec<i64>],
        params: &SamplingParams,
        seeds: Option<&[u64]>,
        mut on_token: Option<&mut dyn FnMut(TokenEvent<'_>)>,
        mut constraint: Option<&mut dyn Constraint>,
        mut prefix: Option<&mut PrefixCache>,
        drawn: Option<&[usize]>,
    ) -> Result<(Vec<Generation>, GenerationStats), PolicyError> {
        params.validate()?;
        let vocab = self.model().spec().vocab_size;
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
        let batch = prompts.len();
        let mut stats = GenerationStats {
            prompt_tokens: prompts.iter().map(Vec::len).sum(),
            generated_tokens: 0,
            prefill_secs: 0.0,
            decode_secs: 0.0,
        };
        if batch == 0 || params.max_new_tokens == 0 {
            let done = prompts.iter().map(|p| Generation {
                prompt_ids: p.clone(),
                output_ids: Vec::new(),
                text: String::new(),
                finish_reason: FinishReason::Length,
                logprobs: Vec::new(),
            });
            return Ok((done.collect(), stats));
        }
        let mut seqs: Vec<Sequence> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| Sequence {
                prompt: p.clone(),
                output: Vec::new(),
                logprobs: Vec::new(),
                seen: p.clone(),
                // Sampler i draws from seed + stream: a stream that lands on the request's seed.
                sampler: {
                    let mut sampler = Sampler::new(params, seeds.map_or(i as u64, |s| s[i].wrapping_sub(params.seed)));
                    sampler.skip(drawn.map_or(0, |d| d[i]));
                    sampler
                },
                finish: None,
                streamed: 0,
                stop_at: None,
            })
            .collect();
        let longest_stop = params.stop_strings.iter().map(String::len).max().unwrap_or(0);
        let model = self.model();
        let fused = self.fused_weights();
        let fused = Some(&fused);
        let device = model.device();
        let b = batch as i64;
        // Prompts that share a long beginning (an environment's system prompt and tool listing:
        // every episode's first turn) that no cache entry holds yet: that beginning is prefilled
        // once, as a sequence of its own, so that every row then takes it from the cache.
        if let Some(cache) = prefix.as_deref_mut() {
            cache.sync(self.weights_id());
            let shared = shared_prefix(prompts);
            let distinct = prompts.iter().any(|p| p != &prompts[0]);
            if distinct && shared >= SHARED_PREFIX_MIN && cache.longest(&prompts[0][..shared]) < shared - 1 {
                match self.frozen_id() {
                    Some(key) => self.prefill_shared(&prompts[0][..shared], key, cache),
                    None => {
                        let once = SamplingParams { max_new_tokens: 1, temperature: 0.0, ..SamplingParams::default() };
                        self.generate_inner(
                            &[prompts[0][..shared].to_vec()],
                            &once,
                            None,
                            None,
                            None,
                            Some(cache),
                            None,
                        )?;
                    }
                }
            }
        }
        // Tokens each prompt takes from the prefix cache (its cached keys and values).
        let reuse: Vec<Option<(usize, usize)>> = match prefix.as_deref_mut() {
            Some(cache) => {
                cache.sync(self.weights_id());
                prompts.iter().map(|p| cache.lookup(p)).collect()
            }
            None => vec![None; batch],
        };
        let cached: Vec<usize> = reuse.iter().map(|r| r.map_or(0, |(_, n)| n)).collect();
        // Each row's prompt occupies the first `prompt_len` columns: its cached part right-aligned
        // in the first `cached_len`, the rest right-aligned after them; padding in between is
        // masked, and positions count real tokens only.
        let cached_len = cached.iter().copied().max().unwrap_or(0);
        let suffix_len = prompts.iter().zip(&cached).map(|(p, c)| p.len() - c).max().unwrap_or(0);
        let prompt_len = (cached_len + suffix_len) as i64;
        let padded = prompts.iter().any(|p| p.len() as i64 != prompt_len);
        let capacity = prompt_len + params.max_new_tokens as i64;
        let pad = self.tokenizer().pad_id();

        let _guard = tch::no_grad_guard();
        let mut ids = vec![pad; batch * suffix_len];
        let mut prompt_valid_host = vec![0_i64; batch * prompt_len as usize];
        for (i, p) in prompts.iter().enumerate() {
            let (c, s) = (cached[i], p.len() - cached[i]);
            ids[i * suffix_len + suffix_len - s..(i + 1) * suffix_len].copy_from_slice(&p[c..]);
            let row = &mut prompt_valid_host[i * prompt_len as usize..(i + 1) * prompt_len as usize];
            row[cached_len - c..cached_len].fill(1);
            row[prompt_len as usize - s..].fill(1);
        }
        let mut valid = Tensor::zeros([b, capacity], (Kind::Int64, device));
        let prompt_valid = Tensor::from_slice(&prompt_valid_host).view([b, prompt_len]).to_device(device);
        valid.narrow(1, 0, prompt_len).copy_(&prompt_valid);
        let ids = Tensor::from_slice(&ids).view([b, suffix_len as i64]).to_device(device);
        let positions =
            (prompt_valid.cumsum(1, Kind::Int64) - 1).clamp_min(0).narrow(1, cached_len as i64, suffix_len as i64);
        let mut next_pos = positions.select(1, -1) + 1;
        // SDPA's own causal mask is aligned to the top left, wrong after cached columns.
        let mask = if padded || cached_len > 0 {
            AttentionMask::with_padding(&prompt_valid, cached_len as i64, suffix_len as i64)
        } else {
            AttentionMask::Causal
        };
        // Identical prompts (a group's episodes start from the same one) are prefilled once and
        // their cache rows copied.
        let mut first: Vec<i64> = Vec::new();
        let mut row_of: Vec<i64> = Vec::with_capacity(batch);
        for (i, p) in prompts.iter().enumerate() {
            match first.iter().position(|&f| prompts[f as usize] == *p) {
                Some(k) => row_of.push(k as i64),
                None => {
                    row_of.push(first.len() as i64);
                    first.push(i as i64);
                }
            }
        }
        let started = Instant::now();
        let (mut cache, logits) = if cached_len > 0 {
            let mut cache = model.new_cache(b, capacity);
            if let Some(store) = prefix.as_deref() {
                for (i, r) in reuse.iter().enumerate() {
                    if let Some((entry, n)) = *r {
                        cache.write_row(i as i64, (cached_len - n) as i64, store.layers(entry), n as i64);
                    }
                }
            }
            if let Some(store) = prefix.as_deref_mut() {
                store.release_extended(prompts);
            }
            let new: Vec<i64> = prompts.iter().zip(&cached).map(|(p, c)| (p.len() - c) as i64).collect();
            let padding = b * suffix_len as i64 - new.iter().sum::<i64>();
            if padding > PER_ROW_PREFILL_PADDING && padding * 4 > b * suffix_len as i64 {
                // Rows' new tokens differ much in number (one episode's observation is long,
                // another's short): padding them to the longest would be most of the prefill's
                // work, so each run of neighbouring rows with as many new tokens prefills on its
                // own (under continuous batching, the rows resumed after a pause feed one token
                // each: one pass for all of them), and a row repeating an earlier row's prompt
                // copies its keys and values.
                let mut last: Vec<Tensor> = Vec::with_capacity(batch);
                let repeats = |i: usize| first[row_of[i] as usize] as usize != i;
                let mut i = 0;
                while i < batch {
                    if repeats(i) {
                        let earlier = first[row_of[i] as usize] as usize;
                        cache.copy_row(earlier as i64, i as i64);
                        last.push(last[earlier].shallow_clone());
                        i += 1;
                        continue;
                    }
                    let n = new[i];
                    let end = (i + 1..batch).find(|&j| new[j] != n || repeats(j)).unwrap_or(batch);
                    let (row, rows, from) = (i as i64, (end - i) as i64, suffix_len as i64 - n);
                    let past = prompt_len - n;
                    let mask = AttentionMask::with_padding(&prompt_valid.narrow(0, row, rows), past, n);
                    let mut view = cache.rows_view(row, rows, past);
                    let hidden = model.forward_with(
                        &ids.narrow(0, row, rows).narrow(1, from, n),
                        &positions.narrow(0, row, rows).narrow(1, from, n),
                        &mask,
                        Some(&mut view),
                        fused,
                    );
                    let hidden = hidden.select(1, -1);
                    last.extend((0..rows).map(|r| hidden.narrow(0, r, 1)));
                    i = end;
                }
                cache.set_len(prompt_len);
                (cache, model.logits_with(&Tensor::cat(&last, 0), fused))
            } else {
                let hidden = model.forward_with(&ids, &positions, &mask, Some(&mut cache), fused);
                (cache, model.logits_with(&hidden.select(1, -1), fused))
            }
        } else if first.len() < batch {
            let pick = Tensor::from_slice(&first).to_device(device);
            let (ids, positions) = (ids.index_select(0, &pick), positions.index_select(0, &pick));
            let mask = if padded {
                AttentionMask::with_padding(&prompt_valid.index_select(0, &pick), 0, prompt_len)
            } else {
                AttentionMask::Causal
            };
            let mut cache = model.new_cache(first.len() as i64, capacity);
            let hidden = model.forward_with(&ids, &positions, &mask, Some(&mut cache), fused);
            let rows = Tensor::from_slice(&row_of).to_device(device);
            (cache.select_rows(&rows), model.logits_with(&hidden.select(1, -1), fused).index_select(0, &rows))
        } else {
            let mut cache = model.new_cache(b, capacity);
            let hidden = model.forward_with(&ids, &positions, &mask, Some(&mut cache), fused);
            (cache, model.logits_with(&hidden.select(1, -1), fused))
        };
        let mut rows = logits_rows(&logits, vocab)?;
        stats.prefill_secs = started.elapsed().as_secs_f64();

        let decode_started = Instant::now();
        // Cache row `r` decodes sequence `live[r]`.
        let mut live: Vec<usize> = (0..batch).collect();
        for step in 0..params.max_new_tokens {
            let mut feed = vec![pad; batch];
            let picks = if constraint.is_none() { sample_rows(&mut seqs, &rows) } else { Vec::new() };
            for (i, seq) in seqs.iter_mut().enumerate() {
                if seq.finish.is_some() {
                    continue;
                }
                let row = &rows[i];
                let (token, logprob) = match constraint.as_deref_mut() {
                    None => match picks.get(i).copied().flatten() {
                        Some(pick) => pick,
                        None => continue,
                    },
                    Some(c) => match constrained_next(c, i, row, &mut seq.sampler, &seq.seen) {
                        Some(t) => (t, log_prob(row, t as usize, params.temperature)),
                        None => {
                            seq.finish = Some(FinishReason::Constraint);
                            continue;
                        }
                    },
                };
                seq.logprobs.push(logprob);
                seq.output.push(token);
                seq.seen.push(token);
                feed[i] = token;
                stats.generated_tokens += 1;
                let done = constraint.as_deref_mut().is_some_and(|c| c.advance(i, token));
                if done {
                    seq.finish = Some(FinishReason::Constraint);
                } else if !params.ignore_eos && self.tokenizer().eos_ids().contains(&token) {
                    seq.finish = Some(FinishReason::Eos);
                } else if params.stop_token_ids.contains(&token) {
                    seq.finish = Some(FinishReason::StopToken);
                } else if seq.output.len() == params.max_new_tokens || params.ends_in_loop(&seq.output) {
                    seq.finish = Some(FinishReason::Length);
                }
                let needs_text = longest_stop > 0 || on_token.is_some();
                if needs_text {
                    let text = self.tokenizer().decode(&seq.output)?;
                    if let Some(at) = first_stop(&text, &params.stop_strings) {
                        seq.finish = Some(FinishReason::StopString);
                        seq.stop_at = Some(at);
                    }
                    if let Some(callback) = on_token.as_mut() {
                        let end = match seq.stop_at {
                            Some(at) => at,
                            None if seq.finish.is_some() => text.len(),
                            None => safe_prefix(&text, longest_stop),
                        };
                        let delta = if end > seq.streamed { &text[seq.streamed..end] } else { "" };
                        callback(TokenEvent { sequence: i, token_id: token, text: delta });
                        seq.streamed = seq.streamed.max(end);
                    }
                }
            }
            if seqs.iter().all(|s| s.finish.is_some()) || step + 1 == params.max_new_tokens {
                break;
            }
            // A finished row would be decoded for nothing until the batch's last one ends: once a
            // quarter of the rows have finished, running rows move into finished rows' slots
            // (in place, so no second cache) and the batch narrows to the running ones.
            let running = live.iter().filter(|&&i| seqs[i].finish.is_none()).count();
            if running * 4 <= live.len() * 3 {
                let finished = live.iter().enumerate().filter(|&(_, &i)| seqs[i].finish.is_some());
                if let Some(store) = prefix.as_deref_mut() {
                    for (r, &i) in finished.clone() {
                        store_row(
                            store,
                            &cache,
                            r as i64,
                            &seqs[i],
                            &prompt_valid_host[i * prompt_len as usize..],
                            prompt_len,
                        );
                    }
                }
                let holes: Vec<usize> = finished.map(|(r, _)| r).filter(|&r| r < running).collect();
                let movers: Vec<usize> = (running..live.len()).filter(|&r| seqs[live[r]].finish.is_none()).collect();
                let mut order: Vec<i64> = (0..running as i64).collect();
                for (hole, from) in holes.into_iter().zip(movers) {
                    cache.copy_row(from as i64, hole as i64);
                    order[hole] = from as i64;
                    live[hole] = live[from];
                }
                live.truncate(running);
                let order = Tensor::from_slice(&order).to_device(device);
                valid = valid.index_select(0, &order);
                next_pos = next_pos.index_select(0, &order);
                cache = cache.rows_view(0, running as i64, cache.len());
            }
            let column = prompt_len + step as i64;
            let _ = valid.narrow(1, column, 1).fill_(1);
            let feed: Vec<i64> = live.iter().map(|&i| feed[i]).collect();
            let feed = Tensor::from_slice(&feed).view([live.len() as i64, 1]).to_device(device);
            let mask = if padded {
                AttentionMask::with_padding(&valid.narrow(1, 0, column + 1), column, 1)
            } else {
                AttentionMask::Causal
            };
            let hidden = model.forward_with(&feed, &next_pos.unsqueeze(1), &mask, Some(&mut cache), fused);
            next_pos += 1;
            let logits = model.logits_with(&hidden.select(1, -1), fused);
            // Finished sequences keep their last rows: nothing reads them again.
            for (&i, row) in live.iter().zip(logits_rows(&logits, vocab)?) {
                rows[i] = row;
            }
        }
        stats.decode_secs = decode_started.elapsed().as_secs_f64();
        if let Some(store) = prefix {
            for (r, &i) in live.iter().enumerate() {
                store_row(store, &cache, r as i64, &seqs[i], &prompt_valid_host[i * prompt_len as usize..], prompt_len);
            }
        }

        let mut out = Vec::with_capacity(batch);
        for seq in seqs {
            let mut text = self.tokenizer().decode(&seq.output)?;
            if let Some(at) = seq.stop_at {
                text.truncate(at);
            }
            out.push(Generation {
                prompt_ids: seq.prompt,
                output_ids: seq.output,
                text,
                finish_reason: seq.finish.unwrap_or(FinishReason::Length),
                logprobs: seq.logprobs,
            });
        }
        Ok((out, stats))
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
}

impl Policy {
    /// Prefills the shared beginning `ids` into `cache` where the lowest `key.1` layers are
    /// frozen: their rows (and the residual stream above them) come from the longest beginning
    /// kept across updates, so that only the trained layers run over it; the rest runs whole.
    /// What it computes is kept for the next update's rollouts.
    fn prefill_shared(&self, ids: &[i64], key: (u64, usize), cache: &mut PrefixCache) {
        let _guard = tch::no_grad_guard();
        let (model, fused) = (self.model(), self.fused_weights());
        let device = model.device();
        let (n, boundary) = (ids.len(), key.1);
        cache.sync_frozen(key);
        let mut kv = model.new_cache(1, n as i64);
        let mut streams = Vec::with_capacity(2);
        let found = cache.lookup_frozen(ids);
        let kept = match found.and_then(|(entry, kept)| Some((cache.frozen(entry)?, kept))) {
            Some(((lower, stream), kept)) => {
                kv.write_row(0, 0, lower, kept as i64);
                let stream = stream.narrow(1, 0, kept as i64);
                model.refill_upper(&stream, &mut kv, boundary, Some(&fused));
                streams.push(stream);
                kept
            }
            None => 0,
        };
        if kept < n {
            let new = Tensor::from_slice(&ids[kept..]).view([1, (n - kept) as i64]).to_device(device);
            let positions = Tensor::arange_start(kept as i64, n as i64, (Kind::Int64, device)).unsqueeze(0);
            // After kept columns SDPA's causal mask (aligned to the top left) would be wrong.
            let mask = if kept == 0 {
                AttentionMask::Causal
            } else {
                let valid = Tensor::ones([1, n as i64], (Kind::Int64, device));
                AttentionMask::with_padding(&valid, kept as i64, (n - kept) as i64)
            };
            let (_, stream) = model.forward_keeping(&new, &positions, &mask, &mut kv, boundary, Some(&fused));
            streams.push(stream);
        }
        let rows = kv.row_columns(0, &Tensor::arange(n as i64, (Kind::Int64, device)));
        let lower =
            rows[..boundary.min(rows.len())].iter().map(|(k, v)| (k.shallow_clone(), v.shallow_clone())).collect();
        cache.insert_frozen(ids.to_vec(), lower, Tensor::cat(&streams, 1));
        cache.insert(ids.to_vec(), rows);
    }
}

/// Puts sequence `seq`'s keys and values (cache row `row`) into the prefix store: its prompt's
/// columns (`prompt_valid`, from its row of the prompt mask, nonzero where a real token is),
/// then its outputs but the last (never fed back).
fn store_row(
    store: &mut PrefixCache,
    cache: &KvCache,
    row: i64,
    seq: &Sequence,
    prompt_valid: &[i64],
    prompt_len: i64,
) {
    let fed = seq.output.len().saturating_sub(1);
    let columns: Vec<i64> =
        (0..prompt_len).filter(|&c| prompt_valid[c as usize] != 0).chain(prompt_len..prompt_len + fed as i64).collect();
    let ids: Vec<i64> = seq.prompt.iter().chain(&seq.output[..fed]).copied().collect();
    let columns = Tensor::from_slice(&columns).to_device(cache.device());
    store.insert(ids, cache.row_columns(row, &columns));
}

/// Each running row's next token and its log-prob ([`Sampler::next_scored`]), rows spread over
/// the machine's cores: the model's threads are idle meanwhile, and a batch's rows cost a pass
/// over the vocabulary each. `None` for a finished row. Each row draws from its own generator,
/// so the result does not depend on how rows are split.
fn sample_rows(seqs: &mut [Sequence], rows: &[Vec<f32>]) -> Vec<Option<(i64, f64)>> {
    // Below about a millisecond of work (a few rows of a large vocabulary) a thread costs more
    // than it saves.
    sample_rows_over_threads(seqs, rows, 1 << 18)
}

fn sample_rows_over_threads(seqs: &mut [Sequence], rows: &[Vec<f32>], min_work: usize) -> Vec<Option<(i64, f64)>> {
    fn pick(seqs: &mut [Sequence], rows: &[Vec<f32>]) -> Vec<Option<(i64, f64)>> {
        seqs.iter_mut()
            .zip(rows)
            .map(|(s, row)| s.finish.is_none().then(|| s.sampler.next_scored(row, &s.seen)))
            .collect()
    }
    // Asked once: on Linux the answer reads the cgroup's CPU quota from files.
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let running = seqs.iter().filter(|s| s.finish.is_none()).count();
    if running * rows.first().map_or(0, Vec::len) < min_work {
        return pick(seqs, rows);
    }
    let workers = (*CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))).min(running);
    if workers <= 1 {
        return pick(seqs, rows);
    }
    let chunk = seqs.len().div_ceil(workers);
    std::thread::scope(|scope| {
        let handles: Vec<_> =
            seqs.chunks_mut(chunk).zip(rows.chunks(chunk)).map(|(s, r)| scope.spawn(move || pick(s, r))).collect();
        handles.into_iter().flat_map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    })
}

/// Draws under a constraint: mask, draw, check, and on rejection remove the token and draw
/// again. `None` when no token is allowed.
fn constrained_next(c: &mut dyn Constraint, i: usize, row: &[f32], sampler: &mut Sampler, seen: &[i64]) -> Option<i64> {
    let mut masked = row.to_vec();
    c.mask(i, &mut masked);
    // Rejection is cheap while most survivors of the mask are allowed; after a few misses, check
    // every survivor once and draw from what is left.
    for _ in 0..16 {
        if !masked.iter().any(|l| l.is_finite()) {
            return None;
        }
        let token = sampler.next(&masked, seen);
        if masked[token as usize].is_finite() && c.allows(i, token) {
            return Some(token);
        }
        masked[token as usize] = f32::NEG_INFINITY;
    }
    for (token, l) in masked.iter_mut().enumerate() {
        if l.is_finite() && !c.allows(i, token as i64) {
            *l = f32::NEG_INFINITY;
        }
    }
    if !masked.iter().any(|l| l.is_finite()) {
        return None;
    }
    Some(sampler.next(&masked, seen))
}

/// The last-position logits of each row, as f32 on the CPU (sampling happens in Rust).
fn logits_rows(logits: &Tensor, vocab: i64) -> Result<Vec<Vec<f32>>, PolicyError> {
    let flat = logits.to_kind(Kind::Float).to_device(Device::Cpu).contiguous().view([-1]);
    let values = Vec::<f32>::try_from(&flat).map_err(PolicyError::Torch)?;
    Ok(values.chunks(vocab as usize).map(<[f32]>::to_vec).collect())
}

/// Byte offset of the earliest stop string in `text`.
fn first_stop(text: &str, stops: &[String]) -> Option<usize> {
    stops.iter().filter_map(|s| text.find(s.as_str())).min()
}

/// How much of `text` can be streamed now: everything but a tail that could still grow into a
/// stop string, and never a trailing replacement character (half of a multi-byte character).
fn safe_prefix(text: &str, longest_stop: usize) -> usize {
    let mut end = text.len().saturating_sub(longest_stop.saturating_sub(1));
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    let trimmed = text[..end].trim_end_matches('\u{FFFD}');
    trimmed.len()
}

/// Padding tokens a batched prefill may carry before rows prefill one by one instead (when
/// padding is also over a quarter of the batch): below this, one batched pass is cheaper than a
/// pass per row.
const PER_ROW_PREFILL_PADDING: i64 = 1024;

/// Shared beginnings shorter than this are prefilled with each row (not worth a pass of their own).
const SHARED_PREFIX_MIN: usize = 32;

/// How many leading tokens every prompt has in common.
fn shared_prefix(prompts: &[Vec<i64>]) -> usize {
    let Some((first, rest)) = prompts.split_first() else { return 0 };
    rest.iter().fold(first.len(), |n, p| first.iter().zip(p).take(n).take_while(|(a, b)| a == b).count())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sequences(params: &SamplingParams, n: usize) -> Vec<Sequence> {
        (0..n)
            .map(|i| Sequence {
                prompt: vec![1],
                output: Vec::new(),
                logprobs: Vec::new(),
                seen: vec![1],
                sampler: Sampler::new(params, i as u64),
                // A finished row in the middle is skipped, whichever thread holds it.
                finish: (i == 3).then_some(FinishReason::Eos),
                streamed: 0,
                stop_at: None,
            })
            .collect()
    }

    #[test]
    fn rows_sampled_over_threads_draw_as_on_one() {
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(1);
        let rows: Vec<Vec<f32>> =
            (0..9).map(|_| (0..1_000).map(|_| rand::Rng::random_range(&mut rng, -5.0_f32..5.0)).collect()).collect();
        for temperature in [1.0, 0.0] {
            let params = SamplingParams { temperature, ..SamplingParams::default() };
            let (mut alone, mut spread) = (sequences(&params, 9), sequences(&params, 9));
            for _ in 0..4 {
                let one = sample_rows_over_threads(&mut alone, &rows, usize::MAX);
                let many = sample_rows_over_threads(&mut spread, &rows, 0);
                assert_eq!(one, many);
                assert_eq!(one.iter().filter(|p| p.is_none()).count(), 1);
                assert!(one[3].is_none());
            }
        }
    }
}
