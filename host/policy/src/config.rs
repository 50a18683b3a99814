//! Model configuration as written in a checkpoint's `config.json`, for the Qwen2 and Llama
//! families. Each architecture file (`qwen2.rs`, `llama.rs`) deserialises its own config and
//! resolves it into one [`DecoderSpec`], the hyperparameters the shared decoder is built from.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::{PolicyError, llama, qwen2};

/// Fields both families share, with Hugging Face's names. Sizes have no defaults: every real
/// `config.json` states them, and guessing a size would load the wrong model silently.
#[derive(Debug, Clone, Deserialize)]
pub struct CommonConfig {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    #[serde(default)]
    pub num_key_value_heads: Option<i64>,
    #[serde(default)]
    pub head_dim: Option<i64>,
    #[serde(default = "default_rms_norm_eps")]
    pub rms_norm_eps: f64,
    /// Transformers 4.x writes `rope_theta` and `rope_scaling`; 5.x writes `rope_parameters`.
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default)]
    pub rope_parameters: Option<Value>,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: i64,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default = "default_hidden_act")]
    pub hidden_act: String,
    #[serde(default = "default_initializer_range")]
    pub initializer_range: f64,
    #[serde(default)]
    pub bos_token_id: Option<TokenIds>,
    #[serde(default)]
    pub eos_token_id: Option<TokenIds>,
    #[serde(default)]
    pub pad_token_id: Option<TokenIds>,
    /// `torch_dtype` in 4.x, `dtype` in 5.x: the precision the weights were saved in.
    #[serde(default, alias = "torch_dtype")]
    pub dtype: Option<String>,
}

fn default_rms_norm_eps() -> f64 {
    1e-6
}
fn default_max_positions() -> i64 {
    2048
}
fn default_hidden_act() -> String {
    "silu".into()
}
fn default_initializer_range() -> f64 {
    0.02
}

/// A token id field that is either one id or a list (`eos_token_id` often is a list).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum TokenIds {
    One(i64),
    Many(Vec<i64>),
}

impl TokenIds {
    pub fn to_vec(&self) -> Vec<i64> {
        match self {
            TokenIds::One(id) => vec![*id],
            TokenIds::Many(ids) => ids.clone(),
        }
    }
}

/// Rotary embedding frequency schedule.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    Default,
    /// Position interpolation: every frequency divided by `factor`.
    Linear {
        factor: f64,
    },
    /// Llama 3.1's piecewise schedule.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
}

/// The resolved hyperparameters of a decoder: what `decoder::Transformer` is built from.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderSpec {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub layers: i64,
    pub heads: i64,
    pub kv_heads: i64,
    pub head_dim: i64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub max_position_embeddings: i64,
    pub tie_word_embeddings: bool,
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub mlp_bias: bool,
    pub initializer_range: f64,
}

impl DecoderSpec {
    /// Rotary inverse frequencies, one per pair of head dimensions, as Hugging Face computes them.
    pub fn inv_freq(&self) -> Vec<f64> {
        let d = self.head_dim as f64;
        let base: Vec<f64> = (0..self.head_dim / 2).map(|i| 1.0 / self.rope_theta.powf(2.0 * i as f64 / d)).collect();
        match self.rope_scaling {
            RopeScaling::Default => base,
            RopeScaling::Linear { factor } => base.into_iter().map(|f| f / factor).collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old_len,
            } => {
                let low_freq_wavelen = old_len / low_freq_factor;
                let high_freq_wavelen = old_len / high_freq_factor;
                base.into_iter()
                    .map(|f| {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen > low_freq_wavelen {
                            f / factor
                        } else if wavelen < high_freq_wavelen {
                            f
                        } else {
                            let smooth = (old_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
        }
    }

    /// Parameter count of a model built from this spec.
    pub fn parameters(&self) -> i64 {
        let h = self.hidden_size;
        let q = self.heads * self.head_dim;
        let kv = self.kv_heads * self.head_dim;
        let bias = |on: bool, n: i64| if on { n } else { 0 };
        let attention = h * q + 2 * h * kv + q * h + bias(self.qkv_bias, q + 2 * kv) + bias(self.o_bias, h);
        let mlp = 3 * h * self.intermediate_size + bias(self.mlp_bias, 2 * self.intermediate_size + h);
        let layer = attention + mlp + 2 * h;
        let embeddings = self.vocab_size * h * if self.tie_word_embeddings { 1 } else { 2 };
        self.layers * layer + embeddings + h
    }
}

impl CommonConfig {
    /// Resolves the fields both families share; the architecture adds its biases.
    pub(crate) fn spec(&self, qkv_bias: bool, o_bias: bool, mlp_bias: bool) -> Result<DecoderSpec, PolicyError> {
        let invalid = |message: String| PolicyError::Config(message);
        if self.hidden_act != "silu" {
            return Err(invalid(format!("hidden_act {:?} is not supported (only silu)", self.hidden_act)));
        }
        for (name, value) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
        ] {
            if value <= 0 {
                return Err(invalid(format!("{name} must be positive, got {value}")));
            }
        }
        let heads = self.num_attention_heads;
        let kv_heads = self.num_key_value_heads.unwrap_or(heads);
        if kv_heads <= 0 || heads % kv_heads != 0 {
            return Err(invalid(format!(
                "num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"
            )));
        }
        let head_dim = match self.head_dim {
            Some(d) => d,
            None if self.hidden_size % heads == 0 => self.hidden_size / heads,
            None => {
                return Err(invalid(format!(
                    "hidden_size ({}) is not divisible by num_attention_heads ({heads}) and head_dim is not set",
                    self.hidden_size
                )));
            }
        };
        if head_dim <= 0 || head_dim % 2 != 0 {
            return Err(invalid(format!("head_dim must be positive and even, got {head_dim}")));
        }
        let (rope_theta, rope_scaling) = self.rope()?;
        Ok(DecoderSpec {
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            layers: self.num_hidden_layers,
            heads,
            kv_heads,
            head_dim,
            rms_norm_eps: self.rms_norm_eps,
            rope_theta,
            rope_scaling,
            max_position_embeddings: self.max_position_embeddings,
            tie_word_embeddings: self.tie_word_embeddings,
            qkv_bias,
            o_bias,
            mlp_bias,
            initializer_range: self.initializer_range,
        })
    }

    fn rope(&self) -> Result<(f64, RopeScaling), PolicyError> {
        let params = self.rope_parameters.as_ref().or(self.rope_scaling.as_ref());
        let theta =
            params.and_then(|p| p.get("rope_theta")).and_then(Value::as_f64).or(self.rope_theta).unwrap_or(10_000.0);
        let Some(params) = params.filter(|p| !p.is_null()) else {
            return Ok((theta, RopeScaling::Default));
        };
        let kind = params.get("rope_type").or_else(|| params.get("type")).and_then(Value::as_str).unwrap_or("default");
        let number = |key: &str| {
            params
                .get(key)
                .and_then(Value::as_f64)
                .ok_or_else(|| PolicyError::Config(format!("rope scaling {kind:?} needs a numeric {key:?}")))
        };
        let scaling = match kind {
            "default" => RopeScaling::Default,
            "linear" => RopeScaling::Linear { factor: number("factor")? },
            "llama3" => RopeScaling::Llama3 {
                factor: number("factor")?,
                low_freq_factor: number("low_freq_factor")?,
                high_freq_factor: number("high_freq_factor")?,
                original_max_position_embeddings: number("original_max_position_embeddings")?,
            },
            other => {
                return Err(PolicyError::Config(format!(
                    "rope type {other:?} is not supported (default, linear, llama3)"
                )));
            }
        };
        Ok((theta, scaling))
    }
}

/// A checkpoint's model configuration, by family.
#[derive(Debug, Clone)]
pub enum ModelConfig {
    Qwen2(qwen2::Config),
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

    pub fn architecture(&self) -> &'static str {
        match self {
            Self::Qwen2(_) => "qwen2",
            Self::Llama(_) => "llama",
        }
    }

    pub fn common(&self) -> &CommonConfig {
        match self {
            Self::Qwen2(c) => &c.common,
            Self::Llama(c) => &c.common,
        }
    }

    pub fn spec(&self) -> Result<DecoderSpec, PolicyError> {
        match self {
            Self::Qwen2(c) => c.spec(),
            Self::Llama(c) => c.spec(),
        }
    }
}
