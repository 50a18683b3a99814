//! The prefill: where each prompt's columns sit, which of its tokens come from the prefix cache,
//! and the passes that run the rest through the model into a new key/value cache.

use tch::{Device, Kind, Tensor};

use crate::decoder::{AttentionMask, FusedWeights, KvCache};
use crate::prefix::PrefixCache;
use crate::sampling::SamplingParams;
use crate::{Policy, PolicyError};

use super::Request;

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

/// Where each row's prompt sits in the batch's columns: its cached part right-aligned in the
/// first `cached_len`, the rest right-aligned after them; padding in between is masked, and
/// positions count real tokens only.
pub(super) struct Layout {
    /// Tokens each prompt takes from the prefix cache.
    cached: Vec<usize>,
    /// The longest cached part.
    cached_len: usize,
    /// The longest uncached part.
    suffix_len: usize,
    /// Columns of the prompts: `cached_len + suffix_len`.
    pub(super) prompt_len: i64,
    /// Whether a row is shorter than `prompt_len`, so that padding must be masked.
    pub(super) padded: bool,
    /// Columns of the cache: the prompts' and every new token's.
    capacity: i64,
}

impl Layout {
    /// The layout of `prompts`, of which `reuse` says what the prefix cache holds.
    pub(super) fn new(prompts: &[Vec<i64>], reuse: &[Option<(usize, usize)>], max_new_tokens: usize) -> Self {
        let cached: Vec<usize> = reuse.iter().map(|r| r.map_or(0, |(_, n)| n)).collect();
        let cached_len = cached.iter().copied().max().unwrap_or(0);
        let suffix_len = prompts.iter().zip(&cached).map(|(p, c)| p.len() - c).max().unwrap_or(0);
        let prompt_len = (cached_len + suffix_len) as i64;
        let padded = prompts.iter().any(|p| p.len() as i64 != prompt_len);
        let capacity = prompt_len + max_new_tokens as i64;
        Self { cached, cached_len, suffix_len, prompt_len, padded, capacity }
    }
}

/// The prompts as tensors, laid out as [`Layout`] says.
pub(super) struct PromptBatch {
    /// `[batch, suffix_len]`: each row's uncached tokens, after padding.
    ids: Tensor,
    /// The rotary positions of `ids`.
    positions: Tensor,
    /// `[batch, prompt_len]`, 1 where a real token is.
    prompt_valid: Tensor,
    /// `prompt_valid` on the host, row after row.
    pub(super) prompt_valid_host: Vec<i64>,
    /// `[batch, capacity]`, 1 where a real token is (the prompts' so far).
    pub(super) valid: Tensor,
    /// Each row's position after its prompt.
    pub(super) next_pos: Tensor,
    /// The mask of one batched pass over `ids`.
    mask: AttentionMask,
    /// The first row of each distinct prompt.
    first: Vec<i64>,
    /// Each row's index in `first`.
    row_of: Vec<i64>,
}

impl PromptBatch {
    /// `prompts` laid out as `layout` says, padded with `pad`, on `device`.
    pub(super) fn new(prompts: &[Vec<i64>], layout: &Layout, pad: i64, device: Device) -> Self {
        let (batch, b) = (prompts.len(), prompts.len() as i64);
        let Layout { cached, cached_len, suffix_len, prompt_len, padded, capacity } = layout;
        let (cached_len, suffix_len, prompt_len) = (*cached_len, *suffix_len, *prompt_len);
        let mut ids = vec![pad; batch * suffix_len];
        let mut prompt_valid_host = vec![0_i64; batch * prompt_len as usize];
        for (i, p) in prompts.iter().enumerate() {
            let (c, s) = (cached[i], p.len() - cached[i]);
            ids[i * suffix_len + suffix_len - s..(i + 1) * suffix_len].copy_from_slice(&p[c..]);
            let row = &mut prompt_valid_host[i * prompt_len as usize..(i + 1) * prompt_len as usize];
            row[cached_len - c..cached_len].fill(1);
            row[prompt_len as usize - s..].fill(1);
        }
        let valid = Tensor::zeros([b, *capacity], (Kind::Int64, device));
        let prompt_valid = Tensor::from_slice(&prompt_valid_host).view([b, prompt_len]).to_device(device);
        valid.narrow(1, 0, prompt_len).copy_(&prompt_valid);
        let ids = Tensor::from_slice(&ids).view([b, suffix_len as i64]).to_device(device);
        let positions =
            (prompt_valid.cumsum(1, Kind::Int64) - 1).clamp_min(0).narrow(1, cached_len as i64, suffix_len as i64);
        let next_pos = positions.select(1, -1) + 1;
        // SDPA's own causal mask is aligned to the top left, wrong after cached columns.
        let mask = if *padded || cached_len > 0 {
            AttentionMask::with_padding(&prompt_valid, cached_len as i64, suffix_len as i64)
        } else {
            AttentionMask::Causal
        };
        let (first, row_of) = distinct_prompts(prompts);
        Self { ids, positions, prompt_valid, prompt_valid_host, valid, next_pos, mask, first, row_of }
    }

    /// Whether row `i` repeats an earlier row's prompt.
    fn repeats(&self, i: usize) -> bool {
        self.first[self.row_of[i] as usize] as usize != i
    }
}

/// Identical prompts (a group's episodes start from the same one) are prefilled once and their
/// cache rows copied: the first row of each distinct prompt, and each row's index among them.
fn distinct_prompts(prompts: &[Vec<i64>]) -> (Vec<i64>, Vec<i64>) {
    let mut first: Vec<i64> = Vec::new();
    let mut row_of: Vec<i64> = Vec::with_capacity(prompts.len());
    for (i, p) in prompts.iter().enumerate() {
        match first.iter().position(|&f| prompts[f as usize] == *p) {
            Some(k) => row_of.push(k as i64),
            None => {
                row_of.push(first.len() as i64);
                first.push(i as i64);
            }
        }
    }
    (first, row_of)
}

impl Policy {
    /// Prompts that share a long beginning (an environment's system prompt and tool listing:
    /// every episode's first turn) that no cache entry holds yet: that beginning is prefilled
    /// once, as a sequence of its own, so that every row then takes it from the cache.
    pub(super) fn prefill_shared_beginning(
        &self,
        prompts: &[Vec<i64>],
        cache: &mut PrefixCache,
    ) -> Result<(), PolicyError> {
        cache.sync(self.weights_id());
        let shared = shared_prefix(prompts);
        let distinct = prompts.iter().any(|p| p != &prompts[0]);
        if distinct && shared >= SHARED_PREFIX_MIN && cache.longest(&prompts[0][..shared]) < shared - 1 {
            match self.frozen_id() {
                Some(key) => self.prefill_shared(&prompts[0][..shared], key, cache),
                None => {
                    let once = SamplingParams { max_new_tokens: 1, temperature: 0.0, ..SamplingParams::default() };
                    let beginning = [prompts[0][..shared].to_vec()];
                    self.generate_inner(Request { prefix: Some(cache), ..Request::new(&beginning, &once) })?;
                }
            }
        }
        Ok(())
    }

    /// The entry and length of each prompt's longest prefix in `prefix` (`None` without a cache,
    /// or when it holds none).
    pub(super) fn reusable_prefixes(
        &self,
        prompts: &[Vec<i64>],
        prefix: Option<&mut PrefixCache>,
    ) -> Vec<Option<(usize, usize)>> {
        match prefix {
            Some(cache) => {
                cache.sync(self.weights_id());
                prompts.iter().map(|p| cache.lookup(p)).collect()
            }
            None => vec![None; prompts.len()],
        }
    }

    /// Runs the prompts through the model into a new cache, and gives each row's logits after
    /// its prompt: rows start from their cached prefix (`reuse`, from `prefix`), and identical
    /// prompts run once.
    pub(super) fn prefill(
        &self,
        prompts: &[Vec<i64>],
        layout: &Layout,
        batch: &PromptBatch,
        reuse: &[Option<(usize, usize)>],
        prefix: Option<&mut PrefixCache>,
        fused: Option<&FusedWeights>,
    ) -> (KvCache, Tensor) {
        let model = self.model();
        let b = prompts.len() as i64;
        let (ids, positions, mask) = (&batch.ids, &batch.positions, &batch.mask);
        if layout.cached_len > 0 {
            let mut cache = model.new_cache(b, layout.capacity);
            if let Some(store) = prefix {
                for (i, r) in reuse.iter().enumerate() {
                    if let Some((entry, n)) = *r {
                        cache.write_row(i as i64, (layout.cached_len - n) as i64, store.layers(entry), n as i64);
                    }
                }
                store.release_extended(prompts);
            }
            let new: Vec<i64> = prompts.iter().zip(&layout.cached).map(|(p, c)| (p.len() - c) as i64).collect();
            let padding = b * layout.suffix_len as i64 - new.iter().sum::<i64>();
            if padding > PER_ROW_PREFILL_PADDING && padding * 4 > b * layout.suffix_len as i64 {
                self.prefill_runs(cache, layout, batch, &new, fused)
            } else {
                let hidden = model.forward_with(ids, positions, mask, Some(&mut cache), fused);
                (cache, model.logits_with(&hidden.select(1, -1), fused))
            }
        } else if batch.first.len() < prompts.len() {
            let device = model.device();
            let pick = Tensor::from_slice(&batch.first).to_device(device);
            let (ids, positions) = (ids.index_select(0, &pick), positions.index_select(0, &pick));
            let mask = if layout.padded {
                AttentionMask::with_padding(&batch.prompt_valid.index_select(0, &pick), 0, layout.prompt_len)
            } else {
                AttentionMask::Causal
            };
            let mut cache = model.new_cache(batch.first.len() as i64, layout.capacity);
            let hidden = model.forward_with(&ids, &positions, &mask, Some(&mut cache), fused);
            let rows = Tensor::from_slice(&batch.row_of).to_device(device);
            (cache.select_rows(&rows), model.logits_with(&hidden.select(1, -1), fused).index_select(0, &rows))
        } else {
            let mut cache = model.new_cache(b, layout.capacity);
            let hidden = model.forward_with(ids, positions, mask, Some(&mut cache), fused);
            (cache, model.logits_with(&hidden.select(1, -1), fused))
        }
    }

    /// The prefill after cached prefixes when rows' new tokens (`new`) differ much in number (one
    /// episode's observation is long, another's short): padding them to the longest would be
    /// most of the prefill's work, so each run of neighbouring rows with as many new tokens
    /// prefills on its own (under continuous batching, the rows resumed after a pause feed one
    /// token each: one pass for all of them), and a row repeating an earlier row's prompt copies
    /// its keys and values.
    fn prefill_runs(
        &self,
        mut cache: KvCache,
        layout: &Layout,
        batch: &PromptBatch,
        new: &[i64],
        fused: Option<&FusedWeights>,
    ) -> (KvCache, Tensor) {
        let model = self.model();
        let rows_in_batch = new.len();
        let mut last: Vec<Tensor> = Vec::with_capacity(rows_in_batch);
        let mut i = 0;
        while i < rows_in_batch {
            if batch.repeats(i) {
                let earlier = batch.first[batch.row_of[i] as usize] as usize;
                cache.copy_row(earlier as i64, i as i64);
                last.push(last[earlier].shallow_clone());
                i += 1;
                continue;
            }
            let n = new[i];
            let end = (i + 1..rows_in_batch).find(|&j| new[j] != n || batch.repeats(j)).unwrap_or(rows_in_batch);
            let (row, rows, from) = (i as i64, (end - i) as i64, layout.suffix_len as i64 - n);
            let past = layout.prompt_len - n;
            let mask = AttentionMask::with_padding(&batch.prompt_valid.narrow(0, row, rows), past, n);
            let mut view = cache.rows_view(row, rows, past);
            let hidden = model.forward_with(
                &batch.ids.narrow(0, row, rows).narrow(1, from, n),
                &batch.positions.narrow(0, row, rows).narrow(1, from, n),
                &mask,
                Some(&mut view),
                fused,
            );
            let hidden = hidden.select(1, -1);
            last.extend((0..rows).map(|r| hidden.narrow(0, r, 1)));
            i = end;
        }
        cache.set_len(layout.prompt_len);
        (cache, model.logits_with(&Tensor::cat(&last, 0), fused))
    }

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
