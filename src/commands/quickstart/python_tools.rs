//! Agent-written Python: SEARL's `create_and_execute_mcp`, then the admitted tool called by name,
//! then hostile code.

use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::json;
use toolsmith_sandbox::python::create::CreateRequest;
use toolsmith_sandbox::{Limits, Toolbox};

use super::{Env, clip, ms, show};

/// Prints `agent-written Python (CPython as a WebAssembly component, a fresh instance per call):`,
/// then `  skipped: …` and nothing more when the Python guest is missing.
pub(super) fn section(env: &Env, toolbox: &Toolbox) -> Result<()> {
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
    create_and_admit(toolbox)?;
    hostile_code(toolbox)
}

/// Creates `quadratic_solver` as SEARL's agent would, admits it and calls it by name, once well
/// and once with a bad argument.
fn create_and_admit(toolbox: &Toolbox) -> Result<()> {
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
    Ok(())
}

/// Runs code that loops, reads a host file and opens a socket; each gets a typed outcome.
fn hostile_code(toolbox: &Toolbox) -> Result<()> {
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
