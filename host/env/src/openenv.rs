//! The environment as an OpenEnv server (`toolsmith env serve`), as openenv-core 0.3 defines one.
//!
//! - `WS /ws`: the protocol OpenEnv's clients speak (`GenericEnvClient`, `MCPToolClient`, TRL's
//!   rollout functions): `{"type": "reset" | "step" | "state" | "mcp" | "close", "data": ...}`,
//!   one reply per message. A connection is one session; closing it ends its episode.
//! - `POST /reset`, `POST /step`, `GET /state`: the same over HTTP. OpenEnv's HTTP routes are
//!   stateless (a fresh environment per request), which cannot hold a multi-turn episode, so
//!   here `reset` answers an `episode_id` that `step` and `state` name (`POST /close` ends it).
//! - `POST /mcp`: JSON-RPC `tools/list` and `tools/call` over the episodes' own tools (world 0's).
//! - `GET /health`, `/metadata`, `/schema`, `/openapi.json`: what `openenv validate` checks.
//!
//! Actions: `{"text": "<think>..."}` (a turn in the trace grammar), `{"ids": [...], "logprobs":
//! [...]}` (the sampled ids, decoded with `--tokenizer`), or OpenEnv's MCP actions `{"type":
//! "list_tools"}` and `{"type": "call_tool", "tool_name": ..., "arguments": {...}}`.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::ws::{Message as WsMessage, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use toolsmith_daemon::http::{Guard, HttpOptions, finish};

use crate::{ClientTurn, EnvError, Environment, ResetRequest, StepResult};

/// The OpenEnv HTTP profile this server follows (`openenv validate` reads it from
/// `/openapi.json`).
pub const OPENENV_PROFILE_VERSION: &str = "1.0.0";

#[derive(Clone)]
struct Served {
    env: Arc<Environment>,
    guard: Arc<Guard>,
}

/// A bound OpenEnv server.
#[derive(Debug)]
pub struct EnvServer {
    listener: tokio::net::TcpListener,
    router: Router,
}

impl EnvServer {
    /// Binds `options.addr` for `env`, with the daemon's protections (a token off loopback, the
    /// `Host` and cross-site checks, a body cap).
    pub async fn bind(env: Arc<Environment>, options: HttpOptions) -> Result<EnvServer, EnvError> {
        let (listener, guard) = Guard::listen(options.addr, options.token.clone(), &options)
            .await
            .map_err(|e| EnvError::Internal(e.to_string()))?;
        let served = Served { env: env.clone(), guard: Arc::new(guard.clone()) };
        let protected = guard.wrap(
            Router::new()
                .route("/reset", post(reset))
                .route("/step", post(step))
                .route("/state", get(state))
                .route("/close", post(close))
                .route("/mcp", post(mcp))
                .route("/ws", get(socket))
                .route("/metadata", get(metadata))
                .route("/schema", get(schema))
                .route("/tasks", get(tasks))
                .with_state(served),
        );
        let router = finish(
            Router::new()
                .route("/health", get(|| async { axum::Json(json!({"status": "healthy"})) }))
                .route("/openapi.json", get(openapi))
                .merge(protected),
            options.max_body_bytes,
        );
        // Idle sessions are closed even when no request comes to trigger it.
        let reaper = Arc::downgrade(&env);
        let every = env
            .options()
            .idle_timeout
            .min(std::time::Duration::from_secs(30))
            .max(std::time::Duration::from_millis(100));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(env) = reaper.upgrade() else { break };
                let closed = env.reap();
                if closed > 0 {
                    tracing::info!(closed, "closed idle episodes");
                }
            }
        });
        Ok(EnvServer { listener, router })
    }

    /// The address bound (useful with port 0).
    pub fn local_addr(&self) -> Result<SocketAddr, EnvError> {
        self.listener.local_addr().map_err(|e| EnvError::Internal(format!("cannot read the listening address: {e}")))
    }

    /// Serves until `stop` resolves.
    pub async fn serve(self, stop: impl Future<Output = ()> + Send + 'static) -> Result<(), EnvError> {
        axum::serve(self.listener, self.router)
            .with_graceful_shutdown(stop)
            .await
            .map_err(|e| EnvError::Internal(format!("the HTTP server failed: {e}")))
    }
}

impl EnvError {
    fn status(&self) -> StatusCode {
        match self {
            EnvError::UnknownSession(_) => StatusCode::NOT_FOUND,
            EnvError::Finished(_) => StatusCode::CONFLICT,
            EnvError::Full(_) => StatusCode::SERVICE_UNAVAILABLE,
            EnvError::BadTurn(_) | EnvError::BadReset(_) => StatusCode::UNPROCESSABLE_ENTITY,
            EnvError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenEnv's WebSocket error code.
    fn code(&self) -> &'static str {
        match self {
            EnvError::BadTurn(_) | EnvError::BadReset(_) => "VALIDATION_ERROR",
            EnvError::Full(_) => "CAPACITY_REACHED",
            EnvError::UnknownSession(_) | EnvError::Finished(_) => "SESSION_ERROR",
            _ => "EXECUTION_ERROR",
        }
    }
}

impl IntoResponse for EnvError {
    fn into_response(self) -> Response {
        (self.status(), axum::Json(json!({"detail": self.to_string()}))).into_response()
    }
}

/// A bad request body, FastAPI's way.
fn unprocessable(message: impl Into<String>) -> Response {
    (StatusCode::UNPROCESSABLE_ENTITY, axum::Json(json!({"detail": message.into()}))).into_response()
}

/// A JSON body, or `{}` for none (OpenEnv's `reset` takes an empty or absent body).
fn body_json(body: &[u8]) -> Result<Value, Response> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    let value: Value = serde_json::from_slice(body).map_err(|e| unprocessable(format!("the body is not JSON: {e}")))?;
    if !value.is_object() {
        return Err(unprocessable("the body must be a JSON object"));
    }
    Ok(value)
}

/// A reset's fields; any others are OpenEnv's pass-through keyword arguments, ignored here.
fn reset_request(data: &Value, episode_id: Option<String>) -> Result<ResetRequest, String> {
    let seed = match data.get("seed") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().ok_or_else(|| format!("seed must be an integer >= 0, not {v}"))?),
    };
    let text = |key: &str| -> Result<Option<String>, String> {
        match data.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(format!("{key} must be a string, not {v}")),
        }
    };
    let world = match data.get("world") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().ok_or_else(|| format!("world must be an integer >= 0, not {v}"))? as usize),
    };
    Ok(ResetRequest { episode_id, task_id: text("task_id")?, world, seed })
}

/// What an action asks for.
enum Action {
    Turn(ClientTurn),
    ListTools,
    CallTool { name: String, arguments: Value },
}

fn action(value: &Value) -> Result<Action, String> {
    let object = value.as_object().ok_or("the action must be a JSON object")?;
    match object.get("type").and_then(Value::as_str) {
        Some("list_tools") => return Ok(Action::ListTools),
        Some("call_tool") => {
            let name = object.get("tool_name").and_then(Value::as_str).ok_or("call_tool needs a tool_name string")?;
            let arguments = object.get("arguments").cloned().unwrap_or_else(|| json!({}));
            return Ok(Action::CallTool { name: name.to_string(), arguments });
        }
        Some(other) if other != "turn" => {
            return Err(format!("unknown action type {other:?}: turn, list_tools or call_tool"));
        }
        _ => {}
    }
    for key in object.keys() {
        if !matches!(key.as_str(), "text" | "ids" | "logprobs" | "metadata" | "type") {
            return Err(format!("unknown action field {key:?}: a turn is {{\"text\"}} or {{\"ids\", \"logprobs\"}}"));
        }
    }
    let text = match object.get("text") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => return Err(format!("text must be a string, not {v}")),
    };
    let ids = match object.get("ids") {
        None | Some(Value::Null) => None,
        Some(Value::Array(ids)) => Some(
            ids.iter()
                .map(|v| v.as_i64().ok_or_else(|| format!("token ids are integers, not {v}")))
                .collect::<Result<Vec<i64>, String>>()?,
        ),
        Some(v) => return Err(format!("ids must be an array of integers, not {v}")),
    };
    let logprobs = match object.get("logprobs") {
        None | Some(Value::Null) => None,
        Some(Value::Array(lps)) => Some(
            lps.iter()
                .map(|v| v.as_f64().ok_or_else(|| format!("log-probs are numbers, not {v}")))
                .collect::<Result<Vec<f64>, String>>()?,
        ),
        Some(v) => return Err(format!("logprobs must be an array of numbers, not {v}")),
    };
    Ok(Action::Turn(ClientTurn { text, ids, logprobs }))
}

/// An observation on the wire: OpenEnv lifts `reward` and `done` out of it.
fn observation_reply(id: &str, result: &StepResult) -> Value {
    let mut observation = serde_json::to_value(&result.observation).unwrap_or_else(|_| json!({}));
    observation["episode_id"] = json!(id);
    observation["result"] = result.info.clone();
    json!({"observation": observation, "reward": result.reward, "done": result.done})
}

async fn do_reset(env: &Environment, request: ResetRequest) -> Result<Value, EnvError> {
    let (id, observation) = env.reset(request).await?;
    let result = StepResult { observation, reward: 0.0, done: false, info: json!({}) };
    let mut reply = observation_reply(&id, &result);
    reply["reward"] = Value::Null;
    Ok(reply)
}

/// A step of any action: a turn advances the episode; the MCP actions call its tools.
async fn do_step(env: &Environment, id: &str, action: Action) -> Result<Value, EnvError> {
    match action {
        Action::Turn(turn) => {
            let result = env.step(id, turn).await?;
            Ok(observation_reply(id, &result))
        }
        Action::ListTools => {
            let tools: Vec<Value> = env
                .tools()
                .iter()
                .map(|m| json!({"name": m.name.as_str(), "description": m.description, "input_schema": m.input_schema}))
                .collect();
            Ok(json!({"observation": {"tools": tools}, "reward": null, "done": false}))
        }
        Action::CallTool { name, arguments } => {
            // A tool's own failure is its result (`isError`), as MCP reports it; OpenEnv's
            // `error` is for the transport, which cannot fail in process.
            let result = call_result(env.call_tool(&name, arguments).await);
            Ok(
                json!({"observation": {"tool_name": name, "result": result, "error": null}, "reward": null, "done": false}),
            )
        }
    }
}

/// A tool's result as MCP writes one (`data` is what OpenEnv's client returns from `call_tool`).
fn call_result(value: Result<Value, toolsmith_contract::StructuredError>) -> Value {
    match value {
        Ok(v) => {
            json!({"content": [{"type": "text", "text": v.to_string()}], "structuredContent": v, "data": v, "isError": false})
        }
        Err(e) => {
            let envelope = json!({"error": e});
            json!({"content": [{"type": "text", "text": envelope.to_string()}], "structuredContent": envelope, "data": envelope, "isError": true})
        }
    }
}

async fn reset(State(served): State<Served>, body: axum::body::Bytes) -> Response {
    let data = match body_json(&body) {
        Ok(d) => d,
        Err(r) => return r,
    };
    let episode_id = data.get("episode_id").and_then(Value::as_str).map(str::to_string);
    let request = match reset_request(&data, episode_id) {
        Ok(r) => r,
        Err(e) => return unprocessable(e),
    };
    match do_reset(&served.env, request).await {
        Ok(reply) => axum::Json(reply).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn step(State(served): State<Served>, body: axum::body::Bytes) -> Response {
    let data = match body_json(&body) {
        Ok(d) => d,
        Err(r) => return r,
    };
    let Some(raw) = data.get("action") else { return unprocessable("the body needs an `action` object") };
    let action = match action(raw) {
        Ok(a) => a,
        Err(e) => return unprocessable(e),
    };
    let id = data.get("episode_id").and_then(Value::as_str);
    let id = match (&action, id) {
        (Action::Turn(_), None) => {
            return unprocessable(
                "a turn over HTTP names its episode: send the `episode_id` that /reset returned (or use /ws)",
            );
        }
        (_, id) => id.unwrap_or_default().to_string(),
    };
    match do_step(&served.env, &id, action).await {
        Ok(reply) => axum::Json(reply).into_response(),
        Err(e) => e.into_response(),
    }
}

#[derive(Deserialize)]
struct EpisodeQuery {
    episode_id: Option<String>,
}

async fn state(State(served): State<Served>, Query(q): Query<EpisodeQuery>) -> Response {
    match q.episode_id {
        // OpenEnv's stateless HTTP state: a fresh environment's.
        None => axum::Json(json!({"episode_id": null, "step_count": 0})).into_response(),
        Some(id) => match served.env.state(&id).await {
            Ok(s) => axum::Json(s).into_response(),
            Err(e) => e.into_response(),
        },
    }
}

async fn close(State(served): State<Served>, body: axum::body::Bytes) -> Response {
    let data = match body_json(&body) {
        Ok(d) => d,
        Err(r) => return r,
    };
    let Some(id) = data.get("episode_id").and_then(Value::as_str) else {
        return unprocessable("close names the `episode_id` to end");
    };
    axum::Json(json!({"episode_id": id, "closed": served.env.close(id)})).into_response()
}

async fn tasks(State(served): State<Served>) -> Response {
    let tasks: Vec<Value> =
        served.env.tasks().into_iter().map(|(w, id, q)| json!({"world": w, "task_id": id, "question": q})).collect();
    axum::Json(json!({"tasks": tasks})).into_response()
}

async fn metadata(State(served): State<Served>) -> Response {
    let config = served.env.sampler().config();
    axum::Json(json!({
        "name": "toolsmith",
        "description": format!(
            "Toolsmith's sandboxed tools and tool graph as an environment: {} episodes ({} mode), rewarded by the method's reward",
            config.method, config.method.mode()
        ),
        "readme_content": null,
        "version": env!("CARGO_PKG_VERSION"),
        "author": null,
        "documentation_url": null,
        "method": config.method.name(),
        "mode": config.method.mode().name(),
        "tasks": served.env.tasks().len(),
        "max_sessions": served.env.options().max_sessions,
    }))
    .into_response()
}

/// The action, observation and state schemas.
fn schemas() -> Value {
    json!({
        "action": {
            "title": "ToolsmithAction",
            "type": "object",
            "description": "The model's turn (text in the trace grammar, or sampled token ids), or an MCP action.",
            "properties": {
                "type": {"enum": ["turn", "list_tools", "call_tool"], "default": "turn"},
                "text": {"type": "string", "description": "The turn as text: <think>, <plan>, <tool_call>, <answer> blocks."},
                "ids": {"type": "array", "items": {"type": "integer", "minimum": 0}, "description": "The turn as sampled token ids (needs --tokenizer)."},
                "logprobs": {"type": "array", "items": {"type": "number"}, "description": "The behaviour log-prob of each id."},
                "tool_name": {"type": "string"},
                "arguments": {"type": "object"},
                "metadata": {"type": "object", "additionalProperties": true}
            },
            "additionalProperties": false
        },
        "observation": {
            "title": "ToolsmithObservation",
            "type": "object",
            "properties": {
                "episode_id": {"type": "string"},
                "question": {"type": "string"},
                "messages": {"type": "array", "items": {"type": "object", "properties": {"role": {"type": "string"}, "content": {"type": "string"}}}},
                "tools": {"type": "array", "items": {"type": "object"}},
                "observation": {"type": "string", "description": "What the runtime wrote back after the last turn."},
                "turn": {"type": "integer", "minimum": 0},
                "result": {"type": "object", "description": "Once done: the reward's parts, correctness, answer and finish."},
                "done": {"type": "boolean", "default": false},
                "reward": {"anyOf": [{"type": "number"}, {"type": "null"}], "default": null}
            }
        },
        "state": {
            "title": "ToolsmithState",
            "type": "object",
            "additionalProperties": true,
            "properties": {
                "episode_id": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null},
                "step_count": {"type": "integer", "minimum": 0, "default": 0},
                "task_id": {"type": "string"},
                "world": {"type": "integer"},
                "done": {"type": "boolean"},
                "reward": {"anyOf": [{"type": "number"}, {"type": "null"}]}
            }
        }
    })
}

async fn schema() -> Response {
    axum::Json(schemas()).into_response()
}

async fn openapi() -> Response {
    let body = |description: &str| json!({"description": description, "content": {"application/json": {"schema": {"type": "object"}}}});
    let op = |summary: &str| json!({"summary": summary, "responses": {"200": body("OK")}});
    axum::Json(json!({
        "openapi": "3.1.0",
        "info": {"title": "Toolsmith environment (OpenEnv HTTP API)", "version": OPENENV_PROFILE_VERSION},
        "paths": {
            "/reset": {"post": op("Start an episode; answers its episode_id and first observation")},
            "/step": {"post": op("Take a turn in the episode named by episode_id")},
            "/state": {"get": op("Where an episode stands (?episode_id=)")},
            "/close": {"post": op("End an episode")},
            "/health": {"get": op("Liveness")},
            "/metadata": {"get": op("What this environment is")},
            "/schema": {"get": op("Action, observation and state schemas")},
            "/mcp": {"post": op("JSON-RPC tools/list and tools/call")},
            "/tasks": {"get": op("The tasks episodes are drawn from")}
        }
    }))
    .into_response()
}

/// One JSON-RPC request's reply (MCP's `tools/list` and `tools/call`, and OpenEnv's session
/// methods, whose sessions are the episodes' own).
async fn json_rpc(env: &Environment, request: &Value) -> Value {
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let error = |code: i64, message: String| json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message, "data": null}});
    let (Some("2.0"), Some(method)) =
        (request.get("jsonrpc").and_then(Value::as_str), request.get("method").and_then(Value::as_str))
    else {
        return error(-32600, "Invalid request: a JSON-RPC 2.0 request has \"jsonrpc\": \"2.0\" and a method".into());
    };
    let params = request.get("params").cloned().unwrap_or_else(|| json!({}));
    let result = match method {
        "initialize" => json!({
            "protocolVersion": params.get("protocolVersion").cloned().unwrap_or(json!("2025-06-18")),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "toolsmith-env", "version": env!("CARGO_PKG_VERSION")}
        }),
        "tools/list" => {
            let tools: Vec<Value> = env.tools().iter().map(toolsmith_contract::Manifest::to_mcp_tool).collect();
            json!({"tools": tools})
        }
        "tools/call" => {
            let Some(name) = params.get("name").and_then(Value::as_str) else {
                return error(-32602, "tools/call needs params.name".into());
            };
            if !env.tools().iter().any(|m| m.name.as_str() == name) {
                return error(-32603, format!("Unknown tool: '{name}'"));
            }
            let arguments = params.get("arguments").cloned().unwrap_or_else(|| json!({}));
            call_result(env.call_tool(name, arguments).await)
        }
        "openenv/session/create" => json!({"session_id": format!("mcp-{:x}", crate::rand_u64())}),
        "openenv/session/close" => json!({"session_id": params.get("session_id"), "closed": true}),
        "notifications/initialized" | "ping" => json!({}),
        other => return error(-32601, format!("Method not found: {other}")),
    };
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

async fn mcp(State(served): State<Served>, body: axum::body::Bytes) -> Response {
    // Always 200 with a JSON-RPC reply, as OpenEnv's servers answer (`openenv validate` posts `{}`).
    let reply = match serde_json::from_slice::<Value>(&body) {
        Err(_) => {
            json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": "Parse error", "data": null}})
        }
        Ok(request) => json_rpc(&served.env, &request).await,
    };
    axum::Json(reply).into_response()
}

async fn socket(State(served): State<Served>, headers: HeaderMap, upgrade: WebSocketUpgrade) -> Response {
    // A browser may open a socket to any site; only allowed origins may drive episodes here.
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        if !served.guard.origin_allowed(origin) {
            tracing::warn!(origin, "refused a WebSocket from a foreign origin");
            return (StatusCode::FORBIDDEN, axum::Json(json!({"detail": format!("origin {origin} is refused")})))
                .into_response();
        }
    }
    upgrade.max_message_size(16 << 20).on_upgrade(move |ws| session_socket(served.env, ws))
}

fn ws_error(message: impl Into<String>, code: &str) -> Value {
    json!({"type": "error", "data": {"message": message.into(), "code": code}})
}

/// One connection, one session: its episode is closed when the socket closes, however it
/// closes (the client's `close`, a dropped connection, an error).
async fn session_socket(env: Arc<Environment>, mut ws: WebSocket) {
    let mut current: Option<String> = None;
    while let Some(Ok(message)) = ws.recv().await {
        let text = match message {
            WsMessage::Text(t) => t.to_string(),
            WsMessage::Binary(b) => String::from_utf8_lossy(&b).into_owned(),
            WsMessage::Close(_) => break,
            _ => continue,
        };
        let request: Value = match serde_json::from_str(&text) {
            Ok(v) => v,
            Err(e) => {
                if send(&mut ws, &ws_error(format!("Invalid JSON: {e}"), "INVALID_JSON")).await.is_err() {
                    break;
                }
                continue;
            }
        };
        let data = request.get("data").cloned().unwrap_or_else(|| json!({}));
        let reply = match request.get("type").and_then(Value::as_str) {
            Some("close") => break,
            Some("reset") => {
                if let Some(old) = current.take() {
                    env.close(&old);
                }
                match reset_request(&data, None) {
                    Err(e) => ws_error(e, "VALIDATION_ERROR"),
                    Ok(r) => match do_reset(&env, r).await {
                        Ok(reply) => {
                            current = reply["observation"]["episode_id"].as_str().map(str::to_string);
                            json!({"type": "observation", "data": reply})
                        }
                        Err(e) => ws_error(e.to_string(), e.code()),
                    },
                }
            }
            Some("step") => match action(&data) {
                Err(e) => ws_error(e, "VALIDATION_ERROR"),
                Ok(a) => {
                    let needs_episode = matches!(a, Action::Turn(_));
                    match (&current, needs_episode) {
                        (None, true) => ws_error("reset first: this connection has no episode", "SESSION_ERROR"),
                        (id, _) => match do_step(&env, id.as_deref().unwrap_or_default(), a).await {
                            Ok(reply) => json!({"type": "observation", "data": reply}),
                            Err(e) => ws_error(e.to_string(), e.code()),
                        },
                    }
                }
            },
            Some("state") => match &current {
                None => json!({"type": "state", "data": {"episode_id": null, "step_count": 0}}),
                Some(id) => match env.state(id).await {
                    Ok(s) => json!({"type": "state", "data": s}),
                    Err(e) => ws_error(e.to_string(), e.code()),
                },
            },
            Some("mcp") => json!({"type": "mcp", "data": json_rpc(&env, &data).await}),
            Some(other) => ws_error(format!("Unknown message type: {other}"), "UNKNOWN_TYPE"),
            None => ws_error("a message has a \"type\"", "UNKNOWN_TYPE"),
        };
        if send(&mut ws, &reply).await.is_err() {
            break;
        }
    }
    if let Some(id) = current {
        env.close(&id);
    }
    // 1000, as OpenEnv's servers close: a normal end, not an error.
    let frame = axum::extract::ws::CloseFrame { code: axum::extract::ws::close_code::NORMAL, reason: "".into() };
    let _ = ws.send(WsMessage::Close(Some(frame))).await;
}

async fn send(ws: &mut WebSocket, value: &Value) -> Result<(), axum::Error> {
    ws.send(WsMessage::Text(value.to_string().into())).await
}
