//! Builds the bundled plugins (`plugins/`) from source and embeds the components.

use std::fmt::Write;
use std::path::Path;

const PLUGINS: &[&str] = &["calculator", "text", "units", "json_query"];

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
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
