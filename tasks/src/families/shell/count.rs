//! `count`: how many lines contain `ERROR` across the log files under `logs/`.
//! Level 1 asks about one file and takes the answer (`grep -c`); from level 2 the total goes to
//! `report.txt`; from level 3 the files are discovered with `ls logs`.

use std::collections::BTreeMap;

use serde_json::json;

use super::{recover, sh, Parts};
use crate::checker::{Checker, FileExpectation};
use crate::families::{PlanBuilder, CHAIN_CALLS};
use crate::rng::SplitMix64;

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

/// Log files of a level: the main chain minus the `write_file` and `ls` calls.
fn file_count(level: u32) -> usize {
    let calls = CHAIN_CALLS[level as usize - 1];
    (calls - usize::from(level >= 2) - usize::from(level >= 3)).max(1)
}

pub(super) fn build(level: u32, recovery: bool, rng: &mut SplitMix64) -> Parts {
    let li = level as usize - 1;
    let mut files = BTreeMap::new();
    let mut total = 0usize;
    let mut paths = Vec::new();
    for f in 0..file_count(level) {
        let path = format!("logs/part-{f:02}.log");
        let mut lines = Vec::new();
        for l in 0..LINES[li] {
            // At least one ERROR per file so every grep succeeds.
            let sev = if l == 0 || rng.below(3) == 0 {
                total += 1;
                "ERROR"
            } else {
                *rng.pick(&["INFO", "WARN", "DEBUG"])
            };
            lines.push(format!(
                "2026-11-30T{:02}:{:02}:{:02} {sev} {}: {}",
                rng.below(24),
                rng.below(60),
                rng.below(60),
                rng.pick(&COMPONENTS),
                rng.pick(&MESSAGES)
            ));
        }
        rng.shuffle(&mut lines);
        files.insert(path.clone(), (lines.join("\n") + "\n").into_bytes());
        paths.push(path);
    }
    let answer = total.to_string();
    let prompt = match level {
        1 => format!(
            "How many lines of {} contain ERROR? Use the shell tool (grep), then call answer \
             with the number.",
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
    if recovery {
        recover(&mut plan, "logs/app.log", "logs");
    } else if level >= 3 {
        sh(&mut plan, "ls logs".into());
    }
    for p in &paths {
        // Level 1 only needs the number; longer levels show the lines.
        let flag = if level == 1 { "-c " } else { "" };
        sh(&mut plan, format!("grep {flag}ERROR {p}"));
    }
    if level >= 2 {
        plan.call(
            "write_file",
            json!({"path": "report.txt", "content": format!("{answer}\n")}),
        );
    }
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
    Parts {
        files,
        prompt,
        steps: plan.finish(),
        checker,
        answer,
        needed: paths,
    }
}
