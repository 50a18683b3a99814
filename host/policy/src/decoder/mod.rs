//! The decoder both families share: token embeddings, pre-norm blocks of grouped-query attention
//! with rotary positions and a SwiGLU MLP, a final RMSNorm and the LM head. Variable names follow
//! Hugging Face's (`model.layers.0.self_attn.q_proj.weight`, ...) so checkpoints load as they are.
//!
//! By idea: the building blocks (`layers.rs`), attention (`attention.rs`), the key/value cache
//! (`cache.rs`), the CPU's one-token decode step (`decode.rs`), generation's fused weights
//! (`fused.rs`), passes that reuse the frozen lower layers (`frozen.rs`) and LoRA adapters
//! (`adapters.rs`).

mod adapters;
mod attention;
mod cache;
mod decode;
mod frozen;
mod fused;
mod layers;

use tch::nn::{self, Init};
use tch::{Device, Kind, Tensor};

pub use adapters::{LORA_MODULES, LoraSettings};
pub use attention::AttentionMask;
pub use cache::KvCache;
pub use fused::FusedWeights;

use crate::PolicyError;
use crate::config::DecoderSpec;
use attention::{Attention, Rope};
use cache::LayerCache;
use decode::DecodeKeys;
use layers::{Block, Mlp, Pass, RmsNorm, grad_enabled};

/// How weights start: the checkpoint's initialiser for a fresh model, or zeros when a checkpoint
/// is about to overwrite them anyway (drawing gigabytes of random numbers first would be waste).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WeightInit {
    /// Drawn from libtorch's generator with the config's `initializer_range`.
    Random,
    /// Zeros, for weights a checkpoint fills next.
    Zeros,
}

/// The decoder layer a weight belongs to (`model.layers.N.` names), if any.
pub(crate) fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("model.layers.")?.split('.').next()?.parse().ok()
}

/// The lowest of the top `n` of `total` decoder layers; refused when `n` is 0 or above `total`.
pub(crate) fn lowest_of_top(n: usize, total: usize) -> Result<usize, PolicyError> {
    if n == 0 || n > total {
        return Err(PolicyError::Config(format!(
            "trainable_layers must be between 1 and the model's {total} layers, got {n}"
        )));
    }
    Ok(total - n)
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

    /// The token embedding matrix.
    pub fn embedding(&self) -> &Tensor {
        &self.embed_tokens
    }

    /// The hyperparameters it was built from.
    pub fn spec(&self) -> &DecoderSpec {
        &self.spec
    }

    /// Where the weights live.
    pub fn device(&self) -> Device {
        self.embed_tokens.device()
    }

    /// The weights' element kind (their precision).
    pub fn kind(&self) -> Kind {
        self.embed_tokens.kind()
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

    /// The token embeddings of `input_ids`: the residual stream entering the first layer.
    pub fn embed(&self, input_ids: &Tensor) -> Tensor {
        Tensor::embedding(&self.embed_tokens, input_ids, -1, false, false)
    }

    /// The final norm over the residual stream after the last layer.
    pub fn final_norm(&self, hidden: &Tensor) -> Tensor {
        self.norm.forward(hidden)
    }

    /// Decoder layers.
    pub fn layer_count(&self) -> usize {
        self.layers.len()
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

    /// The LM head's weight (the embeddings when tied).
    fn head(&self) -> &Tensor {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }
}
