//! A sampled episode as training sequences, token for token.
//!
//! The agent loop keeps each turn's sampled ids and behaviour log-probs ([`TurnTokens`]) and
//! shows later turns those ids, never the text tokenized again. Here each turn's context is
//! rebuilt from the record (its own system prompt; MemPO's truncated context), and turns whose
//! context extends the previous turn's conversation share one sequence: a full-history episode
//! is one sequence, a MemPO episode one per turn, and an episode whose tool listing changed
//! mid-way (retrieval after the plan) one per listing. Only sampled tokens are trained on, and
//! each carries the log-prob it was sampled with.

use std::ops::Range;

use toolsmith_agent::backend::{Message, TurnTokens};
use toolsmith_agent::{Tag, Trajectory};
use toolsmith_policy::{PolicyError, TokenSequence, Tokenizer};

use crate::sequence::{SequenceBuilder, SequenceError};

/// Where one sampled turn sits in a sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnSpan {
    /// The turn's index in the trajectory.
    pub step: usize,
    /// Its trained positions: the sampled ids (with the end-of-turn token when the model sampled
    /// it).
    pub range: Range<usize>,
}

/// A training sequence of sampled turns.
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeSequence {
    /// Ids, with the loss mask over exactly the sampled tokens.
    pub tokens: TokenSequence,
    /// Behaviour log-prob of each position (0 where nothing was sampled).
    pub behaviour: Vec<f64>,
    /// The sampled turns, in order.
    pub turns: Vec<TurnSpan>,
}

/// Why an episode cannot be trained on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EpisodeError {
    /// A turn has no sampled tokens (the backend did not report them).
    #[error("turn {0} has no sampled tokens: RL needs a backend that reports token ids and log-probs")]
    NoTokens(usize),
    /// A turn's ids and log-probs disagree in length.
    #[error("turn {step}: {ids} ids but {logprobs} log-probs")]
    Mismatch {
        /// The turn.
        step: usize,
        /// Ids.
        ids: usize,
        /// Log-probs.
        logprobs: usize,
    },
    /// The model ended its turn with a token other than the one the template closes turns with.
    #[error("turn {0} ended with an end-of-sequence token that the chat template does not close turns with")]
    EndOfTurn(usize),
    /// The conversation cannot be encoded (too long for the context, template problems).
    #[error(transparent)]
    Sequence(#[from] SequenceError),
}

/// The training sequences of `trajectory`. Turns that sampled nothing are skipped.
pub fn episode_sequences(
    builder: &SequenceBuilder,
    trajectory: &Trajectory,
) -> Result<Vec<EpisodeSequence>, EpisodeError> {
    // Conversations and their sampled turns: (message index, step, tokens). A context may hold
    // earlier assistant turns (MemPO's last step) that belong to another sequence.
    type Turns<'a> = Vec<(usize, usize, &'a TurnTokens)>;
    let mut groups: Vec<(Vec<Message>, Turns<'_>)> = Vec::new();
    for (step, context) in trajectory.contexts().into_iter().enumerate() {
        let record = &trajectory.steps[step];
        let tokens = record.tokens.as_ref().ok_or(EpisodeError::NoTokens(step))?;
        if tokens.output_ids.len() != tokens.logprobs.len() {
            return Err(EpisodeError::Mismatch { step, ids: tokens.output_ids.len(), logprobs: tokens.logprobs.len() });
        }
        if tokens.output_ids.is_empty() {
            continue;
        }
        let extends = groups.last().is_some_and(|(chat, _)| context.len() > chat.len() && context.starts_with(chat));
        match groups.last_mut() {
            Some((chat, turns)) if extends => {
                chat.extend_from_slice(&context[chat.len()..]);
                turns.push((chat.len(), step, tokens));
                chat.push(record.message());
            }
            _ => {
                let mut chat = context;
                let at = chat.len();
                chat.push(record.message());
                groups.push((chat, vec![(at, step, tokens)]));
            }
        }
    }
    groups
        .into_iter()
        .map(|(chat, turns)| {
            let encoded = builder.encode(&chat)?;
            let n = encoded.ids.len();
            let mut mask = vec![false; n];
            let mut behaviour = vec![0.0; n];
            let mut spans = Vec::with_capacity(turns.len());
            for (at, step, tokens) in &turns {
                let Some((_, range)) = encoded.assistant.iter().find(|(i, _)| i == at) else {
                    return Err(EpisodeError::Sequence(SequenceError::Invalid(format!(
                        "turn {step} is missing from its encoded conversation"
                    ))));
                };
                // A sampled end-of-turn token is the template's token right after the content.
                let end = range.end + usize::from(tokens.closed);
                if tokens.closed && encoded.ids.get(range.end) != tokens.output_ids.last() {
                    return Err(EpisodeError::EndOfTurn(*step));
                }
                for (position, logprob) in (range.start..end.min(n)).zip(&tokens.logprobs) {
                    mask[position] = true;
                    behaviour[position] = *logprob;
                }
                spans.push(TurnSpan { step: *step, range: range.start..end.min(n) });
            }
            Ok(EpisodeSequence { tokens: TokenSequence { ids: encoded.ids, loss_mask: mask }, behaviour, turns: spans })
        })
        .collect()
}

/// The token range, within a turn's `ids`, of its `<mem>...</mem>` block (tags included): the
/// last closed one that is not inside a `<think>` (a memory the model only thinks about is not its
/// memory; the last, as the agent keeps the last). The same block as [`mem_text`], so MemPO's
/// memory reward and its advantage are about one memory. Found in one pass: the ids are decoded
/// once as a stream, which also keeps a token that holds part of a UTF-8 character from shifting
/// the offsets. `None` when the turn has no closed memory block.
pub fn mem_span(tokenizer: &Tokenizer, ids: &[i64]) -> Result<Option<Range<usize>>, PolicyError> {
    let (text, ends) = tokenizer.decode_with_ends(ids)?;
    let Some((start, end)) = block_outside_think(&text, Tag::Mem) else { return Ok(None) };
    Ok(tokens_covering(&ends, start, end))
}

/// The memory of a turn's text: the content (trimmed) of the block [`mem_span`] finds. `None`
/// when there is no closed `<mem>` outside `<think>`: an unclosed one has no tokens to credit.
pub fn mem_text(text: &str) -> Option<&str> {
    let (start, end) = block_outside_think(text, Tag::Mem)?;
    let open = Tag::Mem.name().len() + 2;
    let close = open + 1;
    Some(text[start + open..end - close].trim())
}

/// The tokens whose text overlaps bytes `start..end`, given each token's end offset in the
/// decoded text: the first whose text reaches past `start` through the first that reaches `end`.
pub fn tokens_covering(ends: &[usize], start: usize, end: usize) -> Option<Range<usize>> {
    let first = ends.partition_point(|&e| e <= start);
    let last = ends.partition_point(|&e| e < end);
    (first < ends.len()).then(|| first..(last + 1).min(ends.len()))
}

/// The byte range of the last closed `<tag>...</tag>` of `text` outside any `<think>` block.
fn block_outside_think(text: &str, tag: Tag) -> Option<(usize, usize)> {
    let (open, close) = (format!("<{}>", tag.name()), format!("</{}>", tag.name()));
    let (think_open, think_close) = (format!("<{}>", Tag::Think.name()), format!("</{}>", Tag::Think.name()));
    let mut depth = 0_usize;
    let mut at = 0;
    let mut last = None;
    while let Some(offset) = text[at..].find('<') {
        let here = at + offset;
        let rest = &text[here..];
        if rest.starts_with(&think_open) {
            depth += 1;
            at = here + think_open.len();
        } else if rest.starts_with(&think_close) {
            depth = depth.saturating_sub(1);
            at = here + think_close.len();
        } else if depth == 0 && rest.starts_with(&open) {
            let body = here + open.len();
            let Some(close_at) = text[body..].find(&close) else { break };
            let end = body + close_at + close.len();
            last = Some((here, end));
            at = end;
        } else {
            at = here + 1;
        }
    }
    last
}
