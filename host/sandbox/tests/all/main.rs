//! Integration tests of the host against real components built from source: the bundled plugins
//! and the hostile test programs, run by the real wasmtime sandbox.

mod bundled;
mod hostile;
mod loading;
mod python;
mod reach;

use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;
use toolsmith_sandbox::{CallOutput, Limits, Sandbox, SandboxConfig, StructuredError, Toolbox};

/// One toolbox per test process (one engine, as in production) with every bundled plugin and the
/// `hostile` test program registered.
pub fn toolbox() -> &'static Toolbox {
    static TOOLBOX: OnceLock<Toolbox> = OnceLock::new();
    TOOLBOX.get_or_init(|| {
        let config = SandboxConfig { cache_dir: Some(cache_dir()), ..SandboxConfig::default() };
        let toolbox = Toolbox::new(Sandbox::new(config).expect("sandbox"));
        for bundled in toolsmith_bundled::BUNDLED {
            toolbox.add_component(bundled.component).expect("bundled plugin loads");
        }
        let hostile = toolsmith_test_programs::read(toolsmith_test_programs::HOSTILE);
        toolbox.add_component(&hostile).expect("hostile loads");
        toolbox
    })
}

pub fn cache_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache")
}

pub fn call(tool: &str, args: Value) -> Result<CallOutput, StructuredError> {
    toolbox().call(tool, &args, Limits::default())
}

pub fn call_with(tool: &str, args: Value, limits: Limits) -> Result<CallOutput, StructuredError> {
    toolbox().call(tool, &args, limits)
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The host still serves a normal call correctly.
pub fn assert_host_healthy() {
    let out = call("calculator", serde_json::json!({"expression": "6 * 7"})).expect("healthy host");
    assert_eq!(out.value["value"], 42.0);
}
