//! Registry tests against the real SQLite, tantivy and MiniLM model (run `./scripts/setup.sh`).

mod authors;
mod grants;
mod graph;
mod processes;
mod retrieval;
mod storage;
mod view;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde_json::json;
use toolsmith_contract::Manifest;
use toolsmith_registry::{Embedder, NewTool, Registry, RegistryOptions, Settings};

/// One model per test binary: loading takes a fraction of a second, but ONNX Runtime allows one
/// environment per process anyway.
pub fn embedder() -> Arc<Embedder> {
    static E: OnceLock<Arc<Embedder>> = OnceLock::new();
    E.get_or_init(|| Arc::new(Embedder::load_default().expect("embedding model (run ./scripts/setup.sh)"))).clone()
}

pub fn open(path: &Path) -> Registry {
    open_with(path, Settings::default())
}

pub fn open_with(path: &Path, settings: Settings) -> Registry {
    Registry::open_with(path, RegistryOptions { settings, embedder: Some(embedder()) }).expect("open registry")
}

pub fn temp() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("registry.db");
    (dir, path)
}

pub fn manifest(name: &str, description: &str) -> Manifest {
    Manifest::from_value(json!({
        "name": name,
        "version": "0.1.0",
        "description": description,
        "input_schema": {"type": "object", "properties": {"text": {"type": "string", "description": "input"}}},
        "output_schema": {"type": "object"},
        "kind": "python",
    }))
    .expect("valid manifest")
}

pub fn tool(name: &str, description: &str) -> NewTool {
    NewTool::new(manifest(name, description))
}

pub fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}
