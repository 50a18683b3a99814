//! `schemas/train-sft.schema.json` and `schemas/train-rl.schema.json` are generated from
//! [`SftConfig`] and [`RlConfig`]; this fails when they drift. Rewrite them with
//! `TOOLSMITH_BLESS=1 cargo test -p toolsmith-train --test golden`.

use std::path::Path;

fn check(file: &str, schema: serde_json::Value) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas").join(file);
    let checked =
        toolsmith_contract::schemas::check_committed(&path, &schema, "cargo test -p toolsmith-train --test golden");
    if let Err(e) = checked {
        panic!("{e}");
    }
}

#[test]
fn config_schemas_match_the_committed_files() {
    check("train-sft.schema.json", toolsmith_train::config::schema());
    check("train-rl.schema.json", toolsmith_train::rl::config::schema());
}
