//! What a store holds during one call: the WASI context (stdio to memory, nothing else), the
//! memory limiter, logs, and the way back to the host for `call-tool`.

use std::sync::Arc;
use std::time::Instant;

use toolsmith_contract::StructuredError;
use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::Limits;
use super::bindings::toolsmith::tool::{host, types};

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
    /// The text.
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
    pub(crate) stderr: MemoryOutputPipe,
    pub(crate) logs: Vec<LogLine>,
    pub(crate) log_bytes: usize,
    pub(crate) log_cap: usize,
    pub(crate) logs_dropped: usize,
    pub(crate) nested: Option<Nested>,
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
        nested
            .caller
            .call_nested(&name, &args_json, limits, nested.depth + 1)
            .map_err(|e| types::ToolError {
                code: e.kind.as_str().to_owned(),
                message: serde_json::to_string(&e).unwrap_or_else(|_| e.message.clone()),
            })
    }
}
