//! The oracle: a backend that writes correct traces for tasks with known solutions (the bundled
//! world), in each method's style. It is the trace synthesiser for supervised data and the
//! reference the modes are compared with.
//!
//! It reads only what a model would: the question and the visible context. Its position in the
//! solution comes from the number of its turns in the context or, when the history is replaced by
//! memory (MemPO), from the progress line its own `<mem>` carries. Arithmetic goes to a tool, as
//! an agent of this size must do it: SEARL's style writes one, the others call `calculator` when
//! the system prompt lists it (and add in their head only when it does not).

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::json;
use toolsmith_policy::Tokenizer;

use crate::backend::{
    Backend, BackendError, BoxFuture, Completion, GenerateOptions, Message, Role, Usage, render_prompt,
};
use crate::env::world::{Compute, Solution, Step, Task};
use crate::plan::{self, Plan};
use crate::runner::Mode;
use crate::tools::CREATE_TOOL;
use crate::trace;

/// A backend that knows the answers.
#[derive(Debug, Clone)]
pub struct Oracle {
    tasks: Arc<HashMap<String, Task>>,
    style: Mode,
    tokenizer: Arc<Tokenizer>,
}

const PROGRESS: &str = "Progress: ";

impl Oracle {
    /// An oracle for `tasks` writing in `style`; `tokenizer` counts tokens as the policy would.
    pub fn new(tasks: &[Task], style: Mode, tokenizer: Arc<Tokenizer>) -> Self {
        let tasks = tasks.iter().filter(|t| t.solution.is_some()).map(|t| (t.question.clone(), t.clone())).collect();
        Oracle { tasks: Arc::new(tasks), style, tokenizer }
    }

    /// The same oracle writing in another style.
    pub fn with_style(&self, style: Mode) -> Self {
        Oracle { style, ..self.clone() }
    }

    /// Every turn of the solution of `task`, in this style, with the tools the listing names
    /// (`listed` says whether it names one): `calculator`, or a tool an agent wrote earlier for
    /// this kind of arithmetic, which SEARL's style then calls instead of writing it again.
    pub fn turns(&self, task: &Task, listed: impl Fn(&str) -> bool) -> Vec<String> {
        let Some(solution) = &task.solution else { return Vec::new() };
        let calculator = listed(CALCULATOR);
        let reuse = self.style == Mode::Searl && solution.compute.as_ref().is_some_and(|c| listed(&c.name));
        script(task, solution, self.style, calculator, reuse)
    }

    fn next_turn(&self, messages: &[Message]) -> Result<String, BackendError> {
        let question = messages.iter().find(|m| m.role == Role::User).map(|m| m.content.as_str()).unwrap_or_default();
        // A memory carried with the question (see `runner::context`) is not part of it.
        let question = question.split("\n<mem>").next().unwrap_or(question);
        let task = self.tasks.get(question).ok_or_else(|| BackendError::UnknownTask(clip(question)))?;
        // The listing of the turn being written (retrieved tools join it after the plan).
        let system = messages.iter().rev().find(|m| m.role == Role::System).map(|m| m.content.as_str());
        let turns = self.turns(task, |tool| system.is_some_and(|s| lists_tool(s, tool)));
        let assistant: Vec<&Message> = messages.iter().filter(|m| m.role == Role::Assistant).collect();
        let done = assistant.last().and_then(|m| progress(&m.content)).map(|p| p + 1).unwrap_or(assistant.len());
        Ok(turns.get(done).or(turns.last()).cloned().unwrap_or_default())
    }
}

/// The bundled plugin that evaluates arithmetic.
pub const CALCULATOR: &str = "calculator";

/// Whether a system prompt's tool listing names `tool` (any of `runner::ToolFormat`'s forms).
fn lists_tool(system: &str, tool: &str) -> bool {
    let signature = format!("- {tool}(");
    let json = format!("\"name\":\"{tool}\"");
    system.lines().any(|l| l.starts_with(&signature) || l.contains(&json))
}

fn clip(s: &str) -> String {
    s.chars().take(80).collect()
}

/// The turn index an oracle `<mem>` records.
fn progress(text: &str) -> Option<usize> {
    let turn = trace::parse(text);
    let mem = turn.mem()?;
    let rest = &mem[mem.find(PROGRESS)? + PROGRESS.len()..];
    rest.split('/').next()?.trim().parse().ok()
}

/// What a step does, once its dependencies are known (task files written before `action`
/// existed have only the plan-time description).
fn action(step: &Step) -> &str {
    if step.action.is_empty() { &step.description } else { &step.action }
}

fn call(step: &Step) -> String {
    let body = json!({"name": "search", "arguments": {"query": step.query}});
    format!("<tool_call>{body}</tool_call>")
}

/// The `calculator` call that adds a numeric task's values.
fn calculator_turn(compute: &Compute) -> String {
    let values: Vec<String> =
        compute.inputs["values"].as_array().into_iter().flatten().map(|v| v.to_string()).collect();
    let body = json!({"name": CALCULATOR, "arguments": {"expression": values.join(" + ")}});
    format!("<think>Exact arithmetic: add them with the calculator.</think>\n<tool_call>{body}</tool_call>")
}

/// The `create_and_execute_mcp` arguments that write a numeric task's tool and run it on the
/// task's values.
pub fn create_arguments(compute: &Compute) -> serde_json::Value {
    json!({
        "name": compute.name, "description": compute.description, "arguments": "values: list of integers",
        "returns": "their exact sum", "code": compute.code, "inputs": compute.inputs,
    })
}

/// SEARL's arithmetic turn: the listed tool written earlier called on the values (`reuse`), or
/// a new one written and run.
fn own_tool_turn(compute: &Compute, reuse: bool) -> String {
    if reuse {
        let body = json!({"name": compute.name, "arguments": compute.inputs});
        return format!(
            "<think>Exact arithmetic: {} is listed, call it.</think>\n<tool_call>{body}</tool_call>",
            compute.name
        );
    }
    let body = json!({"name": CREATE_TOOL, "arguments": create_arguments(compute)});
    format!("<think>Exact arithmetic: write a tool.</think>\n<tool_call>{body}</tool_call>")
}

/// The step the calculator carries out: its result is the answer.
fn sum_step(solution: &Solution, compute: &Compute, answer: &str) -> Step {
    let description = compute.description.trim_end_matches('.').to_string();
    Step {
        id: (solution.steps.len() + 1).to_string(),
        action: description.clone(),
        description,
        query: String::new(),
        depends_on: solution.steps.iter().map(|s| s.id.clone()).collect(),
        finding: format!("the calculator adds them to {answer}"),
        value: answer.to_string(),
    }
}

fn plan_of(solution: &Solution) -> Option<Plan> {
    let tasks = solution
        .steps
        .iter()
        .map(|s| plan::Task { id: s.id.clone(), description: s.description.clone(), depends_on: s.depends_on.clone() })
        .collect();
    Plan::new(tasks).ok()
}

/// The plan with the arithmetic as a last task that depends on every lookup.
fn with_compute(plan: &Plan, compute: &Compute) -> Plan {
    let mut tasks = plan.tasks().to_vec();
    let all: Vec<String> = tasks.iter().map(|t| t.id.clone()).collect();
    let id = (tasks.len() + 1).to_string();
    tasks.push(plan::Task { id, description: compute.description.trim_end_matches('.').to_string(), depends_on: all });
    Plan::new(tasks).unwrap_or_else(|_| plan.clone())
}

fn gap_plan(plan: &Plan) -> String {
    format!("<plan>\n{plan}</plan>")
}

fn searl_plan(plan: &Plan) -> String {
    let mut edges: Vec<String> = plan.edges().iter().map(|(from, to)| format!("(ST{from}, ST{to})")).collect();
    for t in plan.tasks() {
        let linked = plan.edges().iter().any(|(a, b)| *a == t.id || *b == t.id);
        if !linked {
            edges.push(format!("(ST{})", t.id));
        }
    }
    let mut s = format!("##DAG_LIST\n[{}]\n", edges.join(", "));
    for t in plan.tasks() {
        s.push_str(&format!("##ST{}: {}\n1. search for it.\n", t.id, t.description));
    }
    s
}

fn answer_turn(task: &Task, solution: &Solution, known: &[&Step], style: Mode) -> String {
    if style == Mode::Mem {
        // The memory already holds every result; restating them would grow the turn.
        return format!(
            "<think>Everything needed is in memory.</think>\n<answer>\\boxed{{{}}}</answer>",
            task.golden_answers[0]
        );
    }
    let facts: Vec<&str> = known.iter().map(|s| s.finding.as_str()).collect();
    let reason = match &solution.compute {
        Some(c) if style == Mode::Searl => {
            format!("{}; adding {} gives the total", facts.join("; "), c.inputs["values"])
        }
        _ => facts.join("; "),
    };
    format!("<think>{reason}.</think>\n<answer>\\boxed{{{}}}</answer>", task.golden_answers[0])
}

fn mem(turn: usize, total: usize, known: &[&Step]) -> String {
    // A summary keeps what later steps need: each step's result, not its prose.
    let facts: Vec<String> = known.iter().map(|s| format!("({}) {}", s.id, s.value)).collect();
    let facts = if facts.is_empty() { "nothing yet".to_string() } else { facts.join("; ") };
    format!("<mem>{PROGRESS}{turn}/{total}. Known: {facts}.</mem>\n")
}

/// The solution as turns in `style`; a numeric task's sum by `calculator` when there is one, or
/// in SEARL's style by a tool it writes (or calls, when one written earlier is listed: `reuse`).
fn script(task: &Task, solution: &Solution, style: Mode, calculator: bool, reuse: bool) -> Vec<String> {
    let Some(plan) = plan_of(solution) else { return Vec::new() };
    let levels: Vec<Vec<&Step>> =
        plan.levels().iter().map(|l| l.iter().map(|&i| &solution.steps[i]).collect()).collect();
    // SEARL's style writes its own tool for the arithmetic (below) instead.
    let sum = match &solution.compute {
        Some(c) if calculator && style != Mode::Searl => Some((c, sum_step(solution, c, &task.golden_answers[0]))),
        _ => None,
    };
    let mut turns = Vec::new();
    let mut known: Vec<&Step> = Vec::new();
    match style {
        Mode::React | Mode::Mem => {
            let flat: Vec<&Step> = levels.iter().flatten().copied().collect();
            let total = flat.len() + usize::from(sum.is_some()) + 1;
            let memory =
                |known: &[&Step]| if style == Mode::Mem { mem(known.len(), total, known) } else { String::new() };
            for step in &flat {
                turns.push(format!("{}<think>{}.</think>\n{}", memory(&known), action(step), call(step)));
                known.push(step);
            }
            if let Some((c, step)) = &sum {
                turns.push(memory(&known) + &calculator_turn(c));
                known.push(step);
            }
            turns.push(memory(&known) + &answer_turn(task, solution, &known, style));
        }
        Mode::Gap | Mode::Searl => {
            for (i, level) in levels.iter().enumerate() {
                let calls: Vec<String> = level.iter().map(|s| call(s)).collect();
                let what: Vec<&str> = level.iter().map(|s| action(s)).collect();
                let mut text = format!("<think>{}.</think>\n", what.join("; "));
                if i == 0 {
                    let written = match (style, &solution.compute) {
                        (Mode::Searl, Some(c)) => searl_plan(&with_compute(&plan, c)),
                        (Mode::Searl, None) => searl_plan(&plan),
                        (_, Some(c)) if sum.is_some() => gap_plan(&with_compute(&plan, c)),
                        _ => gap_plan(&plan),
                    };
                    text.push_str(&written);
                    text.push('\n');
                }
                text.push_str(&calls.join("\n"));
                turns.push(text);
                known.extend(level.iter().copied());
            }
            if let Some((c, step)) = &sum {
                turns.push(calculator_turn(c));
                known.push(step);
            }
            if let (Mode::Searl, Some(c)) = (style, &solution.compute) {
                turns.push(own_tool_turn(c, reuse));
            }
            turns.push(answer_turn(task, solution, &known, style));
        }
    }
    turns
}

impl Backend for Oracle {
    fn name(&self) -> String {
        format!("oracle:{}", self.style)
    }

    fn complete<'a>(
        &'a self,
        messages: &'a [Message],
        _options: &'a GenerateOptions,
    ) -> BoxFuture<'a, Result<Completion, BackendError>> {
        Box::pin(async move {
            let text = self.next_turn(messages)?;
            let prompt = render_prompt(&self.tokenizer, messages)?;
            let usage = Usage {
                prompt_tokens: self.tokenizer.encode(&prompt)?.len(),
                completion_tokens: self.tokenizer.encode(&text)?.len(),
            };
            Ok(Completion { text, usage, finish_reason: "stop".into(), tokens: None, raw: None })
        })
    }
}

/// Writes the tools an agent writes for `tasks` (each numeric task's sum, once per name) with
/// `create_and_execute_mcp`, as SEARL's style does, and installs them into `tools`: the listing
/// then names them, as a tool graph does once it has admitted them.
pub async fn install_own_tools(
    tools: &dyn crate::tools::Executor,
    tasks: &[Task],
) -> Result<(), toolsmith_contract::StructuredError> {
    let mut installed: Vec<&str> = Vec::new();
    for compute in tasks.iter().filter_map(|t| t.solution.as_ref()?.compute.as_ref()) {
        if installed.contains(&compute.name.as_str()) {
            continue;
        }
        let result = tools.call(CREATE_TOOL, &create_arguments(compute)).await;
        result.value?;
        let Some(tool) = result.created else {
            return Err(toolsmith_contract::StructuredError::new(
                toolsmith_contract::ErrorKind::ToolError,
                &compute.name,
                "create_and_execute_mcp ran but created no tool",
            ));
        };
        tools.install(&tool.manifest, Some(&tool.to_blob()))?;
        installed.push(&compute.name);
    }
    Ok(())
}

/// One synthesised supervised example.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SftExample {
    /// The id of the task the example was written for.
    pub id: String,
    /// The task's family, so a synthesised set can be counted or filtered by family.
    pub family: crate::env::Family,
    /// The style (mode) it is written in.
    pub style: Mode,
    /// Which of the trajectory's examples this is (MemPO episodes give one per turn).
    pub part: usize,
    /// The conversation: system, question, then assistant turns and observations.
    pub messages: Vec<Message>,
    /// The answer the conversation ends with, if it reaches one.
    pub answer: Option<String>,
    /// Whether it matches a golden answer.
    pub correct: bool,
}

/// Runs the oracle in each style on every task and returns the traces as chat conversations
/// (tools listed in `tool_format`): the supervised data the policy's first training stage learns
/// from.
pub async fn synthesize(
    oracle: &Oracle,
    tools: std::sync::Arc<dyn crate::tools::Executor>,
    tasks: &[Task],
    styles: &[Mode],
    tool_format: crate::runner::ToolFormat,
    mut on_done: impl FnMut(),
) -> Vec<SftExample> {
    let mut out = Vec::new();
    for &style in styles {
        let config = crate::runner::AgentConfig { mode: style, max_turns: 24, tool_format, ..Default::default() };
        let agent = crate::runner::Agent::new(Arc::new(oracle.with_style(style)), tools.clone(), config);
        for task in tasks.iter().filter(|t| t.solution.is_some()) {
            let t = agent.run(&task.question).await;
            let answer = t.answer.clone();
            let correct = crate::env::metrics::exact_match(answer.as_deref().unwrap_or(""), &task.golden_answers) > 0.0;
            for (part, messages) in t.examples().into_iter().enumerate() {
                out.push(SftExample {
                    id: task.id.clone(),
                    family: task.family,
                    style,
                    part,
                    messages,
                    answer: answer.clone(),
                    correct,
                });
            }
            on_done();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::{Family, World, WorldConfig};

    fn numeric_task() -> Task {
        let world = World::generate(WorldConfig::default());
        world.tasks().into_iter().find(|t| t.family == Family::Numeric).expect("the world has numeric tasks")
    }

    #[test]
    fn the_listing_decides_whether_the_oracle_adds_with_the_calculator() {
        assert!(lists_tool(
            "Tools:\n- search(query: string): Searches\n- calculator(expression: string): Evaluates",
            CALCULATOR
        ));
        assert!(lists_tool("Tools:\n{\"type\":\"function\",\"function\":{\"name\":\"calculator\"}}", CALCULATOR));
        // A mention in prose or another tool's name is not a listing.
        assert!(!lists_tool("Tools:\n- search(query: string): finds a calculator(s) manual", CALCULATOR));
        assert!(!lists_tool("Tools:\n- scientific_calculator(expression: string): x", CALCULATOR));
    }

    #[test]
    fn numeric_tasks_add_with_the_calculator_in_every_style_but_searl() {
        let task = numeric_task();
        let solution = task.solution.as_ref().expect("solution");
        let values: Vec<String> = solution.compute.as_ref().expect("compute").inputs["values"]
            .as_array()
            .expect("values")
            .iter()
            .map(|v| v.to_string())
            .collect();
        let expression = values.join(" + ");
        let answer = &task.golden_answers[0];
        let tokenizer = Arc::new(Tokenizer::tiny().expect("tokenizer"));
        for style in [Mode::React, Mode::Mem, Mode::Gap] {
            let oracle = Oracle::new(std::slice::from_ref(&task), style, tokenizer.clone());
            let with = oracle.turns(&task, |t| t == CALCULATOR);
            let without = oracle.turns(&task, |_| false);
            assert_eq!(with.len(), without.len() + 1, "{style}: one more turn, the call");
            let call = &with[with.len() - 2];
            assert!(call.contains(&format!("\"expression\":\"{expression}\"")), "{style}: {call}");
            assert!(!without.iter().any(|t| t.contains(CALCULATOR)), "{style}: {without:?}");
            let last = with.last().expect("an answer turn");
            assert!(last.ends_with(&format!("\\boxed{{{answer}}}</answer>")), "{style}: {last}");
            if style == Mode::Mem {
                // The memory before the answer holds the sum, under the calculator step's id.
                let id = solution.steps.len() + 1;
                assert!(last.contains(&format!("({id}) {answer}")), "{last}");
            }
            if style == Mode::Gap {
                // The plan lists the sum as a task that depends on every lookup.
                let plan = trace::parse(&with[0]).plan().expect("a plan").expect("a valid plan");
                let sum = plan.tasks().last().expect("tasks");
                let lookups: Vec<String> = solution.steps.iter().map(|s| s.id.clone()).collect();
                assert_eq!((plan.tasks().len(), &sum.depends_on), (lookups.len() + 1, &lookups), "{plan}");
            }
        }
        // SEARL's style writes its own tool whether or not the calculator is listed.
        let searl = Oracle::new(std::slice::from_ref(&task), Mode::Searl, tokenizer);
        assert_eq!(searl.turns(&task, |t| t == CALCULATOR), searl.turns(&task, |_| false));
    }

    #[test]
    fn searl_calls_a_listed_tool_it_wrote_before_instead_of_writing_it_again() {
        let task = numeric_task();
        let compute = task.solution.as_ref().and_then(|s| s.compute.clone()).expect("compute");
        let tokenizer = Arc::new(Tokenizer::tiny().expect("tokenizer"));
        let searl = Oracle::new(std::slice::from_ref(&task), Mode::Searl, tokenizer.clone());
        let writes = searl.turns(&task, |_| false);
        let reuses = searl.turns(&task, |t| t == compute.name);
        // The same turns but the arithmetic's: a call of the listed tool on the same values.
        assert_eq!(writes.len(), reuses.len());
        let differ: Vec<usize> = (0..writes.len()).filter(|&i| writes[i] != reuses[i]).collect();
        assert_eq!(differ, vec![writes.len() - 2]);
        let call = |text: &str| {
            let turn = trace::parse(text);
            assert!(turn.errors.is_empty(), "{text}: {:?}", turn.errors);
            let calls: Vec<trace::ToolCall> =
                turn.tool_calls().into_iter().collect::<Result<_, _>>().expect("calls parse");
            assert_eq!(calls.len(), 1, "{text}");
            (calls[0].name.clone(), serde_json::Value::Object(calls[0].arguments.clone()))
        };
        let (name, arguments) = call(&writes[writes.len() - 2]);
        assert_eq!((name.as_str(), &arguments["inputs"]), (CREATE_TOOL, &compute.inputs));
        assert_eq!(call(&reuses[reuses.len() - 2]), (compute.name.clone(), compute.inputs.clone()));
        // Other styles do not write tools, so a listed one changes nothing there.
        let gap = searl.with_style(Mode::Gap);
        assert_eq!(gap.turns(&task, |t| t == compute.name), gap.turns(&task, |_| false));
    }
}
