//! Opening a registry, its settings and metadata, and keeping its derived indexes in step.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::{OptionalExtension, params};

use super::links::resolve;
use super::{Registry, RegistryOptions, Settings};
use crate::embed::Embedder;
use crate::index::{Bm25, Dense};
use crate::{RegistryError, db};

impl Registry {
    /// The per-user default: `$TOOLSMITH_REGISTRY`, else `registry.db` in the XDG data directory.
    pub fn default_path() -> PathBuf {
        if let Some(p) = std::env::var_os("TOOLSMITH_REGISTRY") {
            return PathBuf::from(p);
        }
        dirs::data_dir().unwrap_or_else(|| PathBuf::from(".")).join("toolsmith").join("registry.db")
    }

    /// Opens (creating and migrating as needed) the registry at `path` with default settings.
    pub fn open(path: &Path) -> Result<Registry, RegistryError> {
        Registry::open_with(path, RegistryOptions::default())
    }

    /// Opens the registry at `path`.
    pub fn open_with(path: &Path, options: RegistryOptions) -> Result<Registry, RegistryError> {
        let conn = db::open(path)?;
        Ok(Registry {
            conn,
            path: path.to_path_buf(),
            settings: options.settings,
            embedder: options.embedder,
            bm25: None,
            dense: Dense::default(),
        })
    }

    /// The registry file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The BM25 index directory: `registry.db` -> `registry.db.index/`.
    pub fn index_dir(&self) -> PathBuf {
        let mut name = self.path.as_os_str().to_owned();
        name.push(".index");
        PathBuf::from(name)
    }

    /// Retrieval and merging settings in use.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Changes settings for this handle only (they are not stored in the file).
    pub fn settings_mut(&mut self) -> &mut Settings {
        &mut self.settings
    }

    /// The embedder, loading it on first use.
    pub fn embedder(&mut self) -> Result<Arc<Embedder>, RegistryError> {
        if let Some(e) = &self.embedder {
            return Ok(e.clone());
        }
        let e = Arc::new(Embedder::load_default()?);
        self.embedder = Some(e.clone());
        Ok(e)
    }

    /// Number of tools.
    pub fn len(&self) -> Result<usize, RegistryError> {
        Ok(self.conn.query_row("SELECT count(*) FROM tools", [], |r| r.get::<_, i64>(0))? as usize)
    }

    /// Whether the registry holds no tools.
    pub fn is_empty(&self) -> Result<bool, RegistryError> {
        Ok(self.len()? == 0)
    }

    /// A value of the registry's key-value metadata.
    pub fn meta(&self, key: &str) -> Result<Option<String>, RegistryError> {
        Ok(self.conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0)).optional()?)
    }

    /// Sets a value of the registry's key-value metadata.
    pub fn set_meta(&self, key: &str, value: &str) -> Result<(), RegistryError> {
        self.conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)", params![key, value])?;
        Ok(())
    }

    /// A counter that moves whenever a tool is added, changed or removed (by any process), and
    /// only then: watch it to learn that the tool list changed.
    pub fn generation(&self) -> Result<i64, RegistryError> {
        Ok(crate::index::generation(&self.conn)?)
    }

    /// The canonical name for `name` (itself, or what it was merged into), if known.
    pub fn resolve(&self, name: &str) -> Result<Option<String>, RegistryError> {
        resolve(&self.conn, name).map(|r| r.map(|(_, n)| n))
    }

    /// Brings the in-memory embeddings and the BM25 index up to date with the database.
    pub(crate) fn sync(&mut self) -> Result<(), RegistryError> {
        // The common case on the search path: nothing changed since the last sync, one query.
        let current = crate::index::generation(&self.conn)?;
        if self.dense.synced() == current && self.bm25.as_ref().is_some_and(|b| b.synced() == current) {
            return Ok(());
        }
        self.dense.sync(&self.conn)?;
        if self.bm25.is_none() {
            self.bm25 = Some(Bm25::open(&self.index_dir())?);
        }
        if let Some(b) = &mut self.bm25 {
            match b.sync(&self.conn, false) {
                // Another process has held the index writer for longer than we wait: search the
                // index as it is (a few tools may be missing from BM25) rather than fail.
                Err(RegistryError::Index { source: tantivy::TantivyError::LockFailure(..), .. }) => {
                    tracing::warn!("search index is locked by another process; searching it as it is");
                }
                other => other?,
            }
        }
        Ok(())
    }
}
