//! `hops`: a multi-hop needle across files. Each chain file says `next: <path>`; the last
//! says `value: <number>`. Distractor files look the same but lead nowhere useful.

use std::collections::BTreeMap;

use super::{filler, random_path, reading_instance, CHAIN_CALLS};
use crate::error::TasksError;
use crate::rng::SplitMix64;
use crate::task::{check_level, FactLayout, TaskFamily, TaskInstance};

/// Filler bytes per file, by level. Levels 1–3 hold only their marker line. A from-scratch
/// policy learns to copy a path from `next: <path>` about 2.5× sooner without same-alphabet
/// filler around it (a reference GPT: ~300 vs ~850 SFT steps, `docs/bench/raw/sft-sweep.md`),
/// so the demonstrated levels 1–2 have none, and level 3, the first past them, adds only a hop
/// and a distractor file: a policy trained on levels 1–2 solved 4% of it, where it solved none
/// of level 3 with filler and RL had no signal (`docs/bench/raw/rl-sweep-2026-12-01.md`, runs
/// e1 and e2). Filler starts at level 4.
const FILLER: [usize; 8] = [0, 0, 0, 40, 140, 220, 320, 420];
/// Distractor files, by level.
const DISTRACTORS: [usize; 8] = [1, 2, 3, 4, 6, 8, 10, 12];

/// The `hops` family.
#[derive(Debug, Clone, Copy, Default)]
pub struct Hops;

/// File text: filler lines with the marker line inserted at a random position.
fn file_text(rng: &mut SplitMix64, marker: &str, filler_bytes: usize) -> String {
    let mut lines = filler(rng, filler_bytes);
    let at = rng.below(lines.len() as u64 + 1) as usize;
    lines.insert(at, marker.to_string());
    lines.join("\n") + "\n"
}

impl TaskFamily for Hops {
    fn name(&self) -> &str {
        "hops"
    }

    fn description(&self) -> &str {
        "follow `next: <path>` across files to the final `value:`; levels add hops, file size and distractors"
    }

    fn levels(&self) -> u32 {
        CHAIN_CALLS.len() as u32
    }

    fn instance(&self, level: u32, seed: u64) -> Result<TaskInstance, TasksError> {
        check_level(self.name(), level, self.levels())?;
        let li = level as usize - 1;
        let hops = CHAIN_CALLS[li];
        let mut rng = SplitMix64::derive(seed, &format!("hops/{level}"));
        let mut paths: Vec<String> = Vec::new();
        while paths.len() < hops + DISTRACTORS[li] {
            let p = random_path(&mut rng);
            if !paths.contains(&p) {
                paths.push(p);
            }
        }
        let (chain, distractors) = paths.split_at(hops);
        let value = rng.range(10_000, 99_999);
        let mut files = BTreeMap::new();
        for (i, p) in chain.iter().enumerate() {
            let marker = match chain.get(i + 1) {
                Some(next) => format!("next: {next}"),
                None => format!("value: {value}"),
            };
            files.insert(
                p.clone(),
                file_text(&mut rng, &marker, FILLER[li]).into_bytes(),
            );
        }
        for (i, p) in distractors.iter().enumerate() {
            // Half the distractors hold a wrong value (a near miss), half point at another
            // distractor, so a policy that skips the chain finds plausible wrong answers.
            let marker = if i % 2 == 0 {
                let mut v = rng.range(10_000, 99_999);
                if v == value {
                    v += 1;
                }
                format!("value: {v}")
            } else {
                format!("next: {}", distractors[(i + 1) % distractors.len()])
            };
            files.insert(
                p.clone(),
                file_text(&mut rng, &marker, FILLER[li]).into_bytes(),
            );
        }
        let start = &chain[0];
        // The learning probe's prompt (`shared/research/learning_feasibility.md`): the tool
        // declarations say how to read and answer. The filler-free low levels were measured
        // with this prompt (the two changes together, `docs/bench/raw/sft-sweep.md`).
        let prompt = format!("Find the value. Start at {start}.");
        let chain = chain.to_vec();
        Ok(reading_instance(
            self.name(),
            (level, seed),
            prompt,
            files,
            (chain.clone(), None),
            chain,
            value,
        ))
    }

    /// The fact is the `value:` line at the chain's end (the oracle's last read); the other
    /// chain files only lead there.
    fn fact_layout(&self, instance: &TaskInstance) -> FactLayout {
        let last = instance
            .oracle
            .steps
            .iter()
            .rev()
            .find(|s| s.name == "read_file")
            .and_then(|s| s.arguments["path"].as_str());
        FactLayout {
            fact_files: last.map(str::to_string).into_iter().collect(),
            distractor_density: None,
        }
    }
}
