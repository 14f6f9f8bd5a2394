//! Per-episode workspaces: a host directory materialised from a
//! [`WorkspaceSpec`], mounted RW at `/workspace` for tools, with optional
//! read-only data mounts, a quota, snapshots and diffs for checkers, and
//! cleanup on drop.
//!
//! Host-side access goes only through cap-std [`Dir`] handles and never
//! follows a symlink out: a guest may *create* `esc -> ../../..` (WASI only
//! refuses to follow it), so `std::fs` on a guest-written path is forbidden.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use cap_fs_ext::{DirExt, FollowSymlinks, OpenOptionsFollowExt};
use cap_std::ambient_authority;
use cap_std::fs::{Dir, OpenOptions};

use crate::limits::{Quota, MAX_WALK_DEPTH};
use crate::SandboxError;

/// Guest path of the episode workspace.
pub const WORKSPACE_GUEST_PATH: &str = "/workspace";

/// What a read-only mount holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountSource {
    /// Files materialised into a fresh directory (path → bytes).
    Files(BTreeMap<String, Vec<u8>>),
    /// An existing host directory (for example a shipped corpus). It is
    /// mounted read-only; the host never writes to it.
    HostDir(PathBuf),
}

/// A read-only mount at `/<name>` in the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Guest name: `[a-z0-9_-]{1,32}`, not `workspace` or `tmp`. Mounted at `/<name>`.
    pub name: String,
    /// The contents.
    pub source: MountSource,
}

/// Everything needed to create a workspace. Deny-by-default: with
/// `WorkspaceSpec::default()` the guest sees an empty `/workspace` and
/// nothing else, a 64 MiB / 10 000-entry quota, clock and RNG seeded with 0.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkspaceSpec {
    /// Initial files, relative path → bytes (parents are created).
    pub files: BTreeMap<String, Vec<u8>>,
    /// Read-only data mounts.
    pub mounts: Vec<Mount>,
    /// Workspace quota, checked after every call that can write.
    pub quota: Quota,
    /// Seed of the episode's fixed clock and RNG: same seed, same outputs.
    pub seed: u64,
    /// Parent directory for the workspace (e.g. a per-actor tmpfs); the
    /// system temp dir when `None`.
    pub parent: Option<PathBuf>,
}

impl WorkspaceSpec {
    /// A spec with these initial files and defaults for the rest.
    pub fn with_files<P: Into<String>, B: Into<Vec<u8>>>(
        files: impl IntoIterator<Item = (P, B)>,
    ) -> Self {
        Self {
            files: files
                .into_iter()
                .map(|(p, b)| (p.into(), b.into()))
                .collect(),
            ..Self::default()
        }
    }
}

/// One entry of a [`Snapshot`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Entry {
    /// A regular file and its bytes.
    File(Vec<u8>),
    /// A directory.
    Dir,
    /// A symlink and its target text (never followed).
    Symlink(String),
}

/// The workspace tree at one moment, keyed by relative path (`a/b.txt`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Snapshot {
    /// Every entry, sorted by path.
    pub entries: BTreeMap<String, Entry>,
}

/// How one path differs between two snapshots.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Present only in the later snapshot.
    Added(String),
    /// Present only in the earlier snapshot.
    Removed(String),
    /// Present in both with different content or kind.
    Modified(String),
}

impl Snapshot {
    /// Changes from `self` (earlier) to `later`, sorted by path.
    pub fn diff(&self, later: &Snapshot) -> Vec<Change> {
        let mut out = Vec::new();
        for (p, e) in &self.entries {
            match later.entries.get(p) {
                None => out.push(Change::Removed(p.clone())),
                Some(l) if l != e => out.push(Change::Modified(p.clone())),
                _ => {}
            }
        }
        for p in later.entries.keys() {
            if !self.entries.contains_key(p) {
                out.push(Change::Added(p.clone()));
            }
        }
        out.sort_by(|a, b| change_path(a).cmp(change_path(b)));
        out
    }

    /// A file's bytes, if `path` is a regular file in the snapshot.
    pub fn file(&self, path: &str) -> Option<&[u8]> {
        match self.entries.get(path.trim_start_matches("./")) {
            Some(Entry::File(b)) => Some(b),
            _ => None,
        }
    }
}

fn change_path(c: &Change) -> &str {
    match c {
        Change::Added(p) | Change::Removed(p) | Change::Modified(p) => p,
    }
}

/// Bytes and entries in use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    /// Bytes of regular-file content.
    pub bytes: u64,
    /// Files, directories and symlinks (the root not counted).
    pub inodes: u64,
}

pub(crate) struct MountedDir {
    pub name: String,
    pub host: PathBuf,
    pub dir: Dir,
}

/// A live episode workspace. Dropping it deletes the directory.
pub struct Workspace {
    // Field order matters: handles close before the directory is removed.
    pub(crate) dir: Dir,
    pub(crate) mounts: Vec<MountedDir>,
    pub(crate) ws_host: PathBuf,
    pub(crate) quota: Quota,
    pub(crate) seed: u64,
    pub(crate) calls: u64,
    pub(crate) answer: Option<String>,
    /// This episode's own retrieval index (a task whose corpus is generated per instance);
    /// preferred over the sandbox-wide index by the `search` tool.
    pub(crate) search: Option<std::sync::Arc<crate::search::SearchIndex>>,
    /// Its inotify watches and the usage they vouch for (see `watch.rs`);
    /// set by the first quota check.
    pub(crate) watch: Option<crate::watch::Registration>,
    /// Custom tools attached to this workspace only (a task pack's tools).
    pub(crate) tools: Vec<crate::sandbox::EpisodeTool>,
    /// The temp directory we created (removed on drop); `None` when attached.
    _root: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for Workspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workspace")
            .field("seed", &self.seed)
            .field("calls", &self.calls)
            .finish_non_exhaustive()
    }
}

/// Checks a path of a workspace's initial files (a [`WorkspaceSpec`] key): relative, clean,
/// printable. The error says why the path is refused.
pub fn check_rel_path(p: &str) -> Result<(), &'static str> {
    if p.is_empty() || p.len() > crate::limits::MAX_PATH_BYTES {
        return Err("empty or too long");
    }
    if p.starts_with('/') {
        return Err("must be relative");
    }
    if p.chars().any(forbidden_char) {
        return Err("contains a control or bidi-override character");
    }
    if p.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Err("has an empty, `.` or `..` component");
    }
    Ok(())
}

/// Characters never accepted in a path: NUL and other controls, and bidi
/// overrides that would make a path display as something else.
pub fn forbidden_char(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}')
}

fn check_mount_name(n: &str) -> Result<(), &'static str> {
    if n.is_empty() || n.len() > 32 || n == "workspace" || n == "tmp" {
        return Err("mount names are 1..=32 chars and not `workspace` or `tmp`");
    }
    if !n
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
    {
        return Err("mount names use only [a-z0-9_-]");
    }
    Ok(())
}

fn materialise(dir: &Dir, files: &BTreeMap<String, Vec<u8>>) -> Result<(), SandboxError> {
    for (p, bytes) in files {
        check_rel_path(p).map_err(|reason| SandboxError::SpecPath {
            path: p.clone(),
            reason,
        })?;
        if let Some((parent, _)) = p.rsplit_once('/') {
            dir.create_dir_all(parent)
                .map_err(|e| SandboxError::io("create_dir", parent, e))?;
        }
        dir.write(p, bytes)
            .map_err(|e| SandboxError::io("write", p, e))?;
    }
    Ok(())
}

impl Workspace {
    /// What a call mounts from this workspace, and what seeds its clock and randomness.
    pub(crate) fn guest_dirs(&self) -> crate::engine::GuestDirs<'_> {
        crate::engine::GuestDirs {
            workspace: &self.ws_host,
            seed: self.seed,
            calls: self.calls,
            mounts: self
                .mounts
                .iter()
                .map(|m| (m.name.as_str(), m.host.as_path()))
                .collect(),
        }
    }

    /// A fresh host folder for a call's `/tmp`: scratch space of that call alone, beside the
    /// workspace (outside its snapshot), removed when the returned handle drops, so nothing a
    /// guest leaves there outlives the call or counts against the next.
    pub(crate) fn scratch_dir(&self) -> Result<tempfile::TempDir, SandboxError> {
        let parent = self.ws_host.parent().filter(|_| self._root.is_some());
        match parent {
            Some(p) => tempfile::Builder::new().prefix("tmp-").tempdir_in(p),
            None => tempfile::Builder::new().prefix("corvid-tmp-").tempdir(),
        }
        .map_err(|e| SandboxError::io("create_tempdir", "/tmp", e))
    }

    /// Materialises a workspace (and its mounts) from a spec.
    pub fn create(spec: WorkspaceSpec) -> Result<Self, SandboxError> {
        let spec_bytes: u64 = spec.files.values().map(|b| b.len() as u64).sum();
        let spec_inodes = spec.files.len() as u64;
        if spec_bytes > spec.quota.max_bytes || spec_inodes > spec.quota.max_inodes {
            return Err(SandboxError::SpecOverQuota {
                bytes: spec_bytes,
                inodes: spec_inodes,
                max_bytes: spec.quota.max_bytes,
                max_inodes: spec.quota.max_inodes,
            });
        }
        let root = match &spec.parent {
            Some(p) => tempfile::Builder::new().prefix("corvid-ws-").tempdir_in(p),
            None => tempfile::Builder::new().prefix("corvid-ws-").tempdir(),
        }
        .map_err(|e| {
            SandboxError::io("create_tempdir", spec.parent.clone().unwrap_or_default(), e)
        })?;
        let ws_host = root.path().join("workspace");
        std::fs::create_dir(&ws_host).map_err(|e| SandboxError::io("create_dir", &ws_host, e))?;
        let dir = Dir::open_ambient_dir(&ws_host, ambient_authority())
            .map_err(|e| SandboxError::io("open_dir", &ws_host, e))?;
        materialise(&dir, &spec.files)?;
        let mut mounts = Vec::new();
        for m in &spec.mounts {
            check_mount_name(&m.name).map_err(|reason| SandboxError::SpecPath {
                path: m.name.clone(),
                reason,
            })?;
            if mounts.iter().any(|x: &MountedDir| x.name == m.name) {
                return Err(SandboxError::SpecPath {
                    path: m.name.clone(),
                    reason: "mount name used twice",
                });
            }
            let host = match &m.source {
                MountSource::HostDir(p) => p.clone(),
                MountSource::Files(files) => {
                    let host = root.path().join("mounts").join(&m.name);
                    std::fs::create_dir_all(&host)
                        .map_err(|e| SandboxError::io("create_dir", &host, e))?;
                    let d = Dir::open_ambient_dir(&host, ambient_authority())
                        .map_err(|e| SandboxError::io("open_dir", &host, e))?;
                    materialise(&d, files)?;
                    host
                }
            };
            let dir = Dir::open_ambient_dir(&host, ambient_authority())
                .map_err(|e| SandboxError::io("open_dir", &host, e))?;
            mounts.push(MountedDir {
                name: m.name.clone(),
                host,
                dir,
            });
        }
        Ok(Self {
            dir,
            mounts,
            ws_host,
            quota: spec.quota,
            seed: spec.seed,
            calls: 0,
            answer: None,
            search: None,
            watch: None,
            tools: Vec::new(),
            _root: Some(root),
        })
    }

    /// Uses an existing host directory as the workspace (for `corvid sandbox
    /// exec` and debugging). Nothing is copied and nothing is deleted on
    /// drop; `mounts` may only be [`MountSource::HostDir`].
    pub fn attach(
        dir: &Path,
        mounts: Vec<Mount>,
        quota: Quota,
        seed: u64,
    ) -> Result<Self, SandboxError> {
        let ws_host = dir
            .canonicalize()
            .map_err(|e| SandboxError::io("open_dir", dir, e))?;
        let handle = Dir::open_ambient_dir(&ws_host, ambient_authority())
            .map_err(|e| SandboxError::io("open_dir", &ws_host, e))?;
        let mut mounted = Vec::new();
        for m in mounts {
            check_mount_name(&m.name).map_err(|reason| SandboxError::SpecPath {
                path: m.name.clone(),
                reason,
            })?;
            let MountSource::HostDir(host) = m.source else {
                return Err(SandboxError::SpecPath {
                    path: m.name,
                    reason: "attached workspaces mount host directories only",
                });
            };
            let host = host
                .canonicalize()
                .map_err(|e| SandboxError::io("open_dir", &host, e))?;
            let d = Dir::open_ambient_dir(&host, ambient_authority())
                .map_err(|e| SandboxError::io("open_dir", &host, e))?;
            mounted.push(MountedDir {
                name: m.name,
                host,
                dir: d,
            });
        }
        Ok(Self {
            dir: handle,
            mounts: mounted,
            ws_host,
            quota,
            seed,
            calls: 0,
            answer: None,
            search: None,
            watch: None,
            tools: Vec::new(),
            _root: None,
        })
    }

    /// Gives this workspace its own retrieval index: the `search` tool then answers from
    /// it instead of the sandbox-wide one (see [`crate::SandboxBuilder::search_tool`]).
    pub fn set_search_index(&mut self, index: std::sync::Arc<crate::search::SearchIndex>) {
        self.search = Some(index);
    }

    /// Attaches a custom tool prepared by [`crate::Sandbox::prepare_tool`]:
    /// calls to it by name in this workspace run it (with this workspace
    /// mounted as the tool declares). Refused when a tool of that name is
    /// already attached.
    pub fn add_tool(&mut self, tool: crate::sandbox::EpisodeTool) -> Result<(), SandboxError> {
        if self.tools.iter().any(|t| t.name() == tool.name()) {
            return Err(SandboxError::CustomTool {
                name: tool.name().to_string(),
                reason: "a tool of this name is already attached to the workspace".into(),
            });
        }
        self.tools.push(tool);
        Ok(())
    }

    /// The custom tools attached to this workspace, in attachment order.
    pub fn tools(&self) -> &[crate::sandbox::EpisodeTool] {
        &self.tools
    }

    /// The episode seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Tool calls made so far in this workspace.
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// The text passed to the `answer` tool, if it was called.
    pub fn answer(&self) -> Option<&str> {
        self.answer.as_deref()
    }

    /// The quota in force.
    pub fn quota(&self) -> Quota {
        self.quota
    }

    /// Host directory mounted at `/workspace`. For host tooling and tests
    /// only: never show it to the model, and read it through
    /// [`Workspace::read`] / [`Workspace::snapshot`], not `std::fs`.
    pub fn host_path(&self) -> &Path {
        &self.ws_host
    }

    /// Reads a workspace file for a checker (relative path; symlinks that
    /// leave the workspace are refused).
    pub fn read(&self, path: &str) -> Result<Vec<u8>, SandboxError> {
        let rel = path
            .trim_start_matches("/workspace/")
            .trim_start_matches("./");
        check_rel_path(rel).map_err(|reason| SandboxError::SpecPath {
            path: path.to_string(),
            reason,
        })?;
        self.dir
            .read(rel)
            .map_err(|e| SandboxError::io("read", rel, e))
    }

    /// Bytes and entries in the workspace now (symlinks not followed).
    pub fn usage(&self) -> Result<Usage, SandboxError> {
        let mut u = Usage::default();
        walk(&self.dir, "", 0, &mut |_, kind, len| {
            u.inodes += 1;
            if kind == Kind::File {
                u.bytes += len;
            }
            Ok(())
        })?;
        Ok(u)
    }

    /// The whole workspace tree with file contents, for checkers and diffs.
    pub fn snapshot(&self) -> Result<Snapshot, SandboxError> {
        let mut s = Snapshot::default();
        let dir = &self.dir;
        walk(dir, "", 0, &mut |path, kind, _| {
            let e = match kind {
                Kind::Dir => Entry::Dir,
                Kind::File => {
                    let mut b = Vec::new();
                    let mut opts = OpenOptions::new();
                    opts.read(true).follow(FollowSymlinks::No);
                    dir.open_with(path, &opts)
                        .and_then(|mut f| f.read_to_end(&mut b))
                        .map_err(|e| SandboxError::io("read", path, e))?;
                    Entry::File(b)
                }
                Kind::Symlink => Entry::Symlink(
                    dir.read_link_contents(path)
                        .map(|p| p.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                ),
                Kind::Other => return Ok(()),
            };
            s.entries.insert(path.to_string(), e);
            Ok(())
        })?;
        Ok(s)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

/// Walks `dir` without following symlinks, depth-bounded, sorted by name.
pub(crate) fn walk(
    dir: &Dir,
    prefix: &str,
    depth: usize,
    f: &mut dyn FnMut(&str, Kind, u64) -> Result<(), SandboxError>,
) -> Result<(), SandboxError> {
    if depth > MAX_WALK_DEPTH {
        return Ok(());
    }
    let here = if prefix.is_empty() { "." } else { prefix };
    let sub = if prefix.is_empty() {
        None
    } else {
        Some(dir.open_dir_nofollow(prefix))
    };
    let d = match &sub {
        None => dir,
        Some(Ok(d)) => d,
        Some(Err(e)) => return Err(SandboxError::io("open_dir", here, clone_err(e))),
    };
    let mut entries: Vec<(String, Kind, u64)> = Vec::new();
    for e in d
        .entries()
        .map_err(|e| SandboxError::io("read_dir", here, e))?
    {
        let e = e.map_err(|e| SandboxError::io("read_dir", here, e))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let ft = e
            .file_type()
            .map_err(|e| SandboxError::io("stat", &name, e))?;
        let kind = if ft.is_symlink() {
            Kind::Symlink
        } else if ft.is_dir() {
            Kind::Dir
        } else if ft.is_file() {
            Kind::File
        } else {
            Kind::Other
        };
        let len = if kind == Kind::File {
            e.metadata().map(|m| m.len()).unwrap_or(0)
        } else {
            0
        };
        entries.push((name, kind, len));
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, kind, len) in entries {
        let path = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        f(&path, kind, len)?;
        if kind == Kind::Dir {
            walk(dir, &path, depth + 1, f)?;
        }
    }
    Ok(())
}

fn clone_err(e: &std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), e.to_string())
}
