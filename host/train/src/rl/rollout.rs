//! Sampling an iteration's groups: tasks drawn in a seeded order, a group of episodes per task
//! run all at once through the batching backend (or an engine), each scored by the method's
//! reward with DAPO's overlong shaping, and DAPO's dynamic sampling drawing more tasks while
//! groups are uninformative.

use std::sync::Arc;
use std::time::Instant;

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use toolsmith_agent::backend::GenerateOptions;
use toolsmith_agent::env::Task;
use toolsmith_agent::simulate::ToolActor;
use toolsmith_agent::tools::{Executor, LocalTools};
use toolsmith_agent::{Agent, AgentConfig, Trajectory};
use toolsmith_contract::ToolKind;

use crate::TrainError;
use crate::rl::advantage::{keeps_group, overlong_penalty};
use crate::rl::reward::EpisodeReward;
use crate::rl::trainer::RlUnit;

/// A training world: its tasks and tools.
pub(super) struct TrainWorld {
    pub(super) tasks: Vec<Task>,
    pub(super) tools: Arc<dyn Executor>,
}

/// A group: one task's episodes and their rewards.
pub(super) struct Group {
    /// The training world the task is from (task ids repeat across worlds).
    pub(super) world: usize,
    pub(super) task: Task,
    pub(super) episodes: Vec<Trajectory>,
    pub(super) rewards: Vec<EpisodeReward>,
}

/// An iteration's groups: those trained on, those dynamic sampling dropped, and the seconds the
/// rollouts took.
pub(super) struct Sampled {
    pub(super) kept: Vec<Group>,
    pub(super) dropped: Vec<Group>,
    pub(super) seconds: f64,
}

/// A seed from a few numbers (SplitMix64 finaliser over their mix).
pub(super) fn mix(parts: &[u64]) -> u64 {
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
pub(super) fn pool_hash(worlds: &[TrainWorld]) -> String {
    let mut h = blake3::Hasher::new();
    for w in worlds {
        for t in &w.tasks {
            h.update(t.id.as_bytes());
            h.update(t.question.as_bytes());
        }
    }
    h.finalize().to_hex().to_string()
}

/// The interfaces of `real`'s tools, answered by `actor` (MTR). Tool creation is left out: its
/// result is code that ran, which a simulation cannot stand in for.
pub(super) fn simulated(real: &dyn Executor, actor: ToolActor) -> Result<Arc<dyn Executor>, TrainError> {
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

/// Dynamic sampling's choice among one draw's groups, in the order drawn: the first `room` that
/// `informative` accepts are kept; the rest, uninformative or surplus, are dropped.
fn select_groups<G>(groups: Vec<G>, room: usize, informative: impl Fn(&G) -> bool) -> (Vec<G>, Vec<G>) {
    let (mut kept, mut dropped) = (Vec::new(), Vec::new());
    for g in groups {
        if kept.len() < room && informative(&g) { kept.push(g) } else { dropped.push(g) }
    }
    (kept, dropped)
}

impl RlUnit {
    /// The iteration's groups. With dynamic sampling, a group whose episodes are all right or
    /// all wrong (equal outcomes: the method's accuracy, before any shaping) is dropped and
    /// more tasks are drawn, up to `max_refills` times.
    ///
    /// With `oversample`, the first draw takes that many more tasks, and groups beyond
    /// `tasks_per_iteration` that would be kept count as dropped.
    pub(super) fn sample(&self, iteration: u64) -> Result<Sampled, TrainError> {
        let target = self.config.tasks_per_iteration;
        let dynamic = self.config.dynamic_sampling;
        let mut sampled = Sampled { kept: Vec::new(), dropped: Vec::new(), seconds: 0.0 };
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
            let groups = self.rollouts(iteration, draw, &tasks);
            sampled.seconds += started.elapsed().as_secs_f64();
            if dynamic {
                let room = target - sampled.kept.len();
                let (kept, dropped) = select_groups(groups, room, |g| keeps_group(&g.rewards));
                sampled.kept.extend(kept);
                sampled.dropped.extend(dropped);
            } else {
                sampled.kept.extend(groups);
            }
            if !dynamic || sampled.kept.len() >= target {
                break;
            }
        }
        Ok(sampled)
    }

    /// Tasks `from..from + count` of the current iteration's order of every training task,
    /// seeded by (seed, iteration) so a resumed run draws the same, and a refill of dynamic
    /// sampling draws tasks not drawn before in the iteration.
    pub(super) fn draw_tasks(&self, iteration: u64, from: usize, count: usize) -> Vec<(usize, Task)> {
        let mut rng = StdRng::seed_from_u64(mix(&[self.config.seed, iteration]));
        let mut all: Vec<(usize, usize)> =
            self.worlds.iter().enumerate().flat_map(|(w, world)| (0..world.tasks.len()).map(move |t| (w, t))).collect();
        all.shuffle(&mut rng);
        all.into_iter().skip(from).take(count).map(|(w, t)| (w, self.worlds[w].tasks[t].clone())).collect()
    }

    /// Samples a group of episodes for each task, all at once.
    pub(super) fn rollouts(&self, iteration: u64, draw: u64, tasks: &[(usize, Task)]) -> Vec<Group> {
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
                    seed: mix(&[c.seed, iteration, draw, k as u64, e as u64]),
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
        let mut r = self.config.method.spec().assign.reward(episode, &task.golden_answers, &self.config);
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
}

#[cfg(test)]
mod tests {
    use super::select_groups;

    #[test]
    fn dynamic_sampling_keeps_the_first_informative_groups_up_to_the_room() {
        // Odd numbers stand for groups whose rewards differ.
        let odd = |g: &u32| g % 2 == 1;
        assert_eq!(select_groups(vec![1, 2, 3, 5, 4, 7], 3, odd), (vec![1, 3, 5], vec![2, 4, 7]));
        assert_eq!(select_groups(vec![2, 4], 3, odd), (vec![], vec![2, 4]));
        assert_eq!(select_groups(vec![1, 3], 0, odd), (vec![], vec![1, 3]));
        assert_eq!(select_groups(Vec::<u32>::new(), 2, odd), (vec![], vec![]));
    }
}
