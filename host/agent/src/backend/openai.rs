//! Any OpenAI-compatible chat-completions endpoint (vLLM, llama.cpp, `toolsmith serve --policy`,
//! hosted APIs): a base URL and a model name.

use serde_json::{Value, json};

use super::{Backend, BackendError, BoxFuture, Completion, GenerateOptions, Message, Usage};

/// A chat-completions endpoint.
#[derive(Debug, Clone)]
pub struct OpenAiBackend {
    client: reqwest::Client,
    base_url: String,
    model: String,
    api_key: Option<String>,
}

impl OpenAiBackend {
    /// `base_url` is the part before `/chat/completions`, e.g. `http://127.0.0.1:8000/v1`.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>, api_key: Option<String>) -> Self {
        let base_url = base_url.into().trim_end_matches('/').to_string();
        OpenAiBackend { client: reqwest::Client::new(), base_url, model: model.into(), api_key }
    }

    fn request_body(&self, messages: &[Message], options: &GenerateOptions) -> Value {
        let mut body = options.request_body(&self.model, options.max_tokens);
        body["messages"] = json!(messages);
        body
    }
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
            let url = format!("{}/chat/completions", self.base_url);
            let mut request = self.client.post(&url).json(&self.request_body(messages, options));
            if let Some(key) = &self.api_key {
                request = request.bearer_auth(key);
            }
            let response = request.send().await.map_err(|e| BackendError::Http(format!("POST {url}: {e}")))?;
            let status = response.status();
            let body: Value = response
                .json()
                .await
                .map_err(|e| BackendError::Http(format!("POST {url}: {status}, body is not JSON: {e}")))?;
            if !status.is_success() {
                return Err(BackendError::Http(format!("POST {url}: {status}: {body}")));
            }
            let text = body
                .pointer("/choices/0/message/content")
                .and_then(Value::as_str)
                .ok_or_else(|| BackendError::Http(format!("POST {url}: no choices[0].message.content in {body}")))?;
            let count =
                |key: &str| body.pointer(&format!("/usage/{key}")).and_then(Value::as_u64).unwrap_or(0) as usize;
            let finish_reason =
                body.pointer("/choices/0/finish_reason").and_then(Value::as_str).unwrap_or("stop").to_string();
            Ok(Completion {
                text: text.to_string(),
                usage: Usage { prompt_tokens: count("prompt_tokens"), completion_tokens: count("completion_tokens") },
                finish_reason,
                tokens: None,
            })
        })
    }
}
