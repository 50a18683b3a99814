//! The meta tools a client gets besides the graph's own: `search_tools` (so a client need not
//! load the whole graph into its context), SEARL's `create_and_execute_mcp`, and with a corpus
//! the agent's `search` over it.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use toolsmith_agent::env::corpus::search_manifest;
use toolsmith_contract::schemas::tool_schema_for;
use toolsmith_contract::{ErrorKind, Manifest, Provenance, StructuredError};
use toolsmith_registry::{Candidate, NewTool, Registered, SearchRequest};

use super::{Admission, CallReply, Daemon, lock};
use toolsmith_sandbox::python::create::{CreateRequest, CreateResult, DEFAULT_TIMEOUT_SECS, create_and_execute};

/// The retrieval meta tool.
pub const SEARCH_TOOL: &str = "search_tools";
/// SEARL's tool-creation meta tool.
pub const CREATE_TOOL: &str = "create_and_execute_mcp";
/// The corpus search tool (served when the daemon has a corpus).
const CORPUS_TOOL: &str = toolsmith_agent::env::corpus::SEARCH_TOOL;

/// `search_tools` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    /// What the tool should do, in words (a sub-task of your plan).
    #[schemars(length(min = 1, max = 2000))]
    query: String,
    /// More sub-task texts; each retrieves its own top `k` and the results are merged.
    #[serde(default)]
    #[schemars(length(max = 16))]
    more_queries: Vec<String>,
    /// Tools kept per query before graph expansion.
    #[serde(default = "default_k")]
    #[schemars(range(min = 1, max = 50))]
    k: usize,
    /// Also return tools that past plans used together with the ones found.
    #[serde(default = "default_expand")]
    expand: bool,
}

fn default_k() -> usize {
    5
}

fn default_expand() -> bool {
    true
}

/// One tool `search_tools` found.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct FoundTool {
    /// The tool's name, to pass to `tools/call`.
    name: String,
    /// What it does.
    description: String,
    /// `plugin`, `python`, `simulated` or `native`.
    kind: String,
    /// Relevance (higher is better).
    score: f32,
    /// The arguments it takes.
    input_schema: Value,
    /// What it returns.
    output_schema: Value,
    /// Set when the tool was found along a dependency edge from another hit.
    #[serde(skip_serializing_if = "Option::is_none")]
    via: Option<String>,
}

/// `search_tools` result.
#[derive(Debug, Serialize, JsonSchema)]
struct Found {
    /// The tools, best first.
    tools: Vec<FoundTool>,
}

/// The meta tools' manifests (kind `native`), with the corpus `search` tool when there is a corpus.
pub(super) fn manifests(corpus: bool) -> Result<Vec<Manifest>, String> {
    let search = json!({
        "name": SEARCH_TOOL,
        "version": env!("CARGO_PKG_VERSION"),
        "description": "Searches the tool graph for tools that can do a task: hybrid keyword and semantic \
            retrieval over every tool's name, description and parameters, expanded along the dependencies \
            that earlier plans used. Returns each tool's name and schemas, ready for tools/call.",
        "input_schema": tool_schema_for::<SearchArgs>(),
        "output_schema": tool_schema_for::<Found>(),
        "kind": "native",
    });
    let create = json!({
        "name": CREATE_TOOL,
        "version": env!("CARGO_PKG_VERSION"),
        "description": "Creates a new tool from a Python function and runs it once: give the function's \
            name, what it does, its arguments and return value in words, the complete code (defining \
            `def <name>(...)`) and example inputs. Returns creation_success, execution_result, stdout, \
            stderr and error. A tool that works is added to the tool graph for later calls.",
        "input_schema": tool_schema_for::<CreateRequest>(),
        "output_schema": tool_schema_for::<CreateResult>(),
        "kind": "native",
    });
    let mut out: Vec<Manifest> = [search, create]
        .into_iter()
        .map(|m| Manifest::from_value(m.clone()).map_err(|e| format!("meta tool {}: {e}", m["name"])))
        .collect::<Result<_, _>>()?;
    if corpus {
        out.push(search_manifest());
    }
    Ok(out)
}

pub(super) async fn call(daemon: &Daemon, name: &str, args: Value) -> CallReply {
    let outcome = match name {
        SEARCH_TOOL => search(daemon, args).await,
        CREATE_TOOL => create(daemon, args).await,
        CORPUS_TOOL => search_corpus(daemon, args).await,
        other => Err(StructuredError::new(ErrorKind::NotFound, other, "no such meta tool")),
    };
    outcome.unwrap_or_else(|e| CallReply::error(&e))
}

/// Searches the served corpus on a blocking thread (tantivy reads are synchronous).
async fn search_corpus(daemon: &Daemon, args: Value) -> Result<CallReply, StructuredError> {
    let tool_error = |e: String| StructuredError::new(ErrorKind::ToolError, CORPUS_TOOL, e);
    let corpus = daemon.options().corpus.clone().ok_or_else(|| tool_error("this server has no corpus".into()))?;
    let found = tokio::task::spawn_blocking(move || corpus.call(&args).map_err(|e| e.to_string()))
        .await
        .map_err(|e| tool_error(format!("the search failed: {e}")))?
        .map_err(tool_error)?;
    Ok(CallReply::ok(found))
}

fn bad_args(tool: &str, e: serde_json::Error) -> StructuredError {
    StructuredError::new(ErrorKind::InvalidArgs, tool, e.to_string())
}

async fn search(daemon: &Daemon, args: Value) -> Result<CallReply, StructuredError> {
    let args: SearchArgs = serde_json::from_value(args).map_err(|e| bad_args(SEARCH_TOOL, e))?;
    let mut queries = vec![args.query];
    queries.extend(args.more_queries.into_iter().filter(|q| !q.trim().is_empty()));
    let request = SearchRequest::new(queries).k(args.k).expand(args.expand);
    let found = daemon
        .with_registry(move |registry| {
            let hits = registry.search(&request)?;
            let mut tools = Vec::with_capacity(hits.len());
            for hit in hits {
                let record = registry.get(&hit.name)?;
                let manifest = &record.manifest;
                tools.push(FoundTool {
                    name: hit.name,
                    description: hit.description,
                    kind: hit.kind.to_string(),
                    score: hit.score,
                    input_schema: toolsmith_contract::schemas::served_schema(&manifest.input_schema),
                    output_schema: super::mcp_output_schema(manifest),
                    via: hit.explain.via.map(|(from, _)| from),
                });
            }
            Ok(Found { tools })
        })
        .await
        .map_err(|e| StructuredError::new(ErrorKind::ToolError, SEARCH_TOOL, e.to_string()))?;
    let value = serde_json::to_value(&found).unwrap_or_default();
    let mut reply = CallReply::ok(value);
    reply.text = found
        .tools
        .iter()
        .map(|t| format!("{} ({:.3}): {}", t.name, t.score, t.description))
        .collect::<Vec<_>>()
        .join("\n");
    Ok(reply)
}

async fn create(daemon: &Daemon, args: Value) -> Result<CallReply, StructuredError> {
    let mut request: CreateRequest = serde_json::from_value(args).map_err(|e| bad_args(CREATE_TOOL, e))?;
    let runtime = daemon.toolbox().python().ok_or_else(|| {
        StructuredError::new(ErrorKind::ToolError, CREATE_TOOL, "this server has no Python runtime")
            .with_hint("build the Python guest with scripts/setup.sh and restart the server")
    })?;
    // The first run gets the caller's timeout, but never more than the server allows a call.
    let cap = daemon.options().limits.timeout.max(Duration::from_secs_f64(DEFAULT_TIMEOUT_SECS));
    if !(request.timeout.is_finite() && request.timeout > 0.0) || request.timeout > cap.as_secs_f64() {
        request.timeout = cap.as_secs_f64();
    }
    if toolsmith_contract::RESERVED_TOOL_NAMES.contains(&request.name.as_str())
        || daemon.shared.meta_tools.iter().any(|(m, _)| m.name.as_str() == request.name)
    {
        let mut error = StructuredError::new(
            ErrorKind::InvalidArgs,
            CREATE_TOOL,
            format!("`{}` is the name of one of this server's meta tools", request.name),
        );
        error.pointer = Some("/name".into());
        return Err(error.with_hint("give the new tool a name of its own"));
    }
    let pool = &daemon.shared.creators;
    let permit = daemon.slot(pool, daemon.options().create_concurrency, "tool creation", CREATE_TOOL).await?;
    let shared = daemon.shared.clone();
    let (admission, run) = (daemon.options().admission, daemon.options().run.clone());
    let task = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let _in_flight = shared.stats.start();
        let existing = lock(&shared.registry).get(&request.name).ok().map(|r| r.manifest);
        let provenance =
            Provenance { author: Some("mcp".into()), created_by_run: Some(run.clone()), ..Default::default() };
        let created = create_and_execute(&runtime, &request, existing.as_ref(), provenance);
        let admitted = created.tool.as_ref().map(|tool| {
            let new = NewTool::new(tool.manifest.clone()).with_blob(tool.to_blob());
            let mut registry = lock(&shared.registry);
            match admission {
                Admission::Register => registry.register(new, true).map(|outcome| admission_meta(&outcome)),
                Admission::Candidate => registry
                    .add_candidate(&Candidate {
                        run: run.clone(),
                        iteration: 0,
                        task: request.description.clone(),
                        trajectory: format!("mcp-{}", tool.manifest.name),
                        reward: 0.0,
                        tool: new,
                    })
                    .map(|_| json!({"status": "candidate", "name": tool.manifest.name, "run": run})),
            }
        });
        (created, admitted)
    });
    let (created, admitted) = task
        .await
        .map_err(|e| StructuredError::new(ErrorKind::Trap, CREATE_TOOL, format!("the creation task failed: {e}")))?;
    // A tool that did not come to be is still SEARL's result shape (`creation_success: false`
    // and `error`), not an error result: reading why and trying again is the agent's next step.
    let mut reply = CallReply::ok(serde_json::to_value(&created.result).unwrap_or_default());
    if let Some(failure) = &created.failure {
        reply.text = format!("creation failed: {failure}");
    }
    match admitted {
        Some(Ok(meta)) => {
            reply.meta = Some(Map::from_iter([("toolsmith/admission".to_string(), meta)]));
            daemon.announce_changes().await;
        }
        Some(Err(e)) => {
            return Err(StructuredError::new(
                ErrorKind::ToolError,
                CREATE_TOOL,
                format!("the tool works but could not be stored: {e}"),
            ));
        }
        None => {}
    }
    Ok(reply)
}

fn admission_meta(outcome: &Registered) -> Value {
    match outcome {
        Registered::Merged { name, into, similarity } => {
            json!({"status": "merged", "name": into, "alias": name, "similarity": similarity})
        }
        Registered::Added { name } => json!({"status": "registered", "name": name}),
        Registered::Updated { name } => json!({"status": "updated", "name": name}),
        Registered::Unchanged { name } => json!({"status": "unchanged", "name": name}),
    }
}
