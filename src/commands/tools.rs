//! `toolsmith tools ...`: browse and maintain the tool graph.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use toolsmith_registry::{AuthorMerge, GraphView, Mode, Registry, SearchRequest, SortBy};

use super::{Env, print_json};

// The `add` half of this command (and the definition half of `import`).
mod add;
// Capability grants.
mod grant;

#[derive(Debug, Subcommand)]
pub enum ToolsCommand {
    /// Register tools: components (.wasm), manifests, OpenAI function lists or MCP tools/list
    /// results (.json, or JSON lines in .jsonl), or directories of them (searched recursively).
    ///
    /// A tool is merged into a registered one (becoming its alias) only when its interface is the
    /// same: description, input and output schema. A near-duplicate (cosine at or above the
    /// registry's merge threshold) is registered under its own name and reported. Names other
    /// systems allow (`getWeather`, `weather.get`) are mapped to snake_case, the original kept as
    /// an alias. Everything is checked first; one bad definition registers nothing.
    Add {
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<PathBuf>,
        /// Also merge near-duplicates (cosine at or above the merge threshold), as agents' tools are.
        #[arg(long, conflicts_with = "no_merge")]
        merge: bool,
        /// Never merge, not even a tool whose interface is the same as a registered one's.
        #[arg(long)]
        no_merge: bool,
        /// Print each tool's outcome as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the registered tools.
    List {
        #[arg(long, value_enum, default_value = "name")]
        sort: Sort,
        #[arg(long)]
        json: bool,
    },
    /// A tool's manifest, statistics, neighbours, provenance and aliases.
    Show {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Hybrid retrieval: each QUERY is a sub-plan; top-k each, then one hop along the graph.
    Search(SearchArgs),
    /// Draw the graph, or the part of it around one tool.
    Graph(GraphArgs),
    /// Grant a tool capabilities: outgoing HTTP to hosts, read-only directories, secrets,
    /// environment variables. Tools are pure until granted; every grant is logged with who and
    /// when, and binds to the tool's current code (new code needs a new grant).
    Grant(grant::GrantArgs),
    /// Revoke capabilities from a tool (as `tools show` lists them), or all of them.
    Revoke(grant::RevokeArgs),
    /// Merge B into A: B's edges move to A, B becomes an alias of A.
    Merge { a: String, b: String },
    /// Remove a tool with its edges and aliases.
    Remove { name: String },
    /// Write the registry as JSON lines (to stdout, or --out); or its tools as OpenAI function
    /// definitions or an MCP tools/list result.
    Export {
        #[arg(long, short)]
        out: Option<PathBuf>,
        /// `jsonl`: everything (tools, code, edges, aliases, candidates), for `import`.
        /// `openai`: a JSON array of `{"type": "function", ...}` definitions.
        /// `mcp`: `{"tools": [...]}` as `toolsmith serve` lists them.
        #[arg(long, value_enum, default_value = "jsonl")]
        format: ExportFormat,
    },
    /// Read what `export` writes (a file, or - for stdin): JSON lines with everything, or tool
    /// definitions (OpenAI functions, an MCP tools/list result, manifests), added as `add` adds
    /// them. All or nothing.
    Import { path: PathBuf },
    /// Counts.
    Stats {
        #[arg(long)]
        json: bool,
    },
    /// Embed tools that lack a vector and rebuild the search index from the database.
    Reindex,
    /// Check the database and the index.
    Doctor,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Sort {
    Name,
    Usage,
    Reward,
    Recency,
}

#[derive(Debug, Args)]
pub struct SearchArgs {
    /// One or more sub-plan texts.
    #[arg(required = true)]
    queries: Vec<String>,
    /// Hits per sub-plan.
    #[arg(short, default_value_t = 5)]
    k: usize,
    /// Show each hit's score breakdown.
    #[arg(long)]
    explain: bool,
    #[arg(long)]
    json: bool,
    #[arg(long, value_enum, default_value = "hybrid")]
    mode: SearchMode,
    /// Weight of BM25 in the fusion (default: the registry setting).
    #[arg(long)]
    alpha: Option<f32>,
    /// Skip graph expansion.
    #[arg(long)]
    no_expand: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum SearchMode {
    Hybrid,
    Bm25,
    Dense,
}

#[derive(Debug, Args)]
pub struct GraphArgs {
    /// Only the tools within --depth hops of this one.
    #[arg(long)]
    around: Option<String>,
    #[arg(long, default_value_t = 1)]
    depth: usize,
    #[arg(long, value_enum, default_value = "dot")]
    format: GraphFormat,
    /// Write the text format here instead of stdout.
    #[arg(long, short)]
    out: Option<PathBuf>,
    /// Also render an SVG picture with Graphviz (`dot` must be installed).
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Also write the graph page (the one `serve --http` shows at /graph) as one offline file
    /// holding the whole graph and every tool's details.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum GraphFormat {
    Dot,
    Mermaid,
    Json,
}

pub fn spinner(message: &str) -> ProgressBar {
    let bar = ProgressBar::new_spinner()
        .with_style(
            ProgressStyle::with_template("{spinner} {msg}").unwrap_or_else(|_| ProgressStyle::default_spinner()),
        )
        .with_message(message.to_string());
    bar.enable_steady_tick(std::time::Duration::from_millis(100));
    bar
}

/// What `tools export` writes.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ExportFormat {
    Jsonl,
    Openai,
    Mcp,
}

fn export(r: &Registry, format: ExportFormat, out: &mut dyn std::io::Write) -> Result<()> {
    let tools = || r.list(SortBy::Name);
    let document = match format {
        ExportFormat::Jsonl => return Ok(r.export(out)?),
        ExportFormat::Openai => {
            serde_json::Value::Array(tools()?.iter().map(|t| t.manifest.to_openai_function()).collect())
        }
        ExportFormat::Mcp => {
            let listed: Vec<_> = tools()?.iter().filter_map(|t| toolsmith_daemon::mcp_tool(&t.manifest)).collect();
            serde_json::json!({ "tools": listed })
        }
    };
    serde_json::to_writer_pretty(&mut *out, &document)?;
    writeln!(out)?;
    Ok(())
}

/// Runs one `tools` subcommand: each has its own function below.
pub fn run(env: &Env, cmd: ToolsCommand) -> Result<ExitCode> {
    let mut r = env.registry()?;
    match cmd {
        ToolsCommand::Add { paths, merge, no_merge, json } => {
            let merge = match (merge, no_merge) {
                (true, _) => AuthorMerge::Similar,
                (_, true) => AuthorMerge::Never,
                _ => AuthorMerge::SameInterface,
            };
            add::add(env, &mut r, &paths, merge, json)?
        }
        ToolsCommand::List { sort, json } => list(&r, sort, json)?,
        ToolsCommand::Show { name, json } => show(&r, &name, json)?,
        ToolsCommand::Search(args) => search(&mut r, args)?,
        ToolsCommand::Graph(args) => graph(&r, args)?,
        ToolsCommand::Grant(args) => grant::grant(&mut r, args)?,
        ToolsCommand::Revoke(args) => grant::revoke(&mut r, args)?,
        ToolsCommand::Merge { a, b } => merge(&mut r, &a, &b)?,
        ToolsCommand::Remove { name } => remove(&mut r, &name)?,
        ToolsCommand::Export { out, format } => export_to(&r, format, out.as_deref())?,
        ToolsCommand::Import { path } => import(&mut r, &path)?,
        ToolsCommand::Stats { json } => stats(&r, json)?,
        ToolsCommand::Reindex => reindex(&mut r)?,
        ToolsCommand::Doctor => return doctor(&mut r),
    }
    Ok(ExitCode::SUCCESS)
}

fn list(r: &Registry, sort: Sort, json: bool) -> Result<()> {
    let sort = match sort {
        Sort::Name => SortBy::Name,
        Sort::Usage => SortBy::Usage,
        Sort::Reward => SortBy::Reward,
        Sort::Recency => SortBy::Recency,
    };
    let tools = r.list(sort)?;
    if json {
        return print_json(&tools);
    }
    println!(
        "{:<28} {:<9} {:<8} {:>6} {:>8} {:>7}  description",
        "name", "kind", "version", "calls", "success", "reward"
    );
    for t in tools {
        let success = t.stats.success_rate().map(|r| format!("{:.0}%", 100.0 * r)).unwrap_or_else(|| "-".into());
        let reward = t.mean_reward.map(|m| format!("{m:.2}")).unwrap_or_else(|| "-".into());
        println!(
            "{:<28} {:<9} {:<8} {:>6} {:>8} {:>7}  {}",
            t.name,
            t.kind.to_string(),
            t.version,
            t.stats.usage_count,
            success,
            reward,
            clip(&t.description, 60)
        );
    }
    Ok(())
}

fn show(r: &Registry, name: &str, json: bool) -> Result<()> {
    let d = r.show(name)?;
    if json {
        return print_json(&d);
    }
    let t = &d.tool;
    println!("{} {} ({})", t.name, t.version, t.kind);
    println!("  {}", t.description);
    println!(
        "  calls {}  ok {}  failed {}  caller errors {}  mean reward {}",
        t.stats.usage_count,
        t.stats.success_count,
        t.stats.failure_count,
        t.stats.caller_errors(),
        t.mean_reward.map(|m| format!("{m:.3}")).unwrap_or_else(|| "-".into())
    );
    let p = &t.manifest.provenance;
    println!(
        "  provenance: author {}, run {}, parents [{}]",
        p.author.as_deref().unwrap_or("-"),
        p.created_by_run.as_deref().unwrap_or("-"),
        p.parents.iter().map(|p| p.as_str()).collect::<Vec<_>>().join(", ")
    );
    if let Some(h) = &t.blob_hash {
        println!("  code: blob {h}");
    }
    if !d.aliases.is_empty() {
        println!("  aliases: {}", d.aliases.join(", "));
    }
    if d.grants.entries.is_empty() {
        println!("  grants: none (pure: no network, files, secrets or environment)");
    }
    for g in &d.grants.entries {
        let stale = if g.current { "" } else { "  [stale: the code changed since; grant again]" };
        println!("  grant {}: {} (by {}, {}){stale}", g.capability, g.description, g.granted_by, when(g.granted_at));
    }
    for e in &d.grant_log {
        println!("  log: {} {} {} by {}", when(e.at), e.action, e.capability, e.actor);
    }
    for (label, list) in [("feeds", &d.dependents), ("fed by", &d.dependencies)] {
        for n in list {
            println!("  {label} {} (count {}, weight {:.2})", n.name, n.count, n.weight);
        }
    }
    println!("  manifest:\n{}", indent(&t.manifest.to_json_pretty(), 4));
    Ok(())
}

/// Unix milliseconds as an HTTP date (`Thu, 03 Dec 2026 23:10:00 GMT`).
fn when(ms: i64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    httpdate::fmt_http_date(at)
}

fn merge(r: &mut Registry, a: &str, b: &str) -> Result<()> {
    r.merge(a, b)?;
    println!("merged `{b}` into `{a}`");
    Ok(())
}

fn remove(r: &mut Registry, name: &str) -> Result<()> {
    r.remove(name)?;
    println!("removed `{name}`");
    Ok(())
}

/// Exports to `out`, or to stdout.
fn export_to(r: &Registry, format: ExportFormat, out: Option<&Path>) -> Result<()> {
    let Some(path) = out else {
        let stdout = std::io::stdout();
        return export(r, format, &mut stdout.lock());
    };
    // Write beside the target and rename: a failed export never leaves half a file.
    let tmp = path.with_extension("partial");
    let mut file = std::io::BufWriter::new(
        std::fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?,
    );
    export(r, format, &mut file)?;
    file.flush()?;
    drop(file);
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("exported to {}", path.display());
    Ok(())
}

fn import(r: &mut Registry, path: &Path) -> Result<()> {
    let text = add::read_text(path)?;
    let label = if path.as_os_str() == "-" { "<stdin>".to_string() } else { path.display().to_string() };
    if !is_export(&text) {
        return add::import_definitions(r, &label, &text);
    }
    let summary = r.import(&mut text.as_bytes()).with_context(|| format!("cannot import {label}"))?;
    println!(
        "imported {} tools, {} edges, {} aliases, {} blobs, {} candidates",
        summary.tools, summary.edges, summary.aliases, summary.blobs, summary.candidates
    );
    Ok(())
}

/// Whether `text` is what `tools export` writes as JSON lines: its first line is the header.
fn is_export(text: &str) -> bool {
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or_default();
    serde_json::from_str::<serde_json::Value>(first).is_ok_and(|v| v["type"] == "header")
}

fn stats(r: &Registry, json: bool) -> Result<()> {
    let s = r.stats()?;
    if json {
        return print_json(&s);
    }
    println!("registry   {} (schema v{})", s.path.display(), s.schema_version);
    let kinds: Vec<String> = s.tools_by_kind.iter().map(|(k, n)| format!("{n} {k}")).collect();
    println!("tools      {} ({})", s.graph.tools, kinds.join(", "));
    println!("edges      {}", s.graph.edges);
    println!("aliases    {}", s.graph.aliases);
    println!("blobs      {} ({} KiB)", s.blobs, s.blob_bytes / 1024);
    println!("candidates {} pending", s.candidates_pending);
    println!("calls      {}", s.graph.calls);
    println!("file       {} KiB", s.database_bytes / 1024);
    Ok(())
}

fn reindex(r: &mut Registry) -> Result<()> {
    let bar = spinner("rebuilding the search index");
    let embedded = r.reindex()?;
    bar.finish_and_clear();
    println!("reindexed {} tools ({embedded} newly embedded)", r.len()?);
    Ok(())
}

/// Prints the checks and problems; a problem fails the command.
fn doctor(r: &mut Registry) -> Result<ExitCode> {
    let report = r.doctor()?;
    for c in &report.checks {
        println!("checked: {c}");
    }
    if report.problems.is_empty() {
        println!("healthy");
        return Ok(ExitCode::SUCCESS);
    }
    for p in &report.problems {
        println!("problem: {p}");
    }
    Ok(ExitCode::FAILURE)
}

fn search(r: &mut Registry, args: SearchArgs) -> Result<()> {
    let mode = match args.mode {
        SearchMode::Hybrid => Mode::Hybrid,
        SearchMode::Bm25 => Mode::Bm25,
        SearchMode::Dense => Mode::Dense,
    };
    let request = SearchRequest {
        alpha: args.alpha,
        ..SearchRequest::new(args.queries).k(args.k).mode(mode).expand(!args.no_expand)
    };
    let hits = r.search(&request)?;
    if args.json {
        return print_json(&hits);
    }
    if hits.is_empty() {
        println!("no tools found");
    }
    for (i, h) in hits.iter().enumerate() {
        println!("{:>2}. {:<28} {:.3}  {}", i + 1, h.name, h.score, clip(&h.description, 70));
        if args.explain {
            let e = &h.explain;
            match &e.via {
                Some((from, w)) => println!("      graph neighbour of {from} (relative edge weight {w:.2})"),
                None => println!(
                    "      bm25 {} -> {:.3}   cosine {} -> {:.3}   fused {:.3}{}",
                    e.bm25.map(|b| format!("{b:.2}")).unwrap_or_else(|| "-".into()),
                    e.sparse,
                    e.cosine.map(|c| format!("{c:.3}")).unwrap_or_else(|| "-".into()),
                    e.dense,
                    e.fused,
                    e.prior.map(|p| format!("   prior {p:.3}")).unwrap_or_default()
                ),
            }
            if request.queries.len() > 1 {
                println!("      for: {}", e.query);
            }
        }
    }
    Ok(())
}

fn graph(r: &Registry, args: GraphArgs) -> Result<()> {
    let whole = r.graph_view()?;
    let g = match &args.around {
        Some(name) => whole.around(name, args.depth)?,
        None => whole,
    };
    let text = match args.format {
        GraphFormat::Dot => to_dot(&g),
        GraphFormat::Mermaid => to_mermaid(&g),
        GraphFormat::Json => serde_json::to_string_pretty(&g)? + "\n",
    };
    match &args.out {
        Some(path) => std::fs::write(path, &text).with_context(|| format!("cannot write {}", path.display()))?,
        None => print!("{text}"),
    }
    if let Some(svg) = &args.svg {
        render_svg(&to_dot(&g), svg)?;
        eprintln!("picture: {}", svg.display());
    }
    if let Some(html) = &args.html {
        let page = toolsmith_daemon::graph::static_page(r).context("cannot build the graph page")?;
        std::fs::write(html, page).with_context(|| format!("cannot write {}", html.display()))?;
        eprintln!("picture: {}", html.display());
    }
    Ok(())
}

/// Tools and plan edges as Graphviz `dot`; aliases are left out.
fn to_dot(g: &GraphView) -> String {
    let mut s =
        String::from("digraph tools {\n  rankdir=LR;\n  node [shape=box, style=rounded, fontname=\"Helvetica\"];\n");
    for n in g.tools() {
        let _ = writeln!(s, "  \"{}\" [tooltip=\"{} tool, {} calls\"];", n.name, n.kind, n.calls);
    }
    for e in g.plan_edges() {
        let _ = writeln!(
            s,
            "  \"{}\" -> \"{}\" [label=\"{}\", penwidth={:.2}];",
            e.src,
            e.dst,
            e.count,
            edge_width(e.weight)
        );
    }
    s.push_str("}\n");
    s
}

/// Tools and plan edges as a Mermaid flowchart; aliases are left out.
fn to_mermaid(g: &GraphView) -> String {
    let mut s = String::from("graph LR\n");
    for n in g.tools() {
        let _ = writeln!(s, "  {}[\"{}\"]", n.name, n.name);
    }
    for e in g.plan_edges() {
        let _ = writeln!(s, "  {} -->|{}| {}", e.src, e.count, e.dst);
    }
    s
}

fn render_svg(dot: &str, out: &Path) -> Result<()> {
    let mut child = match std::process::Command::new("dot")
        .args(["-Tsvg", "-o"])
        .arg(out)
        .stdin(std::process::Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("Graphviz `dot` is not installed; use --html FILE for a picture without dependencies")
        }
        Err(e) => return Err(e).context("cannot run Graphviz `dot`"),
    };
    child.stdin.take().context("dot stdin")?.write_all(dot.as_bytes())?;
    let status = child.wait()?;
    if !status.success() {
        bail!("Graphviz `dot` failed ({status})");
    }
    Ok(())
}

/// Line width for an edge: grows with the log of its weight, so one heavy edge does not swamp the
/// picture.
fn edge_width(weight: f64) -> f64 {
    1.0 + weight.max(0.0).ln_1p()
}

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n { s.to_string() } else { format!("{}…", s.chars().take(n - 1).collect::<String>()) }
}

fn indent(s: &str, n: usize) -> String {
    s.lines().map(|l| format!("{:n$}{l}\n", "")).collect()
}
