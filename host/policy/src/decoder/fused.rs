//! Generation's fast path: copies of the weights fused per layer (and prepacked for oneDNN on a
//! CPU), made once per version of the weights.

use tch::Tensor;

use super::Transformer;
use super::layers::{Block, Linear, Pass};
use crate::packed;

/// Inference copies of every layer's query, key and value weights as one matrix, and of its gate
/// and up weights as another, with any enabled adapter folded in: a step then runs two products
/// where it ran five (on 2 cores each product's dispatch and thread hand-off costs as much as a
/// small one's arithmetic). On the CPU every product's weight (the output and down projections
/// and the LM head too) is also prepacked for oneDNN ([`crate::packed`]), which cuts a decode
/// step's products by a third (bf16) to a half (f32). Valid while the weights they were copied
/// from are ([`crate::Policy::weights_id`]); [`Transformer::fuse`] makes them.
#[derive(Debug)]
pub struct FusedWeights {
    pub(super) layers: Vec<FusedLayer>,
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
pub(super) struct GenLinear {
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
    pub(super) fn apply(&self, x: &Tensor) -> Option<Tensor> {
        if !self.packed {
            return Some(x.linear(&self.weight, self.bias.as_ref()));
        }
        packed::linear(x, &self.weight, self.bias.as_ref())
            .inspect_err(|e| tracing::error!("{e}; computing it from the plain weights"))
            .ok()
    }
}

/// One layer's fused weights.
#[derive(Debug)]
pub(super) struct FusedLayer {
    pub(super) qkv: GenLinear,
    pub(super) gate_up: GenLinear,
    /// The output and down projections, when packed (plain ones are the model's own).
    pub(super) o: Option<GenLinear>,
    pub(super) down: Option<GenLinear>,
}

impl FusedLayer {
    /// `block`'s weights, with the adapters folded in when `pass` applies them.
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

impl Transformer {
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

    /// [`Transformer::logits`] through [`FusedWeights`]' packed head, where it has one.
    pub fn logits_with(&self, hidden: &Tensor, fused: Option<&FusedWeights>) -> Tensor {
        fused.and_then(|f| f.head.as_ref()?.apply(hidden)).unwrap_or_else(|| self.logits(hidden))
    }
}
