//! Registering tools: checks, embeddings, and merging near-duplicates into the tools held.

use rusqlite::{OptionalExtension, Transaction, TransactionBehavior, params};
use serde::Serialize;
use toolsmith_contract::Manifest;

use super::Registry;
use super::blobs::{collect_blobs, put_blob};
use super::links::resolve;
use super::rows::{manifest_json, write_tool_row};
use crate::RegistryError;
use crate::embed::{self, cosine, to_bytes};
use crate::index::Dense;

/// A tool to register: its manifest and, for plugins and Python tools, the component bytes or
/// source it runs from.
#[derive(Debug, Clone)]
pub struct NewTool {
    /// What the tool is and takes.
    pub manifest: Manifest,
    /// The component (`.wasm`) or Python source it runs from, if any.
    pub blob: Option<Vec<u8>>,
}

impl NewTool {
    /// A tool with nothing to run from (simulated, native, or a manifest only).
    pub fn new(manifest: Manifest) -> NewTool {
        NewTool { manifest, blob: None }
    }

    /// With the component or source it runs from.
    pub fn with_blob(mut self, blob: Vec<u8>) -> NewTool {
        self.blob = Some(blob);
        self
    }
}

/// What registering a tool did.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Registered {
    /// A new node.
    Added {
        /// The tool's name.
        name: String,
    },
    /// An existing tool of this name got a new manifest; its statistics and edges are kept.
    Updated {
        /// The tool's name.
        name: String,
    },
    /// Already present exactly as given.
    Unchanged {
        /// The tool's name.
        name: String,
    },
    /// A near-duplicate of `into`: recorded as an alias of it.
    Merged {
        /// The name registered, now an alias.
        name: String,
        /// The tool it was merged into.
        into: String,
        /// Cosine of the two tools' embeddings.
        similarity: f32,
    },
}

impl Registered {
    /// The name the tool is known by now.
    pub fn canonical(&self) -> &str {
        match self {
            Registered::Added { name } | Registered::Updated { name } | Registered::Unchanged { name } => name,
            Registered::Merged { into, .. } => into,
        }
    }
}

impl Registry {
    /// Registers one tool, merging it into a near-duplicate when `merge` is set.
    pub fn register(&mut self, tool: NewTool, merge: bool) -> Result<Registered, RegistryError> {
        Ok(self.register_many(vec![tool], merge)?.remove(0))
    }

    /// Registers tools in one transaction with one batched embedding call.
    pub fn register_many(&mut self, tools: Vec<NewTool>, merge: bool) -> Result<Vec<Registered>, RegistryError> {
        // Checked before the (costly) embedding; `register_checked` does not check again.
        check_all(&tools)?;
        let embedder = self.embedder()?;
        let texts: Vec<String> =
            tools.iter().map(|t| embed::tool_text(t.manifest.name.as_str(), &t.manifest.description)).collect();
        let vectors = embedder.embed(&texts)?;
        self.register_checked(tools, vectors, merge)
    }

    /// [`Registry::register_many`] with the embeddings already computed (one unit vector of
    /// [`embed::DIM`] per tool, of [`embed::tool_text`]), e.g. for bulk loads.
    pub fn register_many_embedded(
        &mut self,
        tools: Vec<NewTool>,
        vectors: Vec<Vec<f32>>,
        merge: bool,
    ) -> Result<Vec<Registered>, RegistryError> {
        check_all(&tools)?;
        self.register_checked(tools, vectors, merge)
    }

    fn register_checked(
        &mut self,
        tools: Vec<NewTool>,
        vectors: Vec<Vec<f32>>,
        merge: bool,
    ) -> Result<Vec<Registered>, RegistryError> {
        let merging = if merge { Merging::Similar } else { Merging::Never };
        Ok(self.register_with(tools, vectors, merging, |_, _, _| Ok(()))?.into_iter().map(|(r, _)| r).collect())
    }

    /// Registers checked tools with their vectors in one transaction, merging as `merging` says;
    /// `after` runs in the transaction after each tool (index, outcome, canonical id), e.g. to
    /// write aliases. Returns each outcome with the closest held tool at or above the merge
    /// threshold when `merging` is [`Merging::SameInterface`] and it was not merged into it.
    pub(crate) fn register_with(
        &mut self,
        tools: Vec<NewTool>,
        vectors: Vec<Vec<f32>>,
        merging: Merging,
        mut after: impl FnMut(&Transaction<'_>, usize, i64) -> Result<(), RegistryError>,
    ) -> Result<Vec<(Registered, Option<Close>)>, RegistryError> {
        if vectors.len() != tools.len() || vectors.iter().any(|v| v.len() != embed::DIM) {
            return Err(RegistryError::Invalid(format!("need one {}-d vector per tool", embed::DIM)));
        }
        self.dense.sync(&self.conn)?;
        let threshold = self.settings.merge_threshold;
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut out = Vec::with_capacity(tools.len());
        // Tools added earlier in this batch take part in merging later ones.
        let mut added: Vec<(i64, Vec<f32>)> = Vec::new();
        for (i, (tool, vector)) in tools.into_iter().zip(vectors).enumerate() {
            let (outcome, near) = register_one(&tx, &self.dense, &added, tool, &vector, merging, threshold)?;
            let id: i64 = tx.query_row("SELECT id FROM tools WHERE name = ?1", [outcome.canonical()], |r| r.get(0))?;
            if let Registered::Added { .. } | Registered::Updated { .. } = &outcome {
                added.push((id, vector));
            }
            after(&tx, i, id)?;
            out.push((outcome, near));
        }
        tx.commit()?;
        Ok(out)
    }

    /// The name each of `tools` (name, description) would be kept under if they were registered
    /// now, in order, with merging; nothing is written. That is its own name (a new tool, or one
    /// the registry holds), the tool it is an alias of, or the most similar tool, held or earlier
    /// in `tools`, at or above the merge threshold. SEARL anchors its step credit on these names,
    /// so near-duplicate tools that different rollouts wrote share one step group.
    pub fn merged_names(&mut self, tools: &[(&str, &str)]) -> Result<Vec<String>, RegistryError> {
        if tools.is_empty() {
            return Ok(Vec::new());
        }
        let texts: Vec<String> = tools.iter().map(|(name, description)| embed::tool_text(name, description)).collect();
        let vectors = self.embedder()?.embed(&texts)?;
        self.dense.sync(&self.conn)?;
        let threshold = self.settings.merge_threshold;
        // The new names so far, with their vectors, as a batch's earlier tools take part in
        // merging its later ones.
        let mut fresh: Vec<(String, Vec<f32>)> = Vec::new();
        let mut out = Vec::with_capacity(tools.len());
        for (&(name, _), vector) in tools.iter().zip(vectors) {
            if let Some(known) = self.resolve(name)? {
                out.push(known);
                continue;
            }
            if fresh.iter().any(|(n, _)| n == name) {
                out.push(name.to_string());
                continue;
            }
            // The same choice as `register_one`'s, among held tools and this batch's earlier ones.
            enum Target<'a> {
                Held(i64),
                Earlier(&'a str),
            }
            let held = self.dense.nearest(&vector).map(|(id, s)| (Target::Held(id), s));
            let earlier = fresh.iter().map(|(n, v)| (Target::Earlier(n), cosine(v, &vector)));
            match closest(held.into_iter().chain(earlier), threshold) {
                Some((Target::Earlier(into), _)) => out.push(into.to_string()),
                Some((Target::Held(id), _)) => {
                    out.push(self.conn.query_row("SELECT name FROM tools WHERE id = ?1", [id], |r| r.get(0))?)
                }
                None => {
                    out.push(name.to_string());
                    fresh.push((name.to_string(), vector));
                }
            }
        }
        Ok(out)
    }
}

fn check_all(tools: &[NewTool]) -> Result<(), RegistryError> {
    tools.iter().try_for_each(|t| check_new(&t.manifest))
}

/// What a tool must be to enter the registry: a sound manifest, whose schemas are JSON Schemas
/// and whose examples fit them, under a name that is not reserved.
pub(crate) fn check_new(manifest: &toolsmith_contract::Manifest) -> Result<(), RegistryError> {
    manifest.check().map_err(|e| RegistryError::Invalid(format!("`{}`: {e}", manifest.name)))?;
    toolsmith_contract::validate::check_manifest(manifest)
        .map_err(|e| RegistryError::Invalid(format!("`{}`: {e}", manifest.name)))?;
    if toolsmith_contract::RESERVED_TOOL_NAMES.contains(&manifest.name.as_str()) {
        return Err(RegistryError::Invalid(format!(
            "`{}` is the name of a meta tool every server answers to; give the tool another name",
            manifest.name
        )));
    }
    Ok(())
}

/// The most similar of `candidates` (held tools first, then a batch's earlier ones) at or above
/// `threshold`; of equals, the last.
fn closest<T>(candidates: impl Iterator<Item = (T, f32)>, threshold: f32) -> Option<(T, f32)> {
    candidates.filter(|(_, s)| *s >= threshold).max_by(|a, b| a.1.total_cmp(&b.1))
}

/// A held tool close to one registered: its name and the cosine of their embeddings.
pub(crate) type Close = (String, f32);

/// When a tool registered under a new name becomes an alias of a held one instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Merging {
    /// Never: every new name is a new node.
    Never,
    /// When its interface (description, input and output schema) is the same as a held tool's;
    /// the closest held tool at or above the threshold is reported, not merged into.
    SameInterface,
    /// When its embedding is within the merge threshold of a held tool's (SEARL's rule).
    Similar,
}

fn register_one(
    tx: &Transaction<'_>,
    dense: &Dense,
    batch: &[(i64, Vec<f32>)],
    tool: NewTool,
    vector: &[f32],
    merging: Merging,
    threshold: f32,
) -> Result<(Registered, Option<Close>), RegistryError> {
    let name = tool.manifest.name.as_str().to_string();
    let json = manifest_json(&tool.manifest);
    let hash = tool.blob.as_deref().map(|b| put_blob(tx, b)).transpose()?;
    let existing: Option<(String, Option<String>)> = tx
        .query_row("SELECT manifest, blob_hash FROM tools WHERE name = ?1", [&name], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    if let Some((old, old_hash)) = existing {
        if old == json && old_hash == hash {
            return Ok((Registered::Unchanged { name }, None));
        }
        write_tool_row(tx, &tool.manifest, &json, hash.as_deref(), Some(&to_bytes(vector)))?;
        collect_blobs(tx)?;
        return Ok((Registered::Updated { name }, None));
    }
    if let Some((canonical, _)) = resolve(tx, &name)? {
        let into: String = tx.query_row("SELECT name FROM tools WHERE id = ?1", [canonical], |r| r.get(0))?;
        let similarity = dense.vector(canonical).map(|v| cosine(v, vector)).unwrap_or(1.0);
        return Ok((Registered::Merged { name, into, similarity }, None));
    }
    let nearest = || {
        let candidates = dense.nearest(vector).into_iter().chain(batch.iter().map(|(id, v)| (*id, cosine(v, vector))));
        closest(candidates, threshold)
    };
    let merge_into = |canonical: i64, similarity: f32, why: &str| -> Result<Registered, RegistryError> {
        let into: String = tx.query_row("SELECT name FROM tools WHERE id = ?1", [canonical], |r| r.get(0))?;
        tx.execute("INSERT OR REPLACE INTO aliases (alias, canonical) VALUES (?1, ?2)", params![name, canonical])?;
        collect_blobs(tx)?;
        tracing::info!(tool = %name, into = %into, similarity, why, "merged on registration");
        Ok(Registered::Merged { name: name.clone(), into, similarity })
    };
    let mut near = None;
    match merging {
        Merging::Never => {}
        Merging::Similar => {
            if let Some((canonical, similarity)) = nearest() {
                return Ok((merge_into(canonical, similarity, "near-duplicate")?, None));
            }
        }
        Merging::SameInterface => {
            if let Some(canonical) = same_interface(tx, &tool.manifest)? {
                let similarity = dense
                    .vector(canonical)
                    .or_else(|| batch.iter().find(|(id, _)| *id == canonical).map(|(_, v)| v.as_slice()))
                    .map_or(1.0, |v| cosine(v, vector));
                return Ok((merge_into(canonical, similarity, "same interface")?, None));
            }
            if let Some((id, similarity)) = nearest() {
                let close: String = tx.query_row("SELECT name FROM tools WHERE id = ?1", [id], |r| r.get(0))?;
                near = Some((close, similarity));
            }
        }
    }
    write_tool_row(tx, &tool.manifest, &json, hash.as_deref(), Some(&to_bytes(vector)))?;
    Ok((Registered::Added { name }, near))
}

/// A held tool (committed, or earlier in this transaction) with the same description, input
/// schema and output schema as `manifest`: the same interface under another name.
fn same_interface(tx: &Transaction<'_>, manifest: &Manifest) -> Result<Option<i64>, RegistryError> {
    let mut stmt = tx.prepare_cached("SELECT id, manifest FROM tools WHERE description = ?1 ORDER BY id")?;
    let mut rows = stmt.query([&manifest.description])?;
    while let Some(row) = rows.next()? {
        let text: String = row.get(1)?;
        // A stored manifest that does not parse is doctor's to report; it is no match here.
        let Ok(held) = serde_json::from_str::<Manifest>(&text) else { continue };
        if held.input_schema == manifest.input_schema && held.output_schema == manifest.output_schema {
            return Ok(Some(row.get(0)?));
        }
    }
    Ok(None)
}
