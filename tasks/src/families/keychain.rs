//! `keychain`: variable assignments spread over a log of parts read in order, where the
//! answer is a variable's value at the end of the log (temporal order).
//!
//! Each part of `chain/part-NN.txt` holds `set <var> = <number>` and `set <var> = <var>`
//! lines, run in reading order (a copy takes the source's value at that line). The asked
//! variable's value comes down a chain that crosses every part: part 1 sets `c1`, part `i`
//! copies `c(i−1)` into `ci`, and after each copy the source is set again to a decoy, in the
//! same part or a later one. So every part is needed, in order, and the last value written
//! to a chain variable anywhere in the log is the wrong answer. The asked variable is also
//! set to a decoy before its final copy. Other variables, set and copied among themselves,
//! fill each part.
//!
//! Levels 1–8 follow the built-in schedule (parts = main-chain calls); levels 9–12 go past it
//! toward long horizons: 24–64 parts of up to 96 lines, 64K tokens at level 12.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::json;

use super::{budget_for, PlanBuilder, RECOVERY_FROM};
use crate::checker::Checker;
use crate::error::TasksError;
use crate::process::ProcessRule;
use crate::rng::SplitMix64;
use crate::task::{
    check_level, OraclePlan, ReadOnlyData, TaskFamily, TaskInstance, ToolLimits, ToolSpec,
};

/// Parts per level (index = level − 1): the built-in schedule, then longer logs.
const PARTS: [usize; 12] = [1, 2, 3, 4, 6, 8, 11, 16, 24, 32, 48, 64];
/// Lines per part, by level (the chain's lines included).
const LINES: [usize; 12] = [2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 80, 96];
/// Most bytes `read_file` shows per call; a part stays under it.
const READ_BYTES: u64 = 4096;

/// The `keychain` family.
#[derive(Debug, Clone, Copy, Default)]
pub struct Keychain;

/// A part's path: `chain/part-07.txt`.
fn part_path(i: usize) -> String {
    format!("chain/part-{:02}.txt", i + 1)
}

/// `n` distinct variable names: `k` and three letters.
fn names(rng: &mut SplitMix64, n: usize) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    while out.len() < n {
        let v = format!("k{}", rng.word(3));
        if v.chars().all(|c| c.is_ascii_lowercase()) && seen.insert(v.clone()) {
            out.push(v);
        }
    }
    out
}

/// A five-digit value other than every one in `avoid`.
fn value(rng: &mut SplitMix64, avoid: &[i64]) -> i64 {
    loop {
        let v = rng.range(10_000, 99_999);
        if !avoid.contains(&v) {
            return v;
        }
    }
}

/// The log's lines, part by part, and the asked variable's final value; every line is
/// `set <var> = <value or var>`.
struct Log {
    parts: Vec<Vec<String>>,
    asked: String,
    answer: i64,
}

impl Log {
    fn new(rng: &mut SplitMix64, parts: usize, lines: usize) -> Self {
        let vars = names(rng, parts + 4);
        let (chain, others) = vars.split_at(parts);
        let answer = rng.range(10_000, 99_999);
        let mut log: Vec<Vec<String>> = vec![Vec::new(); parts];
        // The chain: c1 is set in part 1; part i copies c(i−1) into ci, then c(i−1) gets a
        // decoy, here or in a later part.
        log[0].push(format!("set {} = {answer}", chain[0]));
        for i in 1..parts {
            log[i].push(format!("set {} = {}", chain[i], chain[i - 1]));
            let later = i + rng.below((parts - i) as u64) as usize;
            let decoy = value(rng, &[answer]);
            log[later].push(format!("set {} = {decoy}", chain[i - 1]));
        }
        let asked = chain[parts - 1].clone();
        // At one part the asked variable's decoy comes before its final assignment; with one
        // part, the first value set is the decoy and a second line sets the answer.
        if parts == 1 {
            let decoy = value(rng, &[answer]);
            log[0].insert(0, format!("set {asked} = {decoy}"));
        } else {
            let decoy = value(rng, &[answer]);
            let at = rng.below((parts - 1) as u64) as usize;
            log[at].push(format!("set {asked} = {decoy}"));
        }
        // Filler: the other variables, set and copied among themselves, placed at random
        // lines of each part; they never touch the chain.
        for part in log.iter_mut() {
            while part.len() < lines {
                let v = &others[rng.below(others.len() as u64) as usize];
                let line = if rng.below(3) == 0 {
                    let src = &others[rng.below(others.len() as u64) as usize];
                    format!("set {v} = {src}")
                } else {
                    format!("set {v} = {}", value(rng, &[answer]))
                };
                let at = rng.below(part.len() as u64 + 1) as usize;
                part.insert(at, line);
            }
        }
        Self {
            parts: log,
            asked,
            answer,
        }
    }
}

impl TaskFamily for Keychain {
    fn name(&self) -> &str {
        "keychain"
    }

    fn description(&self) -> &str {
        "run `set` lines across a log's parts in order and answer a variable's final value; levels add parts, lines and decoys"
    }

    fn levels(&self) -> u32 {
        PARTS.len() as u32
    }

    fn instance(&self, level: u32, seed: u64) -> Result<TaskInstance, TasksError> {
        check_level(self.name(), level, self.levels())?;
        let li = level as usize - 1;
        let parts = PARTS[li];
        let mut rng = SplitMix64::derive(seed, &format!("keychain/{level}"));
        let log = Log::new(&mut rng, parts, LINES[li]);
        let mut files = BTreeMap::new();
        let paths: Vec<String> = (0..parts).map(part_path).collect();
        for (p, lines) in paths.iter().zip(&log.parts) {
            files.insert(p.clone(), (lines.join("\n") + "\n").into_bytes());
        }
        let prompt = format!(
            "Run the `set` lines of chain/ in order, part-01.txt first; a copy takes the value the source has at that line. What is {} at the end?",
            log.asked
        );
        let no_corpus = Vec::new();
        let mut plan = PlanBuilder::new(&files, &no_corpus);
        for (i, p) in paths.iter().enumerate() {
            if level >= RECOVERY_FROM && i == 1.min(parts - 1) {
                // Recoverable failure: the path without its extension, then the fix.
                plan.call("read_file", json!({"path": p.trim_end_matches(".txt")}));
            }
            plan.call("read_file", json!({"path": p}));
        }
        let steps = plan.finish();
        let mut inst = TaskInstance {
            id: format!("keychain/L{level}/s{seed}"),
            family: "keychain".into(),
            level,
            seed,
            prompt,
            files,
            read_only: ReadOnlyData::default(),
            tools: vec![
                ToolSpec {
                    name: "read_file".into(),
                    limits: ToolLimits {
                        max_calls: Some(2 * parts as u32 + 4),
                        max_output_bytes: Some(READ_BYTES),
                    },
                },
                ToolSpec::unlimited("list_dir"),
                ToolSpec::unlimited("answer"),
            ],
            max_turns: parts as u32 + 4,
            context_budget: 0,
            checker: Checker::Exact {
                expected: log.answer.to_string(),
                case_insensitive: false,
            },
            process_rules: ProcessRule::defaults(paths),
            oracle: OraclePlan {
                steps,
                answer: log.answer.to_string(),
            },
            custom_tools: Vec::new(),
            spec_hash: String::new(),
        };
        inst.context_budget = budget_for(inst.oracle_tokens());
        Ok(inst.seal())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::CHAIN_CALLS;

    /// Runs `parts` in order; the final values of the variables set.
    fn run_log(parts: &[&str]) -> BTreeMap<String, i64> {
        let mut values: BTreeMap<String, i64> = BTreeMap::new();
        for text in parts {
            for line in text.lines() {
                let Some((var, rhs)) = line
                    .strip_prefix("set ")
                    .and_then(|rest| rest.split_once(" = "))
                else {
                    continue;
                };
                let v = match rhs.parse::<i64>() {
                    Ok(n) => Some(n),
                    Err(_) => values.get(rhs).copied(),
                };
                if let Some(v) = v {
                    values.insert(var.to_string(), v);
                }
            }
        }
        values
    }

    #[test]
    fn levels_1_to_8_follow_the_built_in_schedule() {
        assert_eq!(PARTS[..CHAIN_CALLS.len()], CHAIN_CALLS);
    }

    fn texts(t: &TaskInstance) -> Vec<String> {
        (0..t.files.len())
            .map(|i| String::from_utf8(t.files[&part_path(i)].clone()).unwrap())
            .collect()
    }

    fn asked(t: &TaskInstance) -> String {
        let rest = t.prompt.split("What is ").nth(1).unwrap();
        rest.strip_suffix(" at the end?").unwrap().to_string()
    }

    #[test]
    fn running_the_log_in_order_gives_the_answer_and_every_part_fits_one_read() {
        for level in 1..=Keychain.levels() {
            for seed in 0..20 {
                let t = Keychain.instance(level, seed).unwrap();
                let parts = texts(&t);
                assert_eq!(parts.len(), PARTS[level as usize - 1], "{}", t.id);
                let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
                let end = run_log(&refs);
                assert_eq!(end[&asked(&t)].to_string(), t.oracle.answer, "{}", t.id);
                assert!(
                    parts.iter().all(|p| p.len() as u64 <= READ_BYTES),
                    "{}",
                    t.id
                );
            }
        }
    }

    #[test]
    fn shortcuts_give_wrong_answers() {
        for level in 2..=Keychain.levels() {
            for seed in 0..20 {
                let t = Keychain.instance(level, seed).unwrap();
                let parts = texts(&t);
                let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
                let target = asked(&t);
                // Reading the parts in reverse order.
                let reversed: Vec<&str> = refs.iter().rev().copied().collect();
                let back = run_log(&reversed).get(&target).map(i64::to_string);
                assert_ne!(back.as_deref(), Some(t.oracle.answer.as_str()), "{}", t.id);
                // Skipping any one part.
                for skip in 0..refs.len() {
                    let mut some = refs.clone();
                    some.remove(skip);
                    let got = run_log(&some).get(&target).map(i64::to_string);
                    assert_ne!(
                        got.as_deref(),
                        Some(t.oracle.answer.as_str()),
                        "{} without part {skip}",
                        t.id
                    );
                }
            }
        }
    }

    #[test]
    fn the_longest_level_reaches_64k_tokens() {
        let t = Keychain.instance(Keychain.levels(), 3).unwrap();
        assert!(t.oracle_tokens() >= 64_000, "{}", t.oracle_tokens());
    }
}
