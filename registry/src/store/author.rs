//! Tools a person adds (`toolsmith tools add`, `tools import` of other formats): many at once, in
//! one transaction, and never merged into another tool by surprise.
//!
//! SEARL merges an agent's candidate into a held tool whose description embeds within the merge
//! threshold, and [`Registry::register_many`] keeps that rule. An author's tool with its own name,
//! parameters and provider is a different tool even when its description reads alike, so here a
//! tool merges only when its interface is the same as a held one's (or when asked); a close tool
//! is reported instead.

use std::collections::HashMap;

use rusqlite::params;
use serde::Serialize;

use super::Registry;
use super::register::{Merging, Registered, check_new};
use crate::RegistryError;
use crate::embed;
use crate::formats::{Definition, DefinitionProblem, Format};

/// Texts embedded per call: MiniLM on ONNX Runtime is fastest at about this batch (longer
/// batches pad every text to the longest one).
const EMBED_BATCH: usize = 32;

/// How [`Registry::add_definitions`] treats a tool whose description is close to a held one's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuthorMerge {
    /// Merge only a tool whose description, input and output schema equal a held tool's; report a
    /// close one (the default of `tools add`).
    #[default]
    SameInterface,
    /// Merge into a held tool within the merge threshold, as SEARL merges agents' tools (`--merge`).
    Similar,
    /// Never merge (`--no-merge`).
    Never,
}

/// A registered tool that is close to the one just added but was kept apart from it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NearDuplicate {
    /// The close tool's name.
    pub name: String,
    /// Cosine of the two tools' embeddings.
    pub similarity: f32,
}

/// What adding one definition did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AddedTool {
    /// The registration's outcome, under the tool name.
    #[serde(flatten)]
    pub outcome: Registered,
    /// The name the file gave the tool, when it was mapped to a tool name; now an alias.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub original_name: Option<String>,
    /// A close tool it was not merged into.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub near_duplicate: Option<NearDuplicate>,
    /// The file it came from.
    pub file: String,
    /// JSON pointer of its definition in the file.
    pub pointer: String,
}

impl Registry {
    /// Checks every definition (shape, meta-schema, examples against schemas, reserved names,
    /// one interface per name), then embeds them in batches and registers them all in one
    /// transaction; nothing is written when any is wrong, and every problem is reported.
    /// `progress(done, total)` follows the embedding.
    pub fn add_definitions(
        &mut self,
        definitions: Vec<Definition>,
        merge: AuthorMerge,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Vec<AddedTool>, RegistryError> {
        check_definitions(&definitions)?;
        // An interface-only definition of a tool held under its name with the same interface (a
        // `tools export --format openai|mcp` read back) leaves the held tool, and its code, as is.
        let mut kept = Vec::new();
        let mut unchanged = Vec::new();
        for (i, d) in definitions.into_iter().enumerate() {
            if self.holds_interface(&d)? { unchanged.push((i, d)) } else { kept.push((i, d)) }
        }
        let mut outcomes = self.add_new(kept, merge, progress)?;
        for (i, d) in unchanged {
            self.keep_alias(&d)?;
            let name = d.tool.manifest.name.as_str().to_string();
            let place = (
                i,
                AddedTool {
                    outcome: Registered::Unchanged { name },
                    original_name: d.original_name,
                    near_duplicate: None,
                    file: d.file,
                    pointer: d.pointer,
                },
            );
            outcomes.push(place);
        }
        outcomes.sort_by_key(|(i, _)| *i);
        Ok(outcomes.into_iter().map(|(_, t)| t).collect())
    }

    /// Whether the registry holds a tool of `d`'s name with code, whose interface `d` repeats
    /// without code: description and input schema, and the output schema where `d`'s format has one.
    fn holds_interface(&self, d: &Definition) -> Result<bool, RegistryError> {
        let m = &d.tool.manifest;
        if d.tool.blob.is_some() {
            return Ok(false);
        }
        let held = match self.get(m.name.as_str()) {
            Ok(held) if held.name == m.name.as_str() && held.blob_hash.is_some() => held.manifest,
            Ok(_) | Err(RegistryError::NotFound(_)) => return Ok(false),
            Err(e) => return Err(e),
        };
        let outputs_agree = d.format == Format::OpenAi || held.output_schema == m.output_schema;
        Ok(held.description == m.description && held.input_schema == m.input_schema && outputs_agree)
    }

    /// Records `d`'s original name as an alias of its tool.
    fn keep_alias(&self, d: &Definition) -> Result<(), RegistryError> {
        if let Some(original) = &d.original_name {
            self.conn.execute(
                "INSERT OR REPLACE INTO aliases (alias, canonical) SELECT ?1, id FROM tools WHERE name = ?2",
                params![original, d.tool.manifest.name.as_str()],
            )?;
        }
        Ok(())
    }

    /// Embeds and registers `definitions` (with their places in the command's order).
    fn add_new(
        &mut self,
        definitions: Vec<(usize, Definition)>,
        merge: AuthorMerge,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Vec<(usize, AddedTool)>, RegistryError> {
        if definitions.is_empty() {
            return Ok(Vec::new());
        }
        let (order, definitions): (Vec<usize>, Vec<Definition>) = definitions.into_iter().unzip();
        let embedder = self.embedder()?;
        let texts: Vec<String> = definitions
            .iter()
            .map(|d| embed::tool_text(d.tool.manifest.name.as_str(), &d.tool.manifest.description))
            .collect();
        let mut vectors = Vec::with_capacity(texts.len());
        progress(0, texts.len());
        for chunk in texts.chunks(EMBED_BATCH) {
            vectors.extend(embedder.embed(chunk)?);
            progress(vectors.len(), texts.len());
        }
        let merging = match merge {
            AuthorMerge::SameInterface => Merging::SameInterface,
            AuthorMerge::Similar => Merging::Similar,
            AuthorMerge::Never => Merging::Never,
        };
        let originals: Vec<Option<String>> = definitions.iter().map(|d| d.original_name.clone()).collect();
        let (tools, places): (Vec<_>, Vec<_>) =
            definitions.into_iter().map(|d| (d.tool, (d.original_name, d.file, d.pointer))).unzip();
        let outcomes = self.register_with(tools, vectors, merging, |tx, i, canonical| {
            // A client that read the tool elsewhere calls it by the name it read there.
            if let Some(original) = &originals[i] {
                tx.execute(
                    "INSERT OR REPLACE INTO aliases (alias, canonical) VALUES (?1, ?2)",
                    params![original, canonical],
                )?;
            }
            Ok(())
        })?;
        Ok(order
            .into_iter()
            .zip(outcomes.into_iter().zip(places))
            .map(|(i, ((outcome, near), (original_name, file, pointer)))| {
                let near_duplicate = near.map(|(name, similarity)| NearDuplicate { name, similarity });
                (i, AddedTool { outcome, original_name, near_duplicate, file, pointer })
            })
            .collect())
    }
}

/// Every problem of `definitions`, or none.
fn check_definitions(definitions: &[Definition]) -> Result<(), RegistryError> {
    let mut problems: Vec<DefinitionProblem> = Vec::new();
    // The first definition of each tool name: a second with another interface would silently
    // replace it within one command.
    let mut first: HashMap<&str, &Definition> = HashMap::new();
    for d in definitions {
        let m = &d.tool.manifest;
        if let Err(e) = check_new(m) {
            // The meta-schema and examples again, for the pointer inside the file.
            problems.push(d.check().err().unwrap_or_else(|| d.problem(d.pointer.clone(), e.to_string())));
            continue;
        }
        match first.get(m.name.as_str()) {
            Some(earlier) if earlier.tool.manifest != *m || earlier.tool.blob != d.tool.blob => {
                problems.push(d.problem(
                    d.pointer.clone(),
                    format!(
                        "tool name `{}` is also defined, differently, by `{}` at {} {}; rename one of them",
                        m.name,
                        earlier.given_name(),
                        earlier.file,
                        if earlier.pointer.is_empty() { "(the root)" } else { &earlier.pointer }
                    ),
                ));
            }
            Some(_) => {}
            None => {
                first.insert(m.name.as_str(), d);
            }
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(RegistryError::Definitions(problems)) }
}
