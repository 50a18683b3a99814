//! From credited groups to an optimiser update: each episode's token-exact sequences with their
//! per-token advantages, old log-probs (the sampler's, or the trainer's own when an engine
//! sampled) and reference log-probs, then `epochs` clipped updates over the batch.

use std::sync::{Arc, Mutex};

use toolsmith_agent::Trajectory;
use toolsmith_agent::runner::StepRecord;
use toolsmith_policy::score::micro_batches;
use toolsmith_policy::tch::{self, Kind, Tensor};
use toolsmith_policy::{FinishReason, FrozenActivations, Policy, ScoreOptions, TokenSequence};

use crate::TrainError;
use crate::rl::config::OldLogprobs;
use crate::rl::episode::{EpisodeSequence, episode_sequences, mem_span};
use crate::rl::loss::{Aggregation, LossInputs, LossStats, policy_loss, token_weights};
use crate::rl::method::{TurnCredit, token_advantages};
use crate::rl::rollout::Group;
use crate::rl::trainer::{Reference, RlUnit};
use crate::run::{Core, padded_rows};

/// A trained sequence with its per-token inputs.
pub(super) struct Example {
    sequence: EpisodeSequence,
    /// The episode it comes from, unique in the iteration's batch (an episode may be several
    /// sequences; the loss's per-episode aggregations weigh them as one).
    episode: usize,
    advantages: Vec<f64>,
    /// The old policy's log-probs: the sampler's (behaviour) or the trainer's rescoring.
    old: Vec<f64>,
    reference: Option<Vec<f64>>,
    /// TIS weights, when an engine sampled and the run asks for them.
    importance: Option<Vec<f64>>,
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
fn cut(episode: &Trajectory, step: usize, overlong_cache: usize) -> bool {
    overlong_cache > 0 && episode.steps.get(step).is_some_and(cut_off)
}

/// Whether the turn budget cut this turn off.
pub(super) fn cut_off(step: &StepRecord) -> bool {
    step.tokens.as_ref().is_some_and(|t| t.finish == FinishReason::Length)
}

impl RlUnit {
    /// The examples of one group from its turns' credit (`credit[episode][turn]`); its episodes
    /// are numbered from `first_episode` on.
    pub(super) fn examples(
        &self,
        group: &Group,
        credit: &[Vec<TurnCredit>],
        first_episode: usize,
    ) -> Result<Vec<Example>, TrainError> {
        let tokenizer = self.builder.tokenizer();
        let mut examples = Vec::new();
        for (number, (episode, credit)) in group.episodes.iter().zip(credit).enumerate() {
            let sequences = match episode_sequences(&self.builder, episode) {
                Ok(s) => s,
                Err(e) => {
                    // An episode that cannot be scored (past the context) is left out, not fatal.
                    tracing::warn!(task = %group.task.id, "episode left out of the update: {e}");
                    continue;
                }
            };
            for mut sequence in sequences {
                let advantages = token_advantages(
                    &mut sequence,
                    credit,
                    |step| cut(episode, step, self.config.overlong_cache),
                    |ids| Ok(mem_span(tokenizer, ids)?),
                )?;
                if !sequence.tokens.loss_mask.iter().any(|&m| m) {
                    continue;
                }
                let old = sequence.behaviour.clone();
                examples.push(Example {
                    sequence,
                    episode: first_episode + number,
                    advantages,
                    old,
                    reference: None,
                    importance: None,
                });
            }
        }
        Ok(examples)
    }

    /// With rollouts from an engine: the trainer rescores every example with the policy the
    /// engine sampled (one forward pass without gradients) and its log-probs become the old
    /// ones; with `tis`, the policy-gradient term is also weighted by `min(p_trainer / p_engine,
    /// cap)`. Returns the mean absolute engine/trainer log-prob gap per sampled token.
    pub(super) fn old_logprobs(
        &self,
        examples: &mut [Example],
        policy: &Mutex<Policy>,
    ) -> Result<Option<f64>, TrainError> {
        let Some(engine) = &self.config.engine else { return Ok(None) };
        let options = ScoreOptions::at(self.config.temperature);
        let scored =
            score_all(&toolsmith_contract::sync::lock(policy), examples, &options, self.config.micro_batch_tokens)?;
        let (mut gap, mut tokens) = (0.0, 0usize);
        for (example, trainer) in examples.iter_mut().zip(scored) {
            let mask = &example.sequence.tokens.loss_mask;
            let mut importance = vec![0.0; trainer.len()];
            for (i, &m) in mask.iter().enumerate() {
                if m {
                    let engine_lp = example.sequence.behaviour[i];
                    gap += (trainer[i] - engine_lp).abs();
                    tokens += 1;
                    importance[i] = (trainer[i] - engine_lp).exp().min(engine.tis_cap);
                }
            }
            example.old = trainer;
            if engine.old_logprobs == OldLogprobs::Tis {
                example.importance = Some(importance);
            }
        }
        Ok(Some(gap / tokens.max(1) as f64))
    }

    /// The frozen reference's log-probs, when there is a KL term.
    pub(super) fn reference_logprobs(
        &self,
        examples: &mut [Example],
        policy: &Arc<Mutex<Policy>>,
    ) -> Result<(), TrainError> {
        let Some(reference) = &self.reference else { return Ok(()) };
        let options = ScoreOptions::at(self.config.temperature);
        let tokens = self.config.micro_batch_tokens;
        let scored = match reference {
            Reference::Copy(reference) => {
                score_all(&toolsmith_contract::sync::lock(reference), examples, &options, tokens)
            }
            Reference::Base => {
                let mut policy = toolsmith_contract::sync::lock(policy);
                policy.set_adapters_enabled(false);
                let scored = score_all(&policy, examples, &options, tokens);
                policy.set_adapters_enabled(true);
                scored
            }
        }?;
        for (example, reference) in examples.iter_mut().zip(scored) {
            example.reference = Some(reference);
        }
        Ok(())
    }

    /// `epochs` passes over the examples, each one optimiser step per mini-batch
    /// (`deal`), the examples in the order given ([`longest_first`], as they were scored).
    pub(super) fn update(&self, core: &mut Core, examples: &[Example]) -> Result<UpdateOutcome, TrainError> {
        let c = &self.config;
        let iteration = core.state().step;
        let steps_per_epoch = c.mini_batches as u64;
        let step_index =
            |epoch: usize, part: usize| (iteration * c.epochs as u64 + epoch as u64) * steps_per_epoch + part as u64;
        let mut outcome = UpdateOutcome { lr: core.schedule().lr(step_index(0, 0)), ..Default::default() };
        if examples.is_empty() {
            return Ok(outcome);
        }
        let mut parts: Vec<MiniBatch<'_>> = deal(examples, |e| e.episode, c.mini_batches)
            .into_iter()
            .map(|chosen| MiniBatch::new(chosen, c.loss.aggregation, c.max_tokens * c.max_turns))
            .collect();
        for epoch in 0..c.epochs {
            let (mut stats, mut entropy_sum, mut losses, mut norms) =
                (LossStats::default(), 0.0, Vec::new(), Vec::new());
            for (part, batch) in parts.iter_mut().enumerate() {
                if batch.examples.is_empty() {
                    continue;
                }
                let lr = core.schedule().lr(step_index(epoch, part));
                let (loss, grad_norm) = self.step(core, batch, epoch, lr, &mut stats, &mut entropy_sum)?;
                outcome.lr = lr;
                losses.push(loss);
                norms.push(grad_norm);
            }
            let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len().max(1) as f64;
            outcome.loss = mean(&losses);
            outcome.grad_norm = mean(&norms);
            // Entropy is scored in the first epoch only (it does not move much within an
            // update); the loss stats are the last epoch's, where the ratios show how far the
            // earlier steps moved the policy (the first step's are the sampler's up to rounding).
            if epoch == 0 {
                outcome.entropy = entropy_sum / stats.tokens.max(1.0);
            }
            outcome.stats = stats;
        }
        Ok(outcome)
    }

    /// One optimiser step on one mini-batch; adds its loss statistics and entropy to `stats`
    /// and `entropy_sum`. Returns the loss and the gradient norm before clipping.
    fn step(
        &self,
        core: &mut Core,
        batch: &mut MiniBatch<'_>,
        epoch: usize,
        lr: f64,
        stats: &mut LossStats,
        entropy_sum: &mut f64,
    ) -> Result<(f64, f64), TrainError> {
        let c = &self.config;
        let MiniBatch { examples: chosen, sequences, weights, frozen } = batch;
        core.optimizer_mut().zero_grad();
        let mut failure = None;
        let options = ScoreOptions::at(c.temperature).with_entropy(epoch == 0).recomputing(c.gradient_checkpointing);
        let loss = {
            let policy = core.lock();
            policy.accumulate_gradients_reusing(
                sequences,
                c.micro_batch_tokens,
                &options,
                frozen,
                |scores, range| {
                    let t = scores.logprobs.size()[1];
                    let device = scores.logprobs.device();
                    let part = &chosen[range.clone()];
                    let rows =
                        |pick: fn(&Example) -> &[f64]| padded_rows(part.iter().map(|e| pick(e)), t).to_device(device);
                    let old = rows(|e| &e.old);
                    let adv = rows(|e| &e.advantages);
                    let reference =
                        part[0].reference.is_some().then(|| rows(|e| e.reference.as_deref().unwrap_or_default()));
                    let importance =
                        part[0].importance.is_some().then(|| rows(|e| e.importance.as_deref().unwrap_or_default()));
                    // One weight per sequence, broadcast over its tokens.
                    let w = Tensor::from_slice(&weights[range.clone()])
                        .to_kind(Kind::Float)
                        .view([-1, 1])
                        .to_device(device);
                    let inputs = LossInputs {
                        mask: &scores.mask,
                        old_logprobs: &old,
                        ref_logprobs: reference.as_ref(),
                        advantages: &adv,
                        weights: &w,
                        importance: importance.as_ref(),
                    };
                    let (loss, s) = policy_loss(&scores.logprobs, &inputs, &c.loss);
                    stats.add(&s);
                    if let Some(e) = &scores.entropy {
                        *entropy_sum += (e.detach() * &scores.mask).sum(Kind::Float).double_value(&[]);
                    }
                    if !s.policy.is_finite() && failure.is_none() {
                        failure = Some(s.policy);
                    }
                    loss
                },
            )?
        };
        let grad_norm = core.apply(failure.unwrap_or(loss), c.max_grad_norm, lr)?;
        Ok((loss, grad_norm))
    }

    /// Gives the external engine the current weights (when configured to): saved to
    /// `RUN/engine-weights`, then loaded by the engine before the next rollouts.
    pub(super) fn push_weights(&self, policy: &Mutex<Policy>) -> Result<(), TrainError> {
        let (Some(engine), Some(settings)) = (&self.engine, &self.config.engine) else { return Ok(()) };
        if !settings.push_weights {
            return Ok(());
        }
        let dir = self.run.root().join("engine-weights");
        let partial = self.run.root().join(".engine-weights.partial");
        if partial.exists() {
            std::fs::remove_dir_all(&partial).map_err(|e| TrainError::io(&partial, e))?;
        }
        toolsmith_contract::sync::lock(policy).save(&partial)?;
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| TrainError::io(&dir, e))?;
        }
        std::fs::rename(&partial, &dir).map_err(|e| TrainError::io(&dir, e))?;
        let absolute = std::fs::canonicalize(&dir).map_err(|e| TrainError::io(&dir, e))?;
        self.runtime
            .block_on(engine.update_weights(&absolute))
            .map_err(|e| TrainError::Agent(format!("cannot push the weights to the engine: {e}")))?;
        Ok(())
    }
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
struct MiniBatch<'a> {
    examples: Vec<&'a Example>,
    sequences: Vec<TokenSequence>,
    weights: Vec<f64>,
    frozen: FrozenActivations,
}

impl<'a> MiniBatch<'a> {
    fn new(examples: Vec<&'a Example>, aggregation: Aggregation, constant: usize) -> Self {
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
fn deal<T>(examples: &[T], episode: impl Fn(&T) -> usize, parts: usize) -> Vec<Vec<&T>> {
    let parts = parts.max(1);
    let mut dealt: Vec<Vec<&T>> = (0..parts).map(|_| Vec::new()).collect();
    for e in examples {
        dealt[episode(e) % parts].push(e);
    }
    dealt
}

/// Every example's log-probs under `policy` (no gradients), position by position.
fn score_all(
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
