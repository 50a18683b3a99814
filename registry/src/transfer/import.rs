//! Reading an export back, in two phases: every line is parsed and checked before anything is
//! written, then everything is applied in one transaction, so a bad line leaves the registry as
//! it was.

use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use rusqlite::{OptionalExtension, Transaction, TransactionBehavior, params};
use toolsmith_contract::Manifest;

use super::{FORMAT, ImportSummary, Line, io_error};
use crate::RegistryError;
use crate::embed::DIM;
use crate::formats::manifest_problem;
use crate::store::{
    CandidateRow, Registry, ToolStats, blob_hash, insert_candidate, manifest_json, put_blob, resolve, write_tool_row,
};

/// A checked, decoded import line: what is left to write.
enum Record {
    Meta { key: String, value: String },
    Blob(Vec<u8>),
    Tool(ImportedTool),
    Edge { src: String, dst: String, count: i64, weight: f64 },
    Alias { alias: String, canonical: String },
    Candidate(ImportedCandidate),
}

/// A tool line with its manifest checked and its embedding decoded.
struct ImportedTool {
    manifest: Manifest,
    blob_hash: Option<String>,
    embedding: Option<Vec<u8>>,
    stats: ToolStats,
    failures: BTreeMap<String, i64>,
    created_at: i64,
    last_used_at: Option<i64>,
}

/// A candidate line with its manifest checked.
struct ImportedCandidate {
    manifest: Manifest,
    run: String,
    iteration: i64,
    task: String,
    trajectory: String,
    reward: f64,
    blob_hash: Option<String>,
    created_at: i64,
    status: String,
}

/// The error of import line `line`.
fn fail(line: usize, message: impl Into<String>) -> RegistryError {
    RegistryError::Import { line, message: message.into() }
}

impl Registry {
    /// Reads an export. Everything is checked before anything is written, and the write is one
    /// transaction: a bad line leaves the registry as it was. Tools of the same name are replaced.
    pub fn import(&mut self, input: &mut dyn BufRead) -> Result<ImportSummary, RegistryError> {
        let records = read_records(input)?;
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut apply = Apply { tx: &tx, summary: ImportSummary::default(), ids: HashMap::new() };
        for (line, record) in records {
            apply.record(line, record)?;
        }
        let summary = apply.summary;
        tx.commit()?;
        Ok(summary)
    }
}

/// Phase 1: parses, checks and decodes every line, numbered from 1; nothing is written.
fn read_records(input: &mut dyn BufRead) -> Result<Vec<(usize, Record)>, RegistryError> {
    let mut records = Vec::new();
    for (i, text) in input.lines().enumerate() {
        let line = i + 1;
        let text = text.map_err(io_error)?;
        if text.trim().is_empty() {
            continue;
        }
        let parsed: Line = serde_json::from_str(&text).map_err(|e| fail(line, e.to_string()))?;
        if let Some(record) = check(line, parsed)? {
            records.push((line, record));
        }
    }
    Ok(records)
}

/// What one line holds, checked; `None` for the header, which holds nothing to write.
fn check(line: usize, parsed: Line) -> Result<Option<Record>, RegistryError> {
    Ok(Some(match parsed {
        Line::Header { format } if format != FORMAT => {
            return Err(fail(line, format!("export format {format}; this build reads format {FORMAT}")));
        }
        Line::Header { .. } => return Ok(None),
        Line::Meta { key, value } => Record::Meta { key, value },
        Line::Blob { hash, bytes } => Record::Blob(check_blob(line, &hash, &bytes)?),
        Line::Tool { manifest, blob_hash, embedding, stats, failures, created_at, last_used_at } => {
            let manifest = Manifest::from_value(manifest).map_err(|e| fail(line, format!("invalid manifest: {e}")))?;
            // The whole manifest, as `tools add` checks it: a schema that is no JSON Schema would
            // otherwise only fail at the tool's first call.
            if let Some((pointer, message)) = manifest_problem(&manifest, "/manifest") {
                return Err(fail(line, format!("tool `{}`: at {pointer}: {message}", manifest.name)));
            }
            let embedding = embedding.map(|e| check_embedding(line, &e)).transpose()?;
            if !stats.reward_sum.is_finite() {
                return Err(fail(line, "reward_sum is not finite"));
            }
            if failures.values().any(|&n| n < 0) {
                return Err(fail(line, "a failure count is negative"));
            }
            Record::Tool(ImportedTool { manifest, blob_hash, embedding, stats, failures, created_at, last_used_at })
        }
        Line::Edge { src, dst, count, weight } => Record::Edge { src, dst, count, weight },
        Line::Alias { alias, canonical } => Record::Alias { alias, canonical },
        Line::Candidate { manifest, run, iteration, task, trajectory, reward, blob_hash, created_at, status } => {
            let manifest = Manifest::from_value(manifest).map_err(|e| fail(line, format!("invalid manifest: {e}")))?;
            Record::Candidate(ImportedCandidate {
                manifest,
                run,
                iteration,
                task,
                trajectory,
                reward,
                blob_hash,
                created_at,
                status,
            })
        }
    }))
}

/// A blob's bytes, which must be base64 and match their hash.
fn check_blob(line: usize, hash: &str, bytes: &str) -> Result<Vec<u8>, RegistryError> {
    let bytes = B64.decode(bytes).map_err(|e| fail(line, format!("blob is not base64: {e}")))?;
    if blob_hash(&bytes) != hash {
        return Err(fail(line, format!("blob {hash} does not match its content")));
    }
    Ok(bytes)
}

/// An embedding's bytes, which must be base64 and one [`DIM`]-wide vector.
fn check_embedding(line: usize, text: &str) -> Result<Vec<u8>, RegistryError> {
    let bytes = B64.decode(text).map_err(|e| fail(line, format!("embedding is not base64: {e}")))?;
    if bytes.len() != DIM * 4 {
        return Err(fail(line, format!("embedding has {} bytes, expected {}", bytes.len(), DIM * 4)));
    }
    Ok(bytes)
}

/// Phase 2: writes checked records in one transaction, counting what it wrote.
struct Apply<'a> {
    tx: &'a Transaction<'a>,
    summary: ImportSummary,
    /// Tools written so far, by name, for the edges that follow them.
    ids: HashMap<String, i64>,
}

impl Apply<'_> {
    fn record(&mut self, line: usize, record: Record) -> Result<(), RegistryError> {
        match record {
            Record::Meta { key, value } => {
                self.tx.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)", params![key, value])?;
            }
            Record::Blob(bytes) => {
                put_blob(self.tx, &bytes)?;
                self.summary.blobs += 1;
            }
            Record::Tool(tool) => self.tool(line, tool)?,
            Record::Edge { src, dst, count, weight } => self.edge(line, &src, &dst, count, weight)?,
            Record::Alias { alias, canonical } => self.alias(line, &alias, &canonical)?,
            Record::Candidate(candidate) => self.candidate(candidate)?,
        }
        Ok(())
    }

    /// Writes a tool with its statistics and failures, replacing one of the same name; the blob it
    /// names must have come earlier.
    fn tool(&mut self, line: usize, t: ImportedTool) -> Result<(), RegistryError> {
        let m = &t.manifest;
        if let Some(h) = &t.blob_hash {
            let present: Option<i64> =
                self.tx.query_row("SELECT 1 FROM blobs WHERE hash = ?1", [h], |r| r.get(0)).optional()?;
            if present.is_none() {
                return Err(fail(line, format!("tool `{}` refers to blob {h}, which is not in the import", m.name)));
            }
        }
        write_tool_row(self.tx, m, &manifest_json(m), t.blob_hash.as_deref(), t.embedding.as_deref())?;
        let id: i64 = self.tx.query_row(
            "UPDATE tools SET usage_count = ?2, success_count = ?3, failure_count = ?4, reward_sum = ?5, \
             reward_count = ?6, created_at = ?7, last_used_at = ?8 WHERE name = ?1 RETURNING id",
            params![
                m.name.as_str(),
                t.stats.usage_count,
                t.stats.success_count,
                t.stats.failure_count,
                t.stats.reward_sum,
                t.stats.reward_count,
                t.created_at,
                t.last_used_at,
            ],
            |r| r.get(0),
        )?;
        self.tx.execute("DELETE FROM failures WHERE tool = ?1", [id])?;
        for (kind, count) in &t.failures {
            self.tx
                .execute("INSERT INTO failures (tool, kind, count) VALUES (?1, ?2, ?3)", params![id, kind, count])?;
        }
        self.ids.insert(m.name.as_str().to_string(), id);
        self.summary.tools += 1;
        Ok(())
    }

    /// Writes a plan edge between two tools of the import or of the registry.
    fn edge(&mut self, line: usize, src: &str, dst: &str, count: i64, weight: f64) -> Result<(), RegistryError> {
        let (s, d) = (self.tool_id(line, src)?, self.tool_id(line, dst)?);
        if s == d || count < 0 || !weight.is_finite() {
            return Err(fail(line, format!("edge {src} -> {dst} is a self-loop or has a bad count/weight")));
        }
        self.tx.execute(
            "INSERT OR REPLACE INTO edges (src, dst, count, weight) VALUES (?1, ?2, ?3, ?4)",
            params![s, d, count, weight],
        )?;
        self.summary.edges += 1;
        Ok(())
    }

    /// The id of a tool an edge names: one this import wrote, else one the registry knows.
    fn tool_id(&self, line: usize, name: &str) -> Result<i64, RegistryError> {
        match self.ids.get(name) {
            Some(id) => Ok(*id),
            None => resolve(self.tx, name)?
                .map(|(id, _)| id)
                .ok_or_else(|| fail(line, format!("edge refers to unknown tool `{name}`"))),
        }
    }

    fn alias(&mut self, line: usize, alias: &str, canonical: &str) -> Result<(), RegistryError> {
        let (id, _) = resolve(self.tx, canonical)?
            .ok_or_else(|| fail(line, format!("alias `{alias}` points to unknown tool `{canonical}`")))?;
        self.tx.execute("INSERT OR REPLACE INTO aliases (alias, canonical) VALUES (?1, ?2)", params![alias, id])?;
        self.summary.aliases += 1;
        Ok(())
    }

    fn candidate(&mut self, c: ImportedCandidate) -> Result<(), RegistryError> {
        insert_candidate(
            self.tx,
            &CandidateRow {
                run: &c.run,
                iteration: c.iteration,
                task: &c.task,
                trajectory: &c.trajectory,
                reward: c.reward,
                manifest: &c.manifest,
                blob_hash: c.blob_hash.as_deref(),
                created_at: c.created_at,
                status: &c.status,
            },
        )?;
        self.summary.candidates += 1;
        Ok(())
    }
}
