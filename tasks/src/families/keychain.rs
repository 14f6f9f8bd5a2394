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
//! Levels follow the log schedule ([`super::LOG_PARTS`], [`super::LOG_LINES`]): 1–8 the
//! built-in schedule (parts = main-chain calls), 9–12 past it toward long horizons, 24–64
//! parts of up to 96 lines, ~108K tokens at level 12.

use std::collections::{BTreeMap, BTreeSet};

use super::{log_instance, part_path, LOG_LINES, LOG_PARTS};
use crate::error::TasksError;
use crate::rng::SplitMix64;
use crate::task::{check_level, TaskFamily, TaskInstance};

/// The `keychain` family.
#[derive(Debug, Clone, Copy, Default)]
pub struct Keychain;

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
        LOG_PARTS.len() as u32
    }

    fn instance(&self, level: u32, seed: u64) -> Result<TaskInstance, TasksError> {
        check_level(self.name(), level, self.levels())?;
        let li = level as usize - 1;
        let parts = LOG_PARTS[li];
        let mut rng = SplitMix64::derive(seed, &format!("keychain/{level}"));
        let log = Log::new(&mut rng, parts, LOG_LINES[li]);
        let mut files = BTreeMap::new();
        for (i, lines) in log.parts.iter().enumerate() {
            files.insert(
                part_path("chain", i),
                (lines.join("\n") + "\n").into_bytes(),
            );
        }
        let prompt = format!(
            "Run the `set` lines of chain/ in order, part-01.txt first; a copy takes the value the source has at that line. What is {} at the end?",
            log.asked
        );
        Ok(log_instance(
            self.name(),
            level,
            seed,
            prompt,
            files,
            "chain",
            log.answer,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::{CHAIN_CALLS, LOG_READ_BYTES};

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
        assert_eq!(LOG_PARTS[..CHAIN_CALLS.len()], CHAIN_CALLS);
    }

    fn texts(t: &TaskInstance) -> Vec<String> {
        (0..t.files.len())
            .map(|i| String::from_utf8(t.files[&part_path("chain", i)].clone()).unwrap())
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
                assert_eq!(parts.len(), LOG_PARTS[level as usize - 1], "{}", t.id);
                let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
                let end = run_log(&refs);
                assert_eq!(end[&asked(&t)].to_string(), t.oracle.answer, "{}", t.id);
                assert!(
                    parts.iter().all(|p| p.len() as u64 <= LOG_READ_BYTES),
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
