//! The agent's policy: a decoder-only transformer (Qwen2 and Llama families) on libtorch through
//! `tch`, its tokenizer, generation with a key/value cache, and scoring for training.
//!
//! A [`Policy`] is a checkpoint directory in Hugging Face's layout (`config.json`,
//! `model.safetensors` or sharded `model-*.safetensors` + `model.safetensors.index.json`,
//! `tokenizer.json`, `tokenizer_config.json`), so real models load as they are and our own
//! checkpoints load in `transformers`. Toolsmith adds `toolsmith-state.json` (training step,
//! tokenizer hash, optimizer state).
//!
//! The [`policy`] holds what the other rooms make: [`models`] and [`config`] describe the network,
//! [`decoder`] runs it, [`checkpoint`] and [`lora`] read and write its files, [`tokenizer`] maps
//! text to ids, [`generate`] (with [`sampling`], [`prefix`], [`constrain`] and [`calls`]) decodes
//! and [`score`] scores for training; [`precision`], [`runtime`], [`packed`] and [`memory`] are
//! about the machine it runs on.

#![warn(missing_docs)]

pub mod calls;
pub mod checkpoint;
pub mod config;
pub mod constrain;
pub mod decoder;
pub mod generate;
pub mod lora;
pub mod memory;
pub mod models;
pub mod packed;
pub mod policy;
pub mod precision;
pub mod prefix;
pub mod runtime;
pub mod sampling;
pub mod score;
pub mod tokenizer;

use std::path::{Path, PathBuf};

pub use calls::{CallRules, TurnConstraint, TurnGrammar, TurnMatcher};
pub use checkpoint::PolicyState;
pub use config::{DecoderSpec, TINY_CONFIG};
pub use generate::{Constraint, FinishReason, Generation, GenerationStats, TokenEvent};
pub use lora::{AdapterFiles, LoraConfig};
pub use models::ModelConfig;
pub use policy::{LoadOptions, Policy};
pub use precision::{CpuFeatures, Precision, cpu_has_bf16, cpu_trains_in_bf16};
pub use prefix::{PrefixCache, PrefixStats};
pub use runtime::{parse_device, seeded, set_threads};
pub use sampling::SamplingParams;
pub use score::{FrozenActivations, ScoreOptions, TokenScores, TokenSequence};
pub use tch;
pub use tokenizer::{TINY_TOKENIZER, Tokenizer};

/// Errors of the policy. Torch errors from libtorch itself (shapes, devices, out of memory) come
/// through as [`PolicyError::Torch`].
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// A model or adapter configuration that is malformed or not supported.
    #[error("invalid model config: {0}")]
    Config(String),
    /// A tokenizer that does not load, or text or ids it cannot take.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A checkpoint directory that does not hold what a policy needs (or not for this model).
    #[error("checkpoint {path}: {message}")]
    Checkpoint {
        /// The directory or file at fault.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A generation or scoring request out of range (prompts, sampling settings, a schema).
    #[error("invalid request: {0}")]
    Sampling(String),
    /// A device or precision this machine does not have.
    #[error("device: {0}")]
    Device(String),
    /// An error of libtorch itself.
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

impl PolicyError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io { path: path.to_owned(), source }
    }

    pub(crate) fn checkpoint(path: &Path, message: impl Into<String>) -> Self {
        Self::Checkpoint { path: path.to_owned(), message: message.into() }
    }
}

/// A pretrained policy known by name: `--init NAME` and `--policy NAME` find it where setup put
/// it, or where its environment variable points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamedPolicy {
    /// The name users type.
    pub name: &'static str,
    /// Overrides the directory.
    pub env: &'static str,
    /// The directory under `.deps/` of this checkout.
    pub dir: &'static str,
    /// What fetches it.
    pub fetch: &'static str,
}

/// The policies known by name (`tiny` is built, not fetched, and is not among them).
pub const NAMED_POLICIES: &[NamedPolicy] = &[NamedPolicy {
    name: "smollm2-135m",
    env: "TOOLSMITH_SMOLLM2",
    dir: "smollm2-135m-instruct",
    fetch: "./scripts/setup.sh (or ./scripts/fetch-smollm2.sh)",
}];

/// The checkpoint directory `spec` names: a known name (see [`NAMED_POLICIES`]) or a path. A
/// known name that was never fetched is an error that says how to fetch it.
pub fn locate(spec: &str) -> Result<PathBuf, PolicyError> {
    // A directory of that name wins: a user's own checkpoint is never shadowed by a name.
    let Some(named) = NAMED_POLICIES.iter().find(|n| n.name == spec && !Path::new(spec).exists()) else {
        return Ok(PathBuf::from(spec));
    };
    let set = |name: &str| std::env::var_os(name).filter(|d| !d.is_empty()).map(PathBuf::from);
    let dir = set(named.env).unwrap_or_else(|| {
        toolsmith_contract::home::data_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.deps")).0.join(named.dir)
    });
    if !dir.join("config.json").is_file() {
        return Err(PolicyError::checkpoint(
            &dir,
            format!("the {} policy is not here: run {} or set {}", named.name, named.fetch, named.env),
        ));
    }
    Ok(dir)
}
