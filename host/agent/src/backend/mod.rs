//! Policy backends behind one trait: the local tch policy (one request at a time, or batched),
//! any OpenAI-compatible chat-completions endpoint, an inference engine's completions endpoint
//! token in and token out (RL rollouts), and the oracle that writes correct traces for the
//! bundled world.

pub mod batch;
pub mod chat_template;
pub mod local;
pub mod native;
pub mod openai;
pub mod remote;

use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

pub use batch::{BatchConfig, BatchedBackend, Pending, Prompt};
pub use chat_template::{ChatTemplate, Encoded, plain, render_chat, render_prompt};
pub use local::LocalBackend;
pub use openai::{OpenAiBackend, ToolCallStyle};
pub use remote::CompletionsBackend;

/// Bytes of keys and values a local backend keeps between turns by default: about 130k tokens
/// of the tiny model, every episode of several rollout groups (4k of a 135M model).
pub const PREFIX_CACHE_BYTES: usize = 512 << 20;

/// A boxed future, so backends can be trait objects.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The instructions: method, tool listing and output format.
    System,
    /// The question, and the observations the host writes back.
    User,
    /// The policy's own turns, the only ones a trainer scores.
    Assistant,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Who wrote it, which decides how the template frames it.
    pub role: Role,
    /// The message's text, in the trace grammar for assistant turns.
    pub content: String,
    /// The exact token ids of an assistant turn the local policy sampled (without a closing
    /// end-of-turn token, which the template writes). A local backend splices them into the
    /// prompt instead of tokenizing `content` again: the same text has other tokenizations,
    /// and the model must see (and the trainer score) what it sampled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids: Option<Vec<i64>>,
}

impl Message {
    /// The instructions that open a conversation.
    pub fn system(content: impl Into<String>) -> Self {
        Message { role: Role::System, content: content.into(), ids: None }
    }

    /// A question or an observation.
    pub fn user(content: impl Into<String>) -> Self {
        Message { role: Role::User, content: content.into(), ids: None }
    }

    /// A turn the model wrote, whose tokens are not known (an endpoint's answer, or a
    /// synthesised one).
    pub fn assistant(content: impl Into<String>) -> Self {
        Message { role: Role::Assistant, content: content.into(), ids: None }
    }

    /// An assistant message with the ids it was sampled as.
    pub fn sampled(content: impl Into<String>, ids: Vec<i64>) -> Self {
        Message { role: Role::Assistant, content: content.into(), ids: Some(ids) }
    }
}

/// Token counts of one completion, as OpenAI reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens of the rendered prompt.
    pub prompt_tokens: usize,
    /// Tokens the model generated for the answer.
    pub completion_tokens: usize,
}

/// A backend's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// The model's turn as text in the trace grammar.
    pub text: String,
    /// Prompt and answer tokens, for the TT and PT figures and cost-of-pass.
    pub usage: Usage,
    /// OpenAI's reason: `stop` (end of turn, stop string) or `length` (token budget).
    pub finish_reason: String,
    /// What the policy sampled, token by token, when the backend can tell (the local policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TurnTokens>,
    /// What an HTTP endpoint returned for the turn (an OpenAI response's `choices[0].message`),
    /// when `text` was rewritten from it: with native tool calls, `text` is the trace-grammar
    /// turn the agent parses, and this is what the model actually said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<serde_json::Value>,
}

/// A sampled turn as tokens: what RL trains on, never re-tokenised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnTokens {
    /// The ids sampled, in order, including a final end-of-turn or stop token.
    pub output_ids: Vec<i64>,
    /// The behaviour log-prob of each, under the tempered distribution it was drawn from (before
    /// top-k, top-p and penalties; see [`toolsmith_policy::Generation::logprobs`]). An external
    /// engine reports its own kind (vLLM: before temperature by default); the trainer rescores
    /// engine episodes rather than trust them.
    pub logprobs: Vec<f64>,
    /// Why sampling stopped, which tells a trainer whether the turn was cut short.
    pub finish: toolsmith_policy::FinishReason,
    /// Whether the last id is an end-of-sequence token the model sampled (the template writes
    /// the same token after the turn, so it is left out of [`TurnTokens::content_ids`]).
    pub closed: bool,
}

impl TurnTokens {
    /// The ids that stand for the turn's content in later prompts: the sampled ids without a
    /// sampled end-of-turn token.
    pub fn content_ids(&self) -> &[i64] {
        if self.closed { &self.output_ids[..self.output_ids.len().saturating_sub(1)] } else { &self.output_ids }
    }
}

/// Sampling options every backend understands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerateOptions {
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// Softmax temperature; 0 decodes greedily.
    pub temperature: f64,
    /// Nucleus sampling's probability mass; 1 keeps every token.
    pub top_p: f64,
    /// Text that ends the turn (not included).
    pub stop: Vec<String>,
    /// Seed of the sampler. The agent loop derives each turn's seed from it, so the turns of an
    /// episode (and episodes with different seeds) draw differently.
    pub seed: u64,
    /// Keep only the k most likely tokens; 0 disables it.
    #[serde(default)]
    pub top_k: usize,
    /// Penalty on tokens already in the context (1 disables it; SEARL samples with 1.05).
    #[serde(default = "one")]
    pub repetition_penalty: f64,
    /// Greedy turns that fall into an exact loop end there, as if cut by `max_tokens`
    /// (`SamplingParams::stop_loops`; evaluation sets it). Only the local policy's backends
    /// honour it; remote engines decode as they do.
    #[serde(default)]
    pub stop_loops: bool,
}

fn one() -> f64 {
    1.0
}

impl Completion {
    /// The completion of a local generation from a prompt of `prompt_tokens` tokens.
    /// `end_of_turn` is the token the chat template closes a turn with
    /// ([`ChatTemplate::end_of_turn`]): a turn is closed when the model sampled that very token;
    /// any other end-of-sequence token stays part of the turn's ids.
    pub fn from_generation(g: toolsmith_policy::Generation, prompt_tokens: usize, end_of_turn: Option<i64>) -> Self {
        use toolsmith_policy::FinishReason;
        let closed =
            g.finish_reason == FinishReason::Eos && end_of_turn.is_some_and(|e| g.output_ids.last() == Some(&e));
        Completion {
            usage: Usage { prompt_tokens, completion_tokens: g.output_ids.len() },
            finish_reason: if g.finish_reason == FinishReason::Length { "length" } else { "stop" }.into(),
            text: g.text,
            tokens: Some(TurnTokens {
                output_ids: g.output_ids,
                logprobs: g.logprobs,
                finish: g.finish_reason,
                closed,
            }),
            raw: None,
        }
    }
}

impl GenerateOptions {
    /// An OpenAI-style request body for `model` with these options' sampling fields (top-k,
    /// repetition penalty and stop only when set) and at most `max_tokens` new tokens.
    pub fn request_body(&self, model: &str, max_tokens: usize) -> serde_json::Value {
        let mut body = serde_json::json!({
            "model": model,
            "max_tokens": max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
        });
        if self.top_k > 0 {
            body["top_k"] = serde_json::json!(self.top_k);
        }
        if self.repetition_penalty != 1.0 {
            body["repetition_penalty"] = serde_json::json!(self.repetition_penalty);
        }
        if !self.stop.is_empty() {
            body["stop"] = serde_json::json!(self.stop);
        }
        body
    }

    /// The sampler's settings for these options, with at most `max_new_tokens` new tokens (the
    /// room the context leaves).
    pub fn sampling(&self, max_new_tokens: usize) -> toolsmith_policy::SamplingParams {
        toolsmith_policy::SamplingParams {
            max_new_tokens: self.max_tokens.min(max_new_tokens),
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            repetition_penalty: self.repetition_penalty,
            stop_strings: self.stop.clone(),
            seed: self.seed,
            stop_loops: self.stop_loops,
            ..toolsmith_policy::SamplingParams::default()
        }
    }

    /// The options of turn `turn` of an episode: the same, with a seed of its own.
    pub fn for_turn(&self, turn: usize) -> GenerateOptions {
        // A multiplicative hash spreads consecutive turns over the seed space, so episode
        // seeds s and s + 1 do not share turn seeds.
        let seed = self.seed.wrapping_add((turn as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        GenerateOptions { seed, ..self.clone() }
    }
}

impl Default for GenerateOptions {
    fn default() -> Self {
        // A turn ends before the runtime's observation: the model must not write one itself.
        GenerateOptions {
            max_tokens: 512,
            temperature: 0.0,
            top_p: 1.0,
            stop: vec!["<observation>".into()],
            seed: 0,
            top_k: 0,
            repetition_penalty: 1.0,
            stop_loops: false,
        }
    }
}

/// Why a backend produced no turn.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The local policy failed.
    #[error("policy: {0}")]
    Policy(#[from] toolsmith_policy::PolicyError),
    /// The chat template could not be rendered.
    #[error("chat template: {0}")]
    Template(String),
    /// An HTTP endpoint failed or answered something unexpected.
    #[error("{0}")]
    Http(String),
    /// The conversation no longer fits the model's context.
    #[error("the prompt is {prompt} tokens, the model's context is {context}")]
    ContextFull {
        /// Prompt tokens.
        prompt: usize,
        /// The model's `max_position_embeddings`.
        context: usize,
    },
    /// The oracle does not know the task.
    #[error("the oracle has no solution for this question: {0}")]
    UnknownTask(String),
    /// A blocking task panicked or was cancelled.
    #[error("backend task: {0}")]
    Join(String),
}

/// A policy: chat messages in, the next assistant turn out.
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// A short name for reports (`local:DIR`, `openai:MODEL`, `oracle:gap`).
    fn name(&self) -> String;

    /// The next assistant turn after `messages`.
    fn complete<'a>(
        &'a self,
        messages: &'a [Message],
        options: &'a GenerateOptions,
    ) -> BoxFuture<'a, Result<Completion, BackendError>>;

    /// The next assistant turn after `messages`, when the agent has listed `tools` to the model.
    /// The agent always calls this one: a backend that can hand the model a structured tool
    /// list (an OpenAI endpoint's `tools`) overrides it; every other backend sees the tools in
    /// the system prompt only, so by default this is [`Backend::complete`].
    fn complete_with_tools<'a>(
        &'a self,
        messages: &'a [Message],
        tools: &'a [toolsmith_contract::Manifest],
        options: &'a GenerateOptions,
    ) -> BoxFuture<'a, Result<Completion, BackendError>> {
        let _ = tools;
        self.complete(messages, options)
    }

    /// Drops what the backend keeps between requests to make later ones cheaper (a local
    /// policy's prefix cache) and returns that memory to the system, e.g. before a training
    /// update that would otherwise hold both. Requests after it work as before, with the cost of
    /// recomputing what was dropped. By default nothing is kept.
    fn release_memory(&self) {}
}
