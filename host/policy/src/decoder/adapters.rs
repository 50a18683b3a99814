//! LoRA adapters on the decoder's linear layers: which layers they adapt, attaching and removing
//! them, and their weights folded into the base's.

use tch::Tensor;
use tch::nn::{self, Init};

use super::layers::{Linear, LoraPair};
use super::{Transformer, WeightInit, layer_of};

/// The linear layers LoRA can adapt, by the names PEFT's `target_modules` use.
pub const LORA_MODULES: [&str; 7] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

/// What [`Transformer::attach_lora`] needs of a LoRA configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraSettings {
    /// Rank of each adapter.
    pub rank: i64,
    /// `alpha / rank`.
    pub scale: f64,
    /// Dropout on the adapters' input while training.
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
    pub(super) fn adapts(&self, module: &str, name: &str) -> bool {
        self.modules.iter().any(|m| m == module)
            && self.layers.as_ref().is_none_or(|ls| layer_of(name).is_some_and(|l| ls.binary_search(&l).is_ok()))
    }
}

impl Transformer {
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
}
