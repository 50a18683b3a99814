//! Scoring sequences for training: per-token log-probabilities of the tokens actually taken, their
//! entropy, and a loss mask (the policy's own tokens, not the observations it was shown). Batches
//! are right-padded, so plain causal attention is exact for every real token; long batches are
//! split into micro-batches whose gradients accumulate, which keeps memory bounded.

use std::ops::Range;

use tch::{Kind, Tensor};

use crate::decoder::{AttentionMask, Transformer};
use crate::{Policy, PolicyError};

/// A token sequence and which of its tokens are trained on.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenSequence {
    /// The tokens.
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
    /// Log-probability of each token given the tokens before it.
    pub logprobs: Tensor,
    /// Entropy of the predictive distribution at each position (when asked for; without gradient).
    pub entropy: Option<Tensor>,
    /// 1.0 where the token is real, scored and selected by the loss mask; float, for weighting.
    pub mask: Tensor,
}

/// How [`Policy::score_with`] scores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreOptions {
    /// The sampling temperature the tokens were drawn at: logits are divided by it, so the
    /// log-probs are those of the distribution the sampler used (as TRL and verl score). Top-p,
    /// top-k and the repetition penalty are not applied: they reshape one draw, and the ratio of
    /// two tempered distributions is what the clipped update compares. 0 or 1 leaves the logits
    /// as they are. By default 1.
    pub temperature: f64,
    /// Also compute the entropy of each scored position's distribution. By default false.
    pub entropy: bool,
    /// Gradient checkpointing, for [`Policy::accumulate_gradients`]: the forward pass keeps only
    /// each trained layer's input, and the backward pass recomputes one layer at a time, so the
    /// activations of one layer are alive instead of all of them (one more forward pass of the
    /// trained layers; the same gradients). Not with LoRA dropout, whose masks a recomputation
    /// would draw anew. Plain scoring ignores it. By default false.
    pub recompute: bool,
}

impl Default for ScoreOptions {
    fn default() -> Self {
        ScoreOptions { temperature: 1.0, entropy: false, recompute: false }
    }
}

impl ScoreOptions {
    /// With entropy.
    pub fn with_entropy(self, entropy: bool) -> Self {
        ScoreOptions { entropy, ..self }
    }

    /// At `temperature`.
    pub fn at(temperature: f64) -> Self {
        ScoreOptions { temperature, ..Self::default() }
    }

    /// With gradient checkpointing (see [`ScoreOptions::recompute`]).
    pub fn recomputing(self, recompute: bool) -> Self {
        ScoreOptions { recompute, ..self }
    }
}

impl TokenScores {
    /// Sum of masked log-probs per sequence, `[batch]`.
    pub fn sequence_logprobs(&self) -> Tensor {
        (&self.logprobs * &self.mask).sum_dim_intlist(-1, false, Kind::Float)
    }
}

/// Each micro-batch's output of the frozen lower layers, kept between passes over the same
/// sequences by [`Policy::accumulate_gradients_reusing`] (tens of MB: one `[tokens, hidden]`
/// tensor per micro-batch). Start a new one for other sequences.
#[derive(Debug, Default)]
pub struct FrozenActivations {
    /// `(frozen layers, residual stream)` per micro-batch.
    batches: Vec<Option<(usize, Tensor)>>,
}

impl FrozenActivations {
    /// Micro-batches whose frozen layers' output is kept.
    pub fn len(&self) -> usize {
        self.batches.iter().flatten().count()
    }

    /// Whether no micro-batch's output is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
    /// Scores `sequences` in one batch at temperature 1. Gradients flow unless called under
    /// `tch::no_grad`.
    pub fn score(&self, sequences: &[TokenSequence], with_entropy: bool) -> Result<TokenScores, PolicyError> {
        self.score_with(sequences, &ScoreOptions::default().with_entropy(with_entropy))
    }

    /// Scores `sequences` in one batch. Only the positions the loss masks select are projected
    /// onto the vocabulary (TRL's `logits_to_keep`, per position): a `[tokens, vocabulary]`
    /// log-softmax over every position of a 49k-vocabulary micro-batch would be gigabytes, while
    /// the trained positions are a fraction of it. Other positions score 0 with mask 0.
    pub fn score_with(&self, sequences: &[TokenSequence], options: &ScoreOptions) -> Result<TokenScores, PolicyError> {
        let options = options.recomputing(false);
        Ok(self.score_reusing(sequences, &options, None)?.0)
    }

    /// [`Policy::score_with`], taking the frozen lower layers' output from `frozen` when it holds
    /// this batch's, and putting it there when not. With `options.recompute`, also what the
    /// backward pass of the trained layers needs ([`Recompute::backward`], after the loss's).
    fn score_reusing(
        &self,
        sequences: &[TokenSequence],
        options: &ScoreOptions,
        frozen: Option<&mut Option<(usize, Tensor)>>,
    ) -> Result<(TokenScores, Option<Recompute>), PolicyError> {
        let model = self.model();
        let vocab = model.spec().vocab_size;
        let (b, t) = (sequences.len(), sequences.iter().map(|s| s.ids.len()).max().unwrap_or(0));
        if b == 0 || t < 2 {
            return Err(PolicyError::Sampling("scoring needs at least one sequence of two or more tokens".into()));
        }
        if !(options.temperature >= 0.0 && options.temperature.is_finite()) {
            return Err(PolicyError::Sampling(format!("temperature must be >= 0, got {}", options.temperature)));
        }
        let pad = self.tokenizer().pad_id();
        let mut ids = vec![pad; b * t];
        let mut mask = vec![0_f32; b * t];
        // Flat indices into the `[b, t - 1]` grid of predictions (row i, column j predicts token
        // j + 1) of the positions that are scored.
        let mut picked: Vec<i64> = Vec::new();
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
                if m {
                    mask[i * t + j] = 1.0;
                    picked.push((i * (t - 1) + j - 1) as i64);
                }
            }
        }
        let device = model.device();
        let (bi, ti) = (b as i64, t as i64);
        let ids = Tensor::from_slice(&ids).view([bi, ti]).to_device(device);
        let mask = Tensor::from_slice(&mask).view([bi, ti]).to_device(device);
        let positions = Tensor::arange(ti, (Kind::Int64, device)).unsqueeze(0).expand([bi, ti], true);
        let layers = if frozen.is_some() || options.recompute { model.frozen_layers() } else { 0 };
        let lower = match frozen {
            Some(slot) if layers > 0 => Some(match slot {
                Some((n, h)) if *n == layers && h.size()[..2] == [bi, ti] => h.shallow_clone(),
                _ => slot.insert((layers, model.lower_hidden(&ids, &positions, layers))).1.shallow_clone(),
            }),
            _ if layers > 0 => Some(model.lower_hidden(&ids, &positions, layers)),
            _ => None,
        };
        let (hidden, recompute) = match lower {
            _ if options.recompute => {
                let (hidden, recompute) = Recompute::forward(model, &ids, &positions, lower, layers);
                (hidden, Some(recompute))
            }
            Some(lower) => (model.forward_from(&lower, &positions, layers), None),
            None => (model.forward(&ids, &positions, &AttentionMask::Causal, None), None),
        };
        let zero = Tensor::zeros([bi, 1], (Kind::Float, device));
        let picked = Tensor::from_slice(&picked).to_device(device);
        // Position t-1 predicts token t.
        let hidden = hidden.narrow(1, 0, ti - 1).reshape([bi * (ti - 1), -1]).index_select(0, &picked);
        let targets = ids.narrow(1, 1, ti - 1).reshape([-1]).index_select(0, &picked);
        // Log-softmax in float32 whatever the model's precision.
        let mut logits = model.logits(&hidden).to_kind(Kind::Float);
        if options.temperature > 0.0 && options.temperature != 1.0 {
            logits /= options.temperature;
        }
        // One fused log-softmax (forward and backward) is faster than logsumexp + gather.
        let log_probs = logits.log_softmax(-1, Kind::Float);
        let taken = log_probs.gather(-1, &targets.unsqueeze(-1), false).squeeze_dim(-1);
        // Back onto the grid: unscored positions are 0 (and carry no gradient).
        let grid = |values: &Tensor| {
            let full = Tensor::zeros([bi * (ti - 1)], (Kind::Float, device)).index_add(0, &picked, values);
            Tensor::cat(&[&zero, &full.view([bi, ti - 1])], 1)
        };
        let logprobs = grid(&taken);
        // Entropy is a statistic, never a loss term: without gradients, so that autograd does not
        // keep two more `[positions, vocabulary]` tensors alive until the backward pass.
        let entropy = options
            .entropy
            .then(|| tch::no_grad(|| grid(&-(log_probs.exp() * &log_probs).sum_dim_intlist(-1, false, Kind::Float))));
        Ok((TokenScores { logprobs, entropy, mask }, recompute))
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
        options: &ScoreOptions,
        loss: impl FnMut(&TokenScores, Range<usize>) -> Tensor,
    ) -> Result<f64, PolicyError> {
        self.accumulate(sequences, max_tokens, options, None, loss)
    }

    /// [`Policy::accumulate_gradients`] for passes over the same sequences (an RL update's
    /// epochs): the first pass keeps each micro-batch's output of the frozen lower layers
    /// ([`crate::decoder::Transformer::frozen_layers`]) in `frozen`, and later passes start from
    /// it, running only the layers that train. Exact: the frozen layers' weights do not change
    /// between passes, and the same computation gives the same values.
    pub fn accumulate_gradients_reusing(
        &self,
        sequences: &[TokenSequence],
        max_tokens: usize,
        options: &ScoreOptions,
        frozen: &mut FrozenActivations,
        loss: impl FnMut(&TokenScores, Range<usize>) -> Tensor,
    ) -> Result<f64, PolicyError> {
        self.accumulate(sequences, max_tokens, options, Some(frozen), loss)
    }

    fn accumulate(
        &self,
        sequences: &[TokenSequence],
        max_tokens: usize,
        options: &ScoreOptions,
        mut frozen: Option<&mut FrozenActivations>,
        mut loss: impl FnMut(&TokenScores, Range<usize>) -> Tensor,
    ) -> Result<f64, PolicyError> {
        let mut total = 0.0;
        for (i, range) in micro_batches(sequences, max_tokens).into_iter().enumerate() {
            let slot = frozen.as_deref_mut().map(|f| {
                if f.batches.len() <= i {
                    f.batches.resize_with(i + 1, || None);
                }
                &mut f.batches[i]
            });
            let (scores, recompute) = self.score_reusing(&sequences[range.clone()], options, slot)?;
            let value = loss(&scores, range);
            value.f_backward().map_err(PolicyError::Torch)?;
            if let Some(recompute) = recompute {
                recompute.backward(self.model())?;
            }
            total += value.f_double_value(&[]).map_err(PolicyError::Torch)?;
        }
        Ok(total)
    }
}

/// What a gradient-checkpointed forward pass keeps ([`ScoreOptions::recompute`]): the input of
/// each trained layer, computed without gradients, and the leaf the loss's gradient reaches.
struct Recompute {
    /// The token embeddings with their graph, when they train (their gradient comes last).
    embedded: Option<Tensor>,
    /// The first layer recomputed (the frozen ones below it never are).
    first: usize,
    /// The residual stream entering layers `first..`, without gradients.
    inputs: Vec<Tensor>,
    /// The residual stream after the last layer, a leaf: the final norm and head start from it.
    top: Tensor,
    positions: Tensor,
}

impl Recompute {
    /// Runs layers `first..` without gradients from `lower` (the frozen layers' output) or from
    /// the embeddings, keeping each layer's input; returns the final hidden states (with a graph
    /// back to the top leaf only) and what [`Recompute::backward`] needs.
    fn forward(
        model: &Transformer,
        ids: &Tensor,
        positions: &Tensor,
        lower: Option<Tensor>,
        first: usize,
    ) -> (Tensor, Recompute) {
        let (embedded, mut x) = match lower {
            Some(lower) => (None, lower),
            None => {
                let embedded = model.embed(ids);
                let x = embedded.detach();
                (embedded.requires_grad().then_some(embedded), x)
            }
        };
        let mut inputs = Vec::with_capacity(model.layer_count().saturating_sub(first));
        tch::no_grad(|| {
            for layer in first..model.layer_count() {
                let next = model.run_layers(&x, positions, layer..layer + 1);
                inputs.push(std::mem::replace(&mut x, next));
            }
        });
        let top = x.detach().set_requires_grad(true);
        let hidden = model.final_norm(&top);
        (hidden, Recompute { embedded, first, inputs, top, positions: positions.shallow_clone() })
    }

    /// Continues the backward pass from the top leaf down: each layer is run again from its
    /// input, with gradients, and back-propagated with the gradient of its output (the sum of
    /// output x gradient has exactly that gradient), which accumulates its weights' gradients and
    /// gives its input's.
    fn backward(self, model: &Transformer) -> Result<(), PolicyError> {
        let mut grad = self.top.grad();
        for (k, input) in self.inputs.iter().enumerate().rev() {
            if !grad.defined() {
                return Ok(());
            }
            let layer = self.first + k;
            let leaf = input.detach().set_requires_grad(true);
            let output = model.run_layers(&leaf, &self.positions, layer..layer + 1);
            (output * &grad).sum(Kind::Float).f_backward().map_err(PolicyError::Torch)?;
            grad = leaf.grad();
        }
        if let Some(embedded) = self.embedded.filter(|_| grad.defined()) {
            (embedded * &grad).sum(Kind::Float).f_backward().map_err(PolicyError::Torch)?;
        }
        Ok(())
    }
}
