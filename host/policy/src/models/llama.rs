//! Llama (2, 3, 3.1, 3.2 and the many models built on it).

use serde::Deserialize;

use crate::PolicyError;
use crate::config::{CommonConfig, DecoderSpec};

/// Llama's `config.json`: the shared fields and its bias switches.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    /// The fields both families share.
    #[serde(flatten)]
    pub common: CommonConfig,
    /// One switch for all four attention projections, as in `LlamaAttention`.
    #[serde(default)]
    pub attention_bias: bool,
    /// Biases on the MLP's three projections.
    #[serde(default)]
    pub mlp_bias: bool,
}

impl Config {
    /// The decoder's hyperparameters, with this family's biases.
    pub fn spec(&self) -> Result<DecoderSpec, PolicyError> {
        self.common.spec(self.attention_bias, self.attention_bias, self.mlp_bias)
    }
}
