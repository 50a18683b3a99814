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

use toolsmith_agent::backend::{ChatTemplate, Message, Role};
use toolsmith_policy::{Policy, TokenSequence, Tokenizer};

use crate::chat::{Chat, Content};

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

/// Private-use characters around the index of an ids turn in the rendered text.
const PLACEHOLDER_OPEN: char = '\u{F8F0}';
const PLACEHOLDER_CLOSE: char = '\u{F8F1}';

impl SequenceBuilder {
    /// A builder for `tokenizer` that refuses sequences longer than `context` tokens.
    pub fn new(tokenizer: &Tokenizer, context: usize) -> Result<Self, SequenceError> {
        let template = ChatTemplate::of(tokenizer).map_err(|e| SequenceError::Template(e.to_string()))?;
        Ok(SequenceBuilder { tokenizer: tokenizer.clone(), template, context })
    }

    /// A builder for `policy`'s tokenizer and context length.
    pub fn for_policy(policy: &Policy) -> Result<Self, SequenceError> {
        let context = policy.config().common().max_position_embeddings;
        Self::new(policy.tokenizer(), usize::try_from(context).unwrap_or(usize::MAX))
    }

    /// The context length sequences must fit.
    pub fn context(&self) -> usize {
        self.context
    }

    /// The sequence of `chat`.
    pub fn build(&self, chat: &Chat) -> Result<TrainSequence, SequenceError> {
        chat.validate().map_err(SequenceError::Invalid)?;
        let messages: Vec<Message> = chat
            .turns
            .iter()
            .enumerate()
            .map(|(i, t)| Message {
                role: t.role,
                content: match &t.content {
                    Content::Text(s) => s.clone(),
                    Content::Ids(_) => format!("{PLACEHOLDER_OPEN}{i}{PLACEHOLDER_CLOSE}"),
                },
            })
            .collect();
        let render = |m: &[Message], open: bool| {
            self.template.render(m, open).map_err(|e| SequenceError::Template(e.to_string()))
        };
        let full = render(&messages, false)?;
        // Byte span of each assistant turn's content in `full`, with its turn index.
        let mut spans: Vec<(usize, Range<usize>)> = Vec::new();
        for (i, m) in messages.iter().enumerate().filter(|(_, m)| m.role == Role::Assistant) {
            let prefix = render(&messages[..i], true)?;
            if !full.starts_with(&prefix) || !full[prefix.len()..].starts_with(&m.content) {
                return Err(SequenceError::Template(format!(
                    "assistant turn {i} does not appear verbatim after its prompt in the rendered conversation (the template rewrites turns); training on it would teach text that inference never shows"
                )));
            }
            spans.push((i, prefix.len()..prefix.len() + m.content.len()));
        }
        let mut ids: Vec<i64> = Vec::new();
        let mut mask: Vec<bool> = Vec::new();
        let mut turns: Vec<Range<usize>> = Vec::new();
        // Text between ids turns is tokenized in pieces; with no ids turns, in one piece.
        let mut cursor = 0;
        let mut spans_iter = spans.iter().peekable();
        let mut segments: Vec<(Range<usize>, Option<usize>)> = Vec::new();
        for (i, span) in &spans {
            if let Content::Ids(_) = chat.turns[*i].content {
                segments.push((cursor..span.start, None));
                segments.push((span.clone(), Some(*i)));
                cursor = span.end;
            }
        }
        segments.push((cursor..full.len(), None));
        for (range, ids_turn) in segments {
            match ids_turn {
                Some(i) => {
                    let Content::Ids(turn_ids) = &chat.turns[i].content else { continue };
                    spans_iter.next();
                    turns.push(ids.len()..ids.len() + turn_ids.len());
                    ids.extend_from_slice(turn_ids);
                    mask.resize(ids.len(), true);
                }
                None => {
                    let text = &full[range.clone()];
                    let (piece, offsets) = self
                        .tokenizer
                        .encode_with_offsets(text)
                        .map_err(|e| SequenceError::Tokenizer(e.to_string()))?;
                    let base = ids.len();
                    ids.extend_from_slice(&piece);
                    mask.resize(ids.len(), false);
                    // Text assistant turns inside this piece.
                    while let Some((i, span)) = spans_iter.peek() {
                        if span.start >= range.end || matches!(chat.turns[*i].content, Content::Ids(_)) {
                            break;
                        }
                        let (start, end) = (span.start - range.start, span.end - range.start);
                        let inside: Vec<usize> =
                            (0..offsets.len()).filter(|&t| offsets[t].0 < end && offsets[t].1 > start).collect();
                        if let (Some(&first), Some(&last)) = (inside.first(), inside.last()) {
                            for m in &mut mask[base + first..=base + last] {
                                *m = true;
                            }
                            turns.push(base + first..base + last + 1);
                        }
                        spans_iter.next();
                    }
                }
            }
        }
        // The end-of-turn token right after each assistant turn is trained on too (for an ids
        // turn it is the first token of the following text piece).
        for turn in &mut turns {
            if turn.end < ids.len() && !mask[turn.end] && self.tokenizer.eos_ids().contains(&ids[turn.end]) {
                mask[turn.end] = true;
                turn.end += 1;
            }
        }
        if ids.len() > self.context {
            return Err(SequenceError::TooLong { tokens: ids.len(), context: self.context });
        }
        if !mask.iter().skip(1).any(|&m| m) {
            return Err(SequenceError::Invalid("no assistant token survived tokenization".into()));
        }
        Ok(TrainSequence { tokens: TokenSequence { ids, loss_mask: mask }, turns })
    }
}
