//! Keeping a registry in shape: its counts, reindexing, and consistent copies.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rusqlite::{TransactionBehavior, params};
use serde::Serialize;

use super::Registry;
use crate::embed::{self, to_bytes};
use crate::index::{Bm25, Dense};
use crate::{GraphStats, RegistryError, db};

/// Counts for `toolsmith tools stats`: the graph's totals (as [`Registry::view_stats`] counts
/// them) and what the file stores besides.
#[derive(Debug, Clone, Serialize)]
pub struct RegistryStats {
    /// The registry file.
    pub path: PathBuf,
    /// The database's schema version.
    pub schema_version: i64,
    /// Tools, aliases, plan edges and calls.
    #[serde(flatten)]
    pub graph: GraphStats,
    /// Tools of each kind (`plugin`, `python`, ...).
    pub tools_by_kind: BTreeMap<String, i64>,
    /// Stored components and Python sources.
    pub blobs: i64,
    /// Their total size.
    pub blob_bytes: i64,
    /// Candidates waiting for [`Registry::register_best`].
    pub candidates_pending: i64,
    /// Size of the database file (without its WAL).
    pub database_bytes: u64,
}

impl Registry {
    /// The graph's totals and what the file stores besides.
    pub fn stats(&self) -> Result<RegistryStats, RegistryError> {
        let count = |sql: &str| -> Result<i64, RegistryError> { Ok(self.conn.query_row(sql, [], |r| r.get(0))?) };
        let mut stmt = self.conn.prepare("SELECT kind, count(*) FROM tools GROUP BY kind ORDER BY kind")?;
        let tools_by_kind = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<rusqlite::Result<_>>()?;
        let database_bytes = std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0);
        Ok(RegistryStats {
            path: self.path.clone(),
            schema_version: db::user_version(&self.conn)?,
            graph: self.view_stats()?,
            tools_by_kind,
            blobs: count("SELECT count(*) FROM blobs")?,
            blob_bytes: count("SELECT coalesce(sum(length(bytes)), 0) FROM blobs")?,
            candidates_pending: count("SELECT count(*) FROM candidates WHERE status = 'pending'")?,
            database_bytes,
        })
    }

    /// Embeds tools that lack an embedding (e.g. from an old registry or an import without
    /// vectors), then rebuilds the BM25 index from the database. Returns how many were embedded.
    pub fn reindex(&mut self) -> Result<usize, RegistryError> {
        let embedded = self.embed_missing()?;
        self.dense = Dense::default();
        self.dense.sync(&self.conn)?;
        let dir = self.index_dir();
        let mut bm25 = match self.bm25.take() {
            Some(b) => b,
            None => Bm25::open(&dir)?,
        };
        bm25.sync(&self.conn, true)?;
        self.bm25 = Some(bm25);
        Ok(embedded)
    }

    /// Embeds the tools without a whole embedding, in one transaction; returns how many.
    fn embed_missing(&mut self) -> Result<usize, RegistryError> {
        let missing: Vec<(i64, String, String)> = {
            let mut stmt = self.conn.prepare(
                "SELECT id, name, description FROM tools WHERE embedding IS NULL OR length(embedding) != ?1",
            )?;
            stmt.query_map([embed::DIM * 4], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<rusqlite::Result<_>>()?
        };
        if missing.is_empty() {
            return Ok(0);
        }
        let embedder = self.embedder()?;
        let texts: Vec<String> = missing.iter().map(|(_, n, d)| embed::tool_text(n, d)).collect();
        let vectors = embedder.embed(&texts)?;
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        for ((id, _, _), v) in missing.iter().zip(vectors) {
            tx.execute("UPDATE tools SET embedding = ?2 WHERE id = ?1", params![id, to_bytes(&v)])?;
        }
        tx.commit()?;
        Ok(missing.len())
    }

    /// Writes a consistent, compacted copy of the database to `path`, which must not exist
    /// (`VACUUM INTO`: one read transaction, so other connections may keep writing). The search
    /// index is not copied; a registry opened from the copy rebuilds it.
    pub fn snapshot(&self, path: &Path) -> Result<(), RegistryError> {
        let target =
            path.to_str().ok_or_else(|| RegistryError::Invalid(format!("{} is not a UTF-8 path", path.display())))?;
        self.conn.execute("VACUUM INTO ?1", [target])?;
        Ok(())
    }
}
