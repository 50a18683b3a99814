//! Policy backends behind one trait: the local tch policy, any OpenAI-compatible chat-completions
//! endpoint, and the oracle that writes correct traces for the bundled world.

pub mod chat;
pub mod local;
pub mod openai;

use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

pub use chat::{ChatTemplate, render_chat, render_prompt};
pub use local::LocalBackend;
pub use openai::OpenAiBackend;

/// A boxed future, so backends can be trait objects.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[allow(missing_docs)]
pub enum Role {
    System,
    User,
    Assistant,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Its author.
    pub role: Role,
    /// Its text.
    pub content: String,
}

impl Message {
    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Message { role: Role::System, content: content.into() }
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Message { role: Role::User, content: content.into() }
    }

    /// An assistant message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Message { role: Role::Assistant, content: content.into() }
    }
}

/// Token counts of one completion, as OpenAI reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens of the rendered prompt.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
}

/// A backend's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// The assistant turn.
    pub text: String,
    /// Token counts.
    pub usage: Usage,
    /// OpenAI's reason: `stop` (end of turn, stop string) or `length` (token budget).
    pub finish_reason: String,
}

/// Sampling options every backend understands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerateOptions {
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// 0 for greedy.
    pub temperature: f64,
    /// Nucleus sampling.
    pub top_p: f64,
    /// Text that ends the turn (not included).
    pub stop: Vec<String>,
    /// Seed of the sampler.
    pub seed: u64,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        // A turn ends before the runtime's observation: the model must not write one itself.
        GenerateOptions { max_tokens: 512, temperature: 0.0, top_p: 1.0, stop: vec!["<observation>".into()], seed: 0 }
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
}
