//! Python plugins: `toolsmith plugin new NAME --lang python` and `plugin build` of such a project.
//!
//! A project is a directory with a `toolsmith.toml` that says `lang = "python"` and names the
//! module declaring the tool (`module = "tool"`). The tool is one function over typed input and
//! output, declared with the pure-Python SDK in `sdk/python/toolsmith_sdk.py` (embedded here and
//! copied into each new project, so its tests run on the host's `python3` without wasm).
//!
//! `build` runs the pinned componentize-py against `schemas/wit/tool.wit` with `--stub-wasi`: the
//! result imports only `toolsmith:tool/host`, so it loads through the same path, under the same
//! limits, as a Rust plugin. (Without the stubs CPython's runtime imports `wasi:filesystem` and
//! `wasi:sockets`, which the plugin sandbox refuses at load.) componentize-py imports the project's
//! module while it builds, so the SDK's checks (no tool, a duplicate tool, an unsupported type hint)
//! fail the build with the file and item named.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use toolsmith_contract::ToolName;
use toolsmith_sandbox::{Sandbox, SandboxConfig, Toolbox};

/// The SDK every new project gets a copy of, and the one a project without its own copy builds with.
pub const SDK_PY: &str = include_str!("../../sdk/python/toolsmith_sdk.py");
/// The component's entry module; `__TOOLSMITH_MODULE__` becomes the project's module.
const ENTRY_PY: &str = include_str!("../../sdk/python/toolsmith_component.py");
/// The contract the component implements, the same file the Rust SDK binds to.
const TOOL_WIT: &str = include_str!("../../schemas/wit/tool.wit");

/// The componentize-py release `scripts/build-python-guest.sh` pins and verifies.
pub const COMPONENTIZE_PY_VERSION: &str = "0.25.1";
/// The project file that marks a directory as a Python plugin.
pub const PROJECT_FILE: &str = "toolsmith.toml";
const ENTRY_MODULE: &str = "toolsmith_component";

/// What `toolsmith.toml` says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Project {
    lang: String,
    module: String,
}

/// Reads the subset of TOML a project file uses: comments and `key = "string"` lines. Anything
/// else is refused with its line number rather than half-understood.
fn parse_project(text: &str, file: &Path) -> Result<Project> {
    let mut lang = None;
    let mut module = None;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = || format!("{}:{}", file.display(), i + 1);
        let (key, value) = line.split_once('=').with_context(|| format!("{}: expected `key = \"value\"`", at()))?;
        let value = value.trim();
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .filter(|v| !v.contains('"') && !v.contains('\\'))
            .with_context(|| format!("{}: the value of `{}` must be a plain \"string\"", at(), key.trim()))?;
        match key.trim() {
            "lang" => lang = Some(value.to_owned()),
            "module" => module = Some(value.to_owned()),
            other => bail!("{}: unknown key `{other}` (known: lang, module)", at()),
        }
    }
    let lang = lang.with_context(|| format!("{}: no `lang = \"python\"`", file.display()))?;
    let module = module.unwrap_or_else(|| "tool".to_owned());
    let identifier = |s: &str| {
        s.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    if !module.split('.').all(identifier) {
        bail!("{}: module `{module}` is not a Python module name (e.g. `tool`)", file.display());
    }
    if [ENTRY_MODULE, "toolsmith_sdk", "wit_world", "componentize_py_types"].contains(&module.as_str()) {
        bail!("{}: module `{module}` clashes with a module of the build; rename it", file.display());
    }
    Ok(Project { lang, module })
}

fn read_project(dir: &Path) -> Result<Project> {
    let file = dir.join(PROJECT_FILE);
    let text = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
    parse_project(&text, &file)
}

/// Whether `dir` is a Python plugin project: its `toolsmith.toml` says `lang = "python"`, or is
/// malformed (so that `build` reports what is wrong with it instead of a missing Cargo.toml).
pub fn is_python_project(dir: &Path) -> bool {
    if !dir.join(PROJECT_FILE).is_file() {
        return false;
    }
    match read_project(dir) {
        Ok(project) => project.lang == "python",
        Err(_) => true,
    }
}

/// Creates a Python plugin project for the tool `name` in `dir` (which must be empty or absent).
pub fn scaffold(name: &str, dir: &Path) -> Result<()> {
    ToolName::new(name)?;
    if dir.exists() && dir.read_dir()?.next().is_some() {
        bail!("{} exists and is not empty", dir.display());
    }
    std::fs::create_dir_all(dir)?;
    let project = r#"# A Toolsmith Python plugin: `toolsmith plugin build .` makes build/NAME.wasm.
lang = "python"
# The module that declares the tool with @toolsmith_sdk.tool.
module = "tool"
"#;
    let tool_py = format!(
        r#""""`{name}`: describe what the tool does here."""

from dataclasses import dataclass, field

from toolsmith_sdk import ToolError, tool


@dataclass
class Input:
    """The tool's arguments. Field descriptions become the input schema's."""

    text: str = field(metadata={{"description": "The text to analyse.", "minLength": 1}})


@dataclass
class Output:
    """The tool's result."""

    words: int = field(metadata={{"description": "Number of whitespace-separated words in `text`."}})


@tool(
    name="{name}",
    description="Counts the words in a text.",
    examples=[(Input(text="the quick brown fox"), Output(words=4))],
)
def run(input: Input) -> Output:
    words = input.text.split()
    if not words:
        # A failure of the tool's own: the caller sees kind `tool_error` with this code.
        raise ToolError("no_words", "the text has only whitespace; pass some words")
    return Output(words=len(words))
"#
    );
    let test_py = r#""""Runs every example of the tool natively: `python3 -m unittest` (no wasm needed).

Each example's input is checked against the derived input schema, its output against the output
schema, and run(input) must return the output. The host re-checks both with a full validator.
"""

import unittest

import toolsmith_sdk

import tool  # noqa: F401  (declares the tool)


class ExamplesTest(unittest.TestCase):
    def test_examples_reproduce(self):
        toolsmith_sdk.check_examples(self)

    def test_manifest(self):
        manifest = toolsmith_sdk.the_tool().manifest()
        self.assertEqual(manifest["input_schema"]["type"], "object")
        self.assertEqual(manifest["output_schema"]["type"], "object")


if __name__ == "__main__":
    unittest.main()
"#;
    std::fs::write(dir.join(PROJECT_FILE), project)?;
    std::fs::write(dir.join("tool.py"), tool_py)?;
    std::fs::write(dir.join("test_tool.py"), test_py)?;
    std::fs::write(dir.join("toolsmith_sdk.py"), SDK_PY)?;
    std::fs::write(dir.join(".gitignore"), "/build/\n__pycache__/\n")?;
    Ok(())
}

/// Where componentize-py is: `$TOOLSMITH_COMPONENTIZE_PY`, else `componentize-py/bin/` in the data
/// directory (`toolsmith_contract::home`: an install's, or a checkout's `.deps/`), as the Python
/// guest is found.
pub fn componentize_py_path() -> PathBuf {
    std::env::var_os("TOOLSMITH_COMPONENTIZE_PY")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| super::data_dir().0.join("componentize-py/bin/componentize-py"))
}

fn componentize_py() -> Result<PathBuf> {
    let path = componentize_py_path();
    let fix = "run scripts/build-python-guest.sh in a toolsmith checkout (it installs the pinned, \
               sha-verified componentize-py into .deps/), or set TOOLSMITH_COMPONENTIZE_PY";
    if !path.is_file() {
        bail!("componentize-py is not installed ({}); {fix}", path.display());
    }
    let out = Command::new(&path)
        .arg("--version")
        .output()
        .with_context(|| format!("cannot run {}; {fix}", path.display()))?;
    let version = String::from_utf8_lossy(&out.stdout);
    if !version.contains(COMPONENTIZE_PY_VERSION) {
        bail!(
            "{} is `{}`, but Python plugins are built with componentize-py {COMPONENTIZE_PY_VERSION}; {fix}",
            path.display(),
            version.trim()
        );
    }
    Ok(path)
}

/// A scratch directory removed on drop (the binary has no tempfile dependency).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Builds the Python project at `dir` into a component and returns its path
/// (`OUT_DIR/TOOL.wasm`, by default `DIR/build/`). The caller loads it to check it.
pub fn build(dir: &Path, out_dir: Option<&Path>) -> Result<PathBuf> {
    let project = read_project(dir)?;
    if project.lang != "python" {
        bail!("{} says lang = \"{}\"; only \"python\" is built here", dir.join(PROJECT_FILE).display(), project.lang);
    }
    let module_path = project.module.replace('.', "/");
    if !dir.join(format!("{module_path}.py")).is_file() && !dir.join(&module_path).join("__init__.py").is_file() {
        bail!(
            "{}: module `{}` not found (no {module_path}.py in {})",
            dir.join(PROJECT_FILE).display(),
            project.module,
            dir.display()
        );
    }
    let tool = componentize_py()?;

    let scratch = Scratch(std::env::temp_dir().join(format!(
        "toolsmith-python-plugin-{}-{}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
    )));
    let wit = scratch.0.join("wit");
    let support = scratch.0.join("support");
    std::fs::create_dir_all(&wit)?;
    std::fs::create_dir_all(&support)?;
    std::fs::write(wit.join("tool.wit"), TOOL_WIT)?;
    std::fs::write(
        support.join(format!("{ENTRY_MODULE}.py")),
        ENTRY_PY.replace("__TOOLSMITH_MODULE__", &project.module),
    )?;
    // The project's own copy of the SDK (the one its tests ran against) wins: the project
    // directory comes first on the path. The embedded copy serves projects without one.
    std::fs::write(support.join("toolsmith_sdk.py"), SDK_PY)?;
    match std::fs::read_to_string(dir.join("toolsmith_sdk.py")) {
        Ok(own) if own != SDK_PY => eprintln!(
            "note: {} differs from this toolsmith's SDK; building with the project's copy \
             (delete it to build with toolsmith's, and copy that back in for the tests)",
            dir.join("toolsmith_sdk.py").display()
        ),
        _ => {}
    }

    let out_dir = out_dir.map(Path::to_path_buf).unwrap_or_else(|| dir.join("build"));
    std::fs::create_dir_all(&out_dir).with_context(|| format!("cannot create {}", out_dir.display()))?;
    let staged = scratch.0.join("component.wasm");
    let project_dir = std::fs::canonicalize(dir).with_context(|| format!("cannot resolve {}", dir.display()))?;
    eprintln!("building {} with componentize-py {COMPONENTIZE_PY_VERSION} (about 20 s)", dir.display());
    let out = Command::new(&tool)
        .arg("-d")
        .arg(&wit)
        .args(["-w", "tool", "componentize", "--stub-wasi", ENTRY_MODULE, "-p"])
        .arg(&project_dir)
        .arg("-p")
        .arg(&support)
        .arg("-o")
        .arg(&staged)
        // Pre-init runs in componentize-py's own directory-mounted sandbox; the project's path is
        // the first mount, which the SDK's messages strip to project-relative names.
        .current_dir(&project_dir)
        .env("RUST_BACKTRACE", "0")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .with_context(|| format!("cannot run {}", tool.display()))?;
    if !out.status.success() || !staged.is_file() {
        let all = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        // The SDK prints one line naming the file and the item; prefer it to the traceback.
        if let Some(line) = all.lines().find_map(|l| l.split_once("toolsmith: error: ").map(|(_, m)| m.trim())) {
            bail!("cannot build {}: {line}", dir.display());
        }
        let tail: Vec<&str> = all.lines().filter(|l| !l.trim().is_empty()).collect();
        let tail = tail[tail.len().saturating_sub(40)..].join("\n");
        bail!("componentize-py failed on {}:\n{tail}", dir.display());
    }
    // The file is named after the tool, which only the component knows: read its manifest the
    // way every host does. The compiled artifact is cached, so the caller's own load is quick.
    let bytes = std::fs::read(&staged)?;
    let sandbox = Sandbox::new(SandboxConfig::default()).context("cannot start the sandbox")?;
    let tool = Toolbox::new(sandbox)
        .load_component(&bytes)
        .with_context(|| format!("componentize-py built {} but it does not load", dir.display()))?;
    let name = tool.name().to_owned();
    let component = out_dir.join(format!("{name}.wasm"));
    std::fs::copy(&staged, &component).with_context(|| format!("cannot write {}", component.display()))?;
    Ok(component)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn project_files_parse_strictly() {
        let file = Path::new("toolsmith.toml");
        let p = parse_project("# c\nlang = \"python\"\nmodule = \"pkg.tool\"\n", file).expect("parses");
        assert_eq!(p, Project { lang: "python".into(), module: "pkg.tool".into() });
        assert_eq!(parse_project("lang = \"python\"", file).expect("parses").module, "tool");
        let err = |text: &str| parse_project(text, file).expect_err("refused").to_string();
        assert!(err("lang = python").contains("toolsmith.toml:1"));
        assert!(err("lang = \"python\"\nname = \"x\"").contains("unknown key `name`"));
        assert!(err("module = \"tool\"").contains("no `lang"));
        assert!(err("lang = \"python\"\nmodule = \"2x\"").contains("not a Python module name"));
        assert!(err("lang = \"python\"\nmodule = \"toolsmith_sdk\"").contains("clashes"));
    }
}
