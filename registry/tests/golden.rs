//! `schemas/graph.schema.json` (`GET /graph.json`) and `schemas/graph-tool.schema.json`
//! (`GET /graph/tools/{name}`) are generated from [`GraphView`] and [`ToolView`]; this fails when
//! they drift. Rewrite them with `TOOLSMITH_BLESS=1 cargo test -p toolsmith-registry --test golden`.

use std::path::Path;

use toolsmith_registry::{GraphView, ToolView};

fn check(file: &str, schema: serde_json::Value, source: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../schemas").join(file);
    let mut text = serde_json::to_string_pretty(&schema).expect("schema");
    text.push('\n');
    if std::env::var_os("TOOLSMITH_BLESS").is_some() {
        std::fs::write(&path, &text).expect("write schema");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == text,
        "{} is out of date with {source}; run TOOLSMITH_BLESS=1 cargo test -p toolsmith-registry --test golden",
        path.display()
    );
}

#[test]
fn graph_schemas_match_the_committed_files() {
    check("graph.schema.json", schemars::schema_for!(GraphView).to_value(), "GraphView");
    check("graph-tool.schema.json", schemars::schema_for!(ToolView).to_value(), "ToolView");
}
