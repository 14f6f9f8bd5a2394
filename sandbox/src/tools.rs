//! Tool declarations (OpenAI-style JSON schemas), argument validation from
//! the same tables, and the host-side tools (`read_file`, `write_file`,
//! `list_dir`, `search`, `answer`) on cap-std.

use std::io::Read;

use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, OpenOptions};
use corvid_proto::ToolStatus;
use serde_json::{json, Map, Value};

use crate::limits::{
    DEFAULT_READ_LINES, DEFAULT_SEARCH_K, MAX_ARGS_JSON_BYTES, MAX_COMMAND_BYTES, MAX_PATH_BYTES,
    MAX_READ_FILE_BYTES, MAX_SEARCH_K, MAX_STDIN_BYTES, MAX_TOOL_ARGS, MAX_TOOL_ARGS_BYTES,
    MAX_WRITE_FILE_BYTES, SEARCH_SNIPPET_CHARS,
};
use crate::search::SearchIndex;
use crate::workspace::{forbidden_char, MountedDir, Workspace};

/// Longest `answer` accepted.
pub const MAX_ANSWER_BYTES: usize = 4096;
/// Longest `search` query accepted.
pub const MAX_QUERY_BYTES: usize = 1024;
/// Most entries `list_dir` shows.
pub const MAX_LIST_ENTRIES: usize = 1000;

/// The type of one tool argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ty {
    Str,
    Int,
    StrList,
}

/// One declared argument; the schema and the validator both come from it.
#[derive(Debug, Clone)]
pub(crate) struct Param {
    pub name: &'static str,
    pub ty: Ty,
    pub required: bool,
    pub desc: &'static str,
    /// Largest value (Int) or byte length (Str).
    pub max: u64,
}

/// What runs when a tool is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ToolKind {
    Shell,
    ReadFile,
    WriteFile,
    ListDir,
    Search,
    Answer,
    /// CPython for WASI ([`crate::PythonRuntime`]).
    Python,
    Custom(usize),
    /// A tool attached to the calling workspace ([`crate::EpisodeTool`]).
    Episode,
}

/// A registered tool.
#[derive(Debug, Clone)]
pub(crate) struct ToolSpec {
    pub name: String,
    pub description: String,
    pub params: Vec<Param>,
    pub kind: ToolKind,
}

impl ToolSpec {
    /// The OpenAI function declaration.
    pub fn declaration(&self) -> Value {
        let mut props = Map::new();
        for p in &self.params {
            let schema = match p.ty {
                Ty::Str => json!({"type": "string", "description": p.desc}),
                Ty::Int => {
                    json!({"type": "integer", "minimum": 0, "maximum": p.max, "description": p.desc})
                }
                Ty::StrList => {
                    json!({"type": "array", "items": {"type": "string"}, "description": p.desc})
                }
            };
            props.insert(p.name.to_string(), schema);
        }
        let required: Vec<&str> = self
            .params
            .iter()
            .filter(|p| p.required)
            .map(|p| p.name)
            .collect();
        json!({
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": props,
                    "required": required,
                    "additionalProperties": false,
                }
            }
        })
    }
}

fn p(name: &'static str, ty: Ty, required: bool, max: u64, desc: &'static str) -> Param {
    Param {
        name,
        ty,
        required,
        desc,
        max,
    }
}

/// The built-in tools, in declaration order.
pub(crate) fn builtin_specs(with_search: bool, with_python: bool) -> Vec<ToolSpec> {
    let commands = if with_python {
        "true false calc help python python3"
    } else {
        "true false calc help"
    };
    let mut v = vec![
        ToolSpec {
            name: "shell".into(),
            description: format!(
                "Run a command line in /workspace with a small POSIX-like shell: pipes |, ; && ||, \
                 redirects > >> < 2> 2>&1, quotes, globs, $?. Commands: ls cat head tail wc grep sed sort \
                 uniq cut tr find echo printf mkdir rm cp mv touch diff seq expr basename dirname pwd cd \
                 {commands}. No network, no other programs."
            ),
            params: vec![p("command", Ty::Str, true, MAX_COMMAND_BYTES as u64, "The command line to run.")],
            kind: ToolKind::Shell,
        },
        ToolSpec {
            name: "read_file".into(),
            description: "Read a text file. Paths are relative to /workspace (or absolute under /workspace or a \
                          read-only mount). Returns up to `limit` lines starting at line `offset` (1-based)."
                .into(),
            params: vec![
                p("path", Ty::Str, true, MAX_PATH_BYTES as u64, "File to read."),
                p("offset", Ty::Int, false, u32::MAX as u64, "First line to return, 1-based (default 1)."),
                p("limit", Ty::Int, false, 100_000, "Most lines to return (default 400)."),
            ],
            kind: ToolKind::ReadFile,
        },
        ToolSpec {
            name: "write_file".into(),
            description: "Create or overwrite a file under /workspace with the given content (parent directories \
                          are created)."
                .into(),
            params: vec![
                p("path", Ty::Str, true, MAX_PATH_BYTES as u64, "File to write."),
                p("content", Ty::Str, true, MAX_WRITE_FILE_BYTES as u64, "The full new content."),
            ],
            kind: ToolKind::WriteFile,
        },
        ToolSpec {
            name: "list_dir".into(),
            description: "List a directory, sorted: `name/` for directories, `name@` for symlinks, files with \
                          their size."
                .into(),
            params: vec![p("path", Ty::Str, false, MAX_PATH_BYTES as u64, "Directory (default /workspace).")],
            kind: ToolKind::ListDir,
        },
    ];
    if with_search {
        v.push(ToolSpec {
            name: "search".into(),
            description: "Search the document collection (BM25) and return the best matches with id, title and \
                          a snippet."
                .into(),
            params: vec![
                p("query", Ty::Str, true, MAX_QUERY_BYTES as u64, "Free-text query."),
                p("k", Ty::Int, false, MAX_SEARCH_K, "Number of results (default 5, at most 20)."),
            ],
            kind: ToolKind::Search,
        });
    }
    v.push(ToolSpec {
        name: "answer".into(),
        description: "Give your final answer. Call it once, when you are done.".into(),
        params: vec![p(
            "answer",
            Ty::Str,
            true,
            MAX_ANSWER_BYTES as u64,
            "The final answer.",
        )],
        kind: ToolKind::Answer,
    });
    v
}

/// The `python` tool's declaration, which names the interpreter and what it can import.
pub(crate) fn python_spec(flavor: crate::PythonFlavor) -> ToolSpec {
    let (version, library) = match flavor {
        crate::PythonFlavor::Cpython => ("3.12", "Standard library only"),
        crate::PythonFlavor::WasiPython => (
            "3.15",
            "The standard library, numpy, pandas, scipy, scikit-learn and statsmodels",
        ),
    };
    ToolSpec {
        name: "python".into(),
        description: format!(
            "Run Python {version} in /workspace (the working directory, and on sys.path): `code`, a \
             program, `path`, a script in the workspace, or `module`, like `python -m` (e.g. \
             unittest), with `args`. {library}; /tmp is scratch space; no network, no \
             subprocesses. Prints stdout, then stderr (a traceback on an error). The shell tool \
             runs `python`/`python3` too."
        ),
        params: vec![
            p("code", Ty::Str, false, MAX_COMMAND_BYTES as u64 * 4, "The program to run."),
            p("path", Ty::Str, false, MAX_PATH_BYTES as u64, "A script to run instead."),
            p("module", Ty::Str, false, MAX_PATH_BYTES as u64, "A module to run as __main__ instead."),
            p("args", Ty::StrList, false, MAX_TOOL_ARGS_BYTES as u64, "Its command-line arguments (sys.argv[1:])."),
            p("stdin", Ty::Str, false, MAX_STDIN_BYTES as u64, "Text given on standard input."),
        ],
        kind: ToolKind::Python,
    }
}

/// Parameters of every custom WASI tool.
pub(crate) fn custom_params() -> Vec<Param> {
    vec![
        p(
            "args",
            Ty::StrList,
            false,
            MAX_TOOL_ARGS_BYTES as u64,
            "Command-line arguments.",
        ),
        p(
            "stdin",
            Ty::Str,
            false,
            MAX_STDIN_BYTES as u64,
            "Text given on standard input.",
        ),
    ]
}

/// A refused or failed call: the status class and the reason shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub status: ToolStatus,
    pub msg: String,
}

pub(crate) fn refuse(status: ToolStatus, msg: impl Into<String>) -> Refusal {
    Refusal {
        status,
        msg: msg.into(),
    }
}

/// Validated arguments.
pub(crate) struct Args(Map<String, Value>);

impl Args {
    pub fn str(&self, k: &str) -> Option<&str> {
        self.0.get(k).and_then(Value::as_str)
    }
    pub fn int(&self, k: &str) -> Option<u64> {
        self.0.get(k).and_then(Value::as_u64)
    }
    pub fn list(&self, k: &str) -> Vec<String> {
        self.0
            .get(k)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Checks raw JSON arguments against a tool's parameter table.
pub(crate) fn validate(spec: &ToolSpec, raw: &str) -> Result<Args, Refusal> {
    if raw.len() > MAX_ARGS_JSON_BYTES {
        return Err(refuse(
            ToolStatus::InvalidCall,
            format!(
                "arguments are {} bytes; the limit is {MAX_ARGS_JSON_BYTES}",
                raw.len()
            ),
        ));
    }
    let v: Value = if raw.trim().is_empty() {
        Value::Object(Map::new())
    } else {
        serde_json::from_str(raw).map_err(|e| {
            refuse(
                ToolStatus::InvalidCall,
                format!("arguments are not valid JSON ({e})"),
            )
        })?
    };
    let Value::Object(map) = v else {
        return Err(refuse(
            ToolStatus::InvalidCall,
            "arguments must be a JSON object",
        ));
    };
    let expected = || {
        spec.params
            .iter()
            .map(|p| p.name)
            .collect::<Vec<_>>()
            .join(", ")
    };
    for k in map.keys() {
        if !spec.params.iter().any(|p| p.name == k) {
            let shown: String = k.chars().take(64).collect();
            return Err(refuse(
                ToolStatus::InvalidCall,
                format!(
                    "unknown argument `{}` for {}; expected: {}",
                    crate::output::inert(&shown),
                    spec.name,
                    expected()
                ),
            ));
        }
    }
    for p in &spec.params {
        let Some(v) = map.get(p.name) else {
            if p.required {
                return Err(refuse(
                    ToolStatus::InvalidCall,
                    format!("missing required argument `{}` for {}", p.name, spec.name),
                ));
            }
            continue;
        };
        let ok = match p.ty {
            Ty::Str => match v.as_str() {
                Some(s) if s.len() as u64 > p.max => {
                    return Err(refuse(
                        ToolStatus::InvalidCall,
                        format!(
                            "argument `{}` is {} bytes; the limit is {}",
                            p.name,
                            s.len(),
                            p.max
                        ),
                    ))
                }
                Some(_) => true,
                None => false,
            },
            Ty::Int => match v.as_u64() {
                Some(n) if n > p.max => {
                    return Err(refuse(
                        ToolStatus::InvalidCall,
                        format!("argument `{}` = {n} is above the maximum {}", p.name, p.max),
                    ))
                }
                Some(_) => true,
                None => false,
            },
            Ty::StrList => match v.as_array() {
                Some(a) => {
                    if a.len() > MAX_TOOL_ARGS {
                        return Err(refuse(
                            ToolStatus::InvalidCall,
                            format!(
                                "argument `{}` has {} items; the limit is {MAX_TOOL_ARGS}",
                                p.name,
                                a.len()
                            ),
                        ));
                    }
                    let total: usize = a.iter().filter_map(Value::as_str).map(str::len).sum();
                    if total as u64 > p.max {
                        return Err(refuse(
                            ToolStatus::InvalidCall,
                            format!("argument `{}` is too long", p.name),
                        ));
                    }
                    a.iter().all(Value::is_string)
                }
                None => false,
            },
        };
        if !ok {
            let want = match p.ty {
                Ty::Str => "a string",
                Ty::Int => "a non-negative integer",
                Ty::StrList => "an array of strings",
            };
            return Err(refuse(
                ToolStatus::InvalidCall,
                format!("argument `{}` must be {want}", p.name),
            ));
        }
    }
    Ok(Args(map))
}

// ------------------------------------------------------------------ paths

/// Where a resolved path lives.
pub(crate) enum Root<'a> {
    Workspace,
    Mount(&'a MountedDir),
}

pub(crate) struct Resolved<'a> {
    pub root: Root<'a>,
    /// Path relative to the root; `.` for the root itself.
    pub rel: String,
    /// The path as the guest names it (for messages).
    pub shown: String,
}

impl Resolved<'_> {
    pub fn dir<'w>(&'w self, ws: &'w Workspace) -> &'w Dir {
        match self.root {
            Root::Workspace => &ws.dir,
            Root::Mount(m) => &m.dir,
        }
    }
}

/// Resolves a guest path for a host tool: validated, lexically normalised,
/// never above its root. cap-std then refuses any symlink that leads out.
pub(crate) fn resolve<'a>(ws: &'a Workspace, path: &str) -> Result<Resolved<'a>, Refusal> {
    if path.is_empty() {
        return Err(refuse(ToolStatus::InvalidCall, "path is empty"));
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(refuse(
            ToolStatus::InvalidCall,
            format!("path is longer than {MAX_PATH_BYTES} bytes"),
        ));
    }
    if path.chars().any(forbidden_char) {
        return Err(refuse(
            ToolStatus::InvalidCall,
            "path contains a control or bidi-override character",
        ));
    }
    let (root, root_name, rest) = if let Some(abs) = path.strip_prefix('/') {
        let (first, rest) = abs.split_once('/').unwrap_or((abs, ""));
        if first == "workspace" {
            (Root::Workspace, "/workspace".to_string(), rest)
        } else if let Some(m) = ws.mounts.iter().find(|m| m.name == first) {
            (Root::Mount(m), format!("/{}", m.name), rest)
        } else {
            let visible: Vec<String> = std::iter::once("/workspace".to_string())
                .chain(ws.mounts.iter().map(|m| format!("/{}", m.name)))
                .collect();
            return Err(refuse(
                ToolStatus::PermissionDenied,
                format!(
                    "{}: outside the sandbox; only {} are visible",
                    crate::output::inert(path),
                    visible.join(", ")
                ),
            ));
        }
    } else {
        (Root::Workspace, "/workspace".to_string(), path)
    };
    let mut comps: Vec<&str> = Vec::new();
    for c in rest.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                if comps.pop().is_none() {
                    return Err(refuse(
                        ToolStatus::PermissionDenied,
                        format!("{}: leads outside {root_name}", crate::output::inert(path)),
                    ));
                }
            }
            c => comps.push(c),
        }
    }
    let rel = if comps.is_empty() {
        ".".to_string()
    } else {
        comps.join("/")
    };
    let shown = if comps.is_empty() {
        root_name
    } else {
        format!("{root_name}/{rel}")
    };
    Ok(Resolved { root, rel, shown })
}

/// Maps a host I/O error to a class and a fixed message naming the guest path.
pub(crate) fn io_refusal(e: &std::io::Error, shown: &str) -> Refusal {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::NotFound => refuse(
            ToolStatus::NotFound,
            format!("{shown}: no such file or directory"),
        ),
        K::PermissionDenied | K::ReadOnlyFilesystem => refuse(
            ToolStatus::PermissionDenied,
            format!("{shown}: permission denied (outside the sandbox or read-only)"),
        ),
        K::IsADirectory => refuse(
            ToolStatus::InvalidCall,
            format!("{shown} is a directory (use list_dir)"),
        ),
        K::NotADirectory => refuse(ToolStatus::InvalidCall, format!("{shown}: not a directory")),
        K::AlreadyExists => refuse(ToolStatus::InvalidCall, format!("{shown}: already exists")),
        K::InvalidFilename | K::InvalidInput => refuse(
            ToolStatus::InvalidCall,
            format!("{shown}: invalid file name"),
        ),
        _ => match e.raw_os_error() {
            // ELOOP: a symlink where none may be followed, or a loop.
            Some(40) => refuse(
                ToolStatus::PermissionDenied,
                format!("{shown}: refusing to follow a symbolic link"),
            ),
            Some(36) => refuse(
                ToolStatus::InvalidCall,
                format!("{shown}: file name too long"),
            ),
            _ => refuse(
                ToolStatus::PermissionDenied,
                format!("{shown}: cannot be accessed"),
            ),
        },
    }
}

// ------------------------------------------------------------------ host tools

pub(crate) fn read_file(ws: &Workspace, args: &Args) -> Result<String, Refusal> {
    let r = resolve(ws, args.str("path").unwrap_or_default())?;
    let dir = r.dir(ws);
    let meta = dir.metadata(&r.rel).map_err(|e| io_refusal(&e, &r.shown))?;
    if meta.is_dir() {
        return Err(refuse(
            ToolStatus::InvalidCall,
            format!("{} is a directory (use list_dir)", r.shown),
        ));
    }
    let mut bytes = Vec::new();
    dir.open(&r.rel)
        .and_then(|f| f.take(MAX_READ_FILE_BYTES).read_to_end(&mut bytes))
        .map_err(|e| io_refusal(&e, &r.shown))?;
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    let offset = args.int("offset").unwrap_or(1).max(1);
    let limit = args.int("limit").unwrap_or(DEFAULT_READ_LINES);
    if lines.is_empty() {
        return Ok(format!("({} is empty)", r.shown));
    }
    let start = usize::try_from(offset - 1).unwrap_or(usize::MAX);
    if start >= lines.len() {
        return Ok(format!(
            "({} has {} lines; offset {offset} is past the end)",
            r.shown,
            lines.len()
        ));
    }
    let end = start
        .saturating_add(usize::try_from(limit).unwrap_or(usize::MAX))
        .min(lines.len());
    let mut out = lines[start..end].join("\n");
    out.push('\n');
    if end < lines.len() || start > 0 {
        out.push_str(&format!(
            "[lines {}-{} of {}{}]",
            start + 1,
            end,
            lines.len(),
            if end < lines.len() {
                format!("; call read_file with offset={} for more", end + 1)
            } else {
                String::new()
            }
        ));
    }
    if meta.len() > MAX_READ_FILE_BYTES {
        out.push_str(&format!(
            "\n[only the first {MAX_READ_FILE_BYTES} bytes of {} were read]",
            r.shown
        ));
    }
    Ok(out)
}

pub(crate) fn write_file(ws: &Workspace, args: &Args) -> Result<String, Refusal> {
    let r = resolve(ws, args.str("path").unwrap_or_default())?;
    if let Root::Mount(m) = r.root {
        return Err(refuse(
            ToolStatus::PermissionDenied,
            format!("{}: /{} is read-only", r.shown, m.name),
        ));
    }
    if r.rel == "." {
        return Err(refuse(
            ToolStatus::InvalidCall,
            "path names the workspace itself, not a file",
        ));
    }
    let content = args.str("content").unwrap_or_default();
    let dir = &ws.dir;
    // Pre-check the quota so a single call cannot overshoot it.
    if let Ok(u) = ws.usage() {
        let existing = dir.symlink_metadata(&r.rel).ok();
        let old = existing
            .as_ref()
            .filter(|m| m.is_file())
            .map(|m| m.len())
            .unwrap_or(0);
        let new_inodes = u64::from(existing.is_none());
        if u.bytes - old.min(u.bytes) + content.len() as u64 > ws.quota.max_bytes
            || u.inodes + new_inodes > ws.quota.max_inodes
        {
            return Err(refuse(
                ToolStatus::QuotaExceeded,
                format!(
                    "writing {} bytes to {} would exceed the workspace quota ({} bytes, {} entries); delete files first",
                    content.len(),
                    r.shown,
                    ws.quota.max_bytes,
                    ws.quota.max_inodes
                ),
            ));
        }
    }
    if let Some((parent, _)) = r.rel.rsplit_once('/') {
        dir.create_dir_all(parent)
            .map_err(|e| io_refusal(&e, &r.shown))?;
    }
    let mut opts = OpenOptions::new();
    opts.write(true)
        .create(true)
        .truncate(true)
        .follow(FollowSymlinks::No);
    let mut f = dir
        .open_with(&r.rel, &opts)
        .map_err(|e| io_refusal(&e, &r.shown))?;
    std::io::Write::write_all(&mut f, content.as_bytes()).map_err(|e| io_refusal(&e, &r.shown))?;
    Ok(format!("wrote {} bytes to {}", content.len(), r.shown))
}

pub(crate) fn list_dir(ws: &Workspace, args: &Args) -> Result<String, Refusal> {
    let r = resolve(ws, args.str("path").unwrap_or("/workspace"))?;
    let dir = r.dir(ws);
    let rd = dir.read_dir(&r.rel).map_err(|e| io_refusal(&e, &r.shown))?;
    let mut entries: Vec<String> = Vec::new();
    for e in rd.flatten() {
        let name = crate::output::inert(&e.file_name().to_string_lossy());
        let Ok(ft) = e.file_type() else { continue };
        entries.push(if ft.is_symlink() {
            format!("{name}@")
        } else if ft.is_dir() {
            format!("{name}/")
        } else {
            let len = e.metadata().map(|m| m.len()).unwrap_or(0);
            format!("{name}  ({len} bytes)")
        });
    }
    entries.sort();
    if entries.is_empty() {
        return Ok(format!("({} is empty)", r.shown));
    }
    let more = entries.len().saturating_sub(MAX_LIST_ENTRIES);
    entries.truncate(MAX_LIST_ENTRIES);
    let mut out = entries.join("\n");
    out.push('\n');
    if more > 0 {
        out.push_str(&format!("[... {more} more entries]\n"));
    }
    Ok(out)
}

pub(crate) fn search(index: &SearchIndex, args: &Args) -> Result<String, Refusal> {
    let query = args.str("query").unwrap_or_default();
    if query.trim().is_empty() {
        return Err(refuse(ToolStatus::InvalidCall, "query is empty"));
    }
    let k = args.int("k").unwrap_or(DEFAULT_SEARCH_K).min(MAX_SEARCH_K) as usize;
    let hits = index
        .search(query, k)
        .map_err(|_| refuse(ToolStatus::InfraError, "the search index failed"))?;
    if hits.is_empty() {
        return Ok("no results".into());
    }
    let mut out = String::new();
    for (i, h) in hits.iter().enumerate() {
        let snippet: String = h.text.chars().take(SEARCH_SNIPPET_CHARS).collect();
        let ell = if h.text.chars().count() > SEARCH_SNIPPET_CHARS {
            " ..."
        } else {
            ""
        };
        out.push_str(&format!(
            "[{}] id: {} | title: {}\n{snippet}{ell}\n\n",
            i + 1,
            h.id,
            h.title
        ));
    }
    Ok(out.trim_end().to_string() + "\n")
}
