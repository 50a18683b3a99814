//! Builds the bundled plugins (`plugins/`) from source and embeds the components.

use std::fmt::Write;

const PLUGINS: &[&str] = &["calculator", "text", "units", "json_query", "http_get"];
/// Plugins that reach outside the sandbox once an operator grants them: shipped, registered in a
/// new registry, but not in the default in-process toolbox (which has no grants to give).
const NEEDS_GRANTS: &[&str] = &["http_get"];

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
    let mut src = String::new();
    for (doc, name, wanted) in [
        ("Every pure bundled plugin, in a fixed order.", "BUNDLED", false),
        ("The bundled plugins that need an operator's grants (`toolsmith tools grant`).", "NEEDS_GRANTS", true),
    ] {
        writeln!(src, "/// {doc}\npub static {name}: &[Bundled] = &[").expect("write to string");
        for guest in guests.iter().filter(|g| NEEDS_GRANTS.contains(&g.package.as_str()) == wanted) {
            writeln!(
                src,
                "    Bundled {{ name: {:?}, component: include_bytes!({:?}) }},",
                guest.package,
                guest.path.display().to_string()
            )
            .expect("write to string");
        }
        src.push_str("];\n");
    }
    toolsmith_build::write_out("bundled.rs", &src);
}
