//! Loading: bad files are refused with clear errors, imports are checked, artifacts are cached.

use toolsmith_sandbox::sandbox::CacheOutcome;
use toolsmith_sandbox::{ErrorKind, LoadError, Sandbox, SandboxConfig, Toolbox};
use toolsmith_test_programs as programs;

use crate::toolbox;

#[test]
fn random_bytes_are_not_wasm() {
    let bytes: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
    let e = toolbox().load_component(&bytes).expect_err("garbage");
    assert!(matches!(e, LoadError::NotWasm), "{e}");
    assert_eq!(e.to_structured("x").kind, ErrorKind::InvalidComponent);
}

#[test]
fn core_modules_are_refused_with_a_hint() {
    let module = b"\0asm\x01\0\0\0";
    let e = toolbox().load_component(module).expect_err("core module");
    assert!(matches!(e, LoadError::NotAComponent), "{e}");
    assert!(e.to_string().contains("wasm32-wasip2"));
}

#[test]
fn truncated_components_fail_to_compile() {
    let bytes = programs::read(programs::HOSTILE);
    let e = toolbox().load_component(&bytes[..bytes.len() / 2]).expect_err("truncated");
    assert!(matches!(e, LoadError::Compile(_)), "{e}");
}

#[test]
fn components_importing_the_filesystem_are_refused_at_load() {
    let e = toolbox().load_component(&programs::read(programs::FS_IMPORT)).expect_err("fs import");
    match &e {
        LoadError::DisallowedImport { import } => assert!(import.starts_with("wasi:filesystem/"), "{import}"),
        other => panic!("expected DisallowedImport, got {other}"),
    }
    assert!(e.to_string().contains("does not provide"));
}

#[test]
fn invalid_manifests_are_refused_at_load() {
    let e = toolbox().load_component(&programs::read(programs::BAD_MANIFEST)).expect_err("bad manifest");
    assert!(matches!(e, LoadError::Manifest(_)), "{e}");
    assert!(e.to_string().contains("snake_case"), "{e}");
}

#[test]
fn sdk_components_import_only_the_documented_interfaces() {
    for tool in toolbox().tools() {
        let component = tool.component().expect("plugin");
        for import in &component.imports {
            let interface = import.split('@').next().unwrap_or_default();
            assert!(toolsmith_sandbox::sandbox::ALLOWED_INTERFACES.contains(&interface), "{import}");
            assert!(!interface.starts_with("wasi:filesystem") && !interface.starts_with("wasi:sockets"));
        }
    }
}

#[test]
fn precompiled_artifacts_are_cached_and_corrupt_ones_replaced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = SandboxConfig { cache_dir: Some(dir.path().to_owned()), ..SandboxConfig::default() };
    let sandbox = Sandbox::new(config).expect("sandbox");
    let bytes = toolsmith_bundled::get("units").expect("units").component;
    assert_eq!(sandbox.load(bytes).expect("first load").cache, CacheOutcome::Compiled);
    assert_eq!(sandbox.load(bytes).expect("second load").cache, CacheOutcome::Hit);
    // Corrupt every artifact: the next load notices, recompiles and still works.
    for entry in std::fs::read_dir(dir.path()).expect("read cache") {
        std::fs::write(entry.expect("entry").path(), b"garbage").expect("corrupt");
    }
    assert_eq!(sandbox.load(bytes).expect("after corruption").cache, CacheOutcome::Compiled);
    let toolbox = Toolbox::new(sandbox);
    toolbox.add_component(bytes).expect("loads");
    let out = toolbox
        .call("units", &serde_json::json!({"value": 1, "from": "km", "to": "m"}), Default::default())
        .expect("call");
    assert_eq!(out.value["value"], 1000.0);
}

#[test]
fn a_full_instance_pool_is_busy_not_a_trap() {
    // One instance: a tool that composes another needs two at once.
    let config = SandboxConfig { max_instances: 1, cache_dir: Some(crate::cache_dir()), ..SandboxConfig::default() };
    let toolbox = Toolbox::new(Sandbox::new(config).expect("sandbox"));
    toolbox.add_component(toolsmith_bundled::get("calculator").expect("calculator").component).expect("load");
    toolbox.add_component(&programs::read(programs::HOSTILE)).expect("load");
    let e = toolbox
        .call("hostile", &serde_json::json!({"mode": "compose"}), Default::default())
        .expect_err("the nested call cannot get an instance");
    assert_eq!(e.code.as_deref(), Some("busy"), "{e}");
    // Alone, each call still fits.
    let out =
        toolbox.call("calculator", &serde_json::json!({"expression": "1 + 1"}), Default::default()).expect("fits");
    assert_eq!(out.value["value"], 2.0);
}
