//! The agent loop: prompt, turn, tool calls, observation, until an answer or the turn budget.
//!
//! Modes: `react` (one call per turn, full history), `gap` (a dependency-graph plan, then every
//! call of a level in one turn, run concurrently; full history) and `mem` (MemPO: the context is
//! the question, the latest `<mem>` and the last step only). Each step records its prompt and
//! response tokens, so total (TT) and peak (PT) tokens per trajectory follow.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolsmith_contract::{Manifest, ToolKind};
use toolsmith_registry::PlanStep;

use crate::backend::{Backend, BoxFuture, GenerateOptions, Message, TurnTokens};
use crate::plan::Plan;
use crate::schedule::{CallRecord, Scheduler};
use crate::tools::Executor;
use crate::trace::{self, Tag};

/// How the agent works.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// ReAct: one call per turn, full history.
    React,
    /// GAP: a dependency graph, then each level's calls in parallel in one turn.
    Gap,
    /// MemPO: a self-written `<mem>` replaces the history.
    Mem,
    /// SEARL: a `##DAG_LIST` plan, run level by level, creating Python tools where they help.
    Searl,
}

impl Mode {
    /// Every mode, for evaluating all of them and for the command line's choices.
    pub const ALL: [Mode; 4] = [Mode::React, Mode::Gap, Mode::Mem, Mode::Searl];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Mode::React => "react",
            Mode::Gap => "gap",
            Mode::Mem => "mem",
            Mode::Searl => "searl",
        }
    }

    /// The mode a command-line name stands for, or `None` for an unknown name.
    pub fn parse(name: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.name() == name)
    }

    /// How much of the history the model sees.
    pub fn context(self) -> ContextPolicy {
        match self {
            Mode::Mem => ContextPolicy::Memory,
            _ => ContextPolicy::Full,
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the model sees of the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContextPolicy {
    /// Every turn and observation.
    Full,
    /// The question, the latest `<mem>` and the last step (MemPO).
    Memory,
}

/// Retrieves tools for texts (the question, a plan's tasks).
pub trait Retriever: Send + Sync + fmt::Debug {
    /// The best `k` tools for the queries together.
    fn retrieve<'a>(&'a self, queries: &'a [String], k: usize) -> BoxFuture<'a, Vec<Manifest>>;
}

/// The agent's settings.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The method the agent follows, which sets its prompt and context.
    pub mode: Mode,
    /// The turn budget (B): an episode that has not answered by then ends as `Budget`.
    pub max_turns: usize,
    /// Sampling settings for every turn (each turn's seed is derived from the episode's).
    pub generate: GenerateOptions,
    /// Calls at once and per-call timeout.
    pub scheduler: Scheduler,
    /// How many tools one retrieval (for the question, then for the plan's tasks) adds to the
    /// listing, when the agent has a retriever.
    pub top_k: usize,
    /// How tools are listed in the system prompt. By default [`ToolFormat::Compact`].
    pub tool_format: ToolFormat,
}

/// How the system prompt lists tools.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ToolFormat {
    /// One line per tool: `- name(arg: type, opt?: type): description`. About a sixth of the
    /// tokens of the JSON form, which matters for small models: with the JSON form the bundled
    /// tools alone took ~1,950 of the tiny model's 2,048 positions.
    #[default]
    Compact,
    /// OpenAI function definitions, one JSON object per line (what large chat models are tuned on).
    Json,
    /// The compact signature with the description cut to its first clause (at most ten words):
    /// about a third of the compact form's tokens. For models trained from scratch on traces,
    /// where every prompt token is compute spent on text that never changes.
    Brief,
}

impl ToolFormat {
    /// Parses `compact`, `json` or `brief`.
    pub fn parse(name: &str) -> Option<ToolFormat> {
        match name {
            "compact" => Some(ToolFormat::Compact),
            "json" => Some(ToolFormat::Json),
            "brief" => Some(ToolFormat::Brief),
            _ => None,
        }
    }
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            mode: Mode::Gap,
            max_turns: 12,
            generate: GenerateOptions::default(),
            scheduler: Scheduler::default(),
            top_k: 5,
            tool_format: ToolFormat::default(),
        }
    }
}

/// An agent: a backend, tools, optionally a retriever.
#[derive(Debug, Clone)]
pub struct Agent {
    backend: Arc<dyn Backend>,
    tools: Arc<dyn Executor>,
    retriever: Option<Arc<dyn Retriever>>,
    config: AgentConfig,
}

/// Why an episode ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Finish {
    /// The agent answered.
    Answered,
    /// The turn budget ran out.
    Budget,
    /// The backend failed.
    BackendError(String),
}

/// One turn of a trajectory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StepRecord {
    /// The turn as text in the trace grammar.
    pub text: String,
    /// Tokens of the context it saw.
    pub prompt_tokens: usize,
    /// Tokens of the turn itself.
    pub response_tokens: usize,
    /// The calls of the turn.
    pub calls: Vec<CallRecord>,
    /// What the runtime told the model afterwards (observations and errors).
    pub observation: String,
    /// Syntax and plan problems of the turn.
    pub errors: Vec<String>,
    /// Milliseconds the backend took for the turn, apart from the tools' time.
    pub model_ms: f64,
    /// The system prompt of this turn when it differs from the previous turn's (the first
    /// turn's is always kept): retrieved tools join the listing once a plan names its tasks, and
    /// a turn must be scored under the prompt it saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// The sampled tokens and their behaviour log-probs, when the backend reports them (the
    /// local policy does): later turns' prompts and the trainer use these ids, never the text
    /// tokenized again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TurnTokens>,
    /// What the model returned when it was not text of the trace grammar (an OpenAI endpoint's
    /// message with native `tool_calls`); [`StepRecord::text`] is that message as a grammar turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<Value>,
}

impl StepRecord {
    /// The turn as the assistant message later prompts show: its sampled ids when known.
    pub fn message(&self) -> Message {
        match &self.tokens {
            Some(t) => Message::sampled(&self.text, t.content_ids().to_vec()),
            None => Message::assistant(&self.text),
        }
    }
}

/// A whole episode.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Trajectory {
    /// The question the episode answered.
    pub question: String,
    /// The method it followed, which decides how its contexts are rebuilt.
    pub mode: Mode,
    /// The backend's label, for reports.
    pub backend: String,
    /// Every turn with its calls and observation, in order.
    pub steps: Vec<StepRecord>,
    /// The plan, if the agent wrote a valid one.
    pub plan: Option<Plan>,
    /// The answer the episode ended with, which evaluation grades against the golden answers.
    pub answer: Option<String>,
    /// Whether it answered, ran out of turns or hit a backend error.
    pub finish: Finish,
    /// Tools listed in the prompt (retrieved ones included).
    pub tools: Vec<String>,
    /// The system prompt of the last turn (earlier ones are kept in the steps where they changed).
    pub system: String,
    /// Milliseconds from start to finish.
    pub wall_ms: f64,
}

impl Trajectory {
    /// How many turns the episode took.
    pub fn turns(&self) -> usize {
        self.steps.len()
    }

    /// Total tokens (TT): every step's context plus its response.
    pub fn total_tokens(&self) -> usize {
        self.steps.iter().map(|s| s.prompt_tokens + s.response_tokens).sum()
    }

    /// Peak tokens (PT): the largest context plus response of one step.
    pub fn peak_tokens(&self) -> usize {
        self.steps.iter().map(|s| s.prompt_tokens + s.response_tokens).max().unwrap_or(0)
    }

    /// Tokens the model wrote over the whole episode.
    pub fn response_tokens(&self) -> usize {
        self.steps.iter().map(|s| s.response_tokens).sum()
    }

    /// The whole episode as chat messages (system, question, then each turn and its
    /// observation): supervised data, with the observations to be masked from the loss.
    pub fn messages(&self) -> Vec<Message> {
        let mut m = context(ContextPolicy::Full, &self.system, &self.question, &self.steps);
        // The last observation follows the answer and teaches nothing.
        if self.finish == Finish::Answered {
            m.pop();
        }
        m
    }

    /// Supervised conversations as the model saw them: one for a full-history episode; for a
    /// MemPO episode, one per turn (question, latest memory, last step, then the turn), since
    /// that is all the model sees at inference.
    pub fn examples(&self) -> Vec<Vec<Message>> {
        match self.mode.context() {
            ContextPolicy::Full => vec![self.messages()],
            ContextPolicy::Memory => (0..self.steps.len())
                .map(|i| {
                    let mut m = context(ContextPolicy::Memory, &self.system, &self.question, &self.steps[..i]);
                    m.push(self.steps[i].message());
                    m
                })
                .collect(),
        }
    }

    /// The messages the model saw before each turn, rebuilt from the record (each turn under
    /// its own system prompt; sampled turns as their ids).
    pub fn contexts(&self) -> Vec<Vec<Message>> {
        let mut system = self.system.as_str();
        (0..self.steps.len())
            .map(|i| {
                if let Some(s) = &self.steps[i].system {
                    system = s;
                }
                context(self.mode.context(), system, &self.question, &self.steps[..i])
            })
            .collect()
    }

    /// Every call of every turn, in the order they were made.
    pub fn calls(&self) -> impl Iterator<Item = &CallRecord> {
        self.steps.iter().flat_map(|s| s.calls.iter())
    }

    /// Tools created by `create_and_execute_mcp` that ran: the trajectory's candidates.
    pub fn created_tools(&self) -> Vec<&toolsmith_sandbox::python::create::PythonTool> {
        self.calls().filter_map(|c| c.created.as_ref()).collect()
    }

    /// The plan's tasks bound to the tools that carried them out, for the tool graph's edges.
    pub fn plan_steps(&self) -> Vec<PlanStep> {
        let Some(plan) = &self.plan else { return Vec::new() };
        // A call that created a tool carried out its task with that tool.
        let tool_of: BTreeMap<&str, &str> = self
            .calls()
            .filter_map(|c| {
                let tool = c.created.as_ref().map_or(c.name.as_str(), |t| t.manifest.name.as_str());
                c.task.as_deref().map(|t| (t, tool))
            })
            .collect();
        plan.tasks()
            .iter()
            .filter_map(|t| {
                tool_of.get(t.id.as_str()).map(|tool| PlanStep {
                    id: t.id.clone(),
                    tool: (*tool).to_string(),
                    depends_on: t.depends_on.clone(),
                })
            })
            .collect()
    }
}

/// The instructions for a mode, with the tools listed in `format`.
pub fn system_prompt(mode: Mode, tools: &[Manifest], format: ToolFormat) -> String {
    let mut s = String::from("You answer questions with tools. Think in <think>...</think>. ");
    s.push_str(CALL_INSTRUCTIONS);
    s.push(' ');
    s.push_str(match mode {
        Mode::React => "Call one tool per turn.",
        Mode::Gap => "First write a plan of sub-tasks with dependencies: <plan>Task 1: ... - Dependencies: none</plan>. Then, each turn, call every task whose dependencies are done, as several <tool_call> blocks; they run in parallel.",
        Mode::Mem => "Begin every turn with <mem>...</mem>: everything you know so far. Only the question, your latest memory and the last step are kept.",
        Mode::Searl => "Plan with ##DAG_LIST [(ST1, ST2)] and ##STn: sections. Call independent steps together. For exact computation, write a tool with create_and_execute_mcp.",
    });
    s.push_str(" When you know the answer, write <answer>\\boxed{answer}</answer>.\nTools:\n");
    for t in tools {
        s.push_str(&tool_line(t.name.as_str(), &t.description, &t.input_schema, format));
        s.push('\n');
    }
    s
}

/// The preamble every mode's system prompt starts with: how to call a tool and how results come
/// back. The served endpoint opens a client's tool listing with it, so that a policy trained on
/// the agent's prompts reads an OpenAI `tools` list as it reads its own.
pub const CALL_INSTRUCTIONS: &str = "Call a tool with <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>; each result comes back in <observation>.";

/// One tool's line in a listing: a name, a description and an input schema in `format` (names
/// are taken as they are, so OpenAI function names the registry would refuse list too).
pub fn tool_line(name: &str, description: &str, input_schema: &Value, format: ToolFormat) -> String {
    match format {
        ToolFormat::Json => serde_json::json!({
            "type": "function",
            "function": {"name": name, "description": description, "parameters": input_schema},
        })
        .to_string(),
        ToolFormat::Compact => compact_signature(name, input_schema, description),
        ToolFormat::Brief => compact_signature(name, input_schema, first_clause(description)),
    }
}

/// A description's first clause: up to the first `.`, `,`, `;`, `:` or `(`, and ten words at
/// most.
fn first_clause(description: &str) -> &str {
    let text = description.trim();
    let mut end = text.find(['.', ',', ';', ':', '(']).unwrap_or(text.len());
    if let Some((i, _)) = text[..end].match_indices(' ').nth(9) {
        end = i;
    }
    text[..end].trim_end()
}

/// `- name(arg: type, opt?: type): description` from an input schema.
fn compact_signature(name: &str, schema: &Value, description: &str) -> String {
    let required: HashSet<&str> =
        schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    let args: Vec<String> = schema
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(name, prop)| {
            let optional = if required.contains(name.as_str()) { "" } else { "?" };
            format!("{name}{optional}: {}", type_name(prop))
        })
        .collect();
    format!("- {name}({}): {}", args.join(", "), description.trim())
}

/// A short type for a property schema: `string`, `integer[]`, `"a"|"b"`, `object`.
fn type_name(schema: &Value) -> String {
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        return options.iter().map(Value::to_string).collect::<Vec<_>>().join("|");
    }
    match schema.get("type") {
        Some(Value::String(t)) if t == "array" => {
            format!("{}[]", schema.get("items").map_or_else(|| "any".to_string(), type_name))
        }
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("|"),
        _ => "any".into(),
    }
}

/// The messages the model sees before its next turn.
pub fn context(policy: ContextPolicy, system: &str, question: &str, steps: &[StepRecord]) -> Vec<Message> {
    let mut messages = vec![Message::system(system)];
    match policy {
        ContextPolicy::Full => {
            messages.push(Message::user(question));
            for s in steps {
                messages.push(s.message());
                messages.push(Message::user(&s.observation));
            }
        }
        ContextPolicy::Memory => {
            let last = steps.last();
            // The newest step with a memory, parsed once each from the end.
            let latest = steps
                .iter()
                .enumerate()
                .rev()
                .find_map(|(i, s)| trace::parse(&s.text).mem().map(|m| (i, m.to_string())));
            match latest {
                // The latest memory is not in the last step: carry it with the question.
                Some((i, mem)) if i + 1 < steps.len() => {
                    messages.push(Message::user(format!("{question}\n<mem>{mem}</mem>")))
                }
                _ => messages.push(Message::user(question)),
            }
            if let Some(s) = last {
                messages.push(s.message());
                messages.push(Message::user(&s.observation));
            }
        }
    }
    messages
}

/// How observations are shown: one `<observation>` per call.
pub fn observation(calls: &[CallRecord], errors: &[String]) -> String {
    let mut parts: Vec<String> = calls
        .iter()
        .map(|c| {
            let body = serde_json::json!({ "name": c.name, "result": c.result });
            format!("<{o}>{body}</{o}>", o = Tag::Observation.name())
        })
        .collect();
    for e in errors {
        parts.push(format!("<{o}>{{\"error\": {}}}</{o}>", Value::String(e.clone()), o = Tag::Observation.name()));
    }
    parts.join("\n")
}

impl Agent {
    /// An agent over `backend` and `tools`.
    pub fn new(backend: Arc<dyn Backend>, tools: Arc<dyn Executor>, config: AgentConfig) -> Self {
        Agent { backend, tools, retriever: None, config }
    }

    /// Retrieves tools for the question and the plan's tasks instead of listing every tool.
    pub fn with_retriever(mut self, retriever: Arc<dyn Retriever>) -> Self {
        self.retriever = Some(retriever);
        self
    }

    /// The settings this agent runs episodes with.
    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    async fn listed_tools(&self, queries: &[String], listed: &mut Vec<Manifest>) {
        let Some(retriever) = &self.retriever else {
            if listed.is_empty() {
                *listed = self.tools.manifests();
            }
            return;
        };
        if listed.is_empty() {
            // Host tools (search, create_and_execute_mcp) are always listed.
            listed.extend(self.tools.manifests().into_iter().filter(|m| m.kind == ToolKind::Native));
        }
        for m in retriever.retrieve(queries, self.config.top_k).await {
            if !listed.iter().any(|l| l.name == m.name) {
                listed.push(m);
            }
        }
    }

    /// Runs one episode on `question` to an answer, the turn budget or a backend error; it never
    /// fails, since each of those is recorded in the trajectory.
    pub async fn run(&self, question: &str) -> Trajectory {
        let started = Instant::now();
        let mode = self.config.mode;
        let mut listed = Vec::new();
        self.listed_tools(&[question.to_string()], &mut listed).await;
        let mut steps: Vec<StepRecord> = Vec::new();
        let mut plan: Option<Plan> = None;
        // The plan level the next calls belong to.
        let mut level = 0;
        // Plan tasks already carried out by a successful call.
        let mut bound: HashSet<String> = HashSet::new();
        let mut answer = None;
        let mut finish = Finish::Budget;
        let mut system = String::new();
        let mut previous_system = String::new();
        for turn_index in 0..self.config.max_turns {
            system = system_prompt(mode, &listed, self.config.tool_format);
            let messages = context(mode.context(), &system, question, &steps);
            let model_started = Instant::now();
            // A seed per turn: with one seed for every turn, a sampled episode would repeat its
            // draws, and a group of episodes with consecutive seeds would share them.
            let options = self.config.generate.for_turn(turn_index);
            // The listed tools go to the backend too: one that can hand them to the model as a
            // structured list (OpenAI `tools`) does, the others ignore them.
            let completion = match self.backend.complete_with_tools(&messages, &listed, &options).await {
                Ok(c) => c,
                Err(e) => {
                    finish = Finish::BackendError(e.to_string());
                    break;
                }
            };
            let model_ms = model_started.elapsed().as_secs_f64() * 1e3;
            let turn = trace::parse(&completion.text);
            let mut errors: Vec<String> = turn.errors.iter().map(ToString::to_string).collect();
            if plan.is_none() {
                match turn.plan() {
                    Some(Ok(p)) => {
                        let texts: Vec<String> = p.tasks().iter().map(|t| t.description.clone()).collect();
                        self.listed_tools(&texts, &mut listed).await;
                        plan = Some(p);
                    }
                    Some(Err(e)) => errors.push(e.to_string()),
                    None => {}
                }
            }
            let mut calls = Vec::new();
            for c in turn.tool_calls() {
                match c {
                    Ok(c) => calls.push((c.name, Value::Object(c.arguments))),
                    Err(e) => errors.push(e.to_string()),
                }
            }
            if mode == Mode::React && calls.len() > 1 {
                errors.push(format!("react mode runs one call per turn; {} calls were not run", calls.len() - 1));
                calls.truncate(1);
            }
            let final_answer = turn.final_answer();
            let mut records = if calls.is_empty() {
                Vec::new()
            } else {
                self.config.scheduler.run_level(&self.tools, calls, level).await
            };
            if !records.is_empty() {
                if let Some(p) = &plan {
                    bind_tasks(p, &mut bound, &mut records);
                }
                level += 1;
            }
            if records.is_empty() && final_answer.is_none() && errors.is_empty() {
                errors.push("write a <tool_call> or an <answer>".into());
            }
            let observation = observation(&records, &errors);
            let changed_system = (steps.is_empty() || previous_system != system).then(|| system.clone());
            steps.push(StepRecord {
                text: completion.text,
                prompt_tokens: completion.usage.prompt_tokens,
                response_tokens: completion.usage.completion_tokens,
                calls: records,
                observation,
                errors,
                model_ms,
                system: changed_system,
                tokens: completion.tokens,
                raw: completion.raw,
            });
            previous_system.clone_from(&system);
            if let Some(a) = final_answer {
                answer = Some(a);
                finish = Finish::Answered;
                break;
            }
        }
        Trajectory {
            question: question.to_string(),
            mode,
            backend: self.backend.name(),
            steps,
            plan,
            answer,
            finish,
            tools: listed.iter().map(|m| m.name.as_str().to_string()).collect(),
            system,
            wall_ms: started.elapsed().as_secs_f64() * 1e3,
        }
    }
}

/// Assigns a turn's successful calls, in order, to the plan's ready tasks (not yet carried out,
/// every dependency carried out), in plan order. Failed calls and retries bind nothing new.
fn bind_tasks(plan: &Plan, bound: &mut HashSet<String>, records: &mut [CallRecord]) {
    let ready: Vec<&str> = plan
        .tasks()
        .iter()
        .filter(|t| !bound.contains(&t.id) && t.depends_on.iter().all(|d| bound.contains(d)))
        .map(|t| t.id.as_str())
        .collect();
    let mut ready = ready.into_iter();
    for record in records.iter_mut().filter(|r| r.ok()) {
        let Some(id) = ready.next() else { break };
        record.task = Some(id.to_string());
    }
    for record in records.iter() {
        if let Some(t) = &record.task {
            bound.insert(t.clone());
        }
    }
}
