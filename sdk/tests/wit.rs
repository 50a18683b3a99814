//! The WIT the SDK binds is a copy inside the crate (so a packaged SDK builds on its own); it must
//! stay the workspace's `schemas/wit`, which the host binds.

use std::path::Path;

#[test]
fn the_sdk_binds_the_workspace_wit() {
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |path: &Path| std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let ours = read(&sdk.join("wit/tool.wit"));
    let workspace = read(&sdk.join("../schemas/wit/tool.wit"));
    assert!(
        ours == workspace,
        "sdk/wit/tool.wit differs from schemas/wit/tool.wit: copy schemas/wit/tool.wit to sdk/wit/ \
         (and bump the WIT package version and the SDK's CHANGELOG if the contract changed)"
    );
    let entries = |dir: &Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect();
        names.sort();
        names
    };
    assert_eq!(entries(&sdk.join("wit")), entries(&sdk.join("../schemas/wit")), "the two WIT folders hold other files");
}

#[test]
fn the_wit_package_carries_the_sdk_version() {
    let wit = include_str!("../wit/tool.wit");
    let line = wit.lines().find(|l| l.starts_with("package ")).expect("a package line");
    // Before 1.0 a minor version is a breaking one, so the WIT's major.minor follows the crate's.
    let crate_minor = env!("CARGO_PKG_VERSION").rsplit_once('.').map(|(m, _)| m).unwrap_or_default();
    assert!(line.contains(&format!("@{crate_minor}.")), "{line} does not carry version {crate_minor}.x");
}
