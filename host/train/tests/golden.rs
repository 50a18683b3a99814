//! `schemas/train-sft.schema.json` and `schemas/train-rl.schema.json` are generated from
//! [`SftConfig`] and [`RlConfig`]; this fails when they drift. Rewrite them with
//! `TOOLSMITH_BLESS=1 cargo test -p toolsmith-train --test golden`.

use std::path::Path;

fn check(file: &str, schema: serde_json::Value, source: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas").join(file);
    let mut text = serde_json::to_string_pretty(&schema).expect("schema");
    text.push('\n');
    if std::env::var_os("TOOLSMITH_BLESS").is_some() {
        std::fs::write(&path, &text).expect("write schema");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == text,
        "{} is out of date with {source}; run TOOLSMITH_BLESS=1 cargo test -p toolsmith-train --test golden",
        path.display()
    );
}

#[test]
fn config_schemas_match_the_committed_files() {
    check("train-sft.schema.json", toolsmith_train::config::schema(), "SftConfig");
    check("train-rl.schema.json", toolsmith_train::rl::config::schema(), "RlConfig");
}
