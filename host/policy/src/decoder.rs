//! The decoder both families share: token embeddings, pre-norm blocks of grouped-query attention
//! with rotary positions and a SwiGLU MLP, a final RMSNorm and the LM head. Variable names follow
//! Hugging Face's (`model.layers.0.self_attn.q_proj.weight`, ...) so checkpoints load as they are.

use tch::nn::{self, Init};
use tch::{Device, Kind, Tensor};

use crate::config::DecoderSpec;
use crate::packed;

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

/// The linear layers LoRA can adapt, by the names PEFT's `target_modules` use.
pub const LORA_MODULES: [&str; 7] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

/// A low-rank adapter of one linear layer: `y += scale * B(A(dropout(x)))`, with `A` `[rank, in]`
/// and `B` `[out, rank]` (PEFT's layout and names).
#[derive(Debug)]
struct LoraPair {
    a: Tensor,
    b: Tensor,
    scale: f64,
}

/// A linear layer whose weight may carry a LoRA adapter.
#[derive(Debug)]
struct Linear {
    /// The variable's name without `.weight`, e.g. `model.layers.0.self_attn.q_proj`.
    name: String,
    weight: Tensor,
    bias: Option<Tensor>,
    lora: Option<LoraPair>,
}

/// What a forward pass applies besides the base weights.
#[derive(Debug, Clone, Copy)]
struct Pass {
    adapters: bool,
    dropout: f64,
}

impl Linear {
    fn new(path: nn::Path, input: i64, output: i64, bias: bool, init: Init) -> Self {
        let name = path.components().collect::<Vec<_>>().join(".");
        let weight = path.var("weight", &[output, input], init);
        let bias = bias.then(|| path.var("bias", &[output], Init::Const(0.0)));
        Self { name, weight, bias, lora: None }
    }

    fn forward(&self, x: &Tensor, pass: Pass) -> Tensor {
        let y = x.linear(&self.weight, self.bias.as_ref());
        match &self.lora {
            Some(lora) if pass.adapters => {
                let x = if pass.dropout > 0.0 { x.dropout(pass.dropout, true) } else { x.shallow_clone() };
                y + x.linear::<&Tensor>(&lora.a, None).linear::<&Tensor>(&lora.b, None) * lora.scale
            }
            _ => y,
        }
    }

    /// The weight with the adapter folded in (`W + scale * B A`), or the weight itself.
    fn merged(&self) -> Tensor {
        match &self.lora {
            Some(lora) => tch::no_grad(|| {
                let delta = lora.b.to_kind(Kind::Float).matmul(&lora.a.to_kind(Kind::Float)) * lora.scale;
                (self.weight.to_kind(Kind::Float) + delta).to_kind(self.weight.kind())
            }),
            None => self.weight.shallow_clone(),
        }
    }
}

/// Whether autograd records the current computation (dropout applies only when training).
fn grad_enabled() -> bool {
    (Tensor::zeros([1], (Kind::Float, Device::Cpu)).set_requires_grad(true) * 1.0).requires_grad()
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

/// Which cache columns a one-token decode step reads ([`Attention::decode_attention`]).
#[derive(Debug)]
struct DecodeKeys {
    /// Columns read: the whole buffer when that costs at most a third more than copying the
    /// filled part out of it (a non-contiguous view would send the GEMM down a slow path).
    width: i64,
    /// `[batch or 1, 1, 1, width]`, true where a column must not be attended (padding, and
    /// columns not yet written); `None` when every column read is attended.
    blocked: Option<Tensor>,
}

impl DecodeKeys {
    fn new(mask: &AttentionMask, filled: i64, capacity: i64, device: Device) -> Self {
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
struct LayerCache<'a> {
    buffers: &'a mut (Tensor, Tensor),
    /// Columns already filled.
    past: i64,
    /// Set for a one-token decode step on the CPU.
    decode: Option<&'a DecodeKeys>,
}

#[derive(Debug)]
struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
}

/// Rotary position tables for one forward pass, `[batch, tokens, 1, head_dim]`.
struct Rope {
    cos: Tensor,
    /// `sin` with its first half negated: `rotate_half(x) * sin` is `roll(x, half) * sin_signed`,
    /// one roll instead of two slices, a negation and a concatenation (the same values).
    sin_signed: Tensor,
}

impl Rope {
    /// `x * cos + rotate_half(x) * sin` over the last dimension of `x` `[batch, tokens, heads, head_dim]`.
    fn apply(&self, x: &Tensor) -> Tensor {
        let half = x.size()[x.dim() - 1] / 2;
        x * &self.cos + x.roll([half], [-1]) * &self.sin_signed
    }
}

/// Inference copies of every layer's query, key and value weights as one matrix, and of its gate
/// and up weights as another, with any enabled adapter folded in: a step then runs two products
/// where it ran five (on 2 cores each product's dispatch and thread hand-off costs as much as a
/// small one's arithmetic). On the CPU every product's weight (the output and down projections
/// and the LM head too) is also prepacked for oneDNN ([`crate::packed`]), which cuts a decode
/// step's products by a third (bf16) to a half (f32). Valid while the weights they were copied
/// from are ([`crate::Policy::weights_id`]); [`Transformer::fuse`] makes them.
#[derive(Debug)]
pub struct FusedWeights {
    layers: Vec<FusedLayer>,
    /// The LM head, when packed.
    head: Option<GenLinear>,
}

impl FusedWeights {
    /// Another handle to the same tensors.
    pub fn shallow_clone(&self) -> Self {
        let layers = self
            .layers
            .iter()
            .map(|l| FusedLayer {
                qkv: l.qkv.shallow_clone(),
                gate_up: l.gate_up.shallow_clone(),
                o: l.o.as_ref().map(GenLinear::shallow_clone),
                down: l.down.as_ref().map(GenLinear::shallow_clone),
            })
            .collect();
        Self { layers, head: self.head.as_ref().map(GenLinear::shallow_clone) }
    }

    /// Whether the products run on prepacked weights.
    pub fn packed(&self) -> bool {
        self.head.is_some()
    }
}

/// One product's weight for generation: plain, or prepacked for oneDNN.
#[derive(Debug)]
struct GenLinear {
    weight: Tensor,
    bias: Option<Tensor>,
    packed: bool,
}

impl GenLinear {
    /// `weight` as it is, or packed when `pack` is set and packing works (plain otherwise).
    fn new(weight: Tensor, bias: Option<Tensor>, pack: bool) -> Self {
        if pack {
            match packed::pack(&weight) {
                Ok(weight) => return Self { weight, bias, packed: true },
                Err(e) => tracing::warn!("generation keeps a plain weight: {e}"),
            }
        }
        Self { weight, bias, packed: false }
    }

    fn shallow_clone(&self) -> Self {
        let bias = self.bias.as_ref().map(Tensor::shallow_clone);
        Self { weight: self.weight.shallow_clone(), bias, packed: self.packed }
    }

    /// `x W^T + b`. `None` only if a packed product fails (it passed [`packed::worthwhile`]'s
    /// check, so it should not): the caller then computes it from the model's own weights.
    fn apply(&self, x: &Tensor) -> Option<Tensor> {
        if !self.packed {
            return Some(x.linear(&self.weight, self.bias.as_ref()));
        }
        packed::linear(x, &self.weight, self.bias.as_ref())
            .inspect_err(|e| tracing::error!("{e}; computing it from the plain weights"))
            .ok()
    }
}

#[derive(Debug)]
struct FusedLayer {
    qkv: GenLinear,
    gate_up: GenLinear,
    /// The output and down projections, when packed (plain ones are the model's own).
    o: Option<GenLinear>,
    down: Option<GenLinear>,
}

impl FusedLayer {
    fn new(block: &Block, pass: Pass, pack: bool) -> Self {
        let weight = |l: &Linear| if pass.adapters { l.merged() } else { l.weight.detach() };
        let bias = |l: &Linear| l.bias.as_ref().map(Tensor::detach);
        let fuse = |ls: &[&Linear]| {
            let weights: Vec<Tensor> = ls.iter().map(|l| weight(l)).collect();
            let biases: Option<Vec<Tensor>> = ls.iter().map(|l| bias(l)).collect();
            GenLinear::new(Tensor::cat(&weights, 0).detach(), biases.map(|b| Tensor::cat(&b, 0)), pack)
        };
        let single = |l: &Linear| pack.then(|| GenLinear::new(weight(l), bias(l), true));
        let (a, m) = (&block.self_attn, &block.mlp);
        Self {
            qkv: fuse(&[&a.q_proj, &a.k_proj, &a.v_proj]),
            gate_up: fuse(&[&m.gate_proj, &m.up_proj]),
            o: single(&a.o_proj),
            down: single(&m.down_proj),
        }
    }
}

impl Attention {
    fn new(path: nn::Path, spec: &DecoderSpec, init: Init) -> Self {
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

    fn forward(
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
            Some(keys) => self.decode_attention(&q, &k, &v, keys),
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

    /// One query per row against the cache, as two batched products: each key/value head's
    /// group of query heads is one `[group, head_dim] x [head_dim, width]` product over the
    /// cache's first `keys.width` columns (contiguous, so the CPU's GEMM takes them as they are).
    /// libtorch's CPU SDPA runs a one-row product per head and row instead, which in bf16 made
    /// attention most of a decode step (see BENCHMARKS.md). Scores are rounded to the model's
    /// precision and scaled there before a float32 softmax, as `transformers`' eager attention does.
    fn decode_attention(&self, q: &Tensor, k_buf: &Tensor, v_buf: &Tensor, keys: &DecodeKeys) -> Tensor {
        let b = q.size()[0];
        let (k, v) = if keys.width == k_buf.size()[2] {
            (k_buf.shallow_clone(), v_buf.shallow_clone())
        } else {
            (k_buf.narrow(2, 0, keys.width).contiguous(), v_buf.narrow(2, 0, keys.width).contiguous())
        };
        let group = self.heads / self.kv_heads;
        let q = q.reshape([b, self.kv_heads, group, self.head_dim]);
        let mut scores = q.matmul(&k.transpose(-1, -2));
        let _ = scores.g_mul_scalar_(1.0 / (self.head_dim as f64).sqrt());
        if let Some(blocked) = &keys.blocked {
            let _ = scores.masked_fill_(blocked, f64::NEG_INFINITY);
        }
        let probs = scores.softmax(-1, Kind::Float).to_kind(q.kind());
        probs.matmul(&v).reshape([b, self.heads, 1, self.head_dim])
    }
}

#[derive(Debug)]
struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    fn new(path: nn::Path, spec: &DecoderSpec, init: Init) -> Self {
        let (h, i, bias) = (spec.hidden_size, spec.intermediate_size, spec.mlp_bias);
        Self {
            gate_proj: Linear::new(&path / "gate_proj", h, i, bias, init),
            up_proj: Linear::new(&path / "up_proj", h, i, bias, init),
            down_proj: Linear::new(&path / "down_proj", i, h, bias, init),
        }
    }

    fn forward(&self, x: &Tensor, pass: Pass, fused: Option<&FusedLayer>) -> Tensor {
        let (gate, up) = match fused.and_then(|f| f.gate_up.apply(x)) {
            Some(both) => {
                let i = both.size()[both.dim() - 1] / 2;
                (both.narrow(-1, 0, i), both.narrow(-1, i, i))
            }
            None => (self.gate_proj.forward(x, pass), self.up_proj.forward(x, pass)),
        };
        let h = gate.silu() * up;
        fused.and_then(|f| f.down.as_ref()?.apply(&h)).unwrap_or_else(|| self.down_proj.forward(&h, pass))
    }
}

#[derive(Debug)]
struct Block {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

impl Block {
    fn forward(
        &self,
        x: &Tensor,
        rope: &Rope,
        mask: &AttentionMask,
        cache: Option<LayerCache<'_>>,
        pass: Pass,
        fused: Option<&FusedLayer>,
    ) -> Tensor {
        let h = self.self_attn.forward(&self.input_layernorm.forward(x), rope, mask, cache, pass, fused);
        // Out of place: `+=` is an in-place add in tch, and the norm saved `x` for backward.
        let residual = x + h;
        let h = self.mlp.forward(&self.post_attention_layernorm.forward(&residual), pass, fused);
        &residual + h
    }

    /// Whether any weight of the layer takes gradients or carries an adapter.
    fn trains(&self) -> bool {
        let (a, m) = (&self.self_attn, &self.mlp);
        [&self.input_layernorm.weight, &self.post_attention_layernorm.weight].iter().any(|w| w.requires_grad())
            || [&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj, &m.gate_proj, &m.up_proj, &m.down_proj].iter().any(|l| {
                l.lora.is_some() || l.weight.requires_grad() || l.bias.as_ref().is_some_and(Tensor::requires_grad)
            })
    }
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
    /// The adapters' settings when LoRA is attached.
    lora: Option<LoraSettings>,
}

/// What [`Transformer::attach_lora`] needs of a LoRA configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraSettings {
    pub rank: i64,
    /// `alpha / rank`.
    pub scale: f64,
    pub dropout: f64,
    /// Names from [`LORA_MODULES`].
    pub modules: Vec<String>,
    /// The decoder layers adapted, sorted (`None`: every layer).
    pub layers: Option<Vec<usize>>,
    /// Off: the base model alone (e.g. the reference of a KL penalty), with no second copy.
    pub enabled: bool,
}

impl LoraSettings {
    /// Whether the linear layer `name` (`model.layers.N.<...>.module`) gets an adapter.
    fn adapts(&self, module: &str, name: &str) -> bool {
        self.modules.iter().any(|m| m == module)
            && self
                .layers
                .as_ref()
                .is_none_or(|ls| crate::checkpoint::layer_of(name).is_some_and(|l| ls.binary_search(&l).is_ok()))
    }
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
        Self { spec: spec.clone(), embed_tokens, layers, norm, lm_head, inv_freq, lora: None }
    }

    fn linears(&self) -> impl Iterator<Item = (&'static str, &Linear)> {
        self.layers.iter().flat_map(|b| {
            let (a, m) = (&b.self_attn, &b.mlp);
            LORA_MODULES.into_iter().zip([
                &a.q_proj,
                &a.k_proj,
                &a.v_proj,
                &a.o_proj,
                &m.gate_proj,
                &m.up_proj,
                &m.down_proj,
            ])
        })
    }

    fn linears_mut(&mut self) -> impl Iterator<Item = (&'static str, &mut Linear)> {
        self.layers.iter_mut().flat_map(|b| {
            let (a, m) = (&mut b.self_attn, &mut b.mlp);
            LORA_MODULES.into_iter().zip([
                &mut a.q_proj,
                &mut a.k_proj,
                &mut a.v_proj,
                &mut a.o_proj,
                &mut m.gate_proj,
                &mut m.up_proj,
                &mut m.down_proj,
            ])
        })
    }

    /// Adds LoRA adapters to `settings.modules` of `settings.layers`, their variables under `root`
    /// (another var store than the base's) named as the base's plus `.lora_A.weight` and
    /// `.lora_B.weight`. `A` starts as PEFT's does (Kaiming-uniform, bound `1/sqrt(in)`), `B` at
    /// zero, so the adapted model starts as the base; with [`WeightInit::Zeros`] `A` is zero too,
    /// for adapters whose values are about to be loaded (nothing is drawn). Replaces adapters
    /// attached before.
    pub fn attach_lora(&mut self, root: &nn::Path, settings: LoraSettings, init: WeightInit) {
        for (module, linear) in self.linears_mut() {
            linear.lora = None;
            if !settings.adapts(module, &linear.name) {
                continue;
            }
            let (output, input) = (linear.weight.size()[0], linear.weight.size()[1]);
            let bound = 1.0 / (input as f64).sqrt();
            let path = linear.name.split('.').fold(root.clone(), |p, c| p / c);
            let a_init = match init {
                WeightInit::Random => Init::Uniform { lo: -bound, up: bound },
                WeightInit::Zeros => Init::Const(0.0),
            };
            let a = (&path / "lora_A").var("weight", &[settings.rank, input], a_init);
            let b = (&path / "lora_B").var("weight", &[output, settings.rank], Init::Const(0.0));
            linear.lora = Some(LoraPair { a, b, scale: settings.scale });
        }
        self.lora = Some(settings);
    }

    /// Removes the adapters (their variables stay in whatever store holds them).
    pub fn detach_lora(&mut self) {
        for (_, linear) in self.linears_mut() {
            linear.lora = None;
        }
        self.lora = None;
    }

    /// The adapters' settings, when attached.
    pub fn lora(&self) -> Option<&LoraSettings> {
        self.lora.as_ref()
    }

    /// Turns the attached adapters on or off.
    pub fn set_adapters_enabled(&mut self, enabled: bool) {
        if let Some(lora) = &mut self.lora {
            lora.enabled = enabled;
        }
    }

    /// `(name, weight)` of every adapted linear layer with its adapter folded in (`W + s B A`).
    pub fn merged_weights(&self) -> Vec<(String, Tensor)> {
        self.linears()
            .filter(|(_, l)| l.lora.is_some())
            .map(|(_, l)| (format!("{}.weight", l.name), l.merged()))
            .collect()
    }

    /// The names and shapes of the adapter variables `settings` would attach.
    pub fn lora_shapes(&self, settings: &LoraSettings) -> Vec<(String, Vec<i64>)> {
        self.linears()
            .filter(|(m, l)| settings.adapts(m, &l.name))
            .flat_map(|(_, l)| {
                let (output, input) = (l.weight.size()[0], l.weight.size()[1]);
                [
                    (format!("{}.lora_A.weight", l.name), vec![settings.rank, input]),
                    (format!("{}.lora_B.weight", l.name), vec![output, settings.rank]),
                ]
            })
            .collect()
    }

    /// The token embedding matrix.
    pub fn embedding(&self) -> &Tensor {
        &self.embed_tokens
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
        cache: Option<&mut KvCache>,
    ) -> Tensor {
        self.forward_with(input_ids, positions, mask, cache, None)
    }

    /// [`Transformer::forward`] through [`FusedWeights`] (made by [`Transformer::fuse`] from
    /// the current weights), for passes that take no gradients.
    pub fn forward_with(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        mask: &AttentionMask,
        cache: Option<&mut KvCache>,
        fused: Option<&FusedWeights>,
    ) -> Tensor {
        let x = self.cached_layers(self.embed(input_ids), positions, mask, cache, fused, 0..self.layers.len());
        self.norm.forward(&x)
    }

    /// [`Transformer::forward_with`] that also returns the residual stream entering layer
    /// `boundary` for the new tokens: what [`Transformer::refill_upper`] recomputes the upper
    /// layers' keys and values from after an update that changed only those layers.
    pub fn forward_keeping(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        mask: &AttentionMask,
        cache: &mut KvCache,
        boundary: usize,
        fused: Option<&FusedWeights>,
    ) -> (Tensor, Tensor) {
        let (layers, boundary) = (self.layers.len(), boundary.min(self.layers.len()));
        let past = cache.len;
        let lower = self.cached_layers(self.embed(input_ids), positions, mask, Some(&mut *cache), fused, 0..boundary);
        // The upper layers append at the same columns.
        cache.len = past;
        let upper = self.cached_layers(lower.shallow_clone(), positions, mask, Some(cache), fused, boundary..layers);
        (self.norm.forward(&upper), lower)
    }

    /// Writes the keys and values of layers `from..` for the first `hidden.size(1)` columns of a
    /// one-row `cache`, from `hidden` (`[1, columns, hidden]`), the residual stream entering layer
    /// `from` at positions `0..columns` ([`Transformer::forward_keeping`]). The lower layers'
    /// columns are left as they are: rows kept from before an update that trained only the
    /// layers from `from` up stay exact.
    pub fn refill_upper(&self, hidden: &Tensor, cache: &mut KvCache, from: usize, fused: Option<&FusedWeights>) {
        let columns = hidden.size()[1];
        let positions = Tensor::arange(columns, (Kind::Int64, self.device())).unsqueeze(0);
        let filled = cache.len;
        cache.len = 0;
        let from = from.min(self.layers.len());
        let _ = self.cached_layers(
            hidden.shallow_clone(),
            &positions,
            &AttentionMask::Causal,
            Some(&mut *cache),
            fused,
            from..self.layers.len(),
        );
        cache.len = filled.max(columns);
    }

    /// Decoder layers `layers` over the residual stream `x`, appending the new tokens' keys and
    /// values to `cache` (at its filled length, which then grows by the new tokens).
    fn cached_layers(
        &self,
        mut x: Tensor,
        positions: &Tensor,
        mask: &AttentionMask,
        mut cache: Option<&mut KvCache>,
        fused: Option<&FusedWeights>,
        layers: std::ops::Range<usize>,
    ) -> Tensor {
        let rope = self.rotary(positions);
        let past = cache.as_ref().map_or(0, |c| c.len);
        let pass = self.pass();
        // A decode step on the CPU reads the cache through two batched products, not SDPA.
        let t = x.size()[1];
        let decode = match &cache {
            Some(c) if t == 1 && self.device() == Device::Cpu => {
                Some(DecodeKeys::new(mask, past + 1, c.capacity, self.device()))
            }
            _ => None,
        };
        for i in layers {
            let layer_cache =
                cache.as_mut().map(|c| LayerCache { buffers: &mut c.layers[i], past, decode: decode.as_ref() });
            x = self.layers[i].forward(&x, &rope, mask, layer_cache, pass, fused.map(|f| &f.layers[i]));
        }
        if let Some(cache) = cache {
            cache.len = past + t;
        }
        x
    }

    /// The residual stream after the lowest `layers` decoder layers of a causal pass without a
    /// cache, computed without gradients: where [`Transformer::forward_from`] continues. Meant
    /// for layers that [`Transformer::frozen_layers`] counts, whose output no update changes.
    pub fn lower_hidden(&self, input_ids: &Tensor, positions: &Tensor, layers: usize) -> Tensor {
        tch::no_grad(|| self.causal_layers(self.embed(input_ids), positions, 0..layers.min(self.layers.len())))
    }

    /// [`Transformer::forward`] of a causal pass without a cache, continued from `hidden`, the
    /// residual stream after the lowest `from` layers ([`Transformer::lower_hidden`]).
    pub fn forward_from(&self, hidden: &Tensor, positions: &Tensor, from: usize) -> Tensor {
        let from = from.min(self.layers.len());
        self.norm.forward(&self.causal_layers(hidden.shallow_clone(), positions, from..self.layers.len()))
    }

    /// The token embeddings of `input_ids`: the residual stream entering the first layer.
    pub fn embed(&self, input_ids: &Tensor) -> Tensor {
        Tensor::embedding(&self.embed_tokens, input_ids, -1, false, false)
    }

    /// Decoder layers `layers` of a causal pass without a cache over the residual stream
    /// `hidden` (no final norm): for passes that recompute one layer at a time.
    pub fn run_layers(&self, hidden: &Tensor, positions: &Tensor, layers: std::ops::Range<usize>) -> Tensor {
        let layers = layers.start.min(self.layers.len())..layers.end.min(self.layers.len());
        self.causal_layers(hidden.shallow_clone(), positions, layers)
    }

    /// The final norm over the residual stream after the last layer.
    pub fn final_norm(&self, hidden: &Tensor) -> Tensor {
        self.norm.forward(hidden)
    }

    /// Decoder layers.
    pub fn layer_count(&self) -> usize {
        self.layers.len()
    }

    fn causal_layers(&self, mut x: Tensor, positions: &Tensor, layers: std::ops::Range<usize>) -> Tensor {
        let rope = self.rotary(positions);
        let pass = self.pass();
        for block in &self.layers[layers] {
            x = block.forward(&x, &rope, &AttentionMask::Causal, None, pass, None);
        }
        x
    }

    /// How many of the lowest decoder layers are frozen, with the embeddings below them: no
    /// weight of theirs takes gradients and none carries an adapter, so their output for given
    /// tokens stays the same while the rest trains. 0 when the embeddings train.
    pub fn frozen_layers(&self) -> usize {
        if self.embed_tokens.requires_grad() {
            return 0;
        }
        self.layers.iter().take_while(|b| !b.trains()).count()
    }

    /// Rotary tables for `positions` `[batch, tokens]`.
    fn rotary(&self, positions: &Tensor) -> Rope {
        let kind = self.kind();
        let freqs = positions.to_kind(Kind::Float).unsqueeze(-1) * &self.inv_freq;
        let cos = freqs.cos();
        let sin = freqs.sin();
        let table = |a: Tensor, b: Tensor| Tensor::cat(&[a, b], -1).unsqueeze(2).to_kind(kind);
        Rope { cos: table(cos.shallow_clone(), cos), sin_signed: table(-&sin, sin) }
    }

    /// [`FusedWeights`] of the current weights, with the adapters as the next pass would apply
    /// them.
    pub fn fuse(&self) -> FusedWeights {
        let pass = self.pass();
        let pack = packed::worthwhile(self.device(), self.kind());
        tch::no_grad(|| FusedWeights {
            layers: self.layers.iter().map(|b| FusedLayer::new(b, pass, pack)).collect(),
            head: pack.then(|| GenLinear::new(self.head().detach(), None, true)).filter(|h| h.packed),
        })
    }

    fn pass(&self) -> Pass {
        match &self.lora {
            Some(l) if l.enabled => {
                Pass { adapters: true, dropout: if l.dropout > 0.0 && grad_enabled() { l.dropout } else { 0.0 } }
            }
            _ => Pass { adapters: false, dropout: 0.0 },
        }
    }

    /// Logits over the vocabulary for hidden states `[.., hidden]`.
    pub fn logits(&self, hidden: &Tensor) -> Tensor {
        hidden.linear::<&Tensor>(self.head(), None)
    }

    /// [`Transformer::logits`] through [`FusedWeights`]' packed head, where it has one.
    pub fn logits_with(&self, hidden: &Tensor, fused: Option<&FusedWeights>) -> Tensor {
        fused.and_then(|f| f.head.as_ref()?.apply(hidden)).unwrap_or_else(|| self.logits(hidden))
    }

    /// The LM head's weight (the embeddings when tied).
    fn head(&self) -> &Tensor {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }
}
