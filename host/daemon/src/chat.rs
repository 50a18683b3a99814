//! The local policy as an OpenAI-compatible endpoint: `POST /v1/chat/completions` (streaming
//! with server-sent events when `"stream": true`) and `GET /v1/models`, so other agents can use
//! it and the HTTP backend has a real peer.
//!
//! For RL rollouts it also speaks what vLLM and SGLang offer trainers: `POST /v1/completions`
//! takes the prompt as token ids and, with `"return_token_ids": true` and `"logprobs"`, returns
//! the sampled ids and their log-probs (token in, token out: nothing is re-tokenised), and
//! `POST /update_weights_from_disk` (SGLang's name) swaps in a checkpoint directory. A request
//! holds the policy for its whole generation, so the swap waits for requests in flight, which
//! finish on the old weights; every response names the checkpoint (its optimiser step) that
//! answered in `toolsmith.step`.

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

use toolsmith_policy::{AdapterFiles, FinishReason, LoadOptions, Policy};

use toolsmith_agent::backend::{
    BackendError, BatchConfig, BatchedBackend, GenerateOptions, LocalBackend, Message, Prompt as BatchPrompt,
};

/// Tokens a running batch decodes between admissions of new requests: small enough that a new
/// request starts within a few tokens' time, large enough that pausing (feeding each sequence's
/// last token again from the prefix cache) costs little.
pub const JOIN_EVERY: usize = 8;

/// The served policy: what the endpoints answer with, and what weight swaps (an update request,
/// or the job runner after each checkpoint) replace. Cheap to clone; clones share the policy.
#[derive(Clone, Debug)]
pub struct Served {
    policy: std::sync::Arc<std::sync::Mutex<Policy>>,
    /// The same policy behind continuous batching: concurrent requests decode together, a new
    /// one joining the running batch within [`JOIN_EVERY`] tokens.
    batched: BatchedBackend,
    /// Held through a whole weight update, so two updates cannot swap in out of order.
    updating: std::sync::Arc<std::sync::Mutex<()>>,
}

impl Served {
    /// Serves `backend`'s policy.
    pub fn new(backend: LocalBackend) -> Served {
        let config = BatchConfig { join_every: JOIN_EVERY, ..BatchConfig::default() };
        let policy = backend.policy();
        let batched = BatchedBackend::new(policy.clone(), "served", config);
        Served { policy, batched, updating: Default::default() }
    }

    /// Loads the checkpoint in `dir` beside the served policy, then swaps it in and returns its
    /// step. Blocking. No request sees half-loaded weights: the swap happens between two chunks of the
    /// continuous batch, and a request in flight continues on the new weights (its reply names
    /// the step that finished it). A checkpoint of another
    /// tokenizer or architecture is refused and the old weights keep serving.
    pub fn swap(&self, dir: &std::path::Path) -> Result<u64, String> {
        let _one_at_a_time = toolsmith_contract::sync::lock(&self.updating);
        let shared = self.policy.clone();
        // An adapter for the served base is swapped alone: a few MB instead of the whole model.
        if toolsmith_policy::lora::has_adapter(dir) {
            let files = AdapterFiles::read(dir).map_err(|e| e.to_string())?;
            // A checkpoint's adapter records the step its state does.
            let step = files.step();
            let mut current = toolsmith_contract::sync::lock(&shared);
            match current.apply_adapter(&files) {
                Ok(()) => {
                    let step = step.unwrap_or(current.state().step);
                    current.state_mut().step = step;
                    tracing::info!(dir = %dir.display(), step, "swapped in LoRA adapters");
                    return Ok(step);
                }
                // A checkpoint with its own base loads whole below; a lone adapter cannot.
                Err(e) if !dir.join("config.json").is_file() => return Err(e.to_string()),
                Err(_) => {}
            }
        }
        let (options, tokenizer, config) = {
            let current = toolsmith_contract::sync::lock(&shared);
            (
                LoadOptions { device: current.device(), precision: Some(current.state().precision) },
                current.tokenizer().hash().to_string(),
                current.config().spec().ok(),
            )
        };
        // Loaded without the lock: requests keep being served meanwhile.
        let fresh = Policy::load(dir, options).map_err(|e| e.to_string())?;
        if fresh.tokenizer().hash() != tokenizer {
            return Err("the checkpoint's tokenizer differs from the served model's".into());
        }
        if fresh.config().spec().ok() != config {
            return Err("the checkpoint's architecture differs from the served model's".into());
        }
        let step = fresh.state().step;
        *toolsmith_contract::sync::lock(&shared) = fresh;
        Ok(step)
    }
}

#[derive(Clone, Debug)]
struct ChatState {
    served: Served,
    model: String,
}

/// The routes, for [`crate::http::HttpOptions::extra_routes`] or on their own.
pub fn chat_router(backend: LocalBackend, model: impl Into<String>) -> Router {
    served_router(Served::new(backend), model)
}

/// [`chat_router`] over a [`Served`] policy that someone else (the job runner) also swaps.
pub fn served_router(served: Served, model: impl Into<String>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/update_weights_from_disk", post(update_weights))
        .with_state(ChatState { served, model: model.into() })
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
    #[serde(flatten)]
    sampling: Sampling,
    #[serde(default)]
    stream: bool,
}

/// The sampling fields both endpoints take.
#[derive(Debug, Deserialize)]
struct Sampling {
    #[serde(default, alias = "max_completion_tokens")]
    max_tokens: Option<usize>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    /// vLLM's "no top-k" is -1.
    #[serde(default)]
    top_k: Option<i64>,
    #[serde(default)]
    repetition_penalty: Option<f64>,
    #[serde(default)]
    stop: Option<Stop>,
    #[serde(default)]
    seed: Option<u64>,
}

impl Sampling {
    /// The generation options, `default_max` tokens unless asked otherwise; a bad setting is
    /// the client's error.
    fn options(self, default_max: usize) -> Result<GenerateOptions, Response> {
        if let Some(t) = self.temperature.filter(|t| !(0.0..=2.0).contains(t)) {
            return Err(error(StatusCode::BAD_REQUEST, format!("temperature {t} is outside [0, 2]")));
        }
        Ok(GenerateOptions {
            max_tokens: self.max_tokens.unwrap_or(default_max).clamp(1, 8192),
            temperature: self.temperature.unwrap_or(1.0),
            top_p: self.top_p.unwrap_or(1.0).clamp(f64::MIN_POSITIVE, 1.0),
            top_k: self.top_k.filter(|&k| k > 0).map_or(0, |k| k as usize),
            repetition_penalty: self.repetition_penalty.unwrap_or(1.0),
            stop: match self.stop {
                None => Vec::new(),
                Some(Stop::One(s)) => vec![s],
                Some(Stop::Many(v)) => v,
            },
            seed: self.seed.unwrap_or(GenerateOptions::default().seed),
            stop_loops: false,
        })
    }
}

fn error(status: StatusCode, message: String) -> Response {
    (status, axum::Json(json!({"error": {"message": message, "type": "invalid_request_error"}}))).into_response()
}

/// Bad requests (a template the messages break, sampling settings, a prompt the model cannot
/// take) are the client's; anything else is the server's.
fn status_of(e: &BackendError) -> StatusCode {
    match e {
        BackendError::Template(_)
        | BackendError::ContextFull { .. }
        | BackendError::Policy(toolsmith_policy::PolicyError::Sampling(_)) => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Ids(Vec<i64>),
}

#[derive(Debug, Deserialize)]
struct CompletionRequest {
    #[serde(default)]
    model: Option<String>,
    prompt: Prompt,
    #[serde(flatten)]
    sampling: Sampling,
    /// `true` or a count (OpenAI's legacy form): the sampled tokens' log-probs are returned either
    /// way; alternatives are not.
    #[serde(default)]
    logprobs: Option<Value>,
    #[serde(default)]
    return_token_ids: bool,
}

fn finish_name(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Eos => "eos",
        FinishReason::StopToken => "stop_token",
        FinishReason::StopString => "stop_string",
        FinishReason::Length => "length",
        FinishReason::Constraint => "constraint",
    }
}

/// `POST /v1/completions`: a prompt as text or token ids, sampled on the local policy.
async fn completions(State(state): State<ChatState>, body: Bytes) -> Response {
    let request: CompletionRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid request body: {e}")),
    };
    let options = match request.sampling.options(16) {
        Ok(o) => o,
        Err(response) => return response,
    };
    let want_logprobs = matches!(request.logprobs, Some(Value::Bool(true) | Value::Number(_)));
    let model = request.model.unwrap_or(state.model.clone());
    let prompt = match request.prompt {
        Prompt::Text(text) => BatchPrompt::Text(text),
        Prompt::Ids(ids) => BatchPrompt::Ids(ids),
    };
    // Continuous batching: an engine's concurrent rollouts decode together.
    let (g, step) = match state.served.batched.generate(prompt, &options).await {
        Ok((g, _, step)) => (g, step),
        Err(e) => return error(status_of(&e), e.to_string()),
    };
    let prompt_ids = g.prompt_ids.clone();
    let finish = if g.finish_reason == FinishReason::Length { "length" } else { "stop" };
    let mut choice = json!({"index": 0, "text": g.text, "finish_reason": finish});
    if request.return_token_ids {
        choice["token_ids"] = json!(g.output_ids);
    }
    if want_logprobs {
        choice["logprobs"] = json!({"token_logprobs": g.logprobs});
    }
    let mut body = json!({
        "id": format!("cmpl-{}", now()), "object": "text_completion", "created": now(), "model": model,
        "choices": [choice],
        "usage": {"prompt_tokens": prompt_ids.len(), "completion_tokens": g.output_ids.len(),
                  "total_tokens": prompt_ids.len() + g.output_ids.len()},
        "toolsmith": {"step": step, "finish": finish_name(g.finish_reason)},
    });
    if request.return_token_ids {
        body["prompt_token_ids"] = json!(prompt_ids);
    }
    axum::Json(body).into_response()
}

#[derive(Debug, Deserialize)]
struct UpdateWeights {
    model_path: std::path::PathBuf,
}

/// `POST /update_weights_from_disk {"model_path": DIR}`: loads the checkpoint beside the served
/// one, then swaps it in. A checkpoint of another tokenizer or architecture is refused and the
/// old weights keep serving.
async fn update_weights(State(state): State<ChatState>, body: Bytes) -> Response {
    let request: UpdateWeights = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid request body: {e}")),
    };
    let served = state.served.clone();
    let joined = tokio::task::spawn_blocking(move || served.swap(&request.model_path)).await;
    match joined {
        Ok(Ok(step)) => axum::Json(json!({"success": true, "message": "weights updated", "toolsmith": {"step": step}}))
            .into_response(),
        Ok(Err(e)) => error(StatusCode::BAD_REQUEST, e),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
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
    let options = match request.sampling.options(256) {
        Ok(o) => o,
        Err(response) => return response,
    };
    let model = request.model.unwrap_or(state.model.clone());
    let id = format!("chatcmpl-{}", now());
    let messages = request.messages;
    if !request.stream {
        return match state.served.batched.complete_with_step(&messages, &options).await {
            Ok((c, step)) => axum::Json(json!({
                "id": id, "object": "chat.completion", "created": now(), "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": c.text}, "finish_reason": c.finish_reason}],
                "usage": {"prompt_tokens": c.usage.prompt_tokens, "completion_tokens": c.usage.completion_tokens,
                          "total_tokens": c.usage.prompt_tokens + c.usage.completion_tokens},
                "toolsmith": {"step": step},
            }))
            .into_response(),
            Err(e) => error(status_of(&e), e.to_string()),
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
    // Streamed through the continuous batch too: the text arrives as it becomes final (every
    // few tokens), and a streaming client never holds the policy from the others.
    let batched = state.served.batched.clone();
    tokio::spawn(async move {
        let _ = tx.send(chunk(json!({"role": "assistant", "content": ""}), Value::Null));
        let (pieces, mut text) = tokio::sync::mpsc::unbounded_channel::<String>();
        let generation = batched.complete_streaming(&messages, &options, pieces);
        tokio::pin!(generation);
        // A closed channel means the client left; generation simply finishes unseen.
        let result = loop {
            tokio::select! {
                Some(piece) = text.recv() => {
                    let _ = tx.send(chunk(json!({"content": piece}), Value::Null));
                }
                result = &mut generation => break result,
            }
        };
        while let Ok(piece) = text.try_recv() {
            let _ = tx.send(chunk(json!({"content": piece}), Value::Null));
        }
        match result {
            Ok((c, _)) => {
                let _ = tx.send(chunk(json!({}), json!(c.finish_reason)));
            }
            Err(e) => {
                let _ = tx.send(json!({"error": {"message": e.to_string()}}));
            }
        }
    });
    let events = UnboundedReceiverStream::new(rx)
        .map(|v| Ok::<Event, Infallible>(Event::default().data(v.to_string())))
        .chain(tokio_stream::once(Ok(Event::default().data("[DONE]"))));
    Sse::new(events).into_response()
}
