//! Evaluation: run an agent on a task set and report EM, F1, pass@1, turns, response tokens, total
//! and peak tokens (TT, PT), wall time and cost-of-pass, per family and overall.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use crate::env::metrics::{exact_match, f1};
use crate::env::{Family, Task};
use crate::runner::{Agent, Finish, Mode, Trajectory};

/// One task's outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskResult {
    /// The task's id in its task set.
    pub id: String,
    /// The family the task is reported under.
    pub family: Family,
    /// How many questions the task asks at once.
    pub objectives: usize,
    /// The agent's final answer, `None` when the episode ended without one.
    pub answer: Option<String>,
    /// Exact match with a golden answer.
    pub em: f64,
    /// Token F1 with the best golden answer.
    pub f1: f64,
    /// The whole episode, to see how the answer came about.
    pub trajectory: Trajectory,
}

/// Aggregates over a group of tasks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// How many tasks the figures average over.
    pub tasks: usize,
    /// Mean exact match with a golden answer (SQuAD-normalised).
    pub em: f64,
    /// Mean token F1 with the best golden answer.
    pub f1: f64,
    /// Fraction solved with one sample (exact match).
    pub pass_at_1: f64,
    /// Mean turns per episode.
    pub turns: f64,
    /// Mean tokens the model wrote.
    pub response_tokens: f64,
    /// Mean total tokens (every step's context and response).
    pub total_tokens: f64,
    /// Mean peak tokens of one step.
    pub peak_tokens: f64,
    /// Mean wall time of an episode in milliseconds, model and tools together.
    pub wall_ms: f64,
    /// Total tokens spent per solved task (infinite when none is solved).
    pub cost_of_pass: f64,
    /// Episodes that ended on a backend error.
    pub backend_errors: usize,
}

impl Summary {
    fn of<'a>(results: impl Iterator<Item = &'a TaskResult>) -> Summary {
        let rs: Vec<&TaskResult> = results.collect();
        let n = rs.len().max(1) as f64;
        let mean = |f: &dyn Fn(&TaskResult) -> f64| rs.iter().map(|r| f(r)).sum::<f64>() / n;
        let em = mean(&|r| r.em);
        let total_tokens = mean(&|r| r.trajectory.total_tokens() as f64);
        Summary {
            tasks: rs.len(),
            em,
            f1: mean(&|r| r.f1),
            pass_at_1: em,
            turns: mean(&|r| r.trajectory.turns() as f64),
            response_tokens: mean(&|r| r.trajectory.response_tokens() as f64),
            total_tokens,
            peak_tokens: mean(&|r| r.trajectory.peak_tokens() as f64),
            wall_ms: mean(&|r| r.trajectory.wall_ms),
            cost_of_pass: if em > 0.0 { total_tokens / em } else { f64::INFINITY },
            backend_errors: rs.iter().filter(|r| matches!(r.trajectory.finish, Finish::BackendError(_))).count(),
        }
    }
}

/// An evaluation's figures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// The agent mode that was evaluated.
    pub mode: Mode,
    /// The backend's label (model or endpoint), so reports of several backends can be told apart.
    pub backend: String,
    /// The figures of each family's tasks.
    pub families: BTreeMap<Family, Summary>,
    /// The figures over every task together.
    pub overall: Summary,
    /// Per task (with trajectories).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<TaskResult>,
}

impl Report {
    /// The figures without the per-task results.
    pub fn summary(&self) -> Report {
        Report {
            mode: self.mode,
            backend: self.backend.clone(),
            families: self.families.clone(),
            overall: self.overall.clone(),
            results: Vec::new(),
        }
    }

    /// The figures as a table.
    pub fn table(&self) -> String {
        let mut s = format!("mode {} · backend {}\n", self.mode, self.backend);
        let _ = writeln!(
            s,
            "{:<22} {:>5} {:>6} {:>6} {:>6} {:>6} {:>8} {:>8} {:>7} {:>9} {:>10}",
            "family", "tasks", "EM", "F1", "pass@1", "turns", "resp tok", "TT", "PT", "wall ms", "cost/pass"
        );
        let rows = self.families.iter().map(|(f, s)| (f.name(), s)).chain(std::iter::once(("all", &self.overall)));
        for (name, m) in rows {
            let _ = writeln!(
                s,
                "{:<22} {:>5} {:>6.3} {:>6.3} {:>6.3} {:>6.2} {:>8.1} {:>8.1} {:>7.1} {:>9.1} {:>10.1}",
                name,
                m.tasks,
                m.em,
                m.f1,
                m.pass_at_1,
                m.turns,
                m.response_tokens,
                m.total_tokens,
                m.peak_tokens,
                m.wall_ms,
                m.cost_of_pass
            );
        }
        s
    }
}

/// Runs `agent` on every task, `parallel` episodes at a time; `on_done` is called after each.
pub async fn evaluate(agent: &Agent, tasks: &[Task], parallel: usize, on_done: impl FnMut(&TaskResult)) -> Report {
    let mut reports = evaluate_all(&[agent], tasks, parallel, on_done).await;
    reports.pop().unwrap_or_else(|| report(agent, Vec::new()))
}

/// Runs each of `agents` (e.g. one per mode, over one batching backend) on every task, one
/// report per agent, `parallel` episodes at a time in all. The episodes interleave (each task
/// in every agent, then the next task), so the agents share batches and one tail of long
/// episodes; rows of short and long prompts then decode at the longest one's width, and the
/// two effects cancelled in the one measurement (BENCHMARKS.md).
pub async fn evaluate_all(
    agents: &[&Agent],
    tasks: &[Task],
    parallel: usize,
    mut on_done: impl FnMut(&TaskResult),
) -> Vec<Report> {
    let pairs = tasks.iter().enumerate().flat_map(|(i, task)| (0..agents.len()).map(move |a| (a, i, task)));
    let mut results: Vec<Vec<(usize, TaskResult)>> = agents.iter().map(|_| Vec::with_capacity(tasks.len())).collect();
    let mut stream = futures_util::stream::iter(pairs)
        .map(|(a, i, task)| async move {
            let trajectory = agents[a].run(&task.question).await;
            let answer = trajectory.answer.clone();
            let prediction = answer.clone().unwrap_or_default();
            let result = TaskResult {
                id: task.id.clone(),
                family: task.family,
                objectives: task.objectives,
                em: exact_match(&prediction, &task.golden_answers),
                f1: f1(&prediction, &task.golden_answers),
                answer,
                trajectory,
            };
            (a, i, result)
        })
        .buffer_unordered(parallel.max(1));
    while let Some((a, i, r)) = stream.next().await {
        on_done(&r);
        results[a].push((i, r));
    }
    agents
        .iter()
        .zip(results)
        .map(|(agent, mut results)| {
            results.sort_by_key(|(i, _)| *i);
            report(agent, results.into_iter().map(|(_, r)| r).collect())
        })
        .collect()
}

/// The figures of `agent`'s results, per family and overall.
fn report(agent: &Agent, results: Vec<TaskResult>) -> Report {
    let mut families = BTreeMap::new();
    for family in results.iter().map(|r| r.family).collect::<std::collections::BTreeSet<_>>() {
        families.insert(family, Summary::of(results.iter().filter(|r| r.family == family)));
    }
    Report {
        mode: agent.config().mode,
        backend: results.first().map(|r| r.trajectory.backend.clone()).unwrap_or_default(),
        families,
        overall: Summary::of(results.iter()),
        results,
    }
}

/// Peak tokens per step by number of objectives (multi-objective tasks): MemPO's flat-memory
/// claim in numbers.
pub fn peak_by_objectives(report: &Report) -> BTreeMap<usize, f64> {
    let mut groups: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    for r in report.results.iter().filter(|r| r.family == Family::MultiObjective) {
        groups.entry(r.objectives).or_default().push(r.trajectory.peak_tokens() as f64);
    }
    groups.into_iter().map(|(k, v)| (k, v.iter().sum::<f64>() / v.len() as f64)).collect()
}
