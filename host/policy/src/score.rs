//! Scoring sequences for training: per-token log-probabilities of the tokens actually taken, their
//! entropy, and a loss mask (the policy's own tokens, not the observations it was shown). Batches
//! are right-padded, so plain causal attention is exact for every real token; long batches are
//! split into micro-batches whose gradients accumulate, which keeps memory bounded.

use std::ops::Range;

use tch::{Kind, Tensor};

use crate::decoder::AttentionMask;
use crate::{Policy, PolicyError};

/// A token sequence and which of its tokens are trained on.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenSequence {
    pub ids: Vec<i64>,
    /// Same length as `ids`; true for tokens whose log-prob enters the loss. The first token has
    /// no prediction and is never scored.
    pub loss_mask: Vec<bool>,
}

impl TokenSequence {
    /// A prompt (not trained on) followed by a completion (trained on).
    pub fn completion(prompt: &[i64], completion: &[i64]) -> Self {
        let mut ids = prompt.to_vec();
        ids.extend_from_slice(completion);
        let mut loss_mask = vec![false; prompt.len()];
        loss_mask.resize(ids.len(), true);
        Self { ids, loss_mask }
    }
}

/// Scores of a right-padded batch, all `[batch, tokens]`; position t scores token t given the
/// tokens before it (position 0 and padding are 0 with mask 0).
#[derive(Debug)]
pub struct TokenScores {
    pub logprobs: Tensor,
    /// Entropy of the predictive distribution at each position (when asked for).
    pub entropy: Option<Tensor>,
    /// 1.0 where the token is real, scored and selected by the loss mask; float, for weighting.
    pub mask: Tensor,
}

impl TokenScores {
    /// Sum of masked log-probs per sequence, `[batch]`.
    pub fn sequence_logprobs(&self) -> Tensor {
        (&self.logprobs * &self.mask).sum_dim_intlist(-1, false, Kind::Float)
    }
}

/// Groups consecutive sequences so that each group, padded to its longest member, holds at most
/// `max_tokens` tokens (a sequence longer than that is a group of its own).
pub fn micro_batches(sequences: &[TokenSequence], max_tokens: usize) -> Vec<Range<usize>> {
    let mut groups = Vec::new();
    let mut start = 0;
    let mut longest = 0;
    for (i, seq) in sequences.iter().enumerate() {
        let candidate = longest.max(seq.ids.len());
        if i > start && candidate * (i - start + 1) > max_tokens {
            groups.push(start..i);
            start = i;
            longest = seq.ids.len();
        } else {
            longest = candidate;
        }
    }
    if start < sequences.len() {
        groups.push(start..sequences.len());
    }
    groups
}

impl Policy {
    /// Scores `sequences` in one batch. Gradients flow unless called under `tch::no_grad`.
    pub fn score(&self, sequences: &[TokenSequence], with_entropy: bool) -> Result<TokenScores, PolicyError> {
        let model = self.model();
        let vocab = model.spec().vocab_size;
        let (b, t) = (sequences.len(), sequences.iter().map(|s| s.ids.len()).max().unwrap_or(0));
        if b == 0 || t < 2 {
            return Err(PolicyError::Sampling("scoring needs at least one sequence of two or more tokens".into()));
        }
        let pad = self.tokenizer().pad_id();
        let mut ids = vec![pad; b * t];
        let mut mask = vec![0_f32; b * t];
        for (i, s) in sequences.iter().enumerate() {
            if s.loss_mask.len() != s.ids.len() {
                return Err(PolicyError::Sampling(format!(
                    "sequence {i}: loss mask has {} entries for {} tokens",
                    s.loss_mask.len(),
                    s.ids.len()
                )));
            }
            if let Some(&bad) = s.ids.iter().find(|&&id| id < 0 || id >= vocab) {
                return Err(PolicyError::Sampling(format!("sequence {i}: token id {bad} outside 0..{vocab}")));
            }
            ids[i * t..i * t + s.ids.len()].copy_from_slice(&s.ids);
            for (j, &m) in s.loss_mask.iter().enumerate().skip(1) {
                mask[i * t + j] = if m { 1.0 } else { 0.0 };
            }
        }
        let device = model.device();
        let (bi, ti) = (b as i64, t as i64);
        let ids = Tensor::from_slice(&ids).view([bi, ti]).to_device(device);
        let mask = Tensor::from_slice(&mask).view([bi, ti]).to_device(device);
        let positions = Tensor::arange(ti, (Kind::Int64, device)).unsqueeze(0).expand([bi, ti], true);
        let hidden = model.forward(&ids, &positions, &AttentionMask::Causal, None);
        // Position t-1 predicts token t; log-softmax in float32 whatever the model's precision.
        let logits = model.logits(&hidden.narrow(1, 0, ti - 1)).to_kind(Kind::Float);
        let targets = ids.narrow(1, 1, ti - 1);
        // One fused log-softmax (forward and backward) is faster than logsumexp + gather.
        let log_probs = logits.log_softmax(-1, Kind::Float);
        let taken = log_probs.gather(-1, &targets.unsqueeze(-1), false).squeeze_dim(-1);
        let zero = Tensor::zeros([bi, 1], (Kind::Float, device));
        let logprobs = Tensor::cat(&[&zero, &taken], 1);
        let entropy = with_entropy.then(|| {
            let entropy = -(log_probs.exp() * &log_probs).sum_dim_intlist(-1, false, Kind::Float);
            Tensor::cat(&[&zero, &entropy], 1)
        });
        Ok(TokenScores { logprobs, entropy, mask })
    }

    /// Runs `loss` over micro-batches of at most `max_tokens` padded tokens and back-propagates
    /// each, so gradients accumulate in the variables while activations of only one micro-batch
    /// are alive. `loss` gets the micro-batch's scores and its range in `sequences`; it should
    /// weight its value as a share of the whole batch (e.g. divide by the batch's total number of
    /// masked tokens). Returns the summed loss.
    pub fn accumulate_gradients(
        &self,
        sequences: &[TokenSequence],
        max_tokens: usize,
        with_entropy: bool,
        mut loss: impl FnMut(&TokenScores, Range<usize>) -> Tensor,
    ) -> Result<f64, PolicyError> {
        let mut total = 0.0;
        for range in micro_batches(sequences, max_tokens) {
            let scores = self.score(&sequences[range.clone()], with_entropy)?;
            let value = loss(&scores, range);
            value.f_backward().map_err(PolicyError::Torch)?;
            total += value.f_double_value(&[]).map_err(PolicyError::Torch)?;
        }
        Ok(total)
    }
}
