//! Helpers shared by the binary's end-to-end tests.
#![allow(dead_code)]

use std::process::Output;

/// Asserts the command succeeded and returns its stdout, showing both streams when it did not.
pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
