//! The local policy (tch) as a backend: the tokenizer's chat template, then generation on a
//! blocking thread (one generation at a time; the model is not shared between threads).

use std::sync::{Arc, Mutex};

use toolsmith_policy::{Policy, PrefixCache, TokenEvent};

use super::{Backend, BackendError, BoxFuture, ChatTemplate, Completion, GenerateOptions, Message};

/// A shared local policy. Conversations that go on (an agent's next turn, a chat's next
/// message) prefill only their new tokens: the keys and values of earlier turns are kept.
#[derive(Debug, Clone)]
pub struct LocalBackend {
    policy: Arc<Mutex<Policy>>,
    prefix: Arc<Mutex<PrefixCache>>,
    label: String,
}

impl LocalBackend {
    /// Wraps a loaded policy; `label` names it in reports (its directory, or `tiny`).
    pub fn new(policy: Policy, label: impl Into<String>) -> Self {
        Self::shared(Arc::new(Mutex::new(policy)), label)
    }

    /// A backend over a policy shared with someone else (a trainer that updates its weights
    /// between episodes).
    pub fn shared(policy: Arc<Mutex<Policy>>, label: impl Into<String>) -> Self {
        let prefix = Arc::new(Mutex::new(PrefixCache::new(super::PREFIX_CACHE_BYTES)));
        LocalBackend { policy, prefix, label: label.into() }
    }

    /// The policy this backend samples from, for callers that need it directly (the daemon's
    /// endpoints swap in new weights through it).
    pub fn policy(&self) -> Arc<Mutex<Policy>> {
        self.policy.clone()
    }

    /// Renders and generates synchronously; `on_text` receives streamed text.
    pub fn complete_blocking(
        &self,
        messages: &[Message],
        options: &GenerateOptions,
        mut on_text: Option<&mut dyn FnMut(&str)>,
    ) -> Result<Completion, BackendError> {
        let policy = toolsmith_contract::sync::lock(&self.policy);
        let tokenizer = policy.tokenizer();
        let template = ChatTemplate::of(tokenizer)?;
        let prompt = template.encode(tokenizer, messages, true)?.ids;
        // Positions past the model's context are not refused by the arithmetic, only wrong.
        let context = policy.context_len();
        if prompt.len() >= context {
            return Err(BackendError::ContextFull { prompt: prompt.len(), context });
        }
        let params = options.sampling(context - prompt.len());
        let mut forward = |e: TokenEvent<'_>| {
            if let Some(f) = on_text.as_mut()
                && !e.text.is_empty()
            {
                f(e.text);
            }
        };
        let callback: Option<&mut dyn FnMut(TokenEvent<'_>)> = Some(&mut forward);
        let mut prefix = toolsmith_contract::sync::lock(&self.prefix);
        let (mut generations, _) =
            policy.generate_with_prefix(std::slice::from_ref(&prompt), &params, None, callback, &mut prefix)?;
        let generation = generations.pop().ok_or_else(|| BackendError::Join("no generation".into()))?;
        Ok(Completion::from_generation(generation, prompt.len(), template.end_of_turn(tokenizer)?))
    }
}

/// The prompt's token ids: the chat template (ChatML when the tokenizer has none) with the
/// assistant's turn opened, tokenized in one piece except for earlier sampled turns, whose ids
/// are spliced in as they were sampled.
pub fn prompt_ids(policy: &Policy, messages: &[Message]) -> Result<Vec<i64>, BackendError> {
    let tokenizer = policy.tokenizer();
    Ok(ChatTemplate::of(tokenizer)?.encode(tokenizer, messages, true)?.ids)
}

impl Backend for LocalBackend {
    fn name(&self) -> String {
        format!("local:{}", self.label)
    }

    fn complete<'a>(
        &'a self,
        messages: &'a [Message],
        options: &'a GenerateOptions,
    ) -> BoxFuture<'a, Result<Completion, BackendError>> {
        let this = self.clone();
        let messages = messages.to_vec();
        let options = options.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || this.complete_blocking(&messages, &options, None))
                .await
                .map_err(|e| BackendError::Join(e.to_string()))?
        })
    }
}
