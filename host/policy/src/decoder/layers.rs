//! The building blocks of a decoder layer: RMSNorm, linear layers that may carry a LoRA adapter,
//! the SwiGLU MLP, and the pre-norm block around attention and the MLP.

use tch::nn::{self, Init};
use tch::{Device, Kind, Tensor};

use super::attention::{Attention, AttentionMask, Rope};
use super::cache::LayerCache;
use super::fused::FusedLayer;
use crate::config::DecoderSpec;

/// Root-mean-square normalisation with a learned scale.
#[derive(Debug)]
pub(super) struct RmsNorm {
    pub(super) weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    /// The scale `weight` under `path`, starting at 1.
    pub(super) fn new(path: nn::Path, size: i64, eps: f64) -> Self {
        Self { weight: path.var("weight", &[size], Init::Const(1.0)), eps }
    }

    /// `x` normalised over its last dimension and scaled.
    pub(super) fn forward(&self, x: &Tensor) -> Tensor {
        // In float32 whatever the model's precision, as the reference does.
        let kind = x.kind();
        let xf = x.to_kind(Kind::Float);
        let variance = xf.square().mean_dim(-1, true, Kind::Float);
        let normed = xf * (variance + self.eps).rsqrt();
        &self.weight * normed.to_kind(kind)
    }
}

/// A low-rank adapter of one linear layer: `y += scale * B(A(dropout(x)))`, with `A` `[rank, in]`
/// and `B` `[out, rank]` (PEFT's layout and names).
#[derive(Debug)]
pub(super) struct LoraPair {
    pub(super) a: Tensor,
    pub(super) b: Tensor,
    pub(super) scale: f64,
}

/// A linear layer whose weight may carry a LoRA adapter.
#[derive(Debug)]
pub(super) struct Linear {
    /// The variable's name without `.weight`, e.g. `model.layers.0.self_attn.q_proj`.
    pub(super) name: String,
    pub(super) weight: Tensor,
    pub(super) bias: Option<Tensor>,
    pub(super) lora: Option<LoraPair>,
}

/// What a forward pass applies besides the base weights.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pass {
    /// Whether the adapters apply.
    pub(super) adapters: bool,
    /// The adapters' dropout (0 outside training).
    pub(super) dropout: f64,
}

impl Linear {
    /// `weight` `[output, input]` (and `bias`) under `path`.
    pub(super) fn new(path: nn::Path, input: i64, output: i64, bias: bool, init: Init) -> Self {
        let name = path.components().collect::<Vec<_>>().join(".");
        let weight = path.var("weight", &[output, input], init);
        let bias = bias.then(|| path.var("bias", &[output], Init::Const(0.0)));
        Self { name, weight, bias, lora: None }
    }

    /// `x W^T + b`, plus the adapter's update when `pass` applies it.
    pub(super) fn forward(&self, x: &Tensor, pass: Pass) -> Tensor {
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
    pub(super) fn merged(&self) -> Tensor {
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
pub(super) fn grad_enabled() -> bool {
    (Tensor::zeros([1], (Kind::Float, Device::Cpu)).set_requires_grad(true) * 1.0).requires_grad()
}

/// The SwiGLU MLP: `down(silu(gate(x)) * up(x))`.
#[derive(Debug)]
pub(super) struct Mlp {
    pub(super) gate_proj: Linear,
    pub(super) up_proj: Linear,
    pub(super) down_proj: Linear,
}

impl Mlp {
    /// The three projections under `path`, shaped by `spec`.
    pub(super) fn new(path: nn::Path, spec: &DecoderSpec, init: Init) -> Self {
        let (h, i, bias) = (spec.hidden_size, spec.intermediate_size, spec.mlp_bias);
        Self {
            gate_proj: Linear::new(&path / "gate_proj", h, i, bias, init),
            up_proj: Linear::new(&path / "up_proj", h, i, bias, init),
            down_proj: Linear::new(&path / "down_proj", i, h, bias, init),
        }
    }

    /// The MLP over `x`, through `fused` where given.
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

/// One decoder layer: pre-norm attention and pre-norm MLP, each added to the residual stream.
#[derive(Debug)]
pub(super) struct Block {
    pub(super) input_layernorm: RmsNorm,
    pub(super) self_attn: Attention,
    pub(super) post_attention_layernorm: RmsNorm,
    pub(super) mlp: Mlp,
}

impl Block {
    /// The layer over the residual stream `x`.
    pub(super) fn forward(
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
    pub(super) fn trains(&self) -> bool {
        let (a, m) = (&self.self_attn, &self.mlp);
        [&self.input_layernorm.weight, &self.post_attention_layernorm.weight].iter().any(|w| w.requires_grad())
            || [&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj, &m.gate_proj, &m.up_proj, &m.down_proj].iter().any(|l| {
                l.lora.is_some() || l.weight.requires_grad() || l.bias.as_ref().is_some_and(Tensor::requires_grad)
            })
    }
}
