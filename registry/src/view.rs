//! The tool graph as a page shows it: every tool and alias with its statistics, plan and alias
//! edges, and one tool in full (schemas, code, provenance, failures by kind).
//!
//! The queries take a bare [`Connection`], so they read the live registry and, through
//! [`Snapshot`], a read-only copy that training kept at a checkpoint (schema version 2 and later:
//! one without failures by kind shows none).

use std::collections::BTreeMap;
use std::path::Path;

use rusqlite::{Connection, OpenFlags, OptionalExtension};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolsmith_contract::{Manifest, Provenance, ToolKind};

use crate::RegistryError;
use crate::db;
use crate::store::{Neighbour, Registry, parse_kind};

/// Version of the [`GraphView`] format (`format` in `graph.json`).
pub const GRAPH_FORMAT: u32 = 1;

/// Where a graph view was read from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum GraphSource {
    /// The registry as it is now.
    #[default]
    Live,
    /// The snapshot a training job kept with a checkpoint.
    Checkpoint { job: String, step: u64 },
}

/// What a node is: a tool of some kind, or a name merged into another tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NodeKind {
    Plugin,
    Python,
    Simulated,
    Native,
    /// A merged-away name; `canonical` names the tool that absorbed it.
    Alias,
}

impl From<ToolKind> for NodeKind {
    fn from(kind: ToolKind) -> Self {
        match kind {
            ToolKind::Plugin => NodeKind::Plugin,
            ToolKind::Python => NodeKind::Python,
            ToolKind::Simulated => NodeKind::Simulated,
            ToolKind::Native => NodeKind::Native,
        }
    }
}

/// A node of [`GraphView`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ViewNode {
    pub name: String,
    pub kind: NodeKind,
    /// Empty for an alias.
    pub version: String,
    pub description: String,
    pub calls: i64,
    /// Calls the tool failed; the caller's mistakes (`invalid_args`, `not_found`, `busy`) are
    /// not its failures.
    pub failures: i64,
    /// Mean reward of the episodes that used the tool; null when none was scored.
    pub reward_mean: Option<f64>,
    /// For an alias: the tool it was merged into.
    pub canonical: Option<String>,
    /// Unix milliseconds.
    pub created_at: i64,
    pub last_used_at: Option<i64>,
}

/// An edge's origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EdgeKind {
    /// Learned from plans: `src`'s result fed `dst`.
    Plan,
    /// `src` was merged into `dst`.
    Alias,
}

/// An edge of [`GraphView`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ViewEdge {
    pub src: String,
    pub dst: String,
    pub kind: EdgeKind,
    /// Plans that used the edge (0 for an alias).
    pub count: i64,
    /// Sum of those plans' rewards; `weight / count` is their mean.
    pub weight: f64,
}

/// Totals of a [`GraphView`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ViewStats {
    pub tools: i64,
    pub aliases: i64,
    pub edges: i64,
    pub calls: i64,
}

/// The whole graph for a page (`GET /graph.json`; `schemas/graph.schema.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GraphView {
    pub format: u32,
    /// The registry's generation: changes whenever its tool list does.
    pub generation: i64,
    pub source: GraphSource,
    pub stats: ViewStats,
    /// Tools, then aliases, each in name order.
    pub nodes: Vec<ViewNode>,
    pub edges: Vec<ViewEdge>,
}

/// Calls, successes and failures of a tool, failures by error kind, and rewards.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ViewToolStats {
    pub calls: i64,
    pub successes: i64,
    /// Calls the tool failed (see [`ViewNode::failures`]).
    pub failures: i64,
    /// Error kind (`timeout`, `invalid_args`, ...) to count, the caller's kinds included.
    pub failures_by_kind: BTreeMap<String, i64>,
    pub reward_mean: Option<f64>,
    pub reward_count: i64,
}

/// The episode whose tool was admitted (SEARL's registration step).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolOrigin {
    pub run: String,
    pub iteration: i64,
    /// The task the episode solved.
    pub task: String,
    /// The episode's reward.
    pub reward: f64,
}

/// One tool in full (`GET /graph/tools/{name}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolView {
    pub name: String,
    pub kind: NodeKind,
    pub version: String,
    pub description: String,
    pub input_schema: Value,
    pub output_schema: Value,
    /// The source of a Python tool.
    pub code: Option<String>,
    pub provenance: Provenance,
    /// The episode it came from, when training or a recorded evaluation admitted it.
    pub origin: Option<ToolOrigin>,
    /// Names merged into this tool.
    pub aliases: Vec<String>,
    pub created_at: i64,
    pub last_used_at: Option<i64>,
    pub stats: ViewToolStats,
    /// Edges in: tools whose results fed this one.
    pub dependencies: Vec<Neighbour>,
    /// Edges out: tools this one fed.
    pub dependents: Vec<Neighbour>,
}

/// What changes when the graph does: a watcher compares two of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Activity {
    /// Tool list changes (added, updated, merged, removed).
    pub generation: i64,
    /// Calls recorded and plan edges added or strengthened.
    pub activity: i64,
}

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
    pub fn view_stats(&self) -> Result<ViewStats, RegistryError> {
        view_stats(&self.conn)
    }
}

impl Registry {
    /// The whole graph, as a page shows it.
    pub fn graph_view(&self) -> Result<GraphView, RegistryError> {
        graph_view(&self.conn)
    }

    /// One tool (or alias, resolved to its tool) in full.
    pub fn tool_view(&self, name: &str) -> Result<ToolView, RegistryError> {
        tool_view(&self.conn, name)
    }

    /// The totals of [`Registry::graph_view`] without reading every row out.
    pub fn view_stats(&self) -> Result<ViewStats, RegistryError> {
        view_stats(&self.conn)
    }

    /// Counters that move when tools, calls or edges change (one read).
    pub fn activity(&self) -> Result<Activity, RegistryError> {
        let mut stmt = self.conn.prepare_cached("SELECT name, value FROM counters")?;
        let mut activity = Activity::default();
        for row in stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))? {
            let (name, value) = row?;
            match name.as_str() {
                "generation" => activity.generation = value,
                "activity" => activity.activity = value,
                _ => {}
            }
        }
        Ok(activity)
    }
}

fn has_table(conn: &Connection, name: &str) -> Result<bool, RegistryError> {
    Ok(conn
        .query_row("SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?1", [name], |_| Ok(()))
        .optional()?
        .is_some())
}

fn view_stats(conn: &Connection) -> Result<ViewStats, RegistryError> {
    Ok(conn.query_row(
        "SELECT (SELECT count(*) FROM tools), (SELECT count(*) FROM aliases), (SELECT count(*) FROM edges), \
         (SELECT coalesce(sum(usage_count), 0) FROM tools)",
        [],
        |r| Ok(ViewStats { tools: r.get(0)?, aliases: r.get(1)?, edges: r.get(2)?, calls: r.get(3)? }),
    )?)
}

fn graph_view(conn: &Connection) -> Result<GraphView, RegistryError> {
    // One pass over the tools table; descriptions come from the column, so no manifest is parsed
    // (a 10,000-tool registry reads in milliseconds).
    let mut names: BTreeMap<i64, String> = BTreeMap::new();
    let mut nodes = Vec::new();
    {
        let mut stmt = conn.prepare(
            "SELECT id, name, version, kind, description, usage_count, failure_count, reward_sum, reward_count, \
             created_at, last_used_at FROM tools ORDER BY name",
        )?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            let id: i64 = r.get(0)?;
            let name: String = r.get(1)?;
            let kind: String = r.get(3)?;
            let reward_sum: f64 = r.get(7)?;
            let reward_count: i64 = r.get(8)?;
            names.insert(id, name.clone());
            nodes.push(ViewNode {
                name,
                kind: parse_kind(&kind).into(),
                version: r.get(2)?,
                description: r.get(4)?,
                calls: r.get(5)?,
                failures: r.get(6)?,
                reward_mean: (reward_count > 0).then(|| reward_sum / reward_count as f64),
                canonical: None,
                created_at: r.get(9)?,
                last_used_at: r.get(10)?,
            });
        }
    }
    let tools = nodes.len() as i64;
    let calls = nodes.iter().map(|n| n.calls).sum();
    let mut edges = Vec::new();
    {
        let mut stmt = conn.prepare("SELECT src, dst, count, weight FROM edges")?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            let (src, dst): (i64, i64) = (r.get(0)?, r.get(1)?);
            if let (Some(src), Some(dst)) = (names.get(&src), names.get(&dst)) {
                edges.push(ViewEdge {
                    src: src.clone(),
                    dst: dst.clone(),
                    kind: EdgeKind::Plan,
                    count: r.get(2)?,
                    weight: r.get(3)?,
                });
            }
        }
    }
    let plan_edges = edges.len() as i64;
    let mut aliases = 0;
    {
        let mut stmt = conn.prepare(
            "SELECT a.alias, t.name, t.created_at FROM aliases a JOIN tools t ON t.id = a.canonical ORDER BY a.alias",
        )?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            let (alias, canonical): (String, String) = (r.get(0)?, r.get(1)?);
            aliases += 1;
            edges.push(ViewEdge {
                src: alias.clone(),
                dst: canonical.clone(),
                kind: EdgeKind::Alias,
                count: 0,
                weight: 0.0,
            });
            nodes.push(ViewNode {
                name: alias,
                kind: NodeKind::Alias,
                version: String::new(),
                description: format!("merged into {canonical}"),
                calls: 0,
                failures: 0,
                reward_mean: None,
                canonical: Some(canonical),
                created_at: r.get(2)?,
                last_used_at: None,
            });
        }
    }
    edges.sort_by(|a, b| (a.kind as u8, &a.src, &a.dst).cmp(&(b.kind as u8, &b.src, &b.dst)));
    Ok(GraphView {
        format: GRAPH_FORMAT,
        generation: crate::index::generation(conn)?,
        source: GraphSource::Live,
        stats: ViewStats { tools, aliases, edges: plan_edges, calls },
        nodes,
        edges,
    })
}

fn tool_view(conn: &Connection, name: &str) -> Result<ToolView, RegistryError> {
    let (id, _) = crate::store::resolve(conn, name)?.ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
    #[allow(clippy::type_complexity)]
    let (manifest, blob_hash, calls, successes, failures, reward_sum, reward_count, created_at, last_used_at): (
        String,
        Option<String>,
        i64,
        i64,
        i64,
        f64,
        i64,
        i64,
        Option<i64>,
    ) = conn.query_row(
        "SELECT manifest, blob_hash, usage_count, success_count, failure_count, reward_sum, reward_count, \
         created_at, last_used_at FROM tools WHERE id = ?1",
        [id],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?, r.get(8)?)),
    )?;
    let manifest: Manifest = serde_json::from_str(&manifest)
        .map_err(|e| RegistryError::Invalid(format!("the stored manifest of `{name}` is unreadable: {e}")))?;
    let code = match (&manifest.kind, blob_hash) {
        (ToolKind::Python, Some(hash)) => {
            let bytes: Option<Vec<u8>> =
                conn.query_row("SELECT bytes FROM blobs WHERE hash = ?1", [hash], |r| r.get(0)).optional()?;
            bytes.and_then(|b| python_code(&b))
        }
        _ => None,
    };
    let mut failures_by_kind = BTreeMap::new();
    if has_table(conn, "failures")? {
        let mut stmt = conn.prepare("SELECT kind, count FROM failures WHERE tool = ?1 ORDER BY kind")?;
        for row in stmt.query_map([id], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))? {
            let (kind, count) = row?;
            failures_by_kind.insert(kind, count);
        }
    }
    let origin = conn
        .query_row(
            "SELECT run, iteration, task, reward FROM candidates \
             WHERE status = 'admitted' AND json_extract(manifest, '$.name') = ?1 ORDER BY id DESC LIMIT 1",
            [manifest.name.as_str()],
            |r| Ok(ToolOrigin { run: r.get(0)?, iteration: r.get(1)?, task: r.get(2)?, reward: r.get(3)? }),
        )
        .optional()?;
    let aliases = crate::store::aliases_of(conn, id)?;
    let (dependencies, dependents) = crate::store::neighbours(conn, id)?;
    Ok(ToolView {
        name: manifest.name.to_string(),
        kind: manifest.kind.into(),
        version: manifest.version.clone(),
        description: manifest.description.clone(),
        input_schema: manifest.input_schema.clone(),
        output_schema: manifest.output_schema.clone(),
        code,
        provenance: manifest.provenance.clone(),
        origin,
        aliases,
        created_at,
        last_used_at,
        stats: ViewToolStats {
            calls,
            successes,
            failures,
            failures_by_kind,
            reward_mean: (reward_count > 0).then(|| reward_sum / reward_count as f64),
            reward_count,
        },
        dependencies,
        dependents,
    })
}

/// The source inside a stored Python tool (`{"code": ..., "positional": ...}`).
fn python_code(blob: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(blob).ok()?;
    value.get("code")?.as_str().map(str::to_string)
}
