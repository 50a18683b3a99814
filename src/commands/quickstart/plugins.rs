//! The sandbox and the bundled plugins loaded into it, with each one's size and load time.

use std::time::{Duration, Instant};

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use toolsmith_sandbox::Toolbox;

use super::{Env, ms};
use crate::commands::load_bundled;

/// One row of the plugins table.
struct Load {
    name: &'static str,
    /// The component's size in bytes.
    size: usize,
    /// `hit` (a precompiled artifact loaded) or `compiled`; empty for a tool without a component.
    artifact: String,
    took: Duration,
}

/// Prints `sandbox: wasmtime, pooling allocator, …`, loads every bundled plugin, then prints
/// `plugins (built from plugins/ by cargo, embedded in this binary):` and their table. The
/// toolbox it returns holds them for the sections that call them.
pub(super) fn section(env: &Env) -> Result<Toolbox> {
    let sandbox = env.sandbox()?;
    match sandbox.cache_dir() {
        Some(dir) => println!("sandbox: wasmtime, pooling allocator, artifact cache in {}", dir.display()),
        None => println!("sandbox: wasmtime, pooling allocator, no artifact cache"),
    }
    let toolbox = Toolbox::new(sandbox);
    let loads = load_all(&toolbox)?;
    println!("\nplugins (built from plugins/ by cargo, embedded in this binary):");
    println!("  {:<12} {:>9} {:>9} {:>10}", "tool", "size", "load", "artifact");
    for Load { name, size, artifact, took } in &loads {
        println!("  {:<12} {:>6} KiB {:>9} {:>10}", name, size / 1024, ms(*took), artifact);
    }
    Ok(toolbox)
}

/// Loads the bundled plugins behind a progress bar, timing each.
fn load_all(toolbox: &Toolbox) -> Result<Vec<Load>> {
    let bar = ProgressBar::new(toolsmith_bundled::BUNDLED.len() as u64).with_style(
        ProgressStyle::with_template("{spinner} loading plugins {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut loads = Vec::new();
    for bundled in toolsmith_bundled::BUNDLED {
        bar.set_message(bundled.name);
        let started = Instant::now();
        let tool = load_bundled(toolbox, bundled)?;
        let artifact = tool.component().map(|c| format!("{:?}", c.cache).to_lowercase()).unwrap_or_default();
        loads.push(Load { name: bundled.name, size: bundled.component.len(), artifact, took: started.elapsed() });
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(loads)
}
