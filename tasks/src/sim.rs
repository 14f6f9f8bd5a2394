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
//! - `shell {command}` with `cat FILE`, `wc -l FILE`, `ls [DIR]` and
//!   `grep [-c] WORD FILE...` (fixed-string match; exit 1 on no match, 2 on a missing file);
//! - `answer {answer}`.

use std::collections::BTreeMap;

use corvid_proto::ToolStatus;
use serde_json::Value;

use crate::task::Document;

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
                    (ToolStatus::Ok, format!("wrote {n} bytes to {p}"))
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

    fn shell(&self, command: &str) -> (ToolStatus, String) {
        let words: Vec<String> = command
            .split_whitespace()
            .map(|w| w.trim_matches('\'').to_string())
            .collect();
        let missing = |tool: &str, f: &str| {
            (
                ToolStatus::ExitNonzero,
                format!("{tool}: {f}: No such file or directory\n[exit 2]"),
            )
        };
        match words.first().map(String::as_str) {
            Some("cat") => {
                let mut out = String::new();
                for f in &words[1..] {
                    match self.files.get(f) {
                        Some(b) => out.push_str(&text(b)),
                        None => return missing("cat", f),
                    }
                }
                (ToolStatus::Ok, out)
            }
            Some("wc") if words.get(1).map(String::as_str) == Some("-l") && words.len() == 3 => {
                match self.files.get(&words[2]) {
                    Some(b) => (
                        ToolStatus::Ok,
                        format!("{} {}\n", text(b).lines().count(), words[2]),
                    ),
                    None => missing("wc", &words[2]),
                }
            }
            Some("ls") => match self.list(words.get(1).map(String::as_str).unwrap_or("")) {
                Some(o) => (ToolStatus::Ok, format!("{o}\n")),
                None => missing("ls", words.get(1).map(String::as_str).unwrap_or("")),
            },
            Some("grep") => {
                let count = words.get(1).map(String::as_str) == Some("-c");
                let rest = &words[1 + usize::from(count)..];
                let (Some(pat), files) = (rest.first(), rest.get(1..).unwrap_or(&[])) else {
                    return (
                        ToolStatus::ExitNonzero,
                        "usage: grep [-c] WORD FILE...\n[exit 2]".into(),
                    );
                };
                let mut out = String::new();
                let mut any = false;
                for f in files {
                    let Some(b) = self.files.get(f) else {
                        return missing("grep", f);
                    };
                    let t = text(b);
                    let hits: Vec<&str> = t.lines().filter(|l| l.contains(pat.as_str())).collect();
                    any |= !hits.is_empty();
                    let prefix = if files.len() > 1 {
                        format!("{f}:")
                    } else {
                        String::new()
                    };
                    if count {
                        out.push_str(&format!("{prefix}{}\n", hits.len()));
                    } else {
                        for h in hits {
                            out.push_str(&format!("{prefix}{h}\n"));
                        }
                    }
                }
                if any {
                    (ToolStatus::Ok, out)
                } else {
                    (ToolStatus::ExitNonzero, format!("{out}[exit 1]"))
                }
            }
            _ => (
                ToolStatus::ExitNonzero,
                format!(
                    "sh: {}: command not found\n[exit 127]",
                    words.first().map(String::as_str).unwrap_or("")
                ),
            ),
        }
    }
}
