//! A table of named tools and the one way to call them: validate arguments, run in the sandbox,
//! validate the result.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use serde_json::Value;
use toolsmith_contract::{ErrorKind, Manifest, StructuredError};

use crate::sandbox::{CallReport, Limits, LoadError, LoadedComponent, Sandbox, ToolCaller};
use crate::validate::ToolSchemas;

/// A loaded tool: its manifest, compiled validators and implementation.
#[derive(Debug)]
pub struct Tool {
    /// The manifest the tool declared.
    pub manifest: Manifest,
    schemas: ToolSchemas,
    implementation: Implementation,
}

#[derive(Debug)]
enum Implementation {
    Component(LoadedComponent),
}

impl Tool {
    /// The tool's name.
    pub fn name(&self) -> &str {
        self.manifest.name.as_str()
    }

    /// The component behind a plugin tool.
    pub fn component(&self) -> Option<&LoadedComponent> {
        match &self.implementation {
            Implementation::Component(c) => Some(c),
        }
    }
}

/// The result of a successful call.
#[derive(Debug, Clone)]
pub struct CallOutput {
    /// The tool's result; it validates against the tool's `output_schema`.
    pub value: Value,
    /// Logs and timing.
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
}

impl Toolbox {
    /// An empty toolbox over `sandbox`.
    pub fn new(sandbox: Sandbox) -> Self {
        Toolbox { inner: Arc::new(Inner { sandbox, tools: RwLock::new(BTreeMap::new()) }) }
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
        let schemas = ToolSchemas::compile(&manifest.input_schema, &manifest.output_schema)
            .map_err(|e| LoadError::Manifest(e.to_string()))?;
        Ok(Arc::new(Tool { manifest, schemas, implementation: Implementation::Component(component) }))
    }

    /// Loads a component and registers it under its manifest's name (replacing any tool of that
    /// name, which is returned).
    pub fn add_component(&self, bytes: &[u8]) -> Result<Arc<Tool>, LoadError> {
        let tool = self.load_component(bytes)?;
        self.register(tool.clone());
        Ok(tool)
    }

    /// Registers a loaded tool; returns the tool it replaced, if any.
    pub fn register(&self, tool: Arc<Tool>) -> Option<Arc<Tool>> {
        let mut tools = self.inner.tools.write().unwrap_or_else(|p| p.into_inner());
        tools.insert(tool.name().to_owned(), tool)
    }

    /// The tool called `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Tool>> {
        self.inner.get(name)
    }

    /// Every registered tool, by name.
    pub fn tools(&self) -> Vec<Arc<Tool>> {
        let tools = self.inner.tools.read().unwrap_or_else(|p| p.into_inner());
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
        let tools = self.tools.read().unwrap_or_else(|p| p.into_inner());
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
                self.sandbox.call(component, name, &args.to_string(), limits, Some((caller, depth)))?
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
        let tools = self.tools.read().unwrap_or_else(|p| p.into_inner());
        let mut near: Vec<(f64, &String)> =
            tools.keys().map(|k| (strsim::jaro_winkler(name, k), k)).filter(|(s, _)| *s > 0.7).collect();
        near.sort_by(|a, b| b.0.total_cmp(&a.0));
        let e = StructuredError::new(ErrorKind::NotFound, name, format!("no tool is called `{name}`"));
        match near.first() {
            Some((_, best)) => e.with_hint(format!("did you mean `{best}`?")),
            None => {
                let names: Vec<&str> = tools.keys().take(20).map(String::as_str).collect();
                e.with_hint(format!("available tools: {}", names.join(", ")))
            }
        }
    }
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
