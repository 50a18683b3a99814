//! What both model families' `config.json` share ([`CommonConfig`]) and the hyperparameters the
//! shared decoder is built from ([`DecoderSpec`]). Each family ([`crate::models`]) deserialises its
//! own config and resolves it into a [`DecoderSpec`].

use serde::Deserialize;
use serde_json::Value;

use crate::PolicyError;

/// The tiny default configuration (Qwen2-style, about 4 M parameters).
pub const TINY_CONFIG: &str = include_str!("../assets/tiny-config.json");

/// Fields both families share, with Hugging Face's names. Sizes have no defaults: every real
/// `config.json` states them, and guessing a size would load the wrong model silently.
#[derive(Debug, Clone, Deserialize)]
pub struct CommonConfig {
    /// Rows of the embedding matrix (and of the LM head).
    pub vocab_size: i64,
    /// Width of the residual stream.
    pub hidden_size: i64,
    /// Width of the MLP's hidden layer.
    pub intermediate_size: i64,
    /// Decoder layers.
    pub num_hidden_layers: i64,
    /// Query heads per layer.
    pub num_attention_heads: i64,
    /// Key/value heads per layer (grouped-query attention); absent: as many as query heads.
    #[serde(default)]
    pub num_key_value_heads: Option<i64>,
    /// Width of a head; absent: `hidden_size / num_attention_heads`.
    #[serde(default)]
    pub head_dim: Option<i64>,
    /// RMSNorm's epsilon. By default 1e-6.
    #[serde(default = "default_rms_norm_eps")]
    pub rms_norm_eps: f64,
    /// Transformers 4.x writes `rope_theta` and `rope_scaling`; 5.x writes `rope_parameters`.
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// Transformers 4.x's rotary scaling (`rope_type` and its numbers).
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    /// Transformers 5.x's rotary parameters (`rope_theta`, `rope_type` and its numbers).
    #[serde(default)]
    pub rope_parameters: Option<Value>,
    /// The context length. By default 2048.
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: i64,
    /// Whether the LM head is the embedding matrix.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// The MLP's activation; only `silu` is supported.
    #[serde(default = "default_hidden_act")]
    pub hidden_act: String,
    /// Standard deviation of freshly initialised weights. By default 0.02.
    #[serde(default = "default_initializer_range")]
    pub initializer_range: f64,
    /// The beginning-of-sequence id(s).
    #[serde(default)]
    pub bos_token_id: Option<TokenIds>,
    /// The end-of-sequence id(s).
    #[serde(default)]
    pub eos_token_id: Option<TokenIds>,
    /// The padding id(s).
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
    /// A single id.
    One(i64),
    /// A list of ids.
    Many(Vec<i64>),
}

impl TokenIds {
    /// The ids as a list.
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
    /// The plain schedule: `theta^(-2i/d)`.
    Default,
    /// Position interpolation: every frequency divided by `factor`.
    Linear {
        /// What every frequency is divided by.
        factor: f64,
    },
    /// Llama 3.1's piecewise schedule.
    Llama3 {
        /// What low frequencies are divided by.
        factor: f64,
        /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are scaled.
        low_freq_factor: f64,
        /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The context length the model was pretrained with.
        original_max_position_embeddings: f64,
    },
}

/// The resolved hyperparameters of a decoder: what [`crate::decoder::Transformer`] is built from.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderSpec {
    /// Rows of the embedding matrix (and of the LM head).
    pub vocab_size: i64,
    /// Width of the residual stream.
    pub hidden_size: i64,
    /// Width of the MLP's hidden layer.
    pub intermediate_size: i64,
    /// Decoder layers.
    pub layers: i64,
    /// Query heads per layer.
    pub heads: i64,
    /// Key/value heads per layer (a divisor of `heads`).
    pub kv_heads: i64,
    /// Width of a head (even, for the rotary halves).
    pub head_dim: i64,
    /// RMSNorm's epsilon.
    pub rms_norm_eps: f64,
    /// The rotary base.
    pub rope_theta: f64,
    /// The rotary frequency schedule.
    pub rope_scaling: RopeScaling,
    /// The context length.
    pub max_position_embeddings: i64,
    /// Whether the LM head is the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Biases on the query, key and value projections.
    pub qkv_bias: bool,
    /// A bias on the output projection.
    pub o_bias: bool,
    /// Biases on the MLP's projections.
    pub mlp_bias: bool,
    /// Standard deviation of freshly initialised weights.
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
