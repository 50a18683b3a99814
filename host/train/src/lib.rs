//! The Toolsmith trainer.
//!
//! Training starts from conversations and ends in a checkpoint that any Toolsmith command (or
//! `transformers`) loads:
//!
//! - [`conversation`]: conversations from JSON lines (Toolsmith's trace files or OpenAI-style `messages`
//!   with `tool` roles), with turns given as text or as token ids (what a rollout generated).
//! - [`sequence`]: one conversation becomes one token sequence plus a loss mask over exactly the
//!   assistant's own tokens and its end-of-turn token (observation masking). The sequence is the
//!   chat template's text tokenized in one piece, so training sees what inference sees.
//! - [`optim`]: AdamW with decoupled weight decay and exportable moments, warm-up then cosine
//!   decay, global-norm clipping, fp32 master weights under bf16.
//! - [`checkpoint`]: a run directory whose checkpoints hold weights, optimiser moments, the
//!   schedule and data position and the metrics so far, each written whole or not at all.
//! - [`settings`]: what SFT and RL runs share (the starting model, device, precision, seed, which
//!   weights train), one type flattened into both configs.
//! - [`run`]: the trainer core both kinds of training drive: setup and the checks of a resume,
//!   the loop, the guarded update, evaluation and checkpoint cadence, one event type.
//! - [`sft`]: supervised fine-tuning over those pieces, with held-out evaluation ([`heldout`])
//!   and a metrics stream ([`metrics`]); [`report`] draws the curves.
//! - [`rl`]: group-relative RL, its methods registered in one table ([`rl::method`]).
//! - [`toolcall`]: `train tools`: tasks from tool interfaces, SFT then RL with a fine-grained
//!   call reward, exact-call accuracy by family.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use toolsmith_train::conversation::read_chats;
//! use toolsmith_train::sequence::SequenceBuilder;
//! let policy = toolsmith_policy::Policy::tiny(0, Default::default())?;
//! let builder = SequenceBuilder::for_policy(&policy)?;
//! for (line, chat) in read_chats(std::path::Path::new("traces.jsonl"))? {
//!     let seq = builder.build(&chat)?;
//!     println!("line {line}: {} tokens, {} trained", seq.len(), seq.trained_tokens());
//! }
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod checkpoint;
pub mod config;
pub mod conversation;
pub mod heldout;
pub mod metrics;
pub mod optim;
pub mod report;
pub mod rl;
pub mod run;
pub mod sequence;
pub mod settings;
pub mod sft;
pub mod toolcall;

use std::path::{Path, PathBuf};

pub use config::SftConfig;
pub use run::{Event, Resume};
pub use settings::{DeviceChoice, Init, PrecisionChoice, RunConfig, RunSettings};
pub use sft::SftTrainer;

/// What can go wrong while training.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrainError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A line of a data file is not a usable conversation.
    #[error("{path}:{line}: {message}")]
    Data {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong, and how to fix it where that is known.
        message: String,
    },
    /// A conversation cannot become a training sequence.
    #[error(transparent)]
    Sequence(#[from] sequence::SequenceError),
    /// The configuration is invalid.
    #[error("config: {0}")]
    Config(String),
    /// A checkpoint is missing, corrupt or does not fit the run.
    #[error("checkpoint {path}: {message}")]
    Checkpoint {
        /// The checkpoint directory or file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A loss or gradient became NaN or infinite; the step was not applied.
    #[error(
        "step {step}: the {what} is not finite ({value}); the step was not applied and the last checkpoint is kept"
    )]
    NonFinite {
        /// The optimiser step.
        step: u64,
        /// `loss` or `gradient norm`.
        what: &'static str,
        /// The value.
        value: f64,
    },
    /// The policy failed (libtorch, tokenizer, checkpoint loading).
    #[error(transparent)]
    Policy(#[from] toolsmith_policy::PolicyError),
    /// The agent runtime failed (held-out evaluation, trace synthesis).
    #[error("{0}")]
    Agent(String),
    /// Training was cancelled between steps.
    #[error("cancelled")]
    Cancelled,
}

impl TrainError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        TrainError::Io { path: path.to_owned(), source }
    }

    pub(crate) fn checkpoint(path: &Path, message: impl Into<String>) -> Self {
        TrainError::Checkpoint { path: path.to_owned(), message: message.into() }
    }
}

impl From<toolsmith_policy::tch::TchError> for TrainError {
    fn from(e: toolsmith_policy::tch::TchError) -> Self {
        TrainError::Policy(toolsmith_policy::PolicyError::Torch(e))
    }
}
