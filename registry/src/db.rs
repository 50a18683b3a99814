//! Opening the SQLite file: connection settings, recognising foreign files, versioned migrations.
//!
//! The schema version lives in SQLite's `user_version`; `application_id` marks the file as ours, so
//! a foreign database is refused instead of being "migrated". Migrations run in one `IMMEDIATE`
//! transaction, so processes that open a new registry at the same moment do not race.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags, TransactionBehavior};

use crate::RegistryError;

/// `application_id` of a registry: "TSMR".
pub(crate) const APPLICATION_ID: i64 = 0x5453_4D52;

/// Each entry upgrades the schema from version `i` to `i + 1`. Never edit a released entry: add one.
pub(crate) const MIGRATIONS: &[&str] = &[
    // 1: tools, content-addressed blobs, weighted edges, aliases, candidates.
    r#"
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT;
    CREATE TABLE blobs (hash TEXT PRIMARY KEY, bytes BLOB NOT NULL) STRICT;
    CREATE TABLE tools (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL UNIQUE,
        version TEXT NOT NULL,
        kind TEXT NOT NULL,
        description TEXT NOT NULL,
        manifest TEXT NOT NULL,
        blob_hash TEXT REFERENCES blobs(hash),
        embedding BLOB,
        usage_count INTEGER NOT NULL DEFAULT 0,
        success_count INTEGER NOT NULL DEFAULT 0,
        failure_count INTEGER NOT NULL DEFAULT 0,
        reward_sum REAL NOT NULL DEFAULT 0,
        reward_count INTEGER NOT NULL DEFAULT 0,
        created_at INTEGER NOT NULL,
        author TEXT,
        run TEXT,
        parents TEXT NOT NULL DEFAULT '[]'
    ) STRICT;
    CREATE TABLE edges (
        src INTEGER NOT NULL REFERENCES tools(id) ON DELETE CASCADE,
        dst INTEGER NOT NULL REFERENCES tools(id) ON DELETE CASCADE,
        count INTEGER NOT NULL,
        weight REAL NOT NULL,
        PRIMARY KEY (src, dst)
    ) STRICT, WITHOUT ROWID;
    CREATE INDEX edges_dst ON edges(dst);
    CREATE TABLE aliases (
        alias TEXT PRIMARY KEY,
        canonical INTEGER NOT NULL REFERENCES tools(id) ON DELETE CASCADE
    ) STRICT;
    CREATE TABLE candidates (
        id INTEGER PRIMARY KEY,
        run TEXT NOT NULL,
        iteration INTEGER NOT NULL,
        task TEXT NOT NULL,
        trajectory TEXT NOT NULL,
        reward REAL NOT NULL,
        manifest TEXT NOT NULL,
        blob_hash TEXT REFERENCES blobs(hash),
        created_at INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX candidates_iteration ON candidates(run, iteration);
    "#,
    // 2: recency, candidate status, and a generation counter kept by triggers so the search index
    // and in-memory embeddings of every process catch up incrementally with any writer's changes.
    r#"
    ALTER TABLE tools ADD COLUMN last_used_at INTEGER;
    ALTER TABLE tools ADD COLUMN rev INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE candidates ADD COLUMN status TEXT NOT NULL DEFAULT 'pending';
    CREATE INDEX tools_rev ON tools(rev);
    CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL) STRICT;
    INSERT INTO counters VALUES ('generation', 1);
    UPDATE tools SET rev = 1;
    CREATE TABLE tombstones (id INTEGER PRIMARY KEY, rev INTEGER NOT NULL) STRICT;
    CREATE TRIGGER tools_inserted AFTER INSERT ON tools BEGIN
        UPDATE counters SET value = value + 1 WHERE name = 'generation';
        UPDATE tools SET rev = (SELECT value FROM counters WHERE name = 'generation') WHERE id = NEW.id;
    END;
    CREATE TRIGGER tools_changed AFTER UPDATE OF name, description, manifest, embedding ON tools BEGIN
        UPDATE counters SET value = value + 1 WHERE name = 'generation';
        UPDATE tools SET rev = (SELECT value FROM counters WHERE name = 'generation') WHERE id = NEW.id;
    END;
    CREATE TRIGGER tools_deleted AFTER DELETE ON tools BEGIN
        UPDATE counters SET value = value + 1 WHERE name = 'generation';
        INSERT OR REPLACE INTO tombstones VALUES (OLD.id, (SELECT value FROM counters WHERE name = 'generation'));
    END;
    "#,
    // 3: failures by error kind, and an activity counter (calls and plan edges) so a watcher sees
    // usage change with one read instead of summing every tool.
    r#"
    CREATE TABLE failures (
        tool INTEGER NOT NULL REFERENCES tools(id) ON DELETE CASCADE,
        kind TEXT NOT NULL,
        count INTEGER NOT NULL,
        PRIMARY KEY (tool, kind)
    ) STRICT, WITHOUT ROWID;
    INSERT INTO counters VALUES ('activity', 0);
    CREATE TRIGGER tools_used AFTER UPDATE OF usage_count ON tools BEGIN
        UPDATE counters SET value = value + 1 WHERE name = 'activity';
    END;
    CREATE TRIGGER edges_added AFTER INSERT ON edges BEGIN
        UPDATE counters SET value = value + 1 WHERE name = 'activity';
    END;
    CREATE TRIGGER edges_changed AFTER UPDATE OF count, weight ON edges BEGIN
        UPDATE counters SET value = value + 1 WHERE name = 'activity';
    END;
    "#,
    // 4: capability grants per tool, bound to the code they were granted to, and their log. The
    // log names tools by name (not id) so it outlives a removed tool. A grant moves the generation,
    // so served tool listings (which show grants) are rebuilt.
    r#"
    CREATE TABLE grants (
        tool INTEGER NOT NULL REFERENCES tools(id) ON DELETE CASCADE,
        capability TEXT NOT NULL,
        spec TEXT NOT NULL,
        description TEXT NOT NULL,
        blob_hash TEXT,
        granted_by TEXT NOT NULL,
        granted_at INTEGER NOT NULL,
        PRIMARY KEY (tool, capability)
    ) STRICT;
    CREATE TABLE grant_log (
        id INTEGER PRIMARY KEY,
        tool TEXT NOT NULL,
        action TEXT NOT NULL,
        capability TEXT NOT NULL,
        actor TEXT NOT NULL,
        at INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX grant_log_tool ON grant_log(tool);
    CREATE TRIGGER grants_added AFTER INSERT ON grants BEGIN
        UPDATE counters SET value = value + 1 WHERE name = 'generation';
    END;
    CREATE TRIGGER grants_removed AFTER DELETE ON grants BEGIN
        UPDATE counters SET value = value + 1 WHERE name = 'generation';
    END;
    "#,
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Opens (creating if needed) and migrates the registry database at `path`.
pub(crate) fn open(path: &Path) -> Result<Connection, RegistryError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| RegistryError::Io { path: dir.to_path_buf(), source })?;
    }
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(|e| classify(path, e))?;
    conn.busy_timeout(Duration::from_secs(10)).map_err(|e| classify(path, e))?;
    // The first statement reads the header: a file that is not SQLite fails here.
    let application_id: i64 =
        conn.query_row("PRAGMA application_id", [], |r| r.get(0)).map_err(|e| classify(path, e))?;
    let tables: i64 =
        conn.query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0)).map_err(|e| classify(path, e))?;
    if application_id != APPLICATION_ID && !(application_id == 0 && tables == 0) {
        let reason = if application_id == 0 {
            "an SQLite database of some other program (it has tables but no Toolsmith marker)".to_string()
        } else {
            format!("an SQLite database of some other program (application_id {application_id:#x})")
        };
        return Err(RegistryError::NotARegistry { path: path.to_path_buf(), reason });
    }
    // WAL: readers never block the writer; NORMAL sync loses nothing when a process dies (only a
    // power cut may drop the last transactions).
    conn.pragma_update(None, "journal_mode", "WAL").map_err(|e| classify(path, e))?;
    conn.pragma_update(None, "synchronous", "NORMAL").map_err(|e| classify(path, e))?;
    conn.pragma_update(None, "foreign_keys", true).map_err(|e| classify(path, e))?;
    migrate(path, conn)
}

fn migrate(path: &Path, mut conn: Connection) -> Result<Connection, RegistryError> {
    let version = user_version(&conn).map_err(|e| classify(path, e))?;
    if version > SCHEMA_VERSION {
        return Err(RegistryError::TooNew { path: path.to_path_buf(), found: version, supported: SCHEMA_VERSION });
    }
    if version == SCHEMA_VERSION {
        return Ok(conn);
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // Another process may have migrated while we waited for the lock.
    let version = user_version(&tx)?;
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version.max(0) as usize) {
        tracing::info!(path = %path.display(), to = i + 1, "migrating the registry schema");
        tx.execute_batch(sql)?;
    }
    tx.pragma_update(None, "application_id", APPLICATION_ID)?;
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()?;
    Ok(conn)
}

pub(crate) fn user_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA user_version", [], |r| r.get(0))
}

/// Turns SQLite's "not a database" family into an error that names the file.
pub(crate) fn classify(path: &Path, e: rusqlite::Error) -> RegistryError {
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => {
            RegistryError::NotARegistry { path: path.to_path_buf(), reason: "not an SQLite database".into() }
        }
        Some(ErrorCode::DatabaseCorrupt) => RegistryError::Corrupt { path: path.to_path_buf(), detail: e.to_string() },
        Some(ErrorCode::CannotOpen | ErrorCode::PermissionDenied | ErrorCode::ReadOnly) => {
            RegistryError::Open { path: path.to_path_buf(), detail: e.to_string() }
        }
        _ => RegistryError::Sqlite(e),
    }
}
