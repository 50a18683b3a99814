//! A registry file opened read-only, such as the snapshot a training checkpoint keeps.

use std::path::Path;

use rusqlite::{Connection, OpenFlags};

use super::graph::{GraphStats, GraphView};
use super::graph_rows::{graph_view, view_stats};
use super::tool::{ToolView, tool_view};
use crate::{RegistryError, db};

/// A registry file opened read-only, such as the snapshot a checkpoint keeps: nothing is
/// migrated, indexed or written.
#[derive(Debug)]
pub struct Snapshot {
    conn: Connection,
}

impl Snapshot {
    /// Opens `path` read-only; refuses a file that is not a registry or is newer than this build.
    pub fn open(path: &Path) -> Result<Snapshot, RegistryError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).map_err(|e| db::classify(path, e))?;
        let application_id: i64 =
            conn.query_row("PRAGMA application_id", [], |r| r.get(0)).map_err(|e| db::classify(path, e))?;
        if application_id != db::APPLICATION_ID {
            return Err(RegistryError::NotARegistry {
                path: path.to_path_buf(),
                reason: "no Toolsmith marker (application_id)".into(),
            });
        }
        let version = db::user_version(&conn).map_err(|e| db::classify(path, e))?;
        if version < 2 {
            return Err(RegistryError::Invalid(format!(
                "{}: registry schema version {version} is too old to show; open it with `toolsmith tools` once to upgrade",
                path.display()
            )));
        }
        if version > db::SCHEMA_VERSION {
            return Err(RegistryError::TooNew {
                path: path.to_path_buf(),
                found: version,
                supported: db::SCHEMA_VERSION,
            });
        }
        Ok(Snapshot { conn })
    }

    /// The whole graph.
    pub fn graph_view(&self) -> Result<GraphView, RegistryError> {
        graph_view(&self.conn)
    }

    /// One tool (or alias) in full.
    pub fn tool_view(&self, name: &str) -> Result<ToolView, RegistryError> {
        tool_view(&self.conn, name)
    }

    /// The totals of [`Snapshot::graph_view`] without reading every row out.
    pub fn view_stats(&self) -> Result<GraphStats, RegistryError> {
        view_stats(&self.conn)
    }
}
