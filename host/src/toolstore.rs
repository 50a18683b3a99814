//! Admitted agent-written tools on disk, so `toolsmith call NAME` finds them in a later process.
//!
//! One JSON file per tool (`<name>.json`: manifest and code), written atomically. This is a
//! stop-gap until the SQLite tool graph owns persistence; a file that does not parse is reported
//! and left untouched, never deleted.

use std::path::{Path, PathBuf};

use crate::python::create::PythonTool;

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolStoreError {
    /// Reading or writing the directory failed.
    #[error("tool store {path}: {source}")]
    Io {
        /// The file or directory.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

/// A directory of admitted Python tools.
#[derive(Debug, Clone)]
pub struct ToolStore {
    dir: PathBuf,
}

impl ToolStore {
    /// `$TOOLSMITH_TOOLS_DIR`, else `<user data dir>/toolsmith/tools` (`~/.local/share/...` on Linux).
    pub fn default_dir() -> PathBuf {
        match std::env::var_os("TOOLSMITH_TOOLS_DIR") {
            Some(d) if !d.is_empty() => PathBuf::from(d),
            _ => dirs::data_dir().unwrap_or_else(|| PathBuf::from(".")).join("toolsmith").join("tools"),
        }
    }

    /// A store in `dir` (created on first save).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ToolStore { dir: dir.into() }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Saves (or replaces) a tool.
    pub fn save(&self, tool: &PythonTool) -> Result<PathBuf, ToolStoreError> {
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| ToolStoreError::Io { path, source }
        };
        std::fs::create_dir_all(&self.dir).map_err(io(&self.dir))?;
        let path = self.dir.join(format!("{}.json", tool.manifest.name));
        let text = serde_json::to_string_pretty(tool)
            .map_err(|e| ToolStoreError::Io { path: path.display().to_string(), source: std::io::Error::other(e) })?;
        let mut tmp = tempfile::NamedTempFile::new_in(&self.dir).map_err(io(&self.dir))?;
        std::io::Write::write_all(&mut tmp, text.as_bytes()).map_err(io(&path))?;
        tmp.persist(&path).map_err(|e| ToolStoreError::Io { path: path.display().to_string(), source: e.error })?;
        Ok(path)
    }

    /// Every tool that loads; files that do not are returned as errors beside them.
    pub fn load_all(&self) -> (Vec<PythonTool>, Vec<String>) {
        let (mut tools, mut problems) = (Vec::new(), Vec::new());
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return (tools, problems); // no store yet
        };
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for path in paths.into_iter().filter(|p| p.extension().is_some_and(|e| e == "json")) {
            let parsed = std::fs::read_to_string(&path)
                .map_err(|e| e.to_string())
                .and_then(|text| serde_json::from_str::<PythonTool>(&text).map_err(|e| e.to_string()))
                .and_then(|tool| tool.manifest.check().map(|_| tool).map_err(|e| e.to_string()));
            match parsed {
                Ok(tool) => tools.push(tool),
                Err(e) => problems.push(format!("{}: {e} (left untouched)", path.display())),
            }
        }
        (tools, problems)
    }
}
