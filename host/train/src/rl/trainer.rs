//! The RL run: each iteration draws tasks from the training worlds, samples a group of episodes
//! per task ([`super::rollout`]), lets the method score them and assign credit
//! ([`super::method`]), turns the groups into token-exact examples and updates the policy with
//! the clipped surrogate ([`super::update`]). The loop, checkpoints, resume and evaluation are the
//! trainer core's ([`crate::run`]); this file is the orchestration.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use toolsmith_agent::Trajectory;
use toolsmith_agent::backend::{Backend, BatchConfig, BatchedBackend, CompletionsBackend};
use toolsmith_agent::env::{Corpus, Task, World};
use toolsmith_agent::simulate::ToolActor;
use toolsmith_agent::tools::{CREATE_TOOL, Executor};
use toolsmith_policy::{Policy, SamplingParams};

use crate::TrainError;
use crate::checkpoint::RunDir;
use crate::heldout::{HeldOut, ToolsFor, budget_fit};
use crate::metrics::{IterationMetrics, Record};
use crate::optim::Schedule;
use crate::rl::config::RlConfig;
use crate::rl::graph::{GraphUpdate, REGISTRY_FILE, TrainingGraph};
use crate::rl::method::{CreditContext, GroupView};
use crate::rl::reward::{EpisodeReward, correct};
use crate::rl::rollout::{Group, TrainWorld, mix, pool_hash, simulated};
use crate::rl::update::{cut_off, longest_first};
use crate::run::{Core, Event, Opened, Resume, Setup, Unit, open, trainable};
use crate::sequence::SequenceBuilder;

/// An RL run.
#[derive(Debug)]
pub struct RlTrainer {
    core: Core,
    unit: RlUnit,
}

/// The policy a KL penalty anchors to.
pub(super) enum Reference {
    /// A frozen copy of the starting weights.
    Copy(Arc<Mutex<Policy>>),
    /// The trained policy with its LoRA adapters turned off: the base, with no second copy.
    Base,
}

/// What an iteration needs besides the core.
pub(super) struct RlUnit {
    pub(super) config: RlConfig,
    pub(super) builder: SequenceBuilder,
    pub(super) worlds: Vec<TrainWorld>,
    pub(super) graph: Option<TrainingGraph>,
    pub(super) reference: Option<Reference>,
    pub(super) backend: Arc<dyn Backend>,
    pub(super) engine: Option<CompletionsBackend>,
    pub(super) runtime: tokio::runtime::Runtime,
    pub(super) run: RunDir,
}

impl std::fmt::Debug for RlUnit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RlUnit").field("method", &self.config.method).finish_non_exhaustive()
    }
}

/// The core's accessors (`policy`, `cancel_flag`, `state`, `schedule`) are the trainer's.
impl std::ops::Deref for RlTrainer {
    type Target = Core;

    fn deref(&self) -> &Core {
        &self.core
    }
}

impl RlTrainer {
    /// Prepares a run in `out` (resuming its newest checkpoint when `resume` says so).
    pub fn prepare(
        config: RlConfig,
        out: &Path,
        resume: impl Into<Resume>,
        tools_for: &ToolsFor<'_>,
    ) -> Result<Self, TrainError> {
        let resume = resume.into();
        config.validate()?;
        let Opened { run, options, restored } = open(out, resume, &config)?;
        let initial = if config.init == "tiny" {
            Policy::tiny(config.seed, options)?
        } else {
            Policy::load(&toolsmith_policy::locate(&config.init)?, options)?
        };
        // The KL anchor is the starting policy, frozen, whatever iteration a run resumes at (with
        // LoRA, the base under the adapters). MTR's ToolActor is the starting policy too (what
        // the tools say does not drift with the policy being trained): one frozen copy serves
        // both.
        let kl = config.loss.kl_coef > 0.0;
        let lora = config.lora.is_some();
        let frozen = if (kl && !lora) || config.simulate.is_some() {
            Some(Arc::new(Mutex::new(initial.reference()?)))
        } else {
            None
        };
        let reference = match (&frozen, kl, lora) {
            (_, false, _) => None,
            (_, true, true) => Some(Reference::Base),
            (Some(frozen), true, false) => Some(Reference::Copy(frozen.clone())),
            (None, true, false) => None,
        };
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
        let (policy, resumed) = match restored {
            Some(r) => (r.policy, Some((r.state, r.dir))),
            None => (initial, None),
        };
        let policy = trainable(policy, &config)?;
        let run = RunDir::create(run.root())?;
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
                let mut tasks = world.tasks_counted(&config.worlds.family_tasks);
                tasks.retain(|t| config.families.is_empty() || config.families.contains(&t.family));
                Ok(TrainWorld { tasks, tools })
            })
            .collect::<Result<_, TrainError>>()?;
        warn_if_cut(&worlds, &config, &policy);
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
        let engine = match &config.engine {
            Some(e) => {
                let key = e.api_key_env.as_ref().and_then(|v| std::env::var(v).ok()).filter(|k| !k.is_empty());
                Some(
                    CompletionsBackend::new(&e.url, &e.model, key, policy.tokenizer().clone())
                        .map_err(|err| TrainError::Agent(format!("engine {}: {err}", e.url)))?
                        .with_context(policy.context_len()),
                )
            }
            None => None,
        };
        let updates = config.iterations * (config.epochs * config.mini_batches) as u64;
        let setup = Setup {
            config: &config,
            seed: config.seed,
            data: (pool_hash(&worlds), "the training worlds"),
            units: config.iterations,
            schedule: Schedule {
                peak: config.lr,
                warmup: (config.warmup_ratio * updates as f64).round() as u64,
                total: updates,
                min_ratio: config.min_lr_ratio,
            },
            optimizer: config.optimizer,
            eval_every: config.eval_every,
            checkpoint_every: config.checkpoint_every,
            keep_checkpoints: config.keep_checkpoints,
            heldout,
            resume,
        };
        let core = Core::new(run.clone(), policy, resumed, setup)?;
        let backend: Arc<dyn Backend> = match &engine {
            Some(engine) => Arc::new(engine.clone()),
            None => {
                let batching = rollout_batching(&config, &toolsmith_contract::sync::lock(&core.policy()));
                Arc::new(BatchedBackend::new(core.policy(), "training", batching))
            }
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| TrainError::Agent(format!("cannot start tokio: {e}")))?;
        let unit = RlUnit { config, builder, worlds, graph, reference, backend, engine, runtime, run };
        Ok(RlTrainer { core, unit })
    }

    /// The tools rollouts in training world `index` call (simulated ones for MTR).
    pub fn training_tools(&self, index: usize) -> Option<Arc<dyn Executor>> {
        self.unit.worlds.get(index).map(|w| w.tools.clone())
    }

    /// Trains to the last iteration; returns the directory of the final policy.
    pub fn run(&mut self, on_event: &mut dyn FnMut(Event<'_>)) -> Result<PathBuf, TrainError> {
        self.core.run(&mut self.unit, on_event)
    }
}

impl Unit for RlUnit {
    /// One iteration: rollouts (with dynamic sampling), credit, the tool graph's update, the
    /// policy's update.
    fn unit(&mut self, core: &mut Core) -> Result<Record, TrainError> {
        let started = Instant::now();
        let iteration = core.state().step;
        let sampled = self.sample(iteration)?;
        // The rollouts' keys and values are stale once the weights move: freed now, the update
        // reuses their memory instead of adding to it (issue: RL's peak RSS).
        self.backend.release_memory();
        let policy = core.policy();
        // SEARL merges the iteration's created tools before forming step groups, so that two
        // rollouts' near-duplicate tools anchor one group (the graph admits them after credit).
        let merged = match &self.graph {
            Some(graph) => graph.merged_names(sampled.kept.iter().flat_map(|g| &g.episodes))?,
            None => HashMap::new(),
        };
        let context = CreditContext { config: &self.config, policy: &policy, builder: &self.builder, merged: &merged };
        let mut examples = Vec::new();
        let mut first_episode = 0;
        for group in &sampled.kept {
            let credit = self.config.method.spec().assign.credit(&group.view(), &context)?;
            examples.extend(self.examples(group, &credit, first_episode)?);
            first_episode += group.episodes.len();
        }
        longest_first(&mut examples);
        let gap = self.old_logprobs(&mut examples, &policy)?;
        self.reference_logprobs(&mut examples, &policy)?;
        let all: Vec<&Group> = sampled.kept.iter().chain(&sampled.dropped).collect();
        let calls = self.count_calls(&all)?;
        let graph = self.learn_tools(iteration, &all)?;
        let update = {
            // Every micro-batch allocates and frees the same large tensors: reused from the heap,
            // not zero-filled afresh. Only here, so that decoding keeps glibc's defaults.
            let _heap = toolsmith_policy::memory::HeapReuse::start();
            self.update(core, &examples)?
        };
        // And the update's activations, before the next rollouts.
        toolsmith_policy::memory::release_free_memory();
        let episodes: Vec<(&Trajectory, &Group)> =
            all.iter().flat_map(|&g| g.episodes.iter().map(move |e| (e, g))).collect();
        let n = episodes.len().max(1) as f64;
        let rewards: Vec<f64> = sampled.kept.iter().flat_map(|g| g.rewards.iter().map(|r| r.total)).collect();
        let generated: usize = episodes.iter().map(|(e, _)| e.response_tokens()).sum();
        let sampled_turns: usize = episodes.iter().map(|(e, _)| e.turns()).sum();
        let cut_turns = episodes.iter().flat_map(|(e, _)| &e.steps).filter(|s| cut_off(s)).count();
        Ok(Record::Iteration(IterationMetrics {
            iteration: iteration + 1,
            reward: rewards.iter().sum::<f64>() / rewards.len().max(1) as f64,
            em: episodes.iter().filter(|(e, g)| correct(e, &g.task.golden_answers)).count() as f64 / n,
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
            engine_logprob_gap: gap,
            seconds: started.elapsed().as_secs_f64(),
            rollout_seconds: sampled.seconds,
            elapsed_s: 0.0,
        }))
    }

    fn extra(&self, dir: &Path) -> Result<(), TrainError> {
        self.graph.as_ref().map_or(Ok(()), |g| g.snapshot(dir))
    }

    fn sync(&mut self, core: &Core) -> Result<(), TrainError> {
        self.push_weights(&core.policy())
    }
}

/// Warns when the turn budget cuts the oracle's own trace of some training tasks in the
/// method's mode: those episodes fail on format whatever the policy knows, so their groups teach
/// only brevity (a parallel plan of 3-4 lookups takes 180-260 SmolLM2 tokens).
fn warn_if_cut(worlds: &[TrainWorld], config: &RlConfig, policy: &Policy) {
    let tasks: Vec<Task> = worlds.iter().flat_map(|w| w.tasks.iter().cloned()).collect();
    if let Some((fits, longest)) = budget_fit(&tasks, config.method.mode(), policy.tokenizer(), config.max_tokens)
        && fits < 1.0
    {
        tracing::warn!(
            "the oracle's trace of {:.0}% of the training tasks needs a turn longer than max_tokens ({}; the \
             longest needs {longest})",
            100.0 * (1.0 - fits),
            config.max_tokens
        );
    }
}

/// How the rollouts' batching backend batches: every episode of an iteration's groups keeps its
/// keys and values between turns (so a turn prefills only its observation), and a turn's requests
/// wait for one another long enough to cover the tool calls between turns, so that one decoding
/// pass serves them all instead of the stragglers forming a second, small batch.
fn rollout_batching(config: &RlConfig, policy: &Policy) -> BatchConfig {
    // Dynamic sampling's first draw, the largest.
    let episodes = (config.tasks_per_iteration + config.oversample) * config.group_size;
    BatchConfig::for_episodes(episodes, config.max_turns, config.max_tokens, policy)
}

/// Calls of an iteration's episodes, by kind.
struct CallCounts {
    created: usize,
    reused: usize,
    other: usize,
}

impl RlUnit {
    /// Counts the calls of `groups`: creations, reuses of tools the graph had admitted before
    /// this iteration (as the rollouts saw it) and every other call.
    fn count_calls(&self, groups: &[&Group]) -> Result<CallCounts, TrainError> {
        let admitted: HashSet<String> = match &self.graph {
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

    /// SEARL's tool graph learns from every sampled group (dropped ones included: a tool that
    /// worked is worth keeping whatever its group's spread).
    fn learn_tools(&self, iteration: u64, groups: &[&Group]) -> Result<GraphUpdate, TrainError> {
        let (Some(graph), Some(settings)) = (&self.graph, &self.config.graph) else {
            return Ok(GraphUpdate::default());
        };
        // Task ids repeat across worlds: the graph's admission is per task of a world.
        let keyed: Vec<(String, &Group)> =
            groups.iter().map(|g| (format!("world-{}/{}", g.world, g.task.id), *g)).collect();
        let views: Vec<(&str, &[Trajectory], &[EpisodeReward])> =
            keyed.iter().map(|(k, g)| (k.as_str(), g.episodes.as_slice(), g.rewards.as_slice())).collect();
        let executors: Vec<&dyn Executor> = self.worlds.iter().map(|w| w.tools.as_ref()).collect();
        graph.learn(iteration + 1, &views, settings.admit, &executors)
    }
}

impl Group {
    /// The group as a method sees it.
    pub(super) fn view(&self) -> GroupView<'_> {
        GroupView { task: &self.task, episodes: &self.episodes, rewards: &self.rewards }
    }
}
