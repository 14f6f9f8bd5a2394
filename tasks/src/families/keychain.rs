//! `keychain`: variable assignments spread over a log of parts read in order, where the
//! answer is a variable's value at the end of the log (temporal order).
//!
//! Each part of `chain/part-NN.txt` holds `set <var> = <number>` and `set <var> = <var>`
//! lines, run in reading order (a copy takes the source's value at that line; copying a
//! variable not yet set changes nothing). The asked variable's value comes down a chain that
//! crosses every part: part 1 sets `c1`, part `i` copies `c(i−1)` into `ci`, and after each
//! copy the source is set again to a decoy, in the same part or a later one; the asked
//! variable is set to a decoy before its final copy. From level 2 two distractor chains of the
//! same shape start in part 1 too, and other variables, set and copied among themselves, fill
//! each part. So every part is needed, in order: skipping one, swapping two, or taking the
//! last number written to a chain variable gives a wrong answer, and part 1 alone names three
//! candidate values.
//!
//! Levels follow the log schedule ([`super::LOG_PARTS`], [`super::LOG_LINES`]): 1–8 the
//! built-in schedule (parts = main-chain calls), 9–12 past it toward long horizons, 24–64
//! parts.

use std::collections::{BTreeMap, BTreeSet};

use super::{part_path, part_paths, reading_instance, LOG_LINES, LOG_PARTS};
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

/// Chains in a log of more than one part: the asked one and distractors of the same shape,
/// so part 1 sets several chain starts and only following the copies tells them apart.
const CHAINS: usize = 3;

/// Filler variable names.
const FILLER_NAMES: usize = 12;

/// One chain's lines, part by part: `c1` set to `start` in part 1; part `i` copies `c(i−1)`
/// into `ci`, then `c(i−1)` gets a decoy (never `avoid`), in that part or a later one. The
/// last variable gets a decoy before its final copy. Returns the lines and the last name.
fn chain_lines(
    rng: &mut SplitMix64,
    names: &[String],
    start: i64,
    avoid: i64,
) -> (Vec<Vec<String>>, String) {
    let parts = names.len();
    let mut log: Vec<Vec<String>> = vec![Vec::new(); parts];
    log[0].push(format!("set {} = {start}", names[0]));
    for i in 1..parts {
        log[i].push(format!("set {} = {}", names[i], names[i - 1]));
        let later = i + rng.below((parts - i) as u64) as usize;
        let decoy = value(rng, &[avoid, start]);
        log[later].push(format!("set {} = {decoy}", names[i - 1]));
    }
    let last = names[parts - 1].clone();
    let decoy = value(rng, &[avoid, start]);
    if parts == 1 {
        // One part: the first value set is the decoy, the second the chain's value.
        log[0].insert(0, format!("set {last} = {decoy}"));
    } else {
        let at = rng.below((parts - 1) as u64) as usize;
        log[at].push(format!("set {last} = {decoy}"));
    }
    (log, last)
}

impl Log {
    fn new(rng: &mut SplitMix64, parts: usize, lines: usize) -> Self {
        let chains = if parts == 1 { 1 } else { CHAINS };
        let vars = names(rng, parts * chains + FILLER_NAMES);
        let (chain_names, others) = vars.split_at(parts * chains);
        let answer = rng.range(10_000, 99_999);
        // Each chain's lines, part by part; the first chain is the asked one.
        let mut per_chain = Vec::with_capacity(chains);
        let mut asked = String::new();
        for (j, names) in chain_names.chunks(parts).enumerate() {
            let start = if j == 0 {
                answer
            } else {
                value(rng, &[answer])
            };
            let (lines, last) = chain_lines(rng, names, start, answer);
            if j == 0 {
                asked = last;
            }
            per_chain.push(lines);
        }
        // Each part interleaves the chains' lines at random, each chain's in its order.
        let mut log: Vec<Vec<String>> = Vec::with_capacity(parts);
        for i in 0..parts {
            let mut queues: Vec<std::collections::VecDeque<String>> = per_chain
                .iter_mut()
                .map(|c| std::mem::take(&mut c[i]).into())
                .collect();
            let mut part = Vec::new();
            while queues.iter().any(|q| !q.is_empty()) {
                let live: Vec<usize> = (0..queues.len())
                    .filter(|&q| !queues[q].is_empty())
                    .collect();
                let q = live[rng.below(live.len() as u64) as usize];
                part.extend(queues[q].pop_front());
            }
            log.push(part);
        }
        // Filler: other variables, set and copied among themselves, placed at random lines
        // of each part; they never touch a chain.
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
            "Run the `set` lines of chain/ in order, part-01.txt first; a copy takes the value the source has at that line (none: no change). What is {} at the end?",
            log.asked
        );
        Ok(reading_instance(
            self.name(),
            (level, seed),
            prompt,
            files,
            (part_paths("chain", parts), None),
            part_paths("chain", parts),
            log.answer,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::{CHAIN_CALLS, READ_BYTES};

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
                let wrong = |got: Option<&i64>, how: &str| {
                    assert_ne!(
                        got.map(i64::to_string).as_deref(),
                        Some(t.oracle.answer.as_str()),
                        "{} {how}",
                        t.id
                    )
                };
                for k in 0..refs.len() {
                    // Skipping part k.
                    let mut some = refs.clone();
                    some.remove(k);
                    wrong(run_log(&some).get(&target), &format!("without part {k}"));
                    // Swapping parts k and k + 1.
                    if k + 1 < refs.len() {
                        let mut swapped = refs.clone();
                        swapped.swap(k, k + 1);
                        wrong(
                            run_log(&swapped).get(&target),
                            &format!("with parts {k}, {} swapped", k + 1),
                        );
                    }
                }
                // The last number written to the asked variable anywhere.
                let last = refs
                    .iter()
                    .rev()
                    .flat_map(|p| p.lines().rev())
                    .filter_map(|l| l.strip_prefix(&format!("set {target} = ")))
                    .find_map(|v| v.parse::<i64>().ok());
                wrong(last.as_ref(), "taking the last number written to it");
                // Part 1 alone: at least three variables set to numbers there are copied later.
                let later: String = refs[1..].concat();
                let starts = refs[0]
                    .lines()
                    .filter_map(|l| l.strip_prefix("set ")?.split_once(" = "))
                    .filter(|(var, v)| {
                        v.parse::<i64>().is_ok() && later.contains(&format!(" = {var}\n"))
                    })
                    .map(|(var, _)| var)
                    .collect::<std::collections::BTreeSet<_>>();
                assert!(starts.len() >= CHAINS, "{}: part 1 starts {starts:?}", t.id);
            }
        }
    }

    #[test]
    fn the_longest_level_reaches_64k_tokens() {
        let t = Keychain.instance(Keychain.levels(), 3).unwrap();
        assert!(t.oracle_tokens() >= 64_000, "{}", t.oracle_tokens());
    }
}
