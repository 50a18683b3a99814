//! The RL loop: each iteration draws tasks from the training worlds, samples a group of episodes
//! per task (all groups at once, their turns decoded in batches), scores them with the method's
//! reward, turns rewards into per-token advantages, and updates the policy with the clipped
//! surrogate (plus KL to the frozen starting policy) for a few epochs over the batch.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use toolsmith_agent::backend::{Backend, BatchConfig, BatchedBackend, CompletionsBackend, GenerateOptions, Message};
use toolsmith_agent::env::{Corpus, Task, World};
use toolsmith_agent::simulate::ToolActor;
use toolsmith_agent::tools::{Executor, LocalTools};
use toolsmith_agent::{Agent, AgentConfig, Tag, Trajectory};
use toolsmith_contract::ToolKind;
use toolsmith_policy::score::micro_batches;
use toolsmith_policy::tch::{self, Kind, Tensor};
use toolsmith_policy::{FinishReason, Policy, SamplingParams, TokenSequence};

use crate::TrainError;
use crate::checkpoint::{RunDir, TrainerState, write_json};
use crate::heldout::{HeldOut, ToolsFor};
use crate::metrics::{EvalMetrics, IterationMetrics, MetricsWriter, Record};
use crate::optim::{AdamW, Schedule};
use crate::rl::advantage::{
    answer_probability, group_advantages, informative, memory_advantages, overlong_penalty, searl_step_advantages,
};
use crate::rl::config::{Method, RlConfig};
use crate::rl::episode::{EpisodeSequence, episode_sequences};
use crate::rl::graph::{REGISTRY_FILE, TrainingGraph};
use crate::rl::loss::{LossInputs, LossStats, policy_loss, token_weights};
use crate::rl::reward::{self, EpisodeReward};
use crate::sequence::SequenceBuilder;

/// What a run reports as it goes.
#[derive(Debug)]
pub enum RlEvent<'a> {
    /// Training starts (at an iteration above 0 when resumed).
    Started {
        /// Iterations done.
        iteration: u64,
        /// Iterations in all.
        total: u64,
    },
    /// An iteration ended.
    Iteration(&'a IterationMetrics),
    /// A held-out evaluation starts.
    EvalStarted {
        /// Iterations done.
        iteration: u64,
    },
    /// A held-out evaluation ended.
    Eval(&'a EvalMetrics),
    /// A checkpoint was written.
    Checkpoint {
        /// Iterations done.
        iteration: u64,
        /// Its directory.
        dir: &'a Path,
    },
}

/// A training world: its tasks and tools.
struct TrainWorld {
    tasks: Vec<Task>,
    tools: Arc<dyn Executor>,
}

/// A group: one task's episodes and their rewards.
struct Group {
    /// The training world the task is from (task ids repeat across worlds).
    world: usize,
    task: Task,
    episodes: Vec<Trajectory>,
    rewards: Vec<EpisodeReward>,
}

/// A trained sequence with its per-token inputs.
struct Example {
    sequence: EpisodeSequence,
    advantages: Vec<f64>,
    reference: Option<Vec<f64>>,
}

/// An RL run.
pub struct RlTrainer {
    config: RlConfig,
    run: RunDir,
    policy: Arc<Mutex<Policy>>,
    reference: Option<Arc<Mutex<Policy>>>,
    optimizer: AdamW,
    state: TrainerState,
    schedule: Schedule,
    heldout: Option<HeldOut>,
    metrics: MetricsWriter,
    builder: SequenceBuilder,
    worlds: Vec<TrainWorld>,
    graph: Option<TrainingGraph>,
    backend: Arc<dyn Backend>,
    engine: Option<CompletionsBackend>,
    runtime: tokio::runtime::Runtime,
    cancel: Arc<AtomicBool>,
}

impl std::fmt::Debug for RlTrainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RlTrainer").field("run", &self.run).field("state", &self.state).finish_non_exhaustive()
    }
}

/// A seed from a few numbers (SplitMix64 finaliser over their mix).
fn mix(parts: &[u64]) -> u64 {
    let mut z = 0x9E37_79B9_7F4A_7C15_u64;
    for &p in parts {
        z ^= p.wrapping_add(0x9E37_79B9_7F4A_7C15).wrapping_add(z << 6).wrapping_add(z >> 2);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
    }
    z
}

/// BLAKE3 of the task pool (ids and questions), so a resumed run draws from the same tasks.
fn pool_hash(worlds: &[TrainWorld]) -> String {
    let mut h = blake3::Hasher::new();
    for w in worlds {
        for t in &w.tasks {
            h.update(t.id.as_bytes());
            h.update(t.question.as_bytes());
        }
    }
    h.finalize().to_hex().to_string()
}

impl RlTrainer {
    /// Prepares a run in `out` (resuming its last checkpoint with `resume`).
    pub fn prepare(config: RlConfig, out: &Path, resume: bool, tools_for: &ToolsFor<'_>) -> Result<Self, TrainError> {
        config.validate()?;
        if config.threads > 0 {
            toolsmith_policy::set_threads(config.threads);
        }
        let options = crate::sft::load_options_for(&config.device, &config.precision)?;
        let run = RunDir::create(out)?;
        let initial = if config.init == "tiny" {
            Policy::tiny(config.seed, options)?
        } else {
            Policy::load(Path::new(&config.init), options)?
        };
        // The KL anchor is the starting policy, frozen, whatever iteration a run resumes at.
        // MTR's ToolActor is the starting policy too (what the tools say does not drift with the
        // policy being trained): one frozen copy serves both.
        let frozen = if config.loss.kl_coef > 0.0 || config.simulate.is_some() {
            Some(Arc::new(Mutex::new(initial.reference()?)))
        } else {
            None
        };
        let reference = frozen.clone().filter(|_| config.loss.kl_coef > 0.0);
        let actor = match (&config.simulate, &frozen) {
            (Some(s), Some(frozen)) => {
                let params = SamplingParams {
                    max_new_tokens: s.max_tokens,
                    temperature: s.temperature,
                    seed: mix(&[config.seed, 0x5157]),
                    ..SamplingParams::default()
                };
                Some(ToolActor::new(frozen.clone(), params)?)
            }
            _ => None,
        };
        let resuming = run.should_resume(resume)?;
        let (policy, resumed) = if resuming {
            let restored = run.restore(options)?;
            (restored.policy, Some((restored.state, restored.dir)))
        } else {
            (initial, None)
        };
        let worlds: Vec<TrainWorld> = config
            .worlds
            .seeds
            .iter()
            .map(|&seed| {
                let world = World::generate(config.worlds.world(seed));
                let corpus = Arc::new(Corpus::new(&world.documents()).map_err(|e| TrainError::Agent(e.to_string()))?);
                let tools = match &actor {
                    Some(actor) => simulated(tools_for(corpus).as_ref(), actor.clone())?,
                    None => tools_for(corpus),
                };
                Ok(TrainWorld { tasks: world.tasks(), tools })
            })
            .collect::<Result<_, TrainError>>()?;
        let graph = match (&config.graph, &resumed) {
            (None, _) => None,
            (Some(_), Some((_, dir))) => {
                let graph = TrainingGraph::restore(&run.root().join(REGISTRY_FILE), dir)?;
                let executors: Vec<&dyn Executor> = worlds.iter().map(|w| w.tools.as_ref()).collect();
                graph.install_all(&executors)?;
                Some(graph)
            }
            (Some(_), None) => {
                let tools = worlds.first().map(|w| w.tools.manifests()).unwrap_or_default();
                Some(TrainingGraph::create(&run.root().join(REGISTRY_FILE), &tools)?)
            }
        };
        let heldout = config.eval.clone().map(|e| HeldOut::new(e, config.tool_format, tools_for)).transpose()?;
        let builder = SequenceBuilder::for_policy(&policy)?;
        let total = config.iterations;
        let schedule = Schedule {
            peak: config.lr,
            warmup: (config.warmup_ratio * (total * config.epochs as u64) as f64).round() as u64,
            total: total * config.epochs as u64,
            min_ratio: config.min_lr_ratio,
        };
        let config_json = serde_json::to_value(&config).map_err(|e| TrainError::Config(e.to_string()))?;
        let mut optimizer = AdamW::new(policy.var_store().variables().into_iter().collect(), config.optimizer);
        let hash = pool_hash(&worlds);
        let state = match resumed {
            Some((state, dir)) => {
                if state.kind != "rl" {
                    return Err(TrainError::checkpoint(
                        &dir,
                        format!("a {} checkpoint, not an RL run's; start RL from it with --init", state.kind),
                    ));
                }
                if state.data_hash != hash {
                    return Err(TrainError::checkpoint(
                        &dir,
                        "the training worlds differ from the ones this run was trained on; resume with the same worlds",
                    ));
                }
                // The updates applied, as the policy recorded them (an iteration whose groups were
                // all dropped applies none).
                optimizer.load(&dir.join(crate::checkpoint::OPTIMIZER_STATE), policy.state().step)?;
                TrainerState { total_steps: total, config: config_json, ..state }
            }
            None => {
                let metrics = run.metrics();
                if metrics.exists() {
                    std::fs::remove_file(&metrics).map_err(|e| TrainError::io(&metrics, e))?;
                }
                TrainerState::new("rl", config.seed, hash, total, config_json)
            }
        };
        write_json(&run.root().join("config.json"), &config)?;
        let metrics = MetricsWriter::append(&run.metrics())?;
        let policy = Arc::new(Mutex::new(policy));
        let engine = match &config.engine {
            Some(e) => {
                let key = e.api_key_env.as_ref().and_then(|v| std::env::var(v).ok()).filter(|k| !k.is_empty());
                let tokenizer = policy.lock().unwrap_or_else(|p| p.into_inner()).tokenizer().clone();
                let context =
                    policy.lock().unwrap_or_else(|p| p.into_inner()).config().common().max_position_embeddings;
                Some(
                    CompletionsBackend::new(&e.url, &e.model, key, tokenizer)
                        .map_err(|err| TrainError::Agent(format!("engine {}: {err}", e.url)))?
                        .with_context(usize::try_from(context).unwrap_or(usize::MAX)),
                )
            }
            None => None,
        };
        let backend: Arc<dyn Backend> = match &engine {
            Some(engine) => Arc::new(engine.clone()),
            None => Arc::new(BatchedBackend::new(policy.clone(), "training", BatchConfig::default())),
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| TrainError::Agent(format!("cannot start tokio: {e}")))?;
        Ok(RlTrainer {
            config,
            run,
            policy,
            reference,
            optimizer,
            state,
            schedule,
            heldout,
            metrics,
            builder,
            worlds,
            graph,
            backend,
            engine,
            runtime,
            cancel: Arc::new(AtomicBool::new(false)),
        })
    }

    /// The tools rollouts in training world `index` call (simulated ones for MTR).
    pub fn training_tools(&self, index: usize) -> Option<Arc<dyn Executor>> {
        self.worlds.get(index).map(|w| w.tools.clone())
    }

    /// The policy being trained.
    pub fn policy(&self) -> Arc<Mutex<Policy>> {
        self.policy.clone()
    }

    /// Set it to stop after the current iteration (with a checkpoint).
    pub fn cancel_flag(&self) -> Arc<AtomicBool> {
        self.cancel.clone()
    }

    /// Where training stands.
    pub fn state(&self) -> &TrainerState {
        &self.state
    }

    fn lock(&self) -> MutexGuard<'_, Policy> {
        self.policy.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Trains to the last iteration; returns the directory of the final policy.
    pub fn run(&mut self, on_event: &mut dyn FnMut(RlEvent<'_>)) -> Result<PathBuf, TrainError> {
        on_event(RlEvent::Started { iteration: self.state.step, total: self.config.iterations });
        if self.state.step == 0 {
            self.evaluate(on_event)?;
        }
        let started = Instant::now();
        let elapsed_before = self.state.elapsed_s;
        if self.state.step < self.config.iterations {
            self.push_weights()?;
        }
        while self.state.step < self.config.iterations {
            if self.cancel.load(Ordering::Relaxed) {
                self.checkpoint(on_event)?;
                return Err(TrainError::Cancelled);
            }
            let mut metrics = self.iteration()?;
            self.push_weights()?;
            self.state.step += 1;
            self.state.elapsed_s = elapsed_before + started.elapsed().as_secs_f64();
            metrics.elapsed_s = self.state.elapsed_s;
            self.metrics.write(&Record::Iteration(metrics.clone()))?;
            on_event(RlEvent::Iteration(&metrics));
            let last = self.state.step == self.config.iterations;
            if self.config.eval_every > 0 && self.state.step.is_multiple_of(self.config.eval_every) && !last {
                self.evaluate(on_event)?;
            }
            if self.state.step.is_multiple_of(self.config.checkpoint_every) && !last {
                self.checkpoint(on_event)?;
            }
        }
        self.evaluate(on_event)?;
        self.checkpoint(on_event)?;
        self.run.publish(&self.lock())
    }

    /// Tasks `from..from + count` of the current iteration's order of every training task,
    /// seeded by (seed, iteration) so a resumed run draws the same, and a refill of dynamic
    /// sampling draws tasks not drawn before in the iteration.
    fn draw_tasks(&self, from: usize, count: usize) -> Vec<(usize, Task)> {
        let mut rng = StdRng::seed_from_u64(mix(&[self.config.seed, self.state.step]));
        let mut all: Vec<(usize, usize)> =
            self.worlds.iter().enumerate().flat_map(|(w, world)| (0..world.tasks.len()).map(move |t| (w, t))).collect();
        all.shuffle(&mut rng);
        all.into_iter().skip(from).take(count).map(|(w, t)| (w, self.worlds[w].tasks[t].clone())).collect()
    }

    /// Samples a group of episodes for each task, all at once.
    fn rollouts(&self, draw: u64, tasks: &[(usize, Task)]) -> Vec<Group> {
        let c = &self.config;
        let mut futures = Vec::new();
        for (k, (world, task)) in tasks.iter().enumerate() {
            for e in 0..c.group_size {
                let generate = GenerateOptions {
                    max_tokens: c.max_tokens,
                    temperature: c.temperature,
                    top_p: c.top_p,
                    top_k: c.top_k,
                    repetition_penalty: c.repetition_penalty,
                    seed: mix(&[c.seed, self.state.step, draw, k as u64, e as u64]),
                    ..GenerateOptions::default()
                };
                let mut config = AgentConfig {
                    mode: c.method.mode(),
                    max_turns: c.max_turns,
                    generate,
                    tool_format: c.tool_format,
                    ..AgentConfig::default()
                };
                if let Some(g) = &c.graph {
                    config.top_k = g.top_k;
                }
                let mut agent = Agent::new(self.backend.clone(), self.worlds[*world].tools.clone(), config);
                if let Some(graph) = &self.graph {
                    agent = agent.with_retriever(graph.retriever());
                }
                let question = task.question.clone();
                futures.push(async move { agent.run(&question).await });
            }
        }
        let mut episodes = self.runtime.block_on(futures_util::future::join_all(futures)).into_iter();
        tasks
            .iter()
            .map(|(world, task)| {
                let episodes: Vec<Trajectory> = episodes.by_ref().take(c.group_size).collect();
                let rewards = episodes.iter().map(|e| self.reward(e, task)).collect();
                Group { world: *world, task: task.clone(), episodes, rewards }
            })
            .collect()
    }

    /// The method's reward of an episode, with DAPO's soft overlong penalty when configured.
    fn reward(&self, episode: &Trajectory, task: &Task) -> EpisodeReward {
        let golden = &task.golden_answers;
        let mut r = match self.config.method {
            Method::Gap => reward::gap(episode, golden),
            Method::Searl => reward::searl(episode, golden, &self.config.rewards),
            Method::Mempo => reward::mempo(episode, golden),
            Method::Mtr => reward::mtr(episode, golden, &self.config.rewards),
        };
        if self.config.overlong_cache > 0 {
            // The longest turn decides: one runaway turn is what the penalty discourages.
            let longest = episode.steps.iter().map(|s| s.response_tokens).max().unwrap_or(0);
            let penalty = overlong_penalty(longest, self.config.max_tokens, self.config.overlong_cache);
            r.total += penalty;
            if let Some(last) = r.steps.last_mut() {
                *last += penalty;
            }
        }
        r
    }

    /// One iteration: rollouts (with dynamic sampling), advantages, updates.
    fn iteration(&mut self) -> Result<IterationMetrics, TrainError> {
        let started = Instant::now();
        let target = self.config.tasks_per_iteration;
        let (mut kept, mut dropped, mut sampled): (Vec<Group>, usize, Vec<Group>) = (Vec::new(), 0, Vec::new());
        let mut rollout_seconds = 0.0;
        let mut drawn = 0;
        for draw in 0..=self.config.max_refills as u64 {
            let tasks = self.draw_tasks(drawn, target - kept.len());
            if tasks.is_empty() {
                break;
            }
            drawn += tasks.len();
            let rollout_started = Instant::now();
            let groups = self.rollouts(draw, &tasks);
            rollout_seconds += rollout_started.elapsed().as_secs_f64();
            for g in groups {
                let totals: Vec<f64> = g.rewards.iter().map(|r| r.total).collect();
                if self.config.dynamic_sampling && !informative(&totals) {
                    dropped += 1;
                    sampled.push(g);
                } else {
                    kept.push(g);
                }
            }
            if !self.config.dynamic_sampling || kept.len() >= target {
                break;
            }
        }
        let examples = self.examples(&kept)?;
        let generated: usize =
            kept.iter().chain(&sampled).flat_map(|g| &g.episodes).map(Trajectory::response_tokens).sum();
        let all: Vec<(&Trajectory, &Task)> =
            kept.iter().chain(&sampled).flat_map(|g| g.episodes.iter().map(move |e| (e, &g.task))).collect();
        let episodes = all.len().max(1) as f64;
        let em = all.iter().filter(|(e, t)| reward::correct(e, &t.golden_answers)).count() as f64 / episodes;
        let rewards: Vec<f64> = kept.iter().flat_map(|g| g.rewards.iter().map(|r| r.total)).collect();
        // Reuse is counted against the graph as the rollouts saw it, before this iteration's
        // admissions.
        let admitted_before: std::collections::HashSet<String> = match &self.graph {
            Some(g) => g.admitted_names()?.into_iter().collect(),
            None => Default::default(),
        };
        let (mut created_calls, mut reused_calls, mut other_calls) = (0, 0, 0);
        for (e, _) in &all {
            for c in e.calls() {
                if c.name == toolsmith_agent::tools::CREATE_TOOL {
                    created_calls += 1;
                } else if admitted_before.contains(&c.name) {
                    reused_calls += 1;
                } else {
                    other_calls += 1;
                }
            }
        }
        let update = match (&self.graph, &self.config.graph) {
            (Some(graph), Some(settings)) => {
                // Task ids repeat across worlds: the graph's admission is per task of a world.
                let groups: Vec<(String, Vec<f64>, &Group)> = kept
                    .iter()
                    .chain(&sampled)
                    .map(|g| {
                        (format!("world-{}/{}", g.world, g.task.id), g.rewards.iter().map(|r| r.total).collect(), g)
                    })
                    .collect();
                let views: Vec<(&str, &[Trajectory], &[f64])> =
                    groups.iter().map(|(k, r, g)| (k.as_str(), g.episodes.as_slice(), r.as_slice())).collect();
                let executors: Vec<&dyn Executor> = self.worlds.iter().map(|w| w.tools.as_ref()).collect();
                graph.learn(self.state.step + 1, &views, settings.admit, &executors)?
            }
            _ => Default::default(),
        };
        let (loss, grad_norm, lr, stats, entropy) = self.update(&examples)?;
        Ok(IterationMetrics {
            iteration: self.state.step + 1,
            reward: rewards.iter().sum::<f64>() / rewards.len().max(1) as f64,
            em,
            groups: kept.len(),
            dropped,
            episodes: all.len(),
            turns: all.iter().map(|(e, _)| e.turns() as f64).sum::<f64>() / episodes,
            response_tokens: generated as f64 / episodes,
            peak_tokens: all.iter().map(|(e, _)| e.peak_tokens() as f64).sum::<f64>() / episodes,
            kl: stats.kl(),
            clip_fraction: stats.clip_fraction(),
            entropy,
            loss,
            grad_norm,
            lr,
            created_calls,
            reused_calls,
            other_calls,
            admitted: update.admitted,
            graph_tools: update.tools,
            rollout_tokens_per_sec: generated as f64 / rollout_seconds.max(1e-9),
            seconds: started.elapsed().as_secs_f64(),
            rollout_seconds,
            elapsed_s: 0.0,
        })
    }

    /// The training examples of the kept groups: sequences with per-token advantages (and
    /// reference log-probs when there is a KL term).
    fn examples(&self, groups: &[Group]) -> Result<Vec<Example>, TrainError> {
        let c = &self.config;
        let mut examples = Vec::new();
        for group in groups {
            let totals: Vec<f64> = group.rewards.iter().map(|r| r.total).collect();
            let episode_adv = group_advantages(&totals, c.group_norm);
            let step_adv = match c.method {
                Method::Searl => {
                    let steps: Vec<Vec<f64>> = group.rewards.iter().map(|r| r.steps.clone()).collect();
                    let anchors: Vec<Vec<Option<String>>> = group.episodes.iter().map(anchors).collect();
                    Some(searl_step_advantages(
                        &steps,
                        &anchors,
                        c.step_credit.gamma,
                        c.group_norm,
                        c.step_credit.single_vanishing,
                    ))
                }
                _ => None,
            };
            let memory_adv = match c.method {
                Method::Mempo => Some(memory_advantages(&self.memory_rewards(group)?, c.group_norm)),
                _ => None,
            };
            for (i, episode) in group.episodes.iter().enumerate() {
                let sequences = match episode_sequences(&self.builder, episode) {
                    Ok(s) => s,
                    Err(e) => {
                        // An episode that cannot be scored (past the context) is left out, not fatal.
                        tracing::warn!(task = %group.task.id, "episode left out of the update: {e}");
                        continue;
                    }
                };
                for sequence in sequences {
                    let mut advantages = vec![0.0; sequence.tokens.ids.len()];
                    for span in &sequence.turns {
                        let step = &episode.steps[span.step];
                        // DAPO's overlong filtering: a turn cut off by the budget teaches nothing.
                        let cut = c.overlong_cache > 0
                            && step.tokens.as_ref().is_some_and(|t| t.finish == FinishReason::Length);
                        let mut a = if cut { 0.0 } else { episode_adv[i] };
                        if let Some(s) = &step_adv {
                            a += c.step_credit.lambda * s[i].get(span.step).copied().unwrap_or(0.0);
                        }
                        advantages[span.range.clone()].fill(a);
                        if let (Some(m), false) = (&memory_adv, cut) {
                            let extra = m[i].get(span.step).copied().unwrap_or(0.0);
                            if let Some(mem) = mem_span(&self.lock(), &sequence.tokens.ids[span.range.clone()])? {
                                for v in &mut advantages[span.range.start + mem.start..span.range.start + mem.end] {
                                    *v += extra;
                                }
                            }
                        }
                        if cut {
                            advantages[span.range.clone()].fill(0.0);
                        }
                    }
                    examples.push(Example { sequence, advantages, reference: None });
                }
            }
        }
        if let Some(reference) = &self.reference {
            let reference = reference.lock().unwrap_or_else(|p| p.into_inner());
            let sequences: Vec<TokenSequence> = examples.iter().map(|e| e.sequence.tokens.clone()).collect();
            for range in micro_batches(&sequences, self.config.micro_batch_tokens) {
                let scores = tch::no_grad(|| reference.score(&sequences[range.clone()], false))?;
                for (row, i) in range.enumerate() {
                    let n = examples[i].sequence.tokens.ids.len() as i64;
                    let row = scores.logprobs.get(row as i64).narrow(0, 0, n).to_kind(Kind::Double);
                    examples[i].reference = Some(Vec::<f64>::try_from(row)?);
                }
            }
        }
        Ok(examples)
    }

    /// MemPO's memory reward of every turn of every episode of a group: how likely the policy
    /// finds the golden answer given the turn's `<mem>` (the geometric mean of the answer's
    /// token probabilities), minus the same given the memory before it (the question alone for
    /// the first): the information the new memory added. A turn without a memory scores 0.
    fn memory_rewards(&self, group: &Group) -> Result<Vec<Vec<f64>>, TrainError> {
        let golden = group.task.golden_answers.first().cloned().unwrap_or_default();
        let system = group.episodes.first().map(|e| e.system.clone()).unwrap_or_default();
        let probe = |mem: Option<&str>| -> Vec<Message> {
            let question = match mem {
                Some(m) => format!("{}\n<mem>{m}</mem>", group.task.question),
                None => group.task.question.clone(),
            };
            vec![
                Message::system(&system),
                Message::user(question),
                Message::assistant(format!("<answer>{golden}</answer>")),
            ]
        };
        // Every distinct context to score, once.
        let mut contexts: Vec<Option<String>> = vec![None];
        let mems: Vec<Vec<Option<String>>> = group
            .episodes
            .iter()
            .map(|e| e.steps.iter().map(|s| toolsmith_agent::trace::parse(&s.text).mem().map(str::to_string)).collect())
            .collect();
        for m in mems.iter().flatten().flatten() {
            if !contexts.iter().any(|c| c.as_deref() == Some(m.as_str())) {
                contexts.push(Some(m.clone()));
            }
        }
        let policy = self.lock();
        let mut sequences = Vec::with_capacity(contexts.len());
        for c in &contexts {
            let encoded = self.builder.encode(&probe(c.as_deref()))?;
            let Some((_, answer)) = encoded.assistant.last().cloned() else {
                return Err(TrainError::Agent("the memory probe has no answer turn".into()));
            };
            let mut mask = vec![false; encoded.ids.len()];
            mask[answer].fill(true);
            sequences.push(TokenSequence { ids: encoded.ids, loss_mask: mask });
        }
        let mut probability = Vec::with_capacity(sequences.len());
        for range in micro_batches(&sequences, self.config.micro_batch_tokens) {
            let scores = tch::no_grad(|| policy.score(&sequences[range.clone()], false))?;
            for (row, i) in range.enumerate() {
                let lp = Vec::<f64>::try_from(scores.logprobs.get(row as i64).to_kind(Kind::Double))?;
                let taken: Vec<f64> =
                    sequences[i].loss_mask.iter().zip(&lp).filter(|(m, _)| **m).map(|(_, l)| *l).collect();
                probability.push(answer_probability(&taken));
            }
        }
        let p = |m: Option<&String>| {
            let at = contexts.iter().position(|c| c.as_ref() == m).unwrap_or(0);
            probability[at]
        };
        Ok(mems
            .iter()
            .map(|episode| {
                let mut before = p(None);
                episode
                    .iter()
                    .map(|m| match m {
                        Some(m) => {
                            let now = p(Some(m));
                            let r = now - before;
                            before = now;
                            r
                        }
                        None => 0.0,
                    })
                    .collect()
            })
            .collect())
    }

    /// `epochs` optimiser steps on the examples: (loss, grad norm, lr, stats, entropy).
    fn update(&mut self, examples: &[Example]) -> Result<(f64, f64, f64, LossStats, f64), TrainError> {
        let sequences: Vec<TokenSequence> = examples.iter().map(|e| e.sequence.tokens.clone()).collect();
        let trained: Vec<usize> =
            sequences.iter().map(|s| s.loss_mask.iter().skip(1).filter(|&&m| m).count()).collect();
        let weights =
            token_weights(&trained, self.config.loss.aggregation, self.config.max_tokens * self.config.max_turns);
        let (mut last_loss, mut grad_norm, mut lr, mut first_stats, mut entropy) =
            (0.0, 0.0, 0.0, LossStats::default(), 0.0);
        if sequences.is_empty() {
            return Ok((0.0, 0.0, self.schedule.lr(self.state.step * self.config.epochs as u64), first_stats, 0.0));
        }
        for epoch in 0..self.config.epochs {
            let step = self.state.step * self.config.epochs as u64 + epoch as u64;
            lr = self.schedule.lr(step);
            let policy = self.policy.lock().unwrap_or_else(|p| p.into_inner());
            self.optimizer.zero_grad();
            let (mut stats, mut entropy_sum) = (LossStats::default(), 0.0);
            let config = self.config.loss;
            let mut failure = None;
            let loss = policy.accumulate_gradients(
                &sequences,
                self.config.micro_batch_tokens,
                epoch == 0,
                |scores, range| {
                    let t = scores.logprobs.size()[1];
                    let device = scores.logprobs.device();
                    let rows =
                        |pick: fn(&Example) -> &[f64]| padded_rows(&examples[range.clone()], t, pick).to_device(device);
                    let old = rows(|e| &e.sequence.behaviour);
                    let adv = rows(|e| &e.advantages);
                    // One weight per sequence, broadcast over its tokens.
                    let w = Tensor::from_slice(&weights[range.clone()])
                        .to_kind(Kind::Float)
                        .view([-1, 1])
                        .to_device(device);
                    let reference = examples[range.start]
                        .reference
                        .is_some()
                        .then(|| rows(|e| e.reference.as_deref().unwrap_or_default()));
                    let inputs = LossInputs {
                        mask: &scores.mask,
                        old_logprobs: &old,
                        ref_logprobs: reference.as_ref(),
                        advantages: &adv,
                        weights: &w,
                    };
                    let (loss, s) = policy_loss(&scores.logprobs, &inputs, &config);
                    stats.add(&s);
                    if let Some(e) = &scores.entropy {
                        entropy_sum += (e.detach() * &scores.mask).sum(Kind::Float).double_value(&[]);
                    }
                    if !s.policy.is_finite() && failure.is_none() {
                        failure = Some(s.policy);
                    }
                    loss
                },
            )?;
            drop(policy);
            if let Some(value) = failure.filter(|v| !v.is_finite()).or((!loss.is_finite()).then_some(loss)) {
                self.optimizer.zero_grad();
                return Err(TrainError::NonFinite { step: step + 1, what: "loss", value });
            }
            grad_norm = self.optimizer.clip_grad_norm(self.config.max_grad_norm);
            if !grad_norm.is_finite() {
                self.optimizer.zero_grad();
                return Err(TrainError::NonFinite { step: step + 1, what: "gradient norm", value: grad_norm });
            }
            self.optimizer.step(lr);
            last_loss = loss;
            if epoch == 0 {
                first_stats = stats;
                entropy = entropy_sum / stats.tokens.max(1.0);
            }
        }
        let updates = self.optimizer.steps();
        self.lock().state_mut().step = updates;
        Ok((last_loss, grad_norm, lr, first_stats, entropy))
    }

    /// Gives the external engine the current weights (when configured to): saved to
    /// `RUN/engine-weights`, then loaded by the engine before the next rollouts.
    fn push_weights(&self) -> Result<(), TrainError> {
        let (Some(engine), Some(settings)) = (&self.engine, &self.config.engine) else { return Ok(()) };
        if !settings.push_weights {
            return Ok(());
        }
        let dir = self.run.root().join("engine-weights");
        let partial = self.run.root().join(".engine-weights.partial");
        if partial.exists() {
            std::fs::remove_dir_all(&partial).map_err(|e| TrainError::io(&partial, e))?;
        }
        self.lock().save(&partial)?;
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

    fn evaluate(&mut self, on_event: &mut dyn FnMut(RlEvent<'_>)) -> Result<(), TrainError> {
        let Some(heldout) = &self.heldout else { return Ok(()) };
        on_event(RlEvent::EvalStarted { iteration: self.state.step });
        let figures = heldout.evaluate(&self.policy, self.state.step);
        self.metrics.write(&Record::Eval(figures.clone()))?;
        on_event(RlEvent::Eval(&figures));
        Ok(())
    }

    fn checkpoint(&mut self, on_event: &mut dyn FnMut(RlEvent<'_>)) -> Result<PathBuf, TrainError> {
        let dir = {
            let policy = self.lock();
            let graph = self.graph.as_ref();
            self.run.save_with(&policy, &self.optimizer, &self.state, self.config.keep_checkpoints, |dir| {
                graph.map_or(Ok(()), |g| g.snapshot(dir))
            })?
        };
        on_event(RlEvent::Checkpoint { iteration: self.state.step, dir: &dir });
        Ok(dir)
    }
}

/// The interfaces of `real`'s tools, answered by `actor` (MTR). Tool creation is left out: its
/// result is code that ran, which a simulation cannot stand in for.
fn simulated(real: &dyn Executor, actor: ToolActor) -> Result<Arc<dyn Executor>, TrainError> {
    let tools = LocalTools::new().with_simulator(Arc::new(actor));
    for mut manifest in real.manifests() {
        if manifest.name.as_str() == toolsmith_agent::tools::CREATE_TOOL {
            continue;
        }
        manifest.kind = ToolKind::Simulated;
        tools
            .add_simulated(manifest)
            .map_err(|e| TrainError::Agent(format!("cannot simulate `{}`: {}", e.tool, e.message)))?;
    }
    Ok(Arc::new(tools))
}

/// A `[examples, t]` tensor of each example's `pick`ed values, zero-padded (or cut) to `t`.
fn padded_rows(examples: &[Example], t: i64, pick: fn(&Example) -> &[f64]) -> Tensor {
    let t_len = t as usize;
    let mut flat = vec![0_f32; examples.len() * t_len];
    for (row, e) in flat.chunks_mut(t_len).zip(examples) {
        for (slot, &v) in row.iter_mut().zip(pick(e)) {
            *slot = v as f32;
        }
    }
    Tensor::from_slice(&flat).view([-1, t])
}

/// SEARL's anchor of each turn: the tool it invoked that is not the host's search (a created
/// tool by its name, or a registered tool); the first such call of the turn.
fn anchors(episode: &Trajectory) -> Vec<Option<String>> {
    episode
        .steps
        .iter()
        .map(|s| {
            s.calls.iter().find(|c| c.name != "search").map(|c| match &c.created {
                Some(tool) => tool.manifest.name.as_str().to_string(),
                None => c.name.clone(),
            })
        })
        .collect()
}

/// The token range of the `<mem>...</mem>` block in a turn's ids, tags included.
fn mem_span(policy: &Policy, ids: &[i64]) -> Result<Option<std::ops::Range<usize>>, TrainError> {
    let tokenizer = policy.tokenizer();
    let (open, close) = (format!("<{}>", Tag::Mem.name()), format!("</{}>", Tag::Mem.name()));
    let text = tokenizer.decode(ids)?;
    let (Some(start), Some(end)) = (text.find(&open), text.find(&close)) else { return Ok(None) };
    let end = end + close.len();
    // The first token whose prefix reaches past `start`, and the first whose prefix covers `end`.
    let (mut first, mut last) = (None, ids.len());
    for k in 1..=ids.len() {
        let len = tokenizer.decode(&ids[..k])?.len();
        if first.is_none() && len > start {
            first = Some(k - 1);
        }
        if len >= end {
            last = k;
            break;
        }
    }
    Ok(first.map(|f| f..last))
}
