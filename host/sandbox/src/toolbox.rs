//! A table of named tools and the one way to call them: validate arguments, run in the sandbox,
//! validate the result.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use serde_json::Value;
use toolsmith_contract::{ErrorKind, Grants, Manifest, StructuredError, ToolKind};

use crate::python::PythonRuntime;
use crate::python::create::{CreateRequest, Created, PythonTool, create_and_execute};
use crate::sandbox::{CallReport, Limits, LoadError, LoadedComponent, Sandbox, ToolCaller};
use crate::validate::ToolSchemas;

/// A loaded tool: its manifest, compiled validators, implementation and what an operator granted
/// it (nothing, unless [`Tool::with_grants`] says otherwise).
#[derive(Debug, Clone)]
pub struct Tool {
    /// The manifest the tool declared.
    pub manifest: Manifest,
    schemas: Arc<ToolSchemas>,
    implementation: Implementation,
    grants: Option<Arc<Grants>>,
}

#[derive(Debug, Clone)]
enum Implementation {
    Component(LoadedComponent),
    Python(Box<PythonTool>),
}

impl Tool {
    /// The name calls address the tool by, taken from its manifest.
    pub fn name(&self) -> &str {
        self.manifest.name.as_str()
    }

    /// The component behind a plugin tool.
    pub fn component(&self) -> Option<&LoadedComponent> {
        match &self.implementation {
            Implementation::Component(c) => Some(c),
            Implementation::Python(_) => None,
        }
    }

    /// The same tool with `grants` (an operator's, from the registry); empty grants make it pure.
    pub fn with_grants(&self, grants: Grants) -> Arc<Tool> {
        let grants = if grants.is_empty() { None } else { Some(Arc::new(grants)) };
        Arc::new(Tool { grants, ..self.clone() })
    }

    /// What an operator granted this tool, if anything.
    pub fn grants(&self) -> Option<&Grants> {
        self.grants.as_deref()
    }

    /// The code behind an agent-written Python tool.
    pub fn python(&self) -> Option<&PythonTool> {
        match &self.implementation {
            Implementation::Python(p) => Some(p.as_ref()),
            Implementation::Component(_) => None,
        }
    }
}

/// The result of a successful call.
#[derive(Debug, Clone)]
pub struct CallOutput {
    /// The tool's result; it validates against the tool's `output_schema`.
    pub value: Value,
    /// The call's logs and timing, kept apart from the value so the agent sees only the result.
    pub report: CallReport,
}

/// Named tools sharing one [`Sandbox`]. Cheap to clone; clones share the table.
#[derive(Clone, Debug)]
pub struct Toolbox {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    sandbox: Sandbox,
    tools: RwLock<BTreeMap<String, Arc<Tool>>>,
    python: RwLock<Option<PythonRuntime>>,
}

impl Toolbox {
    /// An empty toolbox over `sandbox`.
    pub fn new(sandbox: Sandbox) -> Self {
        Toolbox { inner: Arc::new(Inner { sandbox, tools: RwLock::new(BTreeMap::new()), python: RwLock::new(None) }) }
    }

    /// The sandbox tools run in.
    pub fn sandbox(&self) -> &Sandbox {
        &self.inner.sandbox
    }

    /// Loads a component and reads and checks its manifest, without registering it.
    pub fn load_component(&self, bytes: &[u8]) -> Result<Arc<Tool>, LoadError> {
        let component = self.inner.sandbox.load(bytes)?;
        let json = self
            .inner
            .sandbox
            .manifest_json(&component, "<manifest>")
            .map_err(|e| LoadError::Manifest(format!("the manifest export failed: {}", e.message)))?;
        let manifest = Manifest::from_json(&json).map_err(|e| LoadError::Manifest(e.to_string()))?;
        // Whole: schemas against the meta-schema and every declared example against them, so a
        // plugin with a wrong example is refused at build and add, not at its first call.
        toolsmith_contract::validate::check_manifest(&manifest)
            .map_err(|e| LoadError::Manifest(format!("tool `{}`: {e}", manifest.name)))?;
        let schemas = ToolSchemas::compile(&manifest.input_schema, &manifest.output_schema)
            .map_err(|e| LoadError::Manifest(e.to_string()))?;
        Ok(Arc::new(Tool {
            manifest,
            schemas: Arc::new(schemas),
            implementation: Implementation::Component(component),
            grants: None,
        }))
    }

    /// Loads a component and registers it under its manifest's name (replacing any tool of that
    /// name, which is returned).
    pub fn add_component(&self, bytes: &[u8]) -> Result<Arc<Tool>, LoadError> {
        let tool = self.load_component(bytes)?;
        self.register(tool.clone());
        Ok(tool)
    }

    /// Loads a tool as a registry stores it: its manifest and the blob it runs from (component
    /// bytes for a plugin, code for a Python tool). The component's own manifest must name the
    /// same tool. Not registered.
    pub fn load_stored(&self, manifest: &Manifest, blob: Option<&[u8]>) -> Result<Arc<Tool>, StructuredError> {
        let name = manifest.name.as_str();
        let missing = || {
            StructuredError::new(ErrorKind::InvalidComponent, name, "the registry has no code for this tool")
                .with_hint("re-add the tool with `toolsmith tools add`")
        };
        match manifest.kind {
            ToolKind::Plugin => {
                let tool = self.load_component(blob.ok_or_else(missing)?).map_err(|e| e.to_structured(name))?;
                if tool.name() != name {
                    return Err(StructuredError::new(
                        ErrorKind::InvalidComponent,
                        name,
                        format!("the stored component declares itself as `{}`", tool.name()),
                    ));
                }
                Ok(tool)
            }
            ToolKind::Python => {
                let tool = PythonTool::from_blob(manifest.clone(), blob.ok_or_else(missing)?)
                    .map_err(|e| StructuredError::new(ErrorKind::InvalidComponent, name, e))?;
                self.python_tool(tool).map_err(|e| e.to_structured(name))
            }
            ToolKind::Simulated | ToolKind::Native => Err(StructuredError::new(
                ErrorKind::NotFound,
                name,
                format!("`{name}` is a {} tool: an interface with no code to run here", manifest.kind),
            )
            .with_hint("simulated tools are answered by a model in the agent runtime; call a plugin or Python tool")),
        }
    }

    /// Lets this toolbox run Python tools with `runtime`.
    pub fn set_python(&self, runtime: PythonRuntime) {
        *toolsmith_contract::sync::write(&self.inner.python) = Some(runtime);
    }

    /// The Python runtime, if one was set.
    pub fn python(&self) -> Option<PythonRuntime> {
        toolsmith_contract::sync::read(&self.inner.python).clone()
    }

    /// Checks an agent-written tool's schemas and wraps it as a [`Tool`] (not registered).
    pub fn python_tool(&self, tool: PythonTool) -> Result<Arc<Tool>, LoadError> {
        let schemas = ToolSchemas::compile(&tool.manifest.input_schema, &tool.manifest.output_schema)
            .map_err(|e| LoadError::Manifest(e.to_string()))?;
        Ok(Arc::new(Tool {
            manifest: tool.manifest.clone(),
            schemas: Arc::new(schemas),
            implementation: Implementation::Python(Box::new(tool)),
            grants: None,
        }))
    }

    /// SEARL's `create_and_execute_mcp`: creates a candidate Python tool and runs it once. The
    /// candidate is returned, not registered; admit it with [`Toolbox::python_tool`] and
    /// [`Toolbox::register`].
    pub fn create_python(
        &self,
        request: &CreateRequest,
        provenance: toolsmith_contract::Provenance,
    ) -> Result<Created, StructuredError> {
        let runtime = self.python().ok_or_else(|| no_python(&request.name))?;
        let existing = self.get(&request.name);
        Ok(create_and_execute(&runtime, request, existing.as_ref().map(|t| &t.manifest), provenance))
    }

    /// Registers a loaded tool; returns the tool it replaced, if any.
    pub fn register(&self, tool: Arc<Tool>) -> Option<Arc<Tool>> {
        let mut tools = toolsmith_contract::sync::write(&self.inner.tools);
        tools.insert(tool.name().to_owned(), tool)
    }

    /// Looks a tool up by name, for callers that need its manifest or implementation.
    pub fn get(&self, name: &str) -> Option<Arc<Tool>> {
        self.inner.get(name)
    }

    /// Every registered tool, by name.
    pub fn tools(&self) -> Vec<Arc<Tool>> {
        let tools = toolsmith_contract::sync::read(&self.inner.tools);
        tools.values().cloned().collect()
    }

    /// Calls `name` with `args`: checks the arguments, runs the tool in a fresh sandbox instance
    /// under `limits`, checks the result. Every failure is a [`StructuredError`].
    pub fn call(&self, name: &str, args: &Value, limits: Limits) -> Result<CallOutput, StructuredError> {
        self.inner.call(name, args, limits, 0)
    }

    /// Calls `tool` directly (it need not be registered).
    pub fn call_tool(&self, tool: &Tool, args: &Value, limits: Limits) -> Result<CallOutput, StructuredError> {
        self.inner.call_loaded(tool, args, limits, 0)
    }
}

impl Inner {
    fn get(&self, name: &str) -> Option<Arc<Tool>> {
        let tools = toolsmith_contract::sync::read(&self.tools);
        tools.get(name).cloned()
    }

    fn call(
        self: &Arc<Self>,
        name: &str,
        args: &Value,
        limits: Limits,
        depth: u32,
    ) -> Result<CallOutput, StructuredError> {
        let Some(tool) = self.get(name) else {
            return Err(self.not_found(name));
        };
        self.call_loaded(&tool, args, limits, depth)
    }

    fn call_loaded(
        self: &Arc<Self>,
        tool: &Tool,
        args: &Value,
        limits: Limits,
        depth: u32,
    ) -> Result<CallOutput, StructuredError> {
        let name = tool.name();
        tool.schemas.check_args(name, args)?;
        let (text, report) = match &tool.implementation {
            Implementation::Component(component) => {
                let caller: Arc<dyn ToolCaller> = Arc::new(Caller(self.clone()));
                let (args, grants) = (args.to_string(), tool.grants.as_ref());
                self.sandbox.call_granted(component, name, &args, limits, Some((caller, depth)), grants)?
            }
            Implementation::Python(python) => {
                let runtime = toolsmith_contract::sync::read(&self.python).clone();
                let runtime = runtime.ok_or_else(|| no_python(name))?;
                let (positional, kwargs) = python.split_args(args);
                let run = runtime
                    .exec_granted(name, &python.code, name, positional, kwargs, limits, None, tool.grants.as_ref())
                    .map_err(|failure| *failure.error)?;
                let mut report = run.report;
                report.push_output(&run.stdout, &run.stderr);
                (serde_json::json!({ "result": run.result }).to_string(), report)
            }
        };
        let value: Value = serde_json::from_str(&text).map_err(|e| {
            let head: String = text.chars().take(200).collect();
            let mut err = StructuredError::new(ErrorKind::InvalidOutput, name, format!("the result is not JSON: {e}"));
            err.got = Some(Value::String(head));
            err.with_hint("this is a bug in the tool: it must return a JSON document")
        })?;
        tool.schemas.check_output(name, &value)?;
        Ok(CallOutput { value, report })
    }

    fn not_found(&self, name: &str) -> StructuredError {
        let tools = toolsmith_contract::sync::read(&self.tools);
        not_found_error(name, tools.keys(), || {
            let names: Vec<&str> = tools.keys().take(20).map(String::as_str).collect();
            format!("available tools: {}", names.join(", "))
        })
    }
}

/// `not_found` for `name`, with a "did you mean" hint naming the closest of `known` (Jaro-Winkler
/// above 0.7), or `otherwise()` as the hint when nothing is close.
pub fn not_found_error<S: AsRef<str>>(
    name: &str,
    known: impl IntoIterator<Item = S>,
    otherwise: impl FnOnce() -> String,
) -> StructuredError {
    let closest = known
        .into_iter()
        .map(|k| (strsim::jaro_winkler(name, k.as_ref()), k))
        .filter(|(score, _)| *score > 0.7)
        .max_by(|a, b| a.0.total_cmp(&b.0));
    let e = StructuredError::new(ErrorKind::NotFound, name, format!("no tool is called `{name}`"));
    match closest {
        Some((_, best)) => e.with_hint(format!("did you mean `{}`?", best.as_ref())),
        None => e.with_hint(otherwise()),
    }
}

fn no_python(tool: &str) -> StructuredError {
    StructuredError::new(ErrorKind::InvalidComponent, tool, "this host has no Python runtime loaded")
        .with_hint("run scripts/setup.sh to build the Python guest, or set TOOLSMITH_PYTHON_GUEST")
}

/// The way back into the toolbox for `call-tool`: held by the calling store for one call.
struct Caller(Arc<Inner>);

impl ToolCaller for Caller {
    fn call_nested(&self, name: &str, args: &str, limits: Limits, depth: u32) -> Result<String, StructuredError> {
        let args: Value = serde_json::from_str(args).map_err(|e| {
            StructuredError::new(ErrorKind::InvalidArgs, name, format!("call-tool arguments are not JSON: {e}"))
        })?;
        self.0.call(name, &args, limits, depth).map(|out| out.value.to_string())
    }
}
