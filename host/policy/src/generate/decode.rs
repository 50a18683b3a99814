//! The decode loop: each step draws every running row's next token (under the constraint where
//! there is one), decides whether the row is done, streams its text, narrows the batch once
//! enough rows have finished, and feeds the tokens back through the cache.

use tch::Tensor;

use crate::decoder::{AttentionMask, FusedWeights, KvCache};
use crate::prefix::PrefixCache;
use crate::sampling::{SamplingParams, log_prob};
use crate::{Policy, PolicyError, Tokenizer};

use super::prefill::{Layout, PromptBatch};
use super::sample::{constrained_next, logits_rows, sample_rows};
use super::sequence::Sequence;
use super::{FinishReason, Generation, GenerationStats, Request};

/// The decode loop's state: the sequences, the cache rows that decode them, and the mask.
pub(super) struct Decoding {
    seqs: Vec<Sequence>,
    cache: KvCache,
    /// Each sequence's latest logits.
    rows: Vec<Vec<f32>>,
    /// Cache row `r` decodes sequence `live[r]`.
    live: Vec<usize>,
    /// `[rows, capacity]`, 1 where a column holds a real token of the row.
    valid: Tensor,
    /// Each cache row's next rotary position.
    next_pos: Tensor,
    /// The prompts' columns that hold real tokens, row after row of `prompt_len`.
    prompt_valid_host: Vec<i64>,
    prompt_len: i64,
    padded: bool,
    pad: i64,
    /// The longest stop string's length in bytes.
    longest_stop: usize,
}

impl Decoding {
    /// The loop after the prefill left `cache` and each row's logits `rows`.
    pub(super) fn new(
        seqs: Vec<Sequence>,
        cache: KvCache,
        rows: Vec<Vec<f32>>,
        batch: PromptBatch,
        layout: &Layout,
        pad: i64,
        params: &SamplingParams,
    ) -> Self {
        let PromptBatch { prompt_valid_host, valid, next_pos, .. } = batch;
        Self {
            live: (0..seqs.len()).collect(),
            seqs,
            cache,
            rows,
            valid,
            next_pos,
            prompt_valid_host,
            prompt_len: layout.prompt_len,
            padded: layout.padded,
            pad,
            longest_stop: params.stop_strings.iter().map(String::len).max().unwrap_or(0),
        }
    }

    /// Decodes until every sequence is done or `max_new_tokens` steps were taken.
    pub(super) fn run(
        &mut self,
        policy: &Policy,
        request: &mut Request<'_, '_, '_>,
        fused: Option<&FusedWeights>,
        stats: &mut GenerationStats,
    ) -> Result<(), PolicyError> {
        let max_new_tokens = request.params.max_new_tokens;
        for step in 0..max_new_tokens {
            let feed = self.draw(policy, request, stats)?;
            if self.seqs.iter().all(|s| s.finish.is_some()) || step + 1 == max_new_tokens {
                break;
            }
            // A finished row would be decoded for nothing until the batch's last one ends: once a
            // quarter of the rows have finished, running rows move into finished rows' slots
            // (in place, so no second cache) and the batch narrows to the running ones.
            let running = self.live.iter().filter(|&&i| self.seqs[i].finish.is_none()).count();
            if running * 4 <= self.live.len() * 3 {
                self.narrow(running, request.prefix.as_deref_mut(), policy);
            }
            self.feed(policy, &feed, step, fused)?;
        }
        Ok(())
    }

    /// Draws each running sequence's next token, in order (the constraint and the stream see
    /// them so), and returns what each row feeds back (padding where it is done).
    fn draw(
        &mut self,
        policy: &Policy,
        request: &mut Request<'_, '_, '_>,
        stats: &mut GenerationStats,
    ) -> Result<Vec<i64>, PolicyError> {
        let params = request.params;
        let mut feed = vec![self.pad; self.seqs.len()];
        let picks = if request.constraint.is_none() { sample_rows(&mut self.seqs, &self.rows) } else { Vec::new() };
        for (i, seq) in self.seqs.iter_mut().enumerate() {
            if seq.finish.is_some() {
                continue;
            }
            let row = &self.rows[i];
            let (token, logprob) = match request.constraint.as_deref_mut() {
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
            seq.take(token, logprob);
            feed[i] = token;
            stats.generated_tokens += 1;
            let done = request.constraint.as_deref_mut().is_some_and(|c| c.advance(i, token));
            seq.check_end(token, done, params, policy.tokenizer().eos_ids());
            if self.longest_stop > 0 || request.on_token.is_some() {
                let on_token = request.on_token.as_deref_mut();
                seq.stream(i, token, policy.tokenizer(), params, self.longest_stop, on_token)?;
            }
        }
        Ok(feed)
    }

    /// Moves the `running` rows into the first cache rows (keeping the finished ones' keys and
    /// values in `prefix`) and narrows the batch to them.
    fn narrow(&mut self, running: usize, prefix: Option<&mut PrefixCache>, policy: &Policy) {
        let finished = self.live.iter().enumerate().filter(|&(_, &i)| self.seqs[i].finish.is_some());
        if let Some(store) = prefix {
            for (r, &i) in finished.clone() {
                let prompt_valid = &self.prompt_valid_host[i * self.prompt_len as usize..];
                store_row(store, &self.cache, r as i64, &self.seqs[i], prompt_valid, self.prompt_len);
            }
        }
        let holes: Vec<usize> = finished.map(|(r, _)| r).filter(|&r| r < running).collect();
        let movers: Vec<usize> =
            (running..self.live.len()).filter(|&r| self.seqs[self.live[r]].finish.is_none()).collect();
        let mut order: Vec<i64> = (0..running as i64).collect();
        for (hole, from) in holes.into_iter().zip(movers) {
            self.cache.copy_row(from as i64, hole as i64);
            order[hole] = from as i64;
            self.live[hole] = self.live[from];
        }
        self.live.truncate(running);
        let order = Tensor::from_slice(&order).to_device(policy.model().device());
        self.valid = self.valid.index_select(0, &order);
        self.next_pos = self.next_pos.index_select(0, &order);
        self.cache = self.cache.rows_view(0, running as i64, self.cache.len());
    }

    /// Feeds each running row's token (`feed`, by sequence) at decode step `step`, and keeps
    /// the logits that follow.
    fn feed(
        &mut self,
        policy: &Policy,
        feed: &[i64],
        step: usize,
        fused: Option<&FusedWeights>,
    ) -> Result<(), PolicyError> {
        let model = policy.model();
        let device = model.device();
        let column = self.prompt_len + step as i64;
        let _ = self.valid.narrow(1, column, 1).fill_(1);
        let feed: Vec<i64> = self.live.iter().map(|&i| feed[i]).collect();
        let feed = Tensor::from_slice(&feed).view([self.live.len() as i64, 1]).to_device(device);
        let mask = if self.padded {
            AttentionMask::with_padding(&self.valid.narrow(1, 0, column + 1), column, 1)
        } else {
            AttentionMask::Causal
        };
        let hidden = model.forward_with(&feed, &self.next_pos.unsqueeze(1), &mask, Some(&mut self.cache), fused);
        self.next_pos += 1;
        let logits = model.logits_with(&hidden.select(1, -1), fused);
        // Finished sequences keep their last rows: nothing reads them again.
        for (&i, row) in self.live.iter().zip(logits_rows(&logits, model.spec().vocab_size)?) {
            self.rows[i] = row;
        }
        Ok(())
    }

    /// Keeps the keys and values of the rows still in the batch in `store`.
    pub(super) fn store_running(&self, store: &mut PrefixCache) {
        for (r, &i) in self.live.iter().enumerate() {
            store_row(store, &self.cache, r as i64, &self.seqs[i], self.prompt_valid(i), self.prompt_len);
        }
    }

    /// Sequence `i`'s row of the prompt mask, and the rows after it.
    fn prompt_valid(&self, i: usize) -> &[i64] {
        &self.prompt_valid_host[i * self.prompt_len as usize..]
    }

    /// The generations, with their text.
    pub(super) fn into_generations(self, tokenizer: &Tokenizer) -> Result<Vec<Generation>, PolicyError> {
        let mut out = Vec::with_capacity(self.seqs.len());
        for seq in self.seqs {
            let mut text = tokenizer.decode(&seq.output)?;
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
        Ok(out)
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
