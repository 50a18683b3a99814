//! Group-relative reinforcement learning: the pieces `toolsmith train rl` is built from.
//!
//! - [`advantage`]: group normalisation (GRPO, Dr. GRPO), DAPO's dynamic sampling and soft
//!   overlong penalty, discounted returns for step-level credit.
//! - [`loss`]: the clipped surrogate with clip-higher, the k3 KL penalty to a frozen reference,
//!   and the token aggregation of each method, micro-batch exact.
//! - [`reward`]: each paper's episode reward (GAP, SEARL, MemPO, MTR).
//! - [`episode`]: a sampled episode as token-exact sequences with behaviour log-probs.
//! - [`graph`]: SEARL's tool graph growing during training (the run's own registry).
//! - [`config`] and [`trainer`]: `toolsmith train rl`: rollouts in groups, rewards, advantages,
//!   updates, checkpoints, held-out evaluation.

pub mod advantage;
pub mod config;
pub mod episode;
pub mod graph;
pub mod loss;
pub mod reward;
pub mod trainer;

pub use config::{Method, RlConfig};
pub use trainer::{RlEvent, RlTrainer};
