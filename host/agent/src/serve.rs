//! The local policy as an OpenAI-compatible endpoint: `POST /v1/chat/completions` (streaming
//! with server-sent events when `"stream": true`) and `GET /v1/models`, so other agents can use
//! it and the HTTP backend has a real peer.

use std::convert::Infallible;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::backend::{BackendError, GenerateOptions, LocalBackend, Message};

#[derive(Clone, Debug)]
struct ChatState {
    backend: LocalBackend,
    model: String,
}

/// The routes, for [`toolsmith_host::daemon::http::HttpOptions::extra_routes`] or on their own.
pub fn chat_router(backend: LocalBackend, model: impl Into<String>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .with_state(ChatState { backend, model: model.into() })
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
struct ChatRequest {
    #[serde(default)]
    model: Option<String>,
    messages: Vec<Message>,
    #[serde(default, alias = "max_completion_tokens")]
    max_tokens: Option<usize>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    stop: Option<Stop>,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    stream: bool,
}

fn error(status: StatusCode, message: String) -> Response {
    (status, axum::Json(json!({"error": {"message": message, "type": "invalid_request_error"}}))).into_response()
}

/// Bad requests (a template the messages break, sampling settings, a prompt the model cannot
/// take) are the client's; anything else is the server's.
fn status_of(e: &BackendError) -> StatusCode {
    match e {
        BackendError::Template(_) | BackendError::Policy(toolsmith_policy::PolicyError::Sampling(_)) => {
            StatusCode::BAD_REQUEST
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

async fn models(State(state): State<ChatState>) -> Response {
    axum::Json(json!({"object": "list", "data": [{"id": state.model, "object": "model", "owned_by": "toolsmith"}]}))
        .into_response()
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

async fn chat(State(state): State<ChatState>, body: Bytes) -> Response {
    let request: ChatRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid request body: {e}")),
    };
    if request.messages.is_empty() {
        return error(StatusCode::BAD_REQUEST, "messages is empty".into());
    }
    if let Some(t) = request.temperature.filter(|t| !(0.0..=2.0).contains(t)) {
        return error(StatusCode::BAD_REQUEST, format!("temperature {t} is outside [0, 2]"));
    }
    let defaults = GenerateOptions::default();
    let options = GenerateOptions {
        max_tokens: request.max_tokens.unwrap_or(256).clamp(1, 8192),
        temperature: request.temperature.unwrap_or(1.0),
        top_p: request.top_p.unwrap_or(1.0).clamp(f64::MIN_POSITIVE, 1.0),
        stop: match request.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(v)) => v,
        },
        seed: request.seed.unwrap_or(defaults.seed),
        ..defaults
    };
    let model = request.model.unwrap_or(state.model.clone());
    let id = format!("chatcmpl-{}", now());
    let messages = request.messages;
    if !request.stream {
        let backend = state.backend.clone();
        let joined = tokio::task::spawn_blocking(move || backend.complete_blocking(&messages, &options, None)).await;
        return match joined {
            Ok(Ok(c)) => axum::Json(json!({
                "id": id, "object": "chat.completion", "created": now(), "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": c.text}, "finish_reason": c.finish_reason}],
                "usage": {"prompt_tokens": c.usage.prompt_tokens, "completion_tokens": c.usage.completion_tokens,
                          "total_tokens": c.usage.prompt_tokens + c.usage.completion_tokens},
            }))
            .into_response(),
            Ok(Err(e)) => error(status_of(&e), e.to_string()),
            Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        };
    }
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Value>();
    let chunk = {
        let (id, model) = (id.clone(), model.clone());
        move |delta: Value, finish: Value| {
            json!({"id": id, "object": "chat.completion.chunk", "created": now(), "model": model,
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        }
    };
    let backend = state.backend.clone();
    let on_panic = tx.clone();
    let generation = tokio::task::spawn_blocking(move || {
        let _ = tx.send(chunk(json!({"role": "assistant", "content": ""}), Value::Null));
        let mut on_text = |text: &str| {
            // A closed channel means the client left; generation simply finishes unseen.
            let _ = tx.send(chunk(json!({"content": text}), Value::Null));
        };
        match backend.complete_blocking(&messages, &options, Some(&mut on_text)) {
            Ok(c) => {
                let _ = tx.send(chunk(json!({}), json!(c.finish_reason)));
            }
            Err(e) => {
                let _ = tx.send(json!({"error": {"message": e.to_string()}}));
            }
        }
    });
    tokio::spawn(async move {
        if let Err(e) = generation.await {
            let _ = on_panic.send(json!({"error": {"message": format!("generation failed: {e}")}}));
        }
    });
    let events = UnboundedReceiverStream::new(rx)
        .map(|v| Ok::<Event, Infallible>(Event::default().data(v.to_string())))
        .chain(tokio_stream::once(Ok(Event::default().data("[DONE]"))));
    Sse::new(events).into_response()
}
