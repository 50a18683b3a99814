//! The local search tool: BM25 (tantivy) over a document corpus, top-3 documents per query, like
//! the local Wikipedia server the papers' agents search.

use std::path::Path;

use serde_json::{Value, json};
use tantivy::collector::TopDocs;
use tantivy::query::QueryParser;
use tantivy::schema::{Field, STORED, Schema, TEXT, Value as _};
use tantivy::{Index, IndexReader, TantivyDocument, doc};
use toolsmith_contract::Manifest;

use super::EnvError;
use super::world::Document;

/// The name of the tool that searches the corpus, always listed in the system prompt.
pub const SEARCH_TOOL: &str = "search";

/// Documents a search returns by default.
pub const TOP_K: usize = 3;

/// A searchable corpus in memory.
pub struct Corpus {
    index: Index,
    reader: IndexReader,
    title: Field,
    text: Field,
    len: usize,
}

impl std::fmt::Debug for Corpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Corpus").field("documents", &self.len).finish()
    }
}

impl Corpus {
    /// Indexes `documents` for BM25 search in RAM (corpora are small enough, and nothing is left
    /// on disk).
    pub fn new(documents: &[Document]) -> Result<Corpus, EnvError> {
        let mut schema = Schema::builder();
        let title = schema.add_text_field("title", TEXT | STORED);
        let text = schema.add_text_field("text", TEXT | STORED);
        let index = Index::create_in_ram(schema.build());
        let mut writer = index.writer_with_num_threads(1, 15_000_000)?;
        for d in documents {
            writer.add_document(doc!(title => d.title.clone(), text => d.text.clone()))?;
        }
        writer.commit()?;
        let reader = index.reader()?;
        Ok(Corpus { index, reader, title, text, len: documents.len() })
    }

    /// Reads a JSON-lines corpus: one `{"title": ..., "text": ...}` per line (`contents` is
    /// accepted for `text`, as in FlashRAG's corpora).
    pub fn load_jsonl(path: &Path) -> Result<Corpus, EnvError> {
        let mut docs = Vec::new();
        for (line, v) in super::read_jsonl(path)? {
            let text = v.get("text").or_else(|| v.get("contents")).and_then(Value::as_str);
            let Some(text) = text else {
                return Err(EnvError::Line {
                    path: path.to_path_buf(),
                    line,
                    message: "a document needs a \"text\" (or \"contents\") string".into(),
                });
            };
            let title = v.get("title").and_then(Value::as_str).unwrap_or_default();
            docs.push(Document { title: title.to_string(), text: text.to_string() });
        }
        Corpus::new(&docs)
    }

    /// How many documents the index holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the corpus is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `k` best documents for `query` by BM25 over title and text. Query syntax is not
    /// interpreted: an agent's query is words.
    pub fn search(&self, query: &str, k: usize) -> Result<Vec<Document>, EnvError> {
        let parser = QueryParser::for_index(&self.index, vec![self.title, self.text]);
        let words: String =
            query.chars().map(|c| if c.is_alphanumeric() || c.is_whitespace() { c } else { ' ' }).collect();
        let (q, _errors) = parser.parse_query_lenient(&words);
        let searcher = self.reader.searcher();
        let hits = searcher.search(&q, &TopDocs::with_limit(k.max(1)))?;
        let mut out = Vec::with_capacity(hits.len());
        for (_, address) in hits {
            let d: TantivyDocument = searcher.doc(address)?;
            let get = |f: Field| d.get_first(f).and_then(|v| v.as_str()).unwrap_or_default().to_string();
            out.push(Document { title: get(self.title), text: get(self.text) });
        }
        Ok(out)
    }

    /// The search tool's result for `args` (`{"query": string}`), as its output schema says.
    pub fn call(&self, args: &Value) -> Result<Value, EnvError> {
        let query = args.get("query").and_then(Value::as_str).unwrap_or_default();
        let docs = self.search(query, TOP_K)?;
        Ok(json!({ "results": docs }))
    }
}

/// The search tool's interface (a `native` tool: the host answers it).
pub fn search_manifest() -> Manifest {
    let value = json!({
        "name": SEARCH_TOOL,
        "version": "0.1.0",
        "description": "Search the local encyclopedia and return the top 3 articles for a query (title and text).",
        "kind": "native",
        "input_schema": {
            "type": "object",
            "properties": {"query": {"type": "string", "minLength": 1, "description": "Words to search for, such as a name."}},
            "required": ["query"],
            "additionalProperties": false
        },
        "output_schema": {
            "type": "object",
            "properties": {"results": {"type": "array", "items": {
                "type": "object",
                "properties": {"title": {"type": "string"}, "text": {"type": "string"}},
                "required": ["title", "text"]
            }}},
            "required": ["results"]
        }
    });
    #[allow(clippy::expect_used)] // A constant the tests parse.
    serde_json::from_value(value).expect("the search manifest is valid")
}
