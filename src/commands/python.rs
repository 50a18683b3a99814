//! `toolsmith python run`: run a Python function in the sandbox, for quick experiments.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use toolsmith_sandbox::Limits;

use super::Env;

#[derive(Debug, clap::Subcommand)]
pub enum PythonCommand {
    /// Run FILE's function ENTRY on --args and print {result, stdout, stderr, error}.
    Run {
        /// The Python file.
        file: PathBuf,
        /// The function to call.
        #[arg(long)]
        entry: String,
        /// Keyword arguments as a JSON object, or positional arguments as a JSON array.
        #[arg(long, default_value = "{}")]
        args: String,
        /// Seconds the call may take.
        #[arg(long, default_value_t = 15.0)]
        timeout: f64,
        /// Memory cap in MiB.
        #[arg(long, default_value_t = 256)]
        memory_mb: usize,
        /// Seed for `random` (fresh each run by default).
        #[arg(long)]
        seed: Option<u64>,
    },
}

pub fn run(env: &Env, cmd: PythonCommand) -> Result<ExitCode> {
    let PythonCommand::Run { file, entry, args, timeout, memory_mb, seed } = cmd;
    let code = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
    let parsed: Value = serde_json::from_str(&args).context("--args is not JSON")?;
    let (positional, kwargs) = match parsed {
        Value::Array(a) => (a, Default::default()),
        Value::Object(o) => (Vec::new(), o),
        _ => anyhow::bail!("--args must be a JSON object (keyword arguments) or array (positional)"),
    };
    anyhow::ensure!(timeout.is_finite() && timeout > 0.0, "--timeout must be a positive number of seconds");
    let limits = Limits {
        timeout: Duration::from_secs_f64(timeout.min(3600.0)),
        memory_bytes: memory_mb.saturating_mul(1 << 20),
        ..Limits::default()
    };
    let runtime = env.python_runtime(&env.sandbox()?)?;
    let out = match runtime.exec(&entry, &code, &entry, positional, kwargs, limits, seed) {
        Ok(run) => json!({"result": run.result, "stdout": run.stdout, "stderr": run.stderr, "error": null}),
        Err(f) => json!({"result": null, "stdout": f.stdout, "stderr": f.stderr, "error": f.error}),
    };
    let failed = !out["error"].is_null();
    super::print_json(&out)?;
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
