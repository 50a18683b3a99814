//! `toolsmith create`: SEARL's `create_and_execute_mcp` from the command line.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use toolsmith_contract::Provenance;
use toolsmith_host::ToolStore;
use toolsmith_host::python::create::{CreateRequest, DEFAULT_TIMEOUT_SECS};

use super::Env;

#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    /// The tool's name, which is also the Python function's name (snake_case).
    #[arg(long)]
    pub name: String,
    /// What the tool does.
    #[arg(long)]
    pub description: String,
    /// The arguments in words, e.g. "a, b, c (float)".
    #[arg(long, default_value = "")]
    pub arguments: String,
    /// The return value in words, e.g. "roots list".
    #[arg(long, default_value = "")]
    pub returns: String,
    /// A file with the Python code (`-` for standard input).
    #[arg(long)]
    pub code: PathBuf,
    /// Arguments for the first run, as a JSON object.
    #[arg(long, default_value = "{}")]
    pub inputs: String,
    /// Seconds the first run may take.
    #[arg(long, default_value_t = DEFAULT_TIMEOUT_SECS)]
    pub timeout: f64,
    /// Admit the tool when creation succeeds, so `toolsmith call NAME` finds it later.
    #[arg(long)]
    pub admit: bool,
}

pub fn run(env: &Env, args: CreateArgs) -> Result<ExitCode> {
    let code = if args.code.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("cannot read the code from standard input")?
    } else {
        std::fs::read_to_string(&args.code).with_context(|| format!("cannot read {}", args.code.display()))?
    };
    let inputs: serde_json::Value = serde_json::from_str(&args.inputs).context("--inputs is not JSON")?;
    let inputs = inputs.as_object().cloned().context("--inputs must be a JSON object")?;
    let request = CreateRequest {
        name: args.name,
        description: args.description,
        arguments: args.arguments,
        returns: args.returns,
        code,
        inputs,
        timeout: args.timeout,
    };
    let toolbox = env.toolbox_with_python()?;
    let provenance = Provenance { author: Some("cli".into()), ..Provenance::default() };
    let created = toolbox.create_python(&request, provenance).map_err(|e| anyhow::anyhow!("{e}"))?;
    super::print_json(&created.result)?;
    match created.tool {
        Some(tool) if args.admit => {
            let store = ToolStore::new(ToolStore::default_dir());
            let path = store.save(&tool)?;
            eprintln!("admitted `{}` {} ({})", tool.manifest.name, tool.manifest.version, path.display());
            Ok(ExitCode::SUCCESS)
        }
        Some(tool) => {
            eprintln!("`{}` is a candidate; pass --admit to keep it", tool.manifest.name);
            Ok(ExitCode::SUCCESS)
        }
        None => Ok(ExitCode::FAILURE),
    }
}
