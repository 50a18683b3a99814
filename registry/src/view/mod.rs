//! The tool graph as it is read: [`GraphView`] (every tool and alias with its statistics, plan
//! and alias edges, and the totals) for the CLI, the daemon's page and the tests, and
//! [`ToolView`], one tool in full (schemas, code, provenance, failures by kind).
//!
//! The queries take a bare [`rusqlite::Connection`], so they read the live registry and, through
//! [`Snapshot`], a read-only copy that training kept at a checkpoint (schema version 2 and later:
//! one without failures by kind shows none).

mod activity;
mod graph;
mod graph_rows;
mod snapshot;
mod tool;

pub use activity::Activity;
pub use graph::{EdgeKind, GRAPH_FORMAT, GraphEdge, GraphNode, GraphSource, GraphStats, GraphView, NodeKind};
pub use snapshot::Snapshot;
pub use tool::{ToolOrigin, ToolView, ToolViewStats};

use crate::{Registry, RegistryError};

impl Registry {
    /// The whole graph, as the CLI and the page show it; [`GraphView::around`] cuts out a part.
    pub fn graph_view(&self) -> Result<GraphView, RegistryError> {
        graph_rows::graph_view(&self.conn)
    }

    /// One tool (or alias, resolved to its tool) in full.
    pub fn tool_view(&self, name: &str) -> Result<ToolView, RegistryError> {
        tool::tool_view(&self.conn, name)
    }

    /// The totals of [`Registry::graph_view`] without reading every row out.
    pub fn view_stats(&self) -> Result<GraphStats, RegistryError> {
        graph_rows::view_stats(&self.conn)
    }
}
