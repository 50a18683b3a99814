//! `schemas/train-sft.schema.json` is generated from [`SftConfig`]; this fails when it drifts.
//! Rewrite it with `TOOLSMITH_BLESS=1 cargo test -p toolsmith-train --test golden`.

use std::path::Path;

#[test]
fn config_schema_matches_the_committed_file() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas/train-sft.schema.json");
    let mut text = serde_json::to_string_pretty(&toolsmith_train::config::schema()).expect("schema");
    text.push('\n');
    if std::env::var_os("TOOLSMITH_BLESS").is_some() {
        std::fs::write(&path, &text).expect("write schema");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == text,
        "{} is out of date with SftConfig; run TOOLSMITH_BLESS=1 cargo test -p toolsmith-train --test golden",
        path.display()
    );
}
