//! Registering many authors' tools: 1,000 generated distinct manifests (`TOOLSMITH_BENCH_TOOLS`),
//! through the library (`Registry::add_definitions`: checks, batched MiniLM embeddings, one
//! transaction) and through `toolsmith tools add DIR` on a directory of one file per tool (one
//! process: the model and the bundled tools loaded once). Prints tools/s for each.
//!
//! `cargo bench --profile dev --bench tools_add`

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use serde_json::{Value, json};
use toolsmith_registry::{AuthorMerge, Registry, read_definitions};

const VERBS: [&str; 10] =
    ["fetch", "create", "delete", "update", "list", "search", "export", "validate", "count", "archive"];
const THINGS: [&str; 10] = [
    "invoice",
    "customer",
    "flight",
    "hotel booking",
    "weather report",
    "stock quote",
    "playlist",
    "git commit",
    "calendar event",
    "support ticket",
];
const BY: [&str; 10] = [
    "by id",
    "by name",
    "for a date",
    "for a region",
    "by owner",
    "by status",
    "by tag",
    "in bulk",
    "for a team",
    "by keyword",
];

/// Tool `i`: a distinct name, description and parameters, as a provider's function would have.
fn manifest(i: usize) -> Value {
    let (verb, thing, by) = (VERBS[i % 10], THINGS[i / 10 % 10], BY[i / 100 % 10]);
    let name = format!("{verb}_{}_{}_{i}", thing.replace(' ', "_"), by.replace(' ', "_"));
    json!({
        "name": name,
        "version": "1.0.0",
        "description": format!("{verb} a {thing} {by} in provider {}'s service, variant {i}.", i % 37),
        "input_schema": {"type": "object", "properties": {
            format!("{}_key", thing.replace(' ', "_")): {"type": "string", "description": by},
            "limit": {"type": "integer", "minimum": 1}}, "required": [format!("{}_key", thing.replace(' ', "_"))]},
        "output_schema": {"type": "object", "properties": {"items": {"type": "array"}}},
        "examples": [{"input": {format!("{}_key", thing.replace(' ', "_")): "x"}, "output": {"items": []}}],
        "kind": "simulated",
    })
}

fn main() {
    let n: usize = std::env::var("TOOLSMITH_BENCH_TOOLS").ok().and_then(|s| s.parse().ok()).unwrap_or(1_000);
    let manifests: Vec<Value> = (0..n).map(manifest).collect();
    let dir = tempfile::tempdir().expect("tempdir");

    // The library: one call, the model loaded before the clock starts (a process loads it once).
    let mut r = Registry::open(&dir.path().join("library.db")).expect("open");
    r.embedder().expect("embedding model (run ./scripts/setup.sh)");
    let text = serde_json::to_string(&manifests).expect("json");
    // The model alone on the same texts, batches of 32: how fast this machine embeds right now.
    let texts: Vec<String> = manifests
        .iter()
        .map(|m| {
            let (name, description) = (m["name"].as_str().unwrap_or(""), m["description"].as_str().unwrap_or(""));
            toolsmith_registry::embed::tool_text(name, description)
        })
        .collect();
    let embedder = r.embedder().expect("model");
    let started = Instant::now();
    for chunk in texts.chunks(32) {
        embedder.embed(chunk).expect("embed");
    }
    let embed_only = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let definitions = read_definitions("generated.json", &text).expect("definitions");
    let added = r.add_definitions(definitions, AuthorMerge::SameInterface, &mut |_, _| {}).expect("add");
    let library = started.elapsed().as_secs_f64();
    let near = added.iter().filter(|t| t.near_duplicate.is_some()).count();
    assert_eq!(r.len().expect("len"), n);

    // The command on a directory of one file per tool, into a registry seeded beforehand.
    let tools = dir.path().join("tools");
    std::fs::create_dir(&tools).expect("mkdir");
    for (i, m) in manifests.iter().enumerate() {
        std::fs::write(tools.join(format!("{i:05}.json")), m.to_string()).expect("write");
    }
    let registry = dir.path().join("cli.db");
    let toolsmith = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_toolsmith"))
            .args(args)
            .env("TOOLSMITH_REGISTRY", &registry)
            .env("TOOLSMITH_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache"))
            .output()
            .expect("run toolsmith");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    toolsmith(&["tools", "stats"]);
    let started = Instant::now();
    toolsmith(&["tools", "add", tools.to_str().expect("utf8")]);
    let cli = started.elapsed().as_secs_f64();

    // The way before: one process per file (the model loaded every time), on the first 20.
    let single = 20.min(n);
    let started = Instant::now();
    for i in 0..single {
        toolsmith(&["tools", "add", tools.join(format!("{i:05}.json")).to_str().expect("utf8"), "--no-merge"]);
    }
    let per_process = started.elapsed().as_secs_f64() / single as f64;

    println!(
        "registering {n} distinct manifests with their MiniLM embeddings ({near} near-duplicates reported, none merged)"
    );
    println!("{:<44} {:>8} {:>10}", "path", "s", "tools/s");
    println!("{:<44} {:>8.2} {:>10.0}", "library: Registry::add_definitions", library, n as f64 / library);
    println!("{:<44} {:>8.2} {:>10.0}", "CLI: toolsmith tools add DIR (whole process)", cli, n as f64 / cli);
    println!("{:<44} {:>8.2} {:>10.0}", "the model alone, batches of 32", embed_only, n as f64 / embed_only);
    println!("{:<44} {:>8.2} {:>10.1}", "CLI: one process per file (baseline)", per_process, 1.0 / per_process);
    println!("directory / one process per file: {:.0}x", per_process * n as f64 / cli);
}
