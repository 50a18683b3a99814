//! Hybrid retrieval (SEARL E.3): BM25 and dense cosine, each normalised over the candidate set,
//! fused as `alpha * sparse + (1 - alpha) * dense`, top-k per sub-plan, then one hop along the
//! tool graph.

use std::collections::HashMap;

use rusqlite::params_from_iter;
use serde::Serialize;
use toolsmith_contract::ToolKind;

use crate::embed::cosine;
use crate::store::{Registry, parse_kind};
use crate::{DIM, RegistryError};

/// Which retrievers to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// BM25 and dense scores fused with the registry's (or the request's) alpha.
    #[default]
    Hybrid,
    /// BM25 only (alpha = 1).
    Bm25,
    /// Dense only (alpha = 0).
    Dense,
}

/// A retrieval request: one or more sub-plan texts.
#[derive(Debug, Clone)]
pub struct SearchRequest {
    /// The sub-plan texts, each retrieved for on its own.
    pub queries: Vec<String>,
    /// Hits kept per sub-plan before graph expansion.
    pub k: usize,
    /// Which retrievers score the tools.
    pub mode: Mode,
    /// Follow one hop of dependency edges from the hits.
    pub expand: bool,
    /// Overrides the registry's alpha.
    pub alpha: Option<f32>,
}

impl SearchRequest {
    /// A hybrid search for `queries`: 5 hits each, expanded along the graph.
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(queries: I) -> SearchRequest {
        SearchRequest {
            queries: queries.into_iter().map(Into::into).collect(),
            k: 5,
            mode: Mode::Hybrid,
            expand: true,
            alpha: None,
        }
    }

    /// With `k` hits per sub-plan.
    pub fn k(mut self, k: usize) -> Self {
        self.k = k;
        self
    }

    /// With these retrievers.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// With or without one hop of graph expansion.
    pub fn expand(mut self, expand: bool) -> Self {
        self.expand = expand;
        self
    }
}

/// Why a hit scored what it did.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Explain {
    /// The sub-plan text that found it (for graph neighbours: the one that found the parent).
    pub query: String,
    /// Raw BM25 score, when BM25 returned the tool.
    pub bm25: Option<f32>,
    /// BM25 divided by the best BM25 of the candidate set or the query's full-match score,
    /// whichever is larger.
    pub sparse: f32,
    /// Raw cosine with the query.
    pub cosine: Option<f32>,
    /// Cosine min-max normalised over the candidate set.
    pub dense: f32,
    /// `alpha * sparse + (1 - alpha) * dense`.
    pub fused: f32,
    /// The usage/reward prior, when enabled.
    pub prior: Option<f32>,
    /// Set when the tool was reached along an edge: the retrieved tool and the edge's weight
    /// relative to that tool's heaviest edge.
    pub via: Option<(String, f32)>,
}

/// One retrieved tool.
#[derive(Debug, Clone, Serialize)]
pub struct SearchHit {
    /// The tool's (canonical) name.
    pub name: String,
    /// What the tool does.
    pub description: String,
    /// How the tool runs.
    pub kind: ToolKind,
    /// The final score hits are ranked by.
    pub score: f32,
    /// How the score came about.
    pub explain: Explain,
}

struct Scored {
    id: i64,
    score: f32,
    explain: Explain,
}

impl Registry {
    /// Retrieves tools for each sub-plan text, fuses, expands along the graph and ranks.
    pub fn search(&mut self, request: &SearchRequest) -> Result<Vec<SearchHit>, RegistryError> {
        let vectors = if request.mode == Mode::Bm25 { Vec::new() } else { self.embedder()?.embed(&request.queries)? };
        self.search_embedded(request, &vectors)
    }

    /// [`Registry::search`] with the query embeddings already computed (one per query; ignored
    /// in BM25 mode).
    pub fn search_embedded(
        &mut self,
        request: &SearchRequest,
        vectors: &[Vec<f32>],
    ) -> Result<Vec<SearchHit>, RegistryError> {
        if request.mode != Mode::Bm25 && vectors.len() != request.queries.len() {
            return Err(RegistryError::Invalid(format!(
                "{} queries but {} query vectors",
                request.queries.len(),
                vectors.len()
            )));
        }
        if let Some(bad) = vectors.iter().find(|v| v.len() != DIM) {
            return Err(RegistryError::Invalid(format!("query vectors must be {DIM}-d, got {}", bad.len())));
        }
        self.sync()?;
        let alpha = match request.mode {
            Mode::Hybrid => request.alpha.unwrap_or(self.settings.alpha).clamp(0.0, 1.0),
            Mode::Bm25 => 1.0,
            Mode::Dense => 0.0,
        };
        let pool = self.settings.candidates.max(request.k);
        let mut best: HashMap<i64, Scored> = HashMap::new();
        for (i, query) in request.queries.iter().enumerate() {
            let (sparse, full_match) = if alpha > 0.0 {
                self.bm25.as_ref().map(|b| b.search(query, pool)).transpose()?.unwrap_or_default()
            } else {
                (Vec::new(), 0.0)
            };
            let qv = vectors.get(i);
            let dense = match qv {
                Some(v) if alpha < 1.0 => self.dense.search(v, pool),
                _ => Vec::new(),
            };
            let mut hits = self.fuse(query, &sparse, full_match, &dense, qv.map(Vec::as_slice), alpha);
            if self.settings.prior_weight > 0.0 {
                self.apply_prior(&mut hits)?;
            }
            hits.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.id.cmp(&b.id)));
            hits.truncate(request.k);
            for h in hits {
                if best.get(&h.id).is_none_or(|b| b.score < h.score) {
                    best.insert(h.id, h);
                }
            }
        }
        if request.expand && self.settings.graph_weight > 0.0 && self.settings.neighbours > 0 {
            self.expand(&mut best)?;
        }
        let mut ranked: Vec<Scored> = best.into_values().collect();
        ranked.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.id.cmp(&b.id)));
        // Only the columns a hit shows: no manifest to parse on the search path.
        let mut stmt = self.conn.prepare_cached("SELECT name, description, kind FROM tools WHERE id = ?1")?;
        let mut out = Vec::with_capacity(ranked.len());
        for s in ranked {
            let (name, description, kind): (String, String, String) =
                stmt.query_row([s.id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
            out.push(SearchHit { name, description, kind: parse_kind(&kind), score: s.score, explain: s.explain });
        }
        Ok(out)
    }

    fn fuse(
        &self,
        query: &str,
        sparse: &[(i64, f32)],
        full_match: f32,
        dense: &[(i64, f32)],
        qv: Option<&[f32]>,
        alpha: f32,
    ) -> Vec<Scored> {
        let mut ids: Vec<i64> = sparse.iter().chain(dense).map(|(id, _)| *id).collect();
        ids.sort_unstable();
        ids.dedup();
        let bm25: HashMap<i64, f32> = sparse.iter().copied().collect();
        // Max-normalised over the candidate set, but never by less than the full-match score.
        let max_bm25 = sparse.iter().map(|(_, s)| *s).fold(full_match, f32::max);
        // Exact cosine for every candidate, BM25's included: the vectors are in memory.
        let cos: HashMap<i64, f32> = match qv {
            Some(q) => ids.iter().filter_map(|id| self.dense.vector(*id).map(|v| (*id, cosine(v, q)))).collect(),
            None => HashMap::new(),
        };
        let lo = cos.values().copied().fold(f32::INFINITY, f32::min);
        let hi = cos.values().copied().fold(f32::NEG_INFINITY, f32::max);
        ids.into_iter()
            .map(|id| {
                let raw = bm25.get(&id).copied();
                let s = match raw {
                    Some(v) if max_bm25 > 0.0 => v / max_bm25,
                    _ => 0.0,
                };
                let c = cos.get(&id).copied();
                let d = match c {
                    Some(v) if hi > lo => (v - lo) / (hi - lo),
                    Some(_) => 1.0,
                    None => 0.0,
                };
                let fused = alpha * s + (1.0 - alpha) * d;
                Scored {
                    id,
                    score: fused,
                    explain: Explain {
                        query: query.to_string(),
                        bm25: raw,
                        sparse: s,
                        cosine: c,
                        dense: d,
                        fused,
                        prior: None,
                        via: None,
                    },
                }
            })
            .collect()
    }

    /// Blends in `prior = popularity * reliability`: popularity is log usage relative to the most
    /// used candidate, reliability the Laplace-smoothed success rate (a tool never called gets 0.5).
    fn apply_prior(&self, hits: &mut [Scored]) -> Result<(), RegistryError> {
        if hits.is_empty() {
            return Ok(());
        }
        let sql = format!(
            "SELECT id, usage_count, success_count, failure_count FROM tools WHERE id IN ({})",
            vec!["?"; hits.len()].join(",")
        );
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let stats: HashMap<i64, (i64, i64, i64)> = stmt
            .query_map(params_from_iter(hits.iter().map(|h| h.id)), |r| {
                Ok((r.get(0)?, (r.get(1)?, r.get(2)?, r.get(3)?)))
            })?
            .collect::<rusqlite::Result<_>>()?;
        let max_usage = stats.values().map(|s| s.0).max().unwrap_or(0);
        let w = self.settings.prior_weight.clamp(0.0, 1.0);
        for h in hits {
            let (usage, ok, bad) = stats.get(&h.id).copied().unwrap_or_default();
            let popularity =
                if max_usage > 0 { ((1 + usage) as f32).ln() / ((1 + max_usage) as f32).ln() } else { 0.0 };
            let reliability = (ok + 1) as f32 / (ok + bad + 2) as f32;
            let prior = popularity * reliability;
            h.explain.prior = Some(prior);
            h.score = (1.0 - w) * h.score + w * prior;
        }
        Ok(())
    }

    fn expand(&self, best: &mut HashMap<i64, Scored>) -> Result<(), RegistryError> {
        let seeds: Vec<(i64, f32, Explain)> = best.values().map(|s| (s.id, s.score, s.explain.clone())).collect();
        let mut stmt = self.conn.prepare_cached(
            "SELECT CASE WHEN e.src = ?1 THEN e.dst ELSE e.src END, sum(e.weight) AS w FROM edges e \
             WHERE e.src = ?1 OR e.dst = ?1 GROUP BY 1 ORDER BY w DESC LIMIT ?2",
        )?;
        let mut name = self.conn.prepare_cached("SELECT name FROM tools WHERE id = ?1")?;
        for (seed, score, explain) in seeds {
            let neighbours: Vec<(i64, f64)> = stmt
                .query_map(rusqlite::params![seed, self.settings.neighbours as i64], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            let Some(heaviest) = neighbours.first().map(|n| n.1).filter(|w| *w > 0.0) else { continue };
            let seed_name: String = name.query_row([seed], |r| r.get(0))?;
            for (id, weight) in neighbours {
                let relative = (weight / heaviest) as f32;
                let s = self.settings.graph_weight * score * relative;
                if best.get(&id).is_some_and(|b| b.score >= s) {
                    continue;
                }
                let explain = Explain {
                    bm25: None,
                    sparse: 0.0,
                    cosine: None,
                    dense: 0.0,
                    fused: 0.0,
                    prior: None,
                    via: Some((seed_name.clone(), relative)),
                    query: explain.query.clone(),
                };
                best.insert(id, Scored { id, score: s, explain });
            }
        }
        Ok(())
    }
}
