//! Qwen2 (and Qwen2.5): a Llama-shaped decoder whose query, key and value projections carry biases.

use serde::Deserialize;

use crate::PolicyError;
use crate::config::{CommonConfig, DecoderSpec};

/// Qwen2's `config.json`: the shared fields and its sliding-window switch.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    /// The fields both families share.
    #[serde(flatten)]
    pub common: CommonConfig,
    /// Sliding-window attention, which the decoder does not implement (refused when set).
    #[serde(default)]
    pub use_sliding_window: bool,
}

impl Config {
    /// The decoder's hyperparameters, with this family's biases.
    pub fn spec(&self) -> Result<DecoderSpec, PolicyError> {
        if self.use_sliding_window {
            // Released Qwen2 checkpoints all ship with it off; attending fully would silently
            // change the model's outputs beyond the window, so refuse instead.
            return Err(PolicyError::Config("use_sliding_window is not supported".into()));
        }
        // Qwen2Attention: q/k/v with bias, o without; the MLP has no biases.
        self.common.spec(true, false, false)
    }
}
