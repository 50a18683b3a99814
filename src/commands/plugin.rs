//! `toolsmith plugin new | build | inspect`: the tool author's workflow.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};
use toolsmith_contract::ToolName;
use toolsmith_sandbox::Toolbox;

use super::Env;

#[derive(Debug, clap::Subcommand)]
pub enum PluginCommand {
    /// Scaffold a new plugin crate that builds as-is.
    New {
        /// The tool's name (snake_case); also the crate's name.
        name: String,
        /// Where to create it [default: ./NAME].
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Path of the toolsmith-sdk crate to depend on [default: the SDK this binary was built
        /// from, or $TOOLSMITH_SDK_PATH].
        #[arg(long, env = "TOOLSMITH_SDK_PATH")]
        sdk: Option<PathBuf>,
        /// The plugin's language: a Rust crate, or a Python project built with componentize-py
        /// (docs/guide/writing-a-plugin.md#python-plugins).
        #[arg(long, value_enum, default_value = "rust")]
        lang: Lang,
    },
    /// Build a plugin crate into a component (cargo, release, wasm32-wasip2) and check it loads.
    Build {
        /// The plugin crate's directory.
        #[arg(default_value = ".")]
        dir: PathBuf,
        /// Cargo target directory [default: the crate's own]; for a Python project, where the
        /// component goes [default: DIR/build].
        #[arg(long)]
        target_dir: Option<PathBuf>,
    },
    /// Print a component's manifest.
    Inspect {
        /// The component file.
        file: PathBuf,
        /// Print it as an MCP tool or an OpenAI function definition instead.
        #[arg(long, value_enum, default_value = "manifest")]
        format: InspectFormat,
        /// Also print the interfaces the component imports (to standard error).
        #[arg(long)]
        imports: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Rust,
    Python,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum InspectFormat {
    Manifest,
    Mcp,
    Openai,
}

pub fn run(env: &Env, cmd: PluginCommand) -> Result<ExitCode> {
    match cmd {
        PluginCommand::New { name, dir, sdk, lang } => {
            let dir = dir.unwrap_or_else(|| PathBuf::from(&name));
            match lang {
                Lang::Rust => scaffold(&name, &dir, sdk)?,
                Lang::Python => super::plugin_python::scaffold(&name, &dir)?,
            }
            println!("created plugin `{name}` in {}", dir.display());
            println!("next: toolsmith plugin build {}", dir.display());
            Ok(ExitCode::SUCCESS)
        }
        PluginCommand::Build { dir, target_dir } => {
            let component = if super::plugin_python::is_python_project(&dir) {
                super::plugin_python::build(&dir, target_dir.as_deref())?
            } else {
                build(&dir, target_dir.as_deref())?
            };
            let toolbox = Toolbox::new(env.sandbox()?);
            let bytes = std::fs::read(&component)?;
            let tool = toolbox
                .load_component(&bytes)
                .with_context(|| format!("{} was built but does not load", component.display()))?;
            eprintln!(
                "built `{}` {} ({} KiB, {} examples)",
                tool.name(),
                tool.manifest.version,
                bytes.len() / 1024,
                tool.manifest.examples.len()
            );
            println!("{}", component.display());
            Ok(ExitCode::SUCCESS)
        }
        PluginCommand::Inspect { file, format, imports } => {
            let bytes = std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
            let toolbox = Toolbox::new(env.sandbox()?);
            let tool = toolbox.load_component(&bytes).with_context(|| format!("cannot load {}", file.display()))?;
            let out = match format {
                InspectFormat::Manifest => serde_json::to_value(&tool.manifest)?,
                InspectFormat::Mcp => tool.manifest.to_mcp_tool(),
                InspectFormat::Openai => tool.manifest.to_openai_function(),
            };
            if imports && let Some(component) = tool.component() {
                for import in &component.imports {
                    eprintln!("import {import}");
                }
            }
            super::print_json(&out)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The SDK this binary was built from, if its sources are still there.
fn default_sdk() -> Option<PathBuf> {
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk");
    sdk.join("Cargo.toml").is_file().then_some(sdk)
}

fn scaffold(name: &str, dir: &Path, sdk: Option<PathBuf>) -> Result<()> {
    ToolName::new(name)?;
    if dir.exists() && dir.read_dir()?.next().is_some() {
        bail!("{} exists and is not empty", dir.display());
    }
    let sdk = sdk
        .or_else(default_sdk)
        .context("cannot find the toolsmith-sdk sources; pass --sdk PATH (the sdk/ folder of a toolsmith checkout)")?;
    let sdk = std::fs::canonicalize(&sdk).with_context(|| format!("no SDK at {}", sdk.display()))?;
    std::fs::create_dir_all(dir.join("src"))?;
    let cargo_toml = format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
# cdylib: the component; rlib: native unit tests of the tool's logic.
crate-type = ["cdylib", "rlib"]

[dependencies]
toolsmith-sdk = {{ path = {sdk:?} }}
schemars = "1"
serde = {{ version = "1", features = ["derive"] }}
serde_json = "1"

[profile.release]
opt-level = 3
lto = true
strip = "debuginfo"
panic = "abort"

# A standalone crate, not part of any enclosing workspace.
[workspace]
"#,
        sdk = sdk.display().to_string()
    );
    let lib_rs = format!(
        r#"//! `{name}`: describe what the tool does here.

use schemars::JsonSchema;
use serde::{{Deserialize, Serialize}};
use toolsmith_sdk::ToolError;

/// The tool's arguments. Doc comments become descriptions in the input schema.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {{
    /// The text to analyse.
    pub text: String,
}}

/// The tool's result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Output {{
    /// Number of whitespace-separated words in `text`.
    pub words: usize,
}}

/// The tool itself: typed input in, typed output (or a ToolError) out.
pub fn run(input: Input) -> Result<Output, ToolError> {{
    Ok(Output {{ words: input.text.split_whitespace().count() }})
}}

toolsmith_sdk::tool! {{
    name: "{name}",
    description: "Counts the words in a text.",
    run: run,
    examples: [
        {{"text": "the quick brown fox"}} => {{"words": 4}},
    ],
}}

// `tool!` also generates a test that runs every example natively: `cargo test`.
"#
    );
    std::fs::write(dir.join("Cargo.toml"), cargo_toml)?;
    std::fs::write(dir.join("src/lib.rs"), lib_rs)?;
    std::fs::write(dir.join(".gitignore"), "/target\n")?;
    Ok(())
}

/// Builds the crate at `dir` for wasm32-wasip2 and returns the component's path.
pub fn build(dir: &Path, target_dir: Option<&Path>) -> Result<PathBuf> {
    let manifest = dir.join("Cargo.toml");
    if !manifest.is_file() {
        bail!("{} has no Cargo.toml", dir.display());
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let metadata = Command::new(&cargo)
        .args(["metadata", "--no-deps", "--format-version", "1", "--manifest-path"])
        .arg(&manifest)
        .output()
        .context("cannot run cargo metadata")?;
    if !metadata.status.success() {
        bail!("cargo metadata failed: {}", String::from_utf8_lossy(&metadata.stderr));
    }
    let metadata: serde_json::Value = serde_json::from_slice(&metadata.stdout)?;
    let package = metadata["packages"][0]["name"].as_str().context("no package in Cargo.toml")?.to_owned();
    let target = match target_dir {
        Some(t) => t.to_path_buf(),
        None => PathBuf::from(metadata["target_directory"].as_str().context("no target directory")?),
    };
    let status = Command::new(&cargo)
        .args(["build", "--release", "--target", "wasm32-wasip2", "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status()
        .context("cannot run cargo build")?;
    if !status.success() {
        bail!("cargo build failed (is the wasm32-wasip2 target installed? `rustup target add wasm32-wasip2`)");
    }
    let component = target.join("wasm32-wasip2/release").join(format!("{}.wasm", package.replace('-', "_")));
    if !component.is_file() {
        bail!("cargo succeeded but {} is missing (is the crate a cdylib?)", component.display());
    }
    Ok(component)
}
