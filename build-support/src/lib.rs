//! Build-script support: compiles a guest Cargo workspace (plugins, test programs) to
//! `wasm32-wasip2` components, so no opaque `.wasm` is ever committed.
//!
//! The guests build in release mode into one shared target directory beside the host's
//! (`<target>/guests`), so the bundled plugins and the test programs reuse each other's compiled
//! dependencies and a rerun of the build script is a no-op when nothing changed.
#![warn(missing_docs)]

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The rustup target guests are built for.
pub const GUEST_TARGET: &str = "wasm32-wasip2";

/// One built guest component.
#[derive(Debug, Clone)]
pub struct Guest {
    /// The Cargo package name, e.g. `json_query`.
    pub package: String,
    /// Where the built `.wasm` component lies, for the build script to embed or expose.
    pub path: PathBuf,
}

/// Builds `packages` of the guest workspace at `workspace` and returns their components.
///
/// Call from a build script. `also_watch` lists further directories whose changes must rebuild the
/// guests (the SDK, the contract crate, the WIT files). Panics with cargo's output on failure, which
/// is how a build script fails.
pub fn build_guests(workspace: &Path, packages: &[&str], also_watch: &[&Path]) -> Vec<Guest> {
    for dir in std::iter::once(workspace).chain(also_watch.iter().copied()) {
        println!("cargo:rerun-if-changed={}", dir.display());
    }
    println!("cargo:rerun-if-env-changed=TOOLSMITH_GUEST_TARGET_DIR");
    let target_dir = guest_target_dir();
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--release")
        .arg("--target")
        .arg(GUEST_TARGET)
        .arg("--manifest-path")
        .arg(workspace.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir);
    for package in packages {
        cmd.arg("-p").arg(package);
    }
    // The outer build's flags and wrappers (clippy-driver, coverage, host RUSTFLAGS) are not meant
    // for the guests; the jobserver (CARGO_MAKEFLAGS) is kept so both builds share the cores.
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET_DIR",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_MANIFEST_DIR",
        "CARGO_MANIFEST_PATH",
    ] {
        cmd.env_remove(var);
    }
    let output = cmd.output().unwrap_or_else(|e| panic!("cannot run cargo for the guests: {e}"));
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let hint = if stderr.contains("target may not be installed") || stderr.contains("can't find crate for `core`") {
            format!(
                "\nhint: the {GUEST_TARGET} target is missing; run `rustup target add {GUEST_TARGET}` (scripts/setup.sh does)"
            )
        } else {
            String::new()
        };
        panic!("building the guests in {} failed:\n{stderr}{hint}", workspace.display());
    }
    let out = target_dir.join(GUEST_TARGET).join("release");
    packages
        .iter()
        .map(|package| {
            let path = out.join(format!("{}.wasm", package.replace('-', "_")));
            assert!(path.exists(), "cargo built {package} but {} is missing", path.display());
            Guest { package: (*package).to_owned(), path }
        })
        .collect()
}

/// `<host target dir>/guests`, derived from `OUT_DIR` (`<target>/<profile>/build/<pkg>/out`), or
/// `TOOLSMITH_GUEST_TARGET_DIR` when set.
pub fn guest_target_dir() -> PathBuf {
    if let Some(dir) = env::var_os("TOOLSMITH_GUEST_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set in build scripts"));
    out_dir.ancestors().nth(4).map(|target| target.join("guests")).unwrap_or_else(|| out_dir.join("guests"))
}

/// Writes `contents` to `OUT_DIR/name` and returns the path.
pub fn write_out(name: &str, contents: &str) -> PathBuf {
    let path = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set in build scripts")).join(name);
    std::fs::write(&path, contents).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    path
}

/// For a crate whose binaries, tests or benchmarks link libtorch (through `tch`): embeds the
/// libtorch library directory as an rpath, so they run without `LD_LIBRARY_PATH`; an installed
/// binary's own copy comes first (see `scripts/install.sh`).
///
/// The crate needs a direct `torch-sys` dependency: only direct dependents of a `links` crate see
/// its `DEP_TCH_LIBTORCH_LIB`. Link arguments apply to the crate's own targets only, which is why
/// every such crate calls this (a `RUSTFLAGS` rpath would rebuild everything and break doctests).
pub fn link_libtorch() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") else {
        println!("cargo:warning=DEP_TCH_LIBTORCH_LIB is not set: add a direct torch-sys dependency");
        return;
    };
    // First the copy `scripts/install.sh` puts beside an installed binary (PREFIX/bin/toolsmith,
    // PREFIX/share/toolsmith/libtorch), so an install outlives its checkout; then this build's own.
    println!("cargo:rustc-link-arg=-Wl,-rpath,$ORIGIN/../share/toolsmith/libtorch/lib");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    // rustc links with --as-needed, which drops libtorch_cuda (nothing references it by symbol)
    // and with it CUDA support; keep it whenever this libtorch has one.
    if Path::new(&lib).join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
    }
}
