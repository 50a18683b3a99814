//! `toolsmith tools add` and the definition half of `tools import`: components, manifests, OpenAI
//! function lists and MCP `tools/list` results, many files or directories in one process (one
//! model load, batched embeddings, one transaction).

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use toolsmith_registry::{AddedTool, AuthorMerge, Definition, NewTool, Registered, Registry, read_definitions};
use toolsmith_sandbox::Toolbox;

use crate::commands::{Env, print_json};

/// What a directory holds that `tools add` reads; other files (READMEs, sources) are skipped.
const EXTENSIONS: [&str; 3] = ["wasm", "json", "jsonl"];

/// Registers every tool of `paths` (files, or directories searched recursively).
pub fn add(env: &Env, r: &mut Registry, paths: &[PathBuf], merge: AuthorMerge, json: bool) -> Result<()> {
    let started = Instant::now();
    let files = collect_files(paths)?;
    let definitions = read_files(env, &files)?;
    if definitions.is_empty() {
        bail!(
            "no tool definitions in {}",
            paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        );
    }
    let outcomes = register(r, definitions, merge)?;
    report(&outcomes, files.len(), started, json)
}

/// `tools import` of anything but an export: the definitions of one file (or stdin), added with
/// the default merging.
pub fn import_definitions(r: &mut Registry, label: &str, text: &str) -> Result<()> {
    let started = Instant::now();
    let definitions = read_definitions(label, text).map_err(toolsmith_registry::RegistryError::Definitions)?;
    if definitions.is_empty() {
        bail!("{label}: no tool definitions");
    }
    let outcomes = register(r, definitions, AuthorMerge::default())?;
    report(&outcomes, 1, started, false)
}

/// The text of `path`, or of stdin for `-`.
pub fn read_text(path: &Path) -> Result<String> {
    if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("cannot read stdin")?;
        return Ok(text);
    }
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

fn register(r: &mut Registry, definitions: Vec<Definition>, merge: AuthorMerge) -> Result<Vec<AddedTool>> {
    let bar = ProgressBar::new(definitions.len() as u64).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} tools embedded · {elapsed} (eta {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let outcomes = r.add_definitions(definitions, merge, &mut |done, _| bar.set_position(done as u64));
    bar.finish_and_clear();
    Ok(outcomes?)
}

/// Files named, and the tool files under directories named, each once, directories in name order.
fn collect_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            walk(path, &mut files)?;
        } else {
            files.push(path.clone());
        }
    }
    let mut seen = std::collections::HashSet::new();
    files.retain(|f| seen.insert(f.clone()));
    Ok(files)
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read the directory {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("cannot read the directory {}", dir.display()))?;
    entries.sort();
    for entry in entries {
        if entry.is_dir() {
            walk(&entry, files)?;
        } else if entry.extension().and_then(|e| e.to_str()).is_some_and(|e| EXTENSIONS.contains(&e)) {
            files.push(entry);
        }
    }
    Ok(())
}

/// Every definition of `files`; all their problems at once, so that one run shows what to fix.
fn read_files(env: &Env, files: &[PathBuf]) -> Result<Vec<Definition>> {
    let bar = ProgressBar::new(files.len() as u64).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} files read")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut toolbox = None;
    let mut definitions = Vec::new();
    let mut problems = Vec::new();
    for file in files {
        bar.inc(1);
        let label = file.display().to_string();
        let bytes = std::fs::read(file).with_context(|| format!("cannot read {label}"))?;
        if bytes.starts_with(b"\0asm") {
            let toolbox = match &toolbox {
                Some(t) => t,
                None => toolbox.insert(Toolbox::new(env.sandbox()?)),
            };
            let tool =
                toolbox.add_component(&bytes).with_context(|| format!("{label} is not a usable tool component"))?;
            definitions.push(Definition::from_tool(NewTool::new(tool.manifest.clone()).with_blob(bytes), label));
            continue;
        }
        let Ok(text) = String::from_utf8(bytes) else { bail!("{label} is neither a component nor JSON") };
        match read_definitions(&label, &text) {
            Ok(found) => definitions.extend(found),
            Err(found) => problems.extend(found),
        }
    }
    bar.finish_and_clear();
    if !problems.is_empty() {
        return Err(toolsmith_registry::RegistryError::Definitions(problems).into());
    }
    Ok(definitions)
}

/// One line per tool (or the outcomes as JSON), then a summary on stderr.
fn report(outcomes: &[AddedTool], files: usize, started: Instant, json: bool) -> Result<()> {
    if json {
        print_json(&outcomes)?;
    } else {
        for t in outcomes {
            println!("{}", describe(t));
        }
    }
    let count = |f: fn(&Registered) -> bool| outcomes.iter().filter(|t| f(&t.outcome)).count();
    let seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "{} tools from {files} file(s) in {seconds:.2} s ({:.0} tools/s): {} added, {} updated, {} unchanged, {} merged; {} renamed, {} near-duplicates kept apart",
        outcomes.len(),
        outcomes.len() as f64 / seconds.max(1e-9),
        count(|o| matches!(o, Registered::Added { .. })),
        count(|o| matches!(o, Registered::Updated { .. })),
        count(|o| matches!(o, Registered::Unchanged { .. })),
        count(|o| matches!(o, Registered::Merged { .. })),
        outcomes.iter().filter(|t| t.original_name.is_some()).count(),
        outcomes.iter().filter(|t| t.near_duplicate.is_some()).count(),
    );
    Ok(())
}

fn describe(t: &AddedTool) -> String {
    let mut line = match &t.outcome {
        Registered::Added { name } => format!("added `{name}`"),
        Registered::Updated { name } => format!("updated `{name}` (statistics and edges kept)"),
        Registered::Unchanged { name } => format!("`{name}` is already registered as given"),
        Registered::Merged { name, into, similarity } => {
            format!("`{name}` merged into `{into}` (cosine {similarity:.3}); it is now an alias")
        }
    };
    if let Some(original) = &t.original_name {
        line.push_str(&format!("; named `{original}` in {}, which is kept as an alias", t.file));
    }
    if let Some(near) = &t.near_duplicate {
        line.push_str(&format!(
            "; near-duplicate of `{}` (cosine {:.3}), kept as its own tool (`--merge` merges such tools)",
            near.name, near.similarity
        ));
    }
    line
}
