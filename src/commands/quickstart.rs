//! `toolsmith quickstart`: the main job on embedded defaults. Today: load the bundled plugins into
//! the sandbox, call each on its manifest's examples, and show what failures look like.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};
use toolsmith_host::{Limits, Toolbox};

use super::Env;

pub fn run(env: &Env) -> Result<ExitCode> {
    println!("Toolsmith quickstart\n");
    let sandbox = env.sandbox()?;
    match sandbox.cache_dir() {
        Some(dir) => println!("sandbox: wasmtime, pooling allocator, artifact cache in {}", dir.display()),
        None => println!("sandbox: wasmtime, pooling allocator, no artifact cache"),
    }
    let toolbox = Toolbox::new(sandbox);

    let bar = ProgressBar::new(toolsmith_bundled::BUNDLED.len() as u64).with_style(
        ProgressStyle::with_template("{spinner} loading plugins {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut loads = Vec::new();
    for bundled in toolsmith_bundled::BUNDLED {
        bar.set_message(bundled.name);
        let started = Instant::now();
        let tool = super::load_bundled(&toolbox, bundled)?;
        let how = tool.component().map(|c| format!("{:?}", c.cache).to_lowercase()).unwrap_or_default();
        loads.push((bundled.name, bundled.component.len(), how, started.elapsed()));
        bar.inc(1);
    }
    bar.finish_and_clear();
    println!("\nplugins (built from plugins/ by cargo, embedded in this binary):");
    println!("  {:<12} {:>9} {:>9} {:>10}", "tool", "size", "load", "artifact");
    for (name, size, how, took) in &loads {
        println!("  {:<12} {:>6} KiB {:>9} {:>10}", name, size / 1024, ms(*took), how);
    }

    println!("\nexamples from each manifest, run in a fresh sandbox instance, both schemas checked:");
    println!("  {:<11} {:<48} {:<44} {:>9}  ok", "tool", "input", "output", "time");
    let mut failures = 0;
    for tool in toolbox.tools() {
        for example in &tool.manifest.examples {
            let started = Instant::now();
            let outcome = toolbox.call(tool.name(), &example.input, Limits::default());
            let took = started.elapsed();
            let (shown, ok) = match &outcome {
                Ok(out) => (out.value.to_string(), out.value == example.output),
                Err(e) => (e.to_envelope().to_string(), false),
            };
            failures += usize::from(!ok);
            println!(
                "  {:<11} {:<48} {:<44} {:>9}  {}",
                tool.name(),
                clip(&example.input.to_string(), 48),
                clip(&shown, 44),
                us(took),
                if ok { "yes" } else { "NO" }
            );
        }
    }

    println!("\ncomposition: `units` evaluates an expression by calling `calculator` through the host:");
    show(&toolbox, "units", json!({"value": "60 * 60 * 24", "from": "s", "to": "d"}));

    println!("\nfailures are data an agent can read and correct:");
    show(&toolbox, "calculator", json!({"expression": 42}));
    show(&toolbox, "units", json!({"value": 3, "from": "km", "to": "kg"}));
    show(&toolbox, "calculater", json!({"expression": "1"}));

    if failures > 0 {
        println!("\n{failures} example(s) did not reproduce");
        return Ok(ExitCode::FAILURE);
    }
    println!("\nall examples reproduced. Next: `toolsmith call calculator --args '{{\"expression\": \"2^10\"}}'`");
    Ok(ExitCode::SUCCESS)
}

fn show(toolbox: &Toolbox, tool: &str, args: Value) {
    println!("  $ toolsmith call {tool} --args '{args}'");
    match toolbox.call(tool, &args, Limits::default()) {
        Ok(out) => println!("  {}", out.value),
        Err(e) => println!("  {}", e.to_envelope()),
    }
}

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
