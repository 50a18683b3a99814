//! Environments: the bundled offline world, users' task sets and corpora, and the metrics.

pub mod corpus;
pub mod metrics;
pub mod world;

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

pub use corpus::Corpus;
pub use world::{Document, Family, Task, World, WorldConfig};

/// What can go wrong reading or writing task sets and corpora.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// A file could not be read or written.
    #[error("{0}: {1}")]
    Io(PathBuf, #[source] std::io::Error),
    /// One line of a JSON-lines file is malformed.
    #[error("{path}:{line}: {message}")]
    Line {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The search index failed.
    #[error("search index: {0}")]
    Index(#[from] tantivy::TantivyError),
}

/// Reads tasks from JSON lines: `{"question": ..., "golden_answers": [...]}` at least (a single
/// string `answer` or `golden_answers` string is accepted too); the bundled world's tasks also
/// carry `id`, `family`, `objectives` and `solution`.
pub fn load_tasks(path: &Path) -> Result<Vec<Task>, EnvError> {
    let mut tasks = Vec::new();
    for (line, mut v) in read_jsonl(path)? {
        let bad = |message: String| EnvError::Line { path: path.to_path_buf(), line, message };
        if let Some(obj) = v.as_object_mut() {
            // Common spellings in public QA sets.
            if !obj.contains_key("golden_answers")
                && let Some(a) = obj.remove("answer").or_else(|| obj.remove("answers"))
            {
                obj.insert("golden_answers".into(), a);
            }
            if let Some(s) = obj.get("golden_answers").and_then(|g| g.as_str()).map(str::to_string) {
                obj.insert("golden_answers".into(), serde_json::json!([s]));
            }
        }
        let mut task: Task = serde_json::from_value(v)
            .map_err(|e| bad(format!("{e} (a task is {{\"question\": string, \"golden_answers\": [string]}})")))?;
        if task.golden_answers.is_empty() {
            return Err(bad("golden_answers is empty".into()));
        }
        if task.id.is_empty() {
            task.id = format!("task-{line:04}");
        }
        tasks.push(task);
    }
    Ok(tasks)
}

/// The JSON values of a JSON-lines file with their 1-based line numbers (blank lines skipped).
pub fn read_jsonl(path: &Path) -> Result<Vec<(usize, serde_json::Value)>, EnvError> {
    let file = std::fs::File::open(path).map_err(|e| EnvError::Io(path.to_path_buf(), e))?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| EnvError::Io(path.to_path_buf(), e))?;
        if line.trim().is_empty() {
            continue;
        }
        let v = serde_json::from_str(&line).map_err(|e| EnvError::Line {
            path: path.to_path_buf(),
            line: i + 1,
            message: e.to_string(),
        })?;
        out.push((i + 1, v));
    }
    Ok(out)
}

/// Writes values as JSON lines, atomically (a temporary file renamed into place).
pub fn write_jsonl<T: serde::Serialize>(path: &Path, items: &[T]) -> Result<(), EnvError> {
    let io = |e| EnvError::Io(path.to_path_buf(), e);
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io)?;
    for item in items {
        let line = serde_json::to_string(item).map_err(|e| EnvError::Line {
            path: path.to_path_buf(),
            line: 0,
            message: e.to_string(),
        })?;
        writeln!(tmp, "{line}").map_err(io)?;
    }
    // Temporary files are private; these are data files to share.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file().set_permissions(std::fs::Permissions::from_mode(0o644)).map_err(io)?;
    }
    tmp.persist(path).map_err(|e| io(e.error))?;
    Ok(())
}

/// The bundled world written as `corpus.jsonl` and `tasks.jsonl` under `dir`.
pub fn write_world(world: &World, dir: &Path) -> Result<(), EnvError> {
    write_jsonl(&dir.join("corpus.jsonl"), &world.documents())?;
    write_jsonl(&dir.join("tasks.jsonl"), &world.tasks())?;
    // The same tasks in other words, for evaluation only (no trace is made from them).
    write_jsonl(&dir.join("tasks-reworded.jsonl"), &world.reworded_tasks())?;
    let config = serde_json::to_string_pretty(&world.config).unwrap_or_default();
    std::fs::write(dir.join("world.json"), config + "\n").map_err(|e| EnvError::Io(dir.join("world.json"), e))
}
