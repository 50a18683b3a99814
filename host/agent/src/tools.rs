//! The tools an agent can call: the local search tool, sandboxed plugin and Python tools, SEARL's
//! `create_and_execute_mcp`, and simulated tools (interfaces answered by a [`Simulator`]).
//! Every call is checked against the tool's schemas before and after it runs.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolsmith_contract::{ErrorKind, Manifest, Provenance, StructuredError, ToolKind};
use toolsmith_sandbox::python::create::{CreateRequest, PythonTool};
use toolsmith_sandbox::validate::ToolSchemas;
use toolsmith_sandbox::{Limits, Tool, Toolbox, not_found_error};

use crate::backend::BoxFuture;
use crate::env::Corpus;
use crate::env::corpus::search_manifest;

/// The name of SEARL's meta tool, through which the agent writes a Python tool and runs it.
pub const CREATE_TOOL: &str = "create_and_execute_mcp";

/// The outcome of one call, as the runtime records it.
#[derive(Debug, Clone)]
pub struct ToolResult {
    /// The validated result, or the structured error the agent sees.
    pub value: Result<Value, StructuredError>,
    /// A tool `create_and_execute_mcp` created (a candidate of the trajectory).
    pub created: Option<PythonTool>,
}

impl ToolResult {
    pub(crate) fn of(value: Result<Value, StructuredError>) -> Self {
        ToolResult { value, created: None }
    }
}

/// Answers calls to simulated tools (MTR's ToolActor).
pub trait Simulator: Send + Sync + std::fmt::Debug {
    /// An observation for `args` that validates against `manifest.output_schema`.
    fn simulate<'a>(&'a self, manifest: &'a Manifest, args: &'a Value)
    -> BoxFuture<'a, Result<Value, StructuredError>>;
}

/// What the scheduler hands calls to: the local tools ([`LocalTools`]) or an MCP server's
/// ([`crate::mcp_client::McpTools`]).
pub trait Executor: Send + Sync + std::fmt::Debug {
    /// The tools it can run.
    fn manifests(&self) -> Vec<Manifest>;

    /// Runs one call.
    fn call<'a>(&'a self, name: &'a str, args: &'a Value) -> BoxFuture<'a, ToolResult>;

    /// Makes a stored tool callable: its manifest and the blob it runs from, as a registry keeps
    /// them (how training installs the tools it admitted). By default this executor cannot.
    fn install(&self, manifest: &Manifest, _blob: Option<&[u8]>) -> Result<(), StructuredError> {
        Err(StructuredError::new(
            ErrorKind::InvalidComponent,
            manifest.name.as_str(),
            "this executor cannot install tools",
        ))
    }
}

/// How a call's schemas judged it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Arguments and result validated.
    Valid,
    /// The arguments did not validate; the tool did not run.
    InvalidArgs,
    /// The tool's result did not validate.
    InvalidOutput,
    /// No such tool.
    NotFound,
    /// The call ran past its deadline.
    Timeout,
    /// The tool failed (trap, out of memory, its own error).
    Failed,
}

impl Verdict {
    /// The verdict for a call's outcome.
    pub fn of(outcome: &Result<Value, StructuredError>) -> Verdict {
        match outcome {
            Ok(_) => Verdict::Valid,
            Err(e) => match e.kind {
                ErrorKind::InvalidArgs => Verdict::InvalidArgs,
                ErrorKind::InvalidOutput => Verdict::InvalidOutput,
                ErrorKind::NotFound => Verdict::NotFound,
                ErrorKind::Timeout => Verdict::Timeout,
                _ => Verdict::Failed,
            },
        }
    }
}

struct Checked {
    manifest: Manifest,
    schemas: ToolSchemas,
}

/// The tools of one environment: a corpus search tool, a toolbox (plugins, Python tools and
/// `create_and_execute_mcp` when it has a Python runtime) and simulated tools.
#[derive(Default)]
pub struct LocalTools {
    corpus: Option<(Arc<Corpus>, Checked)>,
    toolbox: Option<Toolbox>,
    simulated: RwLock<BTreeMap<String, Arc<Checked>>>,
    simulator: Option<Arc<dyn Simulator>>,
    /// Tools installed into this executor only ([`Executor::install`]), run in the toolbox's
    /// sandbox but not added to its table, which other executors (held-out evaluation) share.
    installed: RwLock<BTreeMap<String, Arc<Tool>>>,
    limits: Limits,
}

impl std::fmt::Debug for LocalTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalTools").field("tools", &self.manifests().len()).finish()
    }
}

impl LocalTools {
    /// An executor with no tools yet, to build up with the `with_*` methods.
    pub fn new() -> Self {
        LocalTools::default()
    }

    /// Adds the `search` tool over `corpus`.
    pub fn with_corpus(mut self, corpus: Arc<Corpus>) -> Self {
        let manifest = search_manifest();
        #[allow(clippy::expect_used)] // A constant schema, compiled by the tests.
        let schemas =
            ToolSchemas::compile(&manifest.input_schema, &manifest.output_schema).expect("search schemas compile");
        self.corpus = Some((corpus, Checked { manifest, schemas }));
        self
    }

    /// Adds every tool of `toolbox` (and `create_and_execute_mcp` if it has a Python runtime).
    pub fn with_toolbox(mut self, toolbox: Toolbox, limits: Limits) -> Self {
        self.toolbox = Some(toolbox);
        self.limits = limits;
        self
    }

    /// Sets who answers simulated tools.
    pub fn with_simulator(mut self, simulator: Arc<dyn Simulator>) -> Self {
        self.simulator = Some(simulator);
        self
    }

    /// Adds a simulated tool (an interface only). Its schemas must compile.
    pub fn add_simulated(&self, manifest: Manifest) -> Result<(), StructuredError> {
        let schemas = ToolSchemas::compile(&manifest.input_schema, &manifest.output_schema).map_err(|e| {
            StructuredError::new(ErrorKind::InvalidArgs, manifest.name.as_str(), format!("invalid schema: {e}"))
        })?;
        let mut table = toolsmith_contract::sync::write(&self.simulated);
        table.insert(manifest.name.as_str().to_string(), Arc::new(Checked { manifest, schemas }));
        Ok(())
    }

    fn has_python(&self) -> bool {
        self.toolbox.as_ref().is_some_and(|t| t.python().is_some())
    }

    fn simulated(&self, name: &str) -> Option<Arc<Checked>> {
        toolsmith_contract::sync::read(&self.simulated).get(name).cloned()
    }
}

/// The manifest of `create_and_execute_mcp` as agents see it.
pub fn create_tool_manifest() -> Manifest {
    let input_schema = toolsmith_contract::schemas::tool_schema_for::<CreateRequest>();
    Manifest {
        #[allow(clippy::expect_used)] // A constant, valid name.
        name: toolsmith_contract::ToolName::new(CREATE_TOOL).expect("valid name"),
        version: "0.1.0".into(),
        description: "Write a new Python tool: define a function, run it once on inputs, and get {creation_success, execution_result, stdout, stderr, error}. Use it for exact computation no listed tool does.".into(),
        input_schema,
        output_schema: toolsmith_contract::schemas::tool_schema_for::<toolsmith_sandbox::python::create::CreateResult>(),
        examples: Vec::new(),
        kind: ToolKind::Native,
        provenance: Provenance::default(),
        capabilities: Default::default(),
    }
}

impl Executor for LocalTools {
    fn manifests(&self) -> Vec<Manifest> {
        let mut out = Vec::new();
        if let Some((_, c)) = &self.corpus {
            out.push(c.manifest.clone());
        }
        if let Some(t) = &self.toolbox {
            out.extend(t.tools().iter().map(|t| t.manifest.clone()));
        }
        if self.has_python() {
            out.push(create_tool_manifest());
        }
        out.extend(toolsmith_contract::sync::read(&self.installed).values().map(|t| t.manifest.clone()));
        out.extend(toolsmith_contract::sync::read(&self.simulated).values().map(|c| c.manifest.clone()));
        out
    }

    fn install(&self, manifest: &Manifest, blob: Option<&[u8]>) -> Result<(), StructuredError> {
        let name = manifest.name.as_str();
        let toolbox = self.toolbox.as_ref().ok_or_else(|| {
            StructuredError::new(ErrorKind::InvalidComponent, name, "these tools have no sandbox to run it in")
        })?;
        let tool = toolbox.load_stored(manifest, blob)?;
        toolsmith_contract::sync::write(&self.installed).insert(name.to_string(), tool);
        Ok(())
    }

    fn call<'a>(&'a self, name: &'a str, args: &'a Value) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move {
            if let Some((corpus, checked)) = self.corpus.as_ref().filter(|(_, c)| c.manifest.name.as_str() == name) {
                if let Err(e) = checked.schemas.check_args(name, args) {
                    return ToolResult::of(Err(e));
                }
                let out = corpus
                    .call(args)
                    .map_err(|e| StructuredError::new(ErrorKind::ToolError, name, e.to_string()))
                    .and_then(|v| checked.schemas.check_output(name, &v).map(|()| v));
                return ToolResult::of(out);
            }
            if let Some(checked) = self.simulated(name) {
                if let Err(e) = checked.schemas.check_args(name, args) {
                    return ToolResult::of(Err(e));
                }
                let Some(simulator) = &self.simulator else {
                    return ToolResult::of(Err(StructuredError::new(
                        ErrorKind::ToolError,
                        name,
                        "this tool is simulated and no simulator is configured",
                    )));
                };
                let out = simulator
                    .simulate(&checked.manifest, args)
                    .await
                    .and_then(|v| checked.schemas.check_output(name, &v).map(|()| v));
                return ToolResult::of(out);
            }
            let installed = toolsmith_contract::sync::read(&self.installed).get(name).cloned();
            let is_create = installed.is_none() && name == CREATE_TOOL && self.has_python();
            let toolbox = match &self.toolbox {
                Some(t) if installed.is_some() || is_create || t.get(name).is_some() => t.clone(),
                // Names for "did you mean" are gathered only on a miss, not for every call.
                _ => {
                    let known: Vec<String> = self.manifests().iter().map(|m| m.name.as_str().to_string()).collect();
                    return ToolResult::of(Err(not_found_error(name, known.iter(), list_hint)));
                }
            };
            let name_owned = name.to_string();
            let args_owned = args.clone();
            let limits = self.limits;
            let joined = tokio::task::spawn_blocking(move || {
                if let Some(tool) = installed {
                    return ToolResult::of(toolbox.call_tool(&tool, &args_owned, limits).map(|o| o.value));
                }
                if is_create {
                    return create(&toolbox, &args_owned);
                }
                ToolResult::of(toolbox.call(&name_owned, &args_owned, limits).map(|o| o.value))
            })
            .await;
            joined.unwrap_or_else(|e| ToolResult::of(Err(StructuredError::new(ErrorKind::Trap, name, e.to_string()))))
        })
    }
}

fn list_hint() -> String {
    "call one of the tools listed in the system message".into()
}

fn create(toolbox: &Toolbox, args: &Value) -> ToolResult {
    let request: CreateRequest = match serde_json::from_value(args.clone()) {
        Ok(r) => r,
        Err(e) => {
            return ToolResult::of(Err(StructuredError::new(ErrorKind::InvalidArgs, CREATE_TOOL, e.to_string())
                .with_hint("pass name, description, code and inputs")));
        }
    };
    let provenance = Provenance { author: Some("agent".into()), ..Provenance::default() };
    match toolbox.create_python(&request, provenance) {
        Ok(created) => {
            let value = serde_json::to_value(&created.result).unwrap_or(Value::Null);
            ToolResult { value: Ok(value), created: created.tool }
        }
        Err(e) => ToolResult::of(Err(e)),
    }
}
