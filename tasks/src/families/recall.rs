//! `recall`: a fact read at the start of an episode and asked for at its end. A chain of
//! files is followed by `next: <path>` like `hops`, but the value is in the *first* file and
//! the last one says only `end`; later files hold decoy values. Every file must be read (the
//! chain is the only way to the end), so a policy whose window cannot hold the whole chain
//! must carry the first value across its folds: the oracle writes it to `notes.md` after the
//! first read (what a `notes` fold shows at the top of every new segment). The family is the
//! "needle in segment 1, question at the end" test of `shared/research/long_context_rl.md`
//! §7.4: `drop_tool_output` keeps the calls but masks the first file's output once it folds,
//! and `none` runs out of window.
//!
//! Levels follow the log schedule ([`super::LOG_PARTS`]): the chain has one file more than
//! that level's parts (2 to 65 files), and from level 3 the middle files hold decoy values,
//! more of them with each level ([`DECOY_SHARE`]).

use std::collections::BTreeMap;

use super::{random_path, reading_instance, LOG_PARTS, NOTES_PATH};
use crate::error::TasksError;
use crate::rng::SplitMix64;
use crate::task::{check_level, FactLayout, TaskFamily, TaskInstance};

/// Share of the middle files that hold a decoy `value:` line, by level (index = level − 1):
/// the family's distractor density.
pub(crate) const DECOY_SHARE: [f64; 12] = [
    0.0, 0.0, 0.25, 0.25, 0.5, 0.5, 0.75, 0.75, 1.0, 1.0, 1.0, 1.0,
];

/// The `recall` family.
#[derive(Debug, Clone, Copy, Default)]
pub struct Recall;

impl TaskFamily for Recall {
    fn name(&self) -> &str {
        "recall"
    }

    fn description(&self) -> &str {
        "follow `next:` from the first file, which holds the value, to the file that says `end`, then answer that first value; levels add files and decoy values"
    }

    fn levels(&self) -> u32 {
        LOG_PARTS.len() as u32
    }

    fn instance(&self, level: u32, seed: u64) -> Result<TaskInstance, TasksError> {
        check_level(self.name(), level, self.levels())?;
        let li = level as usize - 1;
        let files_n = LOG_PARTS[li] + 1;
        let mut rng = SplitMix64::derive(seed, &format!("recall/{level}"));
        let mut chain: Vec<String> = Vec::with_capacity(files_n);
        while chain.len() < files_n {
            let p = random_path(&mut rng);
            if !chain.contains(&p) {
                chain.push(p);
            }
        }
        let value = rng.range(10_000, 99_999);
        let mut files = BTreeMap::new();
        for (i, p) in chain.iter().enumerate() {
            let text = match chain.get(i + 1) {
                None => "end\n".to_string(),
                Some(next) if i == 0 => format!("value: {value}\nnext: {next}\n"),
                Some(next) => {
                    if rng.next_f64() < DECOY_SHARE[li] {
                        let mut decoy = rng.range(10_000, 99_999);
                        if decoy == value {
                            decoy += 1;
                        }
                        format!("value: {decoy}\nnext: {next}\n")
                    } else {
                        format!("next: {next}\n")
                    }
                }
            };
            files.insert(p.clone(), text.into_bytes());
        }
        let prompt = format!(
            "Follow next: from {} to the file that says end, then answer the first file's value; keep it in {NOTES_PATH}.",
            chain[0]
        );
        let note = format!("value: {value}\n");
        Ok(reading_instance(
            self.name(),
            (level, seed),
            prompt,
            files,
            (chain.clone(), Some(vec![note])),
            chain,
            value,
        ))
    }

    /// The fact is the first file's value; the distractors are the later files' decoy values
    /// (decoys per fact line).
    fn fact_layout(&self, instance: &TaskInstance) -> FactLayout {
        let first = instance
            .oracle
            .steps
            .first()
            .and_then(|s| s.arguments["path"].as_str());
        let decoys = instance
            .files
            .iter()
            .filter(|(path, text)| Some(path.as_str()) != first && text.starts_with(b"value: "))
            .count();
        FactLayout {
            fact_files: first.map(str::to_string).into_iter().collect(),
            distractor_density: Some(decoys as f64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chain from the prompt's start: each file's text, in reading order.
    fn follow(t: &TaskInstance) -> Vec<String> {
        let start = t.prompt.split_whitespace().nth(3).unwrap();
        let mut path = start.to_string();
        let mut out = Vec::new();
        loop {
            let text = String::from_utf8(t.files[&path].clone()).unwrap();
            out.push(text.clone());
            match text.lines().find_map(|l| l.strip_prefix("next: ")) {
                Some(next) => path = next.to_string(),
                None => return out,
            }
        }
    }

    #[test]
    fn the_answer_is_the_first_files_value_and_every_file_is_on_the_chain() {
        for level in 1..=Recall.levels() {
            for seed in 0..20 {
                let t = Recall.instance(level, seed).unwrap();
                let texts = follow(&t);
                assert_eq!(texts.len(), t.files.len(), "{}", t.id);
                assert_eq!(texts.len(), LOG_PARTS[level as usize - 1] + 1, "{}", t.id);
                assert_eq!(texts.last().unwrap(), "end\n", "{}", t.id);
                let first = texts[0].lines().next().unwrap();
                assert_eq!(first, format!("value: {}", t.oracle.answer), "{}", t.id);
                // Only the first file holds the answer; the last value read is a decoy
                // wherever there is one.
                for text in &texts[1..] {
                    assert!(!text.contains(&t.oracle.answer), "{}", t.id);
                }
            }
        }
    }

    #[test]
    fn decoys_grow_with_the_level() {
        let decoys = |level: u32| -> usize {
            (0..20)
                .map(|seed| {
                    let t = Recall.instance(level, seed).unwrap();
                    follow(&t)[1..]
                        .iter()
                        .filter(|x| x.starts_with("value: "))
                        .count()
                })
                .sum()
        };
        assert_eq!(decoys(2), 0);
        assert!(decoys(3) > 0);
        assert!(decoys(8) > decoys(4));
        // From level 9 every middle file holds one.
        assert_eq!(decoys(9), 20 * (LOG_PARTS[8] - 1));
    }

    #[test]
    fn the_fact_is_the_first_file_and_the_density_counts_its_decoys() {
        for (level, seed) in [(1, 0), (5, 2), (12, 1)] {
            let t = Recall.instance(level, seed).unwrap();
            let layout = Recall.fact_layout(&t);
            let start = t.prompt.split_whitespace().nth(3).unwrap();
            assert_eq!(layout.fact_files, [start], "{}", t.id);
            let decoys = follow(&t)[1..]
                .iter()
                .filter(|x| x.starts_with("value: "))
                .count();
            assert_eq!(layout.distractor_density, Some(decoys as f64), "{}", t.id);
        }
    }

    #[test]
    fn the_oracle_notes_the_value_once_after_the_first_read() {
        for (level, seed) in [(1, 3), (6, 4), (12, 7)] {
            let t = Recall.instance(level, seed).unwrap();
            let names: Vec<&str> = t.oracle.steps.iter().map(|s| s.name.as_str()).collect();
            assert_eq!(names[..2], ["read_file", "write_file"], "{}", t.id);
            let writes: Vec<&serde_json::Value> = t
                .oracle
                .steps
                .iter()
                .filter(|s| s.name == "write_file")
                .map(|s| &s.arguments)
                .collect();
            assert_eq!(writes.len(), 1, "{}", t.id);
            assert_eq!(writes[0]["path"], NOTES_PATH);
            assert_eq!(
                writes[0]["content"],
                format!("value: {}\n", t.oracle.answer)
            );
            assert!((t.oracle_calls() as u32) < t.max_turns);
        }
    }
}
