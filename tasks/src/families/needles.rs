//! `needles`: multi-hop facts scattered through notes among distractor facts. Each line of
//! `notes/part-NN.txt` is a link `<name> => <name or number>`; the question starts at one
//! name and follows `k` links to a number. The links of the asked chain sit at random places
//! in random parts, among other chains of the same shape that end at other numbers; nothing
//! says which part holds a link, so the notes are read and the links joined. Reading the
//! parts that hold the asked links earns the process rewards.
//!
//! Levels follow the log schedule ([`super::LOG_PARTS`], [`super::LOG_LINES`]) and raise the
//! hops `k` ([`HOPS`]) with the parts and the distractor lines.

use std::collections::{BTreeMap, BTreeSet};

use super::{part_path, part_paths, reading_instance, LOG_LINES, LOG_PARTS};
use crate::error::TasksError;
use crate::rng::SplitMix64;
use crate::task::{check_level, FactLayout, TaskFamily, TaskInstance};

/// Links in the asked chain, by level.
const HOPS: [usize; 12] = [1, 1, 2, 2, 3, 3, 4, 4, 5, 6, 7, 8];

/// The `needles` family.
#[derive(Debug, Clone, Copy, Default)]
pub struct Needles;

/// Fresh names (two words joined by `-`) not yet in `used`.
fn name(rng: &mut SplitMix64, used: &mut BTreeSet<String>) -> String {
    loop {
        let (a, b) = (rng.word(4), rng.word(3));
        let n = format!("{a}-{b}");
        if n.chars().all(|c| c.is_ascii_lowercase() || c == '-') && used.insert(n.clone()) {
            return n;
        }
    }
}

/// A chain of `hops` links from a fresh name to `end`: its lines, start first.
fn chain(rng: &mut SplitMix64, used: &mut BTreeSet<String>, hops: usize, end: i64) -> Vec<String> {
    let names: Vec<String> = (0..hops).map(|_| name(rng, used)).collect();
    let mut lines: Vec<String> = names
        .windows(2)
        .map(|w| format!("{} => {}", w[0], w[1]))
        .collect();
    lines.push(format!("{} => {end}", names[hops - 1]));
    lines
}

impl TaskFamily for Needles {
    fn name(&self) -> &str {
        "needles"
    }

    fn description(&self) -> &str {
        "follow `name => name` links scattered through notes to a number; levels add hops, parts and distractor links"
    }

    fn levels(&self) -> u32 {
        LOG_PARTS.len() as u32
    }

    fn instance(&self, level: u32, seed: u64) -> Result<TaskInstance, TasksError> {
        check_level(self.name(), level, self.levels())?;
        let li = level as usize - 1;
        let (parts, lines, hops) = (LOG_PARTS[li], LOG_LINES[li], HOPS[li]);
        let mut rng = SplitMix64::derive(seed, &format!("needles/{level}"));
        let mut used = BTreeSet::new();
        let answer = rng.range(10_000, 99_999);
        let asked = chain(&mut rng, &mut used, hops, answer);
        let start = asked[0]
            .split(" => ")
            .next()
            .unwrap_or_default()
            .to_string();
        // Distractor chains of the same length, each ending at another number, until the
        // notes hold `lines` links a part.
        let mut all = asked.clone();
        while all.len() + hops <= parts * lines {
            let mut end = rng.range(10_000, 99_999);
            if end == answer {
                end += 1;
            }
            all.extend(chain(&mut rng, &mut used, hops, end));
        }
        rng.shuffle(&mut all);
        let mut files = BTreeMap::new();
        let mut needed = Vec::new();
        for i in 0..parts {
            let part = &all[i * all.len() / parts..(i + 1) * all.len() / parts];
            let path = part_path("notes", i);
            if part.iter().any(|l| asked.contains(l)) {
                needed.push(path.clone());
            }
            files.insert(path, (part.join("\n") + "\n").into_bytes());
        }
        let prompt = format!(
            "The notes in notes/ (part-01.txt to part-{:02}.txt) hold `a => b` links. Start at {start} and follow {hops} link{}: what number do you reach?",
            files.len(),
            if hops == 1 { "" } else { "s" }
        );
        Ok(reading_instance(
            self.name(),
            (level, seed),
            prompt,
            files,
            (part_paths("notes", parts), None),
            needed,
            answer,
        ))
    }

    /// The facts are the parts holding the asked links (the process rules' files); the
    /// distractors are the other chains' links, per asked link.
    fn fact_layout(&self, instance: &TaskInstance) -> FactLayout {
        let hops = HOPS[instance.level as usize - 1];
        let links: usize = instance
            .files
            .values()
            .map(|text| text.iter().filter(|&&b| b == b'\n').count())
            .sum();
        FactLayout {
            distractor_density: Some(links.saturating_sub(hops) as f64 / hops as f64),
            fact_files: instance.needed_files(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::READ_BYTES;

    /// Follows `hops` links from `start` through every line of `files`.
    fn follow(files: &BTreeMap<String, Vec<u8>>, start: &str, hops: usize) -> Option<String> {
        let mut links = BTreeMap::new();
        for text in files.values() {
            for line in std::str::from_utf8(text).unwrap().lines() {
                let (a, b) = line.split_once(" => ").unwrap();
                assert!(
                    links.insert(a.to_string(), b.to_string()).is_none(),
                    "{a} twice"
                );
            }
        }
        let mut at = start.to_string();
        for _ in 0..hops {
            at = links.get(&at)?.clone();
        }
        Some(at)
    }

    #[test]
    fn following_the_links_from_the_start_reaches_the_answer() {
        for level in 1..=Needles.levels() {
            for seed in 0..20 {
                let t = Needles.instance(level, seed).unwrap();
                let hops = HOPS[level as usize - 1];
                let start = t.prompt.split("Start at ").nth(1).unwrap();
                let start = start.split(' ').next().unwrap();
                assert_eq!(
                    follow(&t.files, start, hops).as_deref(),
                    Some(t.oracle.answer.as_str()),
                    "{}",
                    t.id
                );
                assert_eq!(t.files.len(), LOG_PARTS[level as usize - 1], "{}", t.id);
                assert!(
                    t.files.values().all(|f| f.len() as u64 <= READ_BYTES),
                    "{}",
                    t.id
                );
            }
        }
    }

    #[test]
    fn distractor_chains_end_at_other_numbers() {
        for (level, seed) in (2..=Needles.levels()).flat_map(|l| (0..5).map(move |s| (l, s))) {
            let t = Needles.instance(level, seed).unwrap();
            let numbers: Vec<String> = t
                .files
                .values()
                .flat_map(|f| {
                    String::from_utf8(f.clone())
                        .unwrap()
                        .lines()
                        .filter_map(|l| l.split_once(" => ").map(|(_, b)| b.to_string()))
                        .filter(|b| b.parse::<i64>().is_ok())
                        .collect::<Vec<_>>()
                })
                .collect();
            assert!(numbers.len() >= 2, "{}: {numbers:?}", t.id);
            assert_eq!(
                numbers.iter().filter(|n| **n == t.oracle.answer).count(),
                1,
                "{}",
                t.id
            );
        }
    }
}
