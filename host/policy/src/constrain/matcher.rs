//! The matcher: the set of parses the text so far allows, fed text and asked what may follow.

use std::sync::Arc;

use super::completion::preferred;
use super::machine::{Frame, Stack, complete, feed};
use super::schema::Node;

/// The state of one constrained output: the set of parses the text so far allows.
#[derive(Debug, Clone)]
pub struct JsonMatcher {
    stacks: Vec<Stack>,
}

impl JsonMatcher {
    /// A matcher at the start of a document of `root`.
    pub(super) fn start(root: Arc<Node>) -> Self {
        JsonMatcher { stacks: vec![vec![Frame::Value(root)]] }
    }

    /// Feeds text; false (and the matcher unchanged) when it cannot continue a valid document.
    pub fn feed_str(&mut self, text: &str) -> bool {
        match self.after(text) {
            Some(next) => {
                *self = next;
                true
            }
            None => false,
        }
    }

    /// The matcher after `text`, if `text` is allowed.
    pub fn after(&self, text: &str) -> Option<JsonMatcher> {
        let mut stacks = self.stacks.clone();
        for c in text.chars() {
            let mut next = Vec::new();
            for s in stacks {
                feed(s, c, &mut next);
            }
            if next.is_empty() {
                return None;
            }
            // Forks that reached the same state would multiply: keep at most a few.
            next.truncate(16);
            stacks = next;
        }
        Some(JsonMatcher { stacks })
    }

    /// Whether `c` may come next.
    pub fn allows_char(&self, c: char) -> bool {
        let mut out = Vec::new();
        for s in &self.stacks {
            feed(s.clone(), c, &mut out);
            if !out.is_empty() {
                return true;
            }
        }
        false
    }

    /// Whether the text so far is a complete document.
    pub fn is_complete(&self) -> bool {
        self.stacks.iter().any(complete)
    }

    /// Whether the document is complete and nothing more may follow.
    pub fn is_closed(&self) -> bool {
        self.stacks.iter().all(Vec::is_empty)
    }

    /// The shortest-effort suffix that completes the document (empty when complete).
    pub fn completion(&self) -> String {
        let mut out = String::new();
        let mut m = self.clone();
        for _ in 0..4096 {
            if m.is_complete() {
                return out;
            }
            let Some(c) = m.preferred_char() else { return out };
            match m.after(&c.to_string()) {
                Some(next) => {
                    m = next;
                    out.push(c);
                }
                None => return out,
            }
        }
        out
    }

    /// The character that moves the first parse closest to completion.
    fn preferred_char(&self) -> Option<char> {
        let stack = self.stacks.first()?;
        preferred(stack).into_iter().find(|&c| self.allows_char(c))
    }
}
