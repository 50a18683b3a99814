//! The CPU's one-token decode step: the query of each row against the cache as two batched
//! products instead of SDPA.

use tch::{Device, Kind, Tensor};

use super::attention::{Attention, AttentionMask};

/// Which cache columns a one-token decode step reads ([`DecodeKeys::attend`]).
#[derive(Debug)]
pub(super) struct DecodeKeys {
    /// Columns read: the whole buffer when that costs at most a third more than copying the
    /// filled part out of it (a non-contiguous view would send the GEMM down a slow path).
    width: i64,
    /// `[batch or 1, 1, 1, width]`, true where a column must not be attended (padding, and
    /// columns not yet written); `None` when every column read is attended.
    blocked: Option<Tensor>,
}

impl DecodeKeys {
    /// The columns a step reads with `filled` of a cache's `capacity` columns written.
    pub(super) fn new(mask: &AttentionMask, filled: i64, capacity: i64, device: Device) -> Self {
        let width = if capacity <= 3 * filled { capacity } else { filled };
        let blocked = match mask {
            AttentionMask::Causal if width == filled => None,
            AttentionMask::Causal => {
                Some(Tensor::arange(width, (Kind::Int64, device)).ge(filled).view([1, 1, 1, width]))
            }
            // `[batch, 1, 1, filled]`, widened with blocked columns.
            AttentionMask::Explicit(allowed) => {
                let size = allowed.size();
                let blocked = Tensor::ones([size[0], 1, 1, width], (Kind::Bool, device));
                blocked.narrow(3, 0, filled).copy_(&allowed.logical_not());
                Some(blocked)
            }
        };
        Self { width, blocked }
    }

    /// One query per row against the cache, as two batched products: each key/value head's
    /// group of query heads is one `[group, head_dim] x [head_dim, width]` product over the
    /// cache's first `width` columns (contiguous, so the CPU's GEMM takes them as they are).
    /// libtorch's CPU SDPA runs a one-row product per head and row instead, which in bf16 made
    /// attention most of a decode step (see BENCHMARKS.md). Scores are rounded to the model's
    /// precision and scaled there before a float32 softmax, as `transformers`' eager attention does.
    pub(super) fn attend(&self, attention: &Attention, q: &Tensor, k_buf: &Tensor, v_buf: &Tensor) -> Tensor {
        let b = q.size()[0];
        let (k, v) = if self.width == k_buf.size()[2] {
            (k_buf.shallow_clone(), v_buf.shallow_clone())
        } else {
            (k_buf.narrow(2, 0, self.width).contiguous(), v_buf.narrow(2, 0, self.width).contiguous())
        };
        let group = attention.heads / attention.kv_heads;
        let q = q.reshape([b, attention.kv_heads, group, attention.head_dim]);
        let mut scores = q.matmul(&k.transpose(-1, -2));
        let _ = scores.g_mul_scalar_(1.0 / (attention.head_dim as f64).sqrt());
        if let Some(blocked) = &self.blocked {
            let _ = scores.masked_fill_(blocked, f64::NEG_INFINITY);
        }
        let probs = scores.softmax(-1, Kind::Float).to_kind(q.kind());
        probs.matmul(&v).reshape([b, attention.heads, 1, attention.head_dim])
    }
}
