//! Builds the guest programs in `guests/` and exposes their paths as constants.

use std::fmt::Write;

const PROGRAMS: &[&str] = &["hostile", "bad_manifest", "fs_import"];

fn main() {
    // Read when the script runs, not baked in when it compiles (see bundled/build.rs).
    let manifest_dir = std::path::PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let here = manifest_dir.as_path();
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
