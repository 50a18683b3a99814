//! The policy-gradient loss of group-relative RL: the PPO clipped surrogate on the policy's own
//! tokens, with separate lower and upper clip ranges (DAPO's clip-higher), a KL penalty to a frozen
//! reference (k1, k2 or the bounded k3 estimator), and a choice of how token losses are aggregated (GRPO's per-response
//! mean, DAPO's token mean, Dr. GRPO's constant normaliser).
//!
//! Aggregation is expressed as a weight per token, computed on the host from the whole batch
//! ([`token_weights`]) before any micro-batch is scored: the loss of a micro-batch is then
//! `sum(weight * token_loss)`, and the micro-batches' gradients add up to the batch's gradient
//! whatever way the batch was split.

use serde::{Deserialize, Serialize};
use toolsmith_policy::tch::{Kind, Tensor};

/// How token losses of a batch become one number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Aggregation {
    /// Mean over all trained tokens of the batch (DAPO): a long answer weighs as much per token
    /// as a short one, so long wrong answers are not under-penalised.
    TokenMean,
    /// Mean over episodes of each episode's token mean (the original GRPO's per-response mean).
    /// An episode trained as several sequences (MemPO's turns, a changed tool listing) is one
    /// response: its turns share its weight, so more turns do not weigh more.
    SequenceMean,
    /// Sum over an episode's tokens divided by a constant (the longest allowed response), mean
    /// over episodes (Dr. GRPO: no length normalisation bias).
    SequenceSumConstant,
}

/// How the KL to the reference is estimated per token from `log_ratio = logp - ref_logp`
/// (Schulman, "Approximating KL divergence"; verl's `kl_penalty`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum KlEstimator {
    /// `log_ratio`: unbiased, high variance, can be negative.
    K1,
    /// `log_ratio^2 / 2`: biased, low variance, never negative.
    K2,
    /// `exp(-log_ratio) + log_ratio - 1`: unbiased, low variance, never negative (GRPO's). Its
    /// value is clamped to [-10, 10] as verl does: one token the reference finds far less likely
    /// would otherwise reach ~5e8 and swamp the batch.
    K3,
}

/// The bound of the k3 estimate's value.
pub const K3_BOUND: f64 = 10.0;

/// Settings of [`policy_loss`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LossConfig {
    /// Lower clip range: the ratio is clipped below at `1 - clip_low`. By default 0.2.
    pub clip_low: f64,
    /// Upper clip range: clipped above at `1 + clip_high`. By default 0.28 (DAPO's clip-higher,
    /// which keeps unlikely tokens able to grow and entropy from collapsing).
    pub clip_high: f64,
    /// Coefficient of the KL penalty to the reference policy; 0 disables it (and the reference
    /// is never scored). By default 0.
    pub kl_coef: f64,
    /// How the KL is estimated. By default `k3`.
    pub kl_estimator: KlEstimator,
    /// How token losses aggregate. By default the token mean.
    pub aggregation: Aggregation,
}

impl Default for LossConfig {
    fn default() -> Self {
        LossConfig {
            clip_low: 0.2,
            clip_high: 0.28,
            kl_coef: 0.0,
            kl_estimator: KlEstimator::K3,
            aggregation: Aggregation::TokenMean,
        }
    }
}

impl LossConfig {
    /// GRPO's loss as the papers that follow it set it: a symmetric clip of 0.2, `kl_coef` and
    /// `aggregation` (the estimator kept).
    pub fn grpo(self, kl_coef: f64, aggregation: Aggregation) -> Self {
        LossConfig { clip_low: 0.2, clip_high: 0.2, kl_coef, aggregation, ..self }
    }

    /// Checks values a loss cannot be computed with.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.clip_low > 0.0 && self.clip_low < 1.0) {
            return Err(format!("clip_low must be in (0, 1), got {}", self.clip_low));
        }
        if !(self.clip_high > 0.0 && self.clip_high.is_finite()) {
            return Err(format!("clip_high must be positive, got {}", self.clip_high));
        }
        if !(self.kl_coef >= 0.0 && self.kl_coef.is_finite()) {
            return Err(format!("kl_coef must be >= 0, got {}", self.kl_coef));
        }
        Ok(())
    }
}

/// The weight of each trained token in the batch loss, per sequence, for `aggregation`.
/// `trained[i]` is the number of trained tokens of sequence `i` and `episodes[i]` the episode it
/// comes from (sequences of one episode share a key); `constant` is Dr. GRPO's normaliser (the
/// longest response the run allows). Every token of sequence `i` gets the same weight; sequences
/// without trained tokens get 0.
pub fn token_weights(trained: &[usize], episodes: &[usize], aggregation: Aggregation, constant: usize) -> Vec<f64> {
    debug_assert_eq!(trained.len(), episodes.len(), "an episode key per sequence");
    let mut per_episode: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
    for (&n, &e) in trained.iter().zip(episodes) {
        if n > 0 {
            *per_episode.entry(e).or_default() += n;
        }
    }
    let count = per_episode.len() as f64;
    let total: usize = trained.iter().sum();
    trained
        .iter()
        .zip(episodes)
        .map(|(&n, e)| {
            if n == 0 {
                return 0.0;
            }
            match aggregation {
                Aggregation::TokenMean => 1.0 / total as f64,
                Aggregation::SequenceMean => 1.0 / (per_episode[e] as f64 * count),
                Aggregation::SequenceSumConstant => 1.0 / (constant.max(1) as f64 * count),
            }
        })
        .collect()
}

/// The per-token inputs of a micro-batch, all `[batch, tokens]` and aligned with
/// [`toolsmith_policy::score::TokenScores`] (position t is token t).
#[derive(Debug)]
pub struct LossInputs<'a> {
    /// 1.0 on trained tokens.
    pub mask: &'a Tensor,
    /// Behaviour log-probs (the policy that sampled the episode).
    pub old_logprobs: &'a Tensor,
    /// Reference log-probs (for the KL penalty), when `kl_coef > 0`.
    pub ref_logprobs: Option<&'a Tensor>,
    /// Advantage of each token.
    pub advantages: &'a Tensor,
    /// Aggregation weight of each token (see [`token_weights`]); `[batch, 1]` broadcasts one
    /// weight per sequence.
    pub weights: &'a Tensor,
    /// Truncated importance weights of the policy-gradient term, when rollouts came from an
    /// engine whose log-probs differ from the trainer's (TIS): `min(p_trainer / p_engine, cap)`.
    pub importance: Option<&'a Tensor>,
}

/// What a loss computation saw. Sums over trained tokens, so the micro-batches' stats add up to
/// the batch's; the means divide by `tokens`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LossStats {
    /// The clipped surrogate part of the loss (aggregation-weighted, like the loss).
    pub policy: f64,
    /// Sum of the per-token KL estimates.
    pub kl_sum: f64,
    /// Sum of the per-token k3 estimates of KL(policy || the policy that sampled the batch): how
    /// far the update has moved from the rollouts' weights. Measured whatever `kl_coef` is.
    pub drift_sum: f64,
    /// Trained tokens whose ratio was clipped (their gradient is zero).
    pub clipped: f64,
    /// Sum of the ratios.
    pub ratio_sum: f64,
    /// Trained tokens.
    pub tokens: f64,
}

impl LossStats {
    /// Adds another micro-batch's stats.
    pub fn add(&mut self, other: &LossStats) {
        self.policy += other.policy;
        self.kl_sum += other.kl_sum;
        self.drift_sum += other.drift_sum;
        self.clipped += other.clipped;
        self.ratio_sum += other.ratio_sum;
        self.tokens += other.tokens;
    }

    /// Mean KL per trained token.
    pub fn kl(&self) -> f64 {
        self.kl_sum / self.tokens.max(1.0)
    }

    /// Mean KL to the sampling policy per trained token (k3).
    pub fn drift(&self) -> f64 {
        self.drift_sum / self.tokens.max(1.0)
    }

    /// Share of trained tokens that were clipped.
    pub fn clip_fraction(&self) -> f64 {
        self.clipped / self.tokens.max(1.0)
    }

    /// Mean importance ratio.
    pub fn ratio(&self) -> f64 {
        self.ratio_sum / self.tokens.max(1.0)
    }
}

/// The per-token estimate of KL(policy || reference) by `estimator`.
pub fn kl(logprobs: &Tensor, ref_logprobs: &Tensor, estimator: KlEstimator) -> Tensor {
    let log_ratio = logprobs - ref_logprobs;
    match estimator {
        KlEstimator::K1 => log_ratio,
        KlEstimator::K2 => log_ratio.square() * 0.5,
        KlEstimator::K3 => k3(logprobs, ref_logprobs),
    }
}

/// The k3 estimator of KL(policy || reference) per token: `exp(ref - cur) - (ref - cur) - 1`,
/// unbiased and never negative (GRPO's penalty), its value clamped to [`K3_BOUND`].
pub fn k3(logprobs: &Tensor, ref_logprobs: &Tensor) -> Tensor {
    // The log-ratio is clamped first so exp cannot overflow, then the value itself: a log-ratio
    // of 20 alone would give ~5e8.
    let log_ratio = (ref_logprobs - logprobs).clamp(-20.0, 20.0);
    (log_ratio.exp() - &log_ratio - 1.0).clamp(-K3_BOUND, K3_BOUND)
}

/// The loss of one micro-batch and its stats. `logprobs` are the current policy's (with
/// gradients).
///
/// Per token: `ratio = exp(logp - old)`, `surrogate = min(ratio * A, clip(ratio, 1 - low, 1 +
/// high) * A)` (times the TIS weight when there is one), `loss = -surrogate + kl_coef * KL`; the
/// micro-batch's loss is the weighted sum.
pub fn policy_loss(logprobs: &Tensor, inputs: &LossInputs<'_>, config: &LossConfig) -> (Tensor, LossStats) {
    let weights = inputs.weights * inputs.mask;
    let log_ratio = (logprobs - inputs.old_logprobs) * inputs.mask;
    let ratio = log_ratio.exp();
    let unclipped = &ratio * inputs.advantages;
    let clipped = ratio.clamp(1.0 - config.clip_low, 1.0 + config.clip_high) * inputs.advantages;
    let surrogate = match inputs.importance {
        Some(w) => unclipped.minimum(&clipped) * w,
        None => unclipped.minimum(&clipped),
    };
    let policy = -(&surrogate * &weights).sum(Kind::Float);
    let (loss, kl_sum) = match (inputs.ref_logprobs, config.kl_coef > 0.0) {
        (Some(reference), true) => {
            let kl = kl(logprobs, reference, config.kl_estimator) * inputs.mask;
            let penalty = (&kl * &weights).sum(Kind::Float) * config.kl_coef;
            (&policy + penalty, kl.sum(Kind::Float).double_value(&[]))
        }
        _ => (policy.shallow_clone(), 0.0),
    };
    // Clipped where the clipped term is the smaller one, i.e. where the gradient vanishes.
    let was_clipped = clipped.lt_tensor(&unclipped).to_kind(Kind::Float) * inputs.mask;
    let drift = k3(&logprobs.detach(), inputs.old_logprobs) * inputs.mask;
    let stats = LossStats {
        policy: policy.double_value(&[]),
        kl_sum,
        drift_sum: drift.sum(Kind::Float).double_value(&[]),
        clipped: was_clipped.sum(Kind::Float).double_value(&[]),
        ratio_sum: (ratio.detach() * inputs.mask).sum(Kind::Float).double_value(&[]),
        tokens: inputs.mask.sum(Kind::Float).double_value(&[]),
    };
    (loss, stats)
}
