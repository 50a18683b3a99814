//! 10,000 sequential calls must not grow resident memory beyond a stated bound. A test binary of
//! its own, so other tests' allocations do not disturb the measurement.

use serde_json::json;
use toolsmith_sandbox::{Limits, Sandbox, SandboxConfig, Toolbox};

/// Allowed growth of resident memory over 10,000 calls after warm-up. A leak of one instance's
/// memory per call (≥ 1 MiB for the calculator) would exceed it hundreds of times over.
const BOUND_BYTES: u64 = 24 << 20;

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).expect("rss field");
    pages * 4096
}

#[test]
fn ten_thousand_calls_do_not_grow_resident_memory() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache");
    let config = SandboxConfig { cache_dir: Some(dir), ..SandboxConfig::default() };
    let toolbox = Toolbox::new(Sandbox::new(config).expect("sandbox"));
    toolbox.add_component(toolsmith_bundled::get("calculator").expect("calculator").component).expect("load");
    let call = |i: u32| {
        let out = toolbox
            .call("calculator", &json!({ "expression": format!("{i} * 2 + 1") }), Limits::default())
            .expect("call");
        assert_eq!(out.value["value"], f64::from(i * 2 + 1));
    };
    for i in 0..500 {
        call(i);
    }
    let before = rss_bytes();
    for i in 0..10_000 {
        call(i);
    }
    let after = rss_bytes();
    let growth = after.saturating_sub(before);
    eprintln!("rss before {} KiB, after {} KiB, growth {} KiB", before / 1024, after / 1024, growth / 1024);
    assert!(growth <= BOUND_BYTES, "resident memory grew by {} KiB over 10,000 calls", growth / 1024);
}
