//! What ties tools together: names resolved through aliases, and the weighted edges between tools.

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::RegistryError;

/// An edge seen from one end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Neighbour {
    /// The tool at the other end.
    pub name: String,
    /// Plans that used the edge.
    pub count: i64,
    /// Sum of those plans' rewards.
    pub weight: f64,
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

/// Strengthens (or creates) the edge `src -> dst` by `count` plans and `weight`.
pub(crate) fn add_edge(tx: &Connection, src: i64, dst: i64, count: i64, weight: f64) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT INTO edges (src, dst, count, weight) VALUES (?1, ?2, ?3, ?4) \
         ON CONFLICT (src, dst) DO UPDATE SET count = count + excluded.count, weight = weight + excluded.weight",
        params![src, dst, count, weight],
    )?;
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
