//! The `tools` table's rows as Rust values, and the one writer of a tool row.

use rusqlite::{Connection, params};
use serde::{Deserialize, Serialize};
use toolsmith_contract::{Manifest, ToolKind};

use super::now_ms;

/// Usage and reward statistics of a tool.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolStats {
    /// Every call, whoever failed.
    pub usage_count: i64,
    /// Calls that succeeded.
    pub success_count: i64,
    /// Calls the tool failed (`tool_error`, `trap`, `timeout`, ...). The caller's mistakes
    /// (`invalid_args`, `not_found`, `busy`) are the rest of `usage_count`.
    pub failure_count: i64,
    /// Sum of the rewards of the episodes that used the tool, once per episode.
    pub reward_sum: f64,
    /// Episodes whose reward is in `reward_sum`.
    pub reward_count: i64,
}

impl ToolStats {
    /// Successes among the calls the tool itself answered: the caller's mistakes do not count.
    pub fn success_rate(&self) -> Option<f64> {
        let judged = self.success_count + self.failure_count;
        (judged > 0).then(|| self.success_count as f64 / judged as f64)
    }

    /// Calls that failed through the caller's fault.
    pub fn caller_errors(&self) -> i64 {
        (self.usage_count - self.success_count - self.failure_count).max(0)
    }

    /// Mean reward of the episodes that used the tool; `None` when none was scored.
    pub fn mean_reward(&self) -> Option<f64> {
        (self.reward_count > 0).then(|| self.reward_sum / self.reward_count as f64)
    }
}

/// A stored tool.
#[derive(Debug, Clone, Serialize)]
pub struct ToolRecord {
    /// Row id in this database file.
    pub id: i64,
    /// The tool's name.
    pub name: String,
    /// The manifest's version.
    pub version: String,
    /// How the tool runs.
    pub kind: ToolKind,
    /// What the tool does.
    pub description: String,
    /// The whole manifest as registered.
    pub manifest: Manifest,
    /// The blob (component or source) it runs from, if any.
    pub blob_hash: Option<String>,
    /// Its calls, failures and rewards.
    pub stats: ToolStats,
    /// [`ToolStats::mean_reward`], kept beside the counters for JSON readers.
    pub mean_reward: Option<f64>,
    /// Unix milliseconds.
    pub created_at: i64,
    /// Unix milliseconds of the latest call; `None` when never called.
    pub last_used_at: Option<i64>,
    /// Whether the tool has its embedding (`toolsmith tools reindex` adds missing ones).
    pub has_embedding: bool,
}

/// The columns [`tool_from_row`] reads, in its order.
pub(super) const TOOL_COLUMNS: &str = "id, name, version, kind, description, manifest, blob_hash, usage_count, success_count, \
     failure_count, reward_sum, reward_count, created_at, last_used_at, embedding IS NOT NULL";

/// A [`ToolRecord`] from a row of [`TOOL_COLUMNS`].
pub(super) fn tool_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<ToolRecord> {
    let manifest_text: String = row.get(5)?;
    let manifest: Manifest = serde_json::from_str(&manifest_text)
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(5, rusqlite::types::Type::Text, Box::new(e)))?;
    // The `kind` column mirrors the manifest's (it exists for SQL: stats by kind).
    let kind = manifest.kind;
    let stats = ToolStats {
        usage_count: row.get(7)?,
        success_count: row.get(8)?,
        failure_count: row.get(9)?,
        reward_sum: row.get(10)?,
        reward_count: row.get(11)?,
    };
    Ok(ToolRecord {
        id: row.get(0)?,
        name: row.get(1)?,
        version: row.get(2)?,
        kind,
        description: row.get(4)?,
        mean_reward: stats.mean_reward(),
        manifest,
        blob_hash: row.get(6)?,
        stats,
        created_at: row.get(12)?,
        last_used_at: row.get(13)?,
        has_embedding: row.get(14)?,
    })
}

/// A manifest as the `manifest` column stores it.
pub(crate) fn manifest_json(m: &Manifest) -> String {
    serde_json::to_string(m).unwrap_or_default()
}

/// The `kind` column back as a [`ToolKind`] (its `Display` form; unknown text reads as the default).
pub(crate) fn parse_kind(text: &str) -> ToolKind {
    serde_json::from_value(serde_json::Value::String(text.to_string())).unwrap_or_default()
}

/// Inserts a tool, or replaces the manifest-derived columns of the tool of that name (keeping its
/// statistics, edges and creation time).
pub(crate) fn write_tool_row(
    tx: &Connection,
    m: &Manifest,
    manifest_json: &str,
    blob_hash: Option<&str>,
    embedding: Option<&[u8]>,
) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT INTO tools (name, version, kind, description, manifest, blob_hash, embedding, created_at, author, run, \
         parents) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) \
         ON CONFLICT (name) DO UPDATE SET version = excluded.version, kind = excluded.kind, \
         description = excluded.description, manifest = excluded.manifest, blob_hash = excluded.blob_hash, \
         embedding = excluded.embedding, author = excluded.author, run = excluded.run, parents = excluded.parents",
        params![
            m.name.as_str(),
            m.version,
            m.kind.to_string(),
            m.description,
            manifest_json,
            blob_hash,
            embedding,
            now_ms(),
            m.provenance.author,
            m.provenance.created_by_run,
            serde_json::to_string(&m.provenance.parents).unwrap_or_default(),
        ],
    )?;
    Ok(())
}
