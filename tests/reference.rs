//! The docs book's reference pages are the output of `toolsmith reference PAGE`: each is drawn
//! from the code (the error kinds, the command tree, the config schemas), and this test fails when
//! a committed page falls behind. `TOOLSMITH_BLESS=1 cargo test --test reference` rewrites them.

use std::path::Path;
use std::process::Command;

fn page(name: &str) -> String {
    let output =
        Command::new(env!("CARGO_BIN_EXE_toolsmith")).args(["reference", name]).output().expect("run toolsmith");
    assert!(output.status.success(), "toolsmith reference {name}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("UTF-8")
}

fn check(name: &str) -> String {
    let text = page(name);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/reference").join(format!("{name}.md"));
    if std::env::var_os("TOOLSMITH_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("create docs/reference");
        std::fs::write(&path, &text).expect("write the page");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == text,
        "{} is out of date with the code; run TOOLSMITH_BLESS=1 cargo test --test reference",
        path.display()
    );
    text
}

#[test]
fn the_errors_page_lists_every_kind_with_its_description_and_fault() {
    let text = check("errors");
    for kind in toolsmith_contract::ErrorKind::ALL {
        let row = text
            .lines()
            .find(|l| l.starts_with(&format!("| `{kind}` |")))
            .unwrap_or_else(|| panic!("no row for {kind}"));
        let fault = if kind.is_callers() { "the caller's" } else { "the tool's" };
        assert!(row.contains(fault), "{row}");
    }
    assert!(text.contains("| `pointer` |"), "the structured error's fields are listed");
}

#[test]
fn the_cli_page_has_a_section_for_every_subcommand() {
    let text = check("cli");
    for section in
        ["## `toolsmith call`", "## `toolsmith tools search`", "## `toolsmith train rl`", "## `toolsmith plugin new`"]
    {
        assert!(text.contains(section), "missing {section}");
    }
    assert!(!text.contains("## `toolsmith reference`"), "the hidden command stays off the page");
}

#[test]
fn the_config_page_lists_the_shared_run_settings_in_both_trainers() {
    let text = check("config");
    let sft = text.split("## `train rl` config").next().expect("sft part");
    let rl = text.split("## `train rl` config").nth(1).expect("rl part");
    for key in ["| `init` |", "| `device` |", "| `precision` |", "| `lora.rank` |"] {
        assert!(sft.contains(key) && rl.contains(key), "{key} in both");
    }
    assert!(sft.contains("| `data.worlds.seeds` |"), "nested keys are dotted");
}
