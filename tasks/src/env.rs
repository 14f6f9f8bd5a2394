//! A task instance running in the real sandbox: the episode environment shared by the
//! actor (rollouts), the learner (oracle demonstrations for SFT) and the evaluator.
//!
//! - [`TaskEnv`] wraps the process-wide [`Sandbox`] and caches per-instance search
//!   indexes (a group of G episodes shares one instance, hence one index) and compiled
//!   WASI checkers. Tasks that allow `python` run in a second sandbox with the interpreter
//!   (the search tool on, default shell limits), built on the first such task, so that a
//!   process that never runs one never loads the runtime.
//! - [`Episode`] is one live episode: the workspace materialised from the instance's files,
//!   the task's tool gate (only the tools the task allows, each within its call limit, its
//!   output cut to the task's byte limit), the per-turn process reward, and the checker run
//!   on the final state — including the sandbox-only checkers (`command_exit`, `wasi`).
//!
//! ```
//! use corvid_sandbox::Sandbox;
//! use corvid_tasks::{builtin_family, Episode, TaskEnv};
//! let env = TaskEnv::new(Sandbox::builder().search_tool(true).build()?);
//! let task = builtin_family("hops")?.instance(2, 7)?;
//! let mut ep = Episode::start(&env, &task)?;
//! for step in &task.oracle.steps {
//!     let out = ep.call(&step.tool_call());
//!     assert_eq!(out.result.status, step.expect);
//! }
//! ep.call(&task.oracle.answer_step().tool_call());
//! assert!(ep.check().passed());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use corvid_proto::{ToolCall, ToolStatus};
use corvid_sandbox::{
    CustomTool, Entry, EpisodeTool, Limits, PythonFlavor, PythonRuntime, Sandbox, SearchIndex,
    ToolOutput, Workspace, WorkspaceSpec,
};

use crate::checker::{Checker, Verdict};
use crate::error::TasksError;
use crate::process::{score_turns, ScoredTurn};
use crate::task::{CustomToolDecl, TaskInstance};

/// Most search indexes and compiled checkers kept in memory at once.
const CACHE_ENTRIES: usize = 64;

/// A sandbox built on first use.
type PythonCell = Arc<Mutex<Option<Sandbox>>>;

/// The sandbox plus per-instance caches; share one per process (`Send + Sync`).
#[derive(Clone)]
pub struct TaskEnv {
    sandbox: Sandbox,
    indexes: Arc<Mutex<HashMap<String, Arc<SearchIndex>>>>,
    checkers: Arc<Mutex<HashMap<PathBuf, Sandbox>>>,
    /// Packs' custom tools compiled by `sandbox`, keyed by their declaration.
    custom_tools: Arc<Mutex<HashMap<String, EpisodeTool>>>,
    workspace_parent: Option<PathBuf>,
    /// Interpreters given in place of the ones the bootstrap fetched, by flavor.
    python_runtimes: HashMap<PythonFlavor, PythonRuntime>,
    /// Per interpreter, the sandbox of tasks that allow `python` (`false`) and the one
    /// `python` checkers run in (`true`: the workspace read-only); each built on first use
    /// under its own lock, so that compiling one never holds up the others (a failed build
    /// is tried again next time).
    python: Arc<Mutex<HashMap<(PythonFlavor, bool), PythonCell>>>,
}

impl std::fmt::Debug for TaskEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskEnv")
            .field("sandbox", &self.sandbox)
            .finish_non_exhaustive()
    }
}

impl TaskEnv {
    /// An environment over `sandbox`. Build it with
    /// [`corvid_sandbox::SandboxBuilder::search_tool`] so that tasks with a corpus can
    /// search it.
    pub fn new(sandbox: Sandbox) -> Self {
        Self {
            sandbox,
            indexes: Arc::default(),
            checkers: Arc::default(),
            custom_tools: Arc::default(),
            workspace_parent: None,
            python_runtimes: HashMap::new(),
            python: Arc::default(),
        }
    }

    /// Runs `python` in tasks of `runtime`'s flavor with `runtime` instead of the one the
    /// bootstrap fetched for this checkout ([`PythonRuntime::bootstrapped_flavor`]).
    pub fn with_python(mut self, runtime: PythonRuntime) -> Self {
        self.python_runtimes.insert(runtime.flavor, runtime);
        self.python = Arc::default();
        self
    }

    /// Creates workspaces under `dir` (for example a per-actor tmpfs) instead of the
    /// system temp directory.
    pub fn with_workspace_parent(mut self, dir: PathBuf) -> Self {
        self.workspace_parent = Some(dir);
        self
    }

    /// The sandbox.
    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }

    /// The sandbox `task`'s episodes run in: the one with the interpreter when the task
    /// allows `python`, otherwise [`TaskEnv::sandbox`].
    pub fn sandbox_for(&self, task: &TaskInstance) -> Result<Sandbox, TasksError> {
        if !task.tools.iter().any(|t| t.name == "python") {
            return Ok(self.sandbox.clone());
        }
        self.python_sandbox(task.python, false)
            .map_err(|message| TasksError::Sandbox {
                task: task.id.clone(),
                message,
            })
    }

    /// The sandbox with the `flavor` interpreter, for episodes or (`checker`) for `python`
    /// checkers.
    fn python_sandbox(&self, flavor: PythonFlavor, checker: bool) -> Result<Sandbox, String> {
        let cell = self
            .python
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((flavor, checker))
            .or_default()
            .clone();
        let mut cell = cell.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = cell.as_ref() {
            return Ok(s.clone());
        }
        let mut runtime = match self.python_runtimes.get(&flavor) {
            Some(rt) => rt.clone(),
            None => PythonRuntime::bootstrapped_flavor(flavor),
        };
        if checker {
            runtime = runtime.read_only();
        }
        let path = runtime.path.display().to_string();
        let sandbox = Sandbox::builder()
            .search_tool(true)
            .python(runtime)
            .build()
            .map_err(|e| format!("the python runtime {path}: {e}"))?;
        *cell = Some(sandbox.clone());
        Ok(sandbox)
    }

    fn search_index(&self, task: &TaskInstance) -> Result<Arc<SearchIndex>, TasksError> {
        let mut cache = self.indexes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ix) = cache.get(&task.spec_hash) {
            return Ok(ix.clone());
        }
        let docs: Vec<corvid_sandbox::Document> = task
            .read_only
            .corpus
            .iter()
            .map(|d| corvid_sandbox::Document {
                id: d.id.clone(),
                title: d.title.clone(),
                text: d.text.clone(),
            })
            .collect();
        let ix = Arc::new(SearchIndex::build(&docs).map_err(|e| TasksError::Sandbox {
            task: task.id.clone(),
            message: format!("building the search index: {e}"),
        })?);
        if cache.len() >= CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(task.spec_hash.clone(), ix.clone());
        Ok(ix)
    }

    /// A pack's custom tool compiled by this environment's sandbox, once per declaration.
    pub fn custom_tool(
        &self,
        task: &TaskInstance,
        decl: &CustomToolDecl,
    ) -> Result<EpisodeTool, TasksError> {
        let key = serde_json::to_string(decl).unwrap_or_else(|_| decl.name.clone());
        let mut cache = self.custom_tools.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = cache.get(&key) {
            return Ok(t.clone());
        }
        let fail = |message: String| TasksError::Sandbox {
            task: task.id.clone(),
            message,
        };
        let wasm = std::fs::read(&decl.module).map_err(|e| {
            fail(format!(
                "cannot read the module of tool `{}` ({}): {e}",
                decl.name, decl.module
            ))
        })?;
        let tool = self
            .sandbox
            .prepare_tool(CustomTool {
                name: decl.name.clone(),
                description: decl.description.clone(),
                wasm,
                limits: decl.limits,
                workspace_writable: decl.workspace_writable,
            })
            .map_err(|e| fail(format!("tool `{}` ({}): {e}", decl.name, decl.module)))?;
        if cache.len() >= CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(key, tool.clone());
        Ok(tool)
    }

    /// OpenAI-style declarations of the tools `task` allows, in the task's order: the
    /// sandbox's built-ins and the task's own custom tools. This is what the policy's
    /// system prompt should list.
    pub fn tool_declarations(&self, task: &TaskInstance) -> Result<serde_json::Value, TasksError> {
        let mut out = Vec::new();
        let sandbox = self.sandbox_for(task)?;
        for t in &task.tools {
            match task.custom_tools.iter().find(|c| c.name == t.name) {
                Some(decl) => out.push(self.custom_tool(task, decl)?.declaration()),
                None => {
                    let d = sandbox.tool_declarations(Some(&[t.name.as_str()]));
                    out.extend(d.as_array().into_iter().flatten().cloned());
                }
            }
        }
        Ok(serde_json::Value::Array(out))
    }

    /// The sandbox that runs a `wasi` checker module, compiled once per module path.
    fn checker_sandbox(&self, module: &Path) -> Result<Sandbox, String> {
        let mut cache = self.checkers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = cache.get(module) {
            return Ok(s.clone());
        }
        let wasm = std::fs::read(module)
            .map_err(|e| format!("cannot read checker module {}: {e}", module.display()))?;
        let sandbox = Sandbox::builder()
            .custom_tool(CustomTool {
                name: "checker".into(),
                description: "the task's checker".into(),
                wasm,
                limits: Limits::default(),
                workspace_writable: false,
            })
            .build()
            .map_err(|e| format!("checker module {}: {e}", module.display()))?;
        if cache.len() >= CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(module.to_path_buf(), sandbox.clone());
        Ok(sandbox)
    }
}

/// One live episode of a task instance in its own workspace.
pub struct Episode<'a> {
    env: &'a TaskEnv,
    task: &'a TaskInstance,
    /// [`TaskEnv::sandbox_for`] the task.
    sandbox: Sandbox,
    ws: Workspace,
    calls_by_tool: BTreeMap<String, u32>,
    /// Every call so far and its status, for process rewards.
    history: Vec<(ToolCall, ToolStatus)>,
}

impl std::fmt::Debug for Episode<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Episode")
            .field("task", &self.task.id)
            .field("calls", &self.history.len())
            .finish_non_exhaustive()
    }
}

impl<'a> Episode<'a> {
    /// Materialises the task's workspace (its initial files; its corpus as this
    /// workspace's search index; its pack's custom tools attached).
    pub fn start(env: &'a TaskEnv, task: &'a TaskInstance) -> Result<Self, TasksError> {
        let sandbox = env.sandbox_for(task)?;
        let spec = WorkspaceSpec {
            files: task.files.clone(),
            seed: task.seed,
            parent: env.workspace_parent.clone(),
            ..WorkspaceSpec::default()
        };
        let mut ws = Workspace::create(spec).map_err(|e| TasksError::Sandbox {
            task: task.id.clone(),
            message: format!("creating the workspace: {e}"),
        })?;
        if !task.read_only.corpus.is_empty() {
            ws.set_search_index(env.search_index(task)?);
        }
        for decl in &task.custom_tools {
            ws.add_tool(env.custom_tool(task, decl)?)
                .map_err(|e| TasksError::Sandbox {
                    task: task.id.clone(),
                    message: e.to_string(),
                })?;
        }
        Ok(Self {
            env,
            task,
            sandbox,
            ws,
            calls_by_tool: BTreeMap::new(),
            history: Vec::new(),
        })
    }

    /// The task.
    pub fn task(&self) -> &TaskInstance {
        self.task
    }

    /// Runs one call through the task's tool gate, then the sandbox. Never fails: a tool
    /// the task does not allow is `unknown_tool`, a call over the tool's limit is
    /// `invalid_call`, and output over the task's byte limit is cut (`output_truncated`).
    pub fn call(&mut self, call: &ToolCall) -> ToolOutput {
        let out = self.gated_call(call);
        self.history.push((call.clone(), out.result.status));
        out
    }

    fn gated_call(&mut self, call: &ToolCall) -> ToolOutput {
        let Some(spec) = self.task.tools.iter().find(|t| t.name == call.name) else {
            let shown: String = call
                .name
                .chars()
                .filter(|c| !c.is_control())
                .take(64)
                .collect();
            let names: Vec<&str> = self.task.tools.iter().map(|t| t.name.as_str()).collect();
            return ToolOutput::refused(
                &call.name,
                ToolStatus::UnknownTool,
                format!(
                    "no tool named `{shown}` in this task; available: {}",
                    names.join(", ")
                ),
            );
        };
        let used = self.calls_by_tool.entry(call.name.clone()).or_insert(0);
        if let Some(max) = spec.limits.max_calls {
            if *used >= max {
                return ToolOutput::refused(
                    &call.name,
                    ToolStatus::InvalidCall,
                    format!(
                        "{} may be called at most {max} times in this task",
                        call.name
                    ),
                );
            }
        }
        *used += 1;
        let mut out = self.sandbox.call_tool(&mut self.ws, call);
        if let Some(max) = spec.limits.max_output_bytes {
            cut_output(&mut out, max as usize);
        }
        out
    }

    /// The process reward of the latest call, from the task's rules over every call so far:
    /// `p_t = score_turns(rules, turns[..=t])[t]`.
    pub fn last_process_reward(&self) -> f64 {
        let turns: Vec<ScoredTurn<'_>> = self
            .history
            .iter()
            .map(|(call, status)| ScoredTurn {
                call,
                status: *status,
            })
            .collect();
        score_turns(&self.task.process_rules, &turns)
            .last()
            .copied()
            .unwrap_or(0.0)
    }

    /// The argument of the last `answer` call, if any.
    pub fn answer(&self) -> Option<&str> {
        self.ws.answer()
    }

    /// A workspace file's bytes now (a path relative to the workspace; a symlink that leaves
    /// it is refused).
    pub fn read_file(&self, path: &str) -> Result<Vec<u8>, TasksError> {
        self.ws.read(path).map_err(|e| TasksError::Sandbox {
            task: self.task.id.clone(),
            message: format!("reading {path}: {e}"),
        })
    }

    /// Every regular file of the workspace now, path → bytes.
    pub fn files(&self) -> Result<BTreeMap<String, Vec<u8>>, TasksError> {
        let snap = self.ws.snapshot().map_err(|e| TasksError::Sandbox {
            task: self.task.id.clone(),
            message: format!("reading the final workspace: {e}"),
        })?;
        Ok(snap
            .entries
            .into_iter()
            .filter_map(|(p, e)| match e {
                Entry::File(b) => Some((p, b)),
                _ => None,
            })
            .collect())
    }

    /// Judges the episode with the task's checker on the answer and the final workspace.
    /// `command_exit` runs its command with the toolbox shell in this workspace; `wasi`
    /// runs the pack's module over it read-only, `python` its program. A checker that
    /// cannot run at all is a [`Verdict::Fail`] naming why.
    pub fn check(&mut self) -> Verdict {
        match &self.task.checker {
            Checker::CommandExit { command, exit_code } => {
                let args = serde_json::json!({ "command": command }).to_string();
                let out = self.sandbox.call(&mut self.ws, "shell", &args);
                if out.result.status == ToolStatus::InfraError {
                    return Verdict::Fail(format!("checker command could not run: {}", out.text));
                }
                if out.result.exit_code == *exit_code {
                    Verdict::Pass
                } else {
                    Verdict::Fail(format!(
                        "`{command}` exited {} (want {exit_code}): {}",
                        out.result.exit_code,
                        out.text.trim()
                    ))
                }
            }
            Checker::Wasi { module, args } => {
                let sandbox = match self.env.checker_sandbox(Path::new(module)) {
                    Ok(s) => s,
                    Err(e) => return Verdict::Fail(e),
                };
                let call = serde_json::json!({ "args": args }).to_string();
                let out = sandbox.call(&mut self.ws, "checker", &call);
                if out.result.status.is_success() && out.result.exit_code == 0 {
                    Verdict::Pass
                } else {
                    Verdict::Fail(format!(
                        "checker module exited {} ({}): {}",
                        out.result.exit_code,
                        out.result.status,
                        out.text.trim()
                    ))
                }
            }
            Checker::Python { code, script, args } => self.check_python(code, script, args),
            checker => match self.files() {
                Ok(files) => checker.check(self.answer(), &files),
                Err(e) => Verdict::Fail(e.to_string()),
            },
        }
    }
}

impl Episode<'_> {
    /// A `python` checker: its program (`code`, or the file `script`) run with the `python`
    /// tool over the final workspace, read-only, with the answer (empty when none) and `args`
    /// as its arguments; exit status 0 accepts.
    fn check_python(
        &mut self,
        code: &Option<String>,
        script: &Option<String>,
        args: &[String],
    ) -> Verdict {
        let program = match (code, script) {
            (Some(code), None) => code.clone(),
            (None, Some(path)) => match std::fs::read_to_string(path) {
                Ok(text) => text,
                Err(e) => return Verdict::Fail(format!("cannot read checker script {path}: {e}")),
            },
            _ => return Verdict::Fail("a python checker needs one of `code` or `script`".into()),
        };
        let sandbox = match self.env.python_sandbox(self.task.python, true) {
            Ok(s) => s,
            Err(e) => return Verdict::Fail(format!("python checker could not run: {e}")),
        };
        let argv: Vec<&str> = std::iter::once(self.answer().unwrap_or_default())
            .chain(args.iter().map(String::as_str))
            .collect();
        let call = serde_json::json!({ "code": program, "args": argv }).to_string();
        let out = sandbox.call(&mut self.ws, "python", &call);
        if out.result.status.is_success() && out.result.exit_code == 0 {
            return Verdict::Pass;
        }
        // The end of the output holds the verdict (a traceback's error, unittest's summary).
        let text = out.text.trim();
        let mut from = text.len().saturating_sub(600);
        while !text.is_char_boundary(from) {
            from += 1;
        }
        Verdict::Fail(format!(
            "python checker exited {} ({}): {}",
            out.result.exit_code,
            out.result.status,
            &text[from..]
        ))
    }
}

/// Cuts the shown text to `max` bytes on a character boundary and marks the result
/// `output_truncated` (when the call had otherwise succeeded).
fn cut_output(out: &mut ToolOutput, max: usize) {
    if out.text.len() <= max {
        return;
    }
    let mut end = max;
    while !out.text.is_char_boundary(end) {
        end -= 1;
    }
    out.text.truncate(end);
    out.text.push_str("\n[output truncated]");
    out.result.bytes_shown = out.text.len() as u64;
    if out.result.status == ToolStatus::Ok {
        out.result.status = ToolStatus::OutputTruncated;
    }
}
