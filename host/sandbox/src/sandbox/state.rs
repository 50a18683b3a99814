//! What a store holds during one call: the WASI context (stdio to memory, nothing else), the
//! memory limiter, logs, and the way back to the host for `call-tool`.

use std::sync::Arc;
use std::time::Instant;

use toolsmith_contract::StructuredError;
use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::Limits;
use super::bindings::toolsmith::tool::{capabilities, host, types};
use super::reach::{Agents, Reach};

/// Runs a tool by name for `call-tool`: implemented by whatever owns the tool table.
pub trait ToolCaller: Send + Sync {
    /// Calls `name` with JSON `args` under `limits`, `depth` levels below the top-level call.
    fn call_nested(&self, name: &str, args: &str, limits: Limits, depth: u32) -> Result<String, StructuredError>;
}

/// One log line recorded by a tool.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LogLine {
    /// `trace`, `debug`, `info`, `warn`, `error` or `stderr`.
    pub level: &'static str,
    /// The line as the tool wrote it (a line of stderr for the `stderr` level).
    pub message: String,
}

/// Memory cap for one store. Growth past the cap is refused (`memory.grow` returns -1, so a
/// guest allocator fails the way it would on a full machine) and remembered, so the host reports
/// `out_of_memory` rather than the trap the guest raises next.
#[derive(Debug)]
pub(crate) struct Limiter {
    pub(crate) memory_bytes: usize,
    pub(crate) hit: bool,
}

/// Table elements per table; far above what compilers emit, low enough to bound host memory.
const MAX_TABLE_ELEMENTS: usize = 1 << 20;

impl ResourceLimiter for Limiter {
    fn memory_growing(&mut self, _current: usize, desired: usize, _max: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.memory_bytes {
            self.hit = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _max: Option<usize>) -> wasmtime::Result<bool> {
        if desired > MAX_TABLE_ELEMENTS {
            self.hit = true;
            return Ok(false);
        }
        Ok(true)
    }
}

pub(crate) struct Nested {
    pub(crate) caller: Arc<dyn ToolCaller>,
    pub(crate) depth: u32,
    pub(crate) deadline: Instant,
    pub(crate) limits: Limits,
}

/// The data of a `Store` for one call.
pub(crate) struct CallState {
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) limiter: Limiter,
    pub(crate) stdout: CappedPipe,
    pub(crate) stderr: CappedPipe,
    pub(crate) logs: Vec<LogLine>,
    pub(crate) log_bytes: usize,
    pub(crate) log_cap: usize,
    pub(crate) logs_dropped: usize,
    pub(crate) nested: Option<Nested>,
    /// When this call's time is up.
    pub(crate) deadline: Instant,
    /// What the tool was granted (often nothing), what it used and what it was refused.
    pub(crate) reach: Reach,
    pub(crate) agents: Arc<Agents>,
}

impl CallState {
    pub(crate) fn push_log(&mut self, level: &'static str, message: String) {
        if self.log_bytes + message.len() > self.log_cap {
            self.logs_dropped += 1;
            return;
        }
        self.log_bytes += message.len();
        self.logs.push(LogLine { level, message });
    }
}

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl types::Host for CallState {}

impl host::Host for CallState {
    fn log(&mut self, level: host::Level, message: String) {
        let level = match level {
            host::Level::Trace => "trace",
            host::Level::Debug => "debug",
            host::Level::Info => "info",
            host::Level::Warn => "warn",
            host::Level::Error => "error",
        };
        self.push_log(level, message);
    }

    fn call_tool(&mut self, name: String, args_json: String) -> Result<String, types::ToolError> {
        let Some(nested) = &self.nested else {
            return Err(types::ToolError {
                code: "unavailable".into(),
                message: "call-tool is not available in this context (e.g. while reading a manifest)".into(),
            });
        };
        if nested.depth >= nested.limits.max_depth {
            return Err(types::ToolError {
                code: "call_depth_exceeded".into(),
                message: format!("call-tool nests deeper than {} levels", nested.limits.max_depth),
            });
        }
        let remaining = nested.deadline.saturating_duration_since(Instant::now());
        let limits = Limits { timeout: remaining, ..nested.limits };
        nested.caller.call_nested(&name, &args_json, limits, nested.depth + 1).map_err(|e| types::ToolError {
            code: e.kind.as_str().to_owned(),
            message: serde_json::to_string(&e).unwrap_or_else(|_| e.message.clone()),
        })
    }
}

impl capabilities::Host for CallState {
    fn http(&mut self, request: capabilities::HttpRequest) -> Result<capabilities::HttpResponse, types::ToolError> {
        self.reach.http(&self.agents, self.deadline, request)
    }

    fn secret(&mut self, name: String) -> Result<String, types::ToolError> {
        self.reach.secret(&name)
    }
}

/// Standard output or error of one call: keeps the first `capacity` bytes and silently drops the
/// rest. (`MemoryOutputPipe` instead fails writes once full, which makes a Rust guest's
/// `println!` panic: a chatty tool would crash instead of finishing.)
#[derive(Debug, Clone)]
pub(crate) struct CappedPipe {
    capacity: usize,
    buffer: Arc<std::sync::Mutex<Vec<u8>>>,
}

impl CappedPipe {
    pub(crate) fn new(capacity: usize) -> Self {
        CappedPipe { capacity, buffer: Arc::default() }
    }

    pub(crate) fn contents(&self) -> Vec<u8> {
        self.buffer.lock().map(|b| b.clone()).unwrap_or_default()
    }

    fn append(&self, bytes: &[u8]) {
        if let Ok(mut buffer) = self.buffer.lock() {
            let room = self.capacity.saturating_sub(buffer.len());
            buffer.extend_from_slice(&bytes[..bytes.len().min(room)]);
        }
    }
}

impl wasmtime_wasi::cli::IsTerminal for CappedPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl wasmtime_wasi::cli::StdoutStream for CappedPipe {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }

    fn p2_stream(&self) -> Box<dyn wasmtime_wasi::p2::OutputStream> {
        Box::new(self.clone())
    }
}

impl tokio::io::AsyncWrite for CappedPipe {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.append(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[wasmtime_wasi::async_trait]
impl wasmtime_wasi::p2::OutputStream for CappedPipe {
    fn write(&mut self, bytes: bytes::Bytes) -> Result<(), wasmtime_wasi::p2::StreamError> {
        self.append(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), wasmtime_wasi::p2::StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, wasmtime_wasi::p2::StreamError> {
        Ok(64 << 10)
    }
}

#[wasmtime_wasi::async_trait]
impl wasmtime_wasi::p2::Pollable for CappedPipe {
    async fn ready(&mut self) {}
}

/// `wasi:clocks/monotonic-clock` with every sleep clamped to the call's deadline.
///
/// Epoch interruption stops running WebAssembly, but a guest blocked in the host (Python's
/// `time.sleep`, Rust's `thread::sleep`: a monotonic-clock subscription waited on with
/// `wasi:io/poll`) runs no WebAssembly until it wakes. Clamping the subscription wakes it at the
/// deadline; the next epoch check then stops it, so the deadline holds for sleepers too.
pub(crate) struct ClampedClock<'a> {
    clocks: wasmtime_wasi::clocks::WasiClocksCtxView<'a>,
    deadline: Instant,
}

pub(crate) struct ClampedClockData;

impl wasmtime::component::HasData for ClampedClockData {
    type Data<'a> = ClampedClock<'a>;
}

impl CallState {
    pub(crate) fn clamped_clock(&mut self) -> ClampedClock<'_> {
        use wasmtime_wasi::clocks::WasiClocksView;
        let deadline = self.deadline;
        ClampedClock { clocks: self.clocks(), deadline }
    }
}

use wasmtime_wasi::p2::bindings::clocks::monotonic_clock as mono;

impl ClampedClock<'_> {
    /// A little past the deadline, so the epoch check (not the sleep) ends the call.
    fn clamp(&self, nanos: u64) -> u64 {
        let remaining = self.deadline.saturating_duration_since(Instant::now()) + std::time::Duration::from_millis(2);
        nanos.min(u64::try_from(remaining.as_nanos()).unwrap_or(u64::MAX))
    }
}

impl mono::Host for ClampedClock<'_> {
    fn now(&mut self) -> wasmtime::Result<mono::Instant> {
        mono::Host::now(&mut self.clocks)
    }

    fn resolution(&mut self) -> wasmtime::Result<mono::Duration> {
        mono::Host::resolution(&mut self.clocks)
    }

    fn subscribe_instant(
        &mut self,
        when: mono::Instant,
    ) -> wasmtime::Result<wasmtime::component::Resource<wasmtime_wasi::p2::DynPollable>> {
        let now = mono::Host::now(&mut self.clocks)?;
        let duration = self.clamp(when.saturating_sub(now));
        mono::Host::subscribe_duration(&mut self.clocks, duration)
    }

    fn subscribe_duration(
        &mut self,
        duration: mono::Duration,
    ) -> wasmtime::Result<wasmtime::component::Resource<wasmtime_wasi::p2::DynPollable>> {
        let duration = self.clamp(duration);
        mono::Host::subscribe_duration(&mut self.clocks, duration)
    }
}
