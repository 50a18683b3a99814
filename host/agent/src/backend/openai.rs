//! Any OpenAI-compatible chat-completions endpoint (vLLM, llama.cpp, `toolsmith serve --policy`,
//! hosted APIs): a base URL and a model name.
//!
//! Tools reach the model in one of two ways ([`ToolCallStyle`]): as the agent's text grammar
//! only (the system prompt's listing, `<tool_call>` blocks in `content`), or natively, through the
//! request's `tools` and the response's `tool_calls` (see [`super::native`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};
use toolsmith_contract::Manifest;

use super::native;
use super::{Backend, BackendError, BoxFuture, Completion, GenerateOptions, Message, Usage};

/// How an [`OpenAiBackend`] lets the model call tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolCallStyle {
    /// The trace grammar in `content` only: what models trained on the agent's traces write.
    Text,
    /// The API's `tools` and `tool_calls`, converted to and from the grammar: what chat models
    /// tuned for function calling do best.
    Native,
    /// Native, until the endpoint refuses a request with `tools`; text from then on.
    Auto,
}

impl ToolCallStyle {
    /// Every style, for the command line's list of choices.
    pub const ALL: [ToolCallStyle; 3] = [ToolCallStyle::Native, ToolCallStyle::Text, ToolCallStyle::Auto];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ToolCallStyle::Text => "text",
            ToolCallStyle::Native => "native",
            ToolCallStyle::Auto => "auto",
        }
    }

    /// The style a command-line name stands for, or `None` for an unknown name.
    pub fn parse(name: &str) -> Option<ToolCallStyle> {
        ToolCallStyle::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// A chat-completions endpoint.
#[derive(Debug, Clone)]
pub struct OpenAiBackend {
    client: reqwest::Client,
    base_url: String,
    model: String,
    api_key: Option<String>,
    style: ToolCallStyle,
    /// Set once an [`ToolCallStyle::Auto`] backend's endpoint refused `tools`: asking again
    /// every turn would double each request for nothing. Shared by clones, which talk to the
    /// same endpoint.
    text_only: Arc<AtomicBool>,
}

/// Why a POST produced no JSON answer.
#[derive(Debug)]
enum PostError {
    /// No answer, or one that is not JSON.
    Transport(String),
    /// An answer with an error status.
    Status { status: reqwest::StatusCode, body: String },
}

impl OpenAiBackend {
    /// `base_url` is the part before `/chat/completions`, e.g. `http://127.0.0.1:8000/v1`. Tools
    /// go in the text grammar ([`ToolCallStyle::Text`]) unless [`OpenAiBackend::with_tool_calls`]
    /// says otherwise.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>, api_key: Option<String>) -> Self {
        let base_url = base_url.into().trim_end_matches('/').to_string();
        OpenAiBackend {
            client: reqwest::Client::new(),
            base_url,
            model: model.into(),
            api_key,
            style: ToolCallStyle::Text,
            text_only: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The same endpoint, with tools handed to the model in `style`.
    pub fn with_tool_calls(mut self, style: ToolCallStyle) -> Self {
        self.style = style;
        self.text_only = Arc::new(AtomicBool::new(false));
        self
    }

    /// The style this backend was built with (an `Auto` backend stays `Auto` after falling back).
    pub fn tool_calls(&self) -> ToolCallStyle {
        self.style
    }

    /// Whether the next request with tools carries them natively (an auto backend stops after
    /// its endpoint refused them).
    pub fn sends_native_tools(&self) -> bool {
        match self.style {
            ToolCallStyle::Text => false,
            ToolCallStyle::Native => true,
            ToolCallStyle::Auto => !self.text_only.load(Ordering::Relaxed),
        }
    }

    fn request_body(&self, messages: &[Message], options: &GenerateOptions) -> Value {
        let mut body = options.request_body(&self.model, options.max_tokens);
        body["messages"] = json!(messages);
        body
    }

    /// A request with `tools` and the conversation rewritten to native calls.
    fn native_body(&self, messages: &[Message], tools: &[Manifest], options: &GenerateOptions) -> Value {
        let mut body = options.request_body(&self.model, options.max_tokens);
        body["messages"] = Value::Array(native::to_native(messages));
        body["tools"] = native::tools(tools);
        body["tool_choice"] = json!("auto");
        body
    }

    fn url(&self) -> String {
        format!("{}/chat/completions", self.base_url)
    }

    async fn post(&self, body: &Value) -> Result<Value, PostError> {
        let url = self.url();
        let mut request = self.client.post(&url).json(body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.map_err(|e| PostError::Transport(format!("POST {url}: {e}")))?;
        let status = response.status();
        let text =
            response.text().await.map_err(|e| PostError::Transport(format!("POST {url}: {status}, no body: {e}")))?;
        if !status.is_success() {
            return Err(PostError::Status { status, body: text });
        }
        serde_json::from_str(&text)
            .map_err(|e| PostError::Transport(format!("POST {url}: {status}, body is not JSON: {e}")))
    }

    fn error(&self, e: PostError) -> BackendError {
        match e {
            PostError::Transport(message) => BackendError::Http(message),
            PostError::Status { status, body } => BackendError::Http(format!("POST {}: {status}: {body}", self.url())),
        }
    }

    /// The turn in a response body: the content as it is when the model called nothing natively
    /// (byte for byte what it wrote), else the content and its calls as one grammar turn.
    fn completion(&self, body: &Value) -> Result<Completion, BackendError> {
        let url = self.url();
        let message = body
            .pointer("/choices/0/message")
            .ok_or_else(|| BackendError::Http(format!("POST {url}: no choices[0].message in {body}")))?;
        let calls = message.get("tool_calls").and_then(Value::as_array).is_some_and(|c| !c.is_empty());
        let text = if calls {
            native::from_native(message)
        } else {
            match message.get("content") {
                // An empty turn (the budget ran out on text that is not content yet).
                Some(Value::Null) => String::new(),
                content => native::content_text(content).ok_or_else(|| {
                    BackendError::Http(format!("POST {url}: no choices[0].message.content in {body}"))
                })?,
            }
        };
        let count = |key: &str| body.pointer(&format!("/usage/{key}")).and_then(Value::as_u64).unwrap_or(0) as usize;
        let finish_reason = match body.pointer("/choices/0/finish_reason").and_then(Value::as_str) {
            // The turn ended to let the tools run: for the agent that is an ordinary end of turn.
            None | Some("tool_calls" | "function_call") => "stop",
            Some(other) => other,
        };
        Ok(Completion {
            text,
            usage: Usage { prompt_tokens: count("prompt_tokens"), completion_tokens: count("completion_tokens") },
            finish_reason: finish_reason.to_string(),
            tokens: None,
            raw: Some(message.clone()),
        })
    }
}

/// Whether an error answer to a request with `tools` says the endpoint does not take them: a
/// client error that names tools (`tools`, `tool_choice`, "tool calling"), or a 400, 404 or 422
/// about a field it does not know. Other failures (a full context, a bad key) are not cured by
/// dropping the tools and are reported as they are.
pub fn refuses_tools(status: u16, body: &str) -> bool {
    if !(400..500).contains(&status) {
        return false;
    }
    let body = body.to_ascii_lowercase();
    if body.contains("tool") {
        return true;
    }
    let unknown_field = ["unsupported", "not supported", "unknown", "unrecognized", "extra", "not permitted"]
        .iter()
        .any(|w| body.contains(w));
    matches!(status, 400 | 404 | 422) && unknown_field
}

impl Backend for OpenAiBackend {
    fn name(&self) -> String {
        format!("openai:{}", self.model)
    }

    fn complete<'a>(
        &'a self,
        messages: &'a [Message],
        options: &'a GenerateOptions,
    ) -> BoxFuture<'a, Result<Completion, BackendError>> {
        Box::pin(async move {
            let body = self.post(&self.request_body(messages, options)).await.map_err(|e| self.error(e))?;
            self.completion(&body)
        })
    }

    fn complete_with_tools<'a>(
        &'a self,
        messages: &'a [Message],
        tools: &'a [Manifest],
        options: &'a GenerateOptions,
    ) -> BoxFuture<'a, Result<Completion, BackendError>> {
        Box::pin(async move {
            // Some endpoints refuse an empty `tools` list; with nothing listed there is nothing
            // to call natively.
            if tools.is_empty() || !self.sends_native_tools() {
                return self.complete(messages, options).await;
            }
            match self.post(&self.native_body(messages, tools, options)).await {
                Ok(body) => self.completion(&body),
                Err(PostError::Status { status, body })
                    if self.style == ToolCallStyle::Auto && refuses_tools(status.as_u16(), &body) =>
                {
                    tracing::warn!(
                        url = %self.url(),
                        %status,
                        body = %body.chars().take(300).collect::<String>(),
                        "the endpoint refuses native tool calls; using the text grammar from now on"
                    );
                    self.text_only.store(true, Ordering::Relaxed);
                    self.complete(messages, options).await
                }
                Err(e) => Err(self.error(e)),
            }
        })
    }
}
