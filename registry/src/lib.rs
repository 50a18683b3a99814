//! The tool graph: Toolsmith's long-term memory of tools (SEARL §3.4, Appendix E).
//!
//! A [`Registry`] is one SQLite file (WAL mode) holding tools (nodes), weighted dependency edges
//! learned from agents' plans, aliases left by merges, content-addressed blobs (components, Python
//! source) and the candidate pool of an iteration. Beside it live two derived indexes: tantivy
//! BM25 over tool text and the tools' MiniLM embeddings. [`Registry::search`] fuses the two over
//! normalised scores and expands one hop along the graph.
//!
//! ```no_run
//! use toolsmith_registry::{Registry, SearchRequest};
//! # fn main() -> Result<(), toolsmith_registry::RegistryError> {
//! let mut registry = Registry::open(Registry::default_path().as_path())?;
//! let hits = registry.search(&SearchRequest::new(["convert 3 miles to kilometres"]))?;
//! for hit in hits {
//!     println!("{} {:.3}", hit.name, hit.score);
//! }
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

mod db;
pub mod embed;
mod formats;
mod index;
mod search;
mod store;
mod transfer;
mod usage;
mod view;

use std::path::PathBuf;

pub use db::SCHEMA_VERSION;
pub use embed::{DIM, Embedder, ModelFiles};
pub use formats::{Definition, DefinitionProblem, Format, read_definitions, snake_case_name};
pub use search::{Explain, Mode, SearchHit, SearchRequest};
pub use store::{
    AddedTool, Admitted, AuthorMerge, CallUsage, Candidate, CandidateStatus, DoctorReport, GrantEntry, GrantEvent,
    NearDuplicate, Neighbour, NewTool, PlanStep, RecordedCalls, RecordedPlan, Registered, Registry, RegistryOptions,
    RegistryStats, Settings, SortBy, ToolDetails, ToolGrants, ToolRecord, ToolStats,
};
pub use transfer::ImportSummary;
pub use usage::UsageLog;
pub use view::{
    Activity, EdgeKind, GRAPH_FORMAT, GraphEdge, GraphNode, GraphSource, GraphStats, GraphView, NodeKind, Snapshot,
    ToolOrigin, ToolView, ToolViewStats,
};

/// What can go wrong with a registry.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// The file exists but is not a Toolsmith registry.
    #[error("{path}: not a Toolsmith registry: {reason}")]
    NotARegistry {
        /// The file.
        path: PathBuf,
        /// What gave it away.
        reason: String,
    },
    /// SQLite found the file damaged.
    #[error("{path}: the registry database is corrupt ({detail}); restore it from an export or a backup")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// SQLite's words.
        detail: String,
    },
    /// The file cannot be opened (permissions, a directory, a read-only medium).
    #[error("{path}: cannot open the registry: {detail}")]
    Open {
        /// The file.
        path: PathBuf,
        /// The operating system's or SQLite's words.
        detail: String,
    },
    /// Written by a newer Toolsmith.
    #[error(
        "{path}: registry schema version {found} is newer than this build supports ({supported}); upgrade toolsmith"
    )]
    TooNew {
        /// The file.
        path: PathBuf,
        /// Its schema version.
        found: i64,
        /// The newest version this build reads.
        supported: i64,
    },
    /// Any other database failure.
    #[error("registry database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The search index failed.
    #[error("search index {path}: {source}")]
    Index {
        /// The index directory.
        path: PathBuf,
        /// Tantivy's error.
        #[source]
        source: tantivy::TantivyError,
    },
    /// The embedding model failed or is missing.
    #[error("embedding model: {0}")]
    Embedding(String),
    /// No tool (or alias) has this name.
    #[error("no tool named `{0}` in the registry")]
    NotFound(String),
    /// A request that cannot be carried out as asked.
    #[error("{0}")]
    Invalid(String),
    /// A line of an import that cannot be read; nothing of the import was kept.
    #[error("import line {line}: {message}; nothing was imported")]
    Import {
        /// The line's number, from 1.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// Tool definitions that cannot be registered as given; nothing was registered.
    #[error("{} tool definition(s) cannot be registered; nothing was registered:\n{}", .0.len(), list_problems(.0))]
    Definitions(Vec<DefinitionProblem>),
    /// Filesystem failure.
    #[error("{path}: {source}")]
    Io {
        /// The file (or `<stream>` for an import or export stream).
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

fn list_problems(problems: &[DefinitionProblem]) -> String {
    problems.iter().map(|p| format!("  {p}")).collect::<Vec<_>>().join("\n")
}
