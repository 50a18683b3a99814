//! The model families: each deserialises its own `config.json` and resolves it into the
//! [`DecoderSpec`] the shared decoder is built from. [`ModelConfig`] picks the family by
//! `model_type`.

pub mod llama;
pub mod qwen2;

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::PolicyError;
use crate::config::{CommonConfig, DecoderSpec};

/// A checkpoint's model configuration, by family.
#[derive(Debug, Clone)]
pub enum ModelConfig {
    /// `model_type: "qwen2"` (Qwen2 and Qwen2.5).
    Qwen2(qwen2::Config),
    /// `model_type: "llama"` (Llama and the models built on it, SmolLM2 among them).
    Llama(llama::Config),
}

impl ModelConfig {
    /// Parses `config.json` text; the family comes from `model_type`.
    pub fn from_json(value: &Value) -> Result<Self, PolicyError> {
        let model_type = value.get("model_type").and_then(Value::as_str).ok_or_else(|| {
            PolicyError::Config("config has no \"model_type\" (expected \"qwen2\" or \"llama\")".into())
        })?;
        let parse_error = |e: serde_json::Error| PolicyError::Config(e.to_string());
        match model_type {
            "qwen2" => Ok(Self::Qwen2(qwen2::Config::deserialize(value).map_err(parse_error)?)),
            "llama" => Ok(Self::Llama(llama::Config::deserialize(value).map_err(parse_error)?)),
            other => Err(PolicyError::Config(format!("model_type {other:?} is not supported (qwen2, llama)"))),
        }
    }

    /// Reads and parses a `config.json` file.
    pub fn from_file(path: &Path) -> Result<(Self, Value), PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|e| PolicyError::io(path, e))?;
        let value: Value =
            serde_json::from_str(&text).map_err(|e| PolicyError::Config(format!("{}: {e}", path.display())))?;
        let config = Self::from_json(&value).map_err(|e| PolicyError::Config(format!("{}: {e}", path.display())))?;
        Ok((config, value))
    }

    /// The family's `model_type`.
    pub fn architecture(&self) -> &'static str {
        match self {
            Self::Qwen2(_) => "qwen2",
            Self::Llama(_) => "llama",
        }
    }

    /// The fields both families share.
    pub fn common(&self) -> &CommonConfig {
        match self {
            Self::Qwen2(c) => &c.common,
            Self::Llama(c) => &c.common,
        }
    }

    /// The decoder's hyperparameters; refused for settings the decoder does not implement.
    pub fn spec(&self) -> Result<DecoderSpec, PolicyError> {
        match self {
            Self::Qwen2(c) => c.spec(),
            Self::Llama(c) => c.spec(),
        }
    }
}
