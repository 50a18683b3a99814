//! One RL iteration, the unit the trainer core runs: sample the groups ([`super::sampler`], the
//! seam the environments share), let the method score them and assign credit ([`super::method`]), turn them into
//! token-exact examples with old and reference log-probs, learn the tool graph, and update the
//! policy with the clipped surrogate ([`super::update`]'s mini-batches). [`RlUnit`] and every
//! step of its iteration live here, in the order an iteration runs them.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use toolsmith_agent::Trajectory;
use toolsmith_agent::backend::CompletionsBackend;
use toolsmith_agent::tools::CREATE_TOOL;
use toolsmith_policy::tch::{Kind, Tensor};
use toolsmith_policy::{Policy, ScoreOptions};

use crate::TrainError;
use crate::checkpoint::RunDir;
use crate::metrics::{IterationMetrics, Record};
use crate::rl::config::{OldLogprobs, RlConfig};
use crate::rl::loss::{LossInputs, LossStats, policy_loss};
use crate::rl::reward::correct;
use crate::rl::sampler::{Group, Sampled, Sampler};
use crate::rl::training_graph::GraphUpdate;
use crate::rl::update::{Example, MiniBatch, UpdateOutcome, cut_off, deal, longest_first, score_all};
use crate::run::{Core, Unit, padded_rows};
use crate::sequence::SequenceBuilder;

/// The policy a KL penalty anchors to.
pub(super) enum Reference {
    /// A frozen copy of the starting weights.
    Copy(Arc<Mutex<Policy>>),
    /// The trained policy with its LoRA adapters turned off: the base, with no second copy.
    Base,
}

/// What an iteration needs besides the core.
pub(super) struct RlUnit {
    pub(super) sampler: Sampler,
    pub(super) builder: SequenceBuilder,
    pub(super) reference: Option<Reference>,
    pub(super) engine: Option<CompletionsBackend>,
    pub(super) runtime: tokio::runtime::Runtime,
    pub(super) run: RunDir,
}

impl std::fmt::Debug for RlUnit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RlUnit").field("method", &self.config().method).finish_non_exhaustive()
    }
}

impl Unit for RlUnit {
    /// One iteration: rollouts (with dynamic sampling), credit, the tool graph's update, the
    /// policy's update.
    fn unit(&mut self, core: &mut Core) -> Result<Record, TrainError> {
        let started = Instant::now();
        let iteration = core.state().step;
        let sampled = self.runtime.block_on(self.sampler.sample(iteration));
        // The rollouts' keys and values are stale once the weights move: freed now, the update
        // reuses their memory instead of adding to it (issue: RL's peak RSS).
        self.sampler.backend().release_memory();
        let policy = core.policy();
        let mut examples = self.credited_examples(&sampled, &policy)?;
        let gap = self.old_logprobs(&mut examples, &policy)?;
        self.reference_logprobs(&mut examples, &policy)?;
        let all: Vec<&Group> = sampled.kept.iter().chain(&sampled.dropped).collect();
        let calls = self.count_calls(&all)?;
        let graph = self.sampler.learn_tools(iteration, &all)?;
        let update = {
            // Every micro-batch allocates and frees the same large tensors: reused from the heap,
            // not zero-filled afresh. Only here, so that decoding keeps glibc's defaults.
            let _heap = toolsmith_policy::memory::HeapReuse::start();
            self.update(core, &examples)?
        };
        // And the update's activations, before the next rollouts.
        toolsmith_policy::memory::release_free_memory();
        let call_worlds: Vec<bool> = self.sampler.worlds().iter().map(|w| w.calls).collect();
        let parts = IterationParts { sampled: &sampled, call_worlds, calls, graph, update, engine_logprob_gap: gap };
        Ok(Record::Iteration(parts.metrics(iteration, started.elapsed().as_secs_f64())))
    }

    fn extra(&self, dir: &Path) -> Result<(), TrainError> {
        self.sampler.graph().map_or(Ok(()), |g| g.snapshot(dir))
    }

    fn sync(&mut self, core: &Core) -> Result<(), TrainError> {
        self.push_weights(&core.policy())
    }
}

/// Calls of an iteration's episodes, by kind.
struct CallCounts {
    created: usize,
    reused: usize,
    other: usize,
}

impl RlUnit {
    /// The run's settings.
    pub(super) fn config(&self) -> &RlConfig {
        self.sampler.config()
    }

    /// The kept groups' examples, each episode's tokens weighted by the method's credit, longest
    /// first.
    fn credited_examples(&self, sampled: &Sampled, policy: &Arc<Mutex<Policy>>) -> Result<Vec<Example>, TrainError> {
        let mut examples: Vec<Example> = self
            .sampler
            .credited(&sampled.kept, policy, &self.builder)?
            .into_iter()
            .map(|c| Example {
                old: c.sequence.behaviour.clone(),
                sequence: c.sequence,
                episode: c.episode,
                advantages: c.advantages,
                reference: None,
                importance: None,
            })
            .collect();
        longest_first(&mut examples);
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
        let Some(engine) = &self.config().engine else { return Ok(None) };
        let options = ScoreOptions::at(self.config().temperature);
        let scored =
            score_all(&toolsmith_contract::sync::lock(policy), examples, &options, self.config().micro_batch_tokens)?;
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
        let options = ScoreOptions::at(self.config().temperature);
        let tokens = self.config().micro_batch_tokens;
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
        let c = self.config();
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
        let c = self.config();
        let MiniBatch { examples: chosen, sequences, weights, frozen } = batch;
        core.optimizer_mut().zero_grad();
        let mut failure = None;
        let options =
            ScoreOptions::at(c.temperature).with_entropy(epoch == 0).recomputing(c.run.gradient_checkpointing);
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
        let grad_norm = core.apply(failure.unwrap_or(loss), c.run.max_grad_norm, lr)?;
        Ok((loss, grad_norm))
    }

    /// Gives the external engine the current weights (when configured to): saved to
    /// `RUN/engine-weights`, then loaded by the engine before the next rollouts.
    pub(super) fn push_weights(&self, policy: &Mutex<Policy>) -> Result<(), TrainError> {
        let (Some(engine), Some(settings)) = (&self.engine, &self.config().engine) else { return Ok(()) };
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

    /// Counts the calls of `groups`: creations, reuses of tools the graph had admitted before
    /// this iteration (as the rollouts saw it) and every other call.
    fn count_calls(&self, groups: &[&Group]) -> Result<CallCounts, TrainError> {
        let admitted: HashSet<String> = match self.sampler.graph() {
            Some(g) => g.admitted_names()?.into_iter().collect(),
            None => HashSet::new(),
        };
        let mut counts = CallCounts { created: 0, reused: 0, other: 0 };
        for c in groups.iter().flat_map(|g| &g.episodes).flat_map(Trajectory::calls) {
            if c.name == CREATE_TOOL {
                counts.created += 1;
            } else if admitted.contains(&c.name) {
                counts.reused += 1;
            } else {
                counts.other += 1;
            }
        }
        Ok(counts)
    }
}

/// What an iteration produced, for its record.
struct IterationParts<'a> {
    sampled: &'a Sampled,
    /// Whether each training world's tasks are tool-call tasks.
    call_worlds: Vec<bool>,
    calls: CallCounts,
    graph: GraphUpdate,
    update: UpdateOutcome,
    engine_logprob_gap: Option<f64>,
}

impl IterationParts<'_> {
    /// The record of iteration `iteration` (0-based) that took `seconds`; episode figures are
    /// over every sampled group (dropped ones too), rewards over the kept ones.
    fn metrics(self, iteration: u64, seconds: f64) -> IterationMetrics {
        let IterationParts { sampled, call_worlds, calls, graph, update, engine_logprob_gap } = self;
        let episodes: Vec<(&Trajectory, &Group)> =
            sampled.kept.iter().chain(&sampled.dropped).flat_map(|g| g.episodes.iter().map(move |e| (e, g))).collect();
        let n = episodes.len().max(1) as f64;
        let rewards: Vec<f64> = sampled.kept.iter().flat_map(|g| g.rewards.iter().map(|r| r.total)).collect();
        let generated: usize = episodes.iter().map(|(e, _)| e.response_tokens()).sum();
        let sampled_turns: usize = episodes.iter().map(|(e, _)| e.turns()).sum();
        let cut_turns = episodes.iter().flat_map(|(e, _)| &e.steps).filter(|s| cut_off(s)).count();
        IterationMetrics {
            iteration: iteration + 1,
            reward: rewards.iter().sum::<f64>() / rewards.len().max(1) as f64,
            // A tool-call task has no answer to match: its episode is right when its calls are
            // exact, which its reward's outcome records.
            em: sampled
                .kept
                .iter()
                .chain(&sampled.dropped)
                .flat_map(|g| {
                    let calls = call_worlds.get(g.world).copied().unwrap_or(false);
                    g.episodes
                        .iter()
                        .zip(&g.rewards)
                        .map(move |(e, r)| if calls { r.outcome >= 1.0 } else { correct(e, &g.task.golden_answers) })
                })
                .filter(|&right| right)
                .count() as f64
                / n,
            groups: sampled.kept.len(),
            dropped: sampled.dropped.len(),
            episodes: episodes.len(),
            turns: sampled_turns as f64 / n,
            response_tokens: generated as f64 / n,
            peak_tokens: episodes.iter().map(|(e, _)| e.peak_tokens() as f64).sum::<f64>() / n,
            cut_turns: cut_turns as f64 / sampled_turns.max(1) as f64,
            kl: update.stats.kl(),
            sampler_kl: update.stats.drift(),
            clip_fraction: update.stats.clip_fraction(),
            entropy: update.entropy,
            loss: update.loss,
            grad_norm: update.grad_norm,
            lr: update.lr,
            created_calls: calls.created,
            reused_calls: calls.reused,
            other_calls: calls.other,
            admitted: graph.admitted,
            graph_tools: graph.tools,
            rollout_tokens_per_sec: generated as f64 / sampled.seconds.max(1e-9),
            engine_logprob_gap,
            seconds,
            rollout_seconds: sampled.seconds,
            elapsed_s: 0.0,
        }
    }
}
