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
fn a_component_reading_files_sees_only_a_granted_directory_read_only() {
    use toolsmith_contract::capabilities::{DirGrant, Grants};
    let tool = toolbox().load_component(&programs::read(programs::FS_IMPORT)).expect("loads");
    assert!(tool.component().is_some_and(|c| c.imports.iter().any(|i| i.starts_with("wasi:filesystem/"))));
    let call = |tool: &toolsmith_sandbox::Tool, args: serde_json::Value| {
        toolbox().call_tool(tool, &args, toolsmith_sandbox::Limits::default())
    };
    let e = call(&tool, serde_json::json!({"path": "/etc/passwd"})).expect_err("nothing granted");
    assert_eq!(e.code.as_deref(), Some("io_error"), "{e:?}");

    let root = tempfile::tempdir().expect("tempdir");
    let docs = root.path().join("docs");
    std::fs::create_dir(&docs).expect("mkdir");
    std::fs::write(docs.join("a.txt"), "inside").expect("write");
    std::fs::write(root.path().join("secret.txt"), "outside").expect("write");
    std::os::unix::fs::symlink(root.path().join("secret.txt"), docs.join("link.txt")).expect("symlink");
    let path = std::fs::canonicalize(&docs).expect("canonical");
    let granted = tool.with_grants(Grants { dirs: vec![DirGrant { name: "docs".into(), path }], ..Grants::default() });
    let out = call(&granted, serde_json::json!({"path": "/dirs/docs/a.txt"})).expect("granted");
    assert_eq!(out.value["text"], "inside");
    for escape in ["/dirs/docs/../secret.txt", "/dirs/docs/link.txt", "/dirs/docs/../../etc/passwd", "/etc/passwd"] {
        let e = call(&granted, serde_json::json!({"path": escape})).expect_err(escape);
        assert_eq!(e.code.as_deref(), Some("io_error"), "{escape}: {e:?}");
    }
    let e = call(&granted, serde_json::json!({"path": "/dirs/docs/new.txt", "write": true})).expect_err("read-only");
    assert_eq!(e.code.as_deref(), Some("io_error"), "{e:?}");
    assert!(!docs.join("new.txt").exists());
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
