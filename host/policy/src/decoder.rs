//! The decoder both families share: token embeddings, pre-norm blocks of grouped-query attention
//! with rotary positions and a SwiGLU MLP, a final RMSNorm and the LM head. Variable names follow
//! Hugging Face's (`model.layers.0.self_attn.q_proj.weight`, ...) so checkpoints load as they are.

use tch::nn::{self, Init, Module};
use tch::{Device, Kind, Tensor};

use crate::config::DecoderSpec;

/// How weights start: the checkpoint's initialiser for a fresh model, or zeros when a checkpoint
/// is about to overwrite them anyway (drawing gigabytes of random numbers first would be waste).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WeightInit {
    Random,
    Zeros,
}

#[derive(Debug)]
struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    fn new(path: nn::Path, size: i64, eps: f64) -> Self {
        Self { weight: path.var("weight", &[size], Init::Const(1.0)), eps }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        // In float32 whatever the model's precision, as the reference does.
        let kind = x.kind();
        let xf = x.to_kind(Kind::Float);
        let variance = xf.square().mean_dim(-1, true, Kind::Float);
        let normed = xf * (variance + self.eps).rsqrt();
        &self.weight * normed.to_kind(kind)
    }
}

fn linear(path: nn::Path, input: i64, output: i64, bias: bool, init: Init) -> nn::Linear {
    let config = nn::LinearConfig { ws_init: init, bs_init: bias.then_some(Init::Const(0.0)), bias };
    nn::linear(path, input, output, config)
}

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

/// Per-layer key/value buffers, allocated once for the longest sequence a generation may reach.
#[derive(Debug)]
pub struct KvCache {
    layers: Vec<(Tensor, Tensor)>,
    len: i64,
    capacity: i64,
}

impl KvCache {
    pub fn len(&self) -> i64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> i64 {
        self.capacity
    }

    /// The cache of rows `index` (int64, rows may repeat): sequences with the same prompt share
    /// one prefill.
    pub fn select_rows(&self, index: &Tensor) -> KvCache {
        let layers = self.layers.iter().map(|(k, v)| (k.index_select(0, index), v.index_select(0, index))).collect();
        KvCache { layers, len: self.len, capacity: self.capacity }
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

#[derive(Debug)]
struct Attention {
    q_proj: nn::Linear,
    k_proj: nn::Linear,
    v_proj: nn::Linear,
    o_proj: nn::Linear,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
}

fn rotate_half(x: &Tensor) -> Tensor {
    let half = x.size()[x.dim() - 1] / 2;
    let x1 = x.narrow(-1, 0, half);
    let x2 = x.narrow(-1, half, half);
    Tensor::cat(&[x2.neg(), x1], -1)
}

impl Attention {
    fn new(path: nn::Path, spec: &DecoderSpec, init: Init) -> Self {
        let (h, q, kv) = (spec.hidden_size, spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim);
        Self {
            q_proj: linear(&path / "q_proj", h, q, spec.qkv_bias, init),
            k_proj: linear(&path / "k_proj", h, kv, spec.qkv_bias, init),
            v_proj: linear(&path / "v_proj", h, kv, spec.qkv_bias, init),
            o_proj: linear(&path / "o_proj", q, h, spec.o_bias, init),
            heads: spec.heads,
            kv_heads: spec.kv_heads,
            head_dim: spec.head_dim,
        }
    }

    fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: &AttentionMask,
        cache: Option<(&mut (Tensor, Tensor), i64)>,
    ) -> Tensor {
        let (b, t) = (x.size()[0], x.size()[1]);
        let split = |y: Tensor, heads: i64| y.view([b, t, heads, self.head_dim]).transpose(1, 2);
        let q = split(self.q_proj.forward(x), self.heads);
        let k = split(self.k_proj.forward(x), self.kv_heads);
        let v = split(self.v_proj.forward(x), self.kv_heads);
        let q = &q * cos + rotate_half(&q) * sin;
        let k = &k * cos + rotate_half(&k) * sin;
        let (k, v) = match cache {
            Some(((k_buf, v_buf), past)) => {
                k_buf.narrow(2, past, t).copy_(&k);
                v_buf.narrow(2, past, t).copy_(&v);
                (k_buf.narrow(2, 0, past + t), v_buf.narrow(2, 0, past + t))
            }
            None => (k, v),
        };
        let gqa = self.kv_heads != self.heads;
        let y = match mask {
            AttentionMask::Causal => {
                Tensor::scaled_dot_product_attention(&q, &k, &v, None::<&Tensor>, 0.0, t > 1, None, gqa)
            }
            AttentionMask::Explicit(m) => {
                Tensor::scaled_dot_product_attention(&q, &k, &v, Some(m), 0.0, false, None, gqa)
            }
        };
        self.o_proj.forward(&y.transpose(1, 2).contiguous().view([b, t, self.heads * self.head_dim]))
    }
}

#[derive(Debug)]
struct Mlp {
    gate_proj: nn::Linear,
    up_proj: nn::Linear,
    down_proj: nn::Linear,
}

impl Mlp {
    fn new(path: nn::Path, spec: &DecoderSpec, init: Init) -> Self {
        let (h, i, bias) = (spec.hidden_size, spec.intermediate_size, spec.mlp_bias);
        Self {
            gate_proj: linear(&path / "gate_proj", h, i, bias, init),
            up_proj: linear(&path / "up_proj", h, i, bias, init),
            down_proj: linear(&path / "down_proj", i, h, bias, init),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        self.down_proj.forward(&(self.gate_proj.forward(x).silu() * self.up_proj.forward(x)))
    }
}

#[derive(Debug)]
struct Block {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

/// The decoder-only transformer.
#[derive(Debug)]
pub struct Transformer {
    spec: DecoderSpec,
    embed_tokens: Tensor,
    layers: Vec<Block>,
    norm: RmsNorm,
    /// `None` when tied to the embeddings.
    lm_head: Option<Tensor>,
    inv_freq: Tensor,
}

impl Transformer {
    /// Builds the variables under `root` (the var store's root path).
    pub fn new(root: &nn::Path, spec: &DecoderSpec, init: WeightInit) -> Self {
        let weights = match init {
            WeightInit::Random => Init::Randn { mean: 0.0, stdev: spec.initializer_range },
            WeightInit::Zeros => Init::Const(0.0),
        };
        let model = root / "model";
        let embed_tokens = (&model / "embed_tokens").var("weight", &[spec.vocab_size, spec.hidden_size], weights);
        let layers = (0..spec.layers)
            .map(|i| {
                let p = &model / "layers" / i;
                Block {
                    input_layernorm: RmsNorm::new(&p / "input_layernorm", spec.hidden_size, spec.rms_norm_eps),
                    self_attn: Attention::new(&p / "self_attn", spec, weights),
                    post_attention_layernorm: RmsNorm::new(
                        &p / "post_attention_layernorm",
                        spec.hidden_size,
                        spec.rms_norm_eps,
                    ),
                    mlp: Mlp::new(&p / "mlp", spec, weights),
                }
            })
            .collect();
        let norm = RmsNorm::new(&model / "norm", spec.hidden_size, spec.rms_norm_eps);
        let lm_head = (!spec.tie_word_embeddings)
            .then(|| (root / "lm_head").var("weight", &[spec.vocab_size, spec.hidden_size], weights));
        let inv_freq = Tensor::from_slice(&spec.inv_freq()).to_kind(Kind::Float).to_device(root.device());
        Self { spec: spec.clone(), embed_tokens, layers, norm, lm_head, inv_freq }
    }

    pub fn spec(&self) -> &DecoderSpec {
        &self.spec
    }

    pub fn device(&self) -> Device {
        self.embed_tokens.device()
    }

    pub fn kind(&self) -> Kind {
        self.embed_tokens.kind()
    }

    /// An empty cache for `batch` sequences of up to `capacity` tokens.
    pub fn new_cache(&self, batch: i64, capacity: i64) -> KvCache {
        let shape = [batch, self.spec.kv_heads, capacity, self.spec.head_dim];
        let options = (self.kind(), self.device());
        let layers =
            (0..self.spec.layers).map(|_| (Tensor::zeros(shape, options), Tensor::zeros(shape, options))).collect();
        KvCache { layers, len: 0, capacity }
    }

    /// Hidden states after the final norm, `[batch, tokens, hidden]`. `positions` are the rotary
    /// positions (`[batch, tokens]`, int64); with a cache the new keys are appended to it.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        mask: &AttentionMask,
        mut cache: Option<&mut KvCache>,
    ) -> Tensor {
        let kind = self.kind();
        let freqs = positions.to_kind(Kind::Float).unsqueeze(-1) * &self.inv_freq;
        let angles = Tensor::cat(&[&freqs, &freqs], -1).unsqueeze(1); // [b, 1, t, d]
        let (cos, sin) = (angles.cos().to_kind(kind), angles.sin().to_kind(kind));
        let past = cache.as_ref().map_or(0, |c| c.len);
        let mut x = Tensor::embedding(&self.embed_tokens, input_ids, -1, false, false);
        for (i, block) in self.layers.iter().enumerate() {
            let layer_cache = cache.as_mut().map(|c| (&mut c.layers[i], past));
            let h = block.self_attn.forward(&block.input_layernorm.forward(&x), &cos, &sin, mask, layer_cache);
            // Out of place: `+=` is an in-place add in tch, and the norm saved `x` for backward.
            let residual = &x + h;
            let h = block.mlp.forward(&block.post_attention_layernorm.forward(&residual));
            x = &residual + h;
        }
        if let Some(cache) = cache {
            cache.len = past + input_ids.size()[1];
        }
        self.norm.forward(&x)
    }

    /// Logits over the vocabulary for hidden states `[.., hidden]`.
    pub fn logits(&self, hidden: &Tensor) -> Tensor {
        hidden.linear::<&Tensor>(self.lm_head.as_ref().unwrap_or(&self.embed_tokens), None)
    }
}
