//! Export and import as JSON lines: one record per line, in a fixed order, so exporting an
//! imported export gives the same bytes. Embeddings and blobs travel as base64, exactly.

mod export;
mod import;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::RegistryError;
use crate::store::ToolStats;

/// Version of the line format.
const FORMAT: u32 = 1;

/// One line of an export, as written.
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

/// What an import added.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ImportSummary {
    /// Tools written (new or replacing one of the same name).
    pub tools: usize,
    /// Plan edges written.
    pub edges: usize,
    /// Aliases written.
    pub aliases: usize,
    /// Blobs read (ones already held are kept once).
    pub blobs: usize,
    /// Candidates added to the pool.
    pub candidates: usize,
}

/// A failure of the stream itself, which has no path to name.
fn io_error(e: std::io::Error) -> RegistryError {
    RegistryError::Io { path: "<stream>".into(), source: e }
}
