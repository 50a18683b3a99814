//! `toolsmith plugin new | build | inspect`: the tool author's workflow.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};
use toolsmith_contract::ToolName;
use toolsmith_sandbox::Toolbox;

use super::Env;

#[derive(Debug, clap::Subcommand)]
pub enum PluginCommand {
    /// Scaffold a new plugin crate that builds as-is, anywhere (see --sdk-source).
    New {
        /// The tool's name (snake_case); also the crate's name.
        name: String,
        /// Where to create it [default: ./NAME].
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Where the project gets toolsmith-sdk from. `auto`: the enclosing checkout's sdk/ when
        /// the project is inside one, else the copy an install ships, else the checkout this
        /// binary was built from.
        #[arg(long, value_enum, default_value = "auto")]
        sdk_source: SdkSource,
        /// Depend on the SDK at this path (a checkout's sdk/ or an installed copy); implies
        /// `--sdk-source path`.
        #[arg(long, env = "TOOLSMITH_SDK_PATH")]
        sdk: Option<PathBuf>,
        /// The repository for `--sdk-source git` (tag `vVERSION`).
        #[arg(long, default_value = env!("CARGO_PKG_REPOSITORY"))]
        sdk_git: String,
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

/// Where a generated plugin project takes `toolsmith-sdk` from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SdkSource {
    /// The first that exists: an enclosing checkout, the installed copy, this binary's checkout.
    Auto,
    /// The copy `scripts/install.sh` puts in the data directory (DATA/sdk/toolsmith-sdk-VERSION).
    Installed,
    /// The sdk/ of the checkout this binary was built from.
    Checkout,
    /// A path given with `--sdk`.
    Path,
    /// A git dependency on the repository (`--sdk-git`) at tag vVERSION.
    Git,
    /// The crates.io release of this version.
    CratesIo,
}

/// The language of a plugin project.
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
        PluginCommand::New { name, dir, sdk_source, sdk, sdk_git, lang } => {
            let dir = dir.unwrap_or_else(|| PathBuf::from(&name));
            match lang {
                Lang::Rust => {
                    let source = if sdk.is_some() { SdkSource::Path } else { sdk_source };
                    let dependency = sdk_dependency(source, sdk.as_deref(), &sdk_git, &dir)?;
                    scaffold(&name, &dir, &dependency)?;
                    println!("created plugin `{name}` in {} (toolsmith-sdk from {})", dir.display(), dependency.from);
                }
                Lang::Python => {
                    super::plugin_python::scaffold(&name, &dir)?;
                    println!("created plugin `{name}` in {} (Python)", dir.display());
                }
            }
            println!("next: toolsmith plugin build {}", dir.display());
            Ok(ExitCode::SUCCESS)
        }
        PluginCommand::Build { dir, target_dir } => {
            let python = super::plugin_python::is_python_project(&dir);
            let (component, source) = if python {
                (
                    super::plugin_python::build(&dir, target_dir.as_deref())?,
                    dir.join(super::plugin_python::PROJECT_FILE),
                )
            } else {
                (build(&dir, target_dir.as_deref())?, dir.join("src/lib.rs"))
            };
            let toolbox = Toolbox::new(env.sandbox()?);
            let bytes = std::fs::read(&component)?;
            let tool = toolbox.load_component(&bytes).with_context(|| {
                // Name the source the author edits, not only the artifact.
                format!("{}: the component built from it ({}) is refused", source.display(), component.display())
            })?;
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
pub fn checkout_sdk() -> Option<PathBuf> {
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk");
    sdk.join("Cargo.toml").is_file().then_some(sdk)
}

/// The SDK and contract sources `scripts/install.sh` put in the data directory `data`, if there.
pub fn installed_sdk(data: &Path) -> Option<(PathBuf, PathBuf)> {
    let version = env!("CARGO_PKG_VERSION");
    let sdk = data.join(format!("sdk/toolsmith-sdk-{version}"));
    let contract = data.join(format!("sdk/toolsmith-contract-{version}"));
    (sdk.join("Cargo.toml").is_file() && contract.join("Cargo.toml").is_file()).then_some((sdk, contract))
}

/// The sdk/ of a toolsmith checkout that encloses `dir` (a project generated inside a checkout
/// follows that checkout's SDK, whichever binary generated it).
fn enclosing_checkout_sdk(dir: &Path) -> Option<PathBuf> {
    let dir = std::path::absolute(dir).ok()?;
    dir.ancestors().map(|a| a.join("sdk")).find(|sdk| {
        std::fs::read_to_string(sdk.join("Cargo.toml")).is_ok_and(|t| t.contains("name = \"toolsmith-sdk\""))
            && sdk.join("../schemas/wit").is_dir()
    })
}

/// The `toolsmith-sdk` line of a generated Cargo.toml, and where it points, in words.
#[derive(Debug)]
struct SdkDependency {
    line: String,
    from: String,
}

fn path_dependency(sdk: &Path, from: &str) -> Result<SdkDependency> {
    let sdk = std::fs::canonicalize(sdk).with_context(|| format!("no SDK at {}", sdk.display()))?;
    if !sdk.join("Cargo.toml").is_file() {
        bail!("{} is not the toolsmith-sdk crate (no Cargo.toml)", sdk.display());
    }
    // Debug formatting quotes and escapes the path as a TOML basic string would.
    Ok(SdkDependency {
        line: format!("toolsmith-sdk = {{ path = {:?} }}", sdk.display().to_string()),
        from: format!("{from} {}", sdk.display()),
    })
}

fn sdk_dependency(source: SdkSource, sdk: Option<&Path>, git: &str, dir: &Path) -> Result<SdkDependency> {
    let version = env!("CARGO_PKG_VERSION");
    let (data, _) = super::data_dir();
    let installed = || installed_sdk(&data).map(|(sdk, _)| sdk);
    match source {
        SdkSource::Path => path_dependency(sdk.context("--sdk-source path needs --sdk PATH")?, "the path"),
        SdkSource::Installed => path_dependency(
            &installed().with_context(|| {
                format!(
                    "no installed SDK in {}: run ./scripts/install.sh from a checkout, or use --sdk-source git",
                    data.display()
                )
            })?,
            "the installed copy",
        ),
        SdkSource::Checkout => path_dependency(
            &checkout_sdk()
                .context("the checkout this binary was built from is gone; use --sdk-source installed or git")?,
            "the checkout",
        ),
        SdkSource::Git => Ok(SdkDependency {
            line: format!("toolsmith-sdk = {{ git = {git:?}, tag = \"v{version}\" }}"),
            from: format!("{git} at v{version}"),
        }),
        SdkSource::CratesIo => {
            Ok(SdkDependency { line: format!("toolsmith-sdk = \"{version}\""), from: "crates.io".to_owned() })
        }
        SdkSource::Auto => {
            if let Some(sdk) = enclosing_checkout_sdk(dir) {
                path_dependency(&sdk, "the enclosing checkout")
            } else if let Some(sdk) = installed() {
                path_dependency(&sdk, "the installed copy")
            } else if let Some(sdk) = checkout_sdk() {
                path_dependency(&sdk, "the checkout")
            } else {
                bail!(
                    "no toolsmith-sdk sources here: run ./scripts/install.sh from a checkout, or pass \
                     --sdk-source git (or --sdk PATH)"
                )
            }
        }
    }
}

fn scaffold(name: &str, dir: &Path, sdk: &SdkDependency) -> Result<()> {
    ToolName::new(name)?;
    if dir.exists() && dir.read_dir()?.next().is_some() {
        bail!("{} exists and is not empty", dir.display());
    }
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
{sdk}
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
        sdk = sdk.line
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
    std::fs::write(
        dir.join("README.md"),
        format!(
            "# {name}\n\nA Toolsmith tool. `cargo test` runs its examples natively; `toolsmith plugin build .` \
             makes the component; `toolsmith tools add target/wasm32-wasip2/release/{name}.wasm` puts it \
             in the tool graph that `toolsmith serve` serves.\n"
        ),
    )?;
    lock(dir);
    Ok(())
}

/// Pins the project's dependencies in a Cargo.lock, so its first build is reproducible. Needs the
/// crates.io index (or its local cache); without it the project still builds and locks later.
fn lock(dir: &Path) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo).arg("generate-lockfile").arg("--manifest-path").arg(dir.join("Cargo.toml")).output();
    match out {
        Ok(out) if out.status.success() => {}
        Ok(out) => eprintln!(
            "warning: no Cargo.lock yet (cargo generate-lockfile failed: {}); the first build writes one",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => eprintln!("warning: no Cargo.lock yet (cannot run cargo: {e}); the first build writes one"),
    }
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
