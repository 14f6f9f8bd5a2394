//! The built-in families: `hops`, `search`, `shell`, the log-reading `keychain`,
//! `ledger`, `needles` and `recall`, and the code families `pyfix` and `pydata`, whose
//! oracles only the real sandbox runs (the simulator has no Python).
//!
//! The first six share one length schedule for levels 1–8 (the log-reading ones go on to
//! level 12): the main chain of level `L` needs [`CHAIN_CALLS`]`[L−1]` tool calls (1, 2, 3,
//! 4, 6, 8, 11, 16 — roughly ×1.5 per level); `recall` reads one file more and writes one
//! note. From [`RECOVERY_FROM`] up every oracle adds one recoverable failure (a call that
//! fails, then the fix), so demonstrations teach recovery.

mod hops;
mod keychain;
mod ledger;
mod needles;
mod pydata;
mod pyfix;
mod recall;
mod search;
pub mod shell;

pub use hops::Hops;
pub use keychain::Keychain;
pub use ledger::Ledger;
pub use needles::Needles;
pub use pydata::PyData;
pub use pyfix::PyFix;
pub use recall::Recall;
pub use search::Search;
pub use shell::Shell;

use std::collections::BTreeMap;

use serde_json::json;

use corvid_proto::ToolStatus;

use crate::checker::Checker;
use crate::error::TasksError;
use crate::process::ProcessRule;
use crate::sim::Simulator;
use crate::task::{
    Document, OraclePlan, OracleStep, ReadOnlyData, TaskFamily, TaskInstance, ToolSpec,
};

/// Main-chain tool calls per level (index = level − 1).
pub const CHAIN_CALLS: [usize; 8] = [1, 2, 3, 4, 6, 8, 11, 16];

/// The first level whose oracle includes a recoverable failure.
pub const RECOVERY_FROM: u32 = 4;

/// Every built-in family.
pub fn builtin_families() -> Vec<Box<dyn TaskFamily>> {
    vec![
        Box::new(Hops),
        Box::new(Search),
        Box::new(Shell),
        Box::new(Keychain),
        Box::new(Ledger),
        Box::new(Needles),
        Box::new(Recall),
        Box::new(PyFix),
        Box::new(PyData),
    ]
}

/// The names of the built-in families, in [`builtin_families`] order.
pub fn builtin_names() -> Vec<String> {
    builtin_families()
        .iter()
        .map(|f| f.name().to_string())
        .collect()
}

/// The built-in family called `name`.
pub fn builtin_family(name: &str) -> Result<Box<dyn TaskFamily>, TasksError> {
    builtin_families()
        .into_iter()
        .find(|f| f.name() == name)
        .ok_or_else(|| TasksError::UnknownFamily {
            name: name.to_string(),
            known: builtin_names().join(", "),
        })
}

/// Builds oracle steps by running each call in the reference simulator, so that the
/// recorded outputs are exactly what the files produce.
pub(crate) struct PlanBuilder<'a> {
    sim: Simulator<'a>,
    steps: Vec<OracleStep>,
}

impl<'a> PlanBuilder<'a> {
    pub(crate) fn new(files: &BTreeMap<String, Vec<u8>>, corpus: &'a [Document]) -> Self {
        Self {
            sim: Simulator::new(files.clone(), corpus),
            steps: Vec::new(),
        }
    }

    /// Adds a call and returns its output.
    pub(crate) fn call(&mut self, name: &str, arguments: serde_json::Value) -> String {
        let (expect, output) = self.sim.call(name, &arguments);
        self.steps.push(OracleStep {
            name: name.to_string(),
            arguments,
            expect,
            output: output.clone(),
        });
        output
    }

    /// Adds a call to a tool the simulator cannot run (a pack's own WASI tool, `python`):
    /// it is expected to end with `expect`, and `output` is what the family knows it prints
    /// (empty where only the real sandbox knows). The simulated workspace does not see
    /// anything the tool writes.
    pub(crate) fn external(
        &mut self,
        name: &str,
        arguments: serde_json::Value,
        expect: ToolStatus,
        output: String,
    ) {
        self.steps.push(OracleStep {
            name: name.to_string(),
            arguments,
            expect,
            output,
        });
    }

    pub(crate) fn last_status(&self) -> ToolStatus {
        self.steps
            .last()
            .map(|s| s.expect)
            .unwrap_or(ToolStatus::Ok)
    }

    pub(crate) fn finish(self) -> Vec<OracleStep> {
        self.steps
    }
}

/// A random path like `k4/yixz.txt`: a letter and a digit, then 3–5 characters (`hops` and
/// `recall` chain files).
pub(crate) fn random_path(rng: &mut crate::rng::SplitMix64) -> String {
    let letter = (b'a' + rng.below(26) as u8) as char;
    let digit = rng.below(10);
    let len = rng.range(3, 5) as usize;
    format!("{letter}{digit}/{}.txt", rng.word(len))
}

/// Filler text of about `bytes` bytes, in lines of a few pseudo-words, none of which
/// contains `next:`, `value:` or an upper-case word (so it never collides with a marker).
pub(crate) fn filler(rng: &mut crate::rng::SplitMix64, bytes: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut total = 0;
    while total < bytes {
        let n = rng.range(3, 7) as usize;
        let line: Vec<String> = (0..n)
            .map(|_| {
                let len = rng.range(2, 8) as usize;
                rng.word(len)
                    .chars()
                    .filter(|c| c.is_ascii_lowercase())
                    .collect::<String>()
            })
            .filter(|w| !w.is_empty())
            .collect();
        let line = line.join(" ");
        total += line.len() + 1;
        lines.push(line);
    }
    lines
}

/// A context budget comfortably above the oracle's tokens: twice, rounded up to 1024.
pub(crate) fn budget_for(tokens: usize) -> u32 {
    (((tokens * 2).div_ceil(1024)).max(1) * 1024) as u32
}

/// Parts of a log-reading family's log per level (index = level − 1): the main-chain
/// schedule for levels 1–8, then longer logs toward episodes past a context window.
pub(crate) const LOG_PARTS: [usize; 12] = [1, 2, 3, 4, 6, 8, 11, 16, 24, 32, 48, 64];

/// Lines per part of a log-reading family, by level.
pub(crate) const LOG_LINES: [usize; 12] = [2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 80, 96];

/// Most bytes `read_file` shows per call in the file-reading families; a file stays under it.
pub(crate) const READ_BYTES: u64 = 4096;

/// Part `i` (0-based) of the log in `dir`: `dir/part-07.txt`.
pub(crate) fn part_path(dir: &str, i: usize) -> String {
    format!("{dir}/part-{:02}.txt", i + 1)
}

/// The `n` parts of the log in `dir`, in reading order.
pub(crate) fn part_paths(dir: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| part_path(dir, i)).collect()
}

/// The workspace file the log-reading families' oracles keep their running notes in (what
/// a `notes` fold carries: `[rollout.context] notes_path`'s default).
pub(crate) const NOTES_PATH: &str = "notes.md";

/// A task solved by reading files: the oracle reads `reads` in order (from
/// [`RECOVERY_FROM`], the second one's path without its extension first fails, then the
/// fix), after read `i` writes `notes[i]` to [`NOTES_PATH`] where there is one, then answers
/// `answer`, checked exactly. `read_file` may be called twice per read and four times more;
/// with notes, `write_file` is allowed (once per read and four times more); reading the files
/// in `needed` earns the default process rewards.
pub(crate) fn reading_instance(
    family: &str,
    (level, seed): (u32, u64),
    prompt: String,
    files: BTreeMap<String, Vec<u8>>,
    (reads, notes): (Vec<String>, Option<Vec<String>>),
    needed: Vec<String>,
    answer: i64,
) -> TaskInstance {
    debug_assert!(reads
        .iter()
        .all(|p| files.get(p).is_some_and(|f| f.len() as u64 <= READ_BYTES)));
    let no_corpus = Vec::new();
    let mut plan = PlanBuilder::new(&files, &no_corpus);
    for (i, p) in reads.iter().enumerate() {
        if level >= RECOVERY_FROM && i == 1.min(reads.len() - 1) {
            plan.call("read_file", json!({"path": p.trim_end_matches(".txt")}));
        }
        plan.call("read_file", json!({"path": p}));
        if let Some(note) = notes.as_ref().and_then(|n| n.get(i)) {
            plan.call("write_file", json!({"path": NOTES_PATH, "content": note}));
        }
    }
    let steps = plan.finish();
    let n = reads.len() as u32;
    let writes = notes.as_ref().map_or(0, |n| n.len() as u32);
    let mut inst = TaskInstance {
        id: format!("{family}/L{level}/s{seed}"),
        family: family.into(),
        level,
        seed,
        prompt,
        files,
        read_only: ReadOnlyData::default(),
        tools: vec![
            ToolSpec::limited("read_file", 2 * n + 4, Some(READ_BYTES)),
            ToolSpec::unlimited("list_dir"),
            ToolSpec::unlimited("answer"),
        ],
        max_turns: n + writes + 4,
        context_budget: 0,
        checker: Checker::Exact {
            expected: answer.to_string(),
            case_insensitive: false,
        },
        process_rules: ProcessRule::defaults(needed),
        oracle: OraclePlan {
            steps,
            answer: answer.to_string(),
        },
        custom_tools: Vec::new(),
        python: Default::default(),
        spec_hash: String::new(),
    };
    if notes.is_some() {
        inst.tools
            .insert(1, ToolSpec::limited("write_file", n + 4, None));
    }
    inst.context_budget = budget_for(inst.oracle_tokens());
    inst.seal()
}
