//! The wasmtime sandbox every tool runs in.
//!
//! One [`Sandbox`] per process holds one `wasmtime::Engine` (pooling allocator, epoch
//! interruption), one `Linker` and the on-disk artifact cache. [`Sandbox::load`] compiles (or
//! maps from cache) a component, checks its imports against [`ALLOWED_INTERFACES`] and prepares an
//! `InstancePre`; [`Sandbox::call`] runs one call in a **fresh instance** in a fresh `Store` under
//! [`Limits`]: an epoch deadline for wall time, a `ResourceLimiter` for memory, a cap on the size
//! of the result and of the logs. Whatever the tool does, the call ends in a JSON string or a
//! [`StructuredError`] whose kind says what happened; the host does not panic.
//!
//! # What is linked, and why
//! Only these interfaces exist for a tool (anything else it imports is rejected at load):
//! - `toolsmith:tool/host`: `log` and `call-tool`, the tool contract itself.
//! - `wasi:cli/{environment, exit, stdin, stdout, stderr, terminal-*}`: Rust's and CPython's
//!   runtimes import these to start. The environment and arguments are empty, stdin is empty,
//!   stdout and stderr go to capped in-memory pipes (stderr becomes the call's log, and a panic
//!   message becomes the trap message), there is no terminal.
//! - `wasi:io/{error, poll, streams}`: the stream plumbing those stdio handles need.
//! - `wasi:clocks/{monotonic-clock, wall-clock}` and `wasi:random/{random, insecure,
//!   insecure-seed}`: hash-map seeding and `time`/`random` in interpreters; reading a clock or
//!   drawing random bytes reaches nothing outside the sandbox.
//!
//! - `toolsmith:tool/capabilities`: outgoing HTTP and secrets, refused as `permission_denied`
//!   unless an operator granted them to the tool (see `reach`).
//! - `wasi:filesystem/{types, preopens}`: empty unless the tool was granted directories, each
//!   then mounted read-only at `/dirs/<name>`.
//!
//! Not linked: `wasi:sockets/*`, `wasi:http/*`. A component that imports them fails to load with
//! [`LoadError::DisallowedImport`]. The alternative considered, linking everything with an empty
//! context, would also be inert, but refusing at load time tells a tool author at once.
//!
//! The Python guest (a CPython component, see `plugins/python/`) gets a second linker with the whole
//! of WASI 0.2 linked **with an empty context**: no preopened directories, TCP, UDP and name lookup
//! disallowed, no environment. CPython's runtime imports the filesystem and socket interfaces at
//! start-up; with nothing behind them, `open()` raises `FileNotFoundError` and sockets do not exist,
//! so agent code sees clean Python exceptions instead of traps.
//!
//! Fuel metering is not enabled: epoch interruption bounds wall time at a fraction of fuel's cost
//! (about 15% CPU) and without a second compiled artifact.

mod cache;
mod config;
mod reach;
mod state;

pub(crate) mod bindings {
    wasmtime::component::bindgen!({
        world: "tool",
        path: "../../schemas/wit",
    });
}

pub(crate) mod python_bindings {
    wasmtime::component::bindgen!({
        world: "runner",
        path: "../../plugins/python/wit",
        // The same interface as plugins import: one host implementation serves both.
        with: {
            "toolsmith:tool/capabilities": super::bindings::toolsmith::tool::capabilities,
            "toolsmith:tool/types": super::bindings::toolsmith::tool::types,
        },
    });
}

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use toolsmith_contract::capabilities::Grants;
use toolsmith_contract::{ErrorKind, StructuredError};
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, Trap, UpdateDeadline};
use wasmtime_wasi::{FsPerms, WasiCtxBuilder, WasiView};

pub use cache::CacheOutcome;
pub use config::{Limits, SandboxConfig, default_cache_dir};
pub use reach::{HttpLimits, PERMISSION_DENIED, is_public};
use state::{CallState, CappedPipe, ClampedClockData, Limiter, Nested};
pub use state::{LogLine, ToolCaller};

/// Interfaces a component may import (versions are not restricted). See the module docs.
pub const ALLOWED_INTERFACES: &[&str] = &[
    "toolsmith:tool/host",
    "toolsmith:tool/types",
    "toolsmith:tool/capabilities",
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:clocks/monotonic-clock",
    "wasi:clocks/wall-clock",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
    "wasi:filesystem/types",
    "wasi:filesystem/preopens",
];

/// Bytes of a tool's standard output and of its standard error kept per call (the rest is dropped).
const STDIO_CAPACITY: usize = 64 << 10;

/// Failures of the host itself (not of a tool).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// wasmtime refused the engine configuration.
    #[error("cannot create the wasmtime engine: {0}")]
    Engine(String),
    /// Linking the host interfaces failed (a bug).
    #[error("cannot link host interfaces: {0}")]
    Link(String),
    /// The CA certificates given for outgoing HTTPS do not parse.
    #[error("cannot read the HTTPS CA certificates: {0}")]
    HttpRoots(String),
}

/// Why a component could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The bytes are not WebAssembly.
    #[error("not a WebAssembly file (bad magic number); expected a component built for wasm32-wasip2")]
    NotWasm,
    /// A core module, not a component.
    #[error(
        "this is a core WebAssembly module, not a component; build the tool for wasm32-wasip2 (`toolsmith plugin build`)"
    )]
    NotAComponent,
    /// wasmtime rejected the component.
    #[error("invalid component: {0}")]
    Compile(String),
    /// The component imports an interface the sandbox does not provide.
    #[error(
        "component imports `{import}`, which the sandbox does not provide (allowed: toolsmith:tool/host and minimal WASI: cli, io, clocks, random)"
    )]
    DisallowedImport {
        /// The offending import.
        import: String,
    },
    /// The component's exports do not match `schemas/wit/tool.wit`.
    #[error("component does not implement the toolsmith:tool world: {0}")]
    WrongWorld(String),
    /// The manifest export failed or returned a bad manifest.
    #[error("bad manifest: {0}")]
    Manifest(String),
    /// Reading the component file failed.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

impl LoadError {
    /// The error as an `invalid_component` (or `not_found`) failure for the named tool.
    pub fn to_structured(&self, tool: &str) -> StructuredError {
        let kind = match self {
            LoadError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => ErrorKind::NotFound,
            _ => ErrorKind::InvalidComponent,
        };
        StructuredError::new(kind, tool, self.to_string())
    }
}

/// A component that passed loading: compiled, imports checked, linked.
#[derive(Clone)]
pub struct LoadedComponent {
    pre: bindings::ToolPre<CallState>,
    /// BLAKE3 hash of the component bytes, hex.
    pub hash: String,
    /// Whether it came from the artifact cache.
    pub cache: CacheOutcome,
    /// The WIT interfaces it imports, each checked against the allowed set when it loaded.
    pub imports: Vec<String>,
}

impl std::fmt::Debug for LoadedComponent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedComponent").field("hash", &self.hash).field("imports", &self.imports).finish()
    }
}

/// What a successful call produced besides its result.
#[derive(Debug, Clone, Default)]
pub struct CallReport {
    /// Log lines from `log` and standard error.
    pub logs: Vec<LogLine>,
    /// Log lines dropped because the log cap was reached.
    pub logs_dropped: usize,
    /// Wall time of instantiation plus the call.
    pub elapsed: Duration,
    /// The tool asked for more memory than its cap at some point (and was refused) but still
    /// finished: an interpreter may turn a refused allocation into an exception it reports.
    pub memory_limit_hit: bool,
    /// The capability the host last refused the tool (e.g. `http:https://a.com:443`), if any.
    pub denied: Option<String>,
}

impl CallReport {
    /// Appends captured standard output and error, one log line per non-empty line.
    pub fn push_output(&mut self, stdout: &str, stderr: &str) {
        for (level, text) in [("stdout", stdout), ("stderr", stderr)] {
            for line in text.lines().filter(|l| !l.is_empty()) {
                self.logs.push(LogLine { level, message: line.to_owned() });
            }
        }
    }
}

/// The Python guest, compiled and linked.
#[derive(Clone)]
pub struct PythonComponent {
    pre: python_bindings::RunnerPre<CallState>,
    /// BLAKE3 hash of the component bytes, hex.
    pub hash: String,
    /// Whether it came from the artifact cache.
    pub cache: CacheOutcome,
}

impl std::fmt::Debug for PythonComponent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PythonComponent").field("hash", &self.hash).finish()
    }
}

/// The process-wide sandbox. Cheap to clone; all clones share the engine.
#[derive(Clone)]
pub struct Sandbox {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    linker: Linker<CallState>,
    python_linker: Linker<CallState>,
    cache: cache::ArtifactCache,
    config: SandboxConfig,
    ticker: Ticker,
    agents: Arc<reach::Agents>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox").field("config", &self.inner.config).finish()
    }
}

impl Sandbox {
    /// Builds the engine, the linker and the cache. Falls back to on-demand allocation when the
    /// pooling allocator cannot reserve its address space.
    pub fn new(config: SandboxConfig) -> Result<Sandbox, SandboxError> {
        let mut modes = Vec::new();
        if config.pooling {
            if config.keep_resident_bytes > 0 {
                modes.push(Allocation::PoolingResident);
            }
            modes.push(Allocation::Pooling);
        }
        modes.push(Allocation::OnDemand);
        let mut last_error = None;
        let mut engine = None;
        for mode in modes {
            match build_engine(&config, mode) {
                Ok(built) => {
                    tracing::debug!(?mode, "wasmtime engine ready");
                    engine = Some(built);
                    break;
                }
                Err(e) => {
                    tracing::debug!(?mode, error = %e, "engine configuration unavailable; trying the next");
                    if mode == Allocation::Pooling {
                        tracing::warn!(error = %e, "pooling allocator unavailable; using on-demand allocation");
                    }
                    last_error = Some(e);
                }
            }
        }
        let engine = engine.ok_or_else(|| {
            SandboxError::Engine(last_error.map(|e| e.to_string()).unwrap_or_else(|| "no configuration".into()))
        })?;
        let linker = build_linker(&engine).map_err(|e| SandboxError::Link(e.to_string()))?;
        let python_linker = build_python_linker(&engine).map_err(|e| SandboxError::Link(e.to_string()))?;
        let cache = cache::ArtifactCache::new(&engine, config.cache_dir.clone());
        let agents = Arc::new(reach::Agents::new(config.http_ca_pem.as_deref()).map_err(SandboxError::HttpRoots)?);
        let ticker = Ticker::start(engine.clone(), config.epoch_tick);
        Ok(Sandbox { inner: Arc::new(Inner { engine, linker, python_linker, cache, config, ticker, agents }) })
    }

    /// The wasmtime engine (shared by every tool of this process).
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// The configuration the sandbox was built with.
    pub fn config(&self) -> &SandboxConfig {
        &self.inner.config
    }

    /// Where precompiled artifacts are cached, if anywhere.
    pub fn cache_dir(&self) -> Option<&std::path::Path> {
        self.inner.cache.dir()
    }

    /// Compiles (or loads from cache) a component, checks its imports and links it.
    pub fn load(&self, bytes: &[u8]) -> Result<LoadedComponent, LoadError> {
        let (component, cache, hash) = self.compile(bytes)?;
        let imports = check_imports(&self.inner.engine, &component)?;
        let instance_pre =
            self.inner.linker.instantiate_pre(&component).map_err(|e| LoadError::WrongWorld(format!("{e:#}")))?;
        let pre = bindings::ToolPre::new(instance_pre).map_err(|e| LoadError::WrongWorld(format!("{e:#}")))?;
        Ok(LoadedComponent { pre, hash, cache, imports })
    }

    /// Checks the header, then compiles `bytes` (or maps them from the artifact cache).
    fn compile(&self, bytes: &[u8]) -> Result<(Component, CacheOutcome, String), LoadError> {
        match bytes.get(..8) {
            Some([0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00]) => return Err(LoadError::NotAComponent),
            Some([0x00, 0x61, 0x73, 0x6d, ..]) => {}
            _ => return Err(LoadError::NotWasm),
        }
        self.inner.cache.load(&self.inner.engine, bytes).map_err(|e| LoadError::Compile(format!("{e:#}")))
    }

    /// Reads a loaded component's manifest JSON (fresh instance, default limits, no `call-tool`).
    pub fn manifest_json(&self, component: &LoadedComponent, tool: &str) -> Result<String, StructuredError> {
        let instantiate = |store: &mut Store<CallState>| component.pre.instantiate(store);
        self.run(instantiate, tool, Limits::default(), None, None, |bindings, store| {
            bindings.call_manifest(store).map(Ok)
        })
        .map(|(json, _)| json)
    }

    /// Calls a loaded component's `call` export with `args` (already validated JSON text) in a
    /// fresh instance. `caller` resolves `call-tool`; `None` makes `call-tool` fail cleanly.
    pub fn call(
        &self,
        component: &LoadedComponent,
        tool: &str,
        args: &str,
        limits: Limits,
        caller: Option<(Arc<dyn ToolCaller>, u32)>,
    ) -> Result<(String, CallReport), StructuredError> {
        self.call_granted(component, tool, args, limits, caller, None)
    }

    /// [`Sandbox::call`] for a tool an operator granted capabilities: its directories are mounted
    /// read-only, its environment variables passed, its hosts and secrets reachable through
    /// `toolsmith:tool/capabilities`. `None` (or empty grants) is a pure call.
    pub fn call_granted(
        &self,
        component: &LoadedComponent,
        tool: &str,
        args: &str,
        limits: Limits,
        caller: Option<(Arc<dyn ToolCaller>, u32)>,
        grants: Option<&Arc<Grants>>,
    ) -> Result<(String, CallReport), StructuredError> {
        let deadline = Instant::now() + limits.timeout;
        let nested = caller.map(|(caller, depth)| Nested { caller, depth, deadline, limits });
        let instantiate = |store: &mut Store<CallState>| component.pre.instantiate(store);
        self.run(instantiate, tool, limits, nested, grants, |bindings, store| bindings.call_call(store, args))
    }

    /// The naive path, kept as a benchmark baseline: compile the component from its bytes and
    /// instantiate it through the linker (no artifact cache, no `InstancePre`), for every call.
    /// Use a sandbox built with `pooling: false` to also leave out the pooling allocator.
    #[doc(hidden)]
    pub fn call_naive(&self, bytes: &[u8], tool: &str, args: &str, limits: Limits) -> Result<String, StructuredError> {
        let component = Component::new(&self.inner.engine, bytes)
            .map_err(|e| StructuredError::new(ErrorKind::InvalidComponent, tool, format!("{e:#}")))?;
        let linker = &self.inner.linker;
        let instantiate = |store: &mut Store<CallState>| bindings::Tool::instantiate(store, &component, linker);
        self.run(instantiate, tool, limits, None, None, |bindings, store| bindings.call_call(store, args))
            .map(|(out, _)| out)
    }

    /// Compiles (or loads from cache) the Python guest component and links it.
    pub fn load_python(&self, bytes: &[u8]) -> Result<PythonComponent, LoadError> {
        let (component, cache, hash) = self.compile(bytes)?;
        let instance_pre = self
            .inner
            .python_linker
            .instantiate_pre(&component)
            .map_err(|e| LoadError::WrongWorld(format!("{e:#}")))?;
        let pre = python_bindings::RunnerPre::new(instance_pre).map_err(|e| LoadError::WrongWorld(format!("{e:#}")))?;
        Ok(PythonComponent { pre, hash, cache })
    }

    /// Sends one JSON request to a fresh instance of the Python guest and returns its JSON
    /// response text. The response is the guest's; the caller interprets it.
    pub fn run_python(
        &self,
        component: &PythonComponent,
        tool: &str,
        request: &str,
        limits: Limits,
        grants: Option<&Arc<Grants>>,
    ) -> Result<(String, CallReport), StructuredError> {
        let instantiate = |store: &mut Store<CallState>| component.pre.instantiate(store);
        self.run(instantiate, tool, limits, None, grants, |runner, store| runner.call_run(store, request).map(Ok))
    }

    fn run<B>(
        &self,
        instantiate: impl FnOnce(&mut Store<CallState>) -> wasmtime::Result<B>,
        tool: &str,
        limits: Limits,
        nested: Option<Nested>,
        grants: Option<&Arc<Grants>>,
        f: impl FnOnce(&B, &mut Store<CallState>) -> wasmtime::Result<Result<String, bindings::ToolError>>,
    ) -> Result<(String, CallReport), StructuredError> {
        let started = Instant::now();
        let memory_bytes = limits.memory_bytes.min(self.inner.config.max_memory_bytes);
        let stdout = CappedPipe::new(STDIO_CAPACITY);
        let stderr = CappedPipe::new(STDIO_CAPACITY);
        // An empty context: no arguments, environment, preopened directories or network, except
        // what an operator granted this tool.
        let mut builder = WasiCtxBuilder::new();
        builder
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        let grants = grants.filter(|g| !g.is_empty());
        if let Some(grants) = grants {
            for dir in &grants.dirs {
                // cap-std under wasmtime-wasi resolves every path inside the directory: `..` and
                // symlinks that lead out of it fail like a missing file.
                builder.preopened_dir(&dir.path, format!("/dirs/{}", dir.name), FsPerms::ReadOnly).map_err(|e| {
                    StructuredError::new(
                        ErrorKind::PermissionDenied,
                        tool,
                        format!(
                            "the granted directory `{}` ({}) cannot be opened: {e:#}",
                            dir.name,
                            dir.path.display()
                        ),
                    )
                    .with_hint("the operator should grant an existing directory again")
                })?;
            }
            for var in &grants.env {
                if let Some(value) = std::env::var_os(var).and_then(|v| v.into_string().ok()) {
                    builder.env(var, value);
                }
            }
        }
        let wasi = builder.build();
        let granted = grants.cloned().unwrap_or_else(reach::nothing);
        let reach = reach::Reach::new(tool, granted, self.inner.config.http_limits);
        let state = CallState {
            wasi,
            table: ResourceTable::new(),
            limiter: Limiter { memory_bytes, hit: false },
            stdout,
            stderr,
            logs: Vec::new(),
            log_bytes: 0,
            log_cap: limits.log_bytes,
            logs_dropped: 0,
            nested,
            deadline: started + limits.timeout,
            reach,
            agents: self.inner.agents.clone(),
        };
        let mut store = Store::new(&self.inner.engine, state);
        store.limiter(|s| &mut s.limiter);
        let _running = self.inner.ticker.running();
        let tick = self.inner.config.epoch_tick;
        store.set_epoch_deadline(ticks(limits.timeout, tick));
        // The ticker catches up in a burst after being descheduled, so an epoch count alone can
        // run out before the wall-clock deadline; check the clock and extend until it has passed.
        store.epoch_deadline_callback(move |ctx| {
            let now = Instant::now();
            let deadline = ctx.data().deadline;
            Ok(if now >= deadline {
                UpdateDeadline::Interrupt
            } else {
                UpdateDeadline::Continue(ticks(deadline - now, tick))
            })
        });

        let result = instantiate(&mut store).and_then(|bindings| f(&bindings, &mut store));
        let elapsed = started.elapsed();
        let mut state = store.into_data();
        let mut stderr_text = String::from_utf8_lossy(&state.stderr.contents()).into_owned();
        let mut stdout_text = String::from_utf8_lossy(&state.stdout.contents()).into_owned();
        let denied = state.reach.denied.take();
        let scrub = |text: &mut String| state.reach.scrub(text);
        scrub(&mut stderr_text);
        scrub(&mut stdout_text);
        for line in &mut state.logs {
            scrub(&mut line.message);
        }
        let result = match result {
            Ok(Ok(mut output)) => {
                scrub(&mut output);
                Ok(Ok(output))
            }
            Ok(Err(mut tool_error)) => {
                scrub(&mut tool_error.message);
                Ok(Err(tool_error))
            }
            Err(e) => Err(e),
        };
        let fail = |kind, message: String| StructuredError::new(kind, tool, message);
        match result {
            Ok(Ok(output)) => {
                if output.len() > limits.output_bytes {
                    return Err(fail(
                        ErrorKind::OutputTooLarge,
                        format!("the result is {} bytes; the cap is {} bytes", output.len(), limits.output_bytes),
                    )
                    .with_hint("ask for less (filter, paginate or summarise) or raise the output cap"));
                }
                let mut report = CallReport {
                    logs: state.logs,
                    logs_dropped: state.logs_dropped,
                    elapsed,
                    memory_limit_hit: state.limiter.hit,
                    denied,
                };
                report.push_output(&stdout_text, &stderr_text);
                Ok((output, report))
            }
            Ok(Err(tool_error)) => {
                // A tool that gives up on a refused capability failed for want of a grant.
                let denied = denied.filter(|_| tool_error.code == PERMISSION_DENIED);
                let mut e = fail(
                    if denied.is_some() { ErrorKind::PermissionDenied } else { ErrorKind::ToolError },
                    tool_error.message,
                );
                e.code = Some(tool_error.code);
                if let Some(capability) = denied {
                    e.expected = Some(capability);
                    e.hint =
                        Some("the tool may not reach this; an operator grants it with `toolsmith tools grant`".into());
                }
                Err(e)
            }
            Err(error) => {
                let mut e = classify(tool, &error, state.limiter.hit, &stderr_text, limits, memory_bytes);
                scrub(&mut e.message);
                Err(e)
            }
        }
    }
}

/// Turns a wasmtime error into the failure kind an agent sees.
fn classify(
    tool: &str,
    error: &wasmtime::Error,
    memory_hit: bool,
    stderr: &str,
    limits: Limits,
    memory_bytes: usize,
) -> StructuredError {
    let trap = error.downcast_ref::<Trap>().copied();
    if trap == Some(Trap::Interrupt) {
        return StructuredError::new(
            ErrorKind::Timeout,
            tool,
            format!("the call ran past its {} ms deadline and was stopped", limits.timeout.as_millis()),
        )
        .with_hint("make the call cheaper (smaller input) or raise the timeout");
    }
    if memory_hit {
        return StructuredError::new(
            ErrorKind::OutOfMemory,
            tool,
            format!("the tool tried to grow its memory past the {} MiB cap", memory_bytes >> 20),
        )
        .with_hint("make the call smaller or raise the memory cap");
    }
    if error.downcast_ref::<wasmtime::PoolConcurrencyLimitError>().is_some() {
        return StructuredError::new(
            ErrorKind::Busy,
            tool,
            "the sandbox is running as many instances as it holds (nested call-tool calls count)",
        )
        .with_hint("retry when other calls have finished, or configure more instances");
    }
    if let Some(exit) = error.downcast_ref::<wasmtime_wasi::I32Exit>() {
        return StructuredError::new(
            ErrorKind::Trap,
            tool,
            format!("the tool exited the interpreter with status {}", exit.0),
        )
        .with_hint("return a value instead of exiting");
    }
    let panic = panic_message(stderr);
    let what = match trap {
        Some(Trap::StackOverflow) => "stack overflow (too deep recursion)".to_owned(),
        Some(Trap::UnreachableCodeReached) if panic.is_some() => "the tool panicked".to_owned(),
        // Compiled languages keep a shadow stack at the bottom of linear memory; overflowing it
        // runs off the start of memory.
        Some(Trap::MemoryOutOfBounds) => {
            "out-of-bounds memory access (often a stack overflow from too deep recursion)".to_owned()
        }
        Some(trap) => trap.to_string(),
        None => format!("{error:#}").lines().next().unwrap_or("unknown error").to_owned(),
    };
    let message = match panic {
        Some(p) => format!("{what}: {p}"),
        None => what,
    };
    let mut e = StructuredError::new(ErrorKind::Trap, tool, message);
    if !stderr.trim().is_empty() {
        let tail: String = stderr.chars().rev().take(2000).collect::<Vec<_>>().into_iter().rev().collect();
        e.got = Some(serde_json::Value::String(tail));
    }
    e.hint = Some("this is a bug in the tool; report it to its author or try different input".into());
    e
}

/// The message of a Rust panic as printed to stderr by the default hook.
fn panic_message(stderr: &str) -> Option<String> {
    let mut lines = stderr.lines();
    while let Some(line) = lines.next() {
        if line.contains("panicked at") {
            let msg: Vec<&str> = lines.by_ref().take_while(|l| !l.starts_with("note:")).collect();
            let msg = msg.join("\n");
            return Some(if msg.trim().is_empty() { line.to_owned() } else { msg.trim().to_owned() });
        }
    }
    None
}

fn check_imports(engine: &Engine, component: &Component) -> Result<Vec<String>, LoadError> {
    let mut imports = Vec::new();
    for (name, _) in component.component_type().imports(engine) {
        let interface = name.split('@').next().unwrap_or(name);
        if !ALLOWED_INTERFACES.contains(&interface) {
            return Err(LoadError::DisallowedImport { import: name.to_owned() });
        }
        imports.push(name.to_owned());
    }
    Ok(imports)
}

/// Instance allocation strategies, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Allocation {
    /// Pooling, resetting dirty pages in place (needs `PAGEMAP_SCAN`, Linux 6.7+).
    PoolingResident,
    /// Pooling, resetting memory with `madvise` (page faults on reuse).
    Pooling,
    /// Fresh mappings per instance.
    OnDemand,
}

fn build_engine(config: &SandboxConfig, mode: Allocation) -> wasmtime::Result<Engine> {
    let mut cfg = Config::new();
    cfg.wasm_component_model(true)
        .epoch_interruption(true)
        .cranelift_opt_level(wasmtime::OptLevel::Speed)
        .parallel_compilation(true);
    if mode != Allocation::OnDemand {
        let n = config.max_instances.max(1);
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(n)
            // Rust components hold a few core instances (the program and adapter shims);
            // interpreter guests more.
            .total_core_instances(n * 16)
            .max_core_instances_per_component(64)
            .total_memories(n * 2)
            .max_memories_per_component(4)
            .total_tables(n * 16)
            .max_tables_per_component(64)
            .max_memory_size(config.max_memory_bytes)
            .max_component_instance_size(1 << 20)
            .max_core_instance_size(1 << 20)
            .table_elements(1 << 16);
        if mode == Allocation::PoolingResident {
            // Without PAGEMAP_SCAN, keep-resident would memset the whole window on every reuse,
            // which costs more than the page faults it saves: so `Yes`, and fall back if refused.
            pool.pagemap_scan(wasmtime::Enabled::Yes)
                .linear_memory_keep_resident(config.keep_resident_bytes)
                .table_keep_resident(64 << 10);
        }
        cfg.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    Engine::new(&cfg)
}

/// Groups the WASI interfaces we link; `wasmtime_wasi`'s own is private.
struct Io;
impl wasmtime::component::HasData for Io {
    type Data<'a> = &'a mut ResourceTable;
}

fn build_linker(engine: &Engine) -> wasmtime::Result<Linker<CallState>> {
    use wasmtime_wasi::cli::{WasiCli, WasiCliView};
    use wasmtime_wasi::clocks::WasiClocks;
    use wasmtime_wasi::clocks::WasiClocksView;
    use wasmtime_wasi::filesystem::{WasiFilesystem, WasiFilesystemView};
    use wasmtime_wasi::p2::bindings::sync::io as sync_io;
    use wasmtime_wasi::p2::bindings::{cli, clocks, random};
    use wasmtime_wasi::random::WasiRandom;

    let mut linker = Linker::new(engine);
    let l = &mut linker;
    bindings::Tool::add_to_linker::<_, HasSelf<CallState>>(l, |s| s)?;
    wasmtime_wasi_io::bindings::wasi::io::error::add_to_linker::<_, Io>(l, |s| s.ctx().table)?;
    sync_io::poll::add_to_linker::<_, Io>(l, |s| s.ctx().table)?;
    sync_io::streams::add_to_linker::<_, Io>(l, |s| s.ctx().table)?;
    cli::exit::add_to_linker::<_, WasiCli>(l, CallState::cli)?;
    cli::environment::add_to_linker::<_, WasiCli>(l, CallState::cli)?;
    cli::stdin::add_to_linker::<_, WasiCli>(l, CallState::cli)?;
    cli::stdout::add_to_linker::<_, WasiCli>(l, CallState::cli)?;
    cli::stderr::add_to_linker::<_, WasiCli>(l, CallState::cli)?;
    cli::terminal_input::add_to_linker::<_, WasiCli>(l, CallState::cli)?;
    cli::terminal_output::add_to_linker::<_, WasiCli>(l, CallState::cli)?;
    cli::terminal_stdin::add_to_linker::<_, WasiCli>(l, CallState::cli)?;
    cli::terminal_stdout::add_to_linker::<_, WasiCli>(l, CallState::cli)?;
    cli::terminal_stderr::add_to_linker::<_, WasiCli>(l, CallState::cli)?;
    clocks::wall_clock::add_to_linker::<_, WasiClocks>(l, CallState::clocks)?;
    clocks::monotonic_clock::add_to_linker::<_, ClampedClockData>(l, CallState::clamped_clock)?;
    random::random::add_to_linker::<_, WasiRandom>(l, |s| s.wasi.random())?;
    random::insecure::add_to_linker::<_, WasiRandom>(l, |s| s.wasi.random())?;
    random::insecure_seed::add_to_linker::<_, WasiRandom>(l, |s| s.wasi.random())?;
    // Inert unless an operator granted the tool a directory: then it is the only one there.
    wasmtime_wasi::p2::bindings::sync::filesystem::types::add_to_linker::<_, WasiFilesystem>(l, CallState::filesystem)?;
    wasmtime_wasi::p2::bindings::filesystem::preopens::add_to_linker::<_, WasiFilesystem>(l, CallState::filesystem)?;
    Ok(linker)
}

fn build_python_linker(engine: &Engine) -> wasmtime::Result<Linker<CallState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
    // Replace the stock monotonic clock with the deadline-clamped one.
    linker.allow_shadowing(true);
    wasmtime_wasi::p2::bindings::clocks::monotonic_clock::add_to_linker::<_, ClampedClockData>(
        &mut linker,
        CallState::clamped_clock,
    )?;
    linker.allow_shadowing(false);
    python_bindings::Runner::add_to_linker::<_, HasSelf<CallState>>(&mut linker, |s| s)?;
    Ok(linker)
}

fn ticks(timeout: Duration, tick: Duration) -> u64 {
    let tick = tick.as_nanos().max(1);
    // +1: the first tick may come at any point of the current period.
    (timeout.as_nanos().div_ceil(tick) as u64).saturating_add(1)
}

/// Advances the engine's epoch every tick while calls are running and for a short grace period
/// after, then parks. Ticks are scheduled against absolute instants, so the deadline does not
/// drift. Callers wake the thread only when it is actually parked: in a burst of calls no call pays
/// for a futex wake and a context switch.
struct Ticker {
    shared: Arc<TickerShared>,
    handle: Option<JoinHandle<()>>,
}

struct TickerShared {
    running: AtomicUsize,
    parked: AtomicBool,
    stop: AtomicBool,
}

/// How long the ticker keeps ticking with no call running before it parks.
const TICKER_GRACE: Duration = Duration::from_millis(100);

struct Running<'a>(&'a Ticker);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.shared.running.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Ticker {
    fn start(engine: Engine, tick: Duration) -> Ticker {
        let shared = Arc::new(TickerShared {
            running: AtomicUsize::new(0),
            parked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let thread_shared = shared.clone();
        let handle = std::thread::Builder::new()
            .name("toolsmith-epoch".into())
            .spawn(move || tick_loop(&engine, &thread_shared, tick))
            .ok();
        if handle.is_none() {
            tracing::error!("cannot start the epoch thread: deadlines will not be enforced");
        }
        Ticker { shared, handle }
    }

    fn running(&self) -> Running<'_> {
        if self.shared.running.fetch_add(1, Ordering::SeqCst) == 0
            && self.shared.parked.load(Ordering::SeqCst)
            && let Some(h) = &self.handle
        {
            h.thread().unpark();
        }
        Running(self)
    }
}

fn tick_loop(engine: &Engine, shared: &TickerShared, tick: Duration) {
    let mut next = Instant::now() + tick;
    let mut idle_since: Option<Instant> = None;
    while !shared.stop.load(Ordering::Relaxed) {
        if shared.running.load(Ordering::SeqCst) == 0 {
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= TICKER_GRACE {
                shared.parked.store(true, Ordering::SeqCst);
                // Re-check after announcing the park: a caller that saw `parked == false` has
                // already incremented `running`, so no wake-up is lost.
                if shared.running.load(Ordering::SeqCst) == 0 && !shared.stop.load(Ordering::Relaxed) {
                    std::thread::park_timeout(Duration::from_secs(1));
                }
                shared.parked.store(false, Ordering::SeqCst);
                idle_since = None;
                next = Instant::now() + tick;
                continue;
            }
        } else {
            idle_since = None;
        }
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
        engine.increment_epoch();
        next += tick;
        let now = Instant::now();
        if now > next + tick * 100 {
            next = now + tick; // we were descheduled for long: resync instead of bursting
        }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(handle) = self.handle.take() {
            handle.thread().unpark();
            let _ = handle.join();
        }
    }
}
