//! Counters behind the status API.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// What `GET /status` answers.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StatusReport {
    /// Always `"ok"` while the server answers.
    pub status: String,
    /// The server's name.
    pub name: String,
    /// The server's version.
    pub version: String,
    /// Seconds since the daemon started.
    pub uptime_s: f64,
    /// Tools in the registry (`null` if the registry could not be read).
    pub tools: Option<usize>,
    /// `tools/call` requests answered, successful or not.
    pub calls_served: u64,
    /// Calls that returned a result.
    pub calls_ok: u64,
    /// Failed calls by error kind.
    pub failures_by_kind: BTreeMap<String, u64>,
    /// Calls running now.
    pub in_flight: usize,
    /// Calls allowed to run at once.
    pub concurrency: usize,
    /// Connected MCP sessions.
    pub sessions: usize,
    /// Mean call latency in milliseconds (0 before the first call).
    pub mean_call_ms: f64,
    /// Training jobs, when the daemon runs them: the running job's progress and the queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training: Option<crate::jobs::JobsStatus>,
}

pub(super) struct Stats {
    started: Instant,
    served: AtomicU64,
    ok: AtomicU64,
    total_micros: AtomicU64,
    in_flight: AtomicUsize,
    /// `tools/call` requests being handled, from arrival until their reply is handed back.
    handling: AtomicUsize,
    failures: Mutex<BTreeMap<&'static str, u64>>,
}

/// Counts a call as running until dropped.
pub(super) struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Stats {
    pub(super) fn new() -> Stats {
        Stats {
            started: Instant::now(),
            served: AtomicU64::new(0),
            ok: AtomicU64::new(0),
            total_micros: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            handling: AtomicUsize::new(0),
            failures: Mutex::new(BTreeMap::new()),
        }
    }

    pub(super) fn start(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(&self.in_flight)
    }

    pub(super) fn handle(&self) -> InFlight<'_> {
        self.handling.fetch_add(1, Ordering::SeqCst);
        InFlight(&self.handling)
    }

    pub(super) fn handling(&self) -> usize {
        self.handling.load(Ordering::SeqCst)
    }

    pub(super) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    pub(super) fn record(&self, failure: Option<&'static str>, took: Duration) {
        self.served.fetch_add(1, Ordering::Relaxed);
        self.total_micros.fetch_add(took.as_micros().min(u64::MAX as u128) as u64, Ordering::Relaxed);
        match failure {
            None => {
                self.ok.fetch_add(1, Ordering::Relaxed);
            }
            Some(kind) => {
                *toolsmith_contract::sync::lock(&self.failures).entry(kind).or_default() += 1;
            }
        }
    }

    pub(super) fn report(&self, tools: Option<usize>, concurrency: usize, sessions: usize) -> StatusReport {
        let served = self.served.load(Ordering::Relaxed);
        let failures = toolsmith_contract::sync::lock(&self.failures);
        StatusReport {
            status: "ok".into(),
            name: "toolsmith".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            tools,
            calls_served: served,
            calls_ok: self.ok.load(Ordering::Relaxed),
            failures_by_kind: failures.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            in_flight: self.in_flight(),
            concurrency,
            sessions,
            mean_call_ms: if served == 0 {
                0.0
            } else {
                self.total_micros.load(Ordering::Relaxed) as f64 / served as f64 / 1e3
            },
            training: None,
        }
    }
}
