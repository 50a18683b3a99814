//! Where a Toolsmith binary finds its native parts: libtorch, ONNX Runtime, the embedding model,
//! the Python guest, componentize-py, named policies and the SDK sources that `plugin new` uses.
//!
//! They live in one data directory with the layout `scripts/setup.sh` writes to a checkout's
//! `.deps/` (`libtorch/`, `onnxruntime/`, `minilm/`, `python/runner.wasm`, ...), and which
//! `scripts/install.sh` copies beside an installed binary. The first of these that applies wins:
//!
//! 1. `$TOOLSMITH_HOME`, set by the user;
//! 2. `$TOOLSMITH_DEPS`, a checkout's `.deps/` (CI and checkouts that share one target directory);
//! 3. `<prefix>/share/toolsmith` beside an installed `<prefix>/bin/toolsmith`;
//! 4. the `.deps/` of the checkout the binary was built from, while it exists;
//! 5. `$XDG_DATA_HOME/toolsmith` (by default `~/.local/share/toolsmith`).
//!
//! Reading the environment is all this does; what is missing is each part's own error, and
//! `toolsmith doctor` reports them all.

use std::path::{Path, PathBuf};

/// Why the data directory is the one it is (see the module docs for the order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HomeSource {
    /// `$TOOLSMITH_HOME`.
    HomeVar,
    /// `$TOOLSMITH_DEPS`.
    DepsVar,
    /// `share/toolsmith` beside the installed binary.
    Installed,
    /// The `.deps/` of the checkout the binary was built from.
    Checkout,
    /// The XDG data directory.
    Xdg,
}

impl HomeSource {
    /// How `toolsmith doctor` says it.
    pub fn describe(self) -> &'static str {
        match self {
            HomeSource::HomeVar => "$TOOLSMITH_HOME",
            HomeSource::DepsVar => "$TOOLSMITH_DEPS",
            HomeSource::Installed => "beside the installed binary (PREFIX/share/toolsmith)",
            HomeSource::Checkout => "the .deps/ of the checkout this binary was built from",
            HomeSource::Xdg => "the XDG data directory",
        }
    }
}

/// The data directory and why it was chosen. `checkout_deps` is the `.deps/` of the checkout the
/// caller was compiled in (each crate knows its own `CARGO_MANIFEST_DIR`).
pub fn data_dir(checkout_deps: &Path) -> (PathBuf, HomeSource) {
    let set = |name: &str| std::env::var_os(name).filter(|d| !d.is_empty()).map(PathBuf::from);
    if let Some(dir) = set("TOOLSMITH_HOME") {
        return (dir, HomeSource::HomeVar);
    }
    if let Some(dir) = set("TOOLSMITH_DEPS") {
        return (dir, HomeSource::DepsVar);
    }
    if let Some(dir) = installed_dir().filter(|d| d.is_dir()) {
        return (dir, HomeSource::Installed);
    }
    if checkout_deps.is_dir() {
        return (checkout_deps.to_path_buf(), HomeSource::Checkout);
    }
    let xdg = set("XDG_DATA_HOME")
        .or_else(|| set("HOME").map(|home| home.join(".local/share")))
        .unwrap_or_else(|| PathBuf::from(".local/share"));
    (xdg.join("toolsmith"), HomeSource::Xdg)
}

/// `<prefix>/share/toolsmith` for a binary at `<prefix>/bin/`, the layout `scripts/install.sh`
/// writes (and `cargo install --root <prefix>` places the binary in).
pub fn installed_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?;
    (bin.file_name()? == "bin").then(|| bin.parent().map(|prefix| prefix.join("share/toolsmith")))?
}
