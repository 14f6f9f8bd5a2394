//! What a task is: the [`TaskFamily`] trait and the [`TaskInstance`] it generates,
//! with its oracle plan and spec hash.

use std::collections::BTreeMap;

use corvid_proto::{TaskRef, ToolCall, ToolStatus};
use sha2::{Digest, Sha256};

use crate::checker::Checker;
use crate::error::TasksError;
use crate::process::ProcessRule;

/// Limits on one tool within an episode.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolLimits {
    /// Most calls of this tool per episode (`None`: only `max_turns` bounds it).
    #[serde(default)]
    pub max_calls: Option<u32>,
    /// Most output bytes shown to the model per call (`None`: the sandbox default).
    #[serde(default)]
    pub max_output_bytes: Option<u64>,
}

/// A tool the task allows, with its limits.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ToolSpec {
    /// Tool name (`shell`, `python`, `read_file`, `write_file`, `list_dir`, `search`,
    /// `answer`, or a task's own tool).
    pub name: String,
    /// Its limits.
    pub limits: ToolLimits,
}

impl ToolSpec {
    /// A tool without extra limits.
    pub fn unlimited(name: &str) -> Self {
        Self {
            name: name.to_string(),
            limits: ToolLimits::default(),
        }
    }

    /// A tool callable at most `max_calls` times an episode, each call's output cut to
    /// `max_output_bytes` (`None`: the sandbox default).
    pub fn limited(name: &str, max_calls: u32, max_output_bytes: Option<u64>) -> Self {
        Self {
            name: name.to_string(),
            limits: ToolLimits {
                max_calls: Some(max_calls),
                max_output_bytes,
            },
        }
    }
}

/// A task's own tool: any WASI preview-1 command module, called by the model as
/// `{"args": [..], "stdin": ".."}` (argv after the tool's name, and standard input),
/// with the episode workspace mounted at `/workspace` and its own limits.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CustomToolDecl {
    /// Tool name, `[a-z][a-z0-9_]{0,63}`, not a built-in tool's.
    pub name: String,
    /// What the model reads about it.
    pub description: String,
    /// Path of the `.wasm` module (a pack writes it relative to the pack file; the
    /// instance holds it resolved against the pack's directory).
    pub module: String,
    /// Fuel, wall-clock deadline, memory and output limits per call.
    pub limits: corvid_sandbox::Limits,
    /// Whether the tool may write to `/workspace` (otherwise it is mounted read-only).
    pub workspace_writable: bool,
}

/// The tools every built-in and pack task may name.
pub const KNOWN_TOOLS: [&str; 7] = [
    "shell",
    "python",
    "read_file",
    "write_file",
    "list_dir",
    "search",
    "answer",
];

/// One document of a generated retrieval corpus (the sandbox's BM25 index is built from
/// these).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Document {
    /// Stable id, e.g. `doc-0042`.
    pub id: String,
    /// Title (the entity's name).
    pub title: String,
    /// Body text.
    pub text: String,
}

/// Data the task reads but the agent cannot change.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct ReadOnlyData {
    /// Retrieval corpus for the `search` tool (empty when the task has no search).
    pub corpus: Vec<Document>,
}

/// One step of an oracle plan: a tool call, the status it gets, and the output the tool
/// produces for it on the instance's initial files.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OracleStep {
    /// Tool name.
    pub name: String,
    /// JSON arguments.
    pub arguments: serde_json::Value,
    /// The status the call gets (a recoverable failure has a failing status).
    pub expect: ToolStatus,
    /// The output text the tool returns (computed from the generated files).
    pub output: String,
}

impl OracleStep {
    /// The call as a policy would write it.
    pub fn tool_call(&self) -> ToolCall {
        ToolCall {
            name: self.name.clone(),
            arguments_json: self.arguments.to_string(),
        }
    }

    /// The call in the Hermes format, name first:
    /// `<tool_call>{"name": …, "arguments": {…}}</tool_call>`.
    pub fn hermes(&self) -> String {
        format!(
            "<tool_call>{{\"name\":{},\"arguments\":{}}}</tool_call>",
            serde_json::Value::String(self.name.clone()),
            self.arguments
        )
    }

    /// Bytes of [`OracleStep::hermes`].
    pub fn call_bytes(&self) -> usize {
        self.hermes().len()
    }
}

/// The plan a correct agent follows: ordered tool calls, then the final answer.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OraclePlan {
    /// Tool calls in order (excluding the final `answer`).
    pub steps: Vec<OracleStep>,
    /// The argument of the final `answer` call.
    pub answer: String,
}

impl OraclePlan {
    /// Whether the plan contains a recoverable failure (a call that fails, then the fix).
    pub fn has_recovery(&self) -> bool {
        self.steps.iter().any(|s| !s.expect.is_success())
    }

    /// The final `answer` call.
    pub fn answer_step(&self) -> OracleStep {
        OracleStep {
            name: "answer".into(),
            arguments: serde_json::json!({"answer": self.answer}),
            expect: ToolStatus::Ok,
            output: String::new(),
        }
    }
}

/// A fully specified task instance; equal seeds give equal instances (and spec hashes).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TaskInstance {
    /// `family/Llevel/sseed`.
    pub id: String,
    /// Family or pack name.
    pub family: String,
    /// Level, 1-based.
    pub level: u32,
    /// Seed.
    pub seed: u64,
    /// The user prompt.
    pub prompt: String,
    /// Initial workspace files, path → bytes.
    pub files: BTreeMap<String, Vec<u8>>,
    /// Read-only data (the retrieval corpus).
    pub read_only: ReadOnlyData,
    /// Tools allowed, with limits.
    pub tools: Vec<ToolSpec>,
    /// Most turns in an episode.
    pub max_turns: u32,
    /// Context budget in tokens.
    pub context_budget: u32,
    /// How the episode is judged.
    pub checker: Checker,
    /// Process-reward rules.
    pub process_rules: Vec<ProcessRule>,
    /// A correct trajectory's plan.
    pub oracle: OraclePlan,
    /// The task's own WASI tools (declared by a pack), registered in each episode's
    /// workspace; each must also be allowed in [`TaskInstance::tools`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub custom_tools: Vec<CustomToolDecl>,
    /// The interpreter its `python` tool and checker run (a pack's `[pack] python`; CPython
    /// 3.12 unless it says otherwise, and then left out of the JSON and the hash).
    #[serde(default, skip_serializing_if = "is_default_python")]
    pub python: corvid_sandbox::PythonFlavor,
    /// Hex SHA-256 of the canonical JSON of every other field.
    pub spec_hash: String,
}

fn is_default_python(flavor: &corvid_sandbox::PythonFlavor) -> bool {
    *flavor == corvid_sandbox::PythonFlavor::default()
}

impl TaskInstance {
    /// Computes and stores [`TaskInstance::spec_hash`]: SHA-256 of this instance's JSON with
    /// an empty hash (field order is fixed by the struct, maps are sorted).
    pub fn seal(mut self) -> Self {
        self.spec_hash.clear();
        let bytes = serde_json::to_vec(&self).unwrap_or_default();
        self.spec_hash = hex::encode(Sha256::digest(&bytes));
        self
    }

    /// The files its process rules reward reading (`ReadsNeeded`), in rule order.
    pub fn needed_files(&self) -> Vec<String> {
        self.process_rules
            .iter()
            .flat_map(|r| match r {
                ProcessRule::ReadsNeeded { paths, .. } => paths.clone(),
                _ => Vec::new(),
            })
            .collect()
    }

    /// The reference stored in trajectory headers.
    pub fn task_ref(&self) -> TaskRef {
        TaskRef {
            family: self.family.clone(),
            level: self.level,
            seed: self.seed,
            spec_hash: self.spec_hash.clone(),
        }
    }

    /// Estimated tokens of the oracle episode with a byte-level tokenizer: bytes of the
    /// prompt, of every oracle call (Hermes format), of every tool output, and of the
    /// final `answer` call.
    pub fn oracle_tokens(&self) -> usize {
        self.prompt.len()
            + self
                .oracle
                .steps
                .iter()
                .map(|s| s.call_bytes() + s.output.len())
                .sum::<usize>()
            + self.oracle.answer_step().call_bytes()
    }

    /// Tool calls of the oracle plan, without the final `answer`.
    pub fn oracle_calls(&self) -> usize {
        self.oracle.steps.len()
    }
}

/// A procedural family of tasks with difficulty levels.
pub trait TaskFamily: Send + Sync {
    /// Family name (`hops`, `search`, `shell`, or a pack name).
    fn name(&self) -> &str;
    /// One line on what the family asks.
    fn description(&self) -> &str;
    /// Number of levels; levels are `1..=levels()`.
    fn levels(&self) -> u32;
    /// The instance for `level` and `seed`; deterministic.
    fn instance(&self, level: u32, seed: u64) -> Result<TaskInstance, TasksError>;
    /// Where `instance`'s needed facts lie and how densely distractors surround them, for
    /// the long-context evaluation. The default: the files its process rules reward reading,
    /// density unmeasured.
    fn fact_layout(&self, instance: &TaskInstance) -> FactLayout {
        FactLayout {
            fact_files: instance.needed_files(),
            distractor_density: None,
        }
    }
}

/// Where an instance's needed facts lie and how densely distractors surround them: what a
/// long-context evaluation breaks success down by (`corvid eval`'s `by_position` and
/// `by_density`).
#[derive(Debug, Clone, PartialEq)]
pub struct FactLayout {
    /// Workspace files holding the facts the answer needs; where an episode first reads one
    /// of them places it at the beginning, middle or end of the episode.
    pub fact_files: Vec<String>,
    /// Distractor lines per fact line in the files the oracle reads (decoy values, other
    /// chains' links, other accounts' entries); `None` where the family does not say.
    pub distractor_density: Option<f64>,
}

/// Checks `1 <= level <= max`, naming the family otherwise.
pub(crate) fn check_level(family: &str, level: u32, max: u32) -> Result<(), TasksError> {
    if level == 0 || level > max {
        return Err(TasksError::LevelOutOfRange {
            family: family.to_string(),
            level,
            max,
        });
    }
    Ok(())
}
