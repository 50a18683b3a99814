//! One tool in full, as the graph page shows it: schemas, code, provenance, origin, statistics
//! with failures by kind, and its neighbours.

use std::collections::BTreeMap;

use rusqlite::{Connection, OptionalExtension};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolsmith_contract::{Manifest, Provenance, ToolKind};

use super::graph::NodeKind;
use crate::RegistryError;
use crate::store::{Neighbour, aliases_of, neighbours, resolve};

/// Calls, successes and failures of a tool, failures by error kind, and rewards.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolViewStats {
    /// Every call, whoever failed.
    pub calls: i64,
    /// Calls that succeeded.
    pub successes: i64,
    /// Calls the tool failed; the caller's mistakes (`invalid_args`, `not_found`, `busy`) are
    /// not its failures.
    pub failures: i64,
    /// Error kind (`timeout`, `invalid_args`, ...) to count, the caller's kinds included.
    pub failures_by_kind: BTreeMap<String, i64>,
    /// Mean reward of the episodes that used the tool; null when none was scored.
    pub reward_mean: Option<f64>,
    /// Episodes whose reward was counted.
    pub reward_count: i64,
}

/// The episode whose tool was admitted (SEARL's registration step).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolOrigin {
    /// The run (training or evaluation) the episode belonged to.
    pub run: String,
    /// The run's iteration that admitted the tool.
    pub iteration: i64,
    /// The task the episode solved.
    pub task: String,
    /// The episode's reward.
    pub reward: f64,
}

/// One tool in full (`GET /graph/tools/{name}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolView {
    /// The tool's name (the canonical one when it was asked for by an alias).
    pub name: String,
    /// The tool's kind.
    pub kind: NodeKind,
    /// The manifest's version.
    pub version: String,
    /// What the tool does.
    pub description: String,
    /// JSON Schema of the tool's arguments.
    pub input_schema: Value,
    /// JSON Schema of the tool's result.
    pub output_schema: Value,
    /// The source of a Python tool.
    pub code: Option<String>,
    /// Who or what wrote the tool, and the tools merged into it.
    pub provenance: Provenance,
    /// The episode it came from, when training or a recorded evaluation admitted it.
    pub origin: Option<ToolOrigin>,
    /// Names merged into this tool.
    pub aliases: Vec<String>,
    /// Unix milliseconds.
    pub created_at: i64,
    /// Unix milliseconds of the latest call; null when never called.
    pub last_used_at: Option<i64>,
    /// Its calls, failures and rewards.
    pub stats: ToolViewStats,
    /// Edges in: tools whose results fed this one.
    pub dependencies: Vec<Neighbour>,
    /// Edges out: tools this one fed.
    pub dependents: Vec<Neighbour>,
    /// What an operator granted it beyond pure computation (secrets by reference, never values).
    #[serde(default)]
    pub grants: Vec<crate::store::GrantEntry>,
}

/// The columns of a tool's row that its view needs.
struct ToolRow {
    manifest: String,
    blob_hash: Option<String>,
    stats: ToolViewStats,
    created_at: i64,
    last_used_at: Option<i64>,
}

/// One tool (or alias, resolved to its tool) in full.
pub(super) fn tool_view(conn: &Connection, name: &str) -> Result<ToolView, RegistryError> {
    let (id, _) = resolve(conn, name)?.ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
    let row = tool_row(conn, id)?;
    let manifest: Manifest = serde_json::from_str(&row.manifest)
        .map_err(|e| RegistryError::Invalid(format!("the stored manifest of `{name}` is unreadable: {e}")))?;
    let code = match (&manifest.kind, &row.blob_hash) {
        (ToolKind::Python, Some(hash)) => python_code(conn, hash)?,
        _ => None,
    };
    let mut stats = row.stats;
    stats.failures_by_kind = failures_by_kind(conn, id)?;
    let origin = origin(conn, manifest.name.as_str())?;
    let aliases = aliases_of(conn, id)?;
    let (dependencies, dependents) = neighbours(conn, id)?;
    let grants = crate::store::tool_grants(conn, id)?.entries;
    Ok(ToolView {
        name: manifest.name.to_string(),
        kind: manifest.kind.into(),
        version: manifest.version,
        description: manifest.description,
        input_schema: manifest.input_schema,
        output_schema: manifest.output_schema,
        code,
        provenance: manifest.provenance,
        origin,
        aliases,
        created_at: row.created_at,
        last_used_at: row.last_used_at,
        stats,
        dependencies,
        dependents,
        grants,
    })
}

fn tool_row(conn: &Connection, id: i64) -> Result<ToolRow, RegistryError> {
    Ok(conn.query_row(
        "SELECT manifest, blob_hash, usage_count, success_count, failure_count, reward_sum, reward_count, \
         created_at, last_used_at FROM tools WHERE id = ?1",
        [id],
        |r| {
            let (reward_sum, reward_count): (f64, i64) = (r.get(5)?, r.get(6)?);
            Ok(ToolRow {
                manifest: r.get(0)?,
                blob_hash: r.get(1)?,
                stats: ToolViewStats {
                    calls: r.get(2)?,
                    successes: r.get(3)?,
                    failures: r.get(4)?,
                    failures_by_kind: BTreeMap::new(),
                    reward_mean: (reward_count > 0).then(|| reward_sum / reward_count as f64),
                    reward_count,
                },
                created_at: r.get(7)?,
                last_used_at: r.get(8)?,
            })
        },
    )?)
}

/// Failures of tool `id` by error kind; none from a snapshot older than the table.
fn failures_by_kind(conn: &Connection, id: i64) -> Result<BTreeMap<String, i64>, RegistryError> {
    let mut failures = BTreeMap::new();
    if has_table(conn, "failures")? {
        let mut stmt = conn.prepare("SELECT kind, count FROM failures WHERE tool = ?1 ORDER BY kind")?;
        for row in stmt.query_map([id], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))? {
            let (kind, count) = row?;
            failures.insert(kind, count);
        }
    }
    Ok(failures)
}

/// The latest admitted candidate of this name: the episode the tool came from.
fn origin(conn: &Connection, name: &str) -> Result<Option<ToolOrigin>, RegistryError> {
    Ok(conn
        .query_row(
            "SELECT run, iteration, task, reward FROM candidates \
             WHERE status = 'admitted' AND json_extract(manifest, '$.name') = ?1 ORDER BY id DESC LIMIT 1",
            [name],
            |r| Ok(ToolOrigin { run: r.get(0)?, iteration: r.get(1)?, task: r.get(2)?, reward: r.get(3)? }),
        )
        .optional()?)
}

fn has_table(conn: &Connection, name: &str) -> Result<bool, RegistryError> {
    Ok(conn
        .query_row("SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?1", [name], |_| Ok(()))
        .optional()?
        .is_some())
}

/// The source inside the stored Python tool of blob `hash` (`{"code": ..., "positional": ...}`).
fn python_code(conn: &Connection, hash: &str) -> Result<Option<String>, RegistryError> {
    let bytes: Option<Vec<u8>> =
        conn.query_row("SELECT bytes FROM blobs WHERE hash = ?1", [hash], |r| r.get(0)).optional()?;
    Ok(bytes.and_then(|b| {
        let value: Value = serde_json::from_slice(&b).ok()?;
        value.get("code")?.as_str().map(str::to_string)
    }))
}
