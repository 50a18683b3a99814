//! One `calculator` call end to end (fresh instance, both schema checks) against two baselines
//! measured in the same run: the same Rust logic called natively with the same checks, and a naive
//! wasmtime path (compile from bytes, no pooling, no `InstancePre`). Also: loading a cached
//! precompiled component vs compiling it cold. Prints a table of medians and ratios.
//!
//! Run with `cargo bench -p toolsmith-sandbox --bench call` (release profile).

mod common;

use std::time::Duration;

use common::{measure, us};
use serde_json::{Value, json};
use toolsmith_sandbox::validate::ToolSchemas;
use toolsmith_sandbox::{Limits, Sandbox, SandboxConfig, Toolbox};

fn main() {
    let bytes = toolsmith_bundled::get("calculator").expect("calculator is bundled").component;
    let args = json!({"expression": "2 * (3 + 4) ^ 2 / sqrt(16)"});
    let cache = tempfile::tempdir().expect("tempdir");

    // Toolsmith's path: pooling, cached artifact, InstancePre, fresh instance per call.
    let config = SandboxConfig { cache_dir: Some(cache.path().to_owned()), ..SandboxConfig::default() };
    let toolbox = Toolbox::new(Sandbox::new(config).expect("sandbox"));
    let tool = toolbox.add_component(bytes).expect("load");
    // `TOOLSMITH_BENCH_LOOP=N`: only run N calls of Toolsmith's path, for a profiler.
    if let Some(n) = std::env::var("TOOLSMITH_BENCH_LOOP").ok().and_then(|n| n.parse::<usize>().ok()) {
        for _ in 0..n {
            toolbox.call("calculator", &args, Limits::default()).expect("call");
        }
        return;
    }
    let (wasm_p50, wasm_p99) = measure(20_000, || {
        let out = toolbox.call("calculator", &args, Limits::default()).expect("call");
        assert_eq!(out.value["value"], 24.5);
    });

    // Same logic natively, same checks (validators compiled from the same manifest).
    let manifest = calculator::manifest();
    let schemas = ToolSchemas::compile(&manifest.input_schema, &manifest.output_schema).expect("schemas");
    let (native_p50, native_p99) = measure(20_000, || {
        schemas.check_args("calculator", &args).expect("args");
        let out = calculator::call_json(&args.to_string()).expect("call");
        let value: Value = serde_json::from_str(&out).expect("json");
        schemas.check_output("calculator", &value).expect("output");
        assert_eq!(value["value"], 24.5);
    });

    // Naive wasmtime: compile from bytes, no pooling, no InstancePre, every call.
    let naive =
        Sandbox::new(SandboxConfig { pooling: false, cache_dir: None, ..SandboxConfig::default() }).expect("sandbox");
    let text = args.to_string();
    let (naive_p50, naive_p99) = measure(30, || {
        let out = naive.call_naive(bytes, "calculator", &text, Limits::default()).expect("call");
        assert!(out.contains("24.5"));
    });

    // Fresh instance per call without the pooling allocator (everything else as Toolsmith's path).
    let on_demand = Toolbox::new(
        Sandbox::new(SandboxConfig {
            pooling: false,
            cache_dir: Some(cache.path().to_owned()),
            ..SandboxConfig::default()
        })
        .expect("sandbox"),
    );
    on_demand.add_component(bytes).expect("load");
    let (od_p50, od_p99) = measure(20_000, || {
        on_demand.call("calculator", &args, Limits::default()).expect("call");
    });

    // Loading: cached precompiled artifact (mmap) vs cold compile.
    let sandbox = toolbox.sandbox();
    let (hit_p50, _) = measure(200, || {
        sandbox.load(bytes).expect("cached load");
    });
    let uncached = Sandbox::new(SandboxConfig { cache_dir: None, ..SandboxConfig::default() }).expect("sandbox");
    let (cold_p50, _) = measure(10, || {
        uncached.load(bytes).expect("cold load");
    });

    println!("calculator call, end to end (args check, fresh instance, call, output check)");
    println!("{:<58} {:>10} {:>10} {:>12}", "path", "p50 µs", "p99 µs", "p50 ratio");
    let row = |name: &str, p50: Duration, p99: Duration| {
        println!("{:<58} {:>10.1} {:>10.1} {:>11.2}x", name, us(p50), us(p99), us(p50) / us(native_p50));
    };
    row("native Rust, same logic and checks (baseline)", native_p50, native_p99);
    row("toolsmith: pooling + InstancePre + cached artifact", wasm_p50, wasm_p99);
    row("on-demand allocator + InstancePre", od_p50, od_p99);
    row("naive: compile from bytes, no pooling, no InstancePre", naive_p50, naive_p99);
    println!();
    println!("loading the component ({} KiB)", bytes.len() / 1024);
    println!("{:<58} {:>10}", "path", "p50 ms");
    println!("{:<58} {:>10.3}", "precompiled artifact from the cache (mmap)", cold_or(hit_p50));
    println!("{:<58} {:>10.3}", "cold compile (Cranelift)", cold_or(cold_p50));
    println!("{:<58} {:>9.0}x", "speed-up", us(cold_p50) / us(hit_p50));
    println!();
    println!(
        "targets: p50 <= 20 µs -> {:.1} µs ({}); <= 3x native -> {:.2}x ({}); tool: {} {}",
        us(wasm_p50),
        if us(wasm_p50) <= 20.0 { "met" } else { "MISSED" },
        us(wasm_p50) / us(native_p50),
        if us(wasm_p50) <= 3.0 * us(native_p50) { "met" } else { "MISSED" },
        tool.manifest.name,
        tool.manifest.version,
    );
}

fn cold_or(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
