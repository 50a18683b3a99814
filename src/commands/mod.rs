//! One module per subcommand.

pub mod call;
pub mod plugin;
pub mod quickstart;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use toolsmith_host::{Sandbox, SandboxConfig, Tool, Toolbox};

/// Global options every command shares.
#[derive(Debug)]
pub struct Env {
    pub cache_dir: Option<PathBuf>,
    pub no_cache: bool,
}

impl Env {
    pub fn sandbox(&self) -> Result<Sandbox> {
        let mut config = SandboxConfig::default();
        if self.no_cache {
            config.cache_dir = None;
        } else if let Some(dir) = &self.cache_dir {
            config.cache_dir = Some(dir.clone());
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
    println!("{}", serde_json::to_string_pretty(&schema)?);
    Ok(ExitCode::SUCCESS)
}
