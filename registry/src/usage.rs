//! Usage statistics written in batches: a call hands its record to a channel and goes on; one
//! thread owns a connection and commits what arrived in one transaction every few milliseconds
//! (or every [`BATCH`] records), so no call waits on SQLite's write lock.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::{Connection, TransactionBehavior};

use crate::store::{CallUsage, record_calls};
use crate::{RegistryError, db};

/// Records committed together at most.
pub const BATCH: usize = 512;
/// How long a record may wait for its batch.
pub const LINGER: Duration = Duration::from_millis(100);

enum Message {
    Calls(Vec<CallUsage>),
    /// Commit what is pending, then answer.
    Flush(SyncSender<Result<(), String>>),
}

struct Writer {
    sender: Mutex<Option<Sender<Message>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Closing the channel makes the thread commit what is left and stop.
        drop(toolsmith_contract::sync::lock(&self.sender).take());
        if let Some(thread) = toolsmith_contract::sync::lock(&self.thread).take() {
            let _ = thread.join();
        }
    }
}

/// A batching writer of [`CallUsage`] records for one registry file. Cheap to clone; the last
/// clone dropped commits what is pending.
#[derive(Clone)]
pub struct UsageLog {
    writer: Arc<Writer>,
    path: Arc<PathBuf>,
    /// Records that could not be written (logged; the calls themselves are unaffected).
    lost: Arc<AtomicU64>,
}

impl std::fmt::Debug for UsageLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UsageLog").field("path", &self.path).finish_non_exhaustive()
    }
}

impl UsageLog {
    /// Opens (and migrates) the registry at `path` on a connection of the writer's own.
    pub fn open(path: &Path) -> Result<UsageLog, RegistryError> {
        let conn = db::open(path)?;
        let (sender, receiver) = mpsc::channel();
        let lost = Arc::new(AtomicU64::new(0));
        let thread = std::thread::Builder::new()
            .name("toolsmith-usage".into())
            .spawn({
                let lost = lost.clone();
                let path = path.to_path_buf();
                move || run(conn, receiver, &path, &lost)
            })
            .map_err(|source| RegistryError::Io { path: path.to_path_buf(), source })?;
        Ok(UsageLog {
            writer: Arc::new(Writer { sender: Mutex::new(Some(sender)), thread: Mutex::new(Some(thread)) }),
            path: Arc::new(path.to_path_buf()),
            lost,
        })
    }

    /// Queues one call.
    pub fn record(&self, call: CallUsage) {
        self.record_all(vec![call]);
    }

    /// Queues calls (e.g. all of an episode's).
    pub fn record_all(&self, calls: Vec<CallUsage>) {
        if calls.is_empty() {
            return;
        }
        let n = calls.len() as u64;
        let sent = toolsmith_contract::sync::lock(&self.writer.sender)
            .as_ref()
            .is_some_and(|s| s.send(Message::Calls(calls)).is_ok());
        if !sent {
            self.lost.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Waits until everything queued so far is committed.
    pub fn flush(&self) -> Result<(), RegistryError> {
        let (reply, answer) = mpsc::sync_channel(1);
        let sent = toolsmith_contract::sync::lock(&self.writer.sender)
            .as_ref()
            .is_some_and(|s| s.send(Message::Flush(reply)).is_ok());
        if !sent {
            return Err(RegistryError::Invalid("the usage writer has stopped".into()));
        }
        answer
            .recv()
            .map_err(|_| RegistryError::Invalid("the usage writer stopped before committing".into()))?
            .map_err(RegistryError::Invalid)
    }

    /// Records that could not be written since the log was opened.
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }
}

fn run(mut conn: Connection, receiver: Receiver<Message>, path: &Path, lost: &AtomicU64) {
    let mut pending: Vec<CallUsage> = Vec::new();
    let mut oldest: Option<Instant> = None;
    let mut commit = |pending: &mut Vec<CallUsage>| -> Result<(), String> {
        if pending.is_empty() {
            return Ok(());
        }
        let result = (|| -> Result<(), RegistryError> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let recorded = record_calls(&tx, pending)?;
            tx.commit()?;
            tracing::debug!(recorded = recorded.recorded, unknown = recorded.unknown, "usage committed");
            Ok(())
        })();
        let n = pending.len() as u64;
        pending.clear();
        result.map_err(|e| {
            lost.fetch_add(n, Ordering::Relaxed);
            tracing::warn!(path = %path.display(), "cannot record {n} tool calls: {e}");
            e.to_string()
        })
    };
    loop {
        let wait = oldest.map_or(Duration::from_secs(3600), |t| LINGER.saturating_sub(t.elapsed()));
        match receiver.recv_timeout(wait) {
            Ok(Message::Calls(calls)) => {
                oldest.get_or_insert_with(Instant::now);
                pending.extend(calls);
                if pending.len() >= BATCH {
                    let _ = commit(&mut pending);
                    oldest = None;
                }
            }
            Ok(Message::Flush(reply)) => {
                let _ = reply.send(commit(&mut pending));
                oldest = None;
            }
            Err(RecvTimeoutError::Timeout) => {
                let _ = commit(&mut pending);
                oldest = None;
            }
            Err(RecvTimeoutError::Disconnected) => {
                let _ = commit(&mut pending);
                return;
            }
        }
    }
}
