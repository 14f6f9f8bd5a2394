//! What a run folder holds for the report.
//!
//! | file | written by | one record is |
//! |---|---|---|
//! | `run.json` | `corvid run` | the run: name, config, times, frontier, oracle tokens per level, ablation |
//! | `metrics/metrics.jsonl` | the learner | one RL update: [`UpdateRecord`], as the learner writes it |
//! | `metrics/sft.jsonl` | the learner | one SFT step (some lines carry a held-out `eval_loss`) |
//! | `eval/<stage>.json` | `corvid eval` | held-out success per family and level for one checkpoint |
//!
//! Every file is optional: an interrupted run has a partial picture and the report says what
//! is missing instead of failing. A malformed JSONL line (the torn last line of a killed
//! writer, or a metrics line that is not an [`UpdateRecord`]) is skipped and counted. In the
//! files other than the metrics every key is optional and a value of the wrong type reads as
//! absent (with [`lenient`]), so one bad figure never hides the others.
//!
//! A metrics line is read into the learner's own [`UpdateRecord`], with two figures the
//! record does not carry made explicit: a figure the learner wrote as `null` (a non-finite
//! value) reads as NaN and counts as absent ([`super::null_floats`]), and a `family/level`
//! with no episode in the batch has no success rate rather than a rate of 0
//! ([`Update::success_at`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use corvid_learner::metrics::UpdateRecord;
use corvid_model::MoeHealth;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};

use super::null_floats::NullAsNan;

/// Reads a value, or the type's default when the JSON value has another shape.
fn lenient<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned + Default,
{
    let v = serde_json::Value::deserialize(d)?;
    Ok(T::deserialize(v).unwrap_or_default())
}

/// One line of `metrics/metrics.jsonl` and the time it was written relative to the run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Update {
    /// The line as the learner wrote it; a figure written as `null` (non-finite) is NaN.
    pub record: UpdateRecord,
    /// Seconds since the run started: `unix_ms` against `run.json`'s `started_unix_ms`;
    /// absent without that start time.
    pub wall_s: Option<f64>,
}

impl Update {
    /// Training success of the batch at `family` level `level`; absent where the batch had no
    /// scored episode there (the record's rate is then 0 by convention).
    pub fn success_at(&self, family: &str, level: u32) -> Option<f64> {
        let rate = self
            .record
            .rollout
            .success_by_task
            .get(&format!("{family}/{level}"))?;
        (rate.episodes > 0).then_some(rate.rate)
    }

    /// family → level → training success of the batch, as [`Self::success_at`] reads it.
    pub fn success_by_family_level(&self) -> BTreeMap<String, BTreeMap<String, Option<f64>>> {
        let mut out: BTreeMap<String, BTreeMap<String, Option<f64>>> = BTreeMap::new();
        for (task, rate) in &self.record.rollout.success_by_task {
            let Some((family, level)) = task.rsplit_once('/') else {
                continue;
            };
            out.entry(family.to_string())
                .or_default()
                .insert(level.to_string(), (rate.episodes > 0).then_some(rate.rate));
        }
        out
    }

    /// family → frontier level after the update.
    pub fn frontier(&self) -> &BTreeMap<String, u32> {
        &self.record.curriculum.frontier
    }

    /// Per-layer MoE health, each with the layer id the report files it under.
    pub fn moe_layers(&self) -> impl Iterator<Item = (u32, &MoeHealth)> {
        self.record.moe.iter().enumerate().map(|(i, m)| {
            // A layer index that is not a small non-negative number is filed by position.
            (u32::try_from(m.layer).unwrap_or(i as u32), m)
        })
    }
}

/// One line of `metrics/sft.jsonl`: one SFT step.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SftStep {
    /// Step number.
    #[serde(deserialize_with = "lenient")]
    pub step: Option<u64>,
    /// Training loss (mean cross-entropy per trained token).
    #[serde(deserialize_with = "lenient")]
    pub loss: Option<f64>,
    /// Learning rate.
    #[serde(deserialize_with = "lenient")]
    pub lr: Option<f64>,
    /// Trained tokens per second.
    #[serde(deserialize_with = "lenient")]
    pub tokens_per_s: Option<f64>,
    /// Held-out loss, on the lines where it was measured (the learner writes `heldout_loss`).
    #[serde(deserialize_with = "lenient", alias = "heldout_loss")]
    pub eval_loss: Option<f64>,
}

/// One level of one family in an evaluation file.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct EvalLevel {
    /// Level.
    #[serde(deserialize_with = "lenient")]
    pub level: Option<u32>,
    /// Episodes evaluated.
    #[serde(deserialize_with = "lenient")]
    pub episodes: Option<u64>,
    /// Share of episodes whose checker passed.
    #[serde(deserialize_with = "lenient")]
    pub success_rate: Option<f64>,
    /// Share of tool calls that parsed.
    #[serde(deserialize_with = "lenient")]
    pub tool_call_parse_rate: Option<f64>,
    /// Share of parsed tool calls that ran without error.
    #[serde(deserialize_with = "lenient")]
    pub tool_call_success_rate: Option<f64>,
    /// Share of multi-step episodes that completed every step.
    #[serde(deserialize_with = "lenient")]
    pub multi_step_completion: Option<f64>,
    /// Share of episodes with a failed call that still succeeded.
    #[serde(deserialize_with = "lenient")]
    pub failure_recovery_rate: Option<f64>,
    /// pass@k.
    #[serde(deserialize_with = "lenient")]
    pub pass_at_k: Option<f64>,
    /// pass^k.
    #[serde(deserialize_with = "lenient")]
    pub pass_hat_k: Option<f64>,
    /// Mean turns per episode.
    #[serde(deserialize_with = "lenient")]
    pub mean_turns: Option<f64>,
    /// Mean tokens per episode.
    #[serde(deserialize_with = "lenient")]
    pub mean_tokens: Option<f64>,
    /// Episodes left out (infrastructure errors).
    #[serde(deserialize_with = "lenient")]
    pub excluded: Option<u64>,
}

/// One family in an evaluation file.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct EvalFamily {
    /// Family name.
    #[serde(deserialize_with = "lenient")]
    pub family: String,
    /// Levels evaluated.
    #[serde(deserialize_with = "lenient")]
    pub levels: Vec<EvalLevel>,
    /// Success by total episode tokens, in power-of-two buckets.
    #[serde(deserialize_with = "lenient")]
    pub by_tokens: Vec<EvalBucket>,
    /// Success by where a needed fact was first read (`beginning`, `middle`, `end`,
    /// `never_read`).
    #[serde(deserialize_with = "lenient")]
    pub by_position: BTreeMap<String, EvalBucket>,
    /// Success by distractors per fact line, in power-of-two buckets (`up_to` 0: none).
    #[serde(deserialize_with = "lenient")]
    pub by_density: Vec<EvalBucket>,
    /// The longest token bucket within 80% of the shortest's success.
    #[serde(deserialize_with = "lenient")]
    pub effective_length: Option<u64>,
}

/// Scored episodes and successes of one bucket of an evaluation breakdown.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct EvalBucket {
    /// Exclusive upper bound of the bucket (absent for positions).
    #[serde(deserialize_with = "lenient")]
    pub up_to: Option<f64>,
    /// Scored episodes.
    #[serde(deserialize_with = "lenient")]
    pub scored: Option<u64>,
    /// Of those, successes.
    #[serde(deserialize_with = "lenient")]
    pub successes: Option<u64>,
}

impl EvalBucket {
    /// Successes over scored episodes; `None` for an empty bucket.
    pub fn rate(&self) -> Option<f64> {
        let n = self.scored.filter(|&n| n > 0)?;
        Some(self.successes.unwrap_or(0) as f64 / n as f64)
    }
}

/// `eval/<stage>.json`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct EvalFile {
    /// Stage named in the file.
    #[serde(deserialize_with = "lenient")]
    pub stage: Option<String>,
    /// Checkpoint evaluated.
    #[serde(deserialize_with = "lenient")]
    pub checkpoint: Option<String>,
    /// Policy version of the checkpoint.
    #[serde(deserialize_with = "lenient")]
    pub policy_version: Option<u64>,
    /// Episodes per level requested.
    #[serde(deserialize_with = "lenient")]
    pub episodes_per_level: Option<u64>,
    /// The k of pass@k and pass^k.
    #[serde(deserialize_with = "lenient")]
    pub k: Option<u64>,
    /// Families evaluated.
    #[serde(deserialize_with = "lenient")]
    pub families: Vec<EvalFamily>,
}

impl EvalFile {
    /// The figures of `family` at `level`, if that level was evaluated.
    pub fn level(&self, family: &str, level: u32) -> Option<&EvalLevel> {
        self.families
            .iter()
            .find(|f| f.family == family)?
            .levels
            .iter()
            .find(|l| l.level == Some(level))
    }
}

/// Seconds spent per stage of `corvid run`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct StageTimes {
    /// Supervised fine-tuning.
    #[serde(deserialize_with = "lenient")]
    pub sft_s: Option<f64>,
    /// Reinforcement learning.
    #[serde(deserialize_with = "lenient")]
    pub rl_s: Option<f64>,
    /// Held-out evaluation.
    #[serde(deserialize_with = "lenient")]
    pub eval_s: Option<f64>,
}

/// `run.json`'s `ablation`: success at the frontier of the two credit-assignment variants.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct Ablation {
    /// Step-level credit (the main run).
    #[serde(deserialize_with = "lenient")]
    pub step_level: Option<f64>,
    /// Trajectory-level GRPO advantages (`configs/demo-grpo.toml`).
    #[serde(deserialize_with = "lenient")]
    pub trajectory_grpo: Option<f64>,
}

/// `run.json`'s optional `goals`: targets that replace the demo's defaults.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct GoalTargets {
    /// RL minus SFT-only success at the frontier, in points. Default 15.
    #[serde(deserialize_with = "lenient")]
    pub rl_minus_sft_points: Option<f64>,
    /// Oracle tokens at the frontier level over level 1. Default 4.
    #[serde(deserialize_with = "lenient")]
    pub frontier_tokens_ratio: Option<f64>,
    /// Wall-clock minutes from start to finish. Default 20.
    #[serde(deserialize_with = "lenient")]
    pub max_minutes: Option<f64>,
}

/// `run.json`, written by `corvid run`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RunInfo {
    /// Run name.
    #[serde(deserialize_with = "lenient")]
    pub name: Option<String>,
    /// Config file the run was started with.
    #[serde(deserialize_with = "lenient")]
    pub config: Option<String>,
    /// The family whose frontier the headline figures are taken at.
    #[serde(deserialize_with = "lenient")]
    pub main_family: Option<String>,
    /// Start time (Unix ms).
    #[serde(deserialize_with = "lenient")]
    pub started_unix_ms: Option<u64>,
    /// Finish time (Unix ms); absent while running or after an interruption.
    #[serde(deserialize_with = "lenient")]
    pub finished_unix_ms: Option<u64>,
    /// Seconds per stage.
    #[serde(deserialize_with = "lenient")]
    pub stages: StageTimes,
    /// family → frontier level reached.
    #[serde(deserialize_with = "lenient")]
    pub frontier_level: BTreeMap<String, u32>,
    /// family → level → oracle tokens of an episode at that level.
    #[serde(deserialize_with = "lenient")]
    pub level_tokens: BTreeMap<String, BTreeMap<String, f64>>,
    /// The ablation's figures.
    #[serde(deserialize_with = "lenient")]
    pub ablation: Ablation,
    /// Success at the frontier of every evaluated stage (`sft`, `rl`, `ablation-<arm>`), each
    /// in its own window and fold.
    #[serde(deserialize_with = "lenient")]
    pub arms: BTreeMap<String, Option<f64>>,
    /// Goal targets.
    #[serde(deserialize_with = "lenient")]
    pub goals: GoalTargets,
    /// `[sft] heldout_loss_target` of the run's config, if it set one.
    #[serde(deserialize_with = "lenient")]
    pub sft_heldout_loss_target: Option<f64>,
}

impl RunInfo {
    /// Oracle tokens of `family` at `level`.
    pub fn oracle_tokens(&self, family: &str, level: u32) -> Option<f64> {
        self.level_tokens
            .get(family)?
            .get(&level.to_string())
            .copied()
    }
}

/// An evaluation stage: one checkpoint evaluated on held-out seeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// The randomly initialised policy.
    Random,
    /// After supervised fine-tuning.
    Sft,
    /// After RL (step-level credit).
    Rl,
    /// After RL with trajectory-level GRPO advantages (the ablation).
    AblationGrpo,
}

impl Stage {
    /// Every stage, in report order.
    pub const ALL: [Stage; 4] = [Stage::Random, Stage::Sft, Stage::Rl, Stage::AblationGrpo];

    /// Key in `report.json` and stem of `eval/<key>.json`.
    pub fn key(self) -> &'static str {
        match self {
            Stage::Random => "random",
            Stage::Sft => "sft",
            Stage::Rl => "rl",
            Stage::AblationGrpo => "ablation-grpo",
        }
    }

    /// Human label.
    pub fn label(self) -> &'static str {
        match self {
            Stage::Random => "random init",
            Stage::Sft => "SFT only",
            Stage::Rl => "SFT + RL",
            Stage::AblationGrpo => "SFT + RL, trajectory GRPO (ablation)",
        }
    }
}

/// A JSONL file's records and how many lines could not be read.
pub struct Jsonl<T> {
    /// Records in file order.
    pub records: Vec<T>,
    /// Lines that were not a JSON object (typically a torn last line).
    pub bad_lines: usize,
}

/// Everything the report reads from one run folder.
#[derive(Default)]
pub struct Inputs {
    /// `run.json`.
    pub run: Option<RunInfo>,
    /// `metrics/metrics.jsonl`.
    pub updates: Vec<Update>,
    /// `metrics/sft.jsonl`.
    pub sft: Vec<SftStep>,
    /// `eval/<stage>.json` by stage.
    pub eval: BTreeMap<Stage, EvalFile>,
    /// `eval/ablation-<arm>.json` of the ablation arms other than `grpo`, by stage name.
    pub arm_evals: BTreeMap<String, EvalFile>,
    /// Inputs that are absent, one sentence each.
    pub missing: Vec<String>,
    /// Inputs that are present but partly unreadable, one sentence each.
    pub notes: Vec<String>,
    /// `[sft] heldout_loss_target` of the learner's own copy of its config (`config.toml`),
    /// for runs without `run.json` (a learner started by hand).
    pub config_sft_target: Option<f64>,
}

impl Inputs {
    /// Reads every input under `run_dir`. Absent files are listed in `missing`; a whole-file
    /// input that is not valid JSON (a file torn by a killed writer) is listed there too, with
    /// the parse error.
    ///
    /// Fails only when a file exists but cannot be read at all (permissions, not UTF-8).
    pub fn read(run_dir: &Path) -> anyhow::Result<Self> {
        let mut inputs = Inputs::default();

        match load_json::<RunInfo>(&run_dir.join("run.json"))? {
            Loaded::Present(r) => inputs.run = Some(r),
            Loaded::Absent => inputs.missing.push(
                "run.json (no run summary: times, frontier, oracle tokens and ablation unknown)"
                    .into(),
            ),
            Loaded::Invalid(e) => inputs
                .missing
                .push(format!("run.json is not valid JSON ({e})")),
        }

        inputs.config_sft_target = read_text(&run_dir.join("config.toml"))?
            .and_then(|t| t.parse::<toml::Table>().ok())
            .and_then(|t| t.get("sft")?.get("heldout_loss_target")?.as_float());

        let metrics_path = run_dir.join("metrics").join("metrics.jsonl");
        match read_jsonl::<UpdateRecord>(&metrics_path)? {
            Some(j) => {
                if j.bad_lines > 0 {
                    inputs.notes.push(format!(
                        "metrics/metrics.jsonl: {} unreadable line(s) skipped",
                        j.bad_lines
                    ));
                }
                if j.records.is_empty() {
                    inputs
                        .missing
                        .push("metrics/metrics.jsonl has no RL update yet".into());
                }
                let start = inputs.run.as_ref().and_then(|r| r.started_unix_ms);
                inputs.updates = j
                    .records
                    .into_iter()
                    .map(|record| Update {
                        wall_s: start.map(|t0| record.unix_ms.saturating_sub(t0) as f64 / 1000.0),
                        record,
                    })
                    .collect();
            }
            None => inputs
                .missing
                .push("metrics/metrics.jsonl (no RL update was recorded)".into()),
        }

        let sft_path = run_dir.join("metrics").join("sft.jsonl");
        match read_jsonl::<SftStep>(&sft_path)? {
            Some(j) => {
                if j.bad_lines > 0 {
                    inputs.notes.push(format!(
                        "metrics/sft.jsonl: {} unreadable line(s) skipped",
                        j.bad_lines
                    ));
                }
                inputs.sft = j.records;
            }
            None => inputs
                .missing
                .push("metrics/sft.jsonl (no SFT step was recorded)".into()),
        }

        for stage in Stage::ALL {
            match load_json::<EvalFile>(&eval_path(run_dir, stage))? {
                Loaded::Present(e) => {
                    inputs.eval.insert(stage, e);
                }
                // The ablation is a separate run; its absence is not a gap in this one.
                Loaded::Absent if stage == Stage::AblationGrpo => {}
                Loaded::Absent => inputs.missing.push(format!(
                    "eval/{}.json (no held-out evaluation of the {} policy)",
                    stage.key(),
                    stage.label()
                )),
                Loaded::Invalid(e) => inputs
                    .missing
                    .push(format!("eval/{}.json is not valid JSON ({e})", stage.key())),
            }
        }
        // The other ablation arms (`[run] ablation` as a table), each in its own file.
        let arm_files = std::fs::read_dir(run_dir.join("eval"))
            .map(|rd| rd.flatten().map(|e| e.path()).collect::<Vec<_>>())
            .unwrap_or_default();
        for path in arm_files {
            let Some(stem) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".json"))
                .filter(|s| s.starts_with("ablation-") && *s != Stage::AblationGrpo.key())
            else {
                continue;
            };
            match load_json::<EvalFile>(&path)? {
                Loaded::Present(e) => {
                    inputs.arm_evals.insert(stem.to_string(), e);
                }
                Loaded::Absent => {}
                Loaded::Invalid(e) => inputs
                    .missing
                    .push(format!("eval/{stem}.json is not valid JSON ({e})")),
            }
        }
        Ok(inputs)
    }
}

/// `eval/<stage>.json` under `run_dir`.
pub fn eval_path(run_dir: &Path, stage: Stage) -> PathBuf {
    run_dir.join("eval").join(format!("{}.json", stage.key()))
}

fn read_text(path: &Path) -> anyhow::Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// A whole-file JSON input.
pub enum Loaded<T> {
    /// The file does not exist.
    Absent,
    /// The file exists but is not the expected JSON; the parse error.
    Invalid(String),
    /// The file's content.
    Present(T),
}

/// Reads a whole-file JSON input.
pub fn load_json<T: DeserializeOwned>(path: &Path) -> anyhow::Result<Loaded<T>> {
    let Some(text) = read_text(path)? else {
        return Ok(Loaded::Absent);
    };
    Ok(match serde_json::from_str(&text) {
        Ok(v) => Loaded::Present(v),
        Err(e) => Loaded::Invalid(e.to_string()),
    })
}

/// A JSONL input, or `None` when the file does not exist. Blank lines are ignored; lines that
/// are not a JSON object of `T` are counted in `bad_lines`. A `null` where `T` has a float
/// reads as NaN ([`NullAsNan`]).
pub fn read_jsonl<T: DeserializeOwned>(path: &Path) -> anyhow::Result<Option<Jsonl<T>>> {
    let Some(text) = read_text(path)? else {
        return Ok(None);
    };
    let mut out = Jsonl {
        records: Vec::new(),
        bad_lines: 0,
    };
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match serde_json::from_str::<serde_json::Value>(line) {
            Ok(v @ serde_json::Value::Object(_)) => match T::deserialize(NullAsNan(&v)) {
                Ok(r) => out.records.push(r),
                Err(_) => out.bad_lines += 1,
            },
            _ => out.bad_lines += 1,
        }
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_types_read_as_absent_and_torn_lines_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sft.jsonl");
        std::fs::write(
            &p,
            "{\"step\": 1, \"loss\": \"high\", \"lr\": 0.5}\n\
             \n\
             {\"step\": 2, \"loss\": null, \"heldout_loss\": 0.25}\n\
             {\"step\": 3, \"loss\"",
        )
        .unwrap();
        let j = read_jsonl::<SftStep>(&p).unwrap().unwrap();
        assert_eq!(j.records.len(), 2);
        assert_eq!(j.bad_lines, 1);
        assert_eq!(j.records[0].loss, None);
        assert_eq!(j.records[0].lr, Some(0.5));
        assert_eq!(j.records[1].loss, None);
        assert_eq!(j.records[1].eval_loss, Some(0.25));
        assert!(read_jsonl::<SftStep>(&dir.path().join("absent"))
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_non_finite_learner_figure_reads_as_nan_and_a_foreign_line_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let mut rec = UpdateRecord {
            step: 4,
            ..UpdateRecord::default()
        };
        rec.loss.grad_norm = f64::NAN;
        rec.loss.kl = f64::INFINITY;
        let line = serde_json::to_string(&rec).unwrap();
        assert!(line.contains("\"grad_norm\":null"), "{line}");
        let p = dir.path().join("metrics.jsonl");
        std::fs::write(&p, format!("{line}\n{{\"update\": 5, \"kl\": 0.1}}\n")).unwrap();
        let j = read_jsonl::<UpdateRecord>(&p).unwrap().unwrap();
        assert_eq!(j.bad_lines, 1, "a line that is not an UpdateRecord");
        let r = &j.records[0];
        assert_eq!(r.step, 4);
        assert!(r.loss.grad_norm.is_nan() && r.loss.kl.is_nan());
        assert_eq!(r.loss.entropy, 0.0);
    }

    #[test]
    fn a_learner_run_without_run_json_takes_the_sft_target_from_its_config_copy() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Inputs::read(dir.path()).unwrap().config_sft_target, None);
        std::fs::write(
            dir.path().join("config.toml"),
            "run_name = \"x\"\n[sft]\nsteps = 6\nheldout_loss_target = 0.01\n",
        )
        .unwrap();
        assert_eq!(
            Inputs::read(dir.path()).unwrap().config_sft_target,
            Some(0.01)
        );
        std::fs::write(dir.path().join("config.toml"), "[sft\n").unwrap();
        assert_eq!(
            Inputs::read(dir.path()).unwrap().config_sft_target,
            None,
            "an unreadable copy says nothing"
        );
    }

    #[test]
    fn a_torn_whole_file_input_is_reported_missing_with_its_parse_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("run.json"), "{ \"name\": \"de").unwrap();
        let inputs = Inputs::read(dir.path()).unwrap();
        assert!(inputs.run.is_none());
        assert!(
            inputs
                .missing
                .iter()
                .any(|m| m.starts_with("run.json is not valid JSON")),
            "{:?}",
            inputs.missing
        );
    }
}
