//! Agent-written Python in the sandbox: per-call latency of a 10-line function with a fresh
//! interpreter instance per call, the first call after start, loading the precompiled interpreter
//! vs compiling it, and the same function run by a `python3 -c` subprocess and by a warm
//! in-process CPython (native, unsandboxed) for reference. Prints a table.
//!
//! Run with `cargo bench -p toolsmith-sandbox --bench python` (needs scripts/setup.sh's guest).
//! `KEEP_RESIDENT_KIB=N` overrides the pooling allocator's resident window for experiments.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use toolsmith_sandbox::python::{PythonRuntime, default_guest_path};
use toolsmith_sandbox::{Limits, Sandbox, SandboxConfig};

const CODE: &str = r#"
def stats(values):
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / n
    ordered = sorted(values)
    mid = n // 2
    median = ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return {"n": n, "mean": mean, "std": var ** 0.5, "median": median,
            "min": ordered[0], "max": ordered[-1]}
"#;

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort_unstable();
    samples[((samples.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let guest = default_guest_path();
    let bytes = std::fs::read(&guest).unwrap_or_else(|e| panic!("{}: {e} (run scripts/setup.sh)", guest.display()));
    let values: Vec<f64> = (1..=50).map(|i| f64::from((i * 37) % 101)).collect();
    let kwargs: Map<String, Value> = json!({ "values": values }).as_object().cloned().unwrap_or_default();
    let limits = Limits::default();
    let cache = tempfile::tempdir().expect("tempdir");

    let keep_resident = std::env::var("KEEP_RESIDENT_KIB").ok().and_then(|k| k.parse::<usize>().ok());
    // `TOOLSMITH_BENCH_LOOP=N`: only run N sandboxed calls (artifact from the user cache), for a profiler.
    if let Some(n) = std::env::var("TOOLSMITH_BENCH_LOOP").ok().and_then(|n| n.parse::<usize>().ok()) {
        let mut config = SandboxConfig::default();
        if let Some(kib) = keep_resident {
            config.keep_resident_bytes = kib << 10;
        }
        let runtime = PythonRuntime::load(Sandbox::new(config).expect("sandbox"), &guest).expect("load");
        for _ in 0..n {
            runtime.exec("stats", CODE, "stats", vec![], kwargs.clone(), limits, Some(1)).expect("call");
        }
        return;
    }

    // Cold compile of the interpreter (no cache), then the precompiled artifact from the cache.
    let uncached = Sandbox::new(SandboxConfig { cache_dir: None, ..SandboxConfig::default() }).expect("sandbox");
    let t = Instant::now();
    uncached.load_python(&bytes).expect("compile");
    let cold_compile = t.elapsed();
    let mut config = SandboxConfig { cache_dir: Some(cache.path().to_owned()), ..SandboxConfig::default() };
    if let Some(kib) = keep_resident {
        config.keep_resident_bytes = kib << 10;
    }
    Sandbox::new(config.clone()).expect("sandbox").load_python(&bytes).expect("fill the cache");

    // A fresh process's view: sandbox, mmap-load the artifact, first call.
    let t = Instant::now();
    let sandbox = Sandbox::new(config).expect("sandbox");
    let runtime = PythonRuntime::load(sandbox, &guest).expect("load");
    let load = t.elapsed();
    let t = Instant::now();
    let first = runtime.exec("stats", CODE, "stats", vec![], kwargs.clone(), limits, Some(1)).expect("first call");
    let first_call = t.elapsed();
    assert_eq!(first.result["n"], 50);

    // Steady state: a fresh instance per call.
    let mut samples: Vec<Duration> = (0..300)
        .map(|_| {
            let t = Instant::now();
            runtime.exec("stats", CODE, "stats", vec![], kwargs.clone(), limits, Some(1)).expect("call");
            t.elapsed()
        })
        .collect();
    let (p50, p99) = (percentile(&mut samples, 0.5), percentile(&mut samples, 0.99));

    // References: a python3 subprocess per call, and a warm native interpreter. Resolve the real
    // interpreter first: a version-manager shim on PATH would add its own start-up to each call.
    let python3 = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".to_owned());
    let args_json = serde_json::to_string(&kwargs).expect("json");
    let script = format!("{CODE}\nimport json, sys\nprint(json.dumps(stats(**json.loads(sys.argv[1]))))");
    let mut subprocess: Vec<Duration> = (0..20)
        .map(|_| {
            let t = Instant::now();
            let out = Command::new(&python3).arg("-c").arg(&script).arg(&args_json).output().expect("python3");
            assert!(out.status.success());
            t.elapsed()
        })
        .collect();
    let subprocess_p50 = percentile(&mut subprocess, 0.5);
    let timeit = format!(
        "{CODE}\nimport json, timeit, sys\nkw = json.loads(sys.argv[1])\nn = 2000\nprint(min(timeit.repeat(lambda: stats(**kw), number=n, repeat=5)) / n)"
    );
    let out = Command::new(&python3).arg("-c").arg(&timeit).arg(&args_json).output().expect("python3");
    let in_process: f64 = String::from_utf8_lossy(&out.stdout).trim().parse::<f64>().unwrap_or(f64::NAN) * 1e3;

    println!("10-line Python function (stats over 50 numbers)");
    println!("{:<62} {:>10} {:>12}", "path", "ms", "vs sandbox");
    let row = |name: &str, v: f64| println!("{:<62} {:>10.3} {:>11.2}x", name, v, v / ms(p50));
    row("sandbox, fresh instance per call: p50", ms(p50));
    row("sandbox, fresh instance per call: p99", ms(p99));
    row("first call after start (instance + call)", ms(first_call));
    row("python3 -c subprocess per call: p50", ms(subprocess_p50));
    row("warm native CPython, in-process call (timeit best)", in_process);
    println!();
    println!("loading the interpreter component ({:.1} MiB)", bytes.len() as f64 / (1 << 20) as f64);
    println!("{:<62} {:>10}", "path", "ms");
    println!("{:<62} {:>10.1}", "sandbox + precompiled artifact from the cache (mmap)", ms(load));
    println!("{:<62} {:>10.1}", "cold compile with Cranelift", ms(cold_compile));
    println!();
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    println!(
        "targets: p50 <= 2 ms -> {:.2} ms ({}); first call <= 50 ms -> {:.1} ms ({}); faster than a subprocess -> {:.1}x ({})",
        ms(p50),
        verdict(ms(p50) <= 2.0),
        ms(first_call),
        verdict(ms(first_call) <= 50.0),
        ms(subprocess_p50) / ms(p50),
        verdict(p50 < subprocess_p50),
    );
}
