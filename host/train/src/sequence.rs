//! Token-exact training sequences and their loss masks.
//!
//! A conversation becomes the chat template's text, tokenized in one piece: exactly the ids the
//! policy sees at inference (`render_prompt` renders the same template), so nothing is learned
//! about a tokenization that never occurs. The loss mask covers the assistant's own tokens and
//! the end-of-turn token that closes each of its turns (the model must learn to stop), and never
//! a system, user or observation token (GAP's observation masking).
//!
//! Turns given as token ids (what a rollout sampled) are spliced in as they are: the template is
//! rendered with a placeholder in their place, the text around the placeholders is tokenized, and
//! the ids go between. Rendering and tokenizing the text a second time would give other ids for
//! the same text (a BPE tokenizer has many segmentations of a string; the sampler may have taken
//! any of them).
//!
//! Assistant spans are found by rendering each prefix of the conversation with the generation
//! prompt opened: the assistant's text must follow that prefix verbatim in the whole rendering.
//! A template that rewrites earlier turns (some drop old `<think>` blocks) is refused with an
//! error rather than trained on text that inference never shows.

use std::ops::Range;

use toolsmith_agent::backend::{BackendError, ChatTemplate, Encoded, Message};
use toolsmith_policy::{Policy, TokenSequence, Tokenizer};

use crate::conversation::{Chat, Content};

/// Why a conversation cannot be a training sequence.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SequenceError {
    /// The conversation is longer than the model's context.
    #[error(
        "the conversation is {tokens} tokens, longer than the model's context of {context}; shorten it (fewer turns, tools listed compactly) or train a model with a longer context"
    )]
    TooLong {
        /// Its length.
        tokens: usize,
        /// The model's `max_position_embeddings`.
        context: usize,
    },
    /// The conversation is not trainable (no or empty assistant turns).
    #[error("{0}")]
    Invalid(String),
    /// The chat template failed or does not keep assistant turns verbatim.
    #[error("chat template: {0}")]
    Template(String),
    /// The tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

/// A training sequence: ids, loss mask, and where each assistant turn is.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainSequence {
    /// Ids and loss mask, ready for [`Policy::score`].
    pub tokens: TokenSequence,
    /// Token ranges of the assistant turns in order, each with its end-of-turn token when the
    /// template writes one.
    pub turns: Vec<Range<usize>>,
}

impl TrainSequence {
    /// Tokens in all.
    pub fn len(&self) -> usize {
        self.tokens.ids.len()
    }

    /// True for a sequence without tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens.ids.is_empty()
    }

    /// Tokens in the loss.
    pub fn trained_tokens(&self) -> usize {
        self.tokens.loss_mask.iter().filter(|&&m| m).count()
    }

    /// The ids of each maximal run of trained tokens (for checking a mask by decoding it).
    pub fn trained_spans(&self) -> Vec<&[i64]> {
        let mut spans = Vec::new();
        let mut start = None;
        for (i, &m) in self.tokens.loss_mask.iter().chain(std::iter::once(&false)).enumerate() {
            match (m, start) {
                (true, None) => start = Some(i),
                (false, Some(s)) => {
                    spans.push(&self.tokens.ids[s..i]);
                    start = None;
                }
                _ => {}
            }
        }
        spans
    }
}

/// Builds [`TrainSequence`]s with a tokenizer's chat template.
#[derive(Debug)]
pub struct SequenceBuilder {
    tokenizer: Tokenizer,
    template: ChatTemplate,
    context: usize,
}

impl SequenceBuilder {
    /// A builder for `tokenizer` that refuses sequences longer than `context` tokens.
    pub fn new(tokenizer: &Tokenizer, context: usize) -> Result<Self, SequenceError> {
        let template = ChatTemplate::of(tokenizer).map_err(|e| SequenceError::Template(e.to_string()))?;
        Ok(SequenceBuilder { tokenizer: tokenizer.clone(), template, context })
    }

    /// A builder for `policy`'s tokenizer and context length.
    pub fn for_policy(policy: &Policy) -> Result<Self, SequenceError> {
        Self::new(policy.tokenizer(), policy.context_len())
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The context length sequences must fit.
    pub fn context(&self) -> usize {
        self.context
    }

    /// `messages` as ids (sampled turns spliced in as they are), refused when longer than the
    /// context.
    pub fn encode(&self, messages: &[Message]) -> Result<Encoded, SequenceError> {
        let encoded = self.template.encode(&self.tokenizer, messages, false).map_err(|e| match e {
            BackendError::Policy(e) => SequenceError::Tokenizer(e.to_string()),
            other => {
                SequenceError::Template(format!("{other}; training on it would teach text that inference never shows"))
            }
        })?;
        if encoded.ids.len() > self.context {
            return Err(SequenceError::TooLong { tokens: encoded.ids.len(), context: self.context });
        }
        Ok(encoded)
    }

    /// The sequence of `chat`.
    pub fn build(&self, chat: &Chat) -> Result<TrainSequence, SequenceError> {
        chat.validate().map_err(SequenceError::Invalid)?;
        let messages: Vec<Message> = chat
            .turns
            .iter()
            .map(|t| match &t.content {
                Content::Text(s) => Message { role: t.role, content: s.clone(), ids: None },
                Content::Ids(ids) => Message { role: t.role, content: String::new(), ids: Some(ids.clone()) },
            })
            .collect();
        let encoded = self.encode(&messages)?;
        let ids = encoded.ids;
        let mut mask = vec![false; ids.len()];
        let mut turns: Vec<Range<usize>> = Vec::with_capacity(encoded.assistant.len());
        for (_, range) in encoded.assistant {
            mask[range.clone()].fill(true);
            turns.push(range);
        }
        // The end-of-turn token right after each assistant turn is trained on too: the model
        // must learn to stop (for an ids turn it is the first token of the following text).
        for turn in &mut turns {
            if turn.end < ids.len() && !mask[turn.end] && self.tokenizer.eos_ids().contains(&ids[turn.end]) {
                mask[turn.end] = true;
                turn.end += 1;
            }
        }
        if !mask.iter().skip(1).any(|&m| m) {
            return Err(SequenceError::Invalid("no assistant token survived tokenization".into()));
        }
        Ok(TrainSequence { tokens: TokenSequence { ids, loss_mask: mask }, turns })
    }
}
