//! The jobs table in `STATE/jobs.db`, and the lock file that makes one daemon its owner.
//!
//! Kinds and states are stored as the names serde gives them ([`Spelled`]), bound as
//! parameters: no SQL statement spells a state itself.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::types::Value as Sql;
use rusqlite::{Connection, OptionalExtension, params, params_from_iter};
use serde_json::Value;
use toolsmith_contract::sync::lock;

use super::{Job, JobError, JobKind, JobState, Spelled};

/// The jobs database's file name, in the daemon's state directory.
pub const JOBS_FILE: &str = "jobs.db";

/// The lock file of the state directory's jobs.
pub const LOCK_FILE: &str = "jobs.lock";

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// The jobs table, owned by this process while it is open.
#[derive(Debug)]
pub(super) struct Store {
    conn: Mutex<Connection>,
    path: PathBuf,
    root: PathBuf,
    /// Held while this daemon owns the state directory's jobs (released by the OS on any exit).
    _owner: std::fs::File,
}

const COLUMNS: &str =
    "id, kind, state, config, step, total, checkpoint, error, runs, created_at, started_at, finished_at";

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS jobs (
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
);";

impl Store {
    /// Opens (or creates) the jobs of the state directory `root` and takes them for this process.
    pub(super) fn open(root: &Path) -> Result<Store, JobError> {
        std::fs::create_dir_all(root).map_err(|source| JobError::Io { path: root.to_owned(), source })?;
        let path = root.join(JOBS_FILE);
        let err = |source| JobError::Store { path: path.clone(), source };
        let conn = Connection::open(&path).map_err(err)?;
        conn.busy_timeout(Duration::from_secs(5)).map_err(err)?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(err)?;
        conn.execute_batch(SCHEMA).map_err(err)?;
        // A corrupt file is refused here, before anything is written to it.
        conn.query_row("PRAGMA quick_check", [], |r| r.get::<_, String>(0)).map_err(err).and_then(|s| {
            if s == "ok" { Ok(()) } else { Err(JobError::Invalid(format!("{}: {s}", path.display()))) }
        })?;
        let owner = own(root)?;
        Ok(Store { conn: Mutex::new(conn), path, root: root.to_owned(), _owner: owner })
    }

    /// The database file.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self) -> impl Fn(rusqlite::Error) -> JobError + '_ {
        |source| JobError::Store { path: self.path.clone(), source }
    }

    /// Where the run directories of every job lie.
    pub(super) fn jobs_dir(&self) -> PathBuf {
        self.root.join("jobs")
    }

    /// Job `id`'s run directory.
    pub(super) fn dir_of(&self, id: i64) -> PathBuf {
        self.jobs_dir().join(id.to_string())
    }

    fn row(&self, r: &rusqlite::Row<'_>) -> rusqlite::Result<Job> {
        let id: i64 = r.get(0)?;
        let text = |i: usize| -> rusqlite::Result<String> { r.get(i) };
        let bad = |i: usize, what: &str| {
            rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, what.to_owned().into())
        };
        Ok(Job {
            id,
            kind: JobKind::from_spelling(&text(1)?).ok_or_else(|| bad(1, "unknown job kind"))?,
            state: JobState::from_spelling(&text(2)?).ok_or_else(|| bad(2, "unknown job state"))?,
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

    /// Queues a new job of `kind` with `config` (already checked).
    pub(super) fn insert(&self, kind: JobKind, config: &Value) -> Result<Job, JobError> {
        let id = {
            let conn = lock(&self.conn);
            conn.execute(
                "INSERT INTO jobs (kind, state, config, created_at) VALUES (?1, ?2, ?3, ?4)",
                params![kind.spelling(), JobState::Queued.spelling(), config.to_string(), now_ms()],
            )
            .map_err(self.err())?;
            conn.last_insert_rowid()
        };
        self.get(id)
    }

    /// One job.
    pub(super) fn get(&self, id: i64) -> Result<Job, JobError> {
        let conn = lock(&self.conn);
        conn.query_row(&format!("SELECT {COLUMNS} FROM jobs WHERE id = ?1"), [id], |r| self.row(r))
            .optional()
            .map_err(self.err())?
            .ok_or(JobError::NotFound(id))
    }

    /// Every job, oldest first.
    pub(super) fn list(&self) -> Result<Vec<Job>, JobError> {
        let conn = lock(&self.conn);
        let mut stmt = conn.prepare(&format!("SELECT {COLUMNS} FROM jobs ORDER BY id")).map_err(self.err())?;
        let rows = stmt.query_map([], |r| self.row(r)).map_err(self.err())?;
        rows.collect::<Result<Vec<_>, _>>().map_err(self.err())
    }

    /// The oldest queued job, now marked running.
    pub(super) fn claim_next(&self) -> Result<Option<Job>, JobError> {
        let (queued, running) = (JobState::Queued.spelling(), JobState::Running.spelling());
        let id: Option<i64> = {
            let conn = lock(&self.conn);
            let id = conn
                .query_row("SELECT id FROM jobs WHERE state = ?1 ORDER BY id LIMIT 1", [&queued], |r| r.get(0))
                .optional()
                .map_err(self.err())?;
            match id {
                // Guarded on the state, so a job is never claimed twice.
                Some(id) => conn
                    .execute(
                        "UPDATE jobs SET state = ?3, runs = runs + 1, started_at = ?2, finished_at = NULL,
                         error = NULL WHERE id = ?1 AND state = ?4",
                        params![id, now_ms(), running, queued],
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
    pub(super) fn transition(
        &self,
        id: i64,
        from: &[JobState],
        to: JobState,
        error: Option<&str>,
    ) -> Result<bool, JobError> {
        let conn = lock(&self.conn);
        let finished = to.is_terminal().then(now_ms);
        // ?1..?4 are the job and what it becomes; the states it may come from follow.
        let from_params = (5..5 + from.len()).map(|i| format!("?{i}")).collect::<Vec<_>>().join(", ");
        let mut values = vec![
            Sql::Integer(id),
            Sql::Text(to.spelling()),
            error.map_or(Sql::Null, |e| Sql::Text(e.to_owned())),
            finished.map_or(Sql::Null, Sql::Integer),
        ];
        values.extend(from.iter().map(|s| Sql::Text(s.spelling())));
        let n = conn
            .execute(
                &format!(
                    "UPDATE jobs SET state = ?2, error = ?3, finished_at = ?4 WHERE id = ?1 AND state IN ({from_params})"
                ),
                params_from_iter(values),
            )
            .map_err(self.err())?;
        Ok(n == 1)
    }

    /// Records how far a job got: its step, its total once known, its newest checkpoint.
    pub(super) fn progress(
        &self,
        id: i64,
        step: u64,
        total: Option<u64>,
        checkpoint: Option<&Path>,
    ) -> Result<(), JobError> {
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
    pub(super) fn requeue_orphans(&self) -> Result<usize, JobError> {
        let conn = lock(&self.conn);
        conn.execute(
            "UPDATE jobs SET state = ?1 WHERE state = ?2",
            params![JobState::Queued.spelling(), JobState::Running.spelling()],
        )
        .map_err(self.err())
    }

    /// How many jobs wait.
    pub(super) fn queued(&self) -> Result<usize, JobError> {
        let conn = lock(&self.conn);
        conn.query_row("SELECT COUNT(*) FROM jobs WHERE state = ?1", [JobState::Queued.spelling()], |r| {
            r.get::<_, i64>(0)
        })
        .map(|n| n as usize)
        .map_err(self.err())
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// A database written before kinds and states were spelled by serde still loads: the
    /// spellings below are what existing `jobs.db` files hold.
    #[test]
    fn rows_written_with_the_stored_spellings_load() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = Store::open(dir.path()).expect("the store opens");
        let rows = [
            ("sft", "queued", JobKind::Sft, JobState::Queued),
            ("rl", "running", JobKind::Rl, JobState::Running),
            ("sft", "succeeded", JobKind::Sft, JobState::Succeeded),
            ("rl", "failed", JobKind::Rl, JobState::Failed),
            ("sft", "cancelled", JobKind::Sft, JobState::Cancelled),
        ];
        for (kind, state, _, _) in rows {
            lock(&store.conn)
                .execute(
                    "INSERT INTO jobs (kind, state, config, created_at) VALUES (?1, ?2, '{}', 0)",
                    params![kind, state],
                )
                .expect("a row is written");
        }
        let jobs = store.list().expect("the rows load");
        let loaded: Vec<_> = jobs.iter().map(|j| (j.kind, j.state)).collect();
        let expected: Vec<_> = rows.iter().map(|&(_, _, kind, state)| (kind, state)).collect();
        assert_eq!(loaded, expected);
        assert_eq!(store.queued().expect("the queue counts"), 1);
        assert_eq!(store.requeue_orphans().expect("orphans requeue"), 1);
        assert!(store.transition(2, &[JobState::Queued], JobState::Cancelled, None).expect("a transition"));
        assert_eq!(store.get(2).expect("job 2").state, JobState::Cancelled);
        assert!(!store.transition(2, &[JobState::Queued, JobState::Failed], JobState::Queued, None).expect("no-op"));
        let claimed = store.claim_next().expect("a claim").expect("job 1 waits");
        assert_eq!((claimed.id, claimed.state, claimed.runs), (1, JobState::Running, 1));
        let stored: String = lock(&store.conn)
            .query_row("SELECT state FROM jobs WHERE id = 1", [], |r| r.get(0))
            .expect("job 1's state");
        assert_eq!(stored, "running");
    }

    #[test]
    fn an_unknown_spelling_is_refused() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = Store::open(dir.path()).expect("the store opens");
        lock(&store.conn)
            .execute("INSERT INTO jobs (kind, state, config, created_at) VALUES ('sft', 'Queued', '{}', 0)", [])
            .expect("a row is written");
        assert!(matches!(store.get(1), Err(JobError::Store { .. })));
    }
}
