//! The RL run's setup: the starting policy and its frozen reference, the training worlds and
//! their tools (simulated for MTR), the rollout backend (in process or an engine) and the tool
//! graph; each iteration is `iteration`'s. The loop, checkpoints, resume and evaluation
//! are the trainer core's ([`crate::run`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use toolsmith_agent::backend::{Backend, BatchConfig, BatchedBackend, CompletionsBackend};
use toolsmith_agent::env::Task;
use toolsmith_agent::simulate::ToolActor;
use toolsmith_agent::tools::Executor;
use toolsmith_policy::{Policy, SamplingParams};

use crate::TrainError;
use crate::checkpoint::RunDir;
use crate::heldout::{HeldOut, ToolsFor, budget_fit};
use crate::optim::Schedule;
use crate::rl::config::RlConfig;
use crate::rl::iteration::{Reference, RlUnit};
use crate::rl::rollout::{mix, pool_hash};
use crate::rl::sampler::{Sampler, TrainWorld, training_worlds};
use crate::rl::training_graph::{REGISTRY_FILE, TrainingGraph};
use crate::run::{Core, Event, Opened, Resume, Setup, open, trainable};
use crate::sequence::SequenceBuilder;

/// An RL run.
#[derive(Debug)]
pub struct RlTrainer {
    core: Core,
    unit: RlUnit,
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
        let initial = config.run.init.load(config.run.seed, options, None)?;
        // The KL anchor is the starting policy, frozen, whatever iteration a run resumes at (with
        // LoRA, the base under the adapters). MTR's ToolActor is the starting policy too (what
        // the tools say does not drift with the policy being trained): one frozen copy serves
        // both.
        let kl = config.loss.kl_coef > 0.0;
        let lora = config.run.lora.is_some();
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
                    seed: mix(&[config.run.seed, 0x5157]),
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
        let worlds = training_worlds(&config, actor.as_ref(), tools_for)?;
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
        let heldout = config.eval.clone().map(|e| HeldOut::new(e, config.run.tool_format, tools_for)).transpose()?;
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
            seed: config.run.seed,
            data: (pool_hash(&worlds), "the training worlds"),
            units: config.iterations,
            schedule: Schedule {
                peak: config.lr,
                warmup: (config.warmup_ratio * updates as f64).round() as u64,
                total: updates,
                min_ratio: config.min_lr_ratio,
            },
            optimizer: config.optimizer,
            eval_every: config.run.eval_every,
            checkpoint_every: config.checkpoint_every,
            keep_checkpoints: config.run.keep_checkpoints,
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
        let sampler = Sampler::new(config, worlds, graph, backend);
        let unit = RlUnit { sampler, builder, reference, engine, runtime, run };
        Ok(RlTrainer { core, unit })
    }

    /// The tools rollouts in training world `index` call (simulated ones for MTR).
    pub fn training_tools(&self, index: usize) -> Option<Arc<dyn Executor>> {
        self.unit.sampler.worlds().get(index).map(|w| w.tools.clone())
    }

    /// Trains to the last iteration; returns the directory of the final policy.
    pub fn run(&mut self, on_event: &mut dyn FnMut(Event<'_>)) -> Result<PathBuf, TrainError> {
        self.core.run(&mut self.unit, on_event)
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
