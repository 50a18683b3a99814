//! Export and import as JSON lines: one record per line, in a fixed order, so exporting an
//! imported export gives the same bytes. Embeddings and blobs travel as base64, exactly.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Write};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};
use toolsmith_contract::Manifest;

use crate::RegistryError;
use crate::embed::DIM;
use crate::store::{Registry, ToolStats, blob_hash, manifest_json, put_blob, write_tool_row};

/// Version of the line format.
const FORMAT: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum Line {
    Header {
        format: u32,
    },
    Meta {
        key: String,
        value: String,
    },
    Blob {
        hash: String,
        bytes: String,
    },
    Tool {
        manifest: serde_json::Value,
        blob_hash: Option<String>,
        embedding: Option<String>,
        stats: ToolStats,
        /// Failures by error kind (absent in exports from before it was kept).
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        failures: BTreeMap<String, i64>,
        created_at: i64,
        last_used_at: Option<i64>,
    },
    Edge {
        src: String,
        dst: String,
        count: i64,
        weight: f64,
    },
    Alias {
        alias: String,
        canonical: String,
    },
    Candidate {
        run: String,
        iteration: i64,
        task: String,
        trajectory: String,
        reward: f64,
        manifest: serde_json::Value,
        blob_hash: Option<String>,
        created_at: i64,
        status: String,
    },
}

/// A checked, decoded import line.
enum Record {
    Blob(Vec<u8>),
    Tool {
        manifest: Manifest,
        blob_hash: Option<String>,
        embedding: Option<Vec<u8>>,
        stats: ToolStats,
        failures: BTreeMap<String, i64>,
        created_at: i64,
        last_used_at: Option<i64>,
    },
    Candidate {
        manifest: Manifest,
        run: String,
        iteration: i64,
        task: String,
        trajectory: String,
        reward: f64,
        blob_hash: Option<String>,
        created_at: i64,
        status: String,
    },
    /// Lines that need no decoding.
    Plain(Line),
}

/// What an import added.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ImportSummary {
    pub tools: usize,
    pub edges: usize,
    pub aliases: usize,
    pub blobs: usize,
    pub candidates: usize,
}

fn io_error(e: std::io::Error) -> RegistryError {
    RegistryError::Io { path: "<stream>".into(), source: e }
}

impl Registry {
    /// Writes the whole registry as JSON lines.
    pub fn export(&self, out: &mut dyn Write) -> Result<(), RegistryError> {
        // One read transaction: a consistent snapshot even while other processes write.
        let tx = self.conn.unchecked_transaction()?;
        let mut emit = |line: &Line| -> Result<(), RegistryError> {
            let text = serde_json::to_string(line).map_err(|e| RegistryError::Invalid(e.to_string()))?;
            writeln!(out, "{text}").map_err(io_error)
        };
        emit(&Line::Header { format: FORMAT })?;
        let mut stmt = tx.prepare("SELECT key, value FROM meta ORDER BY key")?;
        for row in stmt.query_map([], |r| Ok(Line::Meta { key: r.get(0)?, value: r.get(1)? }))? {
            emit(&row?)?;
        }
        let mut stmt = tx.prepare("SELECT hash, bytes FROM blobs ORDER BY hash")?;
        for row in stmt.query_map([], |r| {
            let bytes: Vec<u8> = r.get(1)?;
            Ok(Line::Blob { hash: r.get(0)?, bytes: B64.encode(bytes) })
        })? {
            emit(&row?)?;
        }
        let mut stmt = tx.prepare(
            "SELECT manifest, blob_hash, embedding, usage_count, success_count, failure_count, reward_sum, \
             reward_count, created_at, last_used_at, id FROM tools ORDER BY name",
        )?;
        let mut failures_of = tx.prepare("SELECT kind, count FROM failures WHERE tool = ?1 ORDER BY kind")?;
        for row in stmt.query_map([], |r| {
            let manifest: String = r.get(0)?;
            let embedding: Option<Vec<u8>> = r.get(2)?;
            Ok((
                manifest,
                r.get(1)?,
                embedding,
                ToolStats {
                    usage_count: r.get(3)?,
                    success_count: r.get(4)?,
                    failure_count: r.get(5)?,
                    reward_sum: r.get(6)?,
                    reward_count: r.get(7)?,
                },
                r.get(8)?,
                r.get(9)?,
                r.get::<_, i64>(10)?,
            ))
        })? {
            let (manifest, blob_hash, embedding, stats, created_at, last_used_at, id) = row?;
            let failures = failures_of
                .query_map([id], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<BTreeMap<String, i64>>>()?;
            let manifest = serde_json::from_str(&manifest).map_err(|e| RegistryError::Invalid(e.to_string()))?;
            emit(&Line::Tool {
                manifest,
                blob_hash,
                embedding: embedding.map(|e| B64.encode(e)),
                stats,
                failures,
                created_at,
                last_used_at,
            })?;
        }
        let mut stmt = tx.prepare(
            "SELECT s.name, d.name, e.count, e.weight FROM edges e JOIN tools s ON s.id = e.src \
             JOIN tools d ON d.id = e.dst ORDER BY s.name, d.name",
        )?;
        for row in stmt
            .query_map([], |r| Ok(Line::Edge { src: r.get(0)?, dst: r.get(1)?, count: r.get(2)?, weight: r.get(3)? }))?
        {
            emit(&row?)?;
        }
        let mut stmt =
            tx.prepare("SELECT a.alias, t.name FROM aliases a JOIN tools t ON t.id = a.canonical ORDER BY a.alias")?;
        for row in stmt.query_map([], |r| Ok(Line::Alias { alias: r.get(0)?, canonical: r.get(1)? }))? {
            emit(&row?)?;
        }
        let mut stmt = tx.prepare(
            "SELECT run, iteration, task, trajectory, reward, manifest, blob_hash, created_at, status \
             FROM candidates ORDER BY id",
        )?;
        for row in stmt.query_map([], |r| {
            let manifest: String = r.get(5)?;
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, manifest, r.get(6)?, r.get(7)?, r.get(8)?))
        })? {
            let (run, iteration, task, trajectory, reward, manifest, blob_hash, created_at, status) = row?;
            let manifest = serde_json::from_str(&manifest).map_err(|e| RegistryError::Invalid(e.to_string()))?;
            emit(&Line::Candidate {
                run,
                iteration,
                task,
                trajectory,
                reward,
                manifest,
                blob_hash,
                created_at,
                status,
            })?;
        }
        Ok(())
    }

    /// Reads an export. Everything is checked before anything is written, and the write is one
    /// transaction: a bad line leaves the registry as it was. Tools of the same name are replaced.
    pub fn import(&mut self, input: &mut dyn BufRead) -> Result<ImportSummary, RegistryError> {
        // Pass 1: parse, check and decode every line; nothing is written yet.
        let mut records = Vec::new();
        for (i, text) in input.lines().enumerate() {
            let line_no = i + 1;
            let text = text.map_err(io_error)?;
            if text.trim().is_empty() {
                continue;
            }
            let fail = |message: String| RegistryError::Import { line: line_no, message };
            let line: Line = serde_json::from_str(&text).map_err(|e| fail(e.to_string()))?;
            let record = match line {
                Line::Header { format } if format != FORMAT => {
                    return Err(fail(format!("export format {format}; this build reads format {FORMAT}")));
                }
                Line::Blob { hash, bytes } => {
                    let bytes = B64.decode(bytes).map_err(|e| fail(format!("blob is not base64: {e}")))?;
                    if blob_hash(&bytes) != hash {
                        return Err(fail(format!("blob {hash} does not match its content")));
                    }
                    Record::Blob(bytes)
                }
                Line::Tool { manifest, blob_hash, embedding, stats, failures, created_at, last_used_at } => {
                    let manifest =
                        Manifest::from_value(manifest).map_err(|e| fail(format!("invalid manifest: {e}")))?;
                    let embedding = match embedding {
                        Some(e) => {
                            let bytes = B64.decode(e).map_err(|e| fail(format!("embedding is not base64: {e}")))?;
                            if bytes.len() != DIM * 4 {
                                return Err(fail(format!("embedding has {} bytes, expected {}", bytes.len(), DIM * 4)));
                            }
                            Some(bytes)
                        }
                        None => None,
                    };
                    if !stats.reward_sum.is_finite() {
                        return Err(fail("reward_sum is not finite".into()));
                    }
                    if failures.values().any(|&n| n < 0) {
                        return Err(fail("a failure count is negative".into()));
                    }
                    Record::Tool { manifest, blob_hash, embedding, stats, failures, created_at, last_used_at }
                }
                Line::Candidate {
                    manifest,
                    run,
                    iteration,
                    task,
                    trajectory,
                    reward,
                    blob_hash,
                    created_at,
                    status,
                } => {
                    let manifest =
                        Manifest::from_value(manifest).map_err(|e| fail(format!("invalid manifest: {e}")))?;
                    Record::Candidate {
                        manifest,
                        run,
                        iteration,
                        task,
                        trajectory,
                        reward,
                        blob_hash,
                        created_at,
                        status,
                    }
                }
                other => Record::Plain(other),
            };
            records.push((line_no, record));
        }
        // Pass 2: one transaction.
        let tx = self.conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let mut summary = ImportSummary::default();
        let mut ids: HashMap<String, i64> = HashMap::new();
        for (line_no, record) in records {
            let fail = |message: String| RegistryError::Import { line: line_no, message };
            let line = match record {
                Record::Blob(bytes) => {
                    put_blob(&tx, &bytes)?;
                    summary.blobs += 1;
                    continue;
                }
                Record::Tool { manifest: m, blob_hash, embedding, stats, failures, created_at, last_used_at } => {
                    if let Some(h) = &blob_hash {
                        let present: Option<i64> =
                            tx.query_row("SELECT 1 FROM blobs WHERE hash = ?1", [h], |r| r.get(0)).optional()?;
                        if present.is_none() {
                            return Err(fail(format!(
                                "tool `{}` refers to blob {h}, which is not in the import",
                                m.name
                            )));
                        }
                    }
                    write_tool_row(&tx, &m, &manifest_json(&m), blob_hash.as_deref(), embedding.as_deref())?;
                    let id: i64 = tx.query_row(
                        "UPDATE tools SET usage_count = ?2, success_count = ?3, failure_count = ?4, reward_sum = ?5, \
                         reward_count = ?6, created_at = ?7, last_used_at = ?8 WHERE name = ?1 RETURNING id",
                        params![
                            m.name.as_str(),
                            stats.usage_count,
                            stats.success_count,
                            stats.failure_count,
                            stats.reward_sum,
                            stats.reward_count,
                            created_at,
                            last_used_at,
                        ],
                        |r| r.get(0),
                    )?;
                    tx.execute("DELETE FROM failures WHERE tool = ?1", [id])?;
                    for (kind, count) in &failures {
                        tx.execute(
                            "INSERT INTO failures (tool, kind, count) VALUES (?1, ?2, ?3)",
                            params![id, kind, count],
                        )?;
                    }
                    ids.insert(m.name.as_str().to_string(), id);
                    summary.tools += 1;
                    continue;
                }
                Record::Candidate {
                    manifest,
                    run,
                    iteration,
                    task,
                    trajectory,
                    reward,
                    blob_hash,
                    created_at,
                    status,
                } => {
                    tx.execute(
                        "INSERT INTO candidates (run, iteration, task, trajectory, reward, manifest, blob_hash, \
                         created_at, status) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                        params![
                            run,
                            iteration,
                            task,
                            trajectory,
                            reward,
                            manifest_json(&manifest),
                            blob_hash,
                            created_at,
                            status
                        ],
                    )?;
                    summary.candidates += 1;
                    continue;
                }
                Record::Plain(line) => line,
            };
            match line {
                Line::Header { .. } => {}
                Line::Meta { key, value } => {
                    tx.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)", params![key, value])?;
                }
                Line::Edge { src, dst, count, weight } => {
                    let id = |name: &str| -> Result<i64, RegistryError> {
                        match ids.get(name) {
                            Some(id) => Ok(*id),
                            None => crate::store::resolve(&tx, name)?
                                .map(|(id, _)| id)
                                .ok_or_else(|| fail(format!("edge refers to unknown tool `{name}`"))),
                        }
                    };
                    let (s, d) = (id(&src)?, id(&dst)?);
                    if s == d || count < 0 || !weight.is_finite() {
                        return Err(fail(format!("edge {src} -> {dst} is a self-loop or has a bad count/weight")));
                    }
                    tx.execute(
                        "INSERT OR REPLACE INTO edges (src, dst, count, weight) VALUES (?1, ?2, ?3, ?4)",
                        params![s, d, count, weight],
                    )?;
                    summary.edges += 1;
                }
                Line::Alias { alias, canonical } => {
                    let (id, _) = crate::store::resolve(&tx, &canonical)?
                        .ok_or_else(|| fail(format!("alias `{alias}` points to unknown tool `{canonical}`")))?;
                    tx.execute(
                        "INSERT OR REPLACE INTO aliases (alias, canonical) VALUES (?1, ?2)",
                        params![alias, id],
                    )?;
                    summary.aliases += 1;
                }
                Line::Blob { .. } | Line::Tool { .. } | Line::Candidate { .. } => {}
            }
        }
        tx.commit()?;
        Ok(summary)
    }
}
