//! How fast the graph page loads as the registry grows: `GET /graph.json` and the page in headless
//! Chromium until its first drawing (`body[data-state=ready]`), for a 200-tool registry (the
//! baseline) and a 10,000-tool one with 15,000 plan edges, served by `toolsmith serve --http`.
//! Medians of 5 rounds; the target is under 1 s for 10,000 tools.
//!
//! `cargo bench --bench graph`

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::HttpServer;

use serde_json::{Value, json};
use toolsmith_contract::Manifest;
use toolsmith_registry::{CallUsage, NewTool, PlanStep, Registry};

const ROUNDS: usize = 5;

/// A deterministic registry of `n` tools of every kind, `edges` plan edges, calls and aliases.
fn build(path: &Path, n: usize, edges: usize) {
    let mut registry = Registry::open(path).expect("open");
    let kinds = ["plugin", "python", "simulated", "native"];
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut tools = Vec::with_capacity(n);
    let mut vectors = Vec::with_capacity(n);
    for i in 0..n {
        let manifest = Manifest::from_value(json!({
            "name": format!("tool_{i:05}"),
            "version": "1.0.0",
            "description": format!("Tool number {i}: converts, fetches or summarises things of family {}.", i % 97),
            "input_schema": {"type": "object", "properties": {"x": {"type": "string"}}},
            "output_schema": {"type": "object"},
            "kind": kinds[i % kinds.len()],
        }))
        .expect("manifest");
        tools.push(NewTool::new(manifest));
        let mut v: Vec<f32> = (0..toolsmith_registry::DIM).map(|_| (next() % 1000) as f32 / 1000.0 - 0.5).collect();
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.iter_mut().for_each(|x| *x /= norm);
        vectors.push(v);
    }
    registry.register_many_embedded(tools, vectors, false).expect("register");
    for _ in 0..edges {
        let (a, b) = (next() as usize % n, next() as usize % n);
        let plan = [
            PlanStep { id: "a".into(), tool: format!("tool_{a:05}"), depends_on: vec![] },
            PlanStep { id: "b".into(), tool: format!("tool_{b:05}"), depends_on: vec!["a".into()] },
        ];
        registry.record_plan(&plan, (next() % 100) as f64 / 100.0).expect("plan");
    }
    let calls: Vec<CallUsage> = (0..n * 3)
        .map(|_| {
            let i = next() as usize % n;
            let failure = next().is_multiple_of(10).then_some("timeout");
            CallUsage::new(format!("tool_{i:05}"), failure).with_reward(Some((next() % 2) as f64))
        })
        .collect();
    registry.record_calls(&calls).expect("calls");
    for i in 0..n / 100 {
        registry.merge(&format!("tool_{:05}", i * 2), &format!("tool_{:05}", i * 2 + 1)).expect("merge");
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Seconds for `GET url`, and the body's size.
fn fetch(url: &str) -> (f64, usize) {
    let out = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-w", "%{time_total} %{size_download} %{http_code}", url])
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut parts = text.split_whitespace();
    let seconds: f64 = parts.next().and_then(|s| s.parse().ok()).expect("time");
    let bytes: usize = parts.next().and_then(|s| s.parse().ok()).expect("size");
    assert_eq!(parts.next(), Some("200"), "{url}: {text}");
    (seconds, bytes)
}

/// Seconds from navigation to the page's first drawing, in a fresh tab.
fn page_load(browser: &headless_chrome::Browser, url: &str) -> (f64, usize) {
    let tab = browser.new_tab().expect("tab");
    let started = Instant::now();
    tab.navigate_to(url).expect("navigate");
    loop {
        let ready = tab
            .evaluate("document.body && document.body.dataset.state", false)
            .ok()
            .and_then(|r| r.value)
            .and_then(|v| v.as_str().map(str::to_string));
        match ready.as_deref() {
            Some("ready") => break,
            Some("error") => panic!("the page failed to load {url}"),
            _ => {}
        }
        assert!(started.elapsed() < Duration::from_secs(60), "the page never got ready");
        std::thread::sleep(Duration::from_millis(5));
    }
    let seconds = started.elapsed().as_secs_f64();
    let nodes = tab
        .evaluate("Number(document.getElementById('graph').dataset.nodes)", false)
        .ok()
        .and_then(|r| r.value)
        .and_then(|v: Value| v.as_u64())
        .unwrap_or(0) as usize;
    let _ = tab.close(true);
    (seconds, nodes)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("graph: bench");
        return;
    }
    let browser = common::browser(Duration::from_secs(600));
    println!("| tools | edges | graph.json | bytes | page ready | nodes drawn |");
    println!("|---:|---:|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for (n, edges) in [(200, 300), (10_000, 15_000)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("registry.db"); // where HttpServer::start_in serves from
        let built = Instant::now();
        build(&path, n, edges);
        eprintln!("built {n} tools in {:.1} s", built.elapsed().as_secs_f64());
        let server = HttpServer::start_in(dir.path(), &[]);
        let url = format!("{}/graph.json", server.base);
        fetch(&url); // warm the page cache and the connection path
        let json: Vec<(f64, usize)> = (0..ROUNDS).map(|_| fetch(&url)).collect();
        let page: Vec<(f64, usize)> =
            (0..ROUNDS).map(|_| page_load(&browser, &format!("{}/graph", server.base))).collect();
        let json_s = median(json.iter().map(|r| r.0).collect());
        let page_s = median(page.iter().map(|r| r.0).collect());
        println!("| {n} | {edges} | {:.0} ms | {} | {:.0} ms | {} |", json_s * 1e3, json[0].1, page_s * 1e3, page[0].1);
        rows.push((n, json_s, page_s));
    }
    let (small, large) = (rows[0], rows[1]);
    println!();
    println!(
        "10,000 tools vs 200: graph.json {:.1}x, page {:.1}x; target < 1 s: graph.json {}, page {}",
        large.1 / small.1,
        large.2 / small.2,
        if large.1 < 1.0 { "met" } else { "missed" },
        if large.2 < 1.0 { "met" } else { "missed" }
    );
}
