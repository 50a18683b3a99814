//! The plugins that ship with Toolsmith, compiled from `plugins/` by this crate's build script and
//! embedded, so the `toolsmith` binary can run them anywhere without files beside it.

/// One bundled plugin component.
#[derive(Debug, Clone, Copy)]
pub struct Bundled {
    /// The tool's name (also its Cargo package name).
    pub name: &'static str,
    /// The WebAssembly component.
    pub component: &'static [u8],
}

include!(concat!(env!("OUT_DIR"), "/bundled.rs"));

/// The bundled plugin called `name`.
pub fn get(name: &str) -> Option<&'static Bundled> {
    BUNDLED.iter().find(|b| b.name == name)
}
