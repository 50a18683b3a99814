//! `toolsmith quickstart`: the main job on embedded defaults: load the bundled plugins into
//! the sandbox, call each on its manifest's examples, show what failures look like, run Python tools,
//! register the bundled tools in the tool graph and search it, serve it over MCP, and create,
//! sample, score and train one step of the tiny policy.
//!
//! One file per section of the output, called by [`run`] in the order they print; each section's
//! doc comment quotes the line it prints first, so a line of output leads to its code.

mod agent;
mod composition;
mod daemon_training;
mod examples;
mod grants;
mod graph;
mod mcp;
mod plugins;
mod policy;
mod pretrained;
mod python_tools;
mod rl;
mod training;
mod typed_errors;

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;
use toolsmith_agent::env::Corpus;
use toolsmith_agent::tools::{Executor, LocalTools};
use toolsmith_sandbox::{Limits, Toolbox};

use super::Env;

pub fn run(env: &Env) -> Result<ExitCode> {
    println!("Toolsmith quickstart\n");
    let toolbox = plugins::section(env)?;
    let failures = examples::section(&toolbox);
    composition::section(&toolbox);
    typed_errors::section(&toolbox);
    grants::section(&toolbox)?;
    python_tools::section(env, &toolbox)?;
    graph::section(env)?;
    mcp::section(env)?;
    policy::section(env)?;
    agent::section(env)?;
    pretrained::section(env)?;
    training::section(env)?;
    rl::section(env)?;
    daemon_training::section(env)?;

    if failures > 0 {
        println!("\n{failures} example(s) did not reproduce");
        return Ok(ExitCode::FAILURE);
    }
    println!("\nall examples reproduced. Next: `toolsmith call calculator --args '{{\"expression\": \"2^10\"}}'`");
    Ok(ExitCode::SUCCESS)
}

/// Prints a call as the user would type it, then its output or its error envelope.
fn show(toolbox: &Toolbox, tool: &str, args: Value) {
    println!("  $ toolsmith call {tool} --args '{args}'");
    match toolbox.call(tool, &args, Limits::default()) {
        Ok(out) => println!("  {}", out.value),
        Err(e) => println!("  {}", e.to_envelope()),
    }
}

/// `s` cut to `width` characters, an ellipsis marking the cut, so table columns stay aligned.
fn clip(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_owned()
    } else {
        let head: String = s.chars().take(width - 1).collect();
        format!("{head}…")
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn us(d: Duration) -> String {
    format!("{} µs", d.as_micros())
}

/// Removes what an earlier quickstart left in `dir`, so each run starts a fresh training run
/// instead of resuming the last one.
fn clear_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("cannot clear {}", dir.display()))?;
    }
    Ok(())
}

/// The agent's local tools over `corpus`: what the training sections give their worlds.
fn corpus_tools(corpus: Arc<Corpus>) -> Arc<dyn Executor> {
    Arc::new(LocalTools::new().with_corpus(corpus))
}
