//! The key/value cache: per-layer buffers allocated once for the longest sequence a generation
//! may reach, which rows of a batch fill, share, copy and hand to the prefix cache.

use tch::{Device, Tensor};

use super::Transformer;
use super::decode::DecodeKeys;

/// Per-layer key/value buffers, allocated once for the longest sequence a generation may reach.
#[derive(Debug)]
pub struct KvCache {
    /// Keys and values per layer, each `[batch, kv_heads, capacity, head_dim]`.
    pub(super) layers: Vec<(Tensor, Tensor)>,
    /// Columns filled.
    pub(super) len: i64,
    pub(super) capacity: i64,
}

impl KvCache {
    /// Columns filled so far.
    pub fn len(&self) -> i64 {
        self.len
    }

    /// Whether no column is filled yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Columns allocated: the longest sequence the cache holds.
    pub fn capacity(&self) -> i64 {
        self.capacity
    }

    /// Where the buffers live.
    pub fn device(&self) -> Device {
        self.layers.first().map_or(Device::Cpu, |(k, _)| k.device())
    }

    /// The cache of rows `index` (int64, rows may repeat): sequences with the same prompt share
    /// one prefill.
    pub fn select_rows(&self, index: &Tensor) -> KvCache {
        let layers = self.layers.iter().map(|(k, v)| (k.index_select(0, index), v.index_select(0, index))).collect();
        KvCache { layers, len: self.len, capacity: self.capacity }
    }

    /// Rows `start..start + n` as a cache of their own, filled up to `len` columns, whose buffers
    /// are views of this cache's: what a forward pass appends to it lands here.
    pub fn rows_view(&self, start: i64, n: i64, len: i64) -> KvCache {
        let layers = self.layers.iter().map(|(k, v)| (k.narrow(0, start, n), v.narrow(0, start, n))).collect();
        KvCache { layers, len, capacity: self.capacity }
    }

    /// Copies row `from` (every column) into row `to`.
    pub fn copy_row(&mut self, from: i64, to: i64) {
        for (k, v) in &mut self.layers {
            k.get(to).copy_(&k.get(from));
            v.get(to).copy_(&v.get(from));
        }
    }

    /// Marks the cache filled up to `len` columns.
    pub fn set_len(&mut self, len: i64) {
        self.len = len;
    }

    /// Row `row`'s keys and values at `columns` (int64), per layer `[kv_heads, n, head_dim]`.
    pub fn row_columns(&self, row: i64, columns: &Tensor) -> Vec<(Tensor, Tensor)> {
        self.layers
            .iter()
            .map(|(k, v)| (k.get(row).index_select(1, columns), v.get(row).index_select(1, columns)))
            .collect()
    }

    /// Writes the first `len` positions of `rows` (per layer `[kv_heads, n >= len, head_dim]`,
    /// as [`KvCache::row_columns`] returns) into row `row` from column `start`, and marks the
    /// cache filled up to `start + len` columns (at least).
    pub fn write_row(&mut self, row: i64, start: i64, rows: &[(Tensor, Tensor)], len: i64) {
        for ((k, v), (rk, rv)) in self.layers.iter_mut().zip(rows) {
            k.get(row).narrow(1, start, len).copy_(&rk.narrow(1, 0, len));
            v.get(row).narrow(1, start, len).copy_(&rv.narrow(1, 0, len));
        }
        self.len = self.len.max(start + len);
    }
}

/// One layer's part of a forward pass through the cache.
pub(super) struct LayerCache<'a> {
    pub(super) buffers: &'a mut (Tensor, Tensor),
    /// Columns already filled.
    pub(super) past: i64,
    /// Set for a one-token decode step on the CPU.
    pub(super) decode: Option<&'a DecodeKeys>,
}

impl Transformer {
    /// An empty cache for `batch` sequences of up to `capacity` tokens.
    pub fn new_cache(&self, batch: i64, capacity: i64) -> KvCache {
        let shape = [batch, self.spec.kv_heads, capacity, self.spec.head_dim];
        let options = (self.kind(), self.device());
        let layers =
            (0..self.spec.layers).map(|_| (Tensor::zeros(shape, options), Tensor::zeros(shape, options))).collect();
        KvCache { layers, len: 0, capacity }
    }
}
