//! SEARL's `create_and_execute_mcp`: an agent writes a Python function, we derive its interface,
//! run it once on the agent's example inputs, and return SEARL's result shape. A tool that runs
//! and validates becomes a *candidate*; admitting it into the tool table is a separate step.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use toolsmith_contract::{ErrorKind, Example, Manifest, Provenance, StructuredError, ToolKind, ToolName};

use super::{DEFAULT_MEMORY_BYTES, PythonRuntime, schema};
use crate::sandbox::Limits;
use crate::validate::ToolSchemas;

/// The timeout SEARL uses by default, in seconds.
pub const DEFAULT_TIMEOUT_SECS: f64 = 15.0;

/// SEARL's `create_and_execute_mcp` arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    /// The tool's name, which is also the name of the Python function to define (snake_case).
    pub name: String,
    /// What the tool does: agents find and choose tools by this text.
    pub description: String,
    /// The arguments in words, e.g. `"a, b, c (float)"` or `"xs: list of numbers"`.
    #[serde(default)]
    pub arguments: String,
    /// The return value in words, e.g. `"roots list"`.
    #[serde(default)]
    pub returns: String,
    /// The complete Python source, defining `def <name>(...)` at top level.
    pub code: String,
    /// Arguments for the first run, by parameter name, e.g. `{"a": 1, "b": -3, "c": 2}`.
    #[serde(default)]
    pub inputs: Map<String, Value>,
    /// Seconds the first run may take (default 15).
    #[serde(default = "default_timeout")]
    pub timeout: f64,
}

fn default_timeout() -> f64 {
    DEFAULT_TIMEOUT_SECS
}

/// SEARL's result: `{creation_success, execution_result, stdout, stderr, error}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CreateResult {
    /// True when the code parsed, defined the function, ran on `inputs` and its result validated.
    pub creation_success: bool,
    /// The function's return value on `inputs` (JSON encoding of `plugins/python/app.py`).
    pub execution_result: Value,
    /// What the run printed.
    pub stdout: String,
    /// What the run wrote to standard error.
    pub stderr: String,
    /// Why creation failed: kind, message and, for Python exceptions, the traceback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// An agent-written tool: its manifest (kind `python`) and its code.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PythonTool {
    /// The manifest derived from the function's signature and docstring.
    pub manifest: Manifest,
    /// The source, defining a function named like the tool.
    pub code: String,
    /// Which parameters are positional-only (passed by position, in order).
    #[serde(default)]
    pub positional: Vec<String>,
}

/// What a registry stores as a Python tool's blob: everything but the manifest.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PythonBlob {
    code: String,
    #[serde(default)]
    positional: Vec<String>,
}

impl PythonTool {
    /// The bytes a registry keeps for this tool (JSON: code and positional parameters).
    pub fn to_blob(&self) -> Vec<u8> {
        let blob = PythonBlob { code: self.code.clone(), positional: self.positional.clone() };
        serde_json::to_vec(&blob).unwrap_or_default()
    }

    /// Rebuilds a tool from its manifest and the bytes [`PythonTool::to_blob`] wrote.
    pub fn from_blob(manifest: Manifest, blob: &[u8]) -> Result<PythonTool, String> {
        let blob: PythonBlob =
            serde_json::from_slice(blob).map_err(|e| format!("the stored Python tool is not readable: {e}"))?;
        if manifest.kind != ToolKind::Python {
            return Err(format!("`{}` is a {} tool, not a Python tool", manifest.name, manifest.kind));
        }
        Ok(PythonTool { manifest, code: blob.code, positional: blob.positional })
    }

    /// Splits a JSON argument object into positional arguments and keyword arguments.
    pub fn split_args(&self, args: &Value) -> (Vec<Value>, Map<String, Value>) {
        let mut kwargs = args.as_object().cloned().unwrap_or_default();
        let positional = self.positional.iter().filter_map(|p| kwargs.remove(p)).collect();
        (positional, kwargs)
    }
}

/// The outcome of `create_and_execute_mcp`.
#[derive(Debug, Clone)]
pub struct Created {
    /// SEARL's result, for the agent.
    pub result: CreateResult,
    /// The candidate tool, when creation succeeded.
    pub tool: Option<PythonTool>,
    /// The structured failure, when it did not.
    pub failure: Option<StructuredError>,
}

/// Runs SEARL's `create_and_execute_mcp`. `existing` is the manifest of a tool that already has
/// the requested name: a Python tool is superseded by a new version, any other kind is a conflict.
pub fn create_and_execute(
    runtime: &PythonRuntime,
    request: &CreateRequest,
    existing: Option<&Manifest>,
    provenance: Provenance,
) -> Created {
    let name = request.name.as_str();
    let fail = |error: StructuredError, stdout: String, stderr: String| Created {
        result: CreateResult {
            creation_success: false,
            execution_result: Value::Null,
            stdout,
            stderr,
            error: Some(describe_failure(&error)),
        },
        tool: None,
        failure: Some(error),
    };
    let invalid = |message: String, hint: &str| {
        fail(StructuredError::new(ErrorKind::InvalidArgs, name, message).with_hint(hint), String::new(), String::new())
    };

    let tool_name = match ToolName::new(name) {
        Ok(n) => n,
        Err(e) => return invalid(e.to_string(), "use a snake_case name such as quadratic_solver"),
    };
    if request.description.trim().is_empty() {
        return invalid("description is empty".into(), "say what the tool does; agents choose tools by it");
    }
    let version = match existing {
        None => "0.1.0".to_owned(),
        Some(m) if m.kind == ToolKind::Python => bump_minor(&m.version),
        Some(m) => {
            return invalid(
                format!("the name `{name}` belongs to a {} tool", m.kind),
                "choose another name (names are unique across all tools)",
            );
        }
    };
    if !(request.timeout.is_finite() && request.timeout > 0.0) {
        return invalid(format!("timeout {} is not a positive number of seconds", request.timeout), "e.g. 15");
    }

    // Parse (inside the sandbox) and find the function.
    let signature = match runtime.describe(name, &request.code, name) {
        Ok(sig) => sig,
        Err(e) => return fail(e, String::new(), String::new()),
    };
    let input_schema = schema::input_schema(&signature, &request.arguments, &request.inputs);
    let inputs = Value::Object(request.inputs.clone());
    let placeholder_output = schema::output_schema(&signature, &request.returns, None);
    match ToolSchemas::compile(&input_schema, &placeholder_output) {
        Ok(schemas) => {
            if let Err(e) = schemas.check_args(name, &inputs) {
                return fail(e, String::new(), String::new());
            }
        }
        Err(e) => return invalid(e.to_string(), "simplify the annotations"),
    }

    // Run it once on the example inputs.
    let positional: Vec<String> =
        signature.params.iter().filter(|p| p.kind == "positional_only").map(|p| p.name.clone()).collect();
    let mut tool = PythonTool {
        manifest: Manifest {
            name: tool_name,
            version,
            description: request.description.trim().to_owned(),
            input_schema,
            output_schema: json!({"type": "object"}),
            examples: Vec::new(),
            kind: ToolKind::Python,
            provenance,
            capabilities: Default::default(),
        },
        code: request.code.clone(),
        positional,
    };
    let (args, kwargs) = tool.split_args(&inputs);
    let limits = Limits {
        timeout: Duration::from_secs_f64(request.timeout.min(600.0)),
        memory_bytes: DEFAULT_MEMORY_BYTES,
        ..Limits::default()
    };
    let run = match runtime.exec(name, &request.code, name, args, kwargs, limits, None) {
        Ok(run) => run,
        Err(f) => return fail(*f.error, f.stdout, f.stderr),
    };

    // Derive and check the output schema against what it returned.
    let output_schema = schema::output_schema(&signature, &request.returns, Some(&run.result));
    let output = json!({ "result": run.result });
    let checked = ToolSchemas::compile(&tool.manifest.input_schema, &output_schema)
        .map_err(|e| StructuredError::new(ErrorKind::InvalidOutput, name, e.to_string()))
        .and_then(|s| s.check_output(name, &output));
    if let Err(e) = checked {
        let e = e.with_hint("the result does not match the return annotation or the `returns` description");
        return fail(e, run.stdout, run.stderr);
    }
    tool.manifest.output_schema = output_schema;
    tool.manifest.examples = vec![Example { input: inputs, output, description: None }];
    if let Some(doc) = &signature.doc
        && tool.manifest.description.len() < 20
    {
        tool.manifest.description = format!("{} {}", tool.manifest.description, doc.lines().next().unwrap_or(""));
    }
    if let Err(e) = tool.manifest.check() {
        return invalid(e.to_string(), "fix the name, description or schemas");
    }
    Created {
        result: CreateResult {
            creation_success: true,
            execution_result: run.result,
            stdout: run.stdout,
            stderr: run.stderr,
            error: None,
        },
        tool: Some(tool),
        failure: None,
    }
}

fn describe_failure(e: &StructuredError) -> String {
    let mut text = format!("{}: {}", e.kind, e.message);
    if let Some(ex) = &e.exception
        && !ex.traceback.is_empty()
    {
        text.push('\n');
        text.push_str(&ex.traceback);
    }
    if let Some(pointer) = &e.pointer {
        text.push_str(&format!(" (at `{pointer}`)"));
    }
    if let Some(hint) = &e.hint {
        text.push_str(&format!("\nhint: {hint}"));
    }
    text
}

fn bump_minor(version: &str) -> String {
    let mut parts =
        version.split(['-', '+']).next().unwrap_or("0.0.0").split('.').map(|p| p.parse::<u64>().unwrap_or(0));
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    format!("{major}.{}.0", minor + 1)
}

#[cfg(test)]
mod tests {
    #[test]
    fn versions_bump_minor() {
        assert_eq!(super::bump_minor("0.1.0"), "0.2.0");
        assert_eq!(super::bump_minor("1.9.3-rc1"), "1.10.0");
    }
}
