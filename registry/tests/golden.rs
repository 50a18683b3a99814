//! `schemas/graph.schema.json` (`GET /graph.json`) and `schemas/graph-tool.schema.json`
//! (`GET /graph/tools/{name}`) are generated from [`GraphView`] and [`ToolView`]; this fails when
//! they drift. Rewrite them with `TOOLSMITH_BLESS=1 cargo test -p toolsmith-registry --test golden`.

use std::path::Path;

use toolsmith_registry::{GraphView, ToolView};

fn check(file: &str, schema: serde_json::Value) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../schemas").join(file);
    let checked =
        toolsmith_contract::schemas::check_committed(&path, &schema, "cargo test -p toolsmith-registry --test golden");
    if let Err(e) = checked {
        panic!("{e}");
    }
}

#[test]
fn graph_schemas_match_the_committed_files() {
    check("graph.schema.json", schemars::schema_for!(GraphView).to_value());
    check("graph-tool.schema.json", schemars::schema_for!(ToolView).to_value());
}
