//! Grouped-query attention with rotary positions, and the masks a pass attends under.

use tch::nn::{self, Init};
use tch::{Kind, Tensor};

use super::cache::LayerCache;
use super::fused::FusedLayer;
use super::layers::{Linear, Pass};
use crate::config::DecoderSpec;

/// The attention mask for one forward pass.
#[derive(Debug)]
pub enum AttentionMask {
    /// Plain causal attention over an unpadded (or right-padded) batch without a cache.
    Causal,
    /// Explicit `[batch, 1, queries, keys]` boolean mask, true where attending is allowed.
    Explicit(Tensor),
}

impl AttentionMask {
    /// Causal mask for `queries` new tokens after `past` cached ones, honouring key padding
    /// (`valid`: `[batch, past + queries]`, nonzero for real tokens). A query always sees itself,
    /// so the rows of padding positions stay finite (their outputs are never used).
    pub fn with_padding(valid: &Tensor, past: i64, queries: i64) -> Self {
        let device = valid.device();
        let keys = past + queries;
        let query_pos = Tensor::arange_start(past, keys, (Kind::Int64, device)).unsqueeze(1);
        let key_pos = Tensor::arange(keys, (Kind::Int64, device)).unsqueeze(0);
        let causal = key_pos.le_tensor(&query_pos); // [q, k]
        let diagonal = key_pos.eq_tensor(&query_pos);
        let valid_keys = valid.to_kind(Kind::Bool).unsqueeze(1).unsqueeze(1); // [b, 1, 1, k]
        let allowed = causal.unsqueeze(0).unsqueeze(0).logical_and(&valid_keys);
        Self::Explicit(allowed.logical_or(&diagonal.unsqueeze(0).unsqueeze(0)))
    }
}

/// One layer's self-attention: its projections and head counts.
#[derive(Debug)]
pub(super) struct Attention {
    pub(super) q_proj: Linear,
    pub(super) k_proj: Linear,
    pub(super) v_proj: Linear,
    pub(super) o_proj: Linear,
    pub(super) heads: i64,
    pub(super) kv_heads: i64,
    pub(super) head_dim: i64,
}

/// Rotary position tables for one forward pass, `[batch, tokens, 1, head_dim]`.
pub(super) struct Rope {
    pub(super) cos: Tensor,
    /// `sin` with its first half negated: `rotate_half(x) * sin` is `roll(x, half) * sin_signed`,
    /// one roll instead of two slices, a negation and a concatenation (the same values).
    pub(super) sin_signed: Tensor,
}

impl Rope {
    /// `x * cos + rotate_half(x) * sin` over the last dimension of `x` `[batch, tokens, heads, head_dim]`.
    fn apply(&self, x: &Tensor) -> Tensor {
        let half = x.size()[x.dim() - 1] / 2;
        x * &self.cos + x.roll([half], [-1]) * &self.sin_signed
    }
}

impl Attention {
    /// The projections under `path`, shaped by `spec`.
    pub(super) fn new(path: nn::Path, spec: &DecoderSpec, init: Init) -> Self {
        let (h, q, kv) = (spec.hidden_size, spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim);
        Self {
            q_proj: Linear::new(&path / "q_proj", h, q, spec.qkv_bias, init),
            k_proj: Linear::new(&path / "k_proj", h, kv, spec.qkv_bias, init),
            v_proj: Linear::new(&path / "v_proj", h, kv, spec.qkv_bias, init),
            o_proj: Linear::new(&path / "o_proj", q, h, spec.o_bias, init),
            heads: spec.heads,
            kv_heads: spec.kv_heads,
            head_dim: spec.head_dim,
        }
    }

    /// Attention over `x` `[batch, tokens, hidden]`, appending the new keys and values to `cache`.
    pub(super) fn forward(
        &self,
        x: &Tensor,
        rope: &Rope,
        mask: &AttentionMask,
        cache: Option<LayerCache<'_>>,
        pass: Pass,
        fused: Option<&FusedLayer>,
    ) -> Tensor {
        let (b, t) = (x.size()[0], x.size()[1]);
        let (heads, kv_heads) = (self.heads, self.kv_heads);
        // Queries, keys and values side by side, `[b, t, heads + 2 kv_heads, head_dim]`, so that
        // the rotary positions apply to queries and keys at once.
        let qkv = fused
            .and_then(|f| f.qkv.apply(x))
            .unwrap_or_else(|| {
                Tensor::cat(
                    &[self.q_proj.forward(x, pass), self.k_proj.forward(x, pass), self.v_proj.forward(x, pass)],
                    -1,
                )
            })
            .view([b, t, heads + 2 * kv_heads, self.head_dim]);
        let qk = rope.apply(&qkv.narrow(2, 0, heads + kv_heads));
        let q = qk.narrow(2, 0, heads).transpose(1, 2);
        let k = qk.narrow(2, heads, kv_heads).transpose(1, 2);
        let v = qkv.narrow(2, heads + kv_heads, kv_heads).transpose(1, 2);
        let decode = cache.as_ref().and_then(|c| c.decode);
        let (k, v) = match cache {
            Some(LayerCache { buffers: (k_buf, v_buf), past, .. }) => {
                k_buf.narrow(2, past, t).copy_(&k);
                v_buf.narrow(2, past, t).copy_(&v);
                match decode {
                    Some(_) => (k_buf.shallow_clone(), v_buf.shallow_clone()),
                    None => (k_buf.narrow(2, 0, past + t), v_buf.narrow(2, 0, past + t)),
                }
            }
            None => (k, v),
        };
        let gqa = kv_heads != heads;
        let y = match decode {
            Some(keys) => keys.attend(self, &q, &k, &v),
            None => self.attention(&q, &k, &v, mask, t, gqa),
        };
        let y = y.transpose(1, 2).reshape([b, t, heads * self.head_dim]);
        fused.and_then(|f| f.o.as_ref()?.apply(&y)).unwrap_or_else(|| self.o_proj.forward(&y, pass))
    }

    /// SDPA over `k`/`v` as the cache or the new tokens give them.
    fn attention(&self, q: &Tensor, k: &Tensor, v: &Tensor, mask: &AttentionMask, t: i64, gqa: bool) -> Tensor {
        match mask {
            AttentionMask::Causal => {
                Tensor::scaled_dot_product_attention(q, k, v, None::<&Tensor>, 0.0, t > 1, None, gqa)
            }
            AttentionMask::Explicit(m) => Tensor::scaled_dot_product_attention(q, k, v, Some(m), 0.0, false, None, gqa),
        }
    }
}
