//! Held-out evaluation with the real agent loop: the policy being trained answers the questions
//! of a world it never saw (another seed: new names, new facts) through the same runner, tools
//! and parser that `toolsmith eval` uses, greedily, in each configured mode.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use toolsmith_agent::backend::{Backend, BatchConfig, BatchedBackend, GenerateOptions};
use toolsmith_agent::env::{Corpus, Family, Task, World, WorldConfig};
use toolsmith_agent::eval::{Report, evaluate};
use toolsmith_agent::tools::Executor;
use toolsmith_agent::{Agent, AgentConfig, ToolFormat};
use toolsmith_policy::Policy;

use crate::TrainError;
use crate::config::EvalConfig;
use crate::metrics::{EvalMetrics, ModeFigures};

/// Builds the tools an agent uses over a corpus (search, plugins, Python).
pub type ToolsFor<'a> = dyn Fn(Arc<Corpus>) -> Arc<dyn Executor> + 'a;

/// A held-out task set with its tools.
pub struct HeldOut {
    config: EvalConfig,
    tool_format: ToolFormat,
    tasks: Vec<Task>,
    tools: Arc<dyn Executor>,
    runtime: tokio::runtime::Runtime,
}

impl std::fmt::Debug for HeldOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldOut")
            .field("config", &self.config)
            .field("tasks", &self.tasks.len())
            .finish_non_exhaustive()
    }
}

impl HeldOut {
    /// Whether the run evaluates before its first step too.
    pub fn before(&self) -> bool {
        self.config.before
    }

    /// The held-out world of `config`, its first `tasks_per_family` tasks of each family, and
    /// tools over its corpus; prompts list tools in `tool_format` (the one training used).
    pub fn new(config: EvalConfig, tool_format: ToolFormat, tools_for: &ToolsFor<'_>) -> Result<Self, TrainError> {
        let world = World::generate(WorldConfig {
            seed: config.world_seed,
            countries: config.countries,
            tasks_per_family: config.tasks_per_family,
        });
        let mut taken: BTreeMap<Family, usize> = BTreeMap::new();
        let tasks: Vec<Task> = world
            .tasks()
            .into_iter()
            .filter(|t| {
                let n = taken.entry(t.family).or_default();
                *n += 1;
                *n <= config.tasks_per_family
            })
            .collect();
        let corpus = Arc::new(Corpus::new(&world.documents()).map_err(|e| TrainError::Agent(e.to_string()))?);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| TrainError::Agent(format!("cannot start tokio: {e}")))?;
        Ok(HeldOut { tools: tools_for(corpus), config, tool_format, tasks, runtime })
    }

    /// The tasks.
    pub fn tasks(&self) -> &[Task] {
        &self.tasks
    }

    /// Runs every mode with `policy` (greedy) and returns the figures, labelled with `step`.
    pub fn evaluate(&self, policy: &Arc<Mutex<Policy>>, step: u64) -> EvalMetrics {
        let started = Instant::now();
        // The evaluation decodes on the batching worker's thread, whose allocator arena cannot
        // reuse what training freed on this one: hand that back to the system first.
        toolsmith_policy::memory::release_free_memory();
        // Episodes run side by side and their turns decode in batches.
        let batching = BatchConfig::for_episodes(
            self.config.parallel,
            self.config.max_turns,
            self.config.max_tokens,
            &toolsmith_contract::sync::lock(policy),
        );
        let backend = Arc::new(BatchedBackend::new(policy.clone(), "training", batching));
        // Modes one after another: side by side (`evaluate_all`) measured no faster here (437 s
        // against 428 s for the `smol-world` evaluation; BENCHMARKS.md).
        let mut modes = BTreeMap::new();
        for &mode in &self.config.modes {
            let config = AgentConfig {
                mode,
                max_turns: self.config.max_turns,
                generate: GenerateOptions { max_tokens: self.config.max_tokens, ..GenerateOptions::default() },
                tool_format: self.tool_format,
                ..AgentConfig::default()
            };
            let agent = Agent::new(backend.clone(), self.tools.clone(), config);
            let report = self.runtime.block_on(evaluate(&agent, &self.tasks, self.config.parallel, |_| {}));
            modes.insert(mode.name().to_string(), figures(&report));
        }
        backend.release_memory();
        let em = modes.values().map(|m| m.em).sum::<f64>() / modes.len().max(1) as f64;
        EvalMetrics { step, modes, em, seconds: started.elapsed().as_secs_f64() }
    }
}

/// A mode's figures from an evaluation report.
pub fn figures(report: &Report) -> ModeFigures {
    let steps: Vec<_> = report.results.iter().flat_map(|r| r.trajectory.steps.iter()).collect();
    let bad_turns = steps.iter().filter(|s| !s.errors.is_empty()).count();
    let answered = report.results.iter().filter(|r| r.answer.is_some()).count();
    ModeFigures {
        em: report.overall.em,
        f1: report.overall.f1,
        turns: report.overall.turns,
        format_error_rate: bad_turns as f64 / steps.len().max(1) as f64,
        answered: answered as f64 / report.results.len().max(1) as f64,
        tasks: report.results.len(),
        families: report.families.iter().map(|(f, s)| (f.name().to_string(), s.em)).collect(),
    }
}
