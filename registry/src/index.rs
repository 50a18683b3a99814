//! The derived indexes: tantivy BM25 over tool text, and the in-memory matrix of embeddings.
//!
//! The database is the source of truth. Triggers bump a generation counter on every change to a
//! tool's text or embedding and stamp the row (or a tombstone) with it; each index remembers the
//! generation it reflects (tantivy in its commit payload) and catches up by reading only the rows
//! stamped later. So any process's writes reach every other process's searches, and
//! `toolsmith tools reindex` is a rebuild from scratch, never a repair that needs the old index.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use tantivy::collector::TopDocs;
use tantivy::directory::error::LockError;
use tantivy::query::{BooleanQuery, BoostQuery, Occur, Query, TermQuery};
use tantivy::schema::{FAST, Field, INDEXED, IndexRecordOption, STORED, Schema, TextFieldIndexing, TextOptions};
use tantivy::tokenizer::{
    Language, LowerCaser, RemoveLongFilter, SimpleTokenizer, Stemmer, StopWordFilter, TextAnalyzer,
};
use tantivy::{DocId, Index, IndexReader, IndexWriter, ReloadPolicy, TantivyError, Term, doc};

use crate::RegistryError;
use crate::embed::{DIM, cosine, from_bytes};

/// How long a writer waits for another process to release the index lock.
const LOCK_WAIT: Duration = Duration::from_secs(10);
/// Name and description words weigh the same (1.5 for names measured no better).
const NAME_BOOST: f32 = 1.0;
const WRITER_HEAP: usize = 15_000_000;
/// Parameters are the weakest evidence: their words ("text", "value", "list") recur everywhere.
const PARAMS_BOOST: f32 = 0.5;
const ANALYZER: &str = "toolsmith_en";

/// Words split at anything not alphanumeric (so snake_case splits), lower-cased, English stop
/// words dropped (queries are sentences: "how many days until ..."), Porter-stemmed.
fn analyzer() -> TextAnalyzer {
    let stop = StopWordFilter::new(Language::English).unwrap_or_else(|| StopWordFilter::remove(Vec::<String>::new()));
    TextAnalyzer::builder(SimpleTokenizer::default())
        .filter(RemoveLongFilter::limit(40))
        .filter(LowerCaser)
        .filter(stop)
        .filter(Stemmer::new(Language::English))
        .build()
}

pub(crate) fn generation(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("SELECT value FROM counters WHERE name = 'generation'", [], |r| r.get(0))
}

/// One tool's searchable text.
pub(crate) struct ToolText {
    pub id: i64,
    pub name: String,
    pub description: String,
    /// Parameter names and descriptions, space separated.
    pub params: String,
}

pub(crate) fn params_text(input_schema: &serde_json::Value) -> String {
    let mut out = String::new();
    if let Some(props) = input_schema.get("properties").and_then(|p| p.as_object()) {
        for (name, schema) in props {
            out.push_str(&name.replace('_', " "));
            out.push(' ');
            if let Some(d) = schema.get("description").and_then(|d| d.as_str()) {
                out.push_str(d);
                out.push(' ');
            }
        }
    }
    out
}

fn changed_texts(conn: &Connection, since: i64) -> rusqlite::Result<(Vec<i64>, Vec<ToolText>)> {
    let mut stmt = conn.prepare("SELECT id FROM tombstones WHERE rev > ?1")?;
    let removed = stmt.query_map([since], |r| r.get(0))?.collect::<rusqlite::Result<Vec<i64>>>()?;
    let mut stmt = conn.prepare("SELECT id, name, description, manifest FROM tools WHERE rev > ?1")?;
    let changed = stmt
        .query_map([since], |r| {
            let manifest: String = r.get(3)?;
            let schema = serde_json::from_str::<serde_json::Value>(&manifest)
                .ok()
                .and_then(|m| m.get("input_schema").cloned())
                .unwrap_or_default();
            Ok(ToolText { id: r.get(0)?, name: r.get(1)?, description: r.get(2)?, params: params_text(&schema) })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok((removed, changed))
}

#[derive(Clone, Copy)]
struct Fields {
    id: Field,
    name: Field,
    description: Field,
    params: Field,
}

fn schema() -> (Schema, Fields) {
    let mut b = Schema::builder();
    let text = TextOptions::default().set_indexing_options(
        TextFieldIndexing::default().set_tokenizer(ANALYZER).set_index_option(IndexRecordOption::WithFreqs),
    );
    let id = b.add_u64_field("id", INDEXED | STORED | FAST);
    let name = b.add_text_field("name", text.clone());
    let description = b.add_text_field("description", text.clone());
    let params = b.add_text_field("params", text);
    (b.build(), Fields { id, name, description, params })
}

/// The BM25 index in a directory beside the database.
pub(crate) struct Bm25 {
    dir: PathBuf,
    index: Index,
    reader: IndexReader,
    fields: Fields,
    synced: i64,
}

fn index_error(dir: &Path, source: TantivyError) -> RegistryError {
    RegistryError::Index { path: dir.to_path_buf(), source }
}

impl Bm25 {
    /// Opens the index at `dir`, creating it (empty, generation 0) when missing, and replacing it
    /// when it is unreadable or has another schema: it is derived data.
    pub(crate) fn open(dir: &Path) -> Result<Bm25, RegistryError> {
        let (schema, fields) = schema();
        std::fs::create_dir_all(dir).map_err(|source| RegistryError::Io { path: dir.to_path_buf(), source })?;
        let index = match Index::open_in_dir(dir) {
            Ok(index) if index.schema() == schema => index,
            Ok(_) => {
                tracing::warn!(dir = %dir.display(), "search index has another schema; rebuilding");
                Self::recreate(dir, schema)?
            }
            Err(TantivyError::OpenDirectoryError(_) | TantivyError::OpenReadError(_))
                if !dir.join("meta.json").exists() =>
            {
                Index::create_in_dir(dir, schema).map_err(|e| index_error(dir, e))?
            }
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "search index unreadable; rebuilding");
                Self::recreate(dir, schema)?
            }
        };
        index.tokenizers().register(ANALYZER, analyzer());
        let reader =
            index.reader_builder().reload_policy(ReloadPolicy::Manual).try_into().map_err(|e| index_error(dir, e))?;
        Ok(Bm25 { dir: dir.to_path_buf(), index, reader, fields, synced: -1 })
    }

    fn recreate(dir: &Path, schema: Schema) -> Result<Index, RegistryError> {
        std::fs::remove_dir_all(dir).map_err(|source| RegistryError::Io { path: dir.to_path_buf(), source })?;
        std::fs::create_dir_all(dir).map_err(|source| RegistryError::Io { path: dir.to_path_buf(), source })?;
        Index::create_in_dir(dir, schema).map_err(|e| index_error(dir, e))
    }

    fn committed_generation(&self) -> Result<Option<i64>, RegistryError> {
        let metas = self.index.load_metas().map_err(|e| index_error(&self.dir, e))?;
        Ok(metas.payload.and_then(|p| p.parse().ok()))
    }

    fn writer(&self) -> Result<IndexWriter, RegistryError> {
        let started = Instant::now();
        loop {
            match self.index.writer_with_num_threads(1, WRITER_HEAP) {
                Ok(w) => return Ok(w),
                Err(TantivyError::LockFailure(LockError::LockBusy, _)) if started.elapsed() < LOCK_WAIT => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(index_error(&self.dir, e)),
            }
        }
    }

    /// Brings the index up to the database's generation. `rebuild` starts from empty.
    pub(crate) fn sync(&mut self, conn: &Connection, rebuild: bool) -> Result<(), RegistryError> {
        let current = generation(conn)?;
        if self.synced == current && !rebuild {
            return Ok(());
        }
        if !rebuild && self.committed_generation()? == Some(current) {
            // Another process (or an earlier run) already indexed this generation.
            self.reader.reload().map_err(|e| index_error(&self.dir, e))?;
            self.synced = current;
            return Ok(());
        }
        let mut writer = self.writer()?;
        // Under the lock: see what the last committer left, and read a consistent snapshot.
        let since = if rebuild { None } else { self.committed_generation()? };
        let tx = conn.unchecked_transaction()?;
        let current = generation(&tx)?;
        let (removed, changed) = changed_texts(&tx, since.unwrap_or(0))?;
        tx.finish()?;
        if since.is_none_or(|s| s > current) {
            writer.delete_all_documents().map_err(|e| index_error(&self.dir, e))?;
        }
        let f = self.fields;
        for id in removed.iter().chain(changed.iter().map(|t| &t.id)) {
            writer.delete_term(Term::from_field_u64(f.id, *id as u64));
        }
        for t in &changed {
            writer
                .add_document(doc!(
                    f.id => t.id as u64,
                    f.name => t.name.replace('_', " "),
                    f.description => t.description.as_str(),
                    f.params => t.params.as_str(),
                ))
                .map_err(|e| index_error(&self.dir, e))?;
        }
        let mut commit = writer.prepare_commit().map_err(|e| index_error(&self.dir, e))?;
        commit.set_payload(&current.to_string());
        commit.commit().map_err(|e| index_error(&self.dir, e))?;
        writer.wait_merging_threads().map_err(|e| index_error(&self.dir, e))?;
        self.reader.reload().map_err(|e| index_error(&self.dir, e))?;
        self.synced = current;
        Ok(())
    }

    pub(crate) fn synced(&self) -> i64 {
        self.synced
    }

    /// Number of documents searchers see.
    pub(crate) fn num_docs(&self) -> u64 {
        self.reader.searcher().num_docs()
    }

    /// Ids of every indexed document.
    pub(crate) fn ids(&self) -> Result<Vec<i64>, RegistryError> {
        let searcher = self.reader.searcher();
        let mut out = Vec::new();
        for segment in searcher.segment_readers() {
            let column = segment.fast_fields().u64("id").map_err(|e| index_error(&self.dir, e))?;
            for doc in segment.doc_ids_alive() {
                if let Some(id) = column.first(doc) {
                    out.push(id as i64);
                }
            }
        }
        Ok(out)
    }

    /// BM25 top `limit` for free text: every analysed query term, in every field, as a SHOULD
    /// clause. Built directly rather than with the query parser, so no user text is query syntax.
    ///
    /// Also returns the query's full-match score: what a document holding every query term once
    /// (in its best field, at average length) would score, counting terms no tool contains at the
    /// highest IDF. Fusion divides by it when no hit reaches it, so a hit that matches one word of
    /// a long query is a weak lexical signal, not a perfect 1.0.
    pub(crate) fn search(&self, text: &str, limit: usize) -> Result<(Vec<(i64, f32)>, f32), RegistryError> {
        let f = self.fields;
        let mut analyzer = self.index.tokenizer_for_field(f.description).map_err(|e| index_error(&self.dir, e))?;
        let mut terms = Vec::new();
        let mut stream = analyzer.token_stream(text);
        while stream.advance() {
            let token = stream.token().text.clone();
            if !terms.contains(&token) {
                terms.push(token);
            }
        }
        if terms.is_empty() {
            return Ok((Vec::new(), 0.0));
        }
        let searcher = self.reader.searcher();
        let mut clauses: Vec<(Occur, Box<dyn Query>)> = Vec::new();
        let docs = searcher.num_docs() as f32;
        let mut full_match = 0.0f32;
        for term in &terms {
            let mut best = 0.0f32;
            for (field, boost) in [(f.name, NAME_BOOST), (f.description, 1.0), (f.params, PARAMS_BOOST)] {
                let term = Term::from_field_text(field, term);
                let df = searcher.doc_freq(&term).map_err(|e| index_error(&self.dir, e))? as f32;
                let idf = (1.0 + (docs - df + 0.5) / (df + 0.5)).ln();
                best = best.max(boost * idf);
                let q = TermQuery::new(term, IndexRecordOption::WithFreqs);
                clauses.push((Occur::Should, Box::new(BoostQuery::new(Box::new(q), boost))));
            }
            full_match += best;
        }
        let hits = searcher
            .search(&BooleanQuery::new(clauses), &TopDocs::with_limit(limit))
            .map_err(|e| index_error(&self.dir, e))?;
        let mut out = Vec::with_capacity(hits.len());
        for (score, address) in hits {
            let segment = searcher.segment_reader(address.segment_ord);
            let column = segment.fast_fields().u64("id").map_err(|e| index_error(&self.dir, e))?;
            if let Some(id) = column.first(address.doc_id as DocId) {
                out.push((id as i64, score));
            }
        }
        Ok((out, full_match))
    }
}

/// Every tool's embedding, as one row-major matrix for a brute-force scan: at 10k tools it is
/// 15 MiB and a scan is about a millisecond, below what an approximate index would save.
#[derive(Default)]
pub(crate) struct Dense {
    ids: Vec<i64>,
    rows: Vec<f32>,
    pos: HashMap<i64, usize>,
    synced: i64,
}

impl Dense {
    pub(crate) fn sync(&mut self, conn: &Connection) -> Result<(), RegistryError> {
        let tx = conn.unchecked_transaction()?;
        let current = generation(&tx)?;
        if current == self.synced {
            return Ok(());
        }
        let mut stmt = tx.prepare_cached("SELECT id FROM tombstones WHERE rev > ?1")?;
        let removed = stmt.query_map([self.synced], |r| r.get(0))?.collect::<rusqlite::Result<Vec<i64>>>()?;
        drop(stmt);
        for id in removed {
            self.remove(id);
        }
        let mut stmt = tx.prepare_cached("SELECT id, embedding FROM tools WHERE rev > ?1")?;
        let mut rows = stmt.query([self.synced])?;
        while let Some(row) = rows.next()? {
            let id: i64 = row.get(0)?;
            let bytes: Option<Vec<u8>> = row.get(1)?;
            match bytes.and_then(|b| from_bytes(&b)).filter(|v| v.len() == DIM) {
                Some(v) => self.upsert(id, &v),
                None => self.remove(id),
            }
        }
        drop(rows);
        drop(stmt);
        tx.finish()?;
        self.synced = current;
        Ok(())
    }

    pub(crate) fn synced(&self) -> i64 {
        self.synced
    }

    fn upsert(&mut self, id: i64, v: &[f32]) {
        if let Some(&i) = self.pos.get(&id) {
            self.rows[i * DIM..(i + 1) * DIM].copy_from_slice(v);
        } else {
            self.pos.insert(id, self.ids.len());
            self.ids.push(id);
            self.rows.extend_from_slice(v);
        }
    }

    fn remove(&mut self, id: i64) {
        let Some(i) = self.pos.remove(&id) else { return };
        let last = self.ids.len() - 1;
        if i != last {
            let moved = self.ids[last];
            self.ids[i] = moved;
            self.rows.copy_within(last * DIM..(last + 1) * DIM, i * DIM);
            self.pos.insert(moved, i);
        }
        self.ids.pop();
        self.rows.truncate(last * DIM);
    }

    /// The embedding of `id`, if it has one.
    pub(crate) fn vector(&self, id: i64) -> Option<&[f32]> {
        self.pos.get(&id).map(|&i| &self.rows[i * DIM..(i + 1) * DIM])
    }

    /// Cosine of every tool with `query`, then the best `limit`.
    pub(crate) fn search(&self, query: &[f32], limit: usize) -> Vec<(i64, f32)> {
        let mut scored: Vec<(i64, f32)> =
            self.rows.chunks_exact(DIM).zip(&self.ids).map(|(row, &id)| (id, cosine(row, query))).collect();
        let limit = limit.min(scored.len());
        if limit == 0 {
            return Vec::new();
        }
        scored.select_nth_unstable_by(limit - 1, |a, b| b.1.total_cmp(&a.1));
        scored.truncate(limit);
        scored.sort_by(|a, b| b.1.total_cmp(&a.1));
        scored
    }

    /// The most similar tool to `query`.
    pub(crate) fn nearest(&self, query: &[f32]) -> Option<(i64, f32)> {
        self.rows
            .chunks_exact(DIM)
            .zip(&self.ids)
            .map(|(row, &id)| (id, cosine(row, query)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }
}
