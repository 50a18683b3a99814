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
    BackendError, BatchConfig, BatchedBackend, GenerateOptions, LocalBackend, Prompt as BatchPrompt,
};

/// Tokens a running batch decodes between admissions of new requests: small enough that a new
/// request starts within a few tokens' time, large enough that pausing (feeding each sequence's
/// last token again from the prefix cache) costs little.
pub const JOIN_EVERY: usize = 8;

pub mod calls;
pub mod request;

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
    /// The served policy's tokenizer.
    pub fn tokenizer(&self) -> toolsmith_policy::Tokenizer {
        toolsmith_contract::sync::lock(&self.policy).tokenizer().clone()
    }

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
    /// The served tokenizer (a swap never changes it): log-prob tokens are decoded with it.
    tokenizer: std::sync::Arc<toolsmith_policy::Tokenizer>,
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
        .route("/policy/status", get(policy_status))
        .with_state(ChatState { tokenizer: std::sync::Arc::new(served.tokenizer()), served, model: model.into() })
}

/// `GET /policy/status`: the served model, its step and the requests it is decoding.
async fn policy_status(State(state): State<ChatState>) -> Response {
    let step = toolsmith_contract::sync::lock(&state.served.policy).state().step;
    axum::Json(json!({"model": state.model, "step": step, "in_flight": state.served.batched.in_flight()}))
        .into_response()
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
    let request = match request::parse_completion(&body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.0),
    };
    let (options, want_logprobs) = (request.options, request.logprobs);
    // The answer names the checkpoint that is served, whatever the request asked for.
    let model = state.model.clone();
    let prompt = match request.prompt {
        request::Prompt::Text(text) => BatchPrompt::Text(text),
        request::Prompt::Ids(ids) => BatchPrompt::Ids(ids),
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

/// A process-wide counter, so that ids of requests in the same second differ.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn request_id() -> String {
    let n = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("{:x}{nanos:08x}{n:x}", now())
}

/// One finished choice, as the client receives it.
struct Answer {
    content: Option<String>,
    calls: Vec<calls::Call>,
    invalid: Vec<calls::Invalid>,
    finish_reason: &'static str,
    generation: toolsmith_policy::Generation,
    step: u64,
}

/// The choice's text, closed where the grammar allows when the budget cut it (the rest of an
/// open call or document), so a constrained answer always parses.
fn closed_text(request: &request::ChatRequest, g: &toolsmith_policy::Generation) -> String {
    let mut text = g.text.clone();
    if g.finish_reason == FinishReason::Length
        && let Some(grammar) = &request.grammar
    {
        let mut matcher = toolsmith_policy::TurnMatcher::new(grammar.clone());
        if matcher.feed(&text)
            && let Some(rest) = matcher.closing()
        {
            text.push_str(&rest);
        }
    }
    text
}

fn finish_reason(g: &toolsmith_policy::Generation, calls: usize) -> &'static str {
    if g.finish_reason == FinishReason::Length {
        "length"
    } else if calls > 0 {
        "tool_calls"
    } else {
        "stop"
    }
}

fn answer(request: &request::ChatRequest, ids: &str, g: toolsmith_policy::Generation, step: u64) -> Answer {
    let text = closed_text(request, &g);
    let (content, calls, invalid) = calls::parse_turn(&request.tools, ids, &text);
    Answer { content, finish_reason: finish_reason(&g, calls.len()), calls, invalid, generation: g, step }
}

/// `logprobs.content` of a choice: each sampled token with its log-prob (no alternatives).
fn logprobs_json(tokenizer: &toolsmith_policy::Tokenizer, g: &toolsmith_policy::Generation) -> Value {
    let content: Vec<Value> = g
        .output_ids
        .iter()
        .zip(&g.logprobs)
        .filter(|(id, _)| !tokenizer.eos_ids().contains(*id))
        .map(|(&id, &logprob)| {
            let token = tokenizer.decode(&[id]).unwrap_or_default();
            json!({"token": token, "logprob": logprob, "bytes": token.as_bytes(), "top_logprobs": []})
        })
        .collect();
    json!({ "content": content })
}

fn invalid_json(choice: usize, invalid: &[calls::Invalid]) -> Vec<Value> {
    invalid.iter().map(|i| json!({"choice": choice, "text": i.text, "error": i.error})).collect()
}

/// The options of choice `i`: its own seed, so `n` choices differ when sampled.
fn choice_options(options: &GenerateOptions, i: usize) -> GenerateOptions {
    GenerateOptions { seed: options.seed.wrapping_add(i as u64), ..options.clone() }
}

async fn chat(State(state): State<ChatState>, body: Bytes) -> Response {
    let request = match request::parse(&body) {
        Ok(r) => std::sync::Arc::new(r),
        Err(e) => return error(StatusCode::BAD_REQUEST, e.0),
    };
    let id = request_id();
    if request.stream {
        return stream(state, request, id);
    }
    // Every choice is queued before any is awaited, so they decode side by side; if the client
    // hangs up, this future is dropped with the pending answers, which withdraws them.
    let mut pending = Vec::with_capacity(request.n);
    for i in 0..request.n {
        let prompt = BatchPrompt::Chat(request.messages.clone());
        match state.served.batched.submit(prompt, &choice_options(&request.options, i), request.grammar.clone(), None) {
            Ok(p) => pending.push(p),
            Err(e) => return error(status_of(&e), e.to_string()),
        }
    }
    let mut choices = Vec::with_capacity(request.n);
    let mut invalid = Vec::new();
    let (mut prompt_tokens, mut completion_tokens, mut step) = (0, 0, 0);
    for (i, p) in pending.into_iter().enumerate() {
        let (g, _, s) = match p.wait().await {
            Ok(done) => done,
            Err(e) => return error(status_of(&e), e.to_string()),
        };
        let a = answer(&request, &format!("call_{id}_{i}_"), g, s);
        step = a.step;
        prompt_tokens = a.generation.prompt_ids.len();
        completion_tokens += a.generation.output_ids.len();
        // `null` content only beside calls, as OpenAI answers: a turn of no text is "".
        let content = a.content.or_else(|| a.calls.is_empty().then(String::new));
        let mut message = json!({"role": "assistant", "content": content});
        if !a.calls.is_empty() {
            message["tool_calls"] = a.calls.iter().map(calls::Call::to_json).collect();
        }
        let mut choice = json!({"index": i, "message": message, "finish_reason": a.finish_reason, "logprobs": null});
        if request.logprobs {
            choice["logprobs"] = logprobs_json(&state.tokenizer, &a.generation);
        }
        invalid.extend(invalid_json(i, &a.invalid));
        choices.push(choice);
    }
    let mut toolsmith = json!({"step": step});
    if !invalid.is_empty() {
        toolsmith["invalid_tool_calls"] = json!(invalid);
    }
    axum::Json(json!({
        "id": format!("chatcmpl-{id}"), "object": "chat.completion", "created": now(), "model": state.model,
        "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
        "toolsmith": toolsmith,
    }))
    .into_response()
}

/// Streams the choices as server-sent events: content as it becomes final, each call as OpenAI
/// sends it (its index, id and name, then its arguments) once its block closes, the finish
/// reason, then usage when asked for. A client that hangs up withdraws every choice.
fn stream(state: ChatState, request: std::sync::Arc<request::ChatRequest>, id: String) -> Response {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Value>();
    let chunk = {
        let (id, model) = (format!("chatcmpl-{id}"), state.model.clone());
        move |choices: Value| json!({"id": id, "object": "chat.completion.chunk", "created": now(), "model": model, "choices": choices})
    };
    tokio::spawn(async move {
        let mut choices = tokio::task::JoinSet::new();
        for i in 0..request.n {
            let (tx, chunk, state, request) = (tx.clone(), chunk.clone(), state.clone(), request.clone());
            let ids = format!("call_{id}_{i}_");
            choices.spawn(async move { stream_choice(&state, &request, i, &ids, &tx, &chunk).await });
        }
        let (mut prompt_tokens, mut completion_tokens) = (0, 0);
        loop {
            tokio::select! {
                done = choices.join_next() => match done {
                    Some(Ok(Some((p, c)))) => {
                        prompt_tokens = p;
                        completion_tokens += c;
                    }
                    Some(_) => {}
                    None => break,
                },
                // The client left: dropping the set aborts every choice, which withdraws it.
                () = tx.closed() => return,
            }
        }
        if request.include_usage {
            let mut last = chunk(json!([]));
            last["usage"] = json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                   "total_tokens": prompt_tokens + completion_tokens});
            let _ = tx.send(last);
        }
    });
    let events = UnboundedReceiverStream::new(rx)
        .map(|v| Ok::<Event, Infallible>(Event::default().data(v.to_string())))
        .chain(tokio_stream::once(Ok(Event::default().data("[DONE]"))));
    Sse::new(events).into_response()
}

/// One streamed choice; its prompt and completion tokens when it finished.
async fn stream_choice(
    state: &ChatState,
    request: &request::ChatRequest,
    index: usize,
    ids: &str,
    tx: &tokio::sync::mpsc::UnboundedSender<Value>,
    chunk: &(impl Fn(Value) -> Value + Sync),
) -> Option<(usize, usize)> {
    let delta = |delta: Value, finish: Value| {
        chunk(json!([{"index": index, "delta": delta, "logprobs": null, "finish_reason": finish}]))
    };
    let send = |events: Vec<calls::Event>| -> bool {
        for event in events {
            let sent = match event {
                calls::Event::Content(text) => tx.send(delta(json!({"content": text}), Value::Null)).is_ok(),
                calls::Event::Call(c) => {
                    let head = json!({"tool_calls": [{"index": c.index, "id": c.id, "type": "function",
                                                      "function": {"name": c.name, "arguments": ""}}]});
                    let arguments = json!({"tool_calls": [{"index": c.index, "function": {"arguments": c.arguments}}]});
                    tx.send(delta(head, Value::Null)).is_ok() && tx.send(delta(arguments, Value::Null)).is_ok()
                }
            };
            if !sent {
                return false;
            }
        }
        true
    };
    if tx.send(delta(json!({"role": "assistant", "content": ""}), Value::Null)).is_err() {
        return None;
    }
    let (pieces, mut text) = tokio::sync::mpsc::unbounded_channel::<String>();
    let prompt = BatchPrompt::Chat(request.messages.clone());
    let options = choice_options(&request.options, index);
    let pending = match state.served.batched.submit(prompt, &options, request.grammar.clone(), Some(pieces)) {
        Ok(p) => p,
        Err(e) => {
            let _ = tx.send(json!({"error": {"message": e.to_string()}}));
            return None;
        }
    };
    let generation = pending.wait();
    tokio::pin!(generation);
    let mut parser = calls::TurnParser::new(&request.tools, ids);
    let mut so_far = String::new();
    let result = loop {
        tokio::select! {
            Some(piece) = text.recv() => {
                so_far.push_str(&piece);
                if !send(parser.push(&so_far, false)) {
                    return None;
                }
            }
            result = &mut generation => break result,
            // The client left while nothing was sent: leave now, withdrawing the request.
            () = tx.closed() => return None,
        }
    };
    match result {
        Ok((g, _, _)) => {
            let whole = closed_text(request, &g);
            if !send(parser.push(&whole, true)) {
                return None;
            }
            let finish = finish_reason(&g, parser.calls());
            let mut last = delta(json!({}), json!(finish));
            if request.logprobs {
                last["choices"][0]["logprobs"] = logprobs_json(&state.tokenizer, &g);
            }
            if !parser.invalid.is_empty() {
                last["toolsmith"] = json!({"invalid_tool_calls": invalid_json(index, &parser.invalid)});
            }
            let _ = tx.send(last);
            Some((g.prompt_ids.len(), g.output_ids.len()))
        }
        Err(e) => {
            let _ = tx.send(json!({"error": {"message": e.to_string()}}));
            None
        }
    }
}
