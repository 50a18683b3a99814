//! Writing the whole registry as JSON lines, section by section in a fixed order.

use std::collections::BTreeMap;
use std::io::Write;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use rusqlite::Connection;

use super::{FORMAT, Line, io_error};
use crate::RegistryError;
use crate::store::{Registry, ToolStats};

/// Where the lines go, one JSON document each.
struct Lines<'a> {
    out: &'a mut dyn Write,
}

impl Lines<'_> {
    fn emit(&mut self, line: &Line) -> Result<(), RegistryError> {
        let text = serde_json::to_string(line).map_err(|e| RegistryError::Invalid(e.to_string()))?;
        writeln!(self.out, "{text}").map_err(io_error)
    }
}

impl Registry {
    /// Writes the whole registry as JSON lines.
    pub fn export(&self, out: &mut dyn Write) -> Result<(), RegistryError> {
        // One read transaction: a consistent snapshot even while other processes write.
        let tx = self.conn.unchecked_transaction()?;
        let mut lines = Lines { out };
        lines.emit(&Line::Header { format: FORMAT })?;
        meta(&tx, &mut lines)?;
        blobs(&tx, &mut lines)?;
        tools(&tx, &mut lines)?;
        edges(&tx, &mut lines)?;
        aliases(&tx, &mut lines)?;
        candidates(&tx, &mut lines)
    }
}

fn meta(conn: &Connection, lines: &mut Lines<'_>) -> Result<(), RegistryError> {
    let mut stmt = conn.prepare("SELECT key, value FROM meta ORDER BY key")?;
    for row in stmt.query_map([], |r| Ok(Line::Meta { key: r.get(0)?, value: r.get(1)? }))? {
        lines.emit(&row?)?;
    }
    Ok(())
}

fn blobs(conn: &Connection, lines: &mut Lines<'_>) -> Result<(), RegistryError> {
    let mut stmt = conn.prepare("SELECT hash, bytes FROM blobs ORDER BY hash")?;
    for row in stmt.query_map([], |r| {
        let bytes: Vec<u8> = r.get(1)?;
        Ok(Line::Blob { hash: r.get(0)?, bytes: B64.encode(bytes) })
    })? {
        lines.emit(&row?)?;
    }
    Ok(())
}

fn tools(conn: &Connection, lines: &mut Lines<'_>) -> Result<(), RegistryError> {
    let mut stmt = conn.prepare(
        "SELECT manifest, blob_hash, embedding, usage_count, success_count, failure_count, reward_sum, \
         reward_count, created_at, last_used_at, id FROM tools ORDER BY name",
    )?;
    let mut failures_of = conn.prepare("SELECT kind, count FROM failures WHERE tool = ?1 ORDER BY kind")?;
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
        lines.emit(&Line::Tool {
            manifest,
            blob_hash,
            embedding: embedding.map(|e| B64.encode(e)),
            stats,
            failures,
            created_at,
            last_used_at,
        })?;
    }
    Ok(())
}

fn edges(conn: &Connection, lines: &mut Lines<'_>) -> Result<(), RegistryError> {
    let mut stmt = conn.prepare(
        "SELECT s.name, d.name, e.count, e.weight FROM edges e JOIN tools s ON s.id = e.src \
         JOIN tools d ON d.id = e.dst ORDER BY s.name, d.name",
    )?;
    for row in
        stmt.query_map([], |r| Ok(Line::Edge { src: r.get(0)?, dst: r.get(1)?, count: r.get(2)?, weight: r.get(3)? }))?
    {
        lines.emit(&row?)?;
    }
    Ok(())
}

fn aliases(conn: &Connection, lines: &mut Lines<'_>) -> Result<(), RegistryError> {
    let mut stmt =
        conn.prepare("SELECT a.alias, t.name FROM aliases a JOIN tools t ON t.id = a.canonical ORDER BY a.alias")?;
    for row in stmt.query_map([], |r| Ok(Line::Alias { alias: r.get(0)?, canonical: r.get(1)? }))? {
        lines.emit(&row?)?;
    }
    Ok(())
}

fn candidates(conn: &Connection, lines: &mut Lines<'_>) -> Result<(), RegistryError> {
    let mut stmt = conn.prepare(
        "SELECT run, iteration, task, trajectory, reward, manifest, blob_hash, created_at, status \
         FROM candidates ORDER BY id",
    )?;
    for row in stmt.query_map([], |r| {
        let manifest: String = r.get(5)?;
        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, manifest, r.get(6)?, r.get(7)?, r.get(8)?))
    })? {
        let (run, iteration, task, trajectory, reward, manifest, blob_hash, created_at, status) = row?;
        let manifest = serde_json::from_str(&manifest).map_err(|e| RegistryError::Invalid(e.to_string()))?;
        lines.emit(&Line::Candidate {
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
