//! The registry proper: tools, blobs, edges, aliases, candidates and their statistics.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};
use serde::{Deserialize, Serialize};
use toolsmith_contract::{Manifest, ToolKind};

use crate::embed::{self, Embedder, cosine, to_bytes};
use crate::index::{Bm25, Dense};
use crate::{RegistryError, db};

/// Tunable behaviour of retrieval and merging.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Weight of the normalised BM25 score in the fusion; `1 - alpha` goes to the dense score.
    /// 0.3 measured best on the labelled set (0.2-0.4 all beat either retriever alone).
    pub alpha: f32,
    /// How many hits each retriever contributes to the candidate set that scores are normalised
    /// over.
    pub candidates: usize,
    /// A neighbour reached by graph expansion scores `graph_weight * parent score * relative edge
    /// weight`.
    pub graph_weight: f32,
    /// At most this many neighbours per retrieved tool.
    pub neighbours: usize,
    /// Weight of the usage/reward prior in the final score (0 disables it).
    pub prior_weight: f32,
    /// A tool registered within this cosine of an existing one merges into it (SEARL's delta).
    /// Chosen from the bundled tools and the labelled set: see docs/architecture.md.
    pub merge_threshold: f32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            alpha: 0.3,
            candidates: 50,
            graph_weight: 0.5,
            neighbours: 3,
            prior_weight: 0.0,
            merge_threshold: 0.92,
        }
    }
}

/// How to open a registry.
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    pub settings: Settings,
    /// A loaded embedder to share; otherwise one is loaded on first use.
    pub embedder: Option<Arc<Embedder>>,
}

/// A tool to register: its manifest and, for plugins and Python tools, the component bytes or
/// source it runs from.
#[derive(Debug, Clone)]
pub struct NewTool {
    pub manifest: Manifest,
    pub blob: Option<Vec<u8>>,
}

impl NewTool {
    pub fn new(manifest: Manifest) -> NewTool {
        NewTool { manifest, blob: None }
    }

    pub fn with_blob(mut self, blob: Vec<u8>) -> NewTool {
        self.blob = Some(blob);
        self
    }
}

/// What registering a tool did.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Registered {
    /// A new node.
    Added { name: String },
    /// An existing tool of this name got a new manifest; its statistics and edges are kept.
    Updated { name: String },
    /// Already present exactly as given.
    Unchanged { name: String },
    /// A near-duplicate of `into`: recorded as an alias of it.
    Merged { name: String, into: String, similarity: f32 },
}

impl Registered {
    /// The name the tool is known by now.
    pub fn canonical(&self) -> &str {
        match self {
            Registered::Added { name } | Registered::Updated { name } | Registered::Unchanged { name } => name,
            Registered::Merged { into, .. } => into,
        }
    }
}

/// Usage and reward statistics of a tool.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolStats {
    /// Every call, whoever failed.
    pub usage_count: i64,
    pub success_count: i64,
    /// Calls the tool failed (`tool_error`, `trap`, `timeout`, ...). The caller's mistakes
    /// (`invalid_args`, `not_found`, `busy`) are the rest of `usage_count`.
    pub failure_count: i64,
    pub reward_sum: f64,
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

    pub fn mean_reward(&self) -> Option<f64> {
        (self.reward_count > 0).then(|| self.reward_sum / self.reward_count as f64)
    }
}

/// A stored tool.
#[derive(Debug, Clone, Serialize)]
pub struct ToolRecord {
    pub id: i64,
    pub name: String,
    pub version: String,
    pub kind: ToolKind,
    pub description: String,
    pub manifest: Manifest,
    pub blob_hash: Option<String>,
    pub stats: ToolStats,
    pub mean_reward: Option<f64>,
    /// Unix milliseconds.
    pub created_at: i64,
    pub last_used_at: Option<i64>,
    pub has_embedding: bool,
}

/// An edge seen from one end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Neighbour {
    pub name: String,
    pub count: i64,
    pub weight: f64,
}

/// A tool with its surroundings, for `toolsmith tools show`.
#[derive(Debug, Clone, Serialize)]
pub struct ToolDetails {
    pub tool: ToolRecord,
    /// Names merged into this tool.
    pub aliases: Vec<String>,
    /// Tools this one feeds (edges out).
    pub dependents: Vec<Neighbour>,
    /// Tools that feed this one (edges in).
    pub dependencies: Vec<Neighbour>,
}

/// One step of a plan: a call of `tool` that needs the results of the steps in `depends_on`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanStep {
    pub id: String,
    pub tool: String,
    #[serde(default)]
    pub depends_on: Vec<String>,
}

/// What [`Registry::record_plan`] did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RecordedPlan {
    /// Tool-level edges strengthened, as (from, to) canonical names.
    pub edges: Vec<(String, String)>,
    /// Tools the plan used that the registry does not know.
    pub unknown: Vec<String>,
}

/// One call of a tool, for its usage statistics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallUsage {
    /// The tool (or an alias of it).
    pub tool: String,
    /// The error kind (`timeout`, `invalid_args`, ...) when the call failed.
    pub failure: Option<String>,
    /// The reward of the episode the call was part of, counted once per episode and tool.
    pub reward: Option<f64>,
}

impl CallUsage {
    /// A call of `tool` that succeeded, or failed with `failure`.
    pub fn new(tool: impl Into<String>, failure: Option<&str>) -> CallUsage {
        CallUsage { tool: tool.into(), failure: failure.map(str::to_string), reward: None }
    }

    /// With the reward of its episode.
    pub fn with_reward(mut self, reward: Option<f64>) -> CallUsage {
        self.reward = reward;
        self
    }
}

/// What [`Registry::record_calls`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RecordedCalls {
    /// Calls counted.
    pub recorded: usize,
    /// Calls of tools the registry does not know, skipped.
    pub unknown: usize,
}

/// A tool created during an iteration, waiting for [`Registry::register_best`].
#[derive(Debug, Clone)]
pub struct Candidate {
    pub run: String,
    pub iteration: i64,
    pub task: String,
    pub trajectory: String,
    pub reward: f64,
    pub tool: NewTool,
}

/// A candidate admitted by [`Registry::register_best`].
#[derive(Debug, Clone, Serialize)]
pub struct Admitted {
    pub task: String,
    pub trajectory: String,
    pub reward: f64,
    pub outcome: Registered,
}

/// A candidate and what became of it: `pending`, `admitted` or `rejected`.
#[derive(Debug, Clone, Serialize)]
pub struct CandidateStatus {
    pub task: String,
    pub trajectory: String,
    pub reward: f64,
    pub tool: String,
    pub status: String,
}

/// Orders for [`Registry::list`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortBy {
    #[default]
    Name,
    Usage,
    Reward,
    Recency,
}

/// A node of an exported graph.
#[derive(Debug, Clone, Serialize)]
pub struct GraphNode {
    pub name: String,
    pub kind: ToolKind,
    pub usage_count: i64,
}

/// An edge of an exported graph.
#[derive(Debug, Clone, Serialize)]
pub struct GraphEdge {
    pub src: String,
    pub dst: String,
    pub count: i64,
    pub weight: f64,
}

/// A subgraph, for `toolsmith tools graph`.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Graph {
    pub nodes: Vec<GraphNode>,
    pub edges: Vec<GraphEdge>,
}

/// Counts for `toolsmith tools stats`.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    pub path: PathBuf,
    pub schema_version: i64,
    pub tools: i64,
    pub tools_by_kind: BTreeMap<String, i64>,
    pub edges: i64,
    pub aliases: i64,
    pub blobs: i64,
    pub blob_bytes: i64,
    pub candidates_pending: i64,
    pub total_calls: i64,
    pub database_bytes: u64,
}

/// What `toolsmith tools doctor` found; `problems` empty means healthy.
#[derive(Debug, Clone, Serialize, Default)]
pub struct DoctorReport {
    pub checks: Vec<String>,
    pub problems: Vec<String>,
}

/// The tool graph. Not `Sync`: open one per thread (WAL lets them all read while one writes).
pub struct Registry {
    pub(crate) conn: Connection,
    path: PathBuf,
    pub(crate) settings: Settings,
    embedder: Option<Arc<Embedder>>,
    pub(crate) bm25: Option<Bm25>,
    pub(crate) dense: Dense,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("path", &self.path).finish_non_exhaustive()
    }
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

const TOOL_COLUMNS: &str = "id, name, version, kind, description, manifest, blob_hash, usage_count, success_count, \
     failure_count, reward_sum, reward_count, created_at, last_used_at, embedding IS NOT NULL";

fn tool_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<ToolRecord> {
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

pub(crate) fn blob_hash(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

pub(crate) fn put_blob(tx: &Connection, bytes: &[u8]) -> rusqlite::Result<String> {
    let hash = blob_hash(bytes);
    tx.execute("INSERT OR IGNORE INTO blobs (hash, bytes) VALUES (?1, ?2)", params![hash, bytes])?;
    Ok(hash)
}

pub(crate) fn manifest_json(m: &Manifest) -> String {
    serde_json::to_string(m).unwrap_or_default()
}

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

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The BM25 index directory: `registry.db` -> `registry.db.index/`.
    pub fn index_dir(&self) -> PathBuf {
        let mut name = self.path.as_os_str().to_owned();
        name.push(".index");
        PathBuf::from(name)
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

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

    pub fn is_empty(&self) -> Result<bool, RegistryError> {
        Ok(self.len()? == 0)
    }

    /// A value of the registry's key-value metadata.
    pub fn meta(&self, key: &str) -> Result<Option<String>, RegistryError> {
        Ok(self.conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0)).optional()?)
    }

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

    /// Registers one tool, merging it into a near-duplicate when `merge` is set.
    pub fn register(&mut self, tool: NewTool, merge: bool) -> Result<Registered, RegistryError> {
        Ok(self.register_many(vec![tool], merge)?.remove(0))
    }

    /// Registers tools in one transaction with one batched embedding call.
    pub fn register_many(&mut self, tools: Vec<NewTool>, merge: bool) -> Result<Vec<Registered>, RegistryError> {
        // Checked before the (costly) embedding; `register_checked` does not check again.
        check_all(&tools)?;
        let embedder = self.embedder()?;
        let texts: Vec<String> =
            tools.iter().map(|t| embed::tool_text(t.manifest.name.as_str(), &t.manifest.description)).collect();
        let vectors = embedder.embed(&texts)?;
        self.register_checked(tools, vectors, merge)
    }

    /// [`Registry::register_many`] with the embeddings already computed (one unit vector of
    /// [`embed::DIM`] per tool, of [`embed::tool_text`]), e.g. for bulk loads.
    pub fn register_many_embedded(
        &mut self,
        tools: Vec<NewTool>,
        vectors: Vec<Vec<f32>>,
        merge: bool,
    ) -> Result<Vec<Registered>, RegistryError> {
        check_all(&tools)?;
        self.register_checked(tools, vectors, merge)
    }

    fn register_checked(
        &mut self,
        tools: Vec<NewTool>,
        vectors: Vec<Vec<f32>>,
        merge: bool,
    ) -> Result<Vec<Registered>, RegistryError> {
        if vectors.len() != tools.len() || vectors.iter().any(|v| v.len() != embed::DIM) {
            return Err(RegistryError::Invalid(format!("need one {}-d vector per tool", embed::DIM)));
        }
        self.dense.sync(&self.conn)?;
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut out = Vec::with_capacity(tools.len());
        // Tools added earlier in this batch take part in merging later ones.
        let mut added: Vec<(i64, Vec<f32>)> = Vec::new();
        for (tool, vector) in tools.into_iter().zip(vectors) {
            let outcome =
                register_one(&tx, &self.dense, &added, tool, &vector, merge.then_some(self.settings.merge_threshold))?;
            if let Registered::Added { name } | Registered::Updated { name } = &outcome {
                let id: i64 = tx.query_row("SELECT id FROM tools WHERE name = ?1", [name], |r| r.get(0))?;
                added.push((id, vector));
            }
            out.push(outcome);
        }
        tx.commit()?;
        Ok(out)
    }

    /// The name each of `tools` (name, description) would be kept under if they were registered
    /// now, in order, with merging; nothing is written. That is its own name (a new tool, or one
    /// the registry holds), the tool it is an alias of, or the most similar tool, held or earlier
    /// in `tools`, at or above the merge threshold. SEARL anchors its step credit on these names,
    /// so near-duplicate tools that different rollouts wrote share one step group.
    pub fn merged_names(&mut self, tools: &[(&str, &str)]) -> Result<Vec<String>, RegistryError> {
        if tools.is_empty() {
            return Ok(Vec::new());
        }
        let texts: Vec<String> = tools.iter().map(|(name, description)| embed::tool_text(name, description)).collect();
        let vectors = self.embedder()?.embed(&texts)?;
        self.dense.sync(&self.conn)?;
        let threshold = self.settings.merge_threshold;
        // The new names so far, with their vectors, as a batch's earlier tools take part in
        // merging its later ones.
        let mut fresh: Vec<(String, Vec<f32>)> = Vec::new();
        let mut out = Vec::with_capacity(tools.len());
        for (&(name, _), vector) in tools.iter().zip(vectors) {
            if let Some(known) = self.resolve(name)? {
                out.push(known);
                continue;
            }
            if fresh.iter().any(|(n, _)| n == name) {
                out.push(name.to_string());
                continue;
            }
            // The same choice as `register_one`'s, among held tools and this batch's earlier ones.
            enum Target<'a> {
                Held(i64),
                Earlier(&'a str),
            }
            let held = self.dense.nearest(&vector).map(|(id, s)| (Target::Held(id), s));
            let earlier = fresh.iter().map(|(n, v)| (Target::Earlier(n), cosine(v, &vector)));
            match closest(held.into_iter().chain(earlier), threshold) {
                Some((Target::Earlier(into), _)) => out.push(into.to_string()),
                Some((Target::Held(id), _)) => {
                    out.push(self.conn.query_row("SELECT name FROM tools WHERE id = ?1", [id], |r| r.get(0))?)
                }
                None => {
                    out.push(name.to_string());
                    fresh.push((name.to_string(), vector));
                }
            }
        }
        Ok(out)
    }

    /// Merges `other` into `canonical`: every edge of `other` is redirected to `canonical` (counts
    /// and weights add up where both had the edge; edges between the two would be self-loops and
    /// are dropped), statistics add up, aliases follow, and `other` becomes an alias.
    pub fn merge(&mut self, canonical: &str, other: &str) -> Result<(), RegistryError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let (keep, keep_name) =
            resolve(&tx, canonical)?.ok_or_else(|| RegistryError::NotFound(canonical.to_string()))?;
        let (gone, gone_name) = resolve(&tx, other)?.ok_or_else(|| RegistryError::NotFound(other.to_string()))?;
        if keep == gone {
            return Err(RegistryError::Invalid(format!("`{other}` is already `{keep_name}`")));
        }
        merge_into(&tx, keep, gone, &gone_name)?;
        tx.commit()?;
        tracing::info!(canonical = %keep_name, merged = %gone_name, "merged tools");
        Ok(())
    }

    /// Removes a tool, its edges and the aliases that point to it.
    pub fn remove(&mut self, name: &str) -> Result<(), RegistryError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let (id, _) = resolve(&tx, name)?.ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
        tx.execute("DELETE FROM tools WHERE id = ?1", [id])?;
        collect_blobs(&tx)?;
        tx.commit()?;
        Ok(())
    }

    /// Adds the tool-level projection of a plan's dependency graph: for every step and each step
    /// it depends on, the edge (dependency's tool -> step's tool) gains `weight` once per plan.
    pub fn record_plan(&mut self, steps: &[PlanStep], weight: f64) -> Result<RecordedPlan, RegistryError> {
        if !weight.is_finite() || weight < 0.0 {
            return Err(RegistryError::Invalid(format!("plan weight must be finite and >= 0, got {weight}")));
        }
        let by_id: HashMap<&str, &PlanStep> = steps.iter().map(|s| (s.id.as_str(), s)).collect();
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut recorded = RecordedPlan::default();
        let mut unknown = BTreeSet::new();
        let mut pairs = BTreeSet::new();
        let mut lookup = |tool: &str| -> Result<Option<(i64, String)>, RegistryError> {
            let r = resolve(&tx, tool)?;
            if r.is_none() {
                unknown.insert(tool.to_string());
            }
            Ok(r)
        };
        for step in steps {
            let Some(to) = lookup(&step.tool)? else { continue };
            for dep in &step.depends_on {
                let from_step = by_id.get(dep.as_str()).ok_or_else(|| {
                    RegistryError::Invalid(format!("step `{}` depends on unknown step `{dep}`", step.id))
                })?;
                let Some(from) = lookup(&from_step.tool)? else { continue };
                if from.0 != to.0 {
                    pairs.insert((from, to.clone()));
                }
            }
        }
        for ((src, src_name), (dst, dst_name)) in pairs {
            add_edge(&tx, src, dst, 1, weight)?;
            recorded.edges.push((src_name, dst_name));
        }
        tx.commit()?;
        recorded.edges.sort();
        recorded.unknown = unknown.into_iter().collect();
        Ok(recorded)
    }

    /// Counts a call of `name` and, if given, the reward of the trajectory it was part of.
    pub fn record_call(&mut self, name: &str, success: bool, reward: Option<f64>) -> Result<(), RegistryError> {
        if resolve(&self.conn, name)?.is_none() {
            return Err(RegistryError::NotFound(name.to_string()));
        }
        let failure = (!success).then(|| "failed".to_string());
        self.record_calls(&[CallUsage { tool: name.to_string(), failure, reward }])?;
        Ok(())
    }

    /// Counts many calls in one transaction (see [`crate::UsageLog`] for a batching writer).
    /// Calls of tools the registry does not know (a typo, a tool created but not admitted) are
    /// not its statistics: they are skipped and counted in the result.
    pub fn record_calls(&mut self, calls: &[CallUsage]) -> Result<RecordedCalls, RegistryError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let recorded = record_calls(&tx, calls)?;
        tx.commit()?;
        Ok(recorded)
    }

    /// Puts a tool created during an iteration into the candidate pool.
    pub fn add_candidate(&mut self, c: &Candidate) -> Result<i64, RegistryError> {
        check_new(&c.tool.manifest)?;
        if !c.reward.is_finite() {
            return Err(RegistryError::Invalid(format!("candidate reward must be finite, got {}", c.reward)));
        }
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let hash = c.tool.blob.as_deref().map(|b| put_blob(&tx, b)).transpose()?;
        tx.execute(
            "INSERT INTO candidates (run, iteration, task, trajectory, reward, manifest, blob_hash, created_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                c.run,
                c.iteration,
                c.task,
                c.trajectory,
                c.reward,
                manifest_json(&c.tool.manifest),
                hash,
                now_ms()
            ],
        )?;
        let id = tx.last_insert_rowid();
        tx.commit()?;
        Ok(id)
    }

    /// SEARL E.1: for each task of the iteration, admits only the tools of its highest-reward
    /// trajectory (ties go to the earliest), merging near-duplicates; the rest are rejected.
    pub fn register_best(&mut self, run: &str, iteration: i64) -> Result<Vec<Admitted>, RegistryError> {
        let rows: Vec<(i64, String, String, f64, String, Option<String>)> = {
            let mut stmt = self.conn.prepare(
                "SELECT id, task, trajectory, reward, manifest, blob_hash FROM candidates \
                 WHERE run = ?1 AND iteration = ?2 AND status = 'pending' ORDER BY id",
            )?;
            stmt.query_map(params![run, iteration], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?))
            })?
            .collect::<rusqlite::Result<_>>()?
        };
        // Best trajectory per task: the first to reach the maximum reward.
        let mut best: BTreeMap<&str, (&str, f64)> = BTreeMap::new();
        for (_, task, trajectory, reward, _, _) in &rows {
            match best.get(task.as_str()) {
                Some((_, r)) if *r >= *reward => {}
                _ => {
                    best.insert(task, (trajectory, *reward));
                }
            }
        }
        let mut admit = Vec::new();
        let mut admitted_ids = Vec::new();
        for (id, task, trajectory, reward, manifest, hash) in &rows {
            if best.get(task.as_str()).is_some_and(|(t, _)| t == trajectory) {
                let manifest: Manifest = serde_json::from_str(manifest)
                    .map_err(|e| RegistryError::Invalid(format!("candidate {id}: stored manifest unreadable: {e}")))?;
                let blob = match hash {
                    Some(h) => Some(self.conn.query_row("SELECT bytes FROM blobs WHERE hash = ?1", [h], |r| r.get(0))?),
                    None => None,
                };
                admit.push((task.clone(), trajectory.clone(), *reward, NewTool { manifest, blob }));
                admitted_ids.push(*id);
            }
        }
        let outcomes = self.register_many(admit.iter().map(|a| a.3.clone()).collect(), true)?;
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute(
            "UPDATE candidates SET status = 'rejected' WHERE run = ?1 AND iteration = ?2 AND status = 'pending'",
            params![run, iteration],
        )?;
        for id in admitted_ids {
            tx.execute("UPDATE candidates SET status = 'admitted' WHERE id = ?1", [id])?;
        }
        tx.commit()?;
        Ok(admit
            .into_iter()
            .zip(outcomes)
            .map(|((task, trajectory, reward, _), outcome)| Admitted { task, trajectory, reward, outcome })
            .collect())
    }

    /// Candidates of an iteration with their status, for inspection.
    pub fn candidates(&self, run: &str, iteration: i64) -> Result<Vec<CandidateStatus>, RegistryError> {
        let mut stmt = self.conn.prepare(
            "SELECT task, trajectory, reward, json_extract(manifest, '$.name'), status FROM candidates \
             WHERE run = ?1 AND iteration = ?2 ORDER BY id",
        )?;
        let rows = stmt
            .query_map(params![run, iteration], |r| {
                Ok(CandidateStatus {
                    task: r.get(0)?,
                    trajectory: r.get(1)?,
                    reward: r.get(2)?,
                    tool: r.get(3)?,
                    status: r.get(4)?,
                })
            })?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    /// A tool by name or alias.
    pub fn get(&self, name: &str) -> Result<ToolRecord, RegistryError> {
        let (id, _) = resolve(&self.conn, name)?.ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
        self.get_by_id(id)
    }

    pub(crate) fn get_by_id(&self, id: i64) -> Result<ToolRecord, RegistryError> {
        Ok(self.conn.query_row(&format!("SELECT {TOOL_COLUMNS} FROM tools WHERE id = ?1"), [id], tool_from_row)?)
    }

    /// The bytes a tool runs from (component or source), if any.
    pub fn blob(&self, hash: &str) -> Result<Option<Vec<u8>>, RegistryError> {
        Ok(self.conn.query_row("SELECT bytes FROM blobs WHERE hash = ?1", [hash], |r| r.get(0)).optional()?)
    }

    /// Every tool, sorted.
    pub fn list(&self, sort: SortBy) -> Result<Vec<ToolRecord>, RegistryError> {
        let order = match sort {
            SortBy::Name => "name",
            SortBy::Usage => "usage_count DESC, name",
            SortBy::Reward => "CASE WHEN reward_count > 0 THEN reward_sum / reward_count END DESC NULLS LAST, name",
            SortBy::Recency => "coalesce(last_used_at, created_at) DESC, name",
        };
        let mut stmt = self.conn.prepare(&format!("SELECT {TOOL_COLUMNS} FROM tools ORDER BY {order}"))?;
        let rows = stmt.query_map([], tool_from_row)?.collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    /// A tool with its aliases and neighbours.
    pub fn show(&self, name: &str) -> Result<ToolDetails, RegistryError> {
        let tool = self.get(name)?;
        let aliases = aliases_of(&self.conn, tool.id)?;
        let (dependencies, dependents) = neighbours(&self.conn, tool.id)?;
        Ok(ToolDetails { tool, aliases, dependents, dependencies })
    }

    /// The whole graph, or the tools within `depth` hops (either direction) of `around`.
    pub fn graph(&self, around: Option<&str>, depth: usize) -> Result<Graph, RegistryError> {
        let mut all_edges: Vec<(i64, i64, i64, f64)> = {
            let mut stmt = self.conn.prepare("SELECT src, dst, count, weight FROM edges ORDER BY src, dst")?;
            stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                .collect::<rusqlite::Result<_>>()?
        };
        let nodes: BTreeMap<i64, GraphNode> = {
            let mut stmt = self.conn.prepare("SELECT id, name, kind, usage_count FROM tools")?;
            stmt.query_map([], |r| {
                let kind: String = r.get(2)?;
                Ok((r.get(0)?, GraphNode { name: r.get(1)?, kind: parse_kind(&kind), usage_count: r.get(3)? }))
            })?
            .collect::<rusqlite::Result<_>>()?
        };
        let keep: BTreeSet<i64> = match around {
            None => nodes.keys().copied().collect(),
            Some(name) => {
                let (start, _) = resolve(&self.conn, name)?.ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
                let mut seen = BTreeSet::from([start]);
                let mut frontier = vec![start];
                for _ in 0..depth {
                    let mut next = Vec::new();
                    for &(s, d, _, _) in &all_edges {
                        for (a, b) in [(s, d), (d, s)] {
                            if frontier.contains(&a) && seen.insert(b) {
                                next.push(b);
                            }
                        }
                    }
                    frontier = next;
                }
                seen
            }
        };
        all_edges.retain(|(s, d, _, _)| keep.contains(s) && keep.contains(d));
        let name = |id: i64| nodes.get(&id).map(|n| n.name.clone()).unwrap_or_default();
        let mut graph = Graph {
            nodes: keep.iter().filter_map(|id| nodes.get(id).cloned()).collect(),
            edges: all_edges
                .into_iter()
                .map(|(s, d, count, weight)| GraphEdge { src: name(s), dst: name(d), count, weight })
                .collect(),
        };
        graph.nodes.sort_by(|a, b| a.name.cmp(&b.name));
        graph.edges.sort_by(|a, b| (&a.src, &a.dst).cmp(&(&b.src, &b.dst)));
        Ok(graph)
    }

    /// Counts.
    pub fn stats(&self) -> Result<Stats, RegistryError> {
        let count = |sql: &str| -> Result<i64, RegistryError> { Ok(self.conn.query_row(sql, [], |r| r.get(0))?) };
        let mut stmt = self.conn.prepare("SELECT kind, count(*) FROM tools GROUP BY kind ORDER BY kind")?;
        let tools_by_kind = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<rusqlite::Result<_>>()?;
        let database_bytes = std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0);
        Ok(Stats {
            path: self.path.clone(),
            schema_version: db::user_version(&self.conn)?,
            tools: count("SELECT count(*) FROM tools")?,
            tools_by_kind,
            edges: count("SELECT count(*) FROM edges")?,
            aliases: count("SELECT count(*) FROM aliases")?,
            blobs: count("SELECT count(*) FROM blobs")?,
            blob_bytes: count("SELECT coalesce(sum(length(bytes)), 0) FROM blobs")?,
            candidates_pending: count("SELECT count(*) FROM candidates WHERE status = 'pending'")?,
            total_calls: count("SELECT coalesce(sum(usage_count), 0) FROM tools")?,
            database_bytes,
        })
    }

    /// Embeds tools that lack an embedding (e.g. from an old registry or an import without
    /// vectors), then rebuilds the BM25 index from the database. Returns how many were embedded.
    pub fn reindex(&mut self) -> Result<usize, RegistryError> {
        let missing: Vec<(i64, String, String)> = {
            let mut stmt = self.conn.prepare(
                "SELECT id, name, description FROM tools WHERE embedding IS NULL OR length(embedding) != ?1",
            )?;
            stmt.query_map([embed::DIM * 4], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<rusqlite::Result<_>>()?
        };
        if !missing.is_empty() {
            let embedder = self.embedder()?;
            let texts: Vec<String> = missing.iter().map(|(_, n, d)| embed::tool_text(n, d)).collect();
            let vectors = embedder.embed(&texts)?;
            let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            for ((id, _, _), v) in missing.iter().zip(vectors) {
                tx.execute("UPDATE tools SET embedding = ?2 WHERE id = ?1", params![id, to_bytes(&v)])?;
            }
            tx.commit()?;
        }
        self.dense = Dense::default();
        self.dense.sync(&self.conn)?;
        let dir = self.index_dir();
        let mut bm25 = match self.bm25.take() {
            Some(b) => b,
            None => Bm25::open(&dir)?,
        };
        bm25.sync(&self.conn, true)?;
        self.bm25 = Some(bm25);
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

    /// Checks the database (`PRAGMA integrity_check`, foreign keys, stored manifests and vectors)
    /// and that the search index holds exactly the registry's tools.
    pub fn doctor(&mut self) -> Result<DoctorReport, RegistryError> {
        let mut report = DoctorReport::default();
        let integrity: Vec<String> = {
            let mut stmt = self.conn.prepare("PRAGMA integrity_check")?;
            stmt.query_map([], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?
        };
        if integrity != ["ok"] {
            report.problems.extend(integrity.into_iter().map(|l| format!("integrity_check: {l}")));
        }
        report.checks.push("SQLite integrity_check".into());
        let fk: i64 = self.conn.query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| r.get(0))?;
        if fk > 0 {
            report.problems.push(format!("{fk} rows break foreign keys"));
        }
        report.checks.push("foreign keys".into());
        let mut stmt = self.conn.prepare("SELECT name, manifest, embedding FROM tools")?;
        let mut rows = stmt.query([])?;
        let mut names = 0;
        while let Some(row) = rows.next()? {
            names += 1;
            let name: String = row.get(0)?;
            let manifest: String = row.get(1)?;
            if let Err(e) = Manifest::from_json(&manifest) {
                report.problems.push(format!("`{name}`: stored manifest is invalid: {e}"));
            }
            let embedding: Option<Vec<u8>> = row.get(2)?;
            if embedding.as_ref().is_none_or(|e| e.len() != embed::DIM * 4) {
                report
                    .problems
                    .push(format!("`{name}`: no {}-d embedding (run `toolsmith tools reindex`)", embed::DIM));
            }
        }
        drop(rows);
        drop(stmt);
        report.checks.push(format!("{names} manifests and embeddings"));
        let missing_blobs: i64 = self.conn.query_row(
            "SELECT count(*) FROM tools WHERE blob_hash IS NOT NULL AND blob_hash NOT IN (SELECT hash FROM blobs)",
            [],
            |r| r.get(0),
        )?;
        if missing_blobs > 0 {
            report.problems.push(format!("{missing_blobs} tools point to missing blobs"));
        }
        let mut stmt = self.conn.prepare("SELECT hash, bytes FROM blobs")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let hash: String = row.get(0)?;
            let bytes: Vec<u8> = row.get(1)?;
            if blob_hash(&bytes) != hash {
                report.problems.push(format!("blob {hash} does not match its content"));
            }
        }
        drop(rows);
        drop(stmt);
        report.checks.push("blob hashes".into());
        self.sync()?;
        if let Some(bm25) = &self.bm25 {
            let mut indexed = bm25.ids()?;
            indexed.sort_unstable();
            let mut stmt = self.conn.prepare("SELECT id FROM tools ORDER BY id")?;
            let ids: Vec<i64> = stmt.query_map([], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?;
            if indexed != ids {
                report.problems.push(format!(
                    "search index holds {} documents for {} tools (run `toolsmith tools reindex`)",
                    bm25.num_docs(),
                    ids.len()
                ));
            }
            report.checks.push("search index matches the tools".into());
        }
        Ok(report)
    }
}

/// (id, canonical name) of a tool or alias.
pub(crate) fn resolve(conn: &Connection, name: &str) -> Result<Option<(i64, String)>, RegistryError> {
    let direct = conn.query_row("SELECT id, name FROM tools WHERE name = ?1", [name], |r| Ok((r.get(0)?, r.get(1)?)));
    if let Some(hit) = direct.optional()? {
        return Ok(Some(hit));
    }
    Ok(conn
        .query_row(
            "SELECT t.id, t.name FROM aliases a JOIN tools t ON t.id = a.canonical WHERE a.alias = ?1",
            [name],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?)
}

pub(crate) fn add_edge(tx: &Connection, src: i64, dst: i64, count: i64, weight: f64) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT INTO edges (src, dst, count, weight) VALUES (?1, ?2, ?3, ?4) \
         ON CONFLICT (src, dst) DO UPDATE SET count = count + excluded.count, weight = weight + excluded.weight",
        params![src, dst, count, weight],
    )?;
    Ok(())
}

pub(crate) fn record_calls(tx: &Connection, calls: &[CallUsage]) -> Result<RecordedCalls, RegistryError> {
    let mut recorded = RecordedCalls::default();
    let now = now_ms();
    let mut ids: HashMap<&str, Option<i64>> = HashMap::new();
    let mut update = tx.prepare_cached(
        "UPDATE tools SET usage_count = usage_count + 1, success_count = success_count + ?2, \
         failure_count = failure_count + ?3, reward_sum = reward_sum + ?4, reward_count = reward_count + ?5, \
         last_used_at = ?6 WHERE id = ?1",
    )?;
    let mut failed = tx.prepare_cached(
        "INSERT INTO failures (tool, kind, count) VALUES (?1, ?2, 1) \
         ON CONFLICT (tool, kind) DO UPDATE SET count = count + 1",
    )?;
    for call in calls {
        let id = match ids.get(call.tool.as_str()) {
            Some(id) => *id,
            None => {
                let id = resolve(tx, &call.tool)?.map(|(id, _)| id);
                ids.insert(&call.tool, id);
                id
            }
        };
        let Some(id) = id else {
            recorded.unknown += 1;
            continue;
        };
        let reward = call.reward.filter(|r| r.is_finite());
        let failure = call.failure.as_deref();
        // A caller's mistake is kept by kind but is not the tool's failure.
        let callers = failure.and_then(toolsmith_contract::ErrorKind::parse).is_some_and(|k| k.is_callers());
        update.execute(params![
            id,
            failure.is_none() as i64,
            (failure.is_some() && !callers) as i64,
            reward.unwrap_or(0.0),
            reward.is_some() as i64,
            now
        ])?;
        if let Some(kind) = failure {
            failed.execute(params![id, kind])?;
        }
        recorded.recorded += 1;
    }
    Ok(recorded)
}

fn merge_into(tx: &Transaction<'_>, keep: i64, gone: i64, gone_name: &str) -> Result<(), RegistryError> {
    let edges: Vec<(i64, i64, i64, f64)> = {
        let mut stmt = tx.prepare("SELECT src, dst, count, weight FROM edges WHERE src = ?1 OR dst = ?1")?;
        stmt.query_map([gone], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
            .collect::<rusqlite::Result<_>>()?
    };
    for (src, dst, count, weight) in edges {
        let src = if src == gone { keep } else { src };
        let dst = if dst == gone { keep } else { dst };
        if src != dst {
            add_edge(tx, src, dst, count, weight)?;
        }
    }
    tx.execute(
        "UPDATE tools SET usage_count = tools.usage_count + g.usage_count, success_count = tools.success_count + g.success_count, \
         failure_count = tools.failure_count + g.failure_count, reward_sum = tools.reward_sum + g.reward_sum, \
         reward_count = tools.reward_count + g.reward_count, \
         last_used_at = nullif(max(coalesce(tools.last_used_at, 0), coalesce(g.last_used_at, 0)), 0) \
         FROM (SELECT * FROM tools WHERE id = ?2) AS g WHERE tools.id = ?1",
        params![keep, gone],
    )?;
    tx.execute(
        "INSERT INTO failures (tool, kind, count) SELECT ?1, kind, count FROM failures WHERE tool = ?2 \
         ON CONFLICT (tool, kind) DO UPDATE SET count = failures.count + excluded.count",
        params![keep, gone],
    )?;
    tx.execute("UPDATE aliases SET canonical = ?1 WHERE canonical = ?2", params![keep, gone])?;
    // Record the merge in the surviving tool's provenance.
    let manifest: String = tx.query_row("SELECT manifest FROM tools WHERE id = ?1", [keep], |r| r.get(0))?;
    if let Ok(mut m) = serde_json::from_str::<Manifest>(&manifest)
        && let Ok(parent) = toolsmith_contract::ToolName::new(gone_name)
        && !m.provenance.parents.contains(&parent)
    {
        m.provenance.parents.push(parent);
        tx.execute(
            "UPDATE tools SET manifest = ?2, parents = ?3 WHERE id = ?1",
            params![keep, manifest_json(&m), serde_json::to_string(&m.provenance.parents).unwrap_or_default()],
        )?;
    }
    tx.execute("DELETE FROM tools WHERE id = ?1", [gone])?;
    tx.execute("INSERT OR REPLACE INTO aliases (alias, canonical) VALUES (?1, ?2)", params![gone_name, keep])?;
    collect_blobs(tx)?;
    Ok(())
}

/// Names merged into tool `id`.
pub(crate) fn aliases_of(conn: &Connection, id: i64) -> Result<Vec<String>, RegistryError> {
    let mut stmt = conn.prepare("SELECT alias FROM aliases WHERE canonical = ?1 ORDER BY alias")?;
    Ok(stmt.query_map([id], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?)
}

/// Tool `id`'s edges: (in: the tools that feed it, out: the tools it feeds), heaviest first.
pub(crate) fn neighbours(conn: &Connection, id: i64) -> Result<(Vec<Neighbour>, Vec<Neighbour>), RegistryError> {
    let side = |sql: &str| -> Result<Vec<Neighbour>, RegistryError> {
        let mut stmt = conn.prepare(sql)?;
        let rows = stmt
            .query_map([id], |r| Ok(Neighbour { name: r.get(0)?, count: r.get(1)?, weight: r.get(2)? }))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    };
    Ok((
        side(
            "SELECT t.name, e.count, e.weight FROM edges e JOIN tools t ON t.id = e.src WHERE e.dst = ?1 \
             ORDER BY e.weight DESC, t.name",
        )?,
        side(
            "SELECT t.name, e.count, e.weight FROM edges e JOIN tools t ON t.id = e.dst WHERE e.src = ?1 \
             ORDER BY e.weight DESC, t.name",
        )?,
    ))
}

/// The `kind` column back as a [`ToolKind`] (its `Display` form; unknown text reads as the default).
pub(crate) fn parse_kind(text: &str) -> ToolKind {
    serde_json::from_value(serde_json::Value::String(text.to_string())).unwrap_or_default()
}

fn check_all(tools: &[NewTool]) -> Result<(), RegistryError> {
    tools.iter().try_for_each(|t| check_new(&t.manifest))
}

/// What a tool must be to enter the registry: a sound manifest under a name that is not reserved.
fn check_new(manifest: &toolsmith_contract::Manifest) -> Result<(), RegistryError> {
    manifest.check().map_err(|e| RegistryError::Invalid(format!("`{}`: {e}", manifest.name)))?;
    if toolsmith_contract::RESERVED_TOOL_NAMES.contains(&manifest.name.as_str()) {
        return Err(RegistryError::Invalid(format!(
            "`{}` is the name of a meta tool every server answers to; give the tool another name",
            manifest.name
        )));
    }
    Ok(())
}

/// Deletes blobs nothing refers to any more.
fn collect_blobs(tx: &Connection) -> rusqlite::Result<()> {
    tx.execute(
        "DELETE FROM blobs WHERE hash NOT IN (SELECT blob_hash FROM tools WHERE blob_hash IS NOT NULL) \
         AND hash NOT IN (SELECT blob_hash FROM candidates WHERE blob_hash IS NOT NULL)",
        [],
    )?;
    Ok(())
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

/// The most similar of `candidates` (held tools first, then a batch's earlier ones) at or above
/// `threshold`; of equals, the last.
fn closest<T>(candidates: impl Iterator<Item = (T, f32)>, threshold: f32) -> Option<(T, f32)> {
    candidates.filter(|(_, s)| *s >= threshold).max_by(|a, b| a.1.total_cmp(&b.1))
}

fn register_one(
    tx: &Transaction<'_>,
    dense: &Dense,
    batch: &[(i64, Vec<f32>)],
    tool: NewTool,
    vector: &[f32],
    merge_threshold: Option<f32>,
) -> Result<Registered, RegistryError> {
    let name = tool.manifest.name.as_str().to_string();
    let json = manifest_json(&tool.manifest);
    let hash = tool.blob.as_deref().map(|b| put_blob(tx, b)).transpose()?;
    let existing: Option<(String, Option<String>)> = tx
        .query_row("SELECT manifest, blob_hash FROM tools WHERE name = ?1", [&name], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    if let Some((old, old_hash)) = existing {
        if old == json && old_hash == hash {
            return Ok(Registered::Unchanged { name });
        }
        write_tool_row(tx, &tool.manifest, &json, hash.as_deref(), Some(&to_bytes(vector)))?;
        collect_blobs(tx)?;
        return Ok(Registered::Updated { name });
    }
    if let Some((canonical, _)) = resolve(tx, &name)? {
        let into: String = tx.query_row("SELECT name FROM tools WHERE id = ?1", [canonical], |r| r.get(0))?;
        let similarity = dense.vector(canonical).map(|v| cosine(v, vector)).unwrap_or(1.0);
        return Ok(Registered::Merged { name, into, similarity });
    }
    if let Some(threshold) = merge_threshold {
        let candidates = dense.nearest(vector).into_iter().chain(batch.iter().map(|(id, v)| (*id, cosine(v, vector))));
        if let Some((canonical, similarity)) = closest(candidates, threshold) {
            let into: String = tx.query_row("SELECT name FROM tools WHERE id = ?1", [canonical], |r| r.get(0))?;
            tx.execute("INSERT OR REPLACE INTO aliases (alias, canonical) VALUES (?1, ?2)", params![name, canonical])?;
            collect_blobs(tx)?;
            tracing::info!(tool = %name, into = %into, similarity, "merged a near-duplicate on registration");
            return Ok(Registered::Merged { name, into, similarity });
        }
    }
    write_tool_row(tx, &tool.manifest, &json, hash.as_deref(), Some(&to_bytes(vector)))?;
    Ok(Registered::Added { name })
}
