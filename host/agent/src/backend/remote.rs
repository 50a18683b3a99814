//! Token in, token out over HTTP: rollouts sampled by an inference engine (vLLM, SGLang, or
//! `toolsmith serve --policy`) through its OpenAI-compatible `/v1/completions` endpoint.
//!
//! The prompt is rendered and tokenized here, with the trained policy's tokenizer and chat
//! template, earlier sampled turns spliced in as their ids, and sent as token ids; the engine
//! returns the sampled ids and their log-probs (`"return_token_ids": true`, `"logprobs": 1`). So
//! the trainer scores exactly what the engine sampled, as with the local policy: text never goes
//! through a second tokenization on either side.

use std::sync::Arc;

use serde_json::{Value, json};
use toolsmith_policy::{FinishReason, Tokenizer};

use super::{Backend, BackendError, BoxFuture, ChatTemplate, Completion, GenerateOptions, Message, TurnTokens, Usage};

/// An engine's completions endpoint, with the tokenizer of the policy it serves.
#[derive(Debug, Clone)]
pub struct CompletionsBackend {
    client: reqwest::Client,
    base_url: String,
    model: String,
    api_key: Option<String>,
    tokenizer: Arc<Tokenizer>,
    /// Compiled once: every turn renders its prompt with it.
    template: Arc<ChatTemplate>,
    end_of_turn: Option<i64>,
    /// The served model's context, when known: a turn's budget is cut to what the prompt leaves
    /// (engines refuse a request whose prompt plus `max_tokens` exceeds it).
    context: Option<usize>,
}

fn http(url: &str, e: impl std::fmt::Display) -> BackendError {
    BackendError::Http(format!("POST {url}: {e}"))
}

impl CompletionsBackend {
    /// `base_url` is the part before `/completions`, e.g. `http://127.0.0.1:8000/v1`; `tokenizer`
    /// must be the served model's (the ids mean nothing otherwise).
    pub fn new(
        base_url: impl Into<String>,
        model: impl Into<String>,
        api_key: Option<String>,
        tokenizer: Tokenizer,
    ) -> Result<Self, BackendError> {
        let template = ChatTemplate::of(&tokenizer)?;
        let end_of_turn = template.end_of_turn(&tokenizer)?;
        Ok(CompletionsBackend {
            client: reqwest::Client::new(),
            base_url: base_url.into().trim_end_matches('/').to_string(),
            model: model.into(),
            api_key,
            tokenizer: Arc::new(tokenizer),
            template: Arc::new(template),
            end_of_turn,
            context: None,
        })
    }

    /// Sets the served model's context length (its `max_position_embeddings`).
    pub fn with_context(mut self, context: usize) -> Self {
        self.context = Some(context);
        self
    }

    /// The server's root (the base URL without a trailing `/v1`), where SGLang-style admin
    /// endpoints such as `/update_weights_from_disk` live.
    pub fn root_url(&self) -> &str {
        self.base_url.strip_suffix("/v1").unwrap_or(&self.base_url)
    }

    async fn post(&self, url: &str, body: &Value) -> Result<Value, BackendError> {
        let mut request = self.client.post(url).json(body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.map_err(|e| http(url, e))?;
        let status = response.status();
        let body: Value = response.json().await.map_err(|e| http(url, format!("{status}, body is not JSON: {e}")))?;
        if !status.is_success() {
            return Err(http(url, format!("{status}: {body}")));
        }
        Ok(body)
    }

    /// Asks the engine to load the checkpoint in `dir` (SGLang's `/update_weights_from_disk`,
    /// which `toolsmith serve --policy` also answers); returns the engine's reply.
    pub async fn update_weights(&self, dir: &std::path::Path) -> Result<Value, BackendError> {
        let url = format!("{}/update_weights_from_disk", self.root_url());
        self.post(&url, &json!({"model_path": dir})).await
    }

    fn request_body(&self, prompt: &[i64], options: &GenerateOptions, max_tokens: usize) -> Value {
        let mut body = options.request_body(&self.model, max_tokens);
        body["prompt"] = json!(prompt);
        body["stop_token_ids"] = json!(self.tokenizer.eos_ids());
        body["logprobs"] = json!(1);
        body["return_token_ids"] = json!(true);
        body
    }
}

impl Backend for CompletionsBackend {
    fn name(&self) -> String {
        format!("engine:{}", self.model)
    }

    fn complete<'a>(
        &'a self,
        messages: &'a [Message],
        options: &'a GenerateOptions,
    ) -> BoxFuture<'a, Result<Completion, BackendError>> {
        Box::pin(async move {
            let prompt = self.template.encode(&self.tokenizer, messages, true)?.ids;
            let max_tokens = match self.context {
                Some(context) if prompt.len() >= context => {
                    return Err(BackendError::ContextFull { prompt: prompt.len(), context });
                }
                Some(context) => options.max_tokens.min(context - prompt.len()),
                None => options.max_tokens,
            };
            let url = format!("{}/completions", self.base_url);
            let body = self.post(&url, &self.request_body(&prompt, options, max_tokens)).await?;
            let choice = body.pointer("/choices/0").ok_or_else(|| http(&url, format!("no choices[0] in {body}")))?;
            let ids: Vec<i64> = choice
                .get("token_ids")
                .and_then(|v| serde_json::from_value(v.clone()).ok())
                .ok_or_else(|| http(&url, "no choices[0].token_ids: the engine must support return_token_ids"))?;
            let logprobs: Vec<f64> = choice
                .pointer("/logprobs/token_logprobs")
                .and_then(|v| serde_json::from_value(v.clone()).ok())
                .ok_or_else(|| http(&url, "no choices[0].logprobs.token_logprobs"))?;
            if logprobs.len() != ids.len() {
                return Err(http(url.as_str(), format!("{} token ids but {} log-probs", ids.len(), logprobs.len())));
            }
            let length = match choice.get("finish_reason").and_then(Value::as_str) {
                Some("length") => true,
                Some("stop") => false,
                // An aborted or failed generation is not a turn to train on.
                other => return Err(http(&url, format!("the engine ended the turn with finish_reason {other:?}"))),
            };
            let last = ids.last().copied();
            let finish = if length {
                FinishReason::Length
            } else if last.is_some_and(|id| self.tokenizer.eos_ids().contains(&id)) {
                FinishReason::Eos
            } else {
                FinishReason::StopString
            };
            let closed = finish == FinishReason::Eos && self.end_of_turn.is_some() && last == self.end_of_turn;
            // The turn's text is the ids decoded here, so text and ids cannot disagree (an
            // engine's text drops the end-of-turn token and may cut at a stop string).
            let content = if closed { &ids[..ids.len() - 1] } else { &ids[..] };
            let mut text = self.tokenizer.decode(content)?;
            if finish == FinishReason::StopString
                && let Some(at) = options.stop.iter().filter_map(|s| text.find(s.as_str())).min()
            {
                text.truncate(at);
            }
            Ok(Completion {
                text,
                usage: Usage { prompt_tokens: prompt.len(), completion_tokens: ids.len() },
                finish_reason: if length { "length" } else { "stop" }.into(),
                tokens: Some(TurnTokens { output_ids: ids, logprobs, finish, closed }),
                raw: None,
            })
        })
    }
}
