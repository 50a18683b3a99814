//! Plans: a dependency graph of sub-tasks. GAP's `<plan>` lines (`Task 1: ... - Dependencies:
//! none`), GAP's `<graph><node id depends>` and SEARL's `##DAG_LIST` + `##STn:` all parse into one
//! [`Plan`], which is validated (unique ids, known dependencies, no cycles) and split into
//! execution levels: every task of a level depends only on tasks of earlier levels, so the tasks
//! of one level can run in parallel.

use std::collections::{HashMap, HashSet};
use std::fmt;

use serde::{Deserialize, Serialize};

/// One sub-task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// Unique within the plan (`1`, `s1`, `ST1`).
    pub id: String,
    /// The sub-task in the agent's words, also the query tools are retrieved for.
    pub description: String,
    /// Ids of the tasks whose results this one needs.
    pub depends_on: Vec<String>,
}

/// A validated plan: tasks in the order written, dependencies acyclic and known.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    tasks: Vec<Task>,
}

/// Why a plan is not usable. Shown to the agent as an observation, so it says exactly what to fix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PlanError {
    /// No tasks at all.
    #[error("the plan has no tasks")]
    Empty,
    /// A line that is not in the format (1-based line number).
    #[error("line {line}: {message}")]
    Malformed {
        /// Where the line is, counting from 1.
        line: usize,
        /// What the line should have looked like.
        message: String,
    },
    /// Two tasks share an id.
    #[error("task id `{id}` is used twice")]
    DuplicateId {
        /// The repeated id.
        id: String,
    },
    /// A dependency names no task.
    #[error("task `{task}` depends on `{dependency}`, which is not a task of this plan")]
    UnknownDependency {
        /// The task that lists the dependency.
        task: String,
        /// The id that matches no task.
        dependency: String,
    },
    /// A task lists itself.
    #[error("task `{task}` depends on itself")]
    SelfDependency {
        /// The task's id.
        task: String,
    },
    /// A cycle, as the path of ids around it.
    #[error("the dependencies form a cycle: {}", cycle.join(" -> "))]
    Cycle {
        /// The ids around the cycle, the first repeated at the end.
        cycle: Vec<String>,
    },
}

impl Plan {
    /// Validates `tasks` into a plan.
    pub fn new(tasks: Vec<Task>) -> Result<Self, PlanError> {
        if tasks.is_empty() {
            return Err(PlanError::Empty);
        }
        let mut ids = HashSet::new();
        for task in &tasks {
            if !ids.insert(task.id.as_str()) {
                return Err(PlanError::DuplicateId { id: task.id.clone() });
            }
        }
        for task in &tasks {
            for dependency in &task.depends_on {
                if *dependency == task.id {
                    return Err(PlanError::SelfDependency { task: task.id.clone() });
                }
                if !ids.contains(dependency.as_str()) {
                    return Err(PlanError::UnknownDependency { task: task.id.clone(), dependency: dependency.clone() });
                }
            }
        }
        let plan = Self { tasks };
        if let Some(cycle) = plan.find_cycle() {
            return Err(PlanError::Cycle { cycle });
        }
        Ok(plan)
    }

    /// The tasks in written order.
    pub fn tasks(&self) -> &[Task] {
        &self.tasks
    }

    /// The task with this id.
    pub fn task(&self, id: &str) -> Option<&Task> {
        self.tasks.iter().find(|t| t.id == id)
    }

    /// Execution levels by topological sort (indices into `tasks`, in written order within a
    /// level). Level 0 holds the tasks without dependencies.
    pub fn levels(&self) -> Vec<Vec<usize>> {
        let index: HashMap<&str, usize> = self.tasks.iter().enumerate().map(|(i, t)| (t.id.as_str(), i)).collect();
        // Kahn's algorithm: a task's level is one more than its deepest dependency's. The graph is
        // acyclic (checked in `new`), so every task is reached.
        let mut waiting: Vec<usize> = self.tasks.iter().map(|t| t.depends_on.len()).collect();
        let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); self.tasks.len()];
        for (i, task) in self.tasks.iter().enumerate() {
            for d in &task.depends_on {
                dependents[index[d.as_str()]].push(i);
            }
        }
        let mut level = vec![0_usize; self.tasks.len()];
        let mut ready: std::collections::VecDeque<usize> = (0..self.tasks.len()).filter(|&i| waiting[i] == 0).collect();
        while let Some(i) = ready.pop_front() {
            for &j in &dependents[i] {
                level[j] = level[j].max(level[i] + 1);
                waiting[j] -= 1;
                if waiting[j] == 0 {
                    ready.push_back(j);
                }
            }
        }
        let depth = level.iter().copied().max().map_or(0, |m| m + 1);
        let mut levels = vec![Vec::new(); depth];
        for (i, l) in level.into_iter().enumerate() {
            levels[l].push(i);
        }
        levels
    }

    /// Dependency edges `(from, to)`: `to` needs `from`'s result (what the tool graph learns).
    pub fn edges(&self) -> Vec<(&str, &str)> {
        self.tasks.iter().flat_map(|t| t.depends_on.iter().map(move |d| (d.as_str(), t.id.as_str()))).collect()
    }

    /// A cycle as a path of ids that starts and ends at the same task, if there is one.
    fn find_cycle(&self) -> Option<Vec<String>> {
        let index: HashMap<&str, usize> = self.tasks.iter().enumerate().map(|(i, t)| (t.id.as_str(), i)).collect();
        // 0 unvisited, 1 on the current path, 2 done. Iterative DFS (plans from a model can be long).
        let mut state = vec![0_u8; self.tasks.len()];
        for start in 0..self.tasks.len() {
            if state[start] != 0 {
                continue;
            }
            let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
            state[start] = 1;
            while let Some(&mut (node, ref mut next)) = stack.last_mut() {
                let deps = &self.tasks[node].depends_on;
                if *next < deps.len() {
                    let dep = index[deps[*next].as_str()];
                    *next += 1;
                    match state[dep] {
                        0 => {
                            state[dep] = 1;
                            stack.push((dep, 0));
                        }
                        1 => {
                            let from = stack.iter().position(|&(n, _)| n == dep).unwrap_or(0);
                            let mut cycle: Vec<String> =
                                stack[from..].iter().map(|&(n, _)| self.tasks[n].id.clone()).collect();
                            cycle.push(self.tasks[dep].id.clone());
                            return Some(cycle);
                        }
                        _ => {}
                    }
                } else {
                    state[node] = 2;
                    stack.pop();
                }
            }
        }
        None
    }
}

impl fmt::Display for Plan {
    /// GAP's line format, the canonical rendering.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for task in &self.tasks {
            let deps = if task.depends_on.is_empty() {
                "none".to_string()
            } else {
                task.depends_on.iter().map(|d| format!("Task {d}")).collect::<Vec<_>>().join(", ")
            };
            writeln!(f, "Task {}: {} - Dependencies: {deps}", task.id, task.description)?;
        }
        Ok(())
    }
}

/// Parses any supported plan format, chosen by its markers.
pub fn parse(text: &str) -> Result<Plan, PlanError> {
    if text.contains("##DAG_LIST") {
        parse_searl(text)
    } else if text.contains("<node") {
        parse_graph(text)
    } else {
        parse_lines(text)
    }
}

/// `Task 1: description - Dependencies: none` (GAP's `<plan>`); the dependencies may also be on
/// the next line (`- Dependencies: Task 1, Task 2`).
pub fn parse_lines(text: &str) -> Result<Plan, PlanError> {
    let mut tasks: Vec<Task> = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        let line_no = n + 1;
        if let Some(rest) = strip_dependencies_label(line) {
            let Some(task) = tasks.last_mut() else {
                return Err(PlanError::Malformed { line: line_no, message: "dependencies before any task".into() });
            };
            task.depends_on = dependency_list(rest, line_no)?;
            continue;
        }
        if let Some((id, rest)) = task_header(line) {
            let (description, deps) = match find_ci(rest, "- dependencies:").or_else(|| find_ci(rest, "dependencies:"))
            {
                Some((at, len)) => (rest[..at].trim(), Some(&rest[at + len..])),
                None => (rest.trim(), None),
            };
            let depends_on = match deps {
                Some(d) => dependency_list(d, line_no)?,
                None => Vec::new(),
            };
            tasks.push(Task { id, description: description.trim_end_matches(['-', ' ']).to_string(), depends_on });
        } else if let Some(task) = tasks.last_mut() {
            // A continuation of the previous task's description.
            if !task.description.is_empty() {
                task.description.push(' ');
            }
            task.description.push_str(line);
        } else {
            return Err(PlanError::Malformed {
                line: line_no,
                message: format!(
                    "expected `Task N: description - Dependencies: none|Task M, ...`, got `{}`",
                    clip(line)
                ),
            });
        }
    }
    Plan::new(tasks)
}

/// GAP's graph: `<graph><node id="s1">...</node><node id="s3" depends="s1,s2">...</node></graph>`.
pub fn parse_graph(text: &str) -> Result<Plan, PlanError> {
    let mut tasks = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("<node") {
        let line = line_of(text, text.len() - rest.len() + start);
        let after = &rest[start + "<node".len()..];
        let Some(close) = after.find('>') else {
            return Err(PlanError::Malformed { line, message: "`<node` without `>`".into() });
        };
        let attributes = &after[..close];
        let body = &after[close + 1..];
        let Some(end) = body.find("</node>") else {
            return Err(PlanError::Malformed { line, message: "`<node>` without `</node>`".into() });
        };
        let id = attribute(attributes, "id")
            .filter(|id| !id.is_empty())
            .ok_or_else(|| PlanError::Malformed { line, message: "a node needs an id=\"...\" attribute".into() })?;
        let depends_on = attribute(attributes, "depends")
            .map(|d| d.split([',', ' ', ';']).map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect())
            .unwrap_or_default();
        tasks.push(Task { id, description: body[..end].trim().to_string(), depends_on });
        rest = &body[end + "</node>".len()..];
    }
    Plan::new(tasks)
}

/// SEARL's plan: `##DAG_LIST` then `[(ST1, ST2), (ST1, ST3)]` (ST2 depends on ST1; `[(ST1)]` for a
/// single task), then `##ST1: ...` sections whose following lines are the steps.
pub fn parse_searl(text: &str) -> Result<Plan, PlanError> {
    let mut tasks: Vec<Task> = Vec::new();
    let mut edges: Vec<(String, String, usize)> = Vec::new();
    let mut singles: Vec<String> = Vec::new();
    let mut in_dag = false;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        let line_no = n + 1;
        if line.is_empty() {
            continue;
        }
        if let Some(after) = line.strip_prefix("##DAG_LIST") {
            in_dag = true;
            if after.trim().is_empty() {
                continue;
            }
        }
        let body = line.strip_prefix("##DAG_LIST").unwrap_or(line).trim();
        if let Some(section) = body.strip_prefix("##") {
            in_dag = false;
            let Some((id, description)) = section.split_once(':') else {
                return Err(PlanError::Malformed {
                    line: line_no,
                    message: format!("expected `##STn: description`, got `{}`", clip(line)),
                });
            };
            tasks.push(Task {
                id: id.trim().to_string(),
                description: description.trim().to_string(),
                depends_on: Vec::new(),
            });
            continue;
        }
        if in_dag && body.starts_with('[') {
            for group in body.trim_start_matches('[').trim_end_matches(']').split(')') {
                let group = group.trim().trim_start_matches(',').trim().trim_start_matches('(');
                let ids: Vec<&str> = group.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
                match ids.as_slice() {
                    [] => {}
                    [one] => singles.push((*one).to_string()),
                    [from, to] => edges.push(((*from).to_string(), (*to).to_string(), line_no)),
                    _ => {
                        return Err(PlanError::Malformed {
                            line: line_no,
                            message: format!("a DAG_LIST entry is `(STa, STb)`, got `({group})`"),
                        });
                    }
                }
            }
            continue;
        }
        match tasks.last_mut() {
            Some(task) => {
                task.description.push('\n');
                task.description.push_str(line);
            }
            None => {
                return Err(PlanError::Malformed {
                    line: line_no,
                    message: format!("unexpected `{}` before `##DAG_LIST`/`##ST1:`", clip(line)),
                });
            }
        }
    }
    for single in &singles {
        if !tasks.iter().any(|t| &t.id == single) {
            return Err(PlanError::UnknownDependency { task: single.clone(), dependency: single.clone() });
        }
    }
    for (from, to, _) in edges {
        let Some(task) = tasks.iter_mut().find(|t| t.id == to) else {
            return Err(PlanError::UnknownDependency { task: to, dependency: from });
        };
        if !task.depends_on.contains(&from) {
            task.depends_on.push(from);
        }
    }
    Plan::new(tasks)
}

/// `Task 1: rest` / `Task1: rest` / `1. rest`-free: only the explicit `Task` label counts.
fn task_header(line: &str) -> Option<(String, &str)> {
    let line = line.trim_start_matches(['-', '*', ' ']);
    let rest = strip_prefix_ci(line, "task")?;
    let (id, rest) = rest.split_once(':')?;
    let id = id.trim();
    (!id.is_empty() && id.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '-')).then(|| (id.to_string(), rest))
}

fn strip_dependencies_label(line: &str) -> Option<&str> {
    let line = line.trim_start_matches(['-', '*', ' ']);
    strip_prefix_ci(line, "dependencies:")
}

/// `none`, or ids separated by commas or "and": `Task 1, Task 2`, `1 and 3`, `Task1`.
fn dependency_list(text: &str, line: usize) -> Result<Vec<String>, PlanError> {
    let text = text.trim().trim_end_matches('.');
    if text.is_empty() || text.eq_ignore_ascii_case("none") {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for part in text.split(',').flat_map(|p| p.split(" and ")) {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let id = strip_prefix_ci(part, "task").unwrap_or(part).trim();
        if id.is_empty() || !id.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '-') {
            return Err(PlanError::Malformed {
                line,
                message: format!("`{}` is not a task reference (write `Task N` or `none`)", clip(part)),
            });
        }
        out.push(id.to_string());
    }
    Ok(out)
}

fn attribute(attributes: &str, name: &str) -> Option<String> {
    let mut rest = attributes;
    while let Some(at) = rest.find(name) {
        let before_ok = at == 0 || rest[..at].ends_with(char::is_whitespace);
        let after = rest[at + name.len()..].trim_start();
        if before_ok && let Some(value) = after.strip_prefix('=') {
            let value = value.trim_start();
            let quote = value.chars().next()?;
            if quote == '"' || quote == '\'' {
                let inner = &value[1..];
                return inner.find(quote).map(|end| inner[..end].trim().to_string());
            }
            return Some(value.split_whitespace().next().unwrap_or("").to_string());
        }
        rest = &rest[at + name.len()..];
    }
    None
}

fn strip_prefix_ci<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix).then(|| &text[prefix.len()..])
}

/// Case-insensitive find of an ASCII needle: (byte offset, needle length).
fn find_ci(text: &str, needle: &str) -> Option<(usize, usize)> {
    let lower = text.to_ascii_lowercase();
    lower.find(needle).map(|at| (at, needle.len()))
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

fn clip(text: &str) -> String {
    let mut out: String = text.chars().take(60).collect();
    if text.chars().count() > 60 {
        out.push('…');
    }
    out
}
