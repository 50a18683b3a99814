//! How a registry behaves: retrieval and merging settings, and the options it is opened with.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::embed::Embedder;

/// Tunable behaviour of retrieval and merging.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Weight of the normalised BM25 score in the fusion; `1 - alpha` goes to the dense score.
    /// 0.3 measured best on the labelled set (0.2-0.4 all beat either retriever alone).
    pub alpha: f32,
    /// How many hits each retriever contributes to the candidate set that scores are normalised
    /// over.
    pub candidates: usize,
    /// A neighbour reached by graph expansion scores `graph_weight * parent score * relative edge
    /// weight`.
    pub graph_weight: f32,
    /// At most this many neighbours per retrieved tool.
    pub neighbours: usize,
    /// Weight of the usage/reward prior in the final score (0 disables it).
    pub prior_weight: f32,
    /// A tool registered within this cosine of an existing one merges into it (SEARL's delta).
    /// Chosen from the bundled tools and the labelled set: see docs/architecture.md.
    pub merge_threshold: f32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            alpha: 0.3,
            candidates: 50,
            graph_weight: 0.5,
            neighbours: 3,
            prior_weight: 0.0,
            merge_threshold: 0.92,
        }
    }
}

/// How to open a registry.
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    /// Retrieval and merging settings.
    pub settings: Settings,
    /// A loaded embedder to share; otherwise one is loaded on first use.
    pub embedder: Option<Arc<Embedder>>,
}
