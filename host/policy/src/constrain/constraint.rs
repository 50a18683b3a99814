//! Constrained generation: a batch whose sequence `i` follows matcher `i`, and
//! [`Policy::generate_json`], which closes and parses each document.

use serde_json::Value;

use super::grammar::JsonSchemaGrammar;
use super::matcher::JsonMatcher;
use super::tokens::TokenTable;
use crate::generate::Constraint;
use crate::{Policy, PolicyError, SamplingParams};

/// Constrains a batch: sequence `i` follows `matchers[i]`.
#[derive(Debug)]
pub struct JsonConstraint<'a> {
    table: &'a TokenTable,
    matchers: Vec<JsonMatcher>,
    texts: Vec<String>,
}

impl<'a> JsonConstraint<'a> {
    /// One matcher per sequence.
    pub fn new(table: &'a TokenTable, matchers: Vec<JsonMatcher>) -> Self {
        let texts = vec![String::new(); matchers.len()];
        JsonConstraint { table, matchers, texts }
    }
}

impl Constraint for JsonConstraint<'_> {
    fn mask(&mut self, sequence: usize, logits: &mut [f32]) {
        if let Some(m) = self.matchers.get(sequence) {
            self.table.mask_first_chars(m, logits);
        }
    }

    fn allows(&mut self, sequence: usize, token: i64) -> bool {
        let (Some(m), Some(text)) = (self.matchers.get(sequence), self.table.text(token)) else { return false };
        m.after(text).is_some()
    }

    fn advance(&mut self, sequence: usize, token: i64) -> bool {
        let (Some(m), Some(text)) = (self.matchers.get_mut(sequence), self.table.text(token)) else { return true };
        if m.feed_str(text) {
            self.texts[sequence].push_str(text);
        }
        m.is_complete()
    }
}

/// A constrained output.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonOutput {
    /// The document's text.
    pub text: String,
    /// The document.
    pub value: Value,
    /// Tokens the model generated.
    pub generated_tokens: usize,
    /// Characters appended to close the document after the token budget ran out.
    pub completed_chars: usize,
}

impl Policy {
    /// Generates one JSON document per prompt, each following its grammar: every output parses and
    /// validates against its schema. The outer error is the batch's (bad prompts, the model); an
    /// inner one is a sequence's own, so one bad sequence does not cost the others.
    pub fn generate_json(
        &self,
        prompts: &[Vec<i64>],
        grammars: &[&JsonSchemaGrammar],
        table: &TokenTable,
        params: &SamplingParams,
    ) -> Result<Vec<Result<JsonOutput, PolicyError>>, PolicyError> {
        if prompts.len() != grammars.len() {
            return Err(PolicyError::Sampling(format!("{} prompts but {} grammars", prompts.len(), grammars.len())));
        }
        let matchers = grammars.iter().map(|g| g.matcher()).collect();
        let mut constraint = JsonConstraint::new(table, matchers);
        let (generations, _) = self.generate_with(prompts, params, None, Some(&mut constraint))?;
        let mut out = Vec::with_capacity(prompts.len());
        for (i, g) in generations.iter().enumerate() {
            let suffix = constraint.matchers[i].completion();
            let text = format!("{}{suffix}", constraint.texts[i]);
            let parsed = serde_json::from_str(&text)
                .map_err(|e| PolicyError::Sampling(format!("constrained output `{text}` is not JSON: {e}")));
            out.push(parsed.map(|value| JsonOutput {
                text,
                value,
                generated_tokens: g.output_ids.len(),
                completed_chars: suffix.len(),
            }));
        }
        Ok(out)
    }
}
