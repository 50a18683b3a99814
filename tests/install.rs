//! `scripts/install.sh` into a temporary prefix, then the installed binary used as a stranger
//! would: from a directory outside the checkout, with none of the checkout's variables set. A tool
//! author's plugin is generated, tested, built, added and called with the SDK the install shipped.

mod common;

use common::ok;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const CHECKOUT: &str = env!("CARGO_MANIFEST_DIR");

/// Variables through which a binary could find the checkout or a user's own state.
const SCRUBBED: &[&str] = &[
    "TOOLSMITH_DEPS",
    "TOOLSMITH_HOME",
    "TOOLSMITH_PYTHON_GUEST",
    "TOOLSMITH_EMBEDDING_MODEL",
    "TOOLSMITH_ONNXRUNTIME",
    "TOOLSMITH_SMOLLM2",
    "TOOLSMITH_SDK_PATH",
    "TOOLSMITH_REGISTRY",
    "CARGO_TARGET_DIR",
    "CARGO_MANIFEST_DIR",
    "LD_LIBRARY_PATH",
    "LIBTORCH",
];

struct Installed {
    _dir: tempfile::TempDir,
    prefix: PathBuf,
    work: PathBuf,
    xdg: PathBuf,
}

impl Installed {
    fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new(program);
        for var in SCRUBBED {
            cmd.env_remove(var);
        }
        cmd.current_dir(&self.work)
            .env("XDG_DATA_HOME", &self.xdg)
            .env("TOOLSMITH_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache"));
        cmd
    }

    fn toolsmith(&self, args: &[&str]) -> Output {
        self.command(&self.prefix.join("bin/toolsmith")).args(args).output().expect("run the installed toolsmith")
    }

    fn data(&self) -> PathBuf {
        self.prefix.join("share/toolsmith")
    }
}

fn install() -> Installed {
    let dir = tempfile::tempdir().expect("tempdir");
    let prefix = dir.path().join("prefix");
    let work = dir.path().join("work");
    let xdg = dir.path().join("xdg");
    std::fs::create_dir_all(&work).expect("mkdir");
    // The binary under test stands in for the release build; hard links keep the copy cheap.
    let out = Command::new(Path::new(CHECKOUT).join("scripts/install.sh"))
        .args(["--link", "--no-models", "--binary", env!("CARGO_BIN_EXE_toolsmith"), "--prefix"])
        .arg(&prefix)
        .output()
        .expect("run install.sh");
    ok(&out);
    Installed { _dir: dir, prefix, work, xdg }
}

fn json(out: &Output) -> Value {
    let text = ok(out);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[test]
fn the_installed_binary_works_from_any_directory() {
    let installed = install();
    let data = installed.data();

    let report = json(&installed.toolsmith(&["doctor", "--json"]));
    assert_eq!(report["data_dir"], data.to_str().expect("utf-8"), "{report:#}");
    for part in report["parts"].as_array().expect("parts") {
        if part["required"] == true {
            assert_eq!(part["found"], true, "{part}");
            let path = part["path"].as_str().expect("a path");
            // libtorch included: the rpath beside the binary wins over the build's own.
            assert!(path.starts_with(data.to_str().expect("utf-8")), "{} came from {path}", part["name"]);
        }
    }

    let out = installed.toolsmith(&["call", "calculator", "--args", r#"{"expression": "2 ^ 10 / sqrt(16)"}"#]);
    assert_eq!(json(&out), serde_json::json!({"value": 256.0}));

    let hits = ok(&installed.toolsmith(&["tools", "search", "convert a length from miles to kilometres"]));
    assert!(hits.lines().next().is_some_and(|first| first.contains("units")), "{hits}");
    // The registry is the user's, in the XDG data directory, not the install's.
    assert!(installed.xdg.join("toolsmith/registry.db").is_file());

    // doctor names what is missing and the command that fixes it.
    std::fs::remove_dir_all(data.join("minilm")).expect("remove the model");
    let out = installed.toolsmith(&["doctor"]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("MISSING  embedding model") && text.contains("./scripts/install.sh"), "{text}");
}

#[test]
fn a_plugin_builds_from_the_installed_sdk_with_no_checkout_in_sight() {
    let installed = install();
    let project = installed.work.join("word_stats");
    let out = installed.toolsmith(&["plugin", "new", "word_stats", "--dir", "word_stats"]);
    let said = ok(&out);
    assert!(said.contains("the installed copy"), "{said}");
    let cargo_toml = std::fs::read_to_string(project.join("Cargo.toml")).expect("Cargo.toml");
    let lock = std::fs::read_to_string(project.join("Cargo.lock")).expect("plugin new writes a Cargo.lock");
    let sdk = installed.data().join("sdk");
    assert!(cargo_toml.contains(sdk.to_str().expect("utf-8")), "{cargo_toml}");
    for (file, text) in [("Cargo.toml", &cargo_toml), ("Cargo.lock", &lock)] {
        assert!(!text.contains(CHECKOUT), "{file} names the checkout:\n{text}");
    }
    // The SDK that was shipped is self-contained: nothing in it points back either.
    for crate_dir in std::fs::read_dir(&sdk).expect("sdk dir") {
        let manifest = crate_dir.expect("entry").path().join("Cargo.toml");
        let text = std::fs::read_to_string(&manifest).expect("read");
        assert!(!text.contains(CHECKOUT) && !text.contains("workspace = true"), "{}", manifest.display());
    }

    // One target directory across runs of this test, so only the first compiles the SDK.
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("installed-plugin-target");
    let cargo = std::env::var_os("CARGO").map_or_else(|| PathBuf::from("cargo"), PathBuf::from);
    let cargo_test = |expect_ok: bool| {
        let out = installed
            .command(&cargo)
            .args(["test", "--quiet", "--target-dir"])
            .arg(&target)
            .current_dir(&project)
            .output()
            .expect("cargo test");
        assert_eq!(out.status.success(), expect_ok, "cargo test:\n{}", String::from_utf8_lossy(&out.stderr));
        out
    };
    cargo_test(true);
    let target_str = target.to_str().expect("utf-8");
    let project_str = project.to_str().expect("utf-8");
    let component =
        ok(&installed.toolsmith(&["plugin", "build", project_str, "--target-dir", target_str])).trim().to_owned();
    ok(&installed.toolsmith(&["tools", "add", &component]));
    let out = installed.toolsmith(&["call", "word_stats", "--args", r#"{"text": "one two three"}"#]);
    assert_eq!(json(&out), serde_json::json!({"words": 3}));

    // An example that breaks its own input schema is refused by the test, the build and the add,
    // each naming the example and the pointer.
    let lib = project.join("src/lib.rs");
    let source = std::fs::read_to_string(&lib).expect("lib.rs");
    let broken = source.replace(r#"{"text": "the quick brown fox"}"#, r#"{"text": 4}"#);
    assert_ne!(broken, source, "the scaffold's example changed shape");
    std::fs::write(&lib, broken).expect("write");
    let out = cargo_test(false);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("example 0 (input) does not match input_schema: at /text"), "{text}");
    let out = installed.toolsmith(&["plugin", "build", project_str, "--target-dir", target_str]);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("example 0 (input) does not match input_schema: at /text"), "{text}");
    // The failed build left its component where the good one was: adding it is refused too.
    let out = installed.toolsmith(&["tools", "add", &component]);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("example 0 (input) does not match input_schema: at /text"), "{text}");
}
