//! The Corvid tool sandbox: every tool the policy calls runs here, confined.
//!
//! # Brief overview
//!
//! - [`Sandbox`] — one per process, `Send + Sync`, cheap to clone. Owns the
//!   wasmtime engine (pooling allocator, fuel, epoch ticker), the compiled
//!   toolbox, custom WASI tools ([`CustomTool`]), the shared read-only
//!   [`SearchIndex`] and the tool registry with its OpenAI-style JSON-schema
//!   declarations ([`Sandbox::tool_declarations`]).
//! - [`Workspace`] — one per episode, created from a [`WorkspaceSpec`]
//!   (initial files, read-only [`Mount`]s, [`Quota`], seed). Checkers read
//!   its final state through [`Workspace::snapshot`] / [`Workspace::read`]
//!   and compare states with [`Snapshot::diff`]. Deleted on drop.
//! - [`Sandbox::call`] — tool name + raw JSON arguments in, [`ToolOutput`]
//!   out: a [`corvid_proto::ToolResult`] (status class, exit code, bytes,
//!   fuel, wall time) and the exact text shown to the model. It never
//!   returns an error and never panics on any input.
//!
//! Tools: `shell` (the toolbox in `sandbox/toolbox`, a multi-call Rust
//! program for `wasm32-wasip1` with a small shell and ~30 commands),
//! `read_file`, `write_file`, `list_dir` (host side, cap-std), `search`
//! (BM25, tantivy; only when an index is given), `python` (CPython 3.12 for
//! WASI, only when a [`PythonRuntime`] is given) and `answer`.
//!
//! ```
//! use corvid_sandbox::{Sandbox, Workspace, WorkspaceSpec};
//! use corvid_proto::ToolStatus;
//!
//! let sandbox = Sandbox::new()?;
//! let mut ws = Workspace::create(WorkspaceSpec::with_files([("notes.txt", "b\na\nb\n")]))?;
//! let out = sandbox.call(&mut ws, "shell", r#"{"command": "sort -u notes.txt | wc -l"}"#);
//! assert_eq!(out.result.status, ToolStatus::Ok);
//! assert_eq!(out.text, "2\n");
//! let out = sandbox.call(&mut ws, "read_file", r#"{"path": "../../etc/passwd"}"#);
//! assert_eq!(out.result.status, ToolStatus::PermissionDenied);
//! assert!(sandbox.tool_declarations(None).as_array().is_some_and(|a| a.len() == 5));
//! # Ok::<(), corvid_sandbox::SandboxError>(())
//! ```
//!
//! # What is contained / what is not (threat model)
//!
//! The policy is treated as an adversary that controls every byte of every
//! tool call. **Contained** (each has a test in `sandbox/tests/`):
//!
//! - *Filesystem*: a guest sees only `/workspace` (read-write) and its
//!   read-only mounts (a `python` call also its own empty `/tmp`, removed
//!   when it ends). `..`, absolute paths, symlinks planted by the host or
//!   created by the guest, trailing-slash tricks, and read-only bypasses
//!   (`O_TRUNC`, hard link, rename, set-times) are refused by WASI
//!   preopens; host-side tools and snapshots use cap-std and never follow a
//!   symlink out.
//! - *CPU*: fuel ([`limits::DEFAULT_FUEL`]) and a wall-clock epoch deadline
//!   ([`limits::DEFAULT_DEADLINE_TICKS`]); `poll_oneoff` is shadowed so a
//!   guest cannot park a worker in `sleep`.
//! - *Memory*: a per-store limiter ([`limits::DEFAULT_MEMORY_BYTES`]), a
//!   bounded wasm stack, pooled slots that are reset between instances (no
//!   cross-episode leakage).
//! - *Output and disk*: stdout/stderr capped on capture and again for
//!   display; a byte and entry quota checked after every call that can write.
//! - *Information*: no inherited env (a fixed allow-list), no host args, no
//!   network (WASI p1 has no sockets), a fixed clock and a seeded RNG. Text
//!   shown to the model never contains a host path, a Rust debug string or
//!   a backtrace; control characters are escaped.
//! - *Host robustness*: arguments are validated before anything runs; any
//!   input yields a [`ToolOutput`], never a panic or an `infra_error`.
//!
//! **Not contained** (layer 2, the deployment's job — see `docs/sandbox.md`):
//! a guest can write up to the quota *within one call* before the post-call
//! check sees it (bound the disk with a per-actor tmpfs); Spectre-class
//! side channels; bugs in wasmtime/Cranelift themselves (run actors as an
//! unprivileged user with RLIMITs); denial of service by a *host-side*
//! search over a huge corpus (the corpus is ours, not the policy's).
//!
//! # Determinism
//!
//! Same [`WorkspaceSpec`] (files, seed) and same calls ⇒ byte-identical
//! outputs: the wall clock starts at 2024-01-01T00:00:00Z and advances one
//! second per call, the monotonic clock is fixed, the RNG is seeded from
//! (seed, call index), and every listing is sorted.
#![deny(missing_docs)]

mod engine;
mod error;
pub mod limits;
mod output;
mod preinit;
pub mod python;
mod sandbox;
mod search;
mod tools;
mod watch;
mod workspace;

pub use corvid_proto::{ToolCall, ToolResult, ToolStatus};
pub use error::SandboxError;
pub use limits::{Limits, Quota};
pub use python::{PythonFlavor, PythonRuntime};
pub use sandbox::{
    CustomTool, EpisodeTool, Sandbox, SandboxBuilder, ToolOutput, EXIT_CRASHED, EXIT_KILLED,
};
pub use search::{Document, Hit, SearchIndex};
pub use workspace::{
    check_rel_path, forbidden_char, Change, Entry, Mount, MountSource, Snapshot, Usage, Workspace,
    WorkspaceSpec, WORKSPACE_GUEST_PATH,
};

/// Re-exported for the CLI, which prints [`ToolOutput`] as JSON.
pub use serde_json;

/// The toolbox module (`sandbox/toolbox`, built for `wasm32-wasip1` by this
/// crate's build script): the program behind the `shell` tool, itself a WASI
/// preview-1 command that any custom-tool slot can run (`toolbox wc -l FILE`).
pub fn toolbox_wasm() -> &'static [u8] {
    engine::TOOLBOX_WASM
}
