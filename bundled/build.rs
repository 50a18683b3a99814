//! Builds the bundled plugins (`plugins/`) from source and embeds the components.

use std::fmt::Write;

const PLUGINS: &[&str] = &["calculator", "text", "units", "json_query"];

fn main() {
    // Read when the script runs, not baked in when it compiles: a target directory shared by
    // checkouts at different paths reuses the compiled script.
    let manifest_dir = std::path::PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let root = manifest_dir.join("..");
    let guests = toolsmith_build::build_guests(
        &root.join("plugins"),
        PLUGINS,
        &[&root.join("sdk"), &root.join("contract"), &root.join("schemas/wit")],
    );
    let mut src = String::from("/// Every bundled plugin, in a fixed order.\npub static BUNDLED: &[Bundled] = &[\n");
    for guest in guests {
        writeln!(
            src,
            "    Bundled {{ name: {:?}, component: include_bytes!({:?}) }},",
            guest.package,
            guest.path.display().to_string()
        )
        .expect("write to string");
    }
    src.push_str("];\n");
    toolsmith_build::write_out("bundled.rs", &src);
}
