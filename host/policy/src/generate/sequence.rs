//! One row of a generation: its prompt, what it has drawn, its sampler, and how its text ends
//! and streams.

use crate::sampling::{Sampler, SamplingParams};
use crate::{PolicyError, Tokenizer};

use super::{FinishReason, Request, TokenEvent};

/// One row of a generation: its prompt, what it has drawn so far, and its sampler.
pub(super) struct Sequence {
    pub(super) prompt: Vec<i64>,
    pub(super) output: Vec<i64>,
    pub(super) logprobs: Vec<f64>,
    /// The prompt and the output: what the repetition penalty counts.
    pub(super) seen: Vec<i64>,
    pub(super) sampler: Sampler,
    pub(super) finish: Option<FinishReason>,
    /// Text emitted to the stream so far.
    pub(super) streamed: usize,
    /// Where the text ends, before the stop string that ended it.
    pub(super) stop_at: Option<usize>,
}

impl Sequence {
    /// A sequence per prompt of `request`, its sampler seeded and past the draws already made.
    pub(super) fn start(request: &Request<'_, '_, '_>) -> Vec<Sequence> {
        let (params, seeds, drawn) = (request.params, request.seeds, request.drawn);
        request
            .prompts
            .iter()
            .enumerate()
            .map(|(i, p)| Sequence {
                prompt: p.clone(),
                output: Vec::new(),
                logprobs: Vec::new(),
                seen: p.clone(),
                // Sampler i draws from seed + stream: a stream that lands on the request's seed.
                sampler: {
                    let mut sampler = Sampler::new(params, seeds.map_or(i as u64, |s| s[i].wrapping_sub(params.seed)));
                    sampler.skip(drawn.map_or(0, |d| d[i]));
                    sampler
                },
                finish: None,
                streamed: 0,
                stop_at: None,
            })
            .collect()
    }

    /// Records `token`, drawn with `logprob`.
    pub(super) fn take(&mut self, token: i64, logprob: f64) {
        self.logprobs.push(logprob);
        self.output.push(token);
        self.seen.push(token);
    }

    /// Whether `token`, just taken, ends the sequence: `done` when the constraint says the output
    /// is complete, else an end-of-sequence or stop token, or the length.
    pub(super) fn check_end(&mut self, token: i64, done: bool, params: &SamplingParams, eos_ids: &[i64]) {
        if done {
            self.finish = Some(FinishReason::Constraint);
        } else if !params.ignore_eos && eos_ids.contains(&token) {
            self.finish = Some(FinishReason::Eos);
        } else if params.stop_token_ids.contains(&token) {
            self.finish = Some(FinishReason::StopToken);
        } else if self.output.len() == params.max_new_tokens || params.ends_in_loop(&self.output) {
            self.finish = Some(FinishReason::Length);
        }
    }

    /// Decodes the output so far: ends it at a stop string (none longer than `longest_stop`), and
    /// streams the text that is now known to `on_token` as sequence `i`'s, after `token`.
    pub(super) fn stream(
        &mut self,
        i: usize,
        token: i64,
        tokenizer: &Tokenizer,
        params: &SamplingParams,
        longest_stop: usize,
        on_token: Option<&mut (dyn FnMut(TokenEvent<'_>) + '_)>,
    ) -> Result<(), PolicyError> {
        let text = tokenizer.decode(&self.output)?;
        if let Some(at) = first_stop(&text, &params.stop_strings) {
            self.finish = Some(FinishReason::StopString);
            self.stop_at = Some(at);
        }
        if let Some(callback) = on_token {
            let end = match self.stop_at {
                Some(at) => at,
                None if self.finish.is_some() => text.len(),
                None => safe_prefix(&text, longest_stop),
            };
            let delta = if end > self.streamed { &text[self.streamed..end] } else { "" };
            callback(TokenEvent { sequence: i, token_id: token, text: delta });
            self.streamed = self.streamed.max(end);
        }
        Ok(())
    }
}

/// Byte offset of the earliest stop string in `text`.
fn first_stop(text: &str, stops: &[String]) -> Option<usize> {
    stops.iter().filter_map(|s| text.find(s.as_str())).min()
}

/// How much of `text` can be streamed now: everything but a tail that could still grow into a
/// stop string, and never a trailing replacement character (half of a multi-byte character).
fn safe_prefix(text: &str, longest_stop: usize) -> usize {
    let mut end = text.len().saturating_sub(longest_stop.saturating_sub(1));
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    let trimmed = text[..end].trim_end_matches('\u{FFFD}');
    trimmed.len()
}
