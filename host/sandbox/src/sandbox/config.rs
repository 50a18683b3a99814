//! Sandbox configuration (per process) and per-call limits.

use std::path::PathBuf;
use std::time::Duration;

/// How the process-wide sandbox is built. Construct with [`SandboxConfig::default`] and adjust.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// Use wasmtime's pooling instance allocator, which pre-reserves slots for instances and their
    /// memories so a fresh instance per call costs microseconds. If the operating system refuses
    /// the up-front address-space reservation the sandbox falls back to on-demand allocation and
    /// logs a warning. By default this is `true`.
    pub pooling: bool,
    /// Concurrent component instances the pool holds (nested `call-tool` calls count). By default
    /// this is `128`.
    pub max_instances: u32,
    /// The largest memory cap any call may ask for; the pool reserves this much address space per
    /// memory slot. By default this is 4 GiB.
    pub max_memory_bytes: usize,
    /// Where precompiled components are cached, keyed by content hash and engine fingerprint.
    /// `None` compiles in memory every time. By default this is `$TOOLSMITH_CACHE_DIR` or the
    /// per-user cache directory (`~/.cache/toolsmith/components` on Linux).
    pub cache_dir: Option<PathBuf>,
    /// Bytes of each linear memory the pooling allocator keeps resident between instances, reset
    /// in place (only the pages a call dirtied, found with Linux's `PAGEMAP_SCAN`) instead of being
    /// unmapped; the next instance then takes no page faults there. Used only where the kernel
    /// supports `PAGEMAP_SCAN` (Linux 6.7+); elsewhere memory is reset with `madvise` as usual.
    /// `0` disables it. By default this is 2 MiB.
    pub keep_resident_bytes: usize,
    /// Resolution of the wall-clock deadline: a background thread advances the engine's epoch this
    /// often while calls are running. By default this is 1 ms.
    pub epoch_tick: Duration,
    /// PEM certificates that replace the built-in Mozilla roots for granted tools' HTTPS (an
    /// operator's internal CA). By default this is `None`; the CLI reads `$TOOLSMITH_HTTP_CA`.
    pub http_ca_pem: Option<Vec<u8>>,
    /// Per-call limits of granted tools' outgoing HTTP.
    pub http_limits: super::reach::HttpLimits,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            pooling: true,
            max_instances: 128,
            max_memory_bytes: 4 << 30,
            keep_resident_bytes: 2 << 20,
            cache_dir: default_cache_dir(),
            epoch_tick: Duration::from_millis(1),
            http_ca_pem: None,
            http_limits: super::reach::HttpLimits::default(),
        }
    }
}

/// `$TOOLSMITH_CACHE_DIR`, else `<user cache dir>/toolsmith/components`.
pub fn default_cache_dir() -> Option<PathBuf> {
    match std::env::var_os("TOOLSMITH_CACHE_DIR") {
        Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
        _ => dirs::cache_dir().map(|d| d.join("toolsmith").join("components")),
    }
}

/// Limits applied to one call (and, for nested `call-tool` calls, to each callee).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock deadline from the start of the call. By default this is 10 s.
    pub timeout: Duration,
    /// Cap on the tool's linear memory, in bytes. By default this is 64 MiB.
    pub memory_bytes: usize,
    /// Cap on the size of the tool's JSON result, in bytes. By default this is 1 MiB.
    pub output_bytes: usize,
    /// Cap on what a call may log (through `log` or standard error), in bytes; beyond it lines
    /// are dropped and the call's report says so. By default this is 64 KiB.
    pub log_bytes: usize,
    /// How deep `call-tool` may nest. By default this is 4.
    pub max_depth: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout: Duration::from_secs(10),
            memory_bytes: 64 << 20,
            output_bytes: 1 << 20,
            log_bytes: 64 << 10,
            max_depth: 4,
        }
    }
}
