//! The tool graph: the bundled tools registered, a two-step plan retrieved, the graph page written.

use std::time::Instant;

use anyhow::{Context, Result};

use super::{Env, ms};

/// Prints `tool graph: PATH (N tools; SQLite + tantivy BM25 + MiniLM embeddings)`, one search hit
/// per sub-plan, and where the offline graph page went.
pub(super) fn section(env: &Env) -> Result<()> {
    let started = Instant::now();
    let mut registry = env.registry()?;
    println!(
        "\ntool graph: {} ({} tools; SQLite + tantivy BM25 + MiniLM embeddings)",
        registry.path().display(),
        registry.len()?
    );
    let queries = ["turn 5 miles into kilometres", "pull the price field out of this JSON order"];
    let hits = registry.search(&toolsmith_registry::SearchRequest::new(queries).k(1))?;
    println!("  hybrid search, one hit per sub-plan, with the score breakdown ({}):", ms(started.elapsed()));
    for h in hits {
        let e = &h.explain;
        println!(
            "  {:<46} -> {:<11} {:.3} (bm25 {:.2}, cosine {:.3})",
            format!("{:?}", e.query),
            h.name,
            h.score,
            e.sparse,
            e.cosine.unwrap_or_default()
        );
    }
    println!("  browse it: toolsmith tools list | show NAME | search TEXT --explain | graph --html graph.html");
    // The graph page, as the offline file `tools graph --html` writes (the daemon serves it live).
    let page = env.policy_dir().with_file_name("quickstart-graph.html");
    let html = toolsmith_daemon::graph::static_page(&registry)?;
    std::fs::write(&page, html).with_context(|| format!("cannot write {}", page.display()))?;
    println!("  graph page: {} (offline copy; live at /graph under `toolsmith serve --http`)", page.display());
    Ok(())
}
