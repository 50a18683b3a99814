//! Teaching a policy to call a given set of tools from their interfaces alone (MTR's premise):
//! `toolsmith train tools`.
//!
//! - [`values`]: argument values drawn from a JSON Schema and checked against it.
//! - [`synthetic`]: seeded interfaces over many domains, split so that held-out domains and
//!   parameter names never appear in training.
//! - [`tasks`]: tasks with ground truth in five families (one tool, a choice among similar
//!   ones, parallel calls, two chained calls, and irrelevance), verbalised from the interfaces'
//!   descriptions in several phrasings.
//! - [`score`]: exact-call accuracy (AST-style: values compared by type, optional arguments
//!   may be omitted) and the fine-grained reward RL trains on (the `toolcall` method).
//! - [`episode`]: an episode of a task: the served prompt, the policy's turns, the observations.
//! - [`eval`]: accuracy by family, with and without schema-constrained decoding.
//! - [`pipeline`]: the whole command: tasks, SFT, RL, evaluation.
//!
//! A task is rendered with [`toolsmith_agent::function_calling`], the rendering the OpenAI
//! endpoint gives a request with `tools`, so the adapter serves the prompts it was trained on.

pub mod episode;
pub mod eval;
pub mod pipeline;
pub mod score;
pub mod synthetic;
pub mod tasks;
pub mod values;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use toolsmith_agent::backend::Message;
use toolsmith_agent::env::{Family, Task};
use toolsmith_agent::function_calling::{self, Function};
use toolsmith_contract::Manifest;

/// A tool as a task lists it: what the model reads, and the output schema its simulated answers
/// follow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interface {
    /// The name calls must give.
    pub name: String,
    /// What it does.
    pub description: String,
    /// The JSON Schema of its arguments.
    pub parameters: Value,
    /// The JSON Schema of its result.
    #[serde(default = "any_object")]
    pub output_schema: Value,
    /// Whether a real tool stands behind it (its results are the tool's own).
    #[serde(default)]
    pub real: bool,
    /// Arguments of the manifest's examples: what a real tool is known to accept, drawn from
    /// beside sampled values (a free-text `expression` sampled as words is nothing a calculator
    /// evaluates).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub examples: Vec<Value>,
}

fn any_object() -> Value {
    serde_json::json!({"type": "object"})
}

impl Interface {
    /// A registered tool's interface.
    pub fn from_manifest(m: &Manifest, real: bool) -> Self {
        Interface {
            name: m.name.as_str().to_string(),
            description: m.description.clone(),
            parameters: m.input_schema.clone(),
            output_schema: m.output_schema.clone(),
            real,
            examples: m.examples.iter().map(|e| e.input.clone()).filter(Value::is_object).collect(),
        }
    }

    /// As a manifest (what the ToolActor simulates), its name in snake_case.
    pub fn manifest(&self) -> Result<Manifest, String> {
        // Manifest names are snake_case; the name only labels the simulation's prompt.
        let name = tasks::humanize(&self.name).to_lowercase().replace(' ', "_");
        serde_json::from_value(serde_json::json!({
            "name": name, "version": "0.0.0", "description": self.description,
            "input_schema": self.parameters, "output_schema": self.output_schema, "kind": "simulated"}))
        .map_err(|e| format!("`{}` cannot be simulated: {e}", self.name))
    }

    /// As the shared rendering takes it.
    pub fn function(&self) -> Function<'_> {
        Function { name: &self.name, description: &self.description, parameters: &self.parameters }
    }
}

/// What kind of call a task asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CallFamily {
    /// One tool listed, one call.
    Single,
    /// The right tool among similar ones (retrieved distractors).
    Choice,
    /// Two calls in one turn.
    Parallel,
    /// Two turns: the second call takes a value from the first one's result.
    Chained,
    /// No listed tool fits: the right answer is no call.
    Irrelevant,
}

impl CallFamily {
    /// Every family, in report order.
    pub const ALL: [CallFamily; 5] =
        [CallFamily::Single, CallFamily::Choice, CallFamily::Parallel, CallFamily::Chained, CallFamily::Irrelevant];

    /// Its name in files and tables.
    pub fn name(self) -> &'static str {
        match self {
            CallFamily::Single => "single",
            CallFamily::Choice => "choice",
            CallFamily::Parallel => "parallel",
            CallFamily::Chained => "chained",
            CallFamily::Irrelevant => "irrelevant",
        }
    }
}

/// One expected call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GoldenCall {
    /// The tool.
    pub name: String,
    /// The arguments the request states.
    pub arguments: Map<String, Value>,
}

/// A task with its ground truth.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallTask {
    /// Unique in its set.
    pub id: String,
    /// Its family.
    pub family: CallFamily,
    /// What the user asks.
    pub request: String,
    /// The tools listed, in listing order.
    pub tools: Vec<Interface>,
    /// The calls each turn must make (one empty turn: no call at all).
    pub turns: Vec<Vec<GoldenCall>>,
    /// What each golden call returns, turn by turn (the turn after sees them).
    pub observations: Vec<Vec<Value>>,
    /// The reply after the last turn's results (or the refusal of an irrelevant request).
    pub answer: String,
}

impl CallTask {
    /// The system prompt: the served endpoint's, over the listed tools.
    pub fn system(&self) -> String {
        let functions: Vec<Function<'_>> = self.tools.iter().map(Interface::function).collect();
        function_calling::system_prompt(&functions)
    }

    /// A listed tool by name.
    pub fn tool(&self, name: &str) -> Option<&Interface> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// The golden conversation: what SFT trains on.
    pub fn chat(&self) -> Vec<Message> {
        let mut messages = vec![Message::system(self.system()), Message::user(&self.request)];
        for (i, turn) in self.turns.iter().enumerate() {
            if turn.is_empty() {
                break;
            }
            let text: Vec<String> = turn
                .iter()
                .map(|c| function_calling::call_text(&c.name, &Value::Object(c.arguments.clone())))
                .collect();
            messages.push(Message::assistant(text.join("\n")));
            let seen = self.observations.get(i).map(Vec::as_slice).unwrap_or_default();
            let obs: Vec<String> =
                turn.iter().zip(seen).map(|(c, r)| function_calling::observation_text(&c.name, r)).collect();
            messages.push(Message::user(obs.join("\n")));
        }
        messages.push(Message::assistant(&self.answer));
        messages
    }

    /// As the RL trainer's task: the question is the request, and the one golden answer is this
    /// task as JSON, which the `toolcall` method's reward reads back.
    pub fn to_task(&self) -> Task {
        Task {
            id: self.id.clone(),
            family: Family::Custom,
            question: self.request.clone(),
            golden_answers: vec![serde_json::to_string(self).unwrap_or_default()],
            objectives: 1,
            solution: None,
        }
    }

    /// The task a trainer's task carries (see [`CallTask::to_task`]).
    pub fn from_golden(golden: &[String]) -> Option<CallTask> {
        golden.first().and_then(|g| serde_json::from_str(g).ok())
    }
}

/// Reads a JSON-lines file of tasks.
pub fn read_tasks(path: &std::path::Path) -> Result<Vec<CallTask>, crate::TrainError> {
    let text = crate::conversation::read_regular_file(path)?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| crate::TrainError::Data {
                path: path.to_owned(),
                line: i + 1,
                message: format!("not a tool-call task: {e}"),
            })
        })
        .collect()
}

/// Writes tasks as JSON lines.
pub fn write_tasks(path: &std::path::Path, tasks: &[CallTask]) -> Result<(), crate::TrainError> {
    write_lines(path, tasks)
}

/// Writes anything serialisable as JSON lines.
pub(crate) fn write_lines<T: Serialize>(path: &std::path::Path, items: &[T]) -> Result<(), crate::TrainError> {
    let mut text = String::new();
    for item in items {
        text.push_str(&serde_json::to_string(item).map_err(|e| crate::TrainError::Config(e.to_string()))?);
        text.push('\n');
    }
    std::fs::write(path, text).map_err(|e| crate::TrainError::io(path, e))
}
