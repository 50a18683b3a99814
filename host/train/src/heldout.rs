//! Held-out evaluation with the real agent loop: the policy being trained answers the questions
//! of a world it never saw (another seed: new names, new facts) through the same runner, tools
//! and parser that `toolsmith eval` uses, greedily, in each configured mode.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use toolsmith_agent::backend::{Backend, BatchConfig, BatchedBackend, GenerateOptions};
use toolsmith_agent::env::{Corpus, Family, Task, World, WorldConfig};
use toolsmith_agent::eval::{Report, evaluate};
use toolsmith_agent::oracle::{CALCULATOR, Oracle};
use toolsmith_agent::tools::Executor;
use toolsmith_agent::{Agent, AgentConfig, Mode, ToolFormat};
use toolsmith_policy::{Policy, Tokenizer};

use crate::TrainError;
use crate::metrics::{EvalMetrics, ModeFigures};
use crate::settings::EvalConfig;

/// Builds the tools an agent uses over a corpus (search, plugins, Python).
pub type ToolsFor<'a> = dyn Fn(Arc<Corpus>) -> Arc<dyn Executor> + 'a;

/// A held-out task set with its tools.
pub struct HeldOut {
    config: EvalConfig,
    tool_format: ToolFormat,
    tasks: Vec<Task>,
    tools: Arc<dyn Executor>,
    runtime: tokio::runtime::Runtime,
    /// Each mode's ceiling, measured once (it depends on the tasks, the budget and the tokenizer).
    ceilings: Mutex<BTreeMap<Mode, Option<f64>>>,
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
        Ok(HeldOut { tools: tools_for(corpus), config, tool_format, tasks, runtime, ceilings: Mutex::default() })
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
        // Modes one after another: side by side (`evaluate_all`) measured slower here (437 s
        // against 428 s, and 617 s against 530-583 s at 256-token turns, for the `smol-world`
        // evaluation; BENCHMARKS.md): rows of different modes and turns pad to the longest.
        let mut modes = BTreeMap::new();
        for &mode in &self.config.modes {
            let config = AgentConfig {
                mode,
                max_turns: self.config.max_turns,
                // Greedy; a turn that falls into an exact loop ends there instead of decoding
                // to the budget (it is lost either way).
                generate: GenerateOptions {
                    max_tokens: self.config.max_tokens,
                    stop_loops: true,
                    ..GenerateOptions::default()
                },
                tool_format: self.tool_format,
                ..AgentConfig::default()
            };
            let agent = Agent::new(backend.clone(), self.tools.clone(), config);
            let report = self.runtime.block_on(evaluate(&agent, &self.tasks, self.config.parallel, |_| {}));
            let mut figures = figures(&report);
            figures.ceiling = self.ceiling(mode, &toolsmith_contract::sync::lock(policy));
            modes.insert(mode.name().to_string(), figures);
        }
        backend.release_memory();
        let em = modes.values().map(|m| m.em).sum::<f64>() / modes.len().max(1) as f64;
        EvalMetrics { step, modes, em, seconds: started.elapsed().as_secs_f64() }
    }

    /// The share of the tasks that the oracle answers, in `mode`, with no turn longer than the
    /// budget in `policy`'s tokens, measured at the first evaluation (warned about when below 1:
    /// the budget, not the policy, then bounds the EM).
    fn ceiling(&self, mode: Mode, policy: &Policy) -> Option<f64> {
        let mut known = toolsmith_contract::sync::lock(&self.ceilings);
        if let Some(&c) = known.get(&mode) {
            return c;
        }
        let measured = self.measure_ceiling(mode, policy);
        known.insert(mode, measured);
        measured
    }

    fn measure_ceiling(&self, mode: Mode, policy: &Policy) -> Option<f64> {
        let budget = self.config.max_tokens;
        let (fits, longest) = budget_fit(&self.tasks, mode, policy.tokenizer(), budget)?;
        if fits < 1.0 {
            tracing::warn!(
                "held-out {mode}: the oracle's own trace needs a turn longer than max_tokens ({budget}) on \
                 {:.0}% of the tasks (the longest {longest} tokens), so EM cannot pass {fits:.2}",
                100.0 * (1.0 - fits)
            );
        }
        Some(fits)
    }
}

/// How `max_tokens` fits the oracle's traces of `tasks` in `mode`, in `tokenizer`'s tokens: the
/// share of tasks that fit ([`ceiling`]) and the longest turn any needs; None (warned about)
/// when the tokenizer fails.
pub fn budget_fit(tasks: &[Task], mode: Mode, tokenizer: &Tokenizer, max_tokens: usize) -> Option<(f64, usize)> {
    match oracle_budgets(tasks, mode, &Arc::new(tokenizer.clone())) {
        Ok(needed) => Some((ceiling(&needed, max_tokens), needed.iter().max().copied().unwrap_or(0))),
        Err(e) => {
            tracing::warn!("cannot measure the oracle's turns: {e}");
            None
        }
    }
}

/// The longest turn of the oracle's trace of each task in `mode`, in `tokenizer`'s tokens: the
/// turn budget a policy needs to answer as the oracle does (0 for a task without a solution).
pub fn oracle_budgets(tasks: &[Task], mode: Mode, tokenizer: &Arc<Tokenizer>) -> Result<Vec<usize>, TrainError> {
    let oracle = Oracle::new(tasks, mode, tokenizer.clone());
    let mut needed = Vec::with_capacity(tasks.len());
    for task in tasks {
        let mut longest = 0;
        // The evaluation lists the bundled plugins, so the oracle would add with `calculator`.
        for turn in oracle.turns(task, |tool| tool == CALCULATOR) {
            longest = longest.max(tokenizer.encode(&turn)?.len());
        }
        needed.push(longest);
    }
    Ok(needed)
}

/// The share of `needed` budgets within `max_tokens` (1 for no tasks).
pub fn ceiling(needed: &[usize], max_tokens: usize) -> f64 {
    if needed.is_empty() {
        return 1.0;
    }
    needed.iter().filter(|&&n| n <= max_tokens).count() as f64 / needed.len() as f64
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
        ceiling: None,
        tasks: report.results.len(),
        families: report.families.iter().map(|(f, s)| (f.name().to_string(), s.em)).collect(),
        family_f1: report.families.iter().map(|(f, s)| (f.name().to_string(), s.f1)).collect(),
    }
}
