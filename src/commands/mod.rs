//! One module per subcommand.

pub mod agent;
pub mod call;
pub mod create;
pub mod doctor;
pub mod env;
pub mod jobs;
pub mod plugin;
pub mod plugin_python;
pub mod policy;
pub mod python;
pub mod quickstart;
pub mod reference;
pub mod serve;
pub mod tools;
pub mod train;
pub mod train_tools;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use toolsmith_registry::{NewTool, Registry};
use toolsmith_sandbox::python::{PythonRuntime, default_guest_path};
use toolsmith_sandbox::{Sandbox, SandboxConfig, Tool, Toolbox};

/// The data directory this binary takes its native parts from, and why (see
/// [`toolsmith_contract::home`]; the fallback is the `.deps/` of the checkout it was built from).
pub fn data_dir() -> (PathBuf, toolsmith_contract::home::HomeSource) {
    toolsmith_contract::home::data_dir(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".deps"))
}

/// Global options every command shares.
#[derive(Debug)]
pub struct Env {
    pub cache_dir: Option<PathBuf>,
    pub no_cache: bool,
    pub registry: Option<PathBuf>,
}

impl Env {
    /// Where the quickstart keeps its tiny policy checkpoint (beside the component cache).
    pub fn policy_dir(&self) -> PathBuf {
        let cache = self.cache_dir.clone().or_else(|| dirs::cache_dir().map(|d| d.join("toolsmith")));
        cache.unwrap_or_else(std::env::temp_dir).join("policy-tiny")
    }

    pub fn sandbox(&self) -> Result<Sandbox> {
        let mut config = SandboxConfig::default();
        if self.no_cache {
            config.cache_dir = None;
        } else if let Some(dir) = &self.cache_dir {
            config.cache_dir = Some(dir.clone());
        }
        // An operator's internal CA for granted tools' HTTPS, replacing the built-in roots.
        if let Some(path) = std::env::var_os("TOOLSMITH_HTTP_CA").filter(|p| !p.is_empty()) {
            let pem = std::fs::read(&path)
                .with_context(|| format!("cannot read $TOOLSMITH_HTTP_CA ({})", PathBuf::from(&path).display()))?;
            config.http_ca_pem = Some(pem);
        }
        Sandbox::new(config).context("cannot start the sandbox")
    }

    /// A toolbox with every bundled plugin registered.
    pub fn toolbox(&self) -> Result<Toolbox> {
        let toolbox = Toolbox::new(self.sandbox()?);
        for bundled in toolsmith_bundled::BUNDLED {
            load_bundled(&toolbox, bundled)?;
        }
        Ok(toolbox)
    }

    /// The registry (`--registry`, `$TOOLSMITH_REGISTRY` or the default), seeded with the
    /// bundled tools the first time.
    pub fn registry(&self) -> Result<Registry> {
        let path = self.registry.clone().unwrap_or_else(Registry::default_path);
        let mut registry =
            Registry::open(&path).with_context(|| format!("cannot open the registry {}", path.display()))?;
        if registry.meta("seeded")?.is_none() {
            let bar = tools::spinner("registering the bundled tools");
            let toolbox = Toolbox::new(self.sandbox()?);
            let mut tools = Vec::new();
            for bundled in toolsmith_bundled::BUNDLED.iter().chain(toolsmith_bundled::NEEDS_GRANTS) {
                let tool = load_bundled(&toolbox, bundled)?;
                tools.push(NewTool::new(tool.manifest.clone()).with_blob(bundled.component.to_vec()));
            }
            registry.register_many(tools, true).context("cannot register the bundled tools")?;
            registry.set_meta("seeded", "bundled")?;
            bar.finish_and_clear();
        }
        Ok(registry)
    }

    /// [`Env::toolbox`] with the Python runtime loaded (an error when the guest is missing).
    pub fn toolbox_with_python(&self) -> Result<Toolbox> {
        let toolbox = self.toolbox()?;
        if toolbox.python().is_none() {
            toolbox.set_python(self.python_runtime(toolbox.sandbox())?);
        }
        Ok(toolbox)
    }

    /// [`Env::toolbox`] with the Python runtime when the guest is there; without it, a warning
    /// says `what` is unavailable and the plugins still work.
    pub fn toolbox_maybe_python(&self, what: &str) -> Result<Toolbox> {
        let toolbox = self.toolbox()?;
        match self.python_runtime(toolbox.sandbox()) {
            Ok(runtime) => toolbox.set_python(runtime),
            Err(e) => tracing::warn!("{what} unavailable: {e:#}"),
        }
        Ok(toolbox)
    }

    /// The Python guest, loaded into `sandbox`.
    pub fn python_runtime(&self, sandbox: &Sandbox) -> Result<PythonRuntime> {
        Ok(PythonRuntime::load(sandbox.clone(), &default_guest_path())?)
    }
}

pub fn load_bundled(toolbox: &Toolbox, bundled: &toolsmith_bundled::Bundled) -> Result<Arc<Tool>> {
    toolbox
        .add_component(bundled.component)
        .with_context(|| format!("cannot load the bundled plugin `{}`", bundled.name))
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum SchemaName {
    /// The tool manifest.
    Manifest,
    /// The structured error of a failed call.
    Error,
}

pub fn print_schema(which: SchemaName) -> Result<ExitCode> {
    let file = match which {
        SchemaName::Manifest => "tool-manifest.schema.json",
        SchemaName::Error => "tool-error.schema.json",
    };
    let schema = toolsmith_contract::schemas::all()
        .into_iter()
        .find(|(name, _)| *name == file)
        .map(|(_, schema)| schema)
        .context("unknown schema")?;
    print_json(&schema)?;
    Ok(ExitCode::SUCCESS)
}

/// Prints a JSON document to standard output. A closed pipe (`toolsmith ... | head`) ends the
/// process quietly instead of panicking.
pub fn print_json(value: &impl serde::Serialize) -> Result<()> {
    use std::io::Write;
    let text = serde_json::to_string_pretty(value)?;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|_| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        other => Ok(other?),
    }
}
