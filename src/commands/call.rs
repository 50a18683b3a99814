//! `toolsmith call`: one validated, sandboxed call.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;
use toolsmith_registry::{RegistryError, SortBy};
use toolsmith_sandbox::{CallOutput, ErrorKind, Limits, StructuredError, ToolKind, Toolbox, not_found_error};

use super::Env;

#[derive(Debug, clap::Args)]
pub struct CallArgs {
    /// A bundled tool's name (e.g. `calculator`) or the path of a component file.
    pub tool: String,
    /// The arguments as a JSON object.
    #[arg(long, default_value = "{}")]
    pub args: String,
    /// Wall-clock deadline in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,
    /// Memory cap in MiB.
    #[arg(long, default_value_t = 64)]
    pub memory_mb: usize,
    /// Cap on the result's size in KiB.
    #[arg(long, default_value_t = 1024)]
    pub output_kb: usize,
    /// Also print the tool's log lines (to standard error).
    #[arg(long)]
    pub logs: bool,
}

pub fn run(env: &Env, args: CallArgs) -> Result<ExitCode> {
    let limits = Limits {
        timeout: Duration::from_millis(args.timeout_ms),
        memory_bytes: args.memory_mb.saturating_mul(1 << 20),
        output_bytes: args.output_kb.saturating_mul(1 << 10),
        ..Limits::default()
    };
    let toolbox = env.toolbox()?;
    let parsed: Result<Value, _> = serde_json::from_str(&args.args);
    let outcome = match parsed {
        Err(e) => Err(StructuredError::new(ErrorKind::InvalidArgs, &args.tool, format!("--args is not JSON: {e}"))
            .with_hint("pass a JSON object, e.g. --args '{\"expression\": \"1+2\"}'")),
        Ok(json) => {
            if looks_like_path(&args.tool) {
                let path = Path::new(&args.tool);
                let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
                match toolbox.load_component(&bytes) {
                    Ok(tool) => toolbox.call_tool(&tool, &json, limits),
                    Err(e) => Err(e.to_structured(&args.tool)),
                }
            } else if toolbox.get(&args.tool).is_some() {
                toolbox.call(&args.tool, &json, limits)
            } else {
                call_registered(env, &toolbox, &args.tool, &json, limits)?
            }
        }
    };
    match outcome {
        Ok(out) => {
            if args.logs {
                for line in &out.report.logs {
                    eprintln!("[{}] {}", line.level, line.message);
                }
            }
            super::print_json(&out.value)?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            super::print_json(&e.to_envelope())?;
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Calls a tool from the registry (a Python tool someone admitted, a plugin added with `tools
/// add`), and counts the call in its statistics.
fn call_registered(
    env: &Env,
    toolbox: &Toolbox,
    name: &str,
    args: &Value,
    limits: Limits,
) -> Result<Result<CallOutput, StructuredError>> {
    let mut registry = env.registry()?;
    let record = match registry.get(name) {
        Ok(record) => record,
        Err(RegistryError::NotFound(_)) => {
            let known = registry.list(SortBy::Name)?;
            let hint = || "`toolsmith tools list` shows every tool".to_owned();
            return Ok(Err(not_found_error(name, known.iter().map(|r| &r.name), hint)));
        }
        Err(e) => return Err(e.into()),
    };
    let blob = match &record.blob_hash {
        Some(hash) => registry.blob(hash)?,
        None => None,
    };
    if record.kind == ToolKind::Python && toolbox.python().is_none() {
        toolbox.set_python(env.python_runtime(toolbox.sandbox())?);
    }
    // Only the grants bound to this code: a tool whose code changed since is pure until granted again.
    let grants = registry.grants(&record.name)?.active;
    let outcome = toolbox
        .load_stored(&record.manifest, blob.as_deref())
        .and_then(|t| toolbox.call_tool(&t.with_grants(grants), args, limits));
    if let Err(e) = registry.record_call(&record.name, outcome.is_ok(), None) {
        tracing::warn!("cannot record the call in the registry: {e}");
    }
    Ok(outcome)
}

fn looks_like_path(tool: &str) -> bool {
    tool.contains('/') || tool.ends_with(".wasm") || Path::new(tool).is_file()
}
