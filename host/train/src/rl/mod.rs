//! Group-relative reinforcement learning: the pieces `toolsmith train rl` is built from.
//!
//! - [`advantage`]: group normalisation (GRPO, Dr. GRPO), DAPO's dynamic sampling and soft
//!   overlong penalty, discounted returns for step-level credit.
//! - [`loss`]: the clipped surrogate with clip-higher, the KL penalty to a frozen reference
//!   (k1, k2 or the bounded k3), and the token aggregation of each method, micro-batch exact.
//! - [`method`]: each paper's reward and credit assignment (GAP, SEARL, MemPO, MTR), one file
//!   each, registered in one table; [`reward`] holds what they share.
//! - [`episode`]: a sampled episode as token-exact sequences with behaviour log-probs.
//! - [`sampler`]: the seam the trainer and the environments share: groups sampled, rewarded
//!   and credited token by token, without an update (`env serve` and `env atropos` use it).
//! - [`training_graph`]: SEARL's tool graph growing during training (the run's own registry).
//! - [`config`] and [`trainer`]: `toolsmith train rl`: its settings and its setup; one iteration
//!   (rollouts in groups, rewards, credit, updates) is `iteration`, its sampling `rollout` and
//!   its mini-batches `update`; the loop, checkpoints and held-out evaluation are the trainer
//!   core's ([`crate::run`]).

pub mod advantage;
pub mod config;
pub mod episode;
mod iteration;
pub mod loss;
pub mod method;
pub mod reward;
mod rollout;
pub mod sampler;
pub mod trainer;
pub mod training_graph;
mod update;

pub use config::RlConfig;
pub use method::{METHODS, Method};
pub use trainer::RlTrainer;
