//! A reference simulator of the tools over an in-memory workspace.
//!
//! For tests and `corvid tasks show --oracle` only, until the sandbox lands: it computes
//! the outputs of oracle plans from the generated files and replays plans to check them.
//! The sandbox is the truth during training; this simulator implements just what the
//! built-in oracles use:
//! - `read_file {path}`, `write_file {path, content}`, `list_dir {path}`;
//! - `search {query, k = 3}`: title equal to the query scores 10, plus one per query
//!   word in the text; ties by id. (The sandbox uses BM25; the oracles query exact
//!   titles, which BM25 also ranks first.)
//! - `shell {command}`: the toolbox subset in [`shell`] (`cat`, `ls`, `wc -l`, `head`,
//!   `grep`, `sort`, `uniq -c`, `cut`, `sed -i`, pipes and `>`), rendered as the sandbox
//!   renders a run;
//! - `answer {answer}`.

use std::collections::BTreeMap;

use corvid_proto::ToolStatus;
use serde_json::Value;

use crate::task::Document;

mod shell;

/// An in-memory workspace plus the read-only corpus.
#[derive(Debug, Clone)]
pub struct Simulator<'a> {
    /// Current files, path → bytes.
    pub files: BTreeMap<String, Vec<u8>>,
    corpus: &'a [Document],
    /// The argument of the last `answer` call.
    pub answer: Option<String>,
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

impl<'a> Simulator<'a> {
    /// A simulator over `files` and `corpus`.
    pub fn new(files: BTreeMap<String, Vec<u8>>, corpus: &'a [Document]) -> Self {
        Self {
            files,
            corpus,
            answer: None,
        }
    }

    /// Runs one call; returns its status and output text.
    pub fn call(&mut self, name: &str, args: &Value) -> (ToolStatus, String) {
        let s = |k: &str| args.get(k).and_then(Value::as_str).map(str::to_string);
        let invalid = |what: &str| {
            (
                ToolStatus::InvalidCall,
                format!("error: invalid_call: {name} needs a string argument `{what}`"),
            )
        };
        match name {
            "read_file" => match s("path") {
                None => invalid("path"),
                Some(p) => match self.files.get(&p) {
                    Some(b) => (ToolStatus::Ok, text(b)),
                    None => (ToolStatus::NotFound, format!("error: not_found: {p}")),
                },
            },
            "write_file" => match (s("path"), s("content")) {
                (Some(p), Some(c)) => {
                    let n = c.len();
                    self.files.insert(p.clone(), c.into_bytes());
                    (
                        ToolStatus::Ok,
                        format!(
                            "wrote {n} bytes to /workspace/{}",
                            p.trim_start_matches('/')
                        ),
                    )
                }
                (None, _) => invalid("path"),
                (_, None) => invalid("content"),
            },
            "list_dir" => {
                let dir = s("path").unwrap_or_default();
                match self.list(&dir) {
                    Some(out) => (ToolStatus::Ok, out),
                    None => (ToolStatus::NotFound, format!("error: not_found: {dir}")),
                }
            }
            "search" => match s("query") {
                None => invalid("query"),
                Some(q) => {
                    let k = args.get("k").and_then(Value::as_u64).unwrap_or(3) as usize;
                    (ToolStatus::Ok, self.search(&q, k))
                }
            },
            "shell" => match s("command") {
                None => invalid("command"),
                Some(c) => self.shell(&c),
            },
            "answer" => match s("answer") {
                None => invalid("answer"),
                Some(a) => {
                    self.answer = Some(a);
                    (ToolStatus::Ok, String::new())
                }
            },
            _ => (
                ToolStatus::UnknownTool,
                format!("error: unknown_tool: {name}"),
            ),
        }
    }

    fn list(&self, dir: &str) -> Option<String> {
        let prefix = match dir.trim_matches('/') {
            "" | "." => String::new(),
            d => format!("{d}/"),
        };
        let mut entries: Vec<String> = self
            .files
            .keys()
            .filter_map(|p| p.strip_prefix(&prefix))
            .map(|rest| match rest.split_once('/') {
                Some((d, _)) => format!("{d}/"),
                None => rest.to_string(),
            })
            .collect();
        entries.dedup();
        (!entries.is_empty() || prefix.is_empty()).then(|| entries.join("\n"))
    }

    /// Ranks the corpus for `query` (see the module doc) and formats the top `k`.
    pub fn search(&self, query: &str, k: usize) -> String {
        let q = query.to_lowercase();
        let words: Vec<&str> = q.split_whitespace().collect();
        let mut scored: Vec<(usize, &Document)> = self
            .corpus
            .iter()
            .map(|d| {
                let t = d.text.to_lowercase();
                let title = if d.title.to_lowercase() == q { 10 } else { 0 };
                (title + words.iter().filter(|w| t.contains(**w)).count(), d)
            })
            .filter(|(s, _)| *s > 0)
            .collect();
        scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.id.cmp(&b.1.id)));
        if scored.is_empty() {
            return "no results".into();
        }
        scored
            .iter()
            .take(k)
            .map(|(_, d)| format!("[{}] {}\n{}\n", d.id, d.title, d.text))
            .collect()
    }

    fn shell(&mut self, command: &str) -> (ToolStatus, String) {
        shell::Toolbox {
            files: &mut self.files,
        }
        .run_line(command)
    }
}
