//! The seam between the trainer and the environments it is served as: sampling groups,
//! rewarding episodes and crediting their tokens, with no policy update.
//!
//! `train rl` runs a [`Sampler`] and then updates its policy on what [`Sampler::credited`]
//! returns; `toolsmith env serve` (OpenEnv) builds the same agents one session at a time
//! ([`Sampler::agent`]) and rewards each finished episode with [`Sampler::reward`];
//! `toolsmith env atropos` samples whole groups on an engine ([`Sampler::sample`]) and posts
//! what [`Sampler::credited`] returns. Each method's reward and credit come from the one table
//! ([`super::method::METHODS`]), so a method added there is served by all three.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use toolsmith_agent::backend::{Backend, GenerateOptions};
use toolsmith_agent::env::{Corpus, Task, World};
use toolsmith_agent::simulate::ToolActor;
use toolsmith_agent::tools::Executor;
use toolsmith_agent::{Agent, AgentConfig, Trajectory};
use toolsmith_policy::Policy;

use crate::TrainError;
use crate::heldout::ToolsFor;
use crate::rl::advantage::{keeps_group, overlong_penalty};
use crate::rl::config::RlConfig;
use crate::rl::episode::{EpisodeSequence, episode_sequences, mem_span};
use crate::rl::method::{CreditContext, GroupView, TurnCredit, token_advantages};
use crate::rl::reward::EpisodeReward;
use crate::rl::training_graph::{GraphUpdate, TrainingGraph};
use crate::rl::update::cut;
use crate::sequence::SequenceBuilder;

/// A training world: its tasks and the tools its episodes call.
pub struct TrainWorld {
    /// The tasks, in the order the world lists them.
    pub tasks: Vec<Task>,
    /// Their tools (simulated ones for MTR).
    pub tools: Arc<dyn Executor>,
    /// Whether the tasks are tool-call tasks (`train tools`): each lists its own tools and its
    /// episodes are [`crate::toolcall::episode`]'s, not the agent's.
    pub calls: bool,
}

impl std::fmt::Debug for TrainWorld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrainWorld").field("tasks", &self.tasks.len()).finish_non_exhaustive()
    }
}

/// The training worlds of `config` (its generated world seeds), each with the tools
/// `tools_for` gives its corpus, answered by `actor` when the method simulates tools (MTR).
pub fn training_worlds(
    config: &RlConfig,
    actor: Option<&ToolActor>,
    tools_for: &ToolsFor<'_>,
) -> Result<Vec<TrainWorld>, TrainError> {
    if let Some(path) = &config.call_tasks {
        let tasks: Vec<Task> = crate::toolcall::read_tasks(path)?.iter().map(|t| t.to_task()).collect();
        if tasks.is_empty() {
            return Err(TrainError::Config(format!("{}: no tool-call tasks", path.display())));
        }
        let tools: Arc<dyn Executor> = Arc::new(toolsmith_agent::tools::LocalTools::new());
        return Ok(vec![TrainWorld { tasks, tools, calls: true }]);
    }
    config
        .worlds
        .seeds
        .iter()
        .map(|&seed| {
            let world = World::generate(config.worlds.world(seed));
            let corpus = Arc::new(Corpus::new(&world.documents()).map_err(|e| TrainError::Agent(e.to_string()))?);
            let tools = match actor {
                Some(actor) => super::rollout::simulated(tools_for(corpus).as_ref(), actor.clone())?,
                None => tools_for(corpus),
            };
            let mut tasks = world.tasks_counted(&config.worlds.family_tasks);
            tasks.retain(|t| config.families.is_empty() || config.families.contains(&t.family));
            Ok(TrainWorld { tasks, tools, calls: false })
        })
        .collect()
}

/// A group: one task's episodes and their rewards.
#[derive(Debug, Clone)]
pub struct Group {
    /// The training world the task is from (task ids repeat across worlds).
    pub world: usize,
    /// The task.
    pub task: Task,
    /// Its episodes.
    pub episodes: Vec<Trajectory>,
    /// Their rewards under the method, in the same order.
    pub rewards: Vec<EpisodeReward>,
}

impl Group {
    /// The group as a method sees it.
    pub fn view(&self) -> GroupView<'_> {
        GroupView { task: &self.task, episodes: &self.episodes, rewards: &self.rewards }
    }

    /// The key the tool graph's admission groups candidates by (task ids repeat across worlds).
    pub fn key(&self) -> String {
        format!("world-{}/{}", self.world, self.task.id)
    }
}

/// An iteration's groups: those trained on, those dynamic sampling dropped, and the seconds the
/// rollouts took.
#[derive(Debug, Default)]
pub struct Sampled {
    /// Informative groups (all of them without dynamic sampling).
    pub kept: Vec<Group>,
    /// Groups dynamic sampling dropped (all right or all wrong, or surplus).
    pub dropped: Vec<Group>,
    /// Wall-clock seconds of the rollouts.
    pub seconds: f64,
}

/// One sequence of an episode with the advantage of each of its tokens: what a trainer's loss
/// takes, whichever process computes it.
#[derive(Debug, Clone)]
pub struct CreditedSequence {
    /// The episode's number in the batch (an episode may be several sequences: MemPO's turns).
    pub episode: usize,
    /// The group's number in the batch.
    pub group: usize,
    /// The tokens, the loss mask over exactly the sampled ones, and their behaviour log-probs.
    pub sequence: EpisodeSequence,
    /// The advantage of each token (0 outside the loss mask).
    pub advantages: Vec<f64>,
    /// The episode's reward under the method.
    pub reward: f64,
}

/// Samples groups of episodes and scores them with a method: everything of an RL iteration but
/// the update.
pub struct Sampler {
    config: RlConfig,
    worlds: Vec<TrainWorld>,
    graph: Option<TrainingGraph>,
    backend: Arc<dyn Backend>,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler").field("method", &self.config.method).field("worlds", &self.worlds).finish()
    }
}

/// A seed from a few numbers; the same mix every sampler and trainer uses.
pub fn seed_of(parts: &[u64]) -> u64 {
    super::rollout::mix(parts)
}

impl Sampler {
    /// A sampler of `config`'s method over `worlds`, whose episodes `backend` writes; with a tool
    /// graph, listings are retrieved from it and SEARL's admitted tools join it.
    pub fn new(
        config: RlConfig,
        worlds: Vec<TrainWorld>,
        graph: Option<TrainingGraph>,
        backend: Arc<dyn Backend>,
    ) -> Sampler {
        Sampler { config, worlds, graph, backend }
    }

    /// The settings.
    pub fn config(&self) -> &RlConfig {
        &self.config
    }

    /// The worlds.
    pub fn worlds(&self) -> &[TrainWorld] {
        &self.worlds
    }

    /// The tool graph, when the run has one.
    pub fn graph(&self) -> Option<&TrainingGraph> {
        self.graph.as_ref()
    }

    /// The backend rollouts sample from.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The agent of one episode in `world`, sampling with `seed` from `backend`: the method's
    /// mode, the run's budgets and tool format, and retrieval from the graph when there is one.
    pub fn agent(&self, world: usize, seed: u64, backend: Arc<dyn Backend>) -> Agent {
        let c = &self.config;
        let generate = self.generate_options(seed);
        let mut config = AgentConfig {
            mode: c.method.mode(),
            max_turns: c.max_turns,
            generate,
            tool_format: c.run.tool_format,
            ..AgentConfig::default()
        };
        if let Some(g) = &c.graph {
            config.top_k = g.top_k;
        }
        let tools = self.worlds.get(world).map_or_else(|| self.worlds[0].tools.clone(), |w| w.tools.clone());
        let mut agent = Agent::new(backend, tools, config);
        if let Some(graph) = &self.graph {
            agent = agent.with_retriever(graph.retriever());
        }
        agent
    }

    /// The run's sampling settings with `seed`.
    fn generate_options(&self, seed: u64) -> GenerateOptions {
        let c = &self.config;
        GenerateOptions {
            max_tokens: c.max_tokens,
            temperature: c.temperature,
            top_p: c.top_p,
            top_k: c.top_k,
            repetition_penalty: c.repetition_penalty,
            seed,
            ..GenerateOptions::default()
        }
    }

    /// The iteration's groups. With dynamic sampling, a group whose episodes are all right or
    /// all wrong (equal outcomes: the method's accuracy, before any shaping) is dropped and
    /// more tasks are drawn, up to `max_refills` times.
    ///
    /// With `oversample`, the first draw takes that many more tasks, and groups beyond
    /// `tasks_per_iteration` that would be kept count as dropped.
    pub async fn sample(&self, iteration: u64) -> Sampled {
        let target = self.config.tasks_per_iteration;
        let dynamic = self.config.dynamic_sampling;
        let mut sampled = Sampled::default();
        let mut drawn = 0;
        for draw in 0..=self.config.max_refills as u64 {
            // `validate` allows oversampling only with dynamic sampling.
            let extra = if draw == 0 { self.config.oversample } else { 0 };
            let tasks = self.draw_tasks(iteration, drawn, target - sampled.kept.len() + extra);
            if tasks.is_empty() {
                break;
            }
            drawn += tasks.len();
            let started = Instant::now();
            let groups = self.rollouts(iteration, draw, &tasks).await;
            sampled.seconds += started.elapsed().as_secs_f64();
            if dynamic {
                let room = target - sampled.kept.len();
                let (kept, dropped) = super::rollout::select_groups(groups, room, |g| keeps_group(&g.rewards));
                sampled.kept.extend(kept);
                sampled.dropped.extend(dropped);
            } else {
                sampled.kept.extend(groups);
            }
            if !dynamic || sampled.kept.len() >= target {
                break;
            }
        }
        sampled
    }

    /// Tasks `from..from + count` of the current iteration's order of every training task,
    /// seeded by (seed, iteration) so a resumed run draws the same, and a refill of dynamic
    /// sampling draws tasks not drawn before in the iteration.
    pub fn draw_tasks(&self, iteration: u64, from: usize, count: usize) -> Vec<(usize, Task)> {
        let mut rng = StdRng::seed_from_u64(seed_of(&[self.config.run.seed, iteration]));
        let mut all: Vec<(usize, usize)> =
            self.worlds.iter().enumerate().flat_map(|(w, world)| (0..world.tasks.len()).map(move |t| (w, t))).collect();
        all.shuffle(&mut rng);
        all.into_iter().skip(from).take(count).map(|(w, t)| (w, self.worlds[w].tasks[t].clone())).collect()
    }

    /// Samples a group of episodes for each task, all at once.
    pub async fn rollouts(&self, iteration: u64, draw: u64, tasks: &[(usize, Task)]) -> Vec<Group> {
        let c = &self.config;
        let mut futures = Vec::new();
        for (k, (world, task)) in tasks.iter().enumerate() {
            // A tool-call task's ground truth, read once for its whole group.
            let call_task = self
                .worlds
                .get(*world)
                .is_some_and(|w| w.calls)
                .then(|| Arc::new(crate::toolcall::CallTask::from_golden(&task.golden_answers)));
            for e in 0..c.group_size {
                let seed = seed_of(&[c.run.seed, iteration, draw, k as u64, e as u64]);
                if let Some(call_task) = call_task.clone() {
                    let backend = self.backend.clone();
                    let options = self.generate_options(seed);
                    let question = task.question.clone();
                    futures.push(Box::pin(async move {
                        match call_task.as_ref() {
                            Some(t) => crate::toolcall::episode::run(backend.as_ref(), t, &options).await,
                            None => crate::toolcall::episode::failed(&question, "the task is not a tool-call task"),
                        }
                    })
                        as std::pin::Pin<Box<dyn std::future::Future<Output = Trajectory> + Send + '_>>);
                    continue;
                }
                let agent = self.agent(*world, seed, self.backend.clone());
                let question = task.question.clone();
                futures.push(Box::pin(async move { agent.run(&question).await }));
            }
        }
        let mut episodes = futures_util::future::join_all(futures).await.into_iter();
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
    pub fn reward(&self, episode: &Trajectory, task: &Task) -> EpisodeReward {
        let c = &self.config;
        let mut r = c.method.spec().assign.reward(episode, &task.golden_answers, c);
        if c.overlong_cache > 0 {
            // The longest turn decides: one runaway turn is what the penalty discourages.
            let longest = episode.steps.iter().map(|s| s.response_tokens).max().unwrap_or(0);
            let penalty = overlong_penalty(longest, c.max_tokens, c.overlong_cache);
            r.total += penalty;
            if let Some(last) = r.steps.last_mut() {
                *last += penalty;
            }
        }
        r
    }

    /// Every kept group's sequences, each token weighted by the method's credit, in the order of
    /// the groups and their episodes. `policy` is the one the groups were sampled with (MemPO
    /// scores memories with it); `builder` turns conversations into its tokens.
    pub fn credited(
        &self,
        groups: &[Group],
        policy: &Mutex<Policy>,
        builder: &SequenceBuilder,
    ) -> Result<Vec<CreditedSequence>, TrainError> {
        // SEARL merges the iteration's created tools before forming step groups, so that two
        // rollouts' near-duplicate tools anchor one group (the graph admits them after credit).
        let merged = match &self.graph {
            Some(graph) => graph.merged_names(groups.iter().flat_map(|g| &g.episodes))?,
            None => HashMap::new(),
        };
        let context = CreditContext { config: &self.config, policy, builder, merged: &merged };
        let mut out = Vec::new();
        let mut first_episode = 0;
        for (number, group) in groups.iter().enumerate() {
            let credit = self.config.method.spec().assign.credit(&group.view(), &context)?;
            out.extend(self.group_sequences(builder, group, number, &credit, first_episode)?);
            first_episode += group.episodes.len();
        }
        Ok(out)
    }

    /// The sequences of one group from its turns' credit (`credit[episode][turn]`); its episodes
    /// are numbered from `first_episode` on.
    fn group_sequences(
        &self,
        builder: &SequenceBuilder,
        group: &Group,
        number: usize,
        credit: &[Vec<TurnCredit>],
        first_episode: usize,
    ) -> Result<Vec<CreditedSequence>, TrainError> {
        let tokenizer = builder.tokenizer();
        let mut out = Vec::new();
        for (index, ((episode, credit), reward)) in group.episodes.iter().zip(credit).zip(&group.rewards).enumerate() {
            let sequences = match episode_sequences(builder, episode) {
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
                out.push(CreditedSequence {
                    episode: first_episode + index,
                    group: number,
                    sequence,
                    advantages,
                    reward: reward.total,
                });
            }
        }
        Ok(out)
    }

    /// SEARL's tool graph learns from sampled groups (dropped ones included: a tool that worked
    /// is worth keeping whatever its group's spread): the best-reward candidates of each group,
    /// admitted as `iteration + 1`'s tools.
    pub fn learn_tools(&self, iteration: u64, groups: &[&Group]) -> Result<GraphUpdate, TrainError> {
        let (Some(graph), Some(settings)) = (&self.graph, &self.config.graph) else {
            return Ok(GraphUpdate::default());
        };
        let keyed: Vec<(String, &Group)> = groups.iter().map(|g| (g.key(), *g)).collect();
        let views: Vec<(&str, &[Trajectory], &[EpisodeReward])> =
            keyed.iter().map(|(k, g)| (k.as_str(), g.episodes.as_slice(), g.rewards.as_slice())).collect();
        let executors: Vec<&dyn Executor> = self.worlds.iter().map(|w| w.tools.as_ref()).collect();
        graph.learn(iteration + 1, &views, settings.admit, &executors)
    }
}

/// What an environment serves of a run: the sampler, and the starting policy its episodes are
/// tokenized (and, for MemPO, scored) with.
#[allow(missing_debug_implementations)] // a policy: nothing to show
pub struct Environment {
    /// The sampler of the run's method over its worlds.
    pub sampler: Sampler,
    /// The starting policy (the one the engine serves, when an engine samples).
    pub policy: Arc<Mutex<Policy>>,
    /// Its conversations to token sequences.
    pub builder: SequenceBuilder,
}

impl Environment {
    /// The run `config` describes, set up as `train rl` sets it up (the starting policy, the
    /// worlds and their tools, simulated ones for MTR, the tool graph in `dir`), with episodes
    /// written by `backend` (given the starting policy) instead of updated on.
    pub fn prepare(
        config: RlConfig,
        dir: &std::path::Path,
        tools_for: &ToolsFor<'_>,
        backend: impl FnOnce(&Arc<Mutex<Policy>>) -> Result<Arc<dyn Backend>, TrainError>,
    ) -> Result<Environment, TrainError> {
        config.validate()?;
        let options = config.run.load_options()?;
        let policy = config.run.init.load(config.run.seed, options, None)?;
        let actor = match &config.simulate {
            Some(s) => {
                let frozen = Arc::new(Mutex::new(policy.reference()?));
                let params = toolsmith_policy::SamplingParams {
                    max_new_tokens: s.max_tokens,
                    temperature: s.temperature,
                    seed: seed_of(&[config.run.seed, 0x5157]),
                    ..toolsmith_policy::SamplingParams::default()
                };
                Some(ToolActor::new(frozen, params)?)
            }
            None => None,
        };
        let worlds = training_worlds(&config, actor.as_ref(), tools_for)?;
        std::fs::create_dir_all(dir).map_err(|e| TrainError::io(dir, e))?;
        let graph = match &config.graph {
            Some(_) => {
                let path = dir.join(super::training_graph::REGISTRY_FILE);
                if path.exists() {
                    std::fs::remove_file(&path).map_err(|e| TrainError::io(&path, e))?;
                }
                let tools = worlds.first().map(|w| w.tools.manifests()).unwrap_or_default();
                Some(TrainingGraph::create(&path, &tools)?)
            }
            None => None,
        };
        let builder = SequenceBuilder::for_policy(&policy)?;
        let policy = Arc::new(Mutex::new(policy));
        let backend = backend(&policy)?;
        Ok(Environment { sampler: Sampler::new(config, worlds, graph, backend), policy, builder })
    }

    /// The tasks of a JSON-lines file in place of the generated worlds' (one world, whose tools
    /// `tools` are, e.g. a search over the file's corpus).
    pub fn with_tasks(mut self, tasks: Vec<Task>, tools: Arc<dyn Executor>) -> Environment {
        let Sampler { config, graph, backend, .. } = self.sampler;
        self.sampler = Sampler { config, worlds: vec![TrainWorld { tasks, tools, calls: false }], graph, backend };
        self
    }
}
