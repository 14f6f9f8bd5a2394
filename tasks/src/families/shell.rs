//! `shell`: tasks solved with toolbox commands over generated files.
//!
//! Each instance has one *kind*, drawn from the seed as `KINDS[seed % 5]`, so every level
//! mixes kinds and seeds `0..5` cover all of them:
//! - `count`: count ERROR lines across log files (`grep`), write the total to `report.txt`;
//! - `find`: find the record file with an id (`grep -rl`), follow `next:` ids to the end
//!   of the chain, answer the last file's number;
//! - `stats`: the most requested path of each access log
//!   (`cut | sort | uniq -c | sort -rn`), written to `report.txt`;
//! - `csv`: keep the `name,score` columns of the rows of one city
//!   (`grep | cut > FILE`), one output file per input;
//! - [`config`]: list a config file's malformed lines with the check command
//!   (`grep -nvE`), repair them with `sed -i` until it lists none.
//!
//! Levels scale the work of the kind (files, hops, rows) so that the oracle's main chain
//! has about [`CHAIN_CALLS`]`[L−1]` calls: one call and ~200–400 tokens at level 1,
//! ≥ 16 calls and ≥ 8K tokens at level 8. From [`RECOVERY_FROM`] up the oracle first
//! guesses a file name that does not exist (the command fails), then lists the
//! directory and goes on (`recover`).

pub mod config;
mod count;
mod csv;
mod find;
mod stats;

use std::collections::BTreeMap;

use serde_json::json;

use super::{budget_for, PlanBuilder, CHAIN_CALLS, RECOVERY_FROM};
use crate::checker::Checker;
use crate::error::TasksError;
use crate::process::ProcessRule;
use crate::rng::SplitMix64;
use crate::task::{
    check_level, OraclePlan, OracleStep, ReadOnlyData, TaskFamily, TaskInstance, ToolSpec,
};

/// The kinds, indexed by `seed % 5`.
pub const KINDS: [&str; 5] = ["count", "find", "stats", "csv", "config"];

/// What a kind generates for one instance.
struct Parts {
    files: BTreeMap<String, Vec<u8>>,
    prompt: String,
    steps: Vec<OracleStep>,
    checker: Checker,
    answer: String,
    /// Files the solution must read (for [`ProcessRule::ReadsNeeded`]).
    needed: Vec<String>,
}

/// The recoverable failure: `cat` a guessed file that does not exist (exit 1), then
/// `ls` the directory to see the real names.
fn recover(plan: &mut PlanBuilder<'_>, guessed: &str, dir: &str) {
    plan.call("shell", json!({ "command": format!("cat {guessed}") }));
    debug_assert!(!plan.last_status().is_success());
    plan.call("shell", json!({ "command": format!("ls {dir}") }));
}

/// A shell call in a plan.
fn sh(plan: &mut PlanBuilder<'_>, command: String) -> String {
    plan.call("shell", json!({ "command": command }))
}

/// The kind of the instance for `seed`.
pub fn kind_of(seed: u64) -> &'static str {
    KINDS[(seed % KINDS.len() as u64) as usize]
}

/// The `shell` family.
#[derive(Debug, Clone, Copy, Default)]
pub struct Shell;

impl TaskFamily for Shell {
    fn name(&self) -> &str {
        "shell"
    }

    fn description(&self) -> &str {
        "toolbox commands over generated files: count matches, find a file by id, sort/uniq \
         statistics, CSV transforms, config repair (kind = seed mod 5)"
    }

    fn levels(&self) -> u32 {
        CHAIN_CALLS.len() as u32
    }

    fn instance(&self, level: u32, seed: u64) -> Result<TaskInstance, TasksError> {
        check_level(self.name(), level, self.levels())?;
        let kind = kind_of(seed);
        let mut rng = SplitMix64::derive(seed, &format!("shell/{kind}/{level}"));
        let recovery = level >= RECOVERY_FROM;
        let parts = match kind {
            "count" => count::build(level, recovery, &mut rng),
            "find" => find::build(level, recovery, &mut rng),
            "stats" => stats::build(level, recovery, &mut rng),
            "csv" => csv::build(level, recovery, &mut rng),
            _ => config::build(level, recovery, &mut rng),
        };
        let mut inst = TaskInstance {
            id: format!("shell/L{level}/s{seed}"),
            family: "shell".into(),
            level,
            seed,
            prompt: parts.prompt,
            files: parts.files,
            read_only: ReadOnlyData::default(),
            tools: ["shell", "read_file", "write_file", "list_dir", "answer"]
                .map(ToolSpec::unlimited)
                .to_vec(),
            max_turns: parts.steps.len() as u32 + 5,
            context_budget: 0,
            checker: parts.checker,
            process_rules: ProcessRule::defaults(parts.needed),
            oracle: OraclePlan {
                steps: parts.steps,
                answer: parts.answer,
            },
            custom_tools: Vec::new(),
            python: Default::default(),
            spec_hash: String::new(),
        };
        inst.context_budget = budget_for(inst.oracle_tokens());
        Ok(inst.seal())
    }
}
