//! `shell`: count matching log lines across files with `grep`, write the total to
//! `report.txt`. Levels add files and lines; level 1 answers directly, from level 2 the
//! total must be written to `report.txt` (checked on the final workspace), from level 3
//! the files must be discovered with `list_dir`.
//!
//! TODO(tasks issue): the other shell task kinds the issue lists (find the file with a
//! property, sort/uniq statistics, transform a CSV, repair a config until a check passes)
//! are not generated yet; the last one needs the sandbox-only `CommandExit` checker.

use std::collections::BTreeMap;

use serde_json::json;

use super::{budget_for, PlanBuilder, CHAIN_CALLS, RECOVERY_FROM};
use crate::checker::{Checker, FileExpectation};
use crate::error::TasksError;
use crate::process::ProcessRule;
use crate::rng::SplitMix64;
use crate::task::{check_level, OraclePlan, ReadOnlyData, TaskFamily, TaskInstance, ToolSpec};

/// Lines per log file, by level.
const LINES: [usize; 8] = [6, 8, 10, 12, 16, 20, 24, 28];
const COMPONENTS: [&str; 5] = ["db", "api", "auth", "cache", "queue"];
const MESSAGES: [&str; 6] = [
    "request took longer than expected",
    "connection reset by peer",
    "retrying operation",
    "user session refreshed",
    "config value reloaded",
    "slow disk detected",
];

/// The `shell` family.
#[derive(Debug, Clone, Copy, Default)]
pub struct Shell;

/// Log files of level `li + 1`: the main chain minus the `write_file` and `list_dir` calls.
fn file_count(level: u32) -> usize {
    let calls = CHAIN_CALLS[level as usize - 1];
    (calls - usize::from(level >= 2) - usize::from(level >= 3)).max(1)
}

impl TaskFamily for Shell {
    fn name(&self) -> &str {
        "shell"
    }

    fn description(&self) -> &str {
        "count ERROR lines across log files with grep and write the total to report.txt"
    }

    fn levels(&self) -> u32 {
        CHAIN_CALLS.len() as u32
    }

    fn instance(&self, level: u32, seed: u64) -> Result<TaskInstance, TasksError> {
        check_level(self.name(), level, self.levels())?;
        let li = level as usize - 1;
        let mut rng = SplitMix64::derive(seed, &format!("shell/{level}"));
        let n_files = file_count(level);
        let mut files = BTreeMap::new();
        let mut total = 0usize;
        let mut paths = Vec::new();
        for f in 0..n_files {
            let path = format!("logs/part-{f:02}.log");
            let mut text = String::new();
            for l in 0..LINES[li] {
                // At least one ERROR per file so every grep succeeds.
                let sev = if l == 0 || rng.below(3) == 0 {
                    total += 1;
                    "ERROR"
                } else {
                    *rng.pick(&["INFO", "WARN", "DEBUG"])
                };
                text.push_str(&format!(
                    "2026-11-30T{:02}:{:02}:{:02} {sev} {}: {}\n",
                    rng.below(24),
                    rng.below(60),
                    rng.below(60),
                    rng.pick(&COMPONENTS),
                    rng.pick(&MESSAGES)
                ));
            }
            // Shuffle lines so the first ERROR is not always first.
            let mut lines: Vec<&str> = text.lines().collect();
            rng.shuffle(&mut lines);
            files.insert(path.clone(), (lines.join("\n") + "\n").into_bytes());
            paths.push(path);
        }
        let answer = total.to_string();
        let prompt = match level {
            1 => format!(
                "How many lines of {} contain the word ERROR? Use the shell tool (grep), then call \
                 answer with the number.",
                paths[0]
            ),
            2 => format!(
                "Count the lines of {} that contain ERROR. Write the count to report.txt \
                 (just the number), then call answer with it.",
                paths[0]
            ),
            _ => "Count the lines containing ERROR across all log files under logs/. Write the \
                  total to report.txt (just the number), then call answer with it."
                .to_string(),
        };
        let mut plan = PlanBuilder::new(&files, &[]);
        if level >= RECOVERY_FROM {
            // Recoverable failure: a guessed file name that does not exist, then list_dir.
            plan.call("shell", json!({"command": "grep ERROR logs/app.log"}));
        }
        if level >= 3 {
            plan.call("list_dir", json!({"path": "logs"}));
        }
        for p in &paths {
            plan.call("shell", json!({"command": format!("grep ERROR {p}")}));
        }
        if level >= 2 {
            plan.call(
                "write_file",
                json!({"path": "report.txt", "content": format!("{answer}\n")}),
            );
        }
        debug_assert!(plan.last_status().is_success());
        let steps = plan.finish();
        let checker = if level == 1 {
            Checker::Numeric {
                expected: total as f64,
                tolerance: 0.0,
            }
        } else {
            Checker::FileState {
                files: BTreeMap::from([(
                    "report.txt".to_string(),
                    FileExpectation::Equals {
                        text: answer.clone(),
                    },
                )]),
            }
        };
        let mut inst = TaskInstance {
            id: format!("shell/L{level}/s{seed}"),
            family: "shell".into(),
            level,
            seed,
            prompt,
            files,
            read_only: ReadOnlyData::default(),
            tools: ["shell", "read_file", "write_file", "list_dir", "answer"]
                .map(ToolSpec::unlimited)
                .to_vec(),
            max_turns: CHAIN_CALLS[li] as u32 + 5,
            context_budget: 0,
            checker,
            process_rules: ProcessRule::defaults(paths),
            oracle: OraclePlan { steps, answer },
            spec_hash: String::new(),
        };
        inst.context_budget = budget_for(inst.oracle_tokens());
        Ok(inst.seal())
    }
}
