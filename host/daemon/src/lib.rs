//! The Toolsmith daemon (`toolsmith serve`): the tool graph over the Model Context Protocol, the
//! policy over an OpenAI-compatible API, and training jobs.
//!
//! A [`Daemon`] owns the registry, the sandbox and the call accounting; transports sit on top:
//! [`mcp_server::McpHandler`] speaks MCP (through `rmcp`) over standard I/O or streamable HTTP, and
//! [`http`] adds the HTTP listener with its bearer token, origin checks and status API.
//!
//! - `tools/list` pages through the registry (sorted by name, the cursor is the last name seen),
//!   plus two meta tools: `search_tools` and `create_and_execute_mcp`.
//! - `tools/call` runs a tool through validation and the sandbox on a blocking thread, at most
//!   [`ServeOptions::concurrency`] at a time. The permit travels with the call, so a client that
//!   goes away never frees a slot a still-running tool holds.
//! - Any change to the registry's tool list, from this process or another, reaches every
//!   connected client as `notifications/tools/list_changed` (a watcher follows the registry's
//!   generation counter).

#![warn(missing_docs)]

pub mod graph_page;
pub mod http;
pub mod jobs;
pub mod mcp_server;
mod meta;
pub mod openai;
mod sessions;
mod stats;

// The modules' former names, which the CLI, benches, fuzz targets and tests still import.
pub use graph_page as graph;
pub use mcp_server as mcp;
pub use openai as chat;

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rmcp::model::Tool as McpTool;
use rmcp::service::{Peer, RoleServer};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use toolsmith_contract::sync::lock;
use toolsmith_contract::{ErrorKind, Manifest, StructuredError, ToolKind};
use toolsmith_registry::{Activity, CallUsage, Registry, RegistryError, UsageLog};

pub use meta::{CREATE_TOOL, SEARCH_TOOL};
use stats::Stats;
pub use stats::StatusReport;
use toolsmith_sandbox::Limits;
use toolsmith_sandbox::{Tool, Toolbox};

/// What becomes of a tool an MCP client creates with `create_and_execute_mcp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Admission {
    /// Registered in the tool graph at once (merged into a near-duplicate when there is one), so
    /// every client sees it in `tools/list`.
    Register,
    /// Kept as a candidate of this server's run; admitting it is left to training
    /// (`register_best`) or an operator.
    Candidate,
}

/// How the daemon serves.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Calls that may run at once; more wait for a slot (up to `slot_wait`).
    pub concurrency: usize,
    /// `create_and_execute_mcp` calls that may run at once, in a pool of their own: a creation
    /// runs code nobody has run before, often to its deadline, and must not take the slots of
    /// the graph's ordinary calls (nor they its).
    pub create_concurrency: usize,
    /// How long a call waits for a slot before it is answered `busy` with a retry hint.
    pub slot_wait: Duration,
    /// Tools per `tools/list` page.
    pub page_size: usize,
    /// What `create_and_execute_mcp` does with a tool that works.
    pub admission: Admission,
    /// Deadline, memory and output caps of every call.
    pub limits: Limits,
    /// How often the registry is checked for changes made by other processes.
    pub watch_interval: Duration,
    /// The run that candidates are recorded against.
    pub run: String,
    /// A document corpus served as the `search` tool (what the agent's worlds search), so an
    /// agent can take every tool it uses over MCP.
    pub corpus: Option<Arc<toolsmith_agent::env::Corpus>>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            concurrency: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            create_concurrency: 1,
            slot_wait: Duration::from_secs(10),
            page_size: 100,
            admission: Admission::Register,
            limits: Limits::default(),
            watch_interval: Duration::from_millis(500),
            run: format!("serve-{}", std::process::id()),
            corpus: None,
        }
    }
}

/// A page of `tools/list`.
#[derive(Debug, Clone)]
pub struct ToolPage {
    /// The tools, in name order.
    pub tools: Vec<McpTool>,
    /// Where the next page starts, when there is one.
    pub next_cursor: Option<String>,
}

/// The outcome of a `tools/call`, in MCP terms.
#[derive(Debug, Clone)]
pub struct CallReply {
    /// The structured result (an object: see [`mcp_output`]) or the error envelope.
    pub structured: Value,
    /// A rendering for clients that show text.
    pub text: String,
    /// True when the call failed; `structured` is then `{"error": {...}}`.
    pub is_error: bool,
    /// True when no tool has the name called (MCP answers that with a protocol error).
    pub unknown_tool: bool,
    /// Protocol-level metadata (e.g. what became of a created tool).
    pub meta: Option<Map<String, Value>>,
}

impl CallReply {
    fn ok(structured: Value) -> CallReply {
        let text = serde_json::to_string(&structured).unwrap_or_default();
        CallReply { structured, text, is_error: false, unknown_tool: false, meta: None }
    }

    fn error(error: &StructuredError) -> CallReply {
        CallReply {
            structured: error.to_envelope(),
            text: error.to_string(),
            is_error: true,
            unknown_tool: false,
            meta: None,
        }
    }
}

/// The serving state: cheap to clone, shared by every session and transport.
#[derive(Clone)]
pub struct Daemon {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon").field("options", &self.shared.options).finish_non_exhaustive()
    }
}

struct Shared {
    registry: Mutex<Registry>,
    toolbox: Toolbox,
    /// Loaded tools by canonical name, with the version and blob they were loaded from.
    loaded: Mutex<HashMap<String, Loaded>>,
    /// The tool list as of a registry generation.
    listing: Mutex<Option<(i64, Arc<Vec<McpTool>>)>>,
    /// Slots of ordinary calls.
    permits: Arc<Semaphore>,
    /// Slots of tool creation, apart from the calls' (see [`ServeOptions::create_concurrency`]).
    creators: Arc<Semaphore>,
    options: ServeOptions,
    stats: Stats,
    peers: Mutex<Vec<Peer<RoleServer>>>,
    /// The registry generation clients were last told about.
    announced: AtomicI64,
    shutdown: CancellationToken,
    meta_tools: Vec<(Manifest, toolsmith_sandbox::validate::ToolSchemas)>,
    /// The training jobs, when this daemon runs them (for `/status`).
    jobs: OnceLock<jobs::StatusSource>,
    /// Calls' usage statistics, written in batches off the calling thread.
    usage: UsageLog,
    /// What the graph page hears (`/graph/events`); taken at shutdown, which ends every stream
    /// (an open page would otherwise hold the graceful shutdown forever).
    events: Mutex<Option<tokio::sync::broadcast::Sender<graph_page::GraphEvent>>>,
    /// The registry's counters as last broadcast.
    seen: Mutex<Activity>,
}

struct Loaded {
    version: String,
    blob: Option<String>,
    grants: toolsmith_contract::Grants,
    tool: Arc<Tool>,
}

/// Why a page of the tool list could not be given.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    /// The cursor is not one this server handed out.
    #[error("{0:?} is not a cursor of this server's tools/list")]
    BadCursor(String),
    /// The registry failed.
    #[error("cannot read the tool graph: {0}")]
    Registry(#[from] RegistryError),
}

/// The opaque cursor of the page after tool `name`: versioned and hex-encoded, so a client
/// cannot mistake it for a name and a made-up one is refused rather than taken as a position.
fn page_cursor(name: &str) -> String {
    format!("{CURSOR_PREFIX}{}", http::hex(name.as_bytes()))
}

const CURSOR_PREFIX: &str = "tools.1.";

/// The tool name a [`page_cursor`] stands for; `None` for anything else.
fn cursor_name(cursor: &str) -> Option<String> {
    let hex = cursor.strip_prefix(CURSOR_PREFIX).filter(|h| !h.is_empty())?;
    String::from_utf8(http::unhex(hex)?).ok()
}

/// Errors that stop the daemon from starting.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The registry failed.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// A listener could not be set up.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The options do not make sense.
    #[error("{0}")]
    Config(String),
}

impl Daemon {
    /// A daemon serving `registry`'s tools through `toolbox` (which should have the Python
    /// runtime set, for Python tools and `create_and_execute_mcp`).
    pub fn new(registry: Registry, toolbox: Toolbox, options: ServeOptions) -> Result<Daemon, DaemonError> {
        if options.concurrency == 0 || options.create_concurrency == 0 || options.page_size == 0 {
            return Err(DaemonError::Config("concurrency and page size must be at least 1".into()));
        }
        let generation = registry.generation()?;
        let seen = registry.activity()?;
        let usage = UsageLog::open(registry.path())?;
        let meta_tools = meta::manifests(options.corpus.is_some())
            .map_err(DaemonError::Config)?
            .into_iter()
            .map(|m| {
                let schemas = toolsmith_sandbox::validate::ToolSchemas::compile(&m.input_schema, &m.output_schema)
                    .map_err(|e| DaemonError::Config(format!("meta tool `{}`: {e}", m.name)))?;
                Ok((m, schemas))
            })
            .collect::<Result<_, DaemonError>>()?;
        Ok(Daemon {
            shared: Arc::new(Shared {
                registry: Mutex::new(registry),
                toolbox,
                loaded: Mutex::new(HashMap::new()),
                listing: Mutex::new(None),
                permits: Arc::new(Semaphore::new(options.concurrency)),
                creators: Arc::new(Semaphore::new(options.create_concurrency)),
                stats: Stats::new(),
                peers: Mutex::new(Vec::new()),
                announced: AtomicI64::new(generation),
                shutdown: CancellationToken::new(),
                meta_tools,
                jobs: OnceLock::new(),
                usage,
                events: Mutex::new(Some(tokio::sync::broadcast::channel(64).0)),
                seen: Mutex::new(seen),
                options,
            }),
        })
    }

    /// The options served with.
    pub fn options(&self) -> &ServeOptions {
        &self.shared.options
    }

    /// Cancelled when the daemon shuts down; transports stop on it.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shared.shutdown.clone()
    }

    /// Runs `f` on the registry on a blocking thread.
    async fn with_registry<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Registry) -> Result<T, RegistryError> + Send + 'static,
    ) -> Result<T, RegistryError> {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || f(&mut lock(&shared.registry)))
            .await
            .unwrap_or_else(|e| Err(RegistryError::Invalid(format!("a registry task failed: {e}"))))
    }

    /// One page of the tool list, starting after `cursor` (one a previous page returned).
    pub async fn list_tools(&self, cursor: Option<&str>) -> Result<ToolPage, ListError> {
        let after = match cursor {
            None => None,
            Some(c) => Some(cursor_name(c).ok_or_else(|| ListError::BadCursor(c.chars().take(80).collect()))?),
        };
        let all = self.all_tools().await?;
        let start = match &after {
            None => 0,
            Some(after) => all.partition_point(|t| t.name.as_ref() <= after.as_str()),
        };
        let end = (start + self.shared.options.page_size).min(all.len());
        let tools = all[start..end].to_vec();
        let next_cursor = (end < all.len()).then(|| tools.last().map(|t| page_cursor(&t.name))).flatten();
        Ok(ToolPage { tools, next_cursor })
    }

    /// Every served tool (meta tools and the registry's), sorted by name; rebuilt only when the
    /// registry's generation moves.
    async fn all_tools(&self) -> Result<Arc<Vec<McpTool>>, RegistryError> {
        let shared = self.shared.clone();
        self.with_registry(move |registry| {
            let generation = registry.generation()?;
            if let Some((g, tools)) = lock(&shared.listing).as_ref()
                && *g == generation
            {
                return Ok(tools.clone());
            }
            let mut tools: Vec<McpTool> = Vec::new();
            for (manifest, _) in &shared.meta_tools {
                tools.extend(mcp_tool(manifest));
            }
            for record in registry.list(toolsmith_registry::SortBy::Name)? {
                if shared.meta_tools.iter().any(|(m, _)| m.name == record.manifest.name) {
                    tracing::warn!(tool = %record.name, "a registry tool is shadowed by the meta tool of that name");
                    continue;
                }
                let grants = registry.grants(&record.name)?;
                tools.extend(mcp_tool_granted(&record.manifest, &grants));
            }
            tools.sort_by(|a, b| a.name.cmp(&b.name));
            let tools = Arc::new(tools);
            *lock(&shared.listing) = Some((generation, tools.clone()));
            Ok(tools)
        })
        .await
    }

    /// Calls a tool: a meta tool, or a registry tool through validation and the sandbox. Every
    /// failure is a [`CallReply`] with `is_error`, never a protocol error.
    pub async fn call(&self, name: &str, args: Value) -> CallReply {
        let _handling = self.shared.stats.handle();
        let started = Instant::now();
        let reply = match self.shared.meta_tools.iter().position(|(m, _)| m.name.as_str() == name) {
            Some(i) => {
                let (manifest, schemas) = &self.shared.meta_tools[i];
                match schemas.check_args(manifest.name.as_str(), &args) {
                    Err(e) => CallReply::error(&e),
                    Ok(()) => meta::call(self, manifest.name.as_str(), args).await,
                }
            }
            None => self.call_registry_tool(name, args).await,
        };
        let kind = reply.is_error.then(|| error_kind(&reply.structured).map_or("unknown", |k| k.as_str()));
        self.shared.stats.record(kind, started.elapsed());
        tracing::info!(
            tool = name,
            ok = !reply.is_error,
            error = kind,
            ms = started.elapsed().as_secs_f64() * 1e3,
            "tools/call"
        );
        reply
    }

    /// A slot of `pool` (`what` names it in the answer), waiting at most
    /// [`ServeOptions::slot_wait`]; past that, or at shutdown, a `busy` error with a retry hint.
    async fn slot(
        &self,
        pool: &Arc<Semaphore>,
        size: usize,
        what: &str,
        tool: &str,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, StructuredError> {
        let wait = self.shared.options.slot_wait;
        match tokio::time::timeout(wait, pool.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_)) => Err(StructuredError::new(ErrorKind::Busy, tool, "the server is shutting down")),
            Err(_) => Err(StructuredError::new(
                ErrorKind::Busy,
                tool,
                format!("all {size} {what} slots stayed busy for {:.1} s", wait.as_secs_f64()),
            )
            .with_hint(format!(
                "retry in a few seconds: a call holds its slot for at most {:.0} s",
                self.shared.options.limits.timeout.as_secs_f64()
            ))),
        }
    }

    async fn call_registry_tool(&self, name: &str, args: Value) -> CallReply {
        let limits = self.shared.options.limits;
        let permit = match self.slot(&self.shared.permits, self.shared.options.concurrency, "call", name).await {
            Ok(permit) => permit,
            Err(e) => return CallReply::error(&e),
        };
        let shared = self.shared.clone();
        let name = name.to_owned();
        let task = tokio::task::spawn_blocking(move || {
            let _permit = permit; // held until the tool has finished, whatever the client does
            let _in_flight = shared.stats.start();
            let tool = match shared.load(&name) {
                Ok(tool) => tool,
                Err(e) => {
                    let mut reply = CallReply::error(&e);
                    reply.unknown_tool = e.kind == ErrorKind::NotFound;
                    return reply;
                }
            };
            let out = shared.toolbox.call_tool(&tool, &args, limits);
            shared.usage.record(CallUsage::new(tool.name(), out.as_ref().err().map(|e| e.kind.as_str())));
            match out {
                Ok(o) => CallReply::ok(mcp_output(&tool.manifest, o.value)),
                Err(e) => CallReply::error(&e),
            }
        });
        task.await.unwrap_or_else(|e| {
            CallReply::error(&StructuredError::new(ErrorKind::Trap, "", format!("the call's host task failed: {e}")))
        })
    }

    /// Waits until every running call has finished and its reply has been handed to the transport
    /// (or `timeout` passed), then stops new calls and cancels the shutdown token. Returns how many
    /// calls were still running at the end.
    pub async fn drain(&self, timeout: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + timeout;
        // Holding every permit of both pools means no tool runs and no new one starts.
        for (pool, size) in [
            (&self.shared.permits, self.shared.options.concurrency),
            (&self.shared.creators, self.shared.options.create_concurrency),
        ] {
            if let Ok(Ok(permits)) = tokio::time::timeout_at(deadline, pool.acquire_many(size as u32)).await {
                permits.forget();
            }
            pool.close();
        }
        // A finished tool's reply still has to reach its request handler.
        while self.shared.stats.handling() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let left = self.shared.stats.handling();
        // The transport writes a reply after the handler returns it; give that a moment before
        // the sessions are torn down.
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(lock(&self.shared.events).take());
        self.shared.shutdown.cancel();
        left
    }

    /// Remembers a connected client, to tell it when the tool list changes.
    pub fn add_peer(&self, peer: Peer<RoleServer>) {
        lock(&self.shared.peers).push(peer);
    }

    /// Tells every connected client that the tool list changed, if it did since the last time.
    pub async fn announce_changes(&self) {
        let generation = match self.with_registry(|r| r.generation()).await {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!("cannot read the registry generation: {e}");
                return;
            }
        };
        let before = self.shared.announced.swap(generation, Ordering::SeqCst);
        if before == generation {
            return;
        }
        let peers: Vec<_> = lock(&self.shared.peers).clone();
        let mut told = 0;
        for peer in &peers {
            if !peer.is_transport_closed() && peer.notify_tool_list_changed().await.is_ok() {
                told += 1;
            }
        }
        tracing::info!(generation, clients = told, "tools/list_changed");
        if told < peers.len() {
            lock(&self.shared.peers).retain(|p| !p.is_transport_closed());
        }
    }

    /// Follows the registry for changes made anywhere until shutdown.
    pub fn spawn_watcher(&self) -> tokio::task::JoinHandle<()> {
        let daemon = self.clone();
        tokio::spawn(async move {
            let token = daemon.shutdown_token();
            let mut tick = tokio::time::interval(daemon.shared.options.watch_interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = token.cancelled() => break,
                    _ = tick.tick() => {
                        daemon.announce_changes().await;
                        daemon.broadcast_graph_changes().await;
                    }
                }
            }
        })
    }

    /// Tells the graph pages that tools, calls or plan edges changed, if they did since the last
    /// time (another process's writes included).
    pub async fn broadcast_graph_changes(&self) {
        let shared = self.shared.clone();
        let changed = self
            .with_registry(move |r| {
                let now = r.activity()?;
                if *lock(&shared.seen) == now {
                    return Ok(None);
                }
                let stats = r.view_stats()?;
                *lock(&shared.seen) = now;
                Ok(Some(graph_page::GraphEvent::new(now, stats)))
            })
            .await;
        match changed {
            Ok(Some(event)) => {
                // No receiver (no page open) is fine.
                if let Some(events) = lock(&self.shared.events).as_ref() {
                    let _ = events.send(event);
                }
            }
            Ok(None) => {}
            Err(e) => tracing::warn!("cannot read the registry's counters: {e}"),
        }
    }

    /// The graph's state now, as an event (the first one a page's stream gets).
    pub(crate) async fn graph_state(&self) -> Result<graph_page::GraphEvent, RegistryError> {
        self.with_registry(|r| Ok(graph_page::GraphEvent::new(r.activity()?, r.view_stats()?))).await
    }

    /// Commits the calls recorded so far (tests and shutdown).
    pub fn flush_usage(&self) -> Result<(), RegistryError> {
        self.shared.usage.flush()
    }

    pub(crate) fn graph_events(&self) -> tokio::sync::broadcast::Receiver<graph_page::GraphEvent> {
        match lock(&self.shared.events).as_ref() {
            Some(events) => events.subscribe(),
            // Shutting down: a stream that ends at once.
            None => tokio::sync::broadcast::channel(1).1,
        }
    }

    /// The tool graphs training jobs kept with their checkpoints.
    pub(crate) fn checkpoint_graphs(&self) -> Vec<(graph_page::CheckpointGraph, std::path::PathBuf)> {
        self.shared.jobs.get().map(|jobs| jobs.checkpoint_graphs()).unwrap_or_default()
    }

    /// Health and counters, for the status API.
    pub async fn status(&self) -> StatusReport {
        let tools = self.with_registry(|r| r.len()).await.ok();
        let sessions = {
            let mut peers = lock(&self.shared.peers);
            peers.retain(|p| !p.is_transport_closed());
            peers.len()
        };
        let mut report = self.shared.stats.report(tools, self.shared.options.concurrency, sessions);
        if let Some(jobs) = self.shared.jobs.get() {
            let jobs = jobs.clone();
            report.training = tokio::task::spawn_blocking(move || jobs.status()).await.ok();
        }
        report
    }

    pub(crate) fn toolbox(&self) -> &Toolbox {
        &self.shared.toolbox
    }

    pub(crate) fn set_jobs_status(&self, source: jobs::StatusSource) {
        if self.shared.jobs.set(source).is_err() {
            tracing::warn!("a second job queue on one daemon: /status shows the first");
        }
    }

    /// Registers tools in the registry (merging near-duplicates), from a blocking thread;
    /// connected clients hear of the change from the watcher.
    pub fn register_blocking(
        &self,
        tools: Vec<toolsmith_registry::NewTool>,
    ) -> Result<Vec<toolsmith_registry::Registered>, RegistryError> {
        lock(&self.shared.registry).register_many(tools, true)
    }
}

impl Shared {
    /// The runnable tool for `name` (or an alias of it), loaded once per version.
    fn load(&self, name: &str) -> Result<Arc<Tool>, StructuredError> {
        let (record, blob, grants) = {
            let registry = lock(&self.registry);
            let record = match registry.get(name) {
                Ok(r) => r,
                Err(RegistryError::NotFound(_)) => return Err(not_found(&registry, name)),
                Err(e) => return Err(StructuredError::new(ErrorKind::NotFound, name, e.to_string())),
            };
            // Read on every call, so a grant or revoke by the CLI applies to the next call.
            let grants = registry
                .grants(&record.name)
                .map_err(|e| StructuredError::new(ErrorKind::PermissionDenied, name, e.to_string()))?
                .active;
            let fresh = lock(&self.loaded)
                .get(&record.name)
                .filter(|l| l.version == record.version && l.blob == record.blob_hash && l.grants == grants)
                .map(|l| l.tool.clone());
            if let Some(tool) = fresh {
                return Ok(tool);
            }
            let blob = match &record.blob_hash {
                Some(h) => registry
                    .blob(h)
                    .map_err(|e| StructuredError::new(ErrorKind::InvalidComponent, name, e.to_string()))?,
                None => None,
            };
            (record, blob, grants)
        };
        // Compiling (or mapping the cached compilation) happens outside the registry lock.
        let tool = self.toolbox.load_stored(&record.manifest, blob.as_deref())?.with_grants(grants.clone());
        lock(&self.loaded).insert(
            record.name.clone(),
            Loaded { version: record.version.clone(), blob: record.blob_hash.clone(), grants, tool: tool.clone() },
        );
        Ok(tool)
    }
}

fn not_found(registry: &Registry, name: &str) -> StructuredError {
    let names = registry.list(toolsmith_registry::SortBy::Name).unwrap_or_default();
    toolsmith_sandbox::not_found_error(name, names.iter().map(|r| &r.name), || {
        format!("find tools with `{SEARCH_TOOL}` or list them with `tools/list`")
    })
}

fn error_kind(envelope: &Value) -> Option<ErrorKind> {
    envelope.pointer("/error/kind").and_then(Value::as_str).and_then(ErrorKind::parse)
}

/// Whether MCP sees this tool's output as it is: MCP's `outputSchema` and `structuredContent`
/// must be objects, so any other result is wrapped as `{"result": value}`.
fn wraps_output(manifest: &Manifest) -> bool {
    manifest.output_schema.get("type").and_then(Value::as_str) != Some("object")
}

/// A tool's result as MCP `structuredContent`.
pub fn mcp_output(manifest: &Manifest, value: Value) -> Value {
    if wraps_output(manifest) { json!({ "result": value }) } else { value }
}

/// A tool's output schema as MCP `outputSchema`: wrapped like [`mcp_output`] wraps results.
pub fn mcp_output_schema(manifest: &Manifest) -> Value {
    let schema = toolsmith_contract::schemas::served_schema(&manifest.output_schema);
    if wraps_output(manifest) {
        json!({"type": "object", "properties": { "result": schema }, "required": ["result"]})
    } else {
        schema
    }
}

/// A manifest as an MCP tool (see [`Manifest::to_mcp_tool`]), with [`mcp_output_schema`].
/// `None` (and a warning) when it does not convert.
pub fn mcp_tool(manifest: &Manifest) -> Option<McpTool> {
    mcp_tool_granted(manifest, &toolsmith_registry::ToolGrants::default())
}

/// [`mcp_tool`] with what an operator granted the tool under `_meta["toolsmith/grants"]`
/// (capabilities and who granted them; secrets by reference only).
pub fn mcp_tool_granted(manifest: &Manifest, grants: &toolsmith_registry::ToolGrants) -> Option<McpTool> {
    let mut value = manifest.to_mcp_tool();
    if !grants.entries.is_empty() {
        value["_meta"]["toolsmith/grants"] = json!(grants.entries);
    }
    if wraps_output(manifest) {
        value["outputSchema"] = mcp_output_schema(manifest);
    }
    if manifest.kind == ToolKind::Simulated {
        // Listed so clients can see the interface, but marked: there is nothing here to run.
        value["annotations"] = json!({ "title": format!("{} (simulated: interface only)", manifest.name) });
    }
    match serde_json::from_value(value) {
        Ok(tool) => Some(tool),
        Err(e) => {
            tracing::warn!(tool = %manifest.name, "not served over MCP: {e}");
            None
        }
    }
}
