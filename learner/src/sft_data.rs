//! SFT data: oracle demonstrations of the configured families and levels, executed in the
//! real sandbox and laid out in the episode token format ([`corvid_episode`]), packed into
//! rows for [`SftTrainer`](crate::train::sft::SftTrainer).
//!
//! # Rules
//!
//! 1. **Stream.** The examples of SFT step `k` are a pure function of `(sft.seed, k)`: each
//!    is a (family, level) drawn uniformly from `sft.levels` (and, from step
//!    `sft.late_levels_from_step` on, `sft.late_levels`) and an instance seed below
//!    `sft.heldout_seed_base`. A resumed SFT stage therefore sees exactly the data it would
//!    have seen, with nothing to save but the step.
//! 2. **Size.** A step draws demonstrations until they hold `batch_tokens` tokens. With
//!    `layout = "pack"` it packs them first-fit decreasing into rows of `seq_len` and keeps
//!    at most `batch_tokens / seq_len` rows; with `layout = "concat"` it bins them the same way
//!    but joins each row's demonstrations into one causal context (held-out rows: one
//!    demonstration each, from position 0); with `layout = "bucket"` each is its own row,
//!    longest first. From step `concat_from_step` on (when set) every step is laid out as
//!    concat. Demonstrations longer than `seq_len` are dropped and
//!    counted; a demonstration whose oracle does not pass its checker in the sandbox is never
//!    trained on (it would teach a wrong answer) and is counted too.
//! 3. **Held out.** `heldout_per_level` instances per (family, level) with seeds from
//!    `heldout_seed_base` up: disjoint from every training seed by construction.
//! 4. **Imports.** Transcripts from `sft.import` (OpenAI-style `messages` with `tool_calls`,
//!    laid out by [`EpisodeFormat::from_messages`]) are read once at start; a bad line is an
//!    error naming its file and line. Each draw picks uniformly among the (family, level)
//!    pairs and, when there are imports, one more slot: a uniformly drawn transcript.
//! 5. **Mistakes.** With `sft.mistake_rate > 0` a demonstration makes loss-masked mistakes
//!    and recovers from them ([`Mistakes`]), from step `sft.mistakes_from_step` on (the
//!    held-out set always); where they fall is a pure function of the instance seed and
//!    `sft.seed`, like the rest of the stream.

use corvid_sandbox::Sandbox;
use corvid_tasks::{Families, SplitMix64, TaskEnv, TaskFamily, TasksError};

use crate::train::config::{SftConfig, SftLayout};
use crate::train::pack::PackedRow;
use crate::train::sft::{concat, pack, Example};
use crate::train::TrainError;
use corvid_episode::{
    oracle_steps_folded, oracle_steps_with, DemonstrationError, EpisodeFormat, Mistakes,
};
use corvid_proto::ContextFold;

/// Most demonstrations drawn for one step, as a multiple of the rows it needs: a guard
/// against a configuration where nothing fits `seq_len`.
const MAX_DRAWS_PER_ROW: usize = 16;

/// Why the SFT data could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SftDataError {
    /// A family, level or oracle failed.
    #[error("SFT demonstrations: {0}")]
    Tasks(#[from] TasksError),
    /// A demonstration could not be made or laid out.
    #[error("SFT demonstrations: {0}")]
    Demonstration(#[from] DemonstrationError),
    /// The sandbox could not be built.
    #[error("SFT demonstrations: sandbox: {0}")]
    Sandbox(String),
    /// Packing failed.
    #[error("SFT demonstrations: {0}")]
    Train(#[from] TrainError),
    /// An imported transcript file could not be read or has a bad line.
    #[error("SFT import {path}:{line}: {message}")]
    Import {
        /// The file.
        path: String,
        /// 1-based line (0: the file itself).
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The configuration yields no usable demonstration.
    #[error("SFT demonstrations: {0}")]
    Empty(String),
}

/// Counts of demonstrations left out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DropCounts {
    /// Longer than `seq_len`.
    pub too_long: u64,
    /// The oracle did not pass its checker.
    pub failed_oracle: u64,
}

/// The SFT example stream.
pub struct SftData {
    env: TaskEnv,
    format: EpisodeFormat,
    /// (family, level, first step that draws it).
    pairs: Vec<(Box<dyn TaskFamily>, u32, u64)>,
    imported: Vec<Example>,
    cfg: SftConfig,
    dropped: DropCounts,
    /// The run's window and fold and its turn limit: demonstrations fold as actors do and
    /// each segment is an example ([`SftData::folding`]).
    fold: Option<(ContextFold, usize)>,
}

impl std::fmt::Debug for SftData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SftData")
            .field(
                "pairs",
                &self
                    .pairs
                    .iter()
                    .map(|(f, l, from)| format!("{}/{l} from step {from}", f.name()))
                    .collect::<Vec<_>>(),
            )
            .field("dropped", &self.dropped)
            .finish_non_exhaustive()
    }
}

impl SftData {
    /// The stream for `cfg` (families from `cfg.levels`, looked up in `families`), with its
    /// own sandbox.
    pub fn new(
        cfg: &SftConfig,
        families: &Families,
        format: EpisodeFormat,
    ) -> Result<Self, SftDataError> {
        let mut pairs = Vec::new();
        let early = cfg.levels.iter().map(|l| ("levels", l, 0));
        let late = (cfg.late_levels.iter()).map(|l| ("late_levels", l, cfg.late_levels_from_step));
        for (field, (name, levels), from) in early.chain(late) {
            for &level in levels {
                let family = families.get(name)?;
                if level == 0 || level > family.levels() {
                    return Err(SftDataError::Empty(format!(
                        "sft.{field}.{name} has level {level}; {name} has levels 1..={}",
                        family.levels()
                    )));
                }
                pairs.push((family, level, from));
            }
        }
        let mut imported = Vec::new();
        for path in &cfg.import {
            let file = import_transcripts(&format, path)?;
            tracing::info!(path = %path.display(), transcripts = file.len(), "SFT import read");
            imported.extend(file);
        }
        if !pairs.iter().any(|p| p.2 == 0) && imported.is_empty() {
            return Err(SftDataError::Empty(
                "sft.levels names no (family, level) to train on from step 0 (late_levels join later) and sft.import no transcript".into(),
            ));
        }
        let sandbox = Sandbox::builder()
            .search_tool(true)
            .build()
            .map_err(|e| SftDataError::Sandbox(e.to_string()))?;
        Ok(Self {
            env: TaskEnv::new(sandbox),
            format,
            pairs,
            imported,
            cfg: cfg.clone(),
            dropped: DropCounts::default(),
            fold: None,
        })
    }

    /// Demonstrations laid out as the run's actors fold their episodes (`context`, turns of
    /// at most `max_new_tokens`; `corvid_episode::oracle_steps_folded`): each context segment
    /// is an example of its own, what the policy sees at once.
    pub fn folding(mut self, context: Option<ContextFold>, max_new_tokens: u32) -> Self {
        self.fold = context.map(|c| (c, max_new_tokens as usize));
        self
    }

    /// Demonstrations left out so far.
    pub fn dropped(&self) -> DropCounts {
        self.dropped
    }

    /// The demonstration of `(pair, seed)` as examples, one per context segment (one when it
    /// does not fold), or none if its oracle fails; with mistakes iff `mistakes`.
    fn examples(
        &mut self,
        pair: usize,
        seed: u64,
        mistakes: bool,
    ) -> Result<Vec<Example>, SftDataError> {
        let (family, level, _) = &self.pairs[pair];
        let task = family.instance(*level, seed)?;
        let mistakes = Mistakes {
            rate: if mistakes { self.cfg.mistake_rate } else { 0.0 },
            seed: self.cfg.seed ^ seed,
            reread: self.cfg.mistake_reread,
        };
        let demo = match &self.fold {
            Some((context, max_new)) => oracle_steps_folded(
                &self.format,
                &self.env,
                &task,
                mistakes,
                (context, *max_new),
            )?,
            None => oracle_steps_with(&self.format, &self.env, &task, mistakes)?,
        };
        if !demo.verdict.passed() {
            self.dropped.failed_oracle += 1;
            tracing::warn!(task = %task.id, "oracle demonstration does not pass its checker; left out");
            return Ok(Vec::new());
        }
        Ok(demo
            .flatten_segments()
            .into_iter()
            .map(|(ids, mask)| Example { ids, mask })
            .collect())
    }

    /// The packed rows of SFT step `step` (rules 1 and 2).
    pub fn step_rows(&mut self, step: u64) -> Result<Vec<PackedRow>, SftDataError> {
        let seq_len = self.cfg.seq_len;
        let rows = self.cfg.rows_per_step();
        let layout = self.cfg.layout_at(step);
        // Pack and concat: rows × seq_len (the rows are then filled first-fit and the surplus
        // dropped); bucket: demonstration tokens, one row each.
        let budget = match layout {
            SftLayout::Pack | SftLayout::Concat => rows * seq_len,
            SftLayout::Bucket => self.cfg.batch_tokens,
        };
        let mut rng =
            SplitMix64::derive(self.cfg.seed ^ step.wrapping_mul(0x9e37_79b9), "sft-step");
        let active: Vec<usize> = (0..self.pairs.len())
            .filter(|&i| self.pairs[i].2 <= step)
            .collect();
        let (mut examples, mut tokens, mut draws) = (Vec::new(), 0usize, 0usize);
        while tokens < budget {
            draws += 1;
            if draws > MAX_DRAWS_PER_ROW * rows {
                break;
            }
            let slots = active.len() + usize::from(!self.imported.is_empty());
            let slot = rng.below(slots as u64) as usize;
            let seed = rng.below(self.cfg.heldout_seed_base.max(1));
            let drawn = if slot == active.len() {
                vec![self.imported[seed as usize % self.imported.len()].clone()]
            } else {
                self.examples(active[slot], seed, step >= self.cfg.mistakes_from_step)?
            };
            for e in drawn {
                if e.ids.len() > seq_len {
                    self.dropped.too_long += 1;
                    continue;
                }
                tokens += e.ids.len();
                examples.push(e);
            }
        }
        if examples.is_empty() {
            return Err(SftDataError::Empty(format!(
                "no demonstration of {:?} fits sft.seq_len = {seq_len}",
                self.cfg.levels
            )));
        }
        let mut binned = match layout {
            SftLayout::Pack => pack(&examples, seq_len, self.format.pad_id())?.rows,
            SftLayout::Concat => concat(&examples, seq_len, self.format.pad_id())?.rows,
            SftLayout::Bucket => return Ok(bucket(&examples, self.format.pad_id())),
        };
        binned.truncate(rows);
        Ok(binned)
    }

    /// The held-out rows (rule 3).
    pub fn heldout_rows(&mut self) -> Result<Vec<PackedRow>, SftDataError> {
        let mut examples = Vec::new();
        for pair in 0..self.pairs.len() {
            for i in 0..self.cfg.heldout_per_level as u64 {
                for e in self.examples(pair, self.cfg.heldout_seed_base + i, true)? {
                    if e.ids.len() <= self.cfg.seq_len {
                        examples.push(e);
                    }
                }
            }
        }
        // Concat trains later demonstrations at later positions; its held-out loss is measured
        // the way the policy meets an episode, each from position 0.
        Ok(match self.cfg.layout {
            SftLayout::Pack => pack(&examples, self.cfg.seq_len, self.format.pad_id())?.rows,
            SftLayout::Bucket | SftLayout::Concat => bucket(&examples, self.format.pad_id()),
        })
    }
}

/// One row per example, longest first, so that a micro-batch holds rows of similar length.
fn bucket(examples: &[Example], pad_id: u32) -> Vec<PackedRow> {
    let mut rows: Vec<PackedRow> = examples
        .iter()
        .map(|e| PackedRow::single(&e.ids, &e.mask, pad_id))
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.len()));
    rows
}

/// Reads one JSONL file of chat transcripts into examples.
fn import_transcripts(
    format: &EpisodeFormat,
    path: &std::path::Path,
) -> Result<Vec<Example>, SftDataError> {
    #[derive(serde::Deserialize)]
    struct Line {
        messages: Vec<corvid_episode::ChatMessage>,
        /// The tools the conversation may call, in OpenAI function format: a model's own
        /// template declares them in the prompt.
        #[serde(default)]
        tools: Vec<serde_json::Value>,
    }
    let err = |line: usize, message: String| SftDataError::Import {
        path: path.display().to_string(),
        line,
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(0, e.to_string()))?;
    let mut out = Vec::new();
    for (i, l) in text.lines().enumerate() {
        if l.trim().is_empty() {
            continue;
        }
        let line: Line = serde_json::from_str(l).map_err(|e| err(i + 1, e.to_string()))?;
        let (ids, mask) = format
            .from_messages(&line.messages, &line.tools)
            .map_err(|e| err(i + 1, e.to_string()))?;
        out.push(Example { ids, mask });
    }
    if out.is_empty() {
        return Err(err(0, "no transcript in the file".into()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn cfg() -> SftConfig {
        SftConfig {
            levels: BTreeMap::from([("hops".to_string(), vec![1, 2])]),
            batch_tokens: 2048,
            seq_len: 512,
            heldout_per_level: 2,
            ..SftConfig::default()
        }
    }

    #[test]
    fn a_step_is_a_pure_function_of_the_seed_and_the_step() {
        let mut a = SftData::new(&cfg(), &Families::default(), EpisodeFormat::default()).unwrap();
        let mut b = SftData::new(&cfg(), &Families::default(), EpisodeFormat::default()).unwrap();
        let r7 = a.step_rows(7).unwrap();
        assert!(!r7.is_empty() && r7.len() <= 4);
        assert!(r7.iter().all(|r| r.len() == 512 && r.trained_tokens() > 0));
        assert_eq!(b.step_rows(7).unwrap(), r7);
        assert_ne!(a.step_rows(8).unwrap(), r7);
    }

    #[test]
    fn imported_transcripts_are_trained_on_and_bad_lines_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("chat.jsonl");
        let line = r#"{"messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "answer", "arguments": "{\"answer\": \"hi\"}"}}]}]}"#;
        std::fs::write(&good, format!("{line}\n\n{line}\n")).unwrap();
        let only_imports = SftConfig {
            levels: BTreeMap::new(),
            import: vec![good.clone()],
            ..cfg()
        };
        let mut d = SftData::new(
            &only_imports,
            &Families::default(),
            EpisodeFormat::default(),
        )
        .unwrap();
        assert_eq!(d.imported.len(), 2);
        let rows = d.step_rows(0).unwrap();
        assert!(rows.iter().all(|r| r.trained_tokens() > 0));

        let bad = dir.path().join("bad.jsonl");
        std::fs::write(
            &bad,
            format!("{line}\n{{\"messages\": [{{\"role\": \"robot\"}}]}}\n"),
        )
        .unwrap();
        let err = SftData::new(
            &SftConfig {
                import: vec![bad],
                ..cfg()
            },
            &Families::default(),
            EpisodeFormat::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("bad.jsonl:2:"), "{err}");
    }

    #[test]
    fn mistakes_start_at_their_step_with_their_calls_out_of_the_loss() {
        let mistaken = SftConfig {
            mistake_rate: 0.5,
            mistakes_from_step: 2,
            ..cfg_bucket()
        };
        // `<tool_call>` targets of a step's rows: (trained, not trained).
        let calls = |rows: &[PackedRow]| {
            let open = i64::from(corvid_tokenizer::Special::ToolCallOpen.id());
            let mut n = (0, 0);
            for r in rows {
                for (t, m) in r.targets.iter().zip(&r.loss_mask) {
                    if *t == open {
                        if *m {
                            n.0 += 1
                        } else {
                            n.1 += 1
                        }
                    }
                }
            }
            n
        };
        let mut a =
            SftData::new(&mistaken, &Families::default(), EpisodeFormat::default()).unwrap();
        let mut plain = SftData::new(
            &cfg_bucket(),
            &Families::default(),
            EpisodeFormat::default(),
        )
        .unwrap();
        for step in 0..2 {
            assert_eq!(a.step_rows(step).unwrap(), plain.step_rows(step).unwrap());
        }
        let (trained, mistakes) = calls(&a.step_rows(2).unwrap());
        assert!(
            trained > 0 && mistakes > 0,
            "{trained} trained, {mistakes} mistakes"
        );
        let (_, held_out_mistakes) = calls(&a.heldout_rows().unwrap());
        assert!(held_out_mistakes > 0);
    }

    fn cfg_bucket() -> SftConfig {
        SftConfig {
            layout: SftLayout::Bucket,
            ..cfg()
        }
    }

    #[test]
    fn a_bucketed_step_holds_one_demonstration_per_row_longest_first() {
        let bucket = cfg_bucket();
        let mut a = SftData::new(&bucket, &Families::default(), EpisodeFormat::default()).unwrap();
        let rows = a.step_rows(3).unwrap();
        let tokens: usize = rows.iter().map(PackedRow::len).sum();
        assert!(tokens >= bucket.batch_tokens, "{tokens} tokens");
        assert!(
            tokens < bucket.batch_tokens + bucket.seq_len,
            "{tokens} tokens"
        );
        assert!(rows.windows(2).all(|w| w[0].len() >= w[1].len()));
        for r in &rows {
            assert!(
                r.doc_ids.iter().all(|d| *d == 0),
                "one document, no padding"
            );
            assert!(r.len() <= bucket.seq_len && r.trained_tokens() > 0);
        }
        let mut b = SftData::new(&bucket, &Families::default(), EpisodeFormat::default()).unwrap();
        assert_eq!(b.step_rows(3).unwrap(), rows);
        // Held out: one row per demonstration that fits (hops 2 may run past 512 tokens).
        let held = a.heldout_rows().unwrap();
        assert!(!held.is_empty() && held.len() <= 2 * bucket.heldout_per_level);
        assert!(held.iter().all(|r| r.doc_ids.iter().all(|d| *d == 0)));
    }

    #[test]
    fn a_concatenated_step_joins_demonstrations_into_causal_rows() {
        let concat = SftConfig {
            layout: SftLayout::Concat,
            ..cfg()
        };
        let mut a = SftData::new(&concat, &Families::default(), EpisodeFormat::default()).unwrap();
        let rows = a.step_rows(3).unwrap();
        assert!(!rows.is_empty() && rows.len() <= concat.rows_per_step());
        let system = i64::from(corvid_tokenizer::Special::System.id());
        let mut joined = 0;
        for r in &rows {
            assert!(r.len() <= concat.seq_len && r.trained_tokens() > 0);
            // One document: positions run on, no padding, no document boundary.
            assert!(r.doc_ids.iter().all(|d| *d == 0));
            assert!(r.positions.iter().enumerate().all(|(i, p)| *p == i as i64));
            let starts: Vec<usize> = (0..r.len()).filter(|&i| r.tokens[i] == system).collect();
            assert_eq!(
                starts.first(),
                Some(&0),
                "a row starts with a demonstration"
            );
            joined += starts.len().saturating_sub(1);
            // Each demonstration's last token is followed by the next one's first.
            for &s in &starts[1..] {
                assert_eq!(r.targets[s - 1], system);
                assert!(
                    !r.loss_mask[s - 1],
                    "the next demonstration's start is not trained"
                );
            }
        }
        assert!(
            joined > 0,
            "rows of 512 hold more than one hops 1-2 demonstration"
        );
        // A pure function of the seed and the step, like every layout; held out: one
        // demonstration per row, from position 0.
        let mut b = SftData::new(&concat, &Families::default(), EpisodeFormat::default()).unwrap();
        assert_eq!(b.step_rows(3).unwrap(), rows);
        let held = a.heldout_rows().unwrap();
        assert!(held
            .iter()
            .all(|r| r.tokens.iter().filter(|t| **t == system).count() == 1));
    }

    #[test]
    fn concat_from_step_switches_the_layout_of_later_steps_only() {
        let switch = SftConfig {
            layout: SftLayout::Bucket,
            concat_from_step: Some(5),
            ..cfg()
        };
        let bucket = SftConfig {
            layout: SftLayout::Bucket,
            ..cfg()
        };
        let concat = SftConfig {
            layout: SftLayout::Concat,
            ..cfg()
        };
        let mut s = SftData::new(&switch, &Families::default(), EpisodeFormat::default()).unwrap();
        let mut b = SftData::new(&bucket, &Families::default(), EpisodeFormat::default()).unwrap();
        let mut c = SftData::new(&concat, &Families::default(), EpisodeFormat::default()).unwrap();
        assert_eq!(s.step_rows(4).unwrap(), b.step_rows(4).unwrap());
        assert_eq!(s.step_rows(5).unwrap(), c.step_rows(5).unwrap());
        assert_eq!(s.step_rows(9).unwrap(), c.step_rows(9).unwrap());
        assert_ne!(s.step_rows(5).unwrap(), b.step_rows(5).unwrap());
        // Held out: the base layout's rows (bucket), one demonstration each.
        assert_eq!(s.heldout_rows().unwrap(), b.heldout_rows().unwrap());
    }

    #[test]
    fn late_levels_join_at_their_step_and_leave_earlier_steps_unchanged() {
        let late = SftConfig {
            late_levels: BTreeMap::from([("hops".to_string(), vec![3])]),
            late_levels_from_step: 5,
            seq_len: 1024,
            ..cfg_bucket()
        };
        let plain = SftConfig {
            seq_len: 1024,
            ..cfg_bucket()
        };
        // Calls per demonstration (`<tool_call>` targets in a row: one demonstration each).
        let calls = |rows: &[PackedRow]| -> Vec<usize> {
            let open = i64::from(corvid_tokenizer::Special::ToolCallOpen.id());
            (rows.iter())
                .map(|r| r.targets.iter().filter(|t| **t == open).count())
                .collect()
        };
        let mut a = SftData::new(&late, &Families::default(), EpisodeFormat::default()).unwrap();
        let mut b = SftData::new(&plain, &Families::default(), EpisodeFormat::default()).unwrap();
        for step in 0..5 {
            let rows = a.step_rows(step).unwrap();
            assert_eq!(rows, b.step_rows(step).unwrap(), "step {step}");
            // hops 1 and 2: one or two reads, then the answer.
            assert!(calls(&rows).iter().all(|&c| c == 2 || c == 3));
        }
        let mut hops3 = 0;
        for step in 5..15 {
            hops3 += calls(&a.step_rows(step).unwrap())
                .iter()
                .filter(|&&c| c == 4)
                .count();
        }
        assert!(hops3 > 0, "no hops 3 demonstration from step 5 on");
        // Held out: every level, the late ones included, from the start.
        let held = a.heldout_rows().unwrap();
        assert_eq!(calls(&held).iter().filter(|&&c| c == 4).count(), 2);
        // A late-only stream has nothing to train on before its step.
        let only_late = SftConfig {
            levels: BTreeMap::new(),
            ..late
        };
        let err =
            SftData::new(&only_late, &Families::default(), EpisodeFormat::default()).unwrap_err();
        assert!(err.to_string().contains("sft.levels names no"), "{err}");
    }

    #[test]
    fn heldout_rows_come_from_their_own_seeds() {
        let mut d = SftData::new(&cfg(), &Families::default(), EpisodeFormat::default()).unwrap();
        let held = d.heldout_rows().unwrap();
        assert!(!held.is_empty());
        assert_eq!(d.dropped().failed_oracle, 0);
    }

    /// With the run's window, a demonstration longer than it is trained as its segments,
    /// each within the window, where unfolded it is dropped as too long.
    #[test]
    fn folded_demonstrations_train_as_segments_within_the_window() {
        let long = SftConfig {
            levels: BTreeMap::from([("ledger".to_string(), vec![8])]),
            batch_tokens: 4096,
            seq_len: 1024,
            heldout_per_level: 1,
            layout: crate::train::SftLayout::Bucket,
            ..SftConfig::default()
        };
        let window = ContextFold {
            window_tokens: 1024,
            fold: corvid_proto::Fold::DropToolOutput,
            memory_tokens: 128,
            notes_path: "notes.md".into(),
        };
        let mut plain =
            SftData::new(&long, &Families::default(), EpisodeFormat::default()).unwrap();
        assert!(
            plain.step_rows(0).is_err(),
            "no ledger level-8 demonstration fits 1,024 tokens"
        );
        assert!(plain.dropped().too_long > 0);
        let mut folded = SftData::new(&long, &Families::default(), EpisodeFormat::default())
            .unwrap()
            .folding(Some(window), 64);
        let rows = folded.step_rows(0).unwrap();
        assert!(rows.len() > 1);
        assert!(rows
            .iter()
            .all(|r| r.len() <= 1024 && r.trained_tokens() > 0));
        assert_eq!(folded.dropped().too_long, 0);
        assert!(!folded.heldout_rows().unwrap().is_empty());
    }
}
