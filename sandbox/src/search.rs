//! BM25 retrieval for the `search` tool, on tantivy (Lucene's BM25 scoring),
//! built once from an in-memory corpus and shared read-only by every call.

use tantivy::collector::TopDocs;
use tantivy::query::QueryParser;
use tantivy::schema::{Field, Schema, Value, STORED, STRING, TEXT};
use tantivy::{doc, Index, IndexReader, ReloadPolicy, TantivyDocument};

use crate::SandboxError;

/// Heap for the one-shot index writer (tantivy's minimum is 15 MB).
const WRITER_HEAP_BYTES: usize = 32 << 20;

/// One corpus document.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Document {
    /// Stable id, shown with each hit (for citations and checkers).
    pub id: String,
    /// Title, searched and shown.
    pub title: String,
    /// Body text, searched and shown (cut to a snippet).
    pub text: String,
}

/// One search result.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Hit {
    /// Document id.
    pub id: String,
    /// Document title.
    pub title: String,
    /// Full document text.
    pub text: String,
    /// BM25 score.
    pub score: f32,
}

/// A read-only BM25 index over a corpus. `Send + Sync`; build it once per
/// process and hand it to [`crate::SandboxBuilder::search_index`].
pub struct SearchIndex {
    reader: IndexReader,
    parser: QueryParser,
    id: Field,
    title: Field,
    text: Field,
    len: usize,
}

impl std::fmt::Debug for SearchIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SearchIndex")
            .field("documents", &self.len)
            .finish_non_exhaustive()
    }
}

fn search_err(e: impl std::fmt::Display) -> SandboxError {
    SandboxError::Search(e.to_string())
}

impl SearchIndex {
    /// Indexes the documents in memory (title and text are tokenised,
    /// lower-cased; id is stored verbatim).
    pub fn build(docs: &[Document]) -> Result<Self, SandboxError> {
        let mut sb = Schema::builder();
        let id = sb.add_text_field("id", STRING | STORED);
        let title = sb.add_text_field("title", TEXT | STORED);
        let text = sb.add_text_field("text", TEXT | STORED);
        let index = Index::create_in_ram(sb.build());
        let mut writer = index
            .writer_with_num_threads::<TantivyDocument>(1, WRITER_HEAP_BYTES)
            .map_err(search_err)?;
        for d in docs {
            writer
                .add_document(
                    doc!(id => d.id.as_str(), title => d.title.as_str(), text => d.text.as_str()),
                )
                .map_err(search_err)?;
        }
        writer.commit().map_err(search_err)?;
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()
            .map_err(search_err)?;
        let mut parser = QueryParser::for_index(&index, vec![title, text]);
        parser.set_field_boost(title, 2.0);
        Ok(Self {
            reader,
            parser,
            id,
            title,
            text,
            len: docs.len(),
        })
    }

    /// Number of documents.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the corpus is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `k` best documents for a free-text query (query syntax errors are
    /// tolerated: the parser is lenient). Ties keep index order.
    pub fn search(&self, query: &str, k: usize) -> Result<Vec<Hit>, SandboxError> {
        if k == 0 {
            return Ok(Vec::new());
        }
        let (q, _errors) = self.parser.parse_query_lenient(query);
        let searcher = self.reader.searcher();
        let top = searcher
            .search(&q, &TopDocs::with_limit(k).order_by_score())
            .map_err(search_err)?;
        let mut hits = Vec::with_capacity(top.len());
        for (score, addr) in top {
            let d: TantivyDocument = searcher.doc(addr).map_err(search_err)?;
            let get = |f: Field| {
                d.get_first(f)
                    .and_then(|v| v.as_str())
                    .unwrap_or_default()
                    .to_string()
            };
            hits.push(Hit {
                id: get(self.id),
                title: get(self.title),
                text: get(self.text),
                score,
            });
        }
        Ok(hits)
    }
}
