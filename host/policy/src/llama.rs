//! Llama (2, 3, 3.1, 3.2 and the many models built on it).

use serde::Deserialize;

use crate::PolicyError;
use crate::config::{CommonConfig, DecoderSpec};

#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    #[serde(flatten)]
    pub common: CommonConfig,
    /// One switch for all four attention projections, as in `LlamaAttention`.
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
}

impl Config {
    pub fn spec(&self) -> Result<DecoderSpec, PolicyError> {
        self.common.spec(self.attention_bias, self.attention_bias, self.mlp_bias)
    }
}
