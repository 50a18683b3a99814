//! `toolsmith create`: SEARL's `create_and_execute_mcp` from the command line.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use toolsmith_contract::Provenance;
use toolsmith_registry::{NewTool, Registered};
use toolsmith_sandbox::python::create::{CreateRequest, DEFAULT_TIMEOUT_SECS, create_and_execute};

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
    let runtime = toolbox.python().context("the Python runtime is not loaded")?;
    let provenance = Provenance { author: Some("cli".into()), ..Provenance::default() };
    // A tool of that name already in the registry is superseded (Python) or a conflict (any
    // other kind); only look when the tool is to be admitted, so a dry run needs no registry.
    let existing = match toolbox.get(&request.name) {
        Some(tool) => Some(tool.manifest.clone()),
        None if args.admit => env.registry()?.get(&request.name).ok().map(|r| r.manifest),
        None => None,
    };
    let created = create_and_execute(&runtime, &request, existing.as_ref(), provenance);
    super::print_json(&created.result)?;
    match created.tool {
        Some(tool) if args.admit => {
            let mut registry = env.registry()?;
            let new = NewTool::new(tool.manifest.clone()).with_blob(tool.to_blob());
            match registry.register(new, true).context("cannot register the tool")? {
                Registered::Merged { name, into, similarity } => {
                    eprintln!(
                        "`{name}` is a near-duplicate of `{into}` (cosine {similarity:.3}): recorded as its alias"
                    )
                }
                outcome => eprintln!(
                    "admitted `{}` {} into the registry {}",
                    outcome.canonical(),
                    tool.manifest.version,
                    registry.path().display()
                ),
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(tool) => {
            eprintln!("`{}` is a candidate; pass --admit to keep it", tool.manifest.name);
            Ok(ExitCode::SUCCESS)
        }
        None => Ok(ExitCode::FAILURE),
    }
}
