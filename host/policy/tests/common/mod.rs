//! Helpers shared by the policy's integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use toolsmith_policy::{LoadOptions, Policy, Precision};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Python with PyTorch 2.11.0 and transformers, from the cached reference venv (created on first
/// use by scripts/torch-reference-env.sh; about 3 GB of wheels), or the interpreter that
/// `TOOLSMITH_REFERENCE_PYTHON` names (a GPU machine's own CUDA PyTorch, say).
pub fn reference_python() -> PathBuf {
    if let Some(python) = std::env::var_os("TOOLSMITH_REFERENCE_PYTHON").filter(|p| !p.is_empty()) {
        return PathBuf::from(python);
    }
    let output = Command::new(repo_root().join("scripts/torch-reference-env.sh"))
        .output()
        .expect("run scripts/torch-reference-env.sh");
    assert!(
        output.status.success(),
        "the reference venv could not be created:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    PathBuf::from(stdout.lines().last().expect("venv script prints the python path").trim())
}

/// One libtorch thread: tests run in parallel on few cores, where more threads only thrash.
pub fn one_thread() {
    toolsmith_policy::set_threads(1);
}

/// The tiny default model on the CPU, in f32: these tests check exact agreements (batched and
/// alone, cached and not), which bf16's rounding of differently shaped products would blur.
pub fn tiny(seed: u64) -> Policy {
    one_thread();
    Policy::tiny(seed, LoadOptions { precision: Some(Precision::F32), ..Default::default() }).expect("tiny policy")
}

/// Peak resident set size of this process, MiB (Linux `VmHWM`).
pub fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}
