//! Guest programs for tests, built from source (`guests/`) by this crate's build script:
//! - [`HOSTILE`]: misbehaves as its `mode` argument says (loops, hoards memory, panics, returns
//!   invalid or oversized output, recurses through `call-tool`, floods its logs).
//! - [`BAD_MANIFEST`]: declares a manifest that does not validate.
//! - [`FS_IMPORT`]: reads (or writes) the file its `path` argument names through `wasi:filesystem`,
//!   which holds only the directories an operator granted.
#![warn(missing_docs)]

include!(concat!(env!("OUT_DIR"), "/programs.rs"));

/// Reads the component at one of this crate's paths; a test fails at once, naming the path, when
/// the build left it missing.
pub fn read(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("cannot read test component {path}: {e}"))
}
