//! The read model of the whole graph: every tool and alias with its statistics, plan and alias
//! edges, and the totals. The CLI (`toolsmith tools graph`), the daemon's page and API
//! (`GET /graph.json`) and the tests all read this one shape.

use std::collections::BTreeSet;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use toolsmith_contract::ToolKind;

use crate::RegistryError;

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
    Checkpoint {
        /// The training job's id.
        job: String,
        /// The step of the checkpoint that kept the snapshot.
        step: u64,
    },
}

/// What a node is: a tool of some kind, or a name merged into another tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NodeKind {
    /// A WebAssembly component built with the SDK.
    Plugin,
    /// A Python function run by the interpreter guest.
    Python,
    /// An interface only; a model simulates its observations.
    Simulated,
    /// Implemented by the host itself (meta tools such as search).
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

impl fmt::Display for NodeKind {
    /// The serialised name (`plugin`, ..., `alias`), as [`ToolKind`]'s `Display` writes a kind.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NodeKind::Plugin => "plugin",
            NodeKind::Python => "python",
            NodeKind::Simulated => "simulated",
            NodeKind::Native => "native",
            NodeKind::Alias => "alias",
        })
    }
}

/// A node of [`GraphView`]: a tool, or an alias of one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GraphNode {
    /// The tool's name, or the merged-away name for an alias.
    pub name: String,
    /// The tool's kind, or `alias`.
    pub kind: NodeKind,
    /// Empty for an alias.
    pub version: String,
    /// The tool's description; for an alias, which tool it was merged into.
    pub description: String,
    /// Every call of the tool, whoever failed (0 for an alias: its calls count for its tool).
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
    /// Unix milliseconds of the latest call; null when never called.
    pub last_used_at: Option<i64>,
}

impl GraphNode {
    /// Whether this node is a merged-away name rather than a tool.
    pub fn is_alias(&self) -> bool {
        self.kind == NodeKind::Alias
    }
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
pub struct GraphEdge {
    /// The tool whose result fed `dst`, or the alias.
    pub src: String,
    /// The tool fed, or the tool an alias was merged into.
    pub dst: String,
    /// Whether a plan or a merge made the edge.
    pub kind: EdgeKind,
    /// Plans that used the edge (0 for an alias).
    pub count: i64,
    /// Sum of those plans' rewards; `weight / count` is their mean.
    pub weight: f64,
}

/// Totals of a [`GraphView`]: what it holds, counted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GraphStats {
    /// Tool nodes.
    pub tools: i64,
    /// Alias nodes.
    pub aliases: i64,
    /// Plan edges (alias edges are as many as aliases).
    pub edges: i64,
    /// Calls of all the tools.
    pub calls: i64,
}

impl GraphStats {
    /// The totals of these nodes and edges.
    pub fn of(nodes: &[GraphNode], edges: &[GraphEdge]) -> GraphStats {
        let (aliases, tools): (Vec<&GraphNode>, Vec<&GraphNode>) = nodes.iter().partition(|n| n.is_alias());
        GraphStats {
            tools: tools.len() as i64,
            aliases: aliases.len() as i64,
            edges: edges.iter().filter(|e| e.kind == EdgeKind::Plan).count() as i64,
            calls: tools.iter().map(|n| n.calls).sum(),
        }
    }
}

/// The whole graph, or a part of it ([`GraphView::around`]); `GET /graph.json` serves it
/// (`schemas/graph.schema.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GraphView {
    /// [`GRAPH_FORMAT`].
    pub format: u32,
    /// The registry's generation: changes whenever its tool list does.
    pub generation: i64,
    /// The live registry or a checkpoint's snapshot.
    pub source: GraphSource,
    /// Totals of `nodes` and `edges`.
    pub stats: GraphStats,
    /// Tools, then aliases, each in name order.
    pub nodes: Vec<GraphNode>,
    /// Plan edges, then alias edges, each in (src, dst) order.
    pub edges: Vec<GraphEdge>,
}

impl GraphView {
    /// The tool nodes, in name order.
    pub fn tools(&self) -> impl Iterator<Item = &GraphNode> {
        self.nodes.iter().filter(|n| !n.is_alias())
    }

    /// The edges learned from plans, in (src, dst) order.
    pub fn plan_edges(&self) -> impl Iterator<Item = &GraphEdge> {
        self.edges.iter().filter(|e| e.kind == EdgeKind::Plan)
    }

    /// The tool `name` is, or is an alias of; a tool's own name wins over an alias.
    pub fn canonical(&self, name: &str) -> Option<&str> {
        let tool = self.tools().find(|n| n.name == name).map(|n| n.name.as_str());
        tool.or_else(|| self.nodes.iter().find(|n| n.is_alias() && n.name == name)?.canonical.as_deref())
    }

    /// The tools within `depth` plan-edge hops (either direction) of `name` (a tool or an
    /// alias), the plan edges among them, and their aliases; the totals are recounted.
    pub fn around(&self, name: &str, depth: usize) -> Result<GraphView, RegistryError> {
        let start = self.canonical(name).ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
        let keep = self.within(start, depth);
        let nodes: Vec<GraphNode> =
            self.nodes.iter().filter(|n| keep.contains(n.canonical.as_deref().unwrap_or(&n.name))).cloned().collect();
        let edges: Vec<GraphEdge> = self
            .edges
            .iter()
            .filter(|e| keep.contains(e.dst.as_str()) && (e.kind == EdgeKind::Alias || keep.contains(e.src.as_str())))
            .cloned()
            .collect();
        Ok(GraphView {
            format: self.format,
            generation: self.generation,
            source: self.source.clone(),
            stats: GraphStats::of(&nodes, &edges),
            nodes,
            edges,
        })
    }

    /// Breadth-first over plan edges both ways: the tools at most `depth` hops from `start`.
    fn within<'a>(&'a self, start: &'a str, depth: usize) -> BTreeSet<&'a str> {
        let mut seen = BTreeSet::from([start]);
        let mut frontier = vec![start];
        for _ in 0..depth {
            let mut next = Vec::new();
            for e in self.plan_edges() {
                for (a, b) in [(e.src.as_str(), e.dst.as_str()), (e.dst.as_str(), e.src.as_str())] {
                    if frontier.contains(&a) && seen.insert(b) {
                        next.push(b);
                    }
                }
            }
            frontier = next;
        }
        seen
    }
}
