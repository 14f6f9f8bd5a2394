//! The crate's one error type. These are *host-side* failures (setting up a
//! sandbox or workspace, a broken module); a misbehaving tool call is never
//! an `Err` — it is a [`crate::ToolOutput`] whose status names the class.

use std::path::PathBuf;

/// Everything that can go wrong while building a sandbox or a workspace.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    // ---------------------------------------------------------------- engine
    /// wasmtime refused the engine configuration.
    #[error("cannot configure the wasm engine: {0}")]
    Engine(String),
    /// A wasm module failed to compile or link.
    #[error("module `{name}` cannot be used as a tool: {reason}")]
    Module {
        /// Tool (or `toolbox`) whose module failed.
        name: String,
        /// What wasmtime said.
        reason: String,
    },
    /// A custom tool's registration is invalid (name, limits, size).
    #[error("custom tool `{name}` is invalid: {reason}")]
    CustomTool {
        /// The tool name as given.
        name: String,
        /// What is wrong and what is allowed.
        reason: String,
    },
    /// Limits outside what the engine's pool supports.
    #[error("limit `{field}` = {value} is invalid: {reason}")]
    Limit {
        /// Field of [`crate::Limits`].
        field: &'static str,
        /// The offending value.
        value: u64,
        /// The allowed range.
        reason: String,
    },

    // ------------------------------------------------------------- workspace
    /// An initial-file or mount path in a [`crate::WorkspaceSpec`] is not a
    /// clean relative path.
    #[error("workspace spec path {path:?} is invalid: {reason}")]
    SpecPath {
        /// The path as given.
        path: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// The initial files exceed the workspace quota.
    #[error("workspace spec holds {bytes} bytes in {inodes} entries, over the quota of {max_bytes} bytes / {max_inodes} entries")]
    SpecOverQuota {
        /// Bytes in the spec.
        bytes: u64,
        /// Files and directories in the spec.
        inodes: u64,
        /// The quota's byte limit.
        max_bytes: u64,
        /// The quota's entry limit.
        max_inodes: u64,
    },
    /// Host I/O failed while materialising, reading or snapshotting a workspace.
    #[error("workspace I/O failed during {op} at {path}: {source}")]
    Io {
        /// What the host was doing.
        op: &'static str,
        /// Host or workspace-relative path involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },

    // ---------------------------------------------------------------- search
    /// Building or querying the BM25 index failed.
    #[error("search index: {0}")]
    Search(String),
}

impl SandboxError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        SandboxError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}
