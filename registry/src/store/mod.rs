//! The registry proper: tools, blobs, edges, aliases, candidates and their statistics.
//!
//! One [`Registry`] type; its methods live in the file of their role: opening, registering tools,
//! the plans and calls that grow the graph, the candidate pool, reading tools back, editing by
//! hand and maintenance. The rows and links files hold the SQL that the others share.

mod author;
mod blobs;
mod calls;
mod candidates;
mod doctor;
mod edit;
mod grants;
mod links;
mod maintenance;
mod open;
mod plans;
mod queries;
mod register;
mod rows;
mod settings;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::Connection;

use crate::embed::Embedder;
use crate::index::{Bm25, Dense};

pub use author::{AddedTool, AuthorMerge, NearDuplicate};
pub(crate) use blobs::{blob_hash, put_blob};
pub(crate) use calls::record_calls;
pub use calls::{CallUsage, RecordedCalls};
pub use candidates::{Admitted, Candidate, CandidateStatus};
pub(crate) use candidates::{CandidateRow, insert_candidate};
pub use doctor::DoctorReport;
pub(crate) use grants::tool_grants;
pub use grants::{GrantEntry, GrantEvent, ToolGrants};
pub use links::Neighbour;
pub(crate) use links::{aliases_of, neighbours, resolve};
pub use maintenance::RegistryStats;
pub use plans::{PlanStep, RecordedPlan};
pub use queries::{SortBy, ToolDetails};
pub use register::{NewTool, Registered};
pub use rows::{ToolRecord, ToolStats};
pub(crate) use rows::{manifest_json, parse_kind, write_tool_row};
pub use settings::{RegistryOptions, Settings};

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
