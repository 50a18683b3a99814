//! Agent-written Python tools.
//!
//! Python code runs in a CPython interpreter that is itself a WebAssembly component
//! (`plugins/python/`, built by `scripts/build-python-guest.sh`), one fresh instance per call, under
//! the same engine, deadline, memory cap and output cap as plugins (see [`crate::sandbox`]). This
//! module speaks the guest's JSON protocol ([`PythonRuntime::exec`], [`PythonRuntime::describe`]),
//! derives tool schemas from Python signatures ([`schema`]), and implements SEARL's
//! `create_and_execute_mcp` ([`create`]).

pub mod create;
pub mod schema;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Map, Value, json};
use toolsmith_contract::{ErrorKind, PythonException, StructuredError};

use crate::sandbox::{CallReport, Limits, LoadError, PythonComponent, Sandbox};

/// Characters of stdout and of stderr a call keeps (the rest is dropped and counted).
pub const CAPTURE_CHARS: usize = 64 << 10;

/// The memory cap Python calls get by default: CPython's heap starts at about 20 MiB.
pub const DEFAULT_MEMORY_BYTES: usize = 256 << 20;

/// Where the Python guest component is: `$TOOLSMITH_PYTHON_GUEST`, else `python/runner.wasm` in
/// the data directory ([`toolsmith_contract::home`]: an install's, or the `.deps/` that
/// `scripts/setup.sh` writes).
pub fn default_guest_path() -> PathBuf {
    std::env::var_os("TOOLSMITH_PYTHON_GUEST").filter(|p| !p.is_empty()).map(PathBuf::from).unwrap_or_else(|| {
        toolsmith_contract::home::data_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.deps"))
            .0
            .join("python/runner.wasm")
    })
}

/// Why the Python guest could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PythonLoadError {
    /// The component file is missing.
    #[error("the Python guest is not built ({path}); run scripts/setup.sh or set TOOLSMITH_PYTHON_GUEST")]
    Missing {
        /// Where it was looked for.
        path: String,
    },
    /// The file exists but does not load.
    #[error("cannot load the Python guest {path}: {source}")]
    Load {
        /// The file.
        path: String,
        /// Why.
        source: LoadError,
    },
}

/// The Python guest, loaded into a sandbox.
#[derive(Debug, Clone)]
pub struct PythonRuntime {
    sandbox: Sandbox,
    component: Arc<PythonComponent>,
}

/// A finished Python call.
#[derive(Debug, Clone)]
pub struct PythonRun {
    /// The entry function's return value, in the guest's JSON encoding (see `plugins/python/app.py`).
    pub result: Value,
    /// Captured standard output (at most [`CAPTURE_CHARS`]).
    pub stdout: String,
    /// Captured standard error (at most [`CAPTURE_CHARS`]).
    pub stderr: String,
    /// The run's timing and logs, as for any sandboxed call.
    pub report: CallReport,
}

/// A failed Python call: the structured error plus whatever the code printed before failing.
#[derive(Debug, Clone)]
pub struct PythonFailure {
    /// What went wrong (boxed: failures are the rare path, and this keeps `Result`s small).
    pub error: Box<StructuredError>,
    /// Captured standard output, if the guest answered.
    pub stdout: String,
    /// Captured standard error, if the guest answered.
    pub stderr: String,
}

impl From<StructuredError> for PythonFailure {
    fn from(error: StructuredError) -> Self {
        PythonFailure { error: Box::new(error), stdout: String::new(), stderr: String::new() }
    }
}

/// One parameter of a Python function, as the guest's `describe` reports it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Param {
    /// The name a keyword argument binds to, which becomes the input schema's property.
    pub name: String,
    /// `positional_only`, `positional_or_keyword`, `var_positional`, `keyword_only`, `var_keyword`.
    pub kind: String,
    /// The annotation's source text, if any.
    pub annotation: Option<String>,
    /// Whether it has a default.
    pub has_default: bool,
    /// The default, when it is a literal.
    pub default: Option<Value>,
}

/// A Python function's signature.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Signature {
    /// The parameters in declaration order, from which the input schema is derived.
    pub params: Vec<Param>,
    /// The return annotation's source text, if any.
    pub returns: Option<String>,
    /// The function's docstring, whose first line fills out a description shorter than 20
    /// characters.
    pub doc: Option<String>,
}

#[derive(Deserialize)]
struct ExecResponse {
    #[serde(default)]
    result: Value,
    #[serde(default)]
    stdout: String,
    #[serde(default)]
    stderr: String,
    #[serde(default)]
    error: Option<GuestError>,
}

#[derive(Deserialize)]
struct GuestError {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    traceback: String,
    #[serde(default)]
    line: Option<u32>,
}

impl GuestError {
    fn into_structured(self, tool: &str) -> StructuredError {
        let hint = match self.kind.as_str() {
            "SyntaxError" | "IndentationError" | "TabError" => "fix the syntax at the line shown",
            "EntryNotFound" => "define a top-level function whose name is the tool's name",
            "ModuleNotFoundError" | "ImportError" => {
                "only these modules exist: math cmath json re itertools functools collections fractions statistics \
                 datetime decimal random heapq bisect string typing dataclasses enum operator copy textwrap hashlib \
                 base64 struct"
            }
            "TypeError" => "check the arguments against the function's signature",
            _ => "read the traceback, fix the code or the arguments, and retry",
        };
        let mut e = StructuredError::new(ErrorKind::PythonError, tool, format!("{}: {}", self.kind, self.message));
        e.exception = Some(Box::new(PythonException {
            kind: self.kind,
            message: self.message,
            traceback: self.traceback,
            line: self.line,
        }));
        e.with_hint(hint)
    }
}

impl PythonRuntime {
    /// Loads the guest component from `path` into `sandbox` (mapped from the artifact cache when
    /// it was compiled before).
    pub fn load(sandbox: Sandbox, path: &Path) -> Result<Self, PythonLoadError> {
        let bytes = std::fs::read(path).map_err(|_| PythonLoadError::Missing { path: path.display().to_string() })?;
        let component = sandbox
            .load_python(&bytes)
            .map_err(|source| PythonLoadError::Load { path: path.display().to_string(), source })?;
        Ok(PythonRuntime { sandbox, component: Arc::new(component) })
    }

    /// The sandbox the guest runs in.
    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }

    /// The CPython guest component every Python tool of this runtime runs in.
    pub fn component(&self) -> &PythonComponent {
        &self.component
    }

    /// Runs `code` in fresh globals and calls `entry(*args, **kwargs)`; `random` is seeded with
    /// `seed` (a fresh random seed when `None`).
    #[allow(clippy::too_many_arguments)] // one parameter per field of the guest's request
    pub fn exec(
        &self,
        tool: &str,
        code: &str,
        entry: &str,
        args: Vec<Value>,
        kwargs: Map<String, Value>,
        limits: Limits,
        seed: Option<u64>,
    ) -> Result<PythonRun, PythonFailure> {
        self.exec_granted(tool, code, entry, args, kwargs, limits, seed, None)
    }

    /// [`PythonRuntime::exec`] for a tool an operator granted capabilities: its directories are
    /// mounted read-only at `/dirs/<name>` and its environment variables set.
    #[allow(clippy::too_many_arguments)] // exec's parameters and the grants
    pub fn exec_granted(
        &self,
        tool: &str,
        code: &str,
        entry: &str,
        args: Vec<Value>,
        kwargs: Map<String, Value>,
        limits: Limits,
        seed: Option<u64>,
        grants: Option<&Arc<toolsmith_contract::Grants>>,
    ) -> Result<PythonRun, PythonFailure> {
        let seed = seed.unwrap_or_else(fresh_seed);
        let request = json!({
            "op": "exec", "code": code, "entry": entry, "args": args, "kwargs": kwargs,
            "seed": seed, "capture": CAPTURE_CHARS,
        });
        let (text, report) = self.sandbox.run_python(&self.component, tool, &request.to_string(), limits, grants)?;
        let response: ExecResponse = serde_json::from_str(&text).map_err(|e| malformed(tool, &e))?;
        let (stdout, stderr) = (response.stdout, response.stderr);
        match response.error {
            None => Ok(PythonRun { result: response.result, stdout, stderr, report }),
            Some(error) => {
                // A refused allocation surfaces in CPython as MemoryError, or as whatever the
                // failing code path raises next (even a TypeError): after the cap was hit, any
                // exception is reported as out_of_memory, with the exception kept for context.
                let error = if report.memory_limit_hit {
                    let exception = error.into_structured(tool).exception;
                    let mut e = StructuredError::new(
                        ErrorKind::OutOfMemory,
                        tool,
                        format!("the code tried to grow memory past the {} MiB cap", limits.memory_bytes >> 20),
                    )
                    .with_hint("use less memory (smaller data, generators) or raise the memory cap");
                    e.exception = exception;
                    e
                } else if let Some(capability) = report.denied.clone().filter(|_| error.kind == "PermissionError") {
                    // Code that lets the host's refusal propagate failed for want of a grant.
                    let mut e = error.into_structured(tool);
                    e.kind = ErrorKind::PermissionDenied;
                    e.expected = Some(capability);
                    e.hint =
                        Some("the tool may not reach this; an operator grants it with `toolsmith tools grant`".into());
                    e
                } else {
                    error.into_structured(tool)
                };
                Err(PythonFailure { error: Box::new(error), stdout, stderr })
            }
        }
    }

    /// Parses `code` (nothing runs) and describes the top-level function `entry`.
    pub fn describe(&self, tool: &str, code: &str, entry: &str) -> Result<Signature, StructuredError> {
        let request = json!({"op": "describe", "code": code, "entry": entry});
        let limits = Limits {
            timeout: std::time::Duration::from_secs(10),
            memory_bytes: DEFAULT_MEMORY_BYTES,
            ..Limits::default()
        };
        let (text, _) = self.sandbox.run_python(&self.component, tool, &request.to_string(), limits, None)?;
        let value: Value = serde_json::from_str(&text).map_err(|e| malformed(tool, &e))?;
        if let Some(error) = value.get("error").filter(|e| !e.is_null()) {
            let error: GuestError = serde_json::from_value(error.clone()).map_err(|e| malformed(tool, &e))?;
            return Err(error.into_structured(tool));
        }
        serde_json::from_value(value).map_err(|e| malformed(tool, &e))
    }
}

fn malformed(tool: &str, e: &serde_json::Error) -> StructuredError {
    StructuredError::new(ErrorKind::Trap, tool, format!("the Python guest returned a malformed response: {e}"))
        .with_hint("the code may have sabotaged the interpreter (e.g. replaced builtins); simplify it")
}

fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}
