//! The pieces of an update from credited groups: an example (one episode's token-exact sequence
//! with its per-token advantages, old and reference log-probs), the mini-batches the examples
//! are dealt into, and their scoring; [`super::iteration`] runs `epochs` clipped updates with
//! them.

use toolsmith_agent::Trajectory;
use toolsmith_agent::runner::StepRecord;
use toolsmith_policy::score::micro_batches;
use toolsmith_policy::tch::{self, Kind};
use toolsmith_policy::{FinishReason, FrozenActivations, Policy, ScoreOptions, TokenSequence};

use crate::TrainError;
use crate::rl::episode::EpisodeSequence;
use crate::rl::loss::{Aggregation, LossStats, token_weights};

/// A trained sequence with its per-token inputs.
pub(super) struct Example {
    pub(super) sequence: EpisodeSequence,
    /// The episode it comes from, unique in the iteration's batch (an episode may be several
    /// sequences; the loss's per-episode aggregations weigh them as one).
    pub(super) episode: usize,
    pub(super) advantages: Vec<f64>,
    /// The old policy's log-probs: the sampler's (behaviour) or the trainer's rescoring.
    pub(super) old: Vec<f64>,
    pub(super) reference: Option<Vec<f64>>,
    /// TIS weights, when an engine sampled and the run asks for them.
    pub(super) importance: Option<Vec<f64>>,
}

/// What an update did.
#[derive(Debug, Default)]
pub(super) struct UpdateOutcome {
    /// The surrogate loss of the last epoch (the mean over its mini-batches' steps).
    pub(super) loss: f64,
    /// Gradient norm before clipping, last epoch (the mean over its steps).
    pub(super) grad_norm: f64,
    /// Learning rate of the last step.
    pub(super) lr: f64,
    /// The last epoch's loss statistics (KL, clip fraction, sampler KL): after the earlier
    /// epochs' steps, so they show how far those moved the policy.
    pub(super) stats: LossStats,
    /// Mean entropy per trained token, first epoch.
    pub(super) entropy: f64,
}

/// Whether DAPO's overlong filtering takes `episode`'s turn `step` out of the loss: the budget
/// cut it off.
pub(super) fn cut(episode: &Trajectory, step: usize, overlong_cache: usize) -> bool {
    overlong_cache > 0 && episode.steps.get(step).is_some_and(cut_off)
}

/// Whether the turn budget cut this turn off.
pub(super) fn cut_off(step: &StepRecord) -> bool {
    step.tokens.as_ref().is_some_and(|t| t.finish == FinishReason::Length)
}

/// Orders `examples` longest first (stably), so that micro-batches hold similar lengths. Done
/// once, before any scoring: the old, reference and trained log-probs then come from the same
/// micro-batches with the same padding, and before the first step the policy and its reference
/// agree bit for bit. Scored in another grouping they differed by rounding, which Adam turned
/// into a full-size step where the advantages were all 0.
pub(super) fn longest_first(examples: &mut [Example]) {
    examples.sort_by_key(|e| std::cmp::Reverse(e.sequence.tokens.ids.len()));
}

/// One optimiser step's examples, with what every epoch's step over them reuses: their token
/// sequences, their token weights (normalised within the mini-batch) and the frozen lower
/// layers' output, computed in the first epoch.
pub(super) struct MiniBatch<'a> {
    pub(super) examples: Vec<&'a Example>,
    pub(super) sequences: Vec<TokenSequence>,
    pub(super) weights: Vec<f64>,
    pub(super) frozen: FrozenActivations,
}

impl<'a> MiniBatch<'a> {
    pub(super) fn new(examples: Vec<&'a Example>, aggregation: Aggregation, constant: usize) -> Self {
        let sequences: Vec<TokenSequence> = examples.iter().map(|e| e.sequence.tokens.clone()).collect();
        let trained: Vec<usize> =
            sequences.iter().map(|s| s.loss_mask.iter().skip(1).filter(|&&m| m).count()).collect();
        let episodes: Vec<usize> = examples.iter().map(|e| e.episode).collect();
        let weights = token_weights(&trained, &episodes, aggregation, constant);
        MiniBatch { examples, sequences, weights, frozen: FrozenActivations::default() }
    }
}

/// Deals the examples into `parts` mini-batches by episode (episode `e` goes to part
/// `e % parts`), so that an episode's sequences train together and each part keeps the order
/// given (longest first, for micro-batching). Parts may be empty when there are fewer episodes.
pub(super) fn deal<T>(examples: &[T], episode: impl Fn(&T) -> usize, parts: usize) -> Vec<Vec<&T>> {
    let parts = parts.max(1);
    let mut dealt: Vec<Vec<&T>> = (0..parts).map(|_| Vec::new()).collect();
    for e in examples {
        dealt[episode(e) % parts].push(e);
    }
    dealt
}

/// Every example's log-probs under `policy` (no gradients), position by position.
pub(super) fn score_all(
    policy: &Policy,
    examples: &[Example],
    options: &ScoreOptions,
    micro_batch_tokens: usize,
) -> Result<Vec<Vec<f64>>, TrainError> {
    let sequences: Vec<TokenSequence> = examples.iter().map(|e| e.sequence.tokens.clone()).collect();
    let mut out = Vec::with_capacity(sequences.len());
    for range in micro_batches(&sequences, micro_batch_tokens) {
        let scores = tch::no_grad(|| policy.score_with(&sequences[range.clone()], options))?;
        for (row, i) in range.enumerate() {
            let n = sequences[i].ids.len() as i64;
            out.push(Vec::<f64>::try_from(scores.logprobs.get(row as i64).narrow(0, 0, n).to_kind(Kind::Double))?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::deal;

    #[test]
    fn mini_batches_take_whole_episodes_in_the_order_given() {
        // Sequences as (episode, length), longest first; episode 4 has two sequences.
        let examples = [(4, 90), (1, 80), (4, 70), (0, 60), (3, 50), (2, 40)];
        let parts = deal(&examples, |e| e.0, 2);
        assert_eq!(parts[0], vec![&(4, 90), &(4, 70), &(0, 60), &(2, 40)]);
        assert_eq!(parts[1], vec![&(1, 80), &(3, 50)]);
        // One part is the whole batch; more parts than episodes leave some empty.
        assert_eq!(deal(&examples, |e| e.0, 1)[0].len(), 6);
        let many = deal(&examples, |e| e.0, 8);
        assert_eq!(many.iter().filter(|p| p.is_empty()).count(), 3);
        assert_eq!(many.iter().map(Vec::len).sum::<usize>(), 6);
    }
}
