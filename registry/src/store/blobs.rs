//! Content-addressed blobs: the components and Python sources tools run from.

use rusqlite::{Connection, OptionalExtension, params};

use super::Registry;
use crate::RegistryError;

/// The content address of `bytes` (BLAKE3, hex).
pub(crate) fn blob_hash(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

/// Stores `bytes` once under their hash, which it returns.
pub(crate) fn put_blob(tx: &Connection, bytes: &[u8]) -> rusqlite::Result<String> {
    let hash = blob_hash(bytes);
    tx.execute("INSERT OR IGNORE INTO blobs (hash, bytes) VALUES (?1, ?2)", params![hash, bytes])?;
    Ok(hash)
}

/// Deletes blobs nothing refers to any more.
pub(super) fn collect_blobs(tx: &Connection) -> rusqlite::Result<()> {
    tx.execute(
        "DELETE FROM blobs WHERE hash NOT IN (SELECT blob_hash FROM tools WHERE blob_hash IS NOT NULL) \
         AND hash NOT IN (SELECT blob_hash FROM candidates WHERE blob_hash IS NOT NULL)",
        [],
    )?;
    Ok(())
}

impl Registry {
    /// The bytes a tool runs from (component or source), if any.
    pub fn blob(&self, hash: &str) -> Result<Option<Vec<u8>>, RegistryError> {
        Ok(self.conn.query_row("SELECT bytes FROM blobs WHERE hash = ?1", [hash], |r| r.get(0)).optional()?)
    }
}
