//! The live tool-graph page and its API, served beside MCP (behind the same token).
//!
//! - `GET /graph`: the page (one embedded file: HTML, CSS and a small canvas renderer; no CDN).
//! - `GET /graph.json[?job=J&step=S]`: [`GraphView`], live or as a training checkpoint kept it.
//! - `GET /graph/search?q=TEXT[&k=N]`: the registry's hybrid retrieval.
//! - `GET /graph/tools/{name}[?job=J&step=S]`: [`ToolView`], one tool in full.
//! - `GET /graph/events`: server-sent `graph` events when tools, calls or plan edges change.
//! - `GET /graph/checkpoints`: the snapshots training jobs kept, to step through.
//!
//! Everything the page shows was written by agents, so the page builds its DOM from text nodes
//! only, and the server adds a Content-Security-Policy that allows no script but the page's own.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::BroadcastStream;
use toolsmith_registry::{
    GraphSource, GraphStats, GraphView, Registry, RegistryError, SearchRequest, Snapshot, ToolView,
};

use super::Daemon;

/// The page, as written; [`static_page`] fills its data element for an offline copy.
pub const PAGE: &str = include_str!("../assets/graph.html");

/// The element a static copy carries its data in (empty in the live page).
const DATA_SLOT: &str = r#"<script id="toolsmith-data" type="application/json"></script>"#;

/// Longest search query accepted.
const MAX_QUERY_CHARS: usize = 1000;
/// Most hits a search returns.
const MAX_HITS: usize = 100;

/// What the page hears on `/graph/events` (event name `graph`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphEvent {
    /// The registry's tool-list generation.
    pub generation: i64,
    /// Moves with every recorded call and plan edge.
    pub activity: i64,
    /// Tools in the graph now.
    pub tools: i64,
    /// Names merged into another tool (near-duplicates).
    pub aliases: i64,
    /// Plan edges between tools.
    pub edges: i64,
    /// Calls recorded in all.
    pub calls: i64,
}

impl GraphEvent {
    pub(crate) fn new(activity: toolsmith_registry::Activity, stats: GraphStats) -> GraphEvent {
        GraphEvent {
            generation: activity.generation,
            activity: activity.activity,
            tools: stats.tools,
            aliases: stats.aliases,
            edges: stats.edges,
            calls: stats.calls,
        }
    }
}

/// A snapshot of the tool graph that a training job kept with a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointGraph {
    /// The job (its directory name under the daemon's runs).
    pub job: String,
    /// The checkpoint's unit (step or iteration).
    pub step: u64,
    /// Tools in its graph.
    pub tools: i64,
}

/// The routes, for the HTTP listener's protected router.
pub(crate) fn routes(daemon: Daemon) -> Router {
    Router::new()
        .route("/graph", get(page))
        .route("/graph.json", get(graph_json))
        .route("/graph/search", get(search))
        .route("/graph/tools/{name}", get(tool))
        .route("/graph/events", get(events))
        .route("/graph/checkpoints", get(checkpoints))
        .route("/graph/{*rest}", get(not_found))
        .with_state(daemon)
}

/// `script-src` hashes of the page's inline scripts, so nothing else can run even if some text
/// ever slipped into markup.
static CSP: LazyLock<String> = LazyLock::new(|| {
    let mut hashes = Vec::new();
    let mut rest = PAGE;
    while let Some(start) = rest.find("<script>") {
        let body = &rest[start + "<script>".len()..];
        let Some(end) = body.find("</script>") else { break };
        let digest = Sha256::digest(&body.as_bytes()[..end]);
        hashes.push(format!("'sha256-{}'", BASE64.encode(digest)));
        rest = &body[end..];
    }
    format!(
        "default-src 'none'; script-src {}; style-src 'unsafe-inline'; img-src data:; connect-src 'self'; \
         base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        hashes.join(" ")
    )
});

fn html(status: StatusCode, body: String) -> Response {
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    if let Ok(csp) = HeaderValue::from_str(&CSP) {
        headers.insert(header::CONTENT_SECURITY_POLICY, csp);
    }
    response
}

/// A small page for errors, every piece of text escaped.
fn error_page(status: StatusCode, message: &str) -> Response {
    let title = format!("{} {}", status.as_u16(), status.canonical_reason().unwrap_or(""));
    html(
        status,
        format!(
            "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title></head>\
             <body style=\"font-family:system-ui,sans-serif;margin:3em\"><h1>{t}</h1><p>{m}</p>\
             <p><a href=\"/graph\">Back to the tool graph</a></p></body></html>",
            t = escape_html(&title),
            m = escape_html(message)
        ),
    )
}

fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn json_error(status: StatusCode, message: impl Into<String>) -> Response {
    let mut response = (status, axum::Json(json!({ "error": message.into() }))).into_response();
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn json_ok<T: Serialize>(value: &T) -> Response {
    let mut response = axum::Json(value).into_response();
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn wants_html(headers: &HeaderMap) -> bool {
    headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("text/html"))
}

/// Requests are checked before they reach the registry, so any error but an unknown tool is
/// the server's.
fn registry_status(e: &RegistryError) -> StatusCode {
    match e {
        RegistryError::NotFound(_) => StatusCode::NOT_FOUND,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

async fn page(State(daemon): State<Daemon>) -> Response {
    // A registry that cannot be read is an error page, not an empty graph.
    match daemon.with_registry(|r| r.activity()).await {
        Ok(_) => html(StatusCode::OK, PAGE.to_string()),
        Err(e) => error_page(StatusCode::INTERNAL_SERVER_ERROR, &format!("the tool registry cannot be read: {e}")),
    }
}

/// `?job=J&step=S`: a checkpoint's snapshot; neither: the live registry.
#[derive(Debug, Deserialize)]
struct At {
    job: Option<String>,
    step: Option<String>,
}

impl At {
    fn checkpoint(&self) -> Result<Option<(String, u64)>, String> {
        match (&self.job, &self.step) {
            (None, None) => Ok(None),
            (Some(job), Some(step)) => {
                let step = step.parse().map_err(|_| format!("step must be a whole number, got `{step}`"))?;
                Ok(Some((job.clone(), step)))
            }
            _ => Err("give both job and step, or neither".into()),
        }
    }
}

/// Opens the snapshot of `job` at `step`.
fn open_checkpoint(daemon: &Daemon, job: &str, step: u64) -> Result<Snapshot, (StatusCode, String)> {
    let found = daemon.checkpoint_graphs().into_iter().find(|(c, _)| c.job == job && c.step == step);
    let Some((_, path)) = found else {
        return Err((StatusCode::NOT_FOUND, format!("job {job} kept no tool graph at step {step}")));
    };
    Snapshot::open(&path).map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, format!("the checkpoint's graph: {e}")))
}

async fn graph_json(State(daemon): State<Daemon>, Query(at): Query<At>) -> Response {
    let at = match at.checkpoint() {
        Ok(at) => at,
        Err(e) => return json_error(StatusCode::BAD_REQUEST, e),
    };
    let view = match at {
        None => daemon.with_registry(|r| r.graph_view()).await.map_err(|e| (registry_status(&e), e.to_string())),
        Some((job, step)) => {
            let daemon = daemon.clone();
            tokio::task::spawn_blocking(move || {
                let mut view = open_checkpoint(&daemon, &job, step)?
                    .graph_view()
                    .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
                view.source = GraphSource::Checkpoint { job, step };
                Ok(view)
            })
            .await
            .unwrap_or_else(|e| Err((StatusCode::INTERNAL_SERVER_ERROR, e.to_string())))
        }
    };
    match view {
        Ok(view) => json_ok(&view),
        Err((status, message)) => json_error(status, message),
    }
}

/// One hit of `/graph/search`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchHit {
    /// The tool's name.
    pub name: String,
    /// Its hybrid retrieval score (higher is closer).
    pub score: f64,
}

async fn search(State(daemon): State<Daemon>, Query(params): Query<BTreeMap<String, String>>) -> Response {
    let query = params.get("q").map(|q| q.trim().to_string()).unwrap_or_default();
    if query.is_empty() {
        return json_error(StatusCode::BAD_REQUEST, "give a search text: /graph/search?q=...");
    }
    if query.chars().count() > MAX_QUERY_CHARS {
        return json_error(
            StatusCode::BAD_REQUEST,
            format!("the search text is longer than {MAX_QUERY_CHARS} characters"),
        );
    }
    let k = match params.get("k").map(|k| k.parse::<usize>()) {
        None => 20,
        Some(Ok(k)) if (1..=MAX_HITS).contains(&k) => k,
        Some(_) => {
            return json_error(StatusCode::BAD_REQUEST, format!("k must be a whole number from 1 to {MAX_HITS}"));
        }
    };
    let text = query.clone();
    let hits = daemon
        .with_registry(move |r| {
            Ok(r.search(&SearchRequest::new([text]).k(k).expand(true))?
                .into_iter()
                .map(|h| SearchHit { name: h.name, score: f64::from(h.score) })
                .collect::<Vec<_>>())
        })
        .await;
    match hits {
        Ok(hits) => json_ok(&json!({ "query": query, "hits": hits })),
        Err(e) => json_error(registry_status(&e), e.to_string()),
    }
}

async fn tool(
    State(daemon): State<Daemon>,
    UrlPath(name): UrlPath<String>,
    Query(at): Query<At>,
    headers: HeaderMap,
) -> Response {
    let html_wanted = wants_html(&headers);
    let fail = |status: StatusCode, message: String| {
        if html_wanted { error_page(status, &message) } else { json_error(status, message) }
    };
    let at = match at.checkpoint() {
        Ok(at) => at,
        Err(e) => return fail(StatusCode::BAD_REQUEST, e),
    };
    let found: Result<ToolView, (StatusCode, String)> = match at {
        None => {
            let name = name.clone();
            daemon.with_registry(move |r| r.tool_view(&name)).await.map_err(|e| (registry_status(&e), e.to_string()))
        }
        Some((job, step)) => {
            let daemon = daemon.clone();
            let name = name.clone();
            tokio::task::spawn_blocking(move || {
                open_checkpoint(&daemon, &job, step)?.tool_view(&name).map_err(|e| (registry_status(&e), e.to_string()))
            })
            .await
            .unwrap_or_else(|e| Err((StatusCode::INTERNAL_SERVER_ERROR, e.to_string())))
        }
    };
    match found {
        // A browser opening a tool's address gets the page with the tool selected (the page's own
        // requests are relative to `/graph`, so it is served there).
        Ok(view) if html_wanted => {
            let mut response = StatusCode::SEE_OTHER.into_response();
            if let Ok(to) = HeaderValue::from_str(&format!("/graph#tool={}", view.name)) {
                response.headers_mut().insert(header::LOCATION, to);
            }
            response
        }
        Ok(view) => json_ok(&view),
        Err((status, message)) => fail(status, message),
    }
}

async fn events(State(daemon): State<Daemon>) -> Sse<impl tokio_stream::Stream<Item = Result<Event, Infallible>>> {
    let receiver = daemon.graph_events();
    // The state now comes first, so a change between the page's first load and this stream's
    // start is not missed.
    let now = daemon.graph_state().await.ok();
    let event = |e: GraphEvent| Event::default().event("graph").json_data(e).unwrap_or_else(|_| Event::default());
    // Lagging behind only skips to the newest state, which is all the page needs.
    let later = BroadcastStream::new(receiver).filter_map(move |e| Some(Ok(event(e.ok()?))));
    let stream = tokio_stream::iter(now.map(|e| Ok(event(e)))).chain(later);
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

async fn checkpoints(State(daemon): State<Daemon>) -> Response {
    let found = tokio::task::spawn_blocking(move || {
        daemon
            .checkpoint_graphs()
            .into_iter()
            .map(|(mut c, path)| {
                c.tools = Snapshot::open(&path).and_then(|s| s.view_stats()).map_or(0, |v| v.tools);
                c
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    json_ok(&json!({ "checkpoints": found }))
}

async fn not_found(UrlPath(rest): UrlPath<String>) -> Response {
    error_page(StatusCode::NOT_FOUND, &format!("nothing at /graph/{rest}"))
}

/// The checkpoints under a job directory that kept a tool graph, oldest first.
pub(crate) fn job_checkpoint_graphs(job: &str, run: &Path) -> Vec<(CheckpointGraph, PathBuf)> {
    let mut found: Vec<(CheckpointGraph, PathBuf)> = std::fs::read_dir(run.join("checkpoints"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name();
            let step = name.to_str()?.strip_prefix("step-")?.parse().ok()?;
            let path = entry.path().join(toolsmith_train::rl::training_graph::REGISTRY_FILE);
            path.is_file().then(|| (CheckpointGraph { job: job.to_string(), step, tools: 0 }, path))
        })
        .collect();
    found.sort_by_key(|(c, _)| c.step);
    found
}

/// The page as one file with the whole graph and every tool's details inside, for
/// `toolsmith tools graph --html` (no server: search runs in the page).
pub fn static_page(registry: &Registry) -> Result<String, RegistryError> {
    let graph: GraphView = registry.graph_view()?;
    let mut details: BTreeMap<String, ToolView> = BTreeMap::new();
    for node in graph.tools() {
        details.insert(node.name.clone(), registry.tool_view(&node.name)?);
    }
    let data = serde_json::to_string(&json!({ "graph": graph, "details": details }))
        .map_err(|e| RegistryError::Invalid(format!("cannot write the graph as JSON: {e}")))?;
    let filled = format!(r#"<script id="toolsmith-data" type="application/json">{}</script>"#, script_safe(&data));
    if !PAGE.contains(DATA_SLOT) || !PAGE.contains("<head>") {
        return Err(RegistryError::Invalid("the page has no data element".into()));
    }
    // A file has no response headers: the same policy goes in a meta element.
    let policy = format!(r#"<head>\n<meta http-equiv="Content-Security-Policy" content="{}">"#, CSP.as_str());
    Ok(PAGE.replacen(DATA_SLOT, &filled, 1).replacen("<head>", &policy, 1))
}

/// JSON that cannot end the `<script>` element it sits in, or open a comment there.
fn script_safe(json: &str) -> String {
    json.replace('<', "\\u003c").replace('>', "\\u003e").replace('&', "\\u0026")
}

/// Parses what [`static_page`] embedded (for tests and tools that read an exported page).
pub fn static_data(page: &str) -> Option<Value> {
    let start = page.find(r#"<script id="toolsmith-data" type="application/json">"#)?;
    let body = &page[start..];
    let body = &body[body.find('>')? + 1..];
    serde_json::from_str(&body[..body.find("</script>")?]).ok()
}

#[cfg(test)]
mod tests {
    use super::{escape_html, script_safe};

    #[test]
    fn text_cannot_become_markup() {
        assert_eq!(
            escape_html(r#"<img src=x onerror="a('b')">&"#),
            "&lt;img src=x onerror=&quot;a(&#39;b&#39;)&quot;&gt;&amp;"
        );
        let json =
            serde_json::to_string(&serde_json::json!({"d": "</script><script>alert(1)</script><!--"})).expect("json");
        let safe = script_safe(&json);
        assert!(!safe.contains('<') && !safe.contains('>'));
        let back: serde_json::Value = serde_json::from_str(&safe).expect("still JSON");
        assert_eq!(back["d"], "</script><script>alert(1)</script><!--");
    }
}
