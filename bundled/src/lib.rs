//! The plugins that ship with Toolsmith, compiled from `plugins/` by this crate's build script and
//! embedded, so the `toolsmith` binary can run them anywhere without files beside it.
#![warn(missing_docs)]

/// A plugin compiled into the binary: what the CLI loads into a toolbox when no plugin directory
/// is given.
#[derive(Debug, Clone, Copy)]
pub struct Bundled {
    /// The tool's name (also its Cargo package name under `plugins/`).
    pub name: &'static str,
    /// The `wasm32-wasip2` component's bytes, ready for the sandbox to compile.
    pub component: &'static [u8],
}

include!(concat!(env!("OUT_DIR"), "/bundled.rs"));

/// Looks up a bundled plugin by tool name, for tests and benchmarks that need one known tool.
pub fn get(name: &str) -> Option<&'static Bundled> {
    BUNDLED.iter().chain(NEEDS_GRANTS).find(|b| b.name == name)
}
