//! `toolsmith doctor`: what this binary found of its native parts, what is missing, and the
//! command that fixes each.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::Result;
use serde::Serialize;
use toolsmith_contract::home::HomeSource;
use toolsmith_registry::{ModelFiles, Registry};

use super::{Env, plugin};

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// One part and where it was found.
#[derive(Debug, Serialize)]
struct Part {
    name: &'static str,
    /// What needs it.
    for_: &'static str,
    /// Without it those commands fail (the rest degrade or are optional).
    required: bool,
    found: bool,
    path: Option<PathBuf>,
    /// The command that puts it in place, when missing.
    #[serde(skip_serializing_if = "Option::is_none")]
    fix: Option<String>,
}

#[derive(Debug, Serialize)]
struct Report {
    version: &'static str,
    data_dir: PathBuf,
    data_dir_source: &'static str,
    registry: PathBuf,
    parts: Vec<Part>,
}

pub fn run(env: &Env, args: DoctorArgs) -> Result<ExitCode> {
    let (data, source) = super::data_dir();
    // In a checkout setup fetches the parts; an install copies them from one.
    let fetch = match source {
        HomeSource::Checkout | HomeSource::DepsVar => "./scripts/setup.sh (in the checkout)".to_owned(),
        _ => format!(
            "./scripts/setup.sh && ./scripts/install.sh (in a checkout), or set TOOLSMITH_HOME; data dir {}",
            data.display()
        ),
    };
    let files = ModelFiles::locate();
    let part = |name, for_, required, path: Option<PathBuf>, fix: &str| {
        let found = path.as_deref().is_some_and(Path::exists);
        Part { name, for_, required, found, path, fix: (!found).then(|| fix.to_owned()) }
    };
    let sdk = plugin::installed_sdk(&data).map(|(sdk, _)| sdk).or_else(plugin::checkout_sdk);
    let parts = vec![
        // The dynamic loader found it, or this process would not be running; say which copy.
        part("libtorch", "the policy, training", true, loaded_library("libtorch_cpu.so"), &fetch),
        part("onnxruntime", "tools search, tools add, serve", true, Some(files.onnxruntime.clone()), &fetch),
        part(
            "embedding model",
            "tools search, tools add, serve",
            true,
            Some(files.model_dir.join("model.onnx")),
            &fetch,
        ),
        part(
            "python guest",
            "create, python, agent-written tools",
            true,
            Some(toolsmith_sandbox::python::default_guest_path()),
            &fetch,
        ),
        part(
            "smollm2-135m",
            "train --preset smol-*, --policy smollm2-135m",
            false,
            Some(data.join("smollm2-135m-instruct/config.json")),
            &fetch,
        ),
        part(
            "componentize-py",
            "plugin build of Python plugins",
            false,
            Some(super::plugin_python::componentize_py_path()),
            &fetch,
        ),
        part(
            "toolsmith-sdk",
            "plugin new",
            false,
            sdk,
            "./scripts/install.sh (copies the SDK), or plugin new --sdk-source git",
        ),
        part("cargo", "plugin build", false, which("cargo"), "install Rust with rustup: https://rustup.rs"),
        part("wasm32-wasip2", "plugin build", false, wasm_target(), "rustup target add wasm32-wasip2"),
    ];
    let report = Report {
        version: env!("CARGO_PKG_VERSION"),
        data_dir: data,
        data_dir_source: source.describe(),
        registry: env.registry.clone().unwrap_or_else(Registry::default_path),
        parts,
    };
    let healthy = report.parts.iter().all(|p| p.found || !p.required);
    if args.json {
        super::print_json(&report)?;
    } else {
        println!("toolsmith {}", report.version);
        println!("data dir  {} ({})", report.data_dir.display(), report.data_dir_source);
        println!("registry  {}", report.registry.display());
        for p in &report.parts {
            let status = match (p.found, p.required) {
                (true, _) => "ok",
                (false, true) => "MISSING",
                (false, false) => "absent",
            };
            let path = p.path.as_deref().map(|p| p.display().to_string()).unwrap_or_else(|| "-".into());
            println!("{status:<8} {:<16} {path}", p.name);
            if let Some(fix) = &p.fix {
                println!("         {:<16} needed by: {}; fix: {fix}", "", p.for_);
            }
        }
    }
    Ok(if healthy { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// The file a shared library of this process was loaded from (Linux: `/proc/self/maps`).
fn loaded_library(name: &str) -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| Path::new(path).file_name().is_some_and(|f| f == name))
        .map(PathBuf::from)
}

/// `name` on `PATH`.
fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| p.is_file())
}

/// The standard library for wasm32-wasip2 in the active toolchain's sysroot.
fn wasm_target() -> Option<PathBuf> {
    let out = Command::new("rustc").args(["--print", "sysroot"]).output().ok()?;
    let sysroot = String::from_utf8(out.stdout).ok().filter(|s| out.status.success() && !s.trim().is_empty())?;
    Some(Path::new(sysroot.trim()).join("lib/rustlib/wasm32-wasip2"))
}
