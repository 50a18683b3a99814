//! `toolsmith call`: one validated, sandboxed call.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;
use toolsmith_host::{ErrorKind, Limits, StructuredError};

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
            } else {
                toolbox.call(&args.tool, &json, limits)
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

fn looks_like_path(tool: &str) -> bool {
    tool.contains('/') || tool.ends_with(".wasm") || Path::new(tool).is_file()
}
