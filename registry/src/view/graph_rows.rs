//! Reading a [`GraphView`] out of a registry database, live or a snapshot.

use std::collections::BTreeMap;

use rusqlite::Connection;

use super::graph::{EdgeKind, GRAPH_FORMAT, GraphEdge, GraphNode, GraphSource, GraphStats, GraphView, NodeKind};
use crate::RegistryError;
use crate::store::parse_kind;

/// The totals of [`graph_view`] without reading every row out.
pub(super) fn view_stats(conn: &Connection) -> Result<GraphStats, RegistryError> {
    Ok(conn.query_row(
        "SELECT (SELECT count(*) FROM tools), (SELECT count(*) FROM aliases), (SELECT count(*) FROM edges), \
         (SELECT coalesce(sum(usage_count), 0) FROM tools)",
        [],
        |r| Ok(GraphStats { tools: r.get(0)?, aliases: r.get(1)?, edges: r.get(2)?, calls: r.get(3)? }),
    )?)
}

/// The whole graph: tools, plan edges, then aliases as nodes and edges.
pub(super) fn graph_view(conn: &Connection) -> Result<GraphView, RegistryError> {
    let (names, mut nodes) = tool_nodes(conn)?;
    let mut edges = plan_edges(conn, &names)?;
    alias_nodes(conn, &mut nodes, &mut edges)?;
    edges.sort_by(|a, b| (a.kind as u8, &a.src, &a.dst).cmp(&(b.kind as u8, &b.src, &b.dst)));
    Ok(GraphView {
        format: GRAPH_FORMAT,
        generation: crate::index::generation(conn)?,
        source: GraphSource::Live,
        stats: GraphStats::of(&nodes, &edges),
        nodes,
        edges,
    })
}

/// Every tool in name order, and the name of each id. One pass over the tools table;
/// descriptions come from the column, so no manifest is parsed (a 10,000-tool registry reads in
/// milliseconds).
fn tool_nodes(conn: &Connection) -> Result<(BTreeMap<i64, String>, Vec<GraphNode>), RegistryError> {
    let mut names = BTreeMap::new();
    let mut nodes = Vec::new();
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
        nodes.push(GraphNode {
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
    Ok((names, nodes))
}

/// The edges learned from plans, between the tools of `names`.
fn plan_edges(conn: &Connection, names: &BTreeMap<i64, String>) -> Result<Vec<GraphEdge>, RegistryError> {
    let mut edges = Vec::new();
    let mut stmt = conn.prepare("SELECT src, dst, count, weight FROM edges")?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        let (src, dst): (i64, i64) = (r.get(0)?, r.get(1)?);
        if let (Some(src), Some(dst)) = (names.get(&src), names.get(&dst)) {
            edges.push(GraphEdge {
                src: src.clone(),
                dst: dst.clone(),
                kind: EdgeKind::Plan,
                count: r.get(2)?,
                weight: r.get(3)?,
            });
        }
    }
    Ok(edges)
}

/// Appends each alias as a node and as an edge to the tool it was merged into, in alias order.
fn alias_nodes(conn: &Connection, nodes: &mut Vec<GraphNode>, edges: &mut Vec<GraphEdge>) -> Result<(), RegistryError> {
    let mut stmt = conn.prepare(
        "SELECT a.alias, t.name, t.created_at FROM aliases a JOIN tools t ON t.id = a.canonical ORDER BY a.alias",
    )?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        let (alias, canonical): (String, String) = (r.get(0)?, r.get(1)?);
        edges.push(GraphEdge {
            src: alias.clone(),
            dst: canonical.clone(),
            kind: EdgeKind::Alias,
            count: 0,
            weight: 0.0,
        });
        nodes.push(GraphNode {
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
    Ok(())
}
