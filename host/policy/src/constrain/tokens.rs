//! The token table: each token's text, decoded once per tokenizer, and the cheap first-character
//! filter over it.

use std::collections::HashMap;

use super::matcher::JsonMatcher;
use crate::{PolicyError, Tokenizer};

/// Each token's text, decoded once per tokenizer, indexed by first character for the cheap
/// filter.
#[derive(Debug)]
pub struct TokenTable {
    texts: Vec<Option<String>>,
    by_first: HashMap<char, Vec<i64>>,
}

impl TokenTable {
    /// Decodes every token of `tokenizer`. Special tokens and tokens that decode to nothing are
    /// never allowed inside a document.
    pub fn new(tokenizer: &Tokenizer) -> Result<Self, PolicyError> {
        let n = tokenizer.vocab_size();
        let mut texts = Vec::with_capacity(n);
        let mut by_first: HashMap<char, Vec<i64>> = HashMap::new();
        // SentencePiece-style decoders drop a word-initial space at the start of a text; decoding
        // each token after a fixed one keeps it ("▁word" is " word" mid-text).
        let anchor = tokenizer.encode("a")?.first().copied();
        let anchor_text = match anchor {
            Some(a) => tokenizer.decode(&[a])?,
            None => String::new(),
        };
        for id in 0..n as i64 {
            let text = match anchor {
                Some(a) => {
                    let both = tokenizer.decode(&[a, id])?;
                    match both.strip_prefix(anchor_text.as_str()) {
                        Some(rest) if !anchor_text.is_empty() => rest.to_string(),
                        _ => tokenizer.decode(&[id])?,
                    }
                }
                None => tokenizer.decode(&[id])?,
            };
            let usable = !text.is_empty() && !text.contains('\u{FFFD}');
            if usable {
                if let Some(c) = text.chars().next() {
                    by_first.entry(c).or_default().push(id);
                }
                texts.push(Some(text));
            } else {
                texts.push(None);
            }
        }
        Ok(TokenTable { texts, by_first })
    }

    /// The text of `id`.
    pub fn text(&self, id: i64) -> Option<&str> {
        self.texts.get(id as usize).and_then(|t| t.as_deref())
    }

    /// Sets the logits of tokens that cannot follow to -inf, using only their first character.
    pub fn mask_first_chars(&self, matcher: &JsonMatcher, logits: &mut [f32]) {
        self.mask_by_first_char(|c| matcher.allows_char(c), &[], logits);
    }

    /// Sets the logits of tokens whose first character `allows` refuses to -inf, except the ids
    /// in `keep` (an end-of-turn token where the grammar may end).
    pub fn mask_by_first_char(&self, allows: impl Fn(char) -> bool, keep: &[i64], logits: &mut [f32]) {
        let mut allowed = vec![false; logits.len()];
        for &id in keep {
            if let Some(a) = allowed.get_mut(id as usize) {
                *a = true;
            }
        }
        for (&c, ids) in &self.by_first {
            if allows(c) {
                for &id in ids {
                    if let Some(a) = allowed.get_mut(id as usize) {
                        *a = true;
                    }
                }
            }
        }
        for (l, a) in logits.iter_mut().zip(allowed) {
            if !a {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}
