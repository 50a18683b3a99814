//! Builds the guest programs in `guests/` and exposes their paths as constants.

use std::fmt::Write;
use std::path::Path;

const PROGRAMS: &[&str] = &["hostile", "bad_manifest", "fs_import"];

fn main() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = here.join("../..");
    let guests = toolsmith_build::build_guests(
        &here.join("guests"),
        PROGRAMS,
        &[&root.join("sdk"), &root.join("contract"), &root.join("schemas/wit")],
    );
    let mut src = String::new();
    for guest in guests {
        writeln!(
            src,
            "/// Path of the `{}` test component.\npub const {}: &str = {:?};",
            guest.package,
            guest.package.to_uppercase(),
            guest.path.display().to_string()
        )
        .expect("write to string");
    }
    toolsmith_build::write_out("programs.rs", &src);
}
