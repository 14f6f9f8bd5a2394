//! `ledger`: an aggregate over a long log that is read in parts — how many entries one
//! account has, or the sum of its amounts. Every part holds some of the account's entries
//! among other accounts', so every part is needed; a policy whose window cannot hold the
//! whole log must carry a running result. The oracle does: after each part but the last it
//! writes the total so far to `notes.md` (what a `notes` fold carries into a new segment).
//!
//! Levels follow `keychain`'s log schedule ([`super::LOG_PARTS`], [`super::LOG_LINES`]):
//! 1–8 the built-in schedule, 9–12 up to 64 parts.

use std::collections::{BTreeMap, BTreeSet};

use super::{part_path, part_paths, reading_instance, LOG_LINES, LOG_PARTS, NOTES_PATH};
use crate::error::TasksError;
use crate::rng::SplitMix64;
use crate::task::{check_level, FactLayout, TaskFamily, TaskInstance};

/// The `ledger` family.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ledger;

/// What is asked about the account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ask {
    /// How many entries it has.
    Count,
    /// The sum of its amounts.
    Sum,
}

/// `n` distinct account names: `acct-` and three letters.
fn accounts(rng: &mut SplitMix64, n: usize) -> Vec<String> {
    let mut seen = BTreeSet::new();
    while seen.len() < n {
        let w = rng.word(3);
        if w.chars().all(|c| c.is_ascii_lowercase()) {
            seen.insert(format!("acct-{w}"));
        }
    }
    let mut out: Vec<String> = seen.into_iter().collect();
    rng.shuffle(&mut out);
    out
}

/// An entry line: the account and a signed amount, never zero; `credit_only` keeps it
/// positive.
fn entry(rng: &mut SplitMix64, account: &str, credit_only: bool) -> (String, i64) {
    let magnitude = rng.range(1, 999);
    let amount = if !credit_only && rng.below(4) == 0 {
        -magnitude
    } else {
        magnitude
    };
    (format!("{account} {amount:+}"), amount)
}

impl TaskFamily for Ledger {
    fn name(&self) -> &str {
        "ledger"
    }

    fn description(&self) -> &str {
        "count one account's entries, or sum its amounts, over a log read in parts; levels add parts and lines"
    }

    fn levels(&self) -> u32 {
        LOG_PARTS.len() as u32
    }

    fn instance(&self, level: u32, seed: u64) -> Result<TaskInstance, TasksError> {
        check_level(self.name(), level, self.levels())?;
        let li = level as usize - 1;
        let (parts, lines) = (LOG_PARTS[li], LOG_LINES[li]);
        let mut rng = SplitMix64::derive(seed, &format!("ledger/{level}"));
        let names = accounts(&mut rng, 6);
        let (asked, others) = (&names[0], &names[1..]);
        let ask = if seed.is_multiple_of(2) {
            Ask::Count
        } else {
            Ask::Sum
        };
        let (mut count, mut sum) = (0i64, 0i64);
        let mut files = BTreeMap::new();
        let mut notes = Vec::with_capacity(parts.saturating_sub(1));
        for i in 0..parts {
            // One to three of the asked account's entries in every part, the rest others'.
            let own = 1 + rng.below(3.min(lines as u64)) as usize;
            let mut text: Vec<String> = Vec::with_capacity(lines);
            for _ in 0..lines - own {
                let other = &others[rng.below(others.len() as u64) as usize];
                text.push(entry(&mut rng, other, false).0);
            }
            // The asked account's amounts are positive, so no part's share, and no total,
            // is zero: leaving out any part changes the answer.
            for _ in 0..own {
                let (line, amount) = entry(&mut rng, asked, true);
                count += 1;
                sum += amount;
                let at = rng.below(text.len() as u64 + 1) as usize;
                text.insert(at, line);
            }
            files.insert(
                part_path("ledger", i),
                (text.join("\n") + "\n").into_bytes(),
            );
            if i + 1 < parts {
                let so_far = match ask {
                    Ask::Count => format!("{count} entries"),
                    Ask::Sum => format!("sum {sum}"),
                };
                notes.push(format!(
                    "{asked}: parts 1-{} of {parts} read, {so_far} so far\n",
                    i + 1
                ));
            }
        }
        let (question, answer) = match ask {
            Ask::Count => (format!("How many entries does {asked} have?"), count),
            Ask::Sum => (format!("What is the sum of {asked}'s amounts?"), sum),
        };
        let prompt = format!(
            "The ledger is in ledger/, part-01.txt to part-{parts:02}.txt, one `<account> <amount>` entry per line; keep your running total in {NOTES_PATH}. {question}"
        );
        Ok(reading_instance(
            self.name(),
            (level, seed),
            prompt,
            files,
            (part_paths("ledger", parts), Some(notes)),
            part_paths("ledger", parts),
            answer,
        ))
    }

    /// Every part holds some of the asked account's entries; the distractors are the other
    /// accounts' entries, per asked entry.
    fn fact_layout(&self, instance: &TaskInstance) -> FactLayout {
        let asked = instance
            .prompt
            .split(|c: char| c.is_whitespace() || c == '\'' || c == '?')
            .find(|w| w.starts_with("acct-"))
            .unwrap_or_default();
        let (mut own, mut other) = (0usize, 0usize);
        for text in instance.files.values() {
            for line in String::from_utf8_lossy(text).lines() {
                if line.split(' ').next() == Some(asked) {
                    own += 1;
                } else {
                    other += 1;
                }
            }
        }
        FactLayout {
            fact_files: instance.needed_files(),
            distractor_density: Some(other as f64 / own.max(1) as f64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::READ_BYTES;

    /// The asked account and the total the prompt asks for, over the parts `keep` selects.
    fn total(t: &TaskInstance, keep: impl Fn(usize) -> bool) -> i64 {
        let asked = t
            .prompt
            .split_whitespace()
            .find(|w| w.starts_with("acct-"))
            .unwrap();
        let asked = asked.trim_end_matches("'s");
        let counting = t.prompt.contains("How many");
        let mut out = 0;
        for i in (0..t.files.len()).filter(|&i| keep(i)) {
            let text = String::from_utf8(t.files[&part_path("ledger", i)].clone()).unwrap();
            for line in text.lines() {
                let (account, amount) = line.split_once(' ').unwrap();
                if account == asked {
                    out += if counting {
                        1
                    } else {
                        amount.parse::<i64>().unwrap()
                    };
                }
            }
        }
        out
    }

    #[test]
    fn the_answer_is_the_total_over_every_part_and_none_can_be_left_out() {
        for level in 1..=Ledger.levels() {
            for seed in 0..20 {
                let t = Ledger.instance(level, seed).unwrap();
                assert_eq!(t.files.len(), LOG_PARTS[level as usize - 1], "{}", t.id);
                assert_eq!(total(&t, |_| true).to_string(), t.oracle.answer, "{}", t.id);
                for skip in 0..t.files.len() {
                    let partial = total(&t, |i| i != skip).to_string();
                    assert_ne!(partial, t.oracle.answer, "{} without part {skip}", t.id);
                }
                let bytes = t.files.values().map(Vec::len).max().unwrap() as u64;
                assert!(bytes <= READ_BYTES, "{}", t.id);
            }
        }
    }

    /// The oracle reads part by part and notes the total so far after each but the last: the
    /// note after part `k` is the total over parts 1..=k.
    #[test]
    fn the_oracle_notes_the_running_total_after_each_part() {
        for (level, seed) in [(1, 3), (5, 4), (12, 7)] {
            let t = Ledger.instance(level, seed).unwrap();
            let parts = t.files.len();
            let writes: Vec<&str> = t
                .oracle
                .steps
                .iter()
                .filter(|s| s.name == "write_file")
                .map(|s| s.arguments["content"].as_str().unwrap())
                .collect();
            assert_eq!(writes.len(), parts - 1, "{}", t.id);
            for (k, note) in writes.iter().enumerate() {
                let so_far = total(&t, |i| i <= k);
                assert!(
                    note.contains(&format!("parts 1-{} of {parts}", k + 1))
                        && note.contains(&format!(" {so_far} ")),
                    "{}: {note}",
                    t.id
                );
            }
            assert!(t.tools.iter().any(|x| x.name == "write_file"));
            assert!((t.oracle_calls() as u32) < t.max_turns);
        }
    }

    #[test]
    fn the_density_is_other_entries_per_asked_entry() {
        for (level, seed) in [(1, 2), (6, 4), (12, 6)] {
            let t = Ledger.instance(level, seed).unwrap();
            let lines: usize = t
                .files
                .values()
                .map(|f| f.iter().filter(|&&b| b == b'\n').count())
                .sum();
            // Even seeds count: the answer is the number of the asked account's entries.
            assert!(t.prompt.contains("How many"), "{}", t.id);
            let own: usize = t.oracle.answer.parse().unwrap();
            let layout = Ledger.fact_layout(&t);
            assert_eq!(
                layout.distractor_density,
                Some((lines - own) as f64 / own as f64),
                "{}",
                t.id
            );
            assert_eq!(layout.fact_files.len(), t.files.len());
        }
    }

    #[test]
    fn even_seeds_count_and_odd_seeds_sum() {
        assert!(Ledger
            .instance(3, 4)
            .unwrap()
            .prompt
            .contains("How many entries"));
        assert!(Ledger
            .instance(3, 5)
            .unwrap()
            .prompt
            .contains("What is the sum"));
    }
}
