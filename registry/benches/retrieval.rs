//! Registry benchmark: prints tables of retrieval latency at 1k/10k/100k tools (against BM25 alone
//! and dense alone in the same run: `ratio` is hybrid / (bm25 + dense), i.e. what fusion and graph
//! expansion add), registration throughput and embedding throughput by batch size.
//!
//! `cargo bench -p toolsmith-registry --bench retrieval` (set `TOOLSMITH_BENCH_SIZES=1000,10000`
//! to skip the 100k build, which takes a few minutes).
//!
//! Large registries are synthesised from the 206 labelled tools: tool i copies tool i mod 206
//! with a numbered name and description, and its vector is the real embedding of the base tool
//! plus Gaussian noise, renormalised (embedding 100k texts for real would take ~7 min and measure
//! the model, not retrieval). Query embedding is measured separately with the real model.

use std::sync::Arc;
use std::time::{Duration, Instant};

use toolsmith_contract::Manifest;
use toolsmith_registry::{DIM, Embedder, Mode, NewTool, Registry, RegistryOptions, SearchRequest, Settings, embed};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

/// xorshift + Box-Muller: reproducible noise without another dependency.
struct Rng(u64);
impl Rng {
    fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 + 0.5) / (1u64 << 24) as f32
    }
    fn gauss(&mut self) -> f32 {
        let (u, v) = (self.next_f32(), self.next_f32());
        (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
    }
}

fn main() {
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let base: Vec<Manifest> = std::fs::read_to_string(data.join("tools.jsonl"))
        .expect("tools.jsonl")
        .lines()
        .map(|l| Manifest::from_json(l).expect("manifest"))
        .collect();
    let queries: Vec<String> = std::fs::read_to_string(data.join("queries.jsonl"))
        .expect("queries.jsonl")
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).expect("query")["query"].as_str().unwrap_or("").to_string()
        })
        .collect();
    let embedder = Arc::new(Embedder::load_default().expect("embedding model (run ./scripts/setup.sh)"));
    let base_texts: Vec<String> = base.iter().map(|m| embed::tool_text(m.name.as_str(), &m.description)).collect();
    let base_vectors = embedder.embed(&base_texts).expect("embed");
    let query_vectors = embedder.embed(&queries).expect("embed");

    println!("embedding throughput (MiniLM int8, ONNX Runtime, this machine's threads)");
    println!("{:>6} {:>12} {:>14}", "batch", "sentences/s", "ms per batch");
    for batch in [1usize, 8, 32, 128] {
        let texts: Vec<&str> = queries.iter().cycle().take(batch).map(String::as_str).collect();
        let rounds = (256 / batch).max(4);
        let started = Instant::now();
        for _ in 0..rounds {
            embedder.embed(&texts).expect("embed");
        }
        let took = started.elapsed();
        println!("{batch:>6} {:>12.0} {:>14}", (batch * rounds) as f64 / took.as_secs_f64(), ms(took / rounds as u32));
    }

    let sizes: Vec<usize> = std::env::var("TOOLSMITH_BENCH_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1_000, 10_000, 100_000]);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    println!(
        "\nretrieval latency, hybrid (k=5, candidates 50 per retriever, graph expansion on), {} queries",
        queries.len()
    );
    println!(
        "{:>8} {:>10} {:>10} {:>12} {:>12} {:>10} {:>10} {:>8} {:>9}",
        "tools", "p50 ms", "p99 ms", "p50+embed", "p99+embed", "bm25 p50", "dense p50", "ratio", "build s"
    );
    for &n in &sizes {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut r = Registry::open_with(
            &dir.path().join("r.db"),
            RegistryOptions { settings: Settings::default(), embedder: Some(embedder.clone()) },
        )
        .expect("open");
        let started = Instant::now();
        for chunk_start in (0..n).step_by(5_000) {
            let mut tools = Vec::new();
            let mut vectors = Vec::new();
            for i in chunk_start..(chunk_start + 5_000).min(n) {
                let b = &base[i % base.len()];
                let mut m = b.clone();
                m.name = toolsmith_contract::ToolName::new(format!("{}_{i}", b.name)).expect("name");
                m.description = format!("{} Variant {i}.", b.description);
                let mut v: Vec<f32> = base_vectors[i % base.len()].iter().map(|x| x + 0.02 * rng.gauss()).collect();
                let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
                v.iter_mut().for_each(|x| *x /= norm);
                debug_assert_eq!(v.len(), DIM);
                tools.push(NewTool::new(m));
                vectors.push(v);
            }
            r.register_many_embedded(tools, vectors, false).expect("register");
        }
        // The first search builds the BM25 index and loads the vectors: part of the build.
        r.search_embedded(&SearchRequest::new(["warm up"]), &query_vectors[..1]).expect("warm");
        let build = started.elapsed();
        let mut plain = Vec::new();
        for (q, v) in queries.iter().zip(&query_vectors) {
            let t = Instant::now();
            r.search_embedded(&SearchRequest::new([q.as_str()]), std::slice::from_ref(v)).expect("search");
            plain.push(t.elapsed());
        }
        // Baselines in the same run: each retriever alone, no expansion.
        let mut alone = |mode: Mode| {
            let mut t = Vec::new();
            for (q, v) in queries.iter().zip(&query_vectors) {
                let started = Instant::now();
                let req = SearchRequest::new([q.as_str()]).mode(mode).expand(false);
                r.search_embedded(&req, std::slice::from_ref(v)).expect("search");
                t.push(started.elapsed());
            }
            t.sort();
            percentile(&t, 0.5)
        };
        let bm25 = alone(Mode::Bm25);
        let dense = alone(Mode::Dense);
        let mut with_embed = Vec::new();
        for q in queries.iter().take(200) {
            let t = Instant::now();
            r.search(&SearchRequest::new([q.as_str()])).expect("search");
            with_embed.push(t.elapsed());
        }
        plain.sort();
        with_embed.sort();
        let p50 = percentile(&plain, 0.5);
        println!(
            "{n:>8} {:>10} {:>10} {:>12} {:>12} {:>10} {:>10} {:>7.2}x {:>9.1}",
            ms(p50),
            ms(percentile(&plain, 0.99)),
            ms(percentile(&with_embed, 0.5)),
            ms(percentile(&with_embed, 0.99)),
            ms(bm25),
            ms(dense),
            p50.as_secs_f64() / (bm25 + dense).as_secs_f64(),
            build.as_secs_f64()
        );
    }

    println!("\nregistration throughput: 1,000 new tools in transactions of 100");
    println!("{:<34} {:>10}", "", "tools/s");
    for with_model in [false, true] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut r = Registry::open_with(
            &dir.path().join("r.db"),
            RegistryOptions { settings: Settings::default(), embedder: Some(embedder.clone()) },
        )
        .expect("open");
        let total = 1_000;
        let started = Instant::now();
        for chunk in 0..total / 100 {
            let mut tools = Vec::new();
            let mut vectors = Vec::new();
            for i in chunk * 100..(chunk + 1) * 100 {
                let b = &base[i % base.len()];
                let mut m = b.clone();
                m.name = toolsmith_contract::ToolName::new(format!("{}_{i}", b.name)).expect("name");
                tools.push(NewTool::new(m));
                vectors.push(base_vectors[i % base.len()].clone());
            }
            if with_model {
                r.register_many(tools, false).expect("register");
            } else {
                r.register_many_embedded(tools, vectors, false).expect("register");
            }
        }
        let label = if with_model { "embedding with the model" } else { "vectors given (storage only)" };
        println!("{label:<34} {:>10.0}", total as f64 / started.elapsed().as_secs_f64());
    }
}
