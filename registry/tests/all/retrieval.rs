//! Retrieval quality on the shipped labelled set (tests/data: tools, queries, duplicates).

use std::collections::HashMap;

use serde::Deserialize;
use toolsmith_contract::Manifest;
use toolsmith_registry::{Mode, NewTool, Registry, SearchRequest, Settings, embed};

use crate::{data, embedder, open_with, temp};

#[derive(Deserialize)]
struct Query {
    query: String,
    relevant: Vec<String>,
}

fn read_jsonl<T: serde::de::DeserializeOwned>(name: &str) -> Vec<T> {
    std::fs::read_to_string(data(name))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{name}: {e}: {l}")))
        .collect()
}

fn tools() -> Vec<Manifest> {
    read_jsonl::<serde_json::Value>("tools.jsonl")
        .into_iter()
        .map(|v| Manifest::from_value(v).expect("valid manifest"))
        .collect()
}

fn queries() -> Vec<Query> {
    read_jsonl("queries.jsonl")
}

#[derive(Debug, Clone, Copy, Default)]
struct Metrics {
    r1: f64,
    r5: f64,
    ndcg10: f64,
}

fn evaluate(r: &mut Registry, queries: &[&Query], vectors: &[Vec<f32>], mode: Mode, alpha: Option<f32>) -> Metrics {
    let mut m = Metrics::default();
    for (q, v) in queries.iter().zip(vectors) {
        let req = SearchRequest { alpha, ..SearchRequest::new([q.query.as_str()]).k(10).mode(mode).expand(false) };
        let hits = r.search_embedded(&req, std::slice::from_ref(v)).expect("search");
        let ranked: Vec<&str> = hits.iter().map(|h| h.name.as_str()).collect();
        let rel = |k: usize| ranked.iter().take(k).filter(|n| q.relevant.iter().any(|r| r == *n)).count() as f64;
        m.r1 += rel(1) / q.relevant.len().min(1) as f64;
        m.r5 += rel(5) / q.relevant.len().min(5) as f64;
        let dcg: f64 = ranked
            .iter()
            .take(10)
            .enumerate()
            .filter(|(_, n)| q.relevant.iter().any(|r| r == *n))
            .map(|(i, _)| 1.0 / ((i + 2) as f64).log2())
            .sum();
        let ideal: f64 = (0..q.relevant.len().min(10)).map(|i| 1.0 / ((i + 2) as f64).log2()).sum();
        m.ndcg10 += dcg / ideal;
    }
    let n = queries.len() as f64;
    Metrics { r1: m.r1 / n, r5: m.r5 / n, ndcg10: m.ndcg10 / n }
}

fn loaded() -> (tempfile::TempDir, Registry) {
    let (dir, path) = temp();
    let mut r = open_with(&path, Settings::default());
    let tools: Vec<NewTool> = tools().into_iter().map(NewTool::new).collect();
    r.register_many(tools, false).expect("register the labelled tools");
    (dir, r)
}

#[test]
fn labelled_set_is_well_formed() {
    let tools = tools();
    let queries = queries();
    assert!(tools.len() >= 150, "{} tools", tools.len());
    assert!(queries.len() >= 300, "{} queries", queries.len());
    let names: std::collections::HashSet<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names.len(), tools.len(), "tool names are unique");
    for q in &queries {
        assert!(!q.relevant.is_empty());
        for r in &q.relevant {
            assert!(names.contains(r.as_str()), "query {:?} names unknown tool {r}", q.query);
        }
    }
}

#[test]
fn hybrid_beats_bm25_and_dense_on_the_labelled_set() {
    let (_d, mut r) = loaded();
    let all = queries();
    let queries: Vec<&Query> = all.iter().collect();
    let vectors = embedder().embed(&queries.iter().map(|q| q.query.as_str()).collect::<Vec<_>>()).expect("embed");
    let bm25 = evaluate(&mut r, &queries, &vectors, Mode::Bm25, None);
    let dense = evaluate(&mut r, &queries, &vectors, Mode::Dense, None);
    let hybrid = evaluate(&mut r, &queries, &vectors, Mode::Hybrid, None);
    println!("{} tools, {} queries", r.len().expect("len"), queries.len());
    println!("{:<14} {:>8} {:>8} {:>8}", "retriever", "R@1", "R@5", "NDCG@10");
    for (name, m) in [("bm25", bm25), ("dense", dense), ("hybrid default", hybrid)] {
        println!("{name:<14} {:>8.3} {:>8.3} {:>8.3}", m.r1, m.r5, m.ndcg10);
    }
    for alpha in [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8] {
        let m = evaluate(&mut r, &queries, &vectors, Mode::Hybrid, Some(alpha));
        println!("{:<14} {:>8.3} {:>8.3} {:>8.3}", format!("hybrid a={alpha}"), m.r1, m.r5, m.ndcg10);
    }
    assert!(hybrid.ndcg10 > bm25.ndcg10 && hybrid.ndcg10 > dense.ndcg10, "NDCG@10: {hybrid:?} vs {bm25:?} / {dense:?}");
    assert!(hybrid.r5 > bm25.r5 && hybrid.r5 > dense.r5, "R@5: {hybrid:?} vs {bm25:?} / {dense:?}");
    assert!(hybrid.r1 > bm25.r1 && hybrid.r1 > dense.r1, "R@1: {hybrid:?} vs {bm25:?} / {dense:?}");
}

/// The usage prior: half of the queries play past traffic (their best tool is called
/// successfully), the other half are scored with and without the prior.
#[test]
fn usage_prior_measured_on_held_out_queries() {
    let (_d, mut r) = loaded();
    let all = queries();
    let past: Vec<&Query> = all.iter().step_by(2).collect();
    let held: Vec<&Query> = all.iter().skip(1).step_by(2).collect();
    for q in &past {
        r.record_call(&q.relevant[0], true, Some(1.0)).expect("record call");
    }
    let vectors = embedder().embed(&held.iter().map(|q| q.query.as_str()).collect::<Vec<_>>()).expect("embed");
    let without = evaluate(&mut r, &held, &vectors, Mode::Hybrid, None);
    println!("{:<14} {:>8} {:>8} {:>8}", "prior weight", "R@1", "R@5", "NDCG@10");
    println!("{:<14} {:>8.3} {:>8.3} {:>8.3}", 0.0, without.r1, without.r5, without.ndcg10);
    for w in [0.05, 0.1, 0.2] {
        r.settings_mut().prior_weight = w;
        let m = evaluate(&mut r, &held, &vectors, Mode::Hybrid, None);
        println!("{w:<14} {:>8.3} {:>8.3} {:>8.3}", m.r1, m.r5, m.ndcg10);
        // The prior only reorders the fused candidates: it must keep its hits within the pool.
        assert!(m.r5 > 0.5 * without.r5, "prior {w} wrecked retrieval: {m:?}");
    }
}

#[derive(Deserialize)]
struct DuplicateCase {
    tool: String,
    duplicate: Option<Manifest>,
    distinct: Option<Manifest>,
}

/// The merge threshold (delta): cosine of near-duplicates vs closely related but distinct tools.
#[test]
fn default_merge_threshold_separates_duplicates_from_related_tools() {
    let by_name: HashMap<String, Manifest> = tools().into_iter().map(|t| (t.name.as_str().to_string(), t)).collect();
    let cases: Vec<DuplicateCase> = read_jsonl("duplicates.jsonl");
    let text = |m: &Manifest| embed::tool_text(m.name.as_str(), &m.description);
    let mut dup = Vec::new();
    let mut distinct = Vec::new();
    let e = embedder();
    for c in &cases {
        let base = &by_name[&c.tool];
        for (other, out) in [(&c.duplicate, &mut dup), (&c.distinct, &mut distinct)] {
            if let Some(o) = other {
                let v = e.embed(&[text(base), text(o)]).expect("embed");
                out.push(embed::cosine(&v[0], &v[1]));
            }
        }
    }
    dup.sort_by(f32::total_cmp);
    distinct.sort_by(f32::total_cmp);
    let q = |v: &[f32], p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    println!("duplicates ({}): min {:.3} p10 {:.3} median {:.3}", dup.len(), dup[0], q(&dup, 0.1), q(&dup, 0.5));
    println!(
        "distinct   ({}): median {:.3} p90 {:.3} max {:.3}",
        distinct.len(),
        q(&distinct, 0.5),
        q(&distinct, 0.9),
        distinct[distinct.len() - 1]
    );
    println!("{:>6} {:>16} {:>20}", "delta", "duplicates merged", "distinct wrongly merged");
    for delta in [0.75f32, 0.8, 0.85, 0.88, 0.9, 0.92, 0.95] {
        let merged = dup.iter().filter(|c| **c >= delta).count();
        let wrong = distinct.iter().filter(|c| **c >= delta).count();
        println!("{delta:>6} {merged:>9}/{:<6} {wrong:>13}/{}", dup.len(), distinct.len());
    }
    let delta = Settings::default().merge_threshold;
    let wrong = distinct.iter().filter(|c| **c >= delta).count();
    let merged = dup.iter().filter(|c| **c >= delta).count();
    println!("default delta {delta}: {merged}/{} duplicates merge, {wrong}/{} distinct", dup.len(), distinct.len());
    // Merging distinct tools loses a capability; missing a duplicate only costs a little space.
    assert_eq!(wrong, 0, "distinct tools would merge at delta {delta}");
    // And the threshold is no stricter than it needs to be: duplicates with near-identical wording
    // (cosine ~0.95, as when an agent re-creates a tool) still merge.
    assert!(dup.iter().any(|c| *c >= delta) || dup[dup.len() - 1] < 0.95);
}
