//! Training jobs in the daemon: a queue stored in SQLite, one runner thread, live progress.
//!
//! - A job is an SFT or RL run with the same config as `toolsmith train sft|rl` (JSON, checked
//!   against the config's schema and rules when submitted). Its run directory is
//!   `STATE/jobs/<id>/`, laid out exactly like `--out` of `toolsmith train`.
//! - One job runs at a time; the others wait in submission order. Jobs and their states live in
//!   `STATE/jobs.db`, so a restarted daemon knows every job. A job found `running` at start
//!   belonged to a daemon that died: it is queued again and resumes from its last checkpoint (the
//!   trainer writes checkpoints whole or not at all).
//! - After each checkpoint the served policy (when there is one) is swapped to it, and tools an
//!   RL run admitted to its tool graph are registered in the daemon's registry, which tells MCP
//!   clients with `notifications/tools/list_changed`.
//! - Cancelling a running job stops it after the current step with a checkpoint; resuming a
//!   cancelled or failed job queues it again from that checkpoint. A daemon told to stop does
//!   the same to its running job but leaves it queued for the next start.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use toolsmith_agent::env::Corpus;
use toolsmith_agent::tools::{Executor, LocalTools};
use toolsmith_contract::ToolKind;
use toolsmith_contract::sync::lock;
use toolsmith_registry::{NewTool, Registered, Registry, SortBy};
use toolsmith_sandbox::Limits;
use toolsmith_train::rl::{RlConfig, RlTrainer};
use toolsmith_train::{Event, SftConfig, TrainError, sft};

use crate::Daemon;
use crate::openai::Served;

mod api;
mod inputs;
pub use api::jobs_router;
pub use inputs::{DEFAULT_MAX_DATA_BYTES, JobInputs};

/// The jobs database's file name, in the daemon's state directory.
pub const JOBS_FILE: &str = "jobs.db";

/// Which trainer a job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobKind {
    /// `toolsmith train sft`.
    Sft,
    /// `toolsmith train rl`.
    Rl,
}

impl JobKind {
    fn as_str(self) -> &'static str {
        match self {
            JobKind::Sft => "sft",
            JobKind::Rl => "rl",
        }
    }

    fn parse(s: &str) -> Option<JobKind> {
        match s {
            "sft" => Some(JobKind::Sft),
            "rl" => Some(JobKind::Rl),
            _ => None,
        }
    }
}

/// Where a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Waiting for the runner.
    Queued,
    /// Training now.
    Running,
    /// Finished; its final policy is in `RUN/final`.
    Succeeded,
    /// Stopped by an error (kept in `error`); it can be resumed.
    Failed,
    /// Cancelled; it can be resumed from its last checkpoint.
    Cancelled,
}

impl JobState {
    fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    fn parse(s: &str) -> Option<JobState> {
        Some(match s {
            "queued" => JobState::Queued,
            "running" => JobState::Running,
            "succeeded" => JobState::Succeeded,
            "failed" => JobState::Failed,
            "cancelled" => JobState::Cancelled,
            _ => return None,
        })
    }

    /// True when the job will not change again unless someone resumes it.
    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Failed | JobState::Cancelled)
    }
}

/// A job as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// Its number, from 1.
    pub id: i64,
    /// SFT or RL.
    pub kind: JobKind,
    /// Where it is.
    pub state: JobState,
    /// The trainer's config, as submitted (defaults filled in).
    pub config: Value,
    /// The run directory.
    pub dir: PathBuf,
    /// Steps (RL: iterations) done, as of the last report.
    pub step: u64,
    /// Steps in all (0 until the trainer starts).
    pub total: u64,
    /// The newest checkpoint's directory.
    pub checkpoint: Option<PathBuf>,
    /// Why it failed.
    pub error: Option<String>,
    /// Times the runner started it (more than 1 after a resume or a daemon restart).
    pub runs: u64,
    /// Unix milliseconds.
    pub created_at: i64,
    /// Unix milliseconds of the latest start.
    pub started_at: Option<i64>,
    /// Unix milliseconds of the end.
    pub finished_at: Option<i64>,
}

/// What the jobs API refuses, or what fails underneath it.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// No such job.
    #[error("no job {0}")]
    NotFound(i64),
    /// The submission is not a usable job.
    #[error("{0}")]
    Invalid(String),
    /// The job is not in a state that allows this.
    #[error("job {id} is {state}: {why}")]
    Conflict {
        /// The job.
        id: i64,
        /// Its state.
        state: &'static str,
        /// What cannot be done.
        why: &'static str,
    },
    /// Another daemon runs the jobs of this state directory.
    #[error("another daemon runs the jobs in {0}; stop it, or give this one another --state-dir")]
    Locked(PathBuf),
    /// The jobs database failed.
    #[error("jobs database {path}: {source}")]
    Store {
        /// The database file.
        path: PathBuf,
        /// The cause.
        source: rusqlite::Error,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// The jobs table.
#[derive(Debug)]
struct Store {
    conn: Mutex<Connection>,
    path: PathBuf,
    root: PathBuf,
}

const COLUMNS: &str =
    "id, kind, state, config, step, total, checkpoint, error, runs, created_at, started_at, finished_at";

impl Store {
    fn open(root: &Path) -> Result<Store, JobError> {
        std::fs::create_dir_all(root).map_err(|source| JobError::Io { path: root.to_owned(), source })?;
        let path = root.join(JOBS_FILE);
        let err = |source| JobError::Store { path: path.clone(), source };
        let conn = Connection::open(&path).map_err(err)?;
        conn.busy_timeout(Duration::from_secs(5)).map_err(err)?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(err)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS jobs (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                kind TEXT NOT NULL,
                state TEXT NOT NULL,
                config TEXT NOT NULL,
                step INTEGER NOT NULL DEFAULT 0,
                total INTEGER NOT NULL DEFAULT 0,
                checkpoint TEXT,
                error TEXT,
                runs INTEGER NOT NULL DEFAULT 0,
                created_at INTEGER NOT NULL,
                started_at INTEGER,
                finished_at INTEGER
            );",
        )
        .map_err(err)?;
        // A corrupt file is refused here, before anything is written to it.
        conn.query_row("PRAGMA quick_check", [], |r| r.get::<_, String>(0)).map_err(err).and_then(|s| {
            if s == "ok" { Ok(()) } else { Err(JobError::Invalid(format!("{}: {s}", path.display()))) }
        })?;
        Ok(Store { conn: Mutex::new(conn), path, root: root.to_owned() })
    }

    fn err(&self) -> impl Fn(rusqlite::Error) -> JobError + '_ {
        |source| JobError::Store { path: self.path.clone(), source }
    }

    fn dir_of(&self, id: i64) -> PathBuf {
        self.root.join("jobs").join(id.to_string())
    }

    fn row(&self, r: &rusqlite::Row<'_>) -> rusqlite::Result<Job> {
        let id: i64 = r.get(0)?;
        let text = |i: usize| -> rusqlite::Result<String> { r.get(i) };
        let bad = |i: usize, what: &str| {
            rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, what.to_owned().into())
        };
        Ok(Job {
            id,
            kind: JobKind::parse(&text(1)?).ok_or_else(|| bad(1, "unknown job kind"))?,
            state: JobState::parse(&text(2)?).ok_or_else(|| bad(2, "unknown job state"))?,
            config: serde_json::from_str(&text(3)?).map_err(|_| bad(3, "config is not JSON"))?,
            dir: self.dir_of(id),
            step: r.get::<_, i64>(4)?.max(0) as u64,
            total: r.get::<_, i64>(5)?.max(0) as u64,
            checkpoint: r.get::<_, Option<String>>(6)?.map(PathBuf::from),
            error: r.get(7)?,
            runs: r.get::<_, i64>(8)?.max(0) as u64,
            created_at: r.get(9)?,
            started_at: r.get(10)?,
            finished_at: r.get(11)?,
        })
    }

    fn insert(&self, kind: JobKind, config: &Value) -> Result<Job, JobError> {
        let id = {
            let conn = lock(&self.conn);
            conn.execute(
                "INSERT INTO jobs (kind, state, config, created_at) VALUES (?1, 'queued', ?2, ?3)",
                params![kind.as_str(), config.to_string(), now_ms()],
            )
            .map_err(self.err())?;
            conn.last_insert_rowid()
        };
        self.get(id)
    }

    fn get(&self, id: i64) -> Result<Job, JobError> {
        let conn = lock(&self.conn);
        conn.query_row(&format!("SELECT {COLUMNS} FROM jobs WHERE id = ?1"), [id], |r| self.row(r))
            .optional()
            .map_err(self.err())?
            .ok_or(JobError::NotFound(id))
    }

    fn list(&self) -> Result<Vec<Job>, JobError> {
        let conn = lock(&self.conn);
        let mut stmt = conn.prepare(&format!("SELECT {COLUMNS} FROM jobs ORDER BY id")).map_err(self.err())?;
        let rows = stmt.query_map([], |r| self.row(r)).map_err(self.err())?;
        rows.collect::<Result<Vec<_>, _>>().map_err(self.err())
    }

    /// The oldest queued job, now marked running.
    fn claim_next(&self) -> Result<Option<Job>, JobError> {
        let id: Option<i64> = {
            let conn = lock(&self.conn);
            let id = conn
                .query_row("SELECT id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT 1", [], |r| r.get(0))
                .optional()
                .map_err(self.err())?;
            match id {
                // Guarded on the state, so a job is never claimed twice.
                Some(id) => conn
                    .execute(
                        "UPDATE jobs SET state = 'running', runs = runs + 1, started_at = ?2, finished_at = NULL,
                         error = NULL WHERE id = ?1 AND state = 'queued'",
                        params![id, now_ms()],
                    )
                    .map_err(self.err())?
                    .eq(&1)
                    .then_some(id),
                None => None,
            }
        };
        id.map(|id| self.get(id)).transpose()
    }

    /// Moves a job from one of `from` to `to`; false when it was in none of them.
    fn transition(&self, id: i64, from: &[JobState], to: JobState, error: Option<&str>) -> Result<bool, JobError> {
        let conn = lock(&self.conn);
        let states: Vec<&str> = from.iter().map(|s| s.as_str()).collect();
        let finished = to.is_terminal().then(now_ms);
        let n = conn
            .execute(
                &format!(
                    "UPDATE jobs SET state = ?2, error = ?3, finished_at = ?4 WHERE id = ?1 AND state IN ({})",
                    states.iter().map(|s| format!("'{s}'")).collect::<Vec<_>>().join(", ")
                ),
                params![id, to.as_str(), error, finished],
            )
            .map_err(self.err())?;
        Ok(n == 1)
    }

    fn progress(&self, id: i64, step: u64, total: Option<u64>, checkpoint: Option<&Path>) -> Result<(), JobError> {
        let conn = lock(&self.conn);
        conn.execute(
            "UPDATE jobs SET step = ?2, total = COALESCE(?3, total), checkpoint = COALESCE(?4, checkpoint)
             WHERE id = ?1",
            params![id, step as i64, total.map(|t| t as i64), checkpoint.map(|p| p.to_string_lossy().into_owned())],
        )
        .map_err(self.err())?;
        Ok(())
    }

    /// Jobs a dead daemon left running go back in the queue; they resume from their checkpoint.
    fn requeue_orphans(&self) -> Result<usize, JobError> {
        let conn = lock(&self.conn);
        conn.execute("UPDATE jobs SET state = 'queued' WHERE state = 'running'", []).map_err(self.err())
    }

    fn queued(&self) -> Result<usize, JobError> {
        let conn = lock(&self.conn);
        conn.query_row("SELECT COUNT(*) FROM jobs WHERE state = 'queued'", [], |r| r.get::<_, i64>(0))
            .map(|n| n as usize)
            .map_err(self.err())
    }
}

/// The lock file of the state directory's jobs.
pub const LOCK_FILE: &str = "jobs.lock";

/// Takes the state directory's jobs for this process. Another daemon holding them would otherwise
/// see its running job as orphaned and run it a second time beside it.
fn own(root: &Path) -> Result<std::fs::File, JobError> {
    let path = root.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| JobError::Io { path: path.clone(), source })?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(JobError::Locked(root.to_owned())),
        Err(std::fs::TryLockError::Error(source)) => Err(JobError::Io { path, source }),
    }
}

/// The running job, as the runner last heard of it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Live {
    /// The job.
    pub id: i64,
    /// SFT or RL.
    pub kind: Option<JobKind>,
    /// Steps (RL: iterations) done.
    pub step: u64,
    /// Steps in all.
    pub total: u64,
    /// What it is doing (`preparing`, `training`, `evaluating`).
    pub phase: String,
    /// The newest step's (or iteration's) figures.
    pub last: Option<Value>,
    /// The newest checkpoint's step.
    pub checkpoint_step: Option<u64>,
    /// The served policy's step, after the newest swap.
    pub served_step: Option<u64>,
}

struct Inner {
    store: Store,
    /// Held while this daemon owns the state directory's jobs (released by the OS on any exit).
    _owner: std::fs::File,
    live: Mutex<Option<Live>>,
    cancel: Mutex<Option<(i64, Arc<AtomicBool>)>>,
    /// Running jobs asked to stop, kept until the trainer's flag exists (a cancel can arrive
    /// while the job is still being prepared).
    requested: Mutex<std::collections::HashSet<i64>>,
    /// Set when the daemon stops: the running job is interrupted but stays queued.
    stopping: AtomicBool,
    wake: (Mutex<bool>, Condvar),
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jobs").field("store", &self.store.path).finish_non_exhaustive()
    }
}

/// The job queue and its runner. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Jobs {
    inner: Arc<Inner>,
    daemon: Daemon,
    served: Option<Served>,
    /// What job configs may name.
    inputs: Arc<JobInputs>,
}

/// What `/status` says about training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobsStatus {
    /// The running job.
    pub running: Option<Live>,
    /// Jobs waiting.
    pub queued: usize,
}

/// A handle on [`Jobs`] state that the daemon's status can read without owning the runner.
#[derive(Clone, Debug)]
pub(crate) struct StatusSource(Arc<Inner>);

impl StatusSource {
    pub(crate) fn status(&self) -> JobsStatus {
        JobsStatus { running: lock(&self.0.live).clone(), queued: self.0.store.queued().unwrap_or(0) }
    }

    /// Every job's checkpoints that kept a tool graph (RL with the graph on), by job and step.
    pub(crate) fn checkpoint_graphs(&self) -> Vec<(crate::graph_page::CheckpointGraph, PathBuf)> {
        let mut jobs: Vec<i64> = std::fs::read_dir(self.0.store.root.join("jobs"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        jobs.sort_unstable();
        jobs.into_iter()
            .flat_map(|id| crate::graph_page::job_checkpoint_graphs(&id.to_string(), &self.0.store.dir_of(id)))
            .collect()
    }
}

impl Jobs {
    /// Opens (or creates) the jobs of the state directory `root`, for `daemon`, swapping `served`
    /// after each checkpoint. Jobs a dead daemon left running are queued again.
    pub fn open(root: &Path, daemon: Daemon, served: Option<Served>) -> Result<Jobs, JobError> {
        let store = Store::open(root)?;
        let owner = own(root)?;
        let orphans = store.requeue_orphans()?;
        if orphans > 0 {
            tracing::warn!(orphans, "jobs left running by a daemon that stopped are queued again; they resume");
        }
        let inner = Arc::new(Inner {
            store,
            _owner: owner,
            live: Mutex::new(None),
            cancel: Mutex::new(None),
            requested: Mutex::new(Default::default()),
            stopping: AtomicBool::new(false),
            wake: (Mutex::new(false), Condvar::new()),
        });
        daemon.set_jobs_status(StatusSource(inner.clone()));
        let inputs = Arc::new(JobInputs::new(root));
        Ok(Jobs { inner, daemon, served, inputs })
    }

    /// With the paths and sizes job configs may name (by default: the state directory only,
    /// data files up to [`DEFAULT_MAX_DATA_BYTES`]).
    pub fn with_inputs(mut self, inputs: JobInputs) -> Jobs {
        self.inputs = Arc::new(inputs);
        self
    }

    /// Queues a job after checking its config the way `toolsmith train` does, and its paths
    /// against what this daemon may read ([`JobInputs`]).
    pub fn submit(&self, kind: JobKind, mut config: Value) -> Result<Job, JobError> {
        if !config.is_object() {
            return Err(JobError::Invalid(format!("config must be an object, not {config}")));
        }
        self.inputs.confine(&mut config)?;
        let normalised = match kind {
            JobKind::Sft => {
                let c: SftConfig = serde_json::from_value(config)
                    .map_err(|e| JobError::Invalid(format!("the SFT config is invalid: {e}")))?;
                c.validate().map_err(|e| JobError::Invalid(e.to_string()))?;
                serde_json::to_value(c)
            }
            JobKind::Rl => {
                let c: RlConfig = serde_json::from_value(config)
                    .map_err(|e| JobError::Invalid(format!("the RL config is invalid: {e}")))?;
                c.validate().map_err(|e| JobError::Invalid(e.to_string()))?;
                serde_json::to_value(c)
            }
        }
        .map_err(|e| JobError::Invalid(e.to_string()))?;
        let job = self.inner.store.insert(kind, &normalised)?;
        tracing::info!(id = job.id, kind = kind.as_str(), "job queued");
        self.wake();
        Ok(job)
    }

    /// One job.
    pub fn get(&self, id: i64) -> Result<Job, JobError> {
        self.inner.store.get(id)
    }

    /// Every job, oldest first.
    pub fn list(&self) -> Result<Vec<Job>, JobError> {
        self.inner.store.list()
    }

    /// Training progress for `/status`.
    pub fn status(&self) -> JobsStatus {
        StatusSource(self.inner.clone()).status()
    }

    /// Cancels a queued job at once, or asks a running one to stop after its current step (with
    /// a checkpoint); returns the job as it is now.
    pub fn cancel(&self, id: i64) -> Result<Job, JobError> {
        let store = &self.inner.store;
        if store.transition(id, &[JobState::Queued], JobState::Cancelled, None)? {
            return store.get(id);
        }
        let job = store.get(id)?;
        match job.state {
            JobState::Running => {
                lock(&self.inner.requested).insert(id);
                if let Some((running, flag)) = lock(&self.inner.cancel).as_ref()
                    && *running == id
                {
                    flag.store(true, Ordering::Relaxed);
                }
                Ok(job)
            }
            state => Err(JobError::Conflict { id, state: state.as_str(), why: "only queued or running jobs cancel" }),
        }
    }

    /// Queues a cancelled or failed job again; it continues from its last checkpoint.
    pub fn resume(&self, id: i64) -> Result<Job, JobError> {
        let store = &self.inner.store;
        if store.transition(id, &[JobState::Cancelled, JobState::Failed], JobState::Queued, None)? {
            self.wake();
            return store.get(id);
        }
        let job = store.get(id)?;
        Err(JobError::Conflict { id, state: job.state.as_str(), why: "only cancelled or failed jobs resume" })
    }

    fn wake(&self) {
        let (flag, cv) = &self.inner.wake;
        *lock(flag) = true;
        cv.notify_all();
    }

    /// Interrupts the running job (it stays queued, with a checkpoint) and ends the runner.
    pub fn stop(&self) {
        self.inner.stopping.store(true, Ordering::Relaxed);
        if let Some((_, flag)) = lock(&self.inner.cancel).as_ref() {
            flag.store(true, Ordering::Relaxed);
        }
        self.wake();
    }

    /// Starts the runner thread: it runs queued jobs one at a time until [`Jobs::stop`].
    pub fn spawn_runner(&self) -> std::io::Result<std::thread::JoinHandle<()>> {
        let jobs = self.clone();
        // A plain thread, not a tokio blocking task: the RL trainer drives its own runtime.
        std::thread::Builder::new().name("toolsmith-jobs".into()).spawn(move || jobs.run_loop())
    }

    fn run_loop(&self) {
        while !self.inner.stopping.load(Ordering::Relaxed) {
            match self.inner.store.claim_next() {
                Ok(Some(job)) => self.run_job(job),
                Ok(None) => {
                    let (flag, cv) = &self.inner.wake;
                    let mut woken = lock(flag);
                    if !*woken {
                        woken = cv
                            .wait_timeout(woken, Duration::from_secs(1))
                            .map(|(g, _)| g)
                            .unwrap_or_else(|p| p.into_inner().0);
                    }
                    *woken = false;
                }
                Err(e) => {
                    tracing::error!("the job runner cannot read the queue: {e}");
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
    }

    fn run_job(&self, job: Job) {
        let id = job.id;
        tracing::info!(id, kind = job.kind.as_str(), run = job.runs, dir = %job.dir.display(), "job started");
        *lock(&self.inner.live) = Some(Live { id, kind: Some(job.kind), phase: "preparing".into(), ..Live::default() });
        let result = self.train(&job);
        *lock(&self.inner.cancel) = None;
        lock(&self.inner.requested).remove(&id);
        *lock(&self.inner.live) = None;
        let store = &self.inner.store;
        let running = [JobState::Running];
        let outcome = match result {
            Ok(final_dir) => {
                self.swap(id, &final_dir);
                store.transition(id, &running, JobState::Succeeded, None)
            }
            Err(TrainError::Cancelled) if self.inner.stopping.load(Ordering::Relaxed) => {
                tracing::info!(id, "job interrupted by shutdown; it resumes at the next start");
                store.transition(id, &running, JobState::Queued, None)
            }
            Err(TrainError::Cancelled) => store.transition(id, &running, JobState::Cancelled, None),
            Err(e) => {
                tracing::error!(id, "job failed: {e}");
                store.transition(id, &running, JobState::Failed, Some(&e.to_string()))
            }
        };
        match outcome {
            Ok(_) => tracing::info!(id, state = ?store.get(id).map(|j| j.state).ok(), "job ended"),
            Err(e) => tracing::error!(id, "cannot record how the job ended: {e}"),
        }
    }

    fn train(&self, job: &Job) -> Result<PathBuf, TrainError> {
        let toolbox = self.daemon.toolbox().clone();
        let tools_for = move |corpus: Arc<Corpus>| -> Arc<dyn Executor> {
            Arc::new(LocalTools::new().with_corpus(corpus).with_toolbox(toolbox.clone(), Limits::default()))
        };
        // A run with a checkpoint continues from it (after a cancel, a failure or a crash); one
        // without starts fresh.
        let resume = toolsmith_train::checkpoint::RunDir::create(&job.dir)?.has_checkpoint();
        // Files checked at submission may have been replaced while the job waited.
        self.inputs.recheck(&job.config).map_err(|e| TrainError::Config(e.to_string()))?;
        match job.kind {
            JobKind::Sft => {
                let config: SftConfig =
                    serde_json::from_value(job.config.clone()).map_err(|e| TrainError::Config(e.to_string()))?;
                let mut trainer = sft::prepare(config, &job.dir, resume, &tools_for)?;
                self.running(job.id, trainer.cancel_flag());
                trainer.run(&mut |event| self.on_event(job.id, event, false))
            }
            JobKind::Rl => {
                let config: RlConfig =
                    serde_json::from_value(job.config.clone()).map_err(|e| TrainError::Config(e.to_string()))?;
                let graph = config.graph.is_some();
                let mut trainer = RlTrainer::prepare(config, &job.dir, resume, &tools_for)?;
                self.running(job.id, trainer.cancel_flag());
                trainer.run(&mut |event| self.on_event(job.id, event, graph))
            }
        }
    }

    /// What a running job's events do: progress in the store and in `/status`, and at each
    /// checkpoint the served policy swapped (and, with `graph`, its admitted tools registered).
    fn on_event(&self, id: i64, event: Event<'_>, graph: bool) {
        match event {
            Event::Data { .. } => {}
            Event::Started { step, total } => self.started(id, step, total),
            Event::Step(record) => self.stepped(id, record.step(), record.figures()),
            Event::EvalStarted { .. } => self.phase("evaluating"),
            Event::Eval(_) => self.phase("training"),
            Event::Checkpoint { step, dir } => self.checkpoint(id, step, dir, graph),
        }
    }

    fn running(&self, id: i64, flag: Arc<AtomicBool>) {
        // A cancel or a shutdown that arrived while the job was being prepared still counts.
        let cancelled = self.inner.stopping.load(Ordering::Relaxed) || lock(&self.inner.requested).contains(&id);
        if cancelled {
            flag.store(true, Ordering::Relaxed);
        }
        *lock(&self.inner.cancel) = Some((id, flag));
    }

    fn phase(&self, phase: &str) {
        if let Some(live) = lock(&self.inner.live).as_mut() {
            live.phase = phase.into();
        }
    }

    fn started(&self, id: i64, step: u64, total: u64) {
        if let Some(live) = lock(&self.inner.live).as_mut() {
            (live.step, live.total, live.phase) = (step, total, "training".into());
        }
        if let Err(e) = self.inner.store.progress(id, step, Some(total), None) {
            tracing::warn!(id, "cannot record progress: {e}");
        }
    }

    fn stepped(&self, id: i64, step: u64, figures: Option<Value>) {
        if let Some(live) = lock(&self.inner.live).as_mut() {
            (live.step, live.last) = (step, figures);
        }
        if let Err(e) = self.inner.store.progress(id, step, None, None) {
            tracing::warn!(id, "cannot record progress: {e}");
        }
    }

    fn checkpoint(&self, id: i64, step: u64, dir: &Path, graph: bool) {
        if let Err(e) = self.inner.store.progress(id, step, None, Some(dir)) {
            tracing::warn!(id, "cannot record the checkpoint: {e}");
        }
        if let Some(live) = lock(&self.inner.live).as_mut() {
            live.checkpoint_step = Some(step);
        }
        if graph {
            match self.publish_tools(dir) {
                Ok(0) => {}
                Ok(n) => tracing::info!(id, step, tools = n, "tools admitted by training registered"),
                Err(e) => tracing::warn!(id, "cannot register the tools training admitted: {e}"),
            }
        }
        self.swap(id, dir);
    }

    /// Swaps the served policy to the weights in `dir` (the trainer is paused meanwhile, so the
    /// checkpoint cannot be pruned under the load).
    fn swap(&self, id: i64, dir: &Path) {
        let Some(served) = &self.served else { return };
        match served.swap(dir) {
            Ok(step) => {
                tracing::info!(id, step, dir = %dir.display(), "served policy swapped");
                if let Some(live) = lock(&self.inner.live).as_mut() {
                    live.served_step = Some(step);
                }
            }
            Err(e) => tracing::warn!(id, dir = %dir.display(), "the served policy keeps its weights: {e}"),
        }
    }

    /// Registers the agent-written tools of the checkpoint's tool graph in the daemon's registry
    /// (an unchanged tool is left alone, so this repeats safely); returns how many changed it.
    pub fn publish_tools(&self, checkpoint: &Path) -> Result<usize, String> {
        let snapshot = checkpoint.join(toolsmith_train::rl::graph::REGISTRY_FILE);
        if !snapshot.is_file() {
            return Ok(0);
        }
        // Read from a copy: opening a registry writes beside it, and a checkpoint stays as written.
        let scratch = tempfile::tempdir().map_err(|e| e.to_string())?;
        let copy = scratch.path().join("registry.db");
        std::fs::copy(&snapshot, &copy).map_err(|e| format!("{}: {e}", snapshot.display()))?;
        let trained = Registry::open(&copy).map_err(|e| e.to_string())?;
        let mut tools = Vec::new();
        for record in trained.list(SortBy::Name).map_err(|e| e.to_string())? {
            if record.manifest.kind != ToolKind::Python {
                continue;
            }
            let mut tool = NewTool::new(record.manifest.clone());
            if let Some(hash) = &record.blob_hash
                && let Some(blob) = trained.blob(hash).map_err(|e| e.to_string())?
            {
                tool = tool.with_blob(blob);
            }
            tools.push(tool);
        }
        if tools.is_empty() {
            return Ok(0);
        }
        let outcomes = self.daemon.register_blocking(tools).map_err(|e| e.to_string())?;
        Ok(outcomes.iter().filter(|o| !matches!(o, Registered::Unchanged { .. })).count())
    }
}

/// The JSON body of `POST /jobs`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Submission {
    /// `sft` or `rl`.
    pub kind: JobKind,
    /// The trainer's config (the same fields as its config file).
    #[serde(default = "empty_object")]
    pub config: Value,
}

fn empty_object() -> Value {
    json!({})
}
