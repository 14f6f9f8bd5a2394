//! `stats`: access logs under `logs/`, one request per line
//! (`IP - METHOD PATH STATUS MS "AGENT"`). Level 1 asks how often the most requested path
//! of one log was requested; from level 2 each log's most requested path and its count
//! go to `report.txt`, one `FILE PATH COUNT` line per log. The oracle counts with
//! `cut -d ' ' -f 4 | sort | uniq -c | sort -rn`, and from level 3 looks at a log's
//! first lines before counting it.

use std::collections::BTreeMap;

use serde_json::json;

use super::{recover, sh, Parts};
use crate::checker::{Checker, FileExpectation};
use crate::families::PlanBuilder;
use crate::rng::SplitMix64;

/// Log files, by level.
const FILES: [usize; 8] = [1, 1, 1, 1, 2, 3, 5, 7];
/// Requests per log, by level.
const LINES: [usize; 8] = [10, 14, 18, 24, 30, 36, 44, 52];
/// Distinct paths, by level.
const PATHS: [usize; 8] = [4, 5, 6, 8, 10, 12, 16, 20];
const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
const RESOURCES: [&str; 10] = [
    "orders", "users", "invoices", "carts", "search", "reports", "tokens", "items", "stock",
    "prices",
];
const ACTIONS: [&str; 4] = ["list", "get", "update", "export"];
const AGENTS: [&str; 3] = ["corvid-client/1.2", "curl/8.4", "probe/0.9"];

pub(super) fn build(level: u32, recovery: bool, rng: &mut SplitMix64) -> Parts {
    let li = level as usize - 1;
    let mut vocab: Vec<String> = Vec::new();
    while vocab.len() < PATHS[li] {
        let p = format!(
            "/api/v{}/{}/{}",
            rng.range(1, 2),
            rng.pick(&RESOURCES),
            rng.pick(&ACTIONS)
        );
        if !vocab.contains(&p) {
            vocab.push(p);
        }
    }
    let mut files = BTreeMap::new();
    let mut rows = Vec::new();
    let mut paths = Vec::new();
    let mut sum = 0usize;
    for day in DAYS.iter().take(FILES[li]) {
        let file = format!("logs/access-{day}.log");
        // Requests: uniform paths, then extra hits for one path until it is the unique top.
        let mut hits: Vec<&String> = (0..LINES[li]).map(|_| rng.pick(&vocab)).collect();
        let top = rng.pick(&vocab);
        loop {
            let n = |p: &String| hits.iter().filter(|h| **h == p).count();
            if vocab.iter().all(|p| p == top || n(p) < n(top)) {
                break;
            }
            hits.push(top);
        }
        rng.shuffle(&mut hits);
        let text: String = hits
            .iter()
            .map(|p| {
                format!(
                    "10.0.{}.{} - {} {p} {} {} \"{}\"\n",
                    rng.below(8),
                    rng.range(2, 254),
                    rng.pick(&["GET", "GET", "POST"]),
                    rng.pick(&[200, 200, 200, 404, 500]),
                    rng.range(3, 900),
                    rng.pick(&AGENTS)
                )
            })
            .collect();
        let count = hits.iter().filter(|h| **h == top).count();
        sum += count;
        rows.push(format!("{file} {top} {count}"));
        files.insert(file.clone(), text.into_bytes());
        paths.push(file);
    }
    let report = rows.join("\n") + "\n";
    let (prompt, answer, checker) = if level == 1 {
        let count = sum;
        (
            format!(
                "Lines of {} read `IP - METHOD PATH STATUS MS \"AGENT\"`. How often was its \
                 most requested PATH requested? Use the shell tool (cut, sort, uniq), then \
                 answer with the number.",
                paths[0]
            ),
            count.to_string(),
            Checker::Numeric {
                expected: count as f64,
                tolerance: 0.0,
            },
        )
    } else {
        (
            format!(
                "The access logs under logs/ ({}) have one request per line: `IP - METHOD PATH \
                 STATUS MS \"AGENT\"`. For each log, find its most requested PATH. Write \
                 report.txt with one line per log, in the order listed: `FILE PATH COUNT` \
                 (e.g. `logs/access-mon.log /api/v1/users/get 7`). Then call answer with the \
                 sum of the counts. Use the shell tool (cut, sort, uniq).",
                paths.join(", ")
            ),
            sum.to_string(),
            Checker::FileState {
                files: BTreeMap::from([(
                    "report.txt".to_string(),
                    FileExpectation::Equals {
                        text: report.clone(),
                    },
                )]),
            },
        )
    };
    let mut plan = PlanBuilder::new(&files, &[]);
    if recovery {
        recover(&mut plan, "logs/access.log", "logs");
    }
    for p in &paths {
        if level >= 3 {
            sh(&mut plan, format!("head -n 5 {p}"));
        }
        // Level 1 only needs the top line.
        let head = if level == 1 { " | head -n 1" } else { "" };
        sh(
            &mut plan,
            format!("cut -d ' ' -f 4 {p} | sort | uniq -c | sort -rn{head}"),
        );
    }
    if level >= 2 {
        plan.call(
            "write_file",
            json!({"path": "report.txt", "content": report}),
        );
    }
    Parts {
        files,
        prompt,
        steps: plan.finish(),
        checker,
        answer,
        needed: paths,
    }
}
