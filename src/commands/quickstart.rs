//! `toolsmith quickstart`: the main job on embedded defaults: load the bundled plugins into
//! the sandbox, call each on its manifest's examples, show what failures look like, run Python tools,
//! and register the bundled tools in the tool graph and search it.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};
use toolsmith_host::python::create::CreateRequest;
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

    python_section(env, &toolbox)?;
    registry_section(env)?;

    if failures > 0 {
        println!("\n{failures} example(s) did not reproduce");
        return Ok(ExitCode::FAILURE);
    }
    println!("\nall examples reproduced. Next: `toolsmith call calculator --args '{{\"expression\": \"2^10\"}}'`");
    Ok(ExitCode::SUCCESS)
}

/// Agent-written Python: SEARL's create_and_execute_mcp, then calls by name, then hostile code.
fn python_section(env: &Env, toolbox: &Toolbox) -> Result<()> {
    println!("\nagent-written Python (CPython as a WebAssembly component, a fresh instance per call):");
    let started = Instant::now();
    let runtime = match env.python_runtime(toolbox.sandbox()) {
        Ok(runtime) => runtime,
        Err(e) => {
            println!("  skipped: {e:#}");
            return Ok(());
        }
    };
    println!("  loaded the interpreter in {} ({:?})", ms(started.elapsed()), runtime.component().cache);
    toolbox.set_python(runtime);
    let request = CreateRequest {
        name: "quadratic_solver".into(),
        description: "Solve ax^2+bx+c=0".into(),
        arguments: "a,b,c (float)".into(),
        returns: "roots list".into(),
        code: "import math\n\ndef quadratic_solver(a, b, c):\n    d = b * b - 4 * a * c\n    if d < 0:\n        \
               return []\n    r = math.sqrt(d)\n    return [(-b + r) / (2 * a), (-b - r) / (2 * a)]\n"
            .into(),
        inputs: json!({"a": 1, "b": -3, "c": 2}).as_object().cloned().unwrap_or_default(),
        timeout: 15.0,
    };
    println!(
        "  $ create_and_execute_mcp(name=\"quadratic_solver\", arguments=\"a,b,c (float)\", inputs={{a: 1, b: -3, c: 2}})"
    );
    let created = toolbox.create_python(&request, Default::default()).map_err(|e| anyhow::anyhow!("{e}"))?;
    println!("  {}", serde_json::to_string(&created.result)?);
    if let Some(tool) = created.tool {
        println!("  derived input schema: {}", tool.manifest.input_schema);
        toolbox.register(toolbox.python_tool(tool)?);
        println!("  admitted; now called by name, validated and sandboxed like any tool:");
        show(toolbox, "quadratic_solver", json!({"a": 2, "b": -4, "c": -6}));
        show(toolbox, "quadratic_solver", json!({"a": "two", "b": -4, "c": -6}));
    }
    println!("  hostile code gets a typed outcome and the host keeps going:");
    for (label, code) in [
        ("while True: pass", "def f():\n    while True:\n        pass\n"),
        ("open('/etc/passwd')", "def f():\n    return open('/etc/passwd').read()\n"),
        ("import socket", "def f():\n    import socket\n"),
    ] {
        let limits = Limits { timeout: Duration::from_millis(300), ..Limits::default() };
        let python = toolbox.python().ok_or_else(|| anyhow::anyhow!("no Python runtime"))?;
        let outcome = match python.exec("f", code, "f", Vec::new(), Default::default(), limits, None) {
            Ok(run) => format!("ok: {}", run.result),
            Err(f) => f.error.to_string(),
        };
        println!("  {label:<22} -> {}", clip(&outcome, 90));
    }
    Ok(())
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

/// The tool graph: the bundled tools registered, then a two-step plan retrieved.
fn registry_section(env: &Env) -> Result<()> {
    let started = Instant::now();
    let mut registry = super::tools::open_registry(env)?;
    println!(
        "\ntool graph: {} ({} tools; SQLite + tantivy BM25 + MiniLM embeddings)",
        registry.path().display(),
        registry.len()?
    );
    let queries = ["turn 5 miles into kilometres", "pull the price field out of this JSON order"];
    let hits = registry.search(&toolsmith_registry::SearchRequest::new(queries).k(1))?;
    println!("  hybrid search, one hit per sub-plan, with the score breakdown ({}):", ms(started.elapsed()));
    for h in hits {
        let e = &h.explain;
        println!(
            "  {:<46} -> {:<11} {:.3} (bm25 {:.2}, cosine {:.3})",
            format!("{:?}", e.query),
            h.name,
            h.score,
            e.sparse,
            e.cosine.unwrap_or_default()
        );
    }
    println!("  browse it: toolsmith tools list | show NAME | search TEXT --explain | graph --html graph.html");
    Ok(())
}
