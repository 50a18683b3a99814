//! Key/value rows kept between generations, so that a prompt extending an earlier one (an
//! episode's next turn: the previous prompt, the tokens sampled for it, the observation and the
//! next turn's header) prefills only its new tokens, as serving engines' prefix caching does.
//!
//! Rows are valid only for the weights that computed them: the cache remembers
//! [`crate::Policy::weights_id`] and empties itself when a generation runs on other weights.
//! Where the lowest layers are frozen (only the top ones train), the shared beginnings of prompts
//! (an environment's system prompt and tool listing) keep those layers' rows and the residual
//! stream above them across updates: after an update only the trained layers are recomputed.

use std::collections::VecDeque;

use tch::Tensor;

/// What a [`PrefixCache`] saved so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PrefixStats {
    /// Prompts looked up.
    pub prompts: u64,
    /// Prompts that reused a cached prefix.
    pub hits: u64,
    /// Prompt tokens looked up.
    pub prompt_tokens: u64,
    /// Of those, tokens whose keys and values came from the cache instead of a prefill.
    pub reused_tokens: u64,
    /// Tokens of shared beginnings whose frozen layers came from rows kept across an update
    /// (only the trained layers above them were computed).
    pub frozen_reused_tokens: u64,
}

/// A bounded store of earlier sequences' key/value rows (oldest dropped first).
#[derive(Debug)]
pub struct PrefixCache {
    entries: VecDeque<Entry>,
    budget_bytes: usize,
    bytes: usize,
    weights_id: Option<u64>,
    stats: PrefixStats,
    frozen: Frozen,
}

/// Shared beginnings' rows of the frozen lower layers, kept while those layers stay as they
/// were: keyed by [`crate::Policy::frozen_id`].
#[derive(Debug, Default)]
struct Frozen {
    key: Option<(u64, usize)>,
    entries: VecDeque<FrozenEntry>,
    bytes: usize,
}

#[derive(Debug)]
struct FrozenEntry {
    ids: Vec<i64>,
    /// Per frozen layer, keys and values `[kv_heads, ids.len(), head_dim]`.
    lower: Vec<(Tensor, Tensor)>,
    /// The residual stream entering the lowest trained layer, `[1, ids.len(), hidden]`.
    boundary: Tensor,
    bytes: usize,
}

#[derive(Debug)]
struct Entry {
    ids: Vec<i64>,
    /// Per layer, keys and values `[kv_heads, ids.len(), head_dim]`.
    layers: Vec<(Tensor, Tensor)>,
    bytes: usize,
}

impl PrefixCache {
    /// An empty cache holding at most `budget_bytes` of keys and values.
    pub fn new(budget_bytes: usize) -> Self {
        PrefixCache {
            entries: VecDeque::new(),
            budget_bytes,
            bytes: 0,
            weights_id: None,
            stats: PrefixStats::default(),
            frozen: Frozen::default(),
        }
    }

    /// Hits, misses and what the cache holds.
    pub fn stats(&self) -> PrefixStats {
        self.stats
    }

    /// Sequences held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no sequence is kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes of keys and values held (and of the residual streams kept with frozen rows).
    pub fn bytes(&self) -> usize {
        self.bytes + self.frozen.bytes
    }

    /// Drops every row an update may change. The frozen layers' rows of shared beginnings stay
    /// (at most an eighth of the budget): no update of the trained layers changes them.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// Drops every row, the frozen layers' too.
    pub fn clear_all(&mut self) {
        self.clear();
        self.frozen = Frozen::default();
    }

    /// Forgets the frozen rows when they were computed by other lower layers (`key`: the
    /// policy's [`crate::Policy::frozen_id`]).
    pub(crate) fn sync_frozen(&mut self, key: (u64, usize)) {
        if self.frozen.key != Some(key) {
            self.frozen = Frozen { key: Some(key), ..Frozen::default() };
        }
    }

    /// The frozen entry sharing the longest prefix with `ids`, and that length.
    pub(crate) fn lookup_frozen(&mut self, ids: &[i64]) -> Option<(usize, usize)> {
        let best = self
            .frozen
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, e.ids.iter().zip(ids).take_while(|(a, b)| a == b).count()))
            .max_by_key(|&(i, n)| (n, i))
            .filter(|&(_, n)| n > 0);
        if let Some((_, n)) = best {
            self.stats.frozen_reused_tokens += n as u64;
        }
        best
    }

    /// Entry `entry`'s frozen layers' rows and residual stream.
    pub(crate) fn frozen(&self, entry: usize) -> Option<(&[(Tensor, Tensor)], &Tensor)> {
        self.frozen.entries.get(entry).map(|e| (e.lower.as_slice(), &e.boundary))
    }

    /// Keeps the frozen layers' rows of the shared beginning `ids` and the residual stream above
    /// them; entries that `ids` extends are dropped, then the oldest until an eighth of the
    /// budget holds them.
    pub(crate) fn insert_frozen(&mut self, ids: Vec<i64>, lower: Vec<(Tensor, Tensor)>, boundary: Tensor) {
        let bytes =
            lower.iter().map(|(k, v)| tensor_bytes(k) + tensor_bytes(v)).sum::<usize>() + tensor_bytes(&boundary);
        let budget = self.budget_bytes / 8;
        if ids.is_empty() || bytes > budget {
            return;
        }
        let frozen = &mut self.frozen;
        let mut freed = 0;
        frozen.entries.retain(|e| {
            let extended = e.ids.len() <= ids.len() && ids.starts_with(&e.ids);
            if extended {
                freed += e.bytes;
            }
            !extended
        });
        frozen.bytes -= freed;
        while frozen.bytes + bytes > budget {
            match frozen.entries.pop_front() {
                Some(old) => frozen.bytes -= old.bytes,
                None => break,
            }
        }
        frozen.bytes += bytes;
        frozen.entries.push_back(FrozenEntry { ids, lower, boundary, bytes });
    }

    /// Empties the cache when its rows were computed by other weights.
    pub(crate) fn sync(&mut self, weights_id: u64) {
        if self.weights_id != Some(weights_id) {
            self.clear();
            self.weights_id = Some(weights_id);
        }
    }

    /// The entry sharing the longest prefix with `prompt`, and that length; at most
    /// `prompt.len() - 1` tokens, since the last prompt token must run to give the next logits.
    pub(crate) fn lookup(&mut self, prompt: &[i64]) -> Option<(usize, usize)> {
        let limit = prompt.len().saturating_sub(1);
        let best = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, e.ids.iter().zip(prompt).take(limit).take_while(|(a, b)| a == b).count()))
            .max_by_key(|&(i, n)| (n, i))
            .filter(|&(_, n)| n > 0);
        self.stats.prompts += 1;
        self.stats.prompt_tokens += prompt.len() as u64;
        if let Some((_, n)) = best {
            self.stats.hits += 1;
            self.stats.reused_tokens += n as u64;
        }
        best
    }

    /// The longest prefix of `prompt` some entry holds, without counting a lookup.
    pub(crate) fn longest(&self, prompt: &[i64]) -> usize {
        self.entries.iter().map(|e| e.ids.iter().zip(prompt).take_while(|(a, b)| a == b).count()).max().unwrap_or(0)
    }

    pub(crate) fn layers(&self, entry: usize) -> &[(Tensor, Tensor)] {
        self.entries.get(entry).map_or(&[], |e| e.layers.as_slice())
    }

    /// Drops the entries that one of `prompts` extends, once their rows have been copied into a
    /// generation's cache: the generation's own entries will supersede them when it ends, and
    /// dropping them now keeps one copy of an episode's keys and values in memory, not two.
    pub(crate) fn release_extended(&mut self, prompts: &[Vec<i64>]) {
        let mut freed = 0;
        self.entries.retain(|e| {
            let extended = prompts.iter().any(|p| e.ids.len() <= p.len() && p.starts_with(&e.ids));
            if extended {
                freed += e.bytes;
            }
            !extended
        });
        self.bytes -= freed;
    }

    /// Keeps `layers` as the rows of `ids`; entries that `ids` extends are dropped (an
    /// episode's turn supersedes its previous one), then the oldest until the budget holds.
    pub(crate) fn insert(&mut self, ids: Vec<i64>, layers: Vec<(Tensor, Tensor)>) {
        let bytes = layers.iter().map(|(k, v)| tensor_bytes(k) + tensor_bytes(v)).sum();
        if ids.is_empty() || bytes > self.budget_bytes {
            return;
        }
        self.release_extended(std::slice::from_ref(&ids));
        while self.bytes + self.frozen.bytes + bytes > self.budget_bytes {
            match self.entries.pop_front() {
                Some(old) => self.bytes -= old.bytes,
                None => break,
            }
        }
        self.bytes += bytes;
        self.entries.push_back(Entry { ids, layers, bytes });
    }
}

fn tensor_bytes(t: &Tensor) -> usize {
    t.numel() * t.kind().elt_size_in_bytes()
}
