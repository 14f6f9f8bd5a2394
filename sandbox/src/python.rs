//! The `python` tool: CPython 3.12 compiled for WASI, run like every other wasm tool (a fresh
//! store per call, the pooled memory limit, fuel, the epoch deadline, the output caps), with
//! `/workspace` as its working directory and on `sys.path`, a scratch `/tmp` of the call's
//! own (gone when it ends), and an environment of its own. The interpreter is a runtime file, not a library: the
//! bootstrap fetches it (`scripts/runtime_files.py`), and [`PythonRuntime::open`] loads it
//! from a path; the sandbox compiles it once into a serialized module kept beside it.
//!
//! The module is VMware Labs' `python-3.12.0.wasm` (webassembly-language-runtimes release
//! `python/3.12.0+20231211-040d5a6`, the standard library embedded): [`open`] refuses any
//! other bytes. WASI preview 1 has no sockets and no processes, so `socket`, `subprocess`,
//! `os.system` and `fork` fail inside the guest; threads are not built in.
//!
//! [`open`]: PythonRuntime::open

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::{Engine, Module};

use crate::limits::Limits;
use crate::SandboxError;

/// The module's file name where the bootstrap puts it.
pub const PYTHON_MODULE_FILE: &str = "python-3.12.0.wasm";

/// sha256 of the only module [`PythonRuntime::open`] accepts (the release's own checksum).
pub const PYTHON_MODULE_SHA256: &str =
    "e5dc5a398b07b54ea8fdb503bf68fb583d533f10ec3f930963e02b9505f7a763";

/// Where `make` (scripts/bootstrap.sh, step 6) puts the module for this checkout:
/// `.corvid/runtimes/python-3.12.0.wasm` at the repository root.
pub fn bootstrap_module_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(".corvid")
        .join("runtimes")
        .join(PYTHON_MODULE_FILE)
}

/// Per-call limits of the `python` tool: the interpreter's start-up alone runs ~3e8 wasm
/// instructions and maps ~20 MiB, so it gets more fuel, memory and time than the shell.
pub fn default_limits() -> Limits {
    Limits {
        fuel: 20_000_000_000,
        deadline_ticks: 1000,
        memory_bytes: 192 << 20,
        ..Limits::default()
    }
}

/// The interpreter, as a [`SandboxBuilder::python`](crate::SandboxBuilder::python) takes it.
#[derive(Debug, Clone)]
pub struct PythonRuntime {
    /// The module file.
    pub path: PathBuf,
    /// Per-call limits (default [`default_limits`]).
    pub limits: Limits,
    /// Whether programs may write `/workspace` (default true; a checker reads the final
    /// workspace and must not change it).
    pub workspace_writable: bool,
}

impl PythonRuntime {
    /// The module at `path`, checked when the sandbox is built, with [`default_limits`]. Its
    /// folder holds the compiled module the sandbox loads without checking its code, so it
    /// must be one only this user writes (the bootstrap's runtime cache is).
    pub fn open(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            limits: default_limits(),
            workspace_writable: true,
        }
    }

    /// The module the bootstrap fetched for this checkout ([`bootstrap_module_path`]).
    pub fn bootstrapped() -> Self {
        Self::open(bootstrap_module_path())
    }

    /// This runtime with `/workspace` mounted read-only.
    pub fn read_only(mut self) -> Self {
        self.workspace_writable = false;
        self
    }
}

/// The program `python -c` runs before the caller's: the workspace becomes the working
/// directory and the first entry of `sys.path` (a script's own folder before it, as
/// `python script.py` does); then `argv[1]` says what to run (`code`, in a fresh `__main__`
/// module, or `path`), `argv[2]` is the code or the script, the rest its arguments.
///
/// It imports nothing the interpreter's start-up has not (`os` is frozen and loaded by
/// `site`; `runpy` only for a script, before the workspace is on `sys.path`): importing
/// `traceback` and `runpy` up front tripled the cost of `print(1)` (660M against 256M wasm
/// instructions). A traceback goes through `sys.__excepthook__`, the interpreter's own C
/// printer (no workspace module can replace it), starting at the caller's frame.
pub(crate) const PRELUDE: &str = r#"import os, sys
_mode, _target = sys.argv[1], sys.argv[2]
_skip = {"<string>"}
if _mode == "path":
    import runpy
    _skip |= {"<frozen runpy>", runpy.__file__}
os.chdir("/workspace")
sys.path.insert(0, "/workspace")
def _run():
    if _mode == "code":
        sys.argv = ["-c"] + sys.argv[3:]
        main = type(sys)("__main__")
        main.__builtins__ = __builtins__
        sys.modules["__main__"] = main
        exec(compile(_target, "<code>", "exec"), main.__dict__)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(_target)))
        sys.argv = [_target] + sys.argv[3:]
        runpy.run_path(_target, run_name="__main__")
try:
    _run()
except SystemExit:
    raise
except BaseException as _e:
    _tb = _e.__traceback__
    while _tb is not None and _tb.tb_frame.f_code.co_filename in _skip:
        _tb = _tb.tb_next
    sys.__excepthook__(type(_e), _e.with_traceback(_tb), _tb)
    sys.exit(1)
"#;

/// Environment of a `python` call beside the sandbox's own (`HOME`, `PWD`, `LANG`): no
/// bytecode written to the workspace, hashing seeded the same every call (deterministic
/// `set` order), UTF-8 streams.
pub(crate) const PYTHON_ENV: [(&str, &str); 4] = [
    ("PYTHONDONTWRITEBYTECODE", "1"),
    ("PYTHONHASHSEED", "0"),
    ("PYTHONIOENCODING", "utf-8"),
    ("PYTHONUTF8", "1"),
];

/// The compiled module for `engine`: the bytes at `path` must hash to `sha256`; they are
/// compiled once into `<path>.<engine key>.cwasm` beside them (with its own sha256 in
/// `.cwasm.sha256`) and deserialized from there afterwards. The serialized file is trusted as
/// wasmtime's own output (deserializing runs no check of the code), so it must live where no
/// guest writes: the runtime cache, never a workspace. One whose checksum does not match, or
/// that this wasmtime cannot load (another version, other settings), is compiled again.
pub(crate) fn precompiled(
    engine: &Engine,
    path: &Path,
    sha256: &str,
) -> Result<Module, SandboxError> {
    let bad = |reason: String| SandboxError::Module {
        name: path.display().to_string(),
        reason,
    };
    let bytes = std::fs::read(path).map_err(|e| {
        bad(format!(
            "cannot read it ({e}); run `make` (scripts/bootstrap.sh, step 6: the sandbox's runtime files) to fetch it"
        ))
    })?;
    let got = hex::encode(Sha256::digest(&bytes));
    if got != sha256 {
        return Err(bad(format!("sha256 {got}, expected {sha256}")));
    }
    let mut h = DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    let cwasm = path.with_extension(format!("{}.{:016x}.cwasm", &got[..16], h.finish()));
    let digest = cwasm.with_extension("cwasm.sha256");
    if let (Ok(serialized), Ok(expected)) =
        (std::fs::read(&cwasm), std::fs::read_to_string(&digest))
    {
        // A torn or altered file is compiled again rather than loaded.
        if hex::encode(Sha256::digest(&serialized)) == expected.trim() {
            // SAFETY: these bytes are this function's own serialization (their sha256 is the
            // one written beside them) of a module whose bytes were checked above, in the
            // runtime cache, which no guest can write.
            if let Ok(m) = unsafe { Module::deserialize(engine, &serialized) } {
                return Ok(m);
            }
        }
    }
    let module = Module::new(engine, &bytes).map_err(|e| bad(e.to_string()))?;
    // The cache is an optimisation: a read-only runtime folder only costs the next start.
    if let Ok(serialized) = module.serialize() {
        let _ = write_atomically(&cwasm, &serialized).and_then(|()| {
            write_atomically(&digest, hex::encode(Sha256::digest(&serialized)).as_bytes())
        });
    }
    Ok(module)
}

/// Writes `bytes` to `path` through a fresh temporary file in its folder, synced, then renamed
/// over it: a concurrent writer or a crash never leaves a torn file under the name.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map(|_| ()).map_err(|e| e.error)
}
