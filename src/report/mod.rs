//! The end-of-run report: `report.json`, PNG charts under `plots/` and a self-contained
//! `report.html`, computed from what a run folder holds (see [`inputs`]).
//!
//! The headline figures ([`headline`]) are held-out success rates at the *frontier level of
//! the main family*:
//!
//! - main family: `run.json`'s `main_family`; else the only family of `run.json`'s
//!   `frontier_level`; else the first family of `eval/rl.json`, `eval/sft.json`, `eval/random.json`;
//! - frontier level: `run.json`'s `frontier_level[main]`; else the last `curriculum.frontier[main]`
//!   of `metrics/metrics.jsonl`;
//! - `success.<stage>`: `success_rate` of that family and level in `eval/<stage>.json`;
//! - `frontier_tokens_ratio_vs_level1`: `level_tokens[main][frontier] / level_tokens[main]["1"]`
//!   (oracle tokens, from `run.json`);
//! - `ablation.step_level`, `ablation.trajectory_grpo`: from `run.json`; the second falls back to
//!   `eval/ablation-grpo.json` at the frontier.
//!
//! Goals ([`goals`], targets overridable in `run.json`'s `goals`): RL beats SFT-only at the
//! frontier by >= 15 points; the curriculum reaches a level with >= 4x the oracle tokens of
//! level 1; the run finishes within 20 minutes. A goal that cannot be measured is reported
//! `met: false`, `measured: null`, with a note saying which input is missing. Nothing here is
//! tuned to make a goal pass: the figures are read, not chosen.
//!
//! This file holds the report's shape, the training summary and the success table; the
//! charts are drawn by [`charts`] and the page by `html`.

mod charts;
mod goals;
mod headline;
mod html;
pub mod inputs;
mod null_floats;
mod plots;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

pub use goals::Goal;
pub use headline::Headline;
use inputs::{EvalFile, Inputs, RunInfo, SftStep, Stage, Update};

/// The expert-load heat map averages the last this many updates that carry MoE health.
pub const EXPERT_LOAD_LAST_N: usize = 10;

/// One row of the success-by-level table: a family and level across stages.
#[derive(Debug, Clone, Serialize)]
pub struct SuccessRow {
    /// Family.
    pub family: String,
    /// Level.
    pub level: u32,
    /// Oracle tokens of an episode at this level, from `run.json`.
    pub oracle_tokens: Option<f64>,
    /// Random init.
    pub random: Option<f64>,
    /// SFT only.
    pub sft: Option<f64>,
    /// SFT + RL.
    pub rl: Option<f64>,
    /// SFT + RL with trajectory-level GRPO.
    pub ablation_grpo: Option<f64>,
}

/// Averaged load of one MoE layer over the last updates.
#[derive(Debug, Clone, Serialize)]
pub struct LayerLoad {
    /// Layer index.
    pub layer: u32,
    /// Mean share of routed tokens per expert `[E]`.
    pub load: Vec<f64>,
    /// Mean `max_vio`.
    pub max_vio: Option<f64>,
    /// Mean router entropy (nats).
    pub router_entropy: Option<f64>,
    /// Dead experts in the last update.
    pub dead_experts: Option<f64>,
}

/// What the training logs say, summarised.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Training {
    /// RL updates recorded.
    pub rl_updates: usize,
    /// Last update number.
    pub last_update: Option<u64>,
    /// Last policy version.
    pub last_policy_version: Option<u64>,
    /// Seconds since start at the last update.
    pub last_wall_s: Option<f64>,
    /// Mean `reward_mean` over the last 10 updates.
    pub final_reward_mean: Option<f64>,
    /// Mean `success_rate` over the last 10 updates.
    pub final_success_rate: Option<f64>,
    /// Frontier per family at the last update.
    pub frontier_by_family: BTreeMap<String, u32>,
    /// Training success per family and level at the last update.
    pub last_success_by_family_level: BTreeMap<String, BTreeMap<String, Option<f64>>>,
    /// Loss spikes at the last update.
    pub loss_spikes: Option<u64>,
    /// Mean trained tokens per second over the run.
    pub mean_tokens_per_s: Option<f64>,
    /// Mean staleness over the run.
    pub mean_staleness: Option<f64>,
    /// Mean episodes consumed per second over the run.
    pub mean_episodes_per_s: Option<f64>,
    /// Updates averaged in `expert_load`.
    pub expert_load_updates: usize,
    /// Per-layer expert load averaged over the last updates.
    pub expert_load: Vec<LayerLoad>,
    /// SFT steps recorded.
    pub sft_steps: usize,
    /// Last SFT training loss.
    pub sft_final_loss: Option<f64>,
    /// Last held-out SFT loss.
    pub sft_final_eval_loss: Option<f64>,
    /// `[sft] heldout_loss_target`, when the run set one.
    pub sft_heldout_loss_target: Option<f64>,
    /// Whether the last held-out loss logged reached that target (none without a target or
    /// a held-out loss). `false` means SFT stopped at its step cap instead.
    pub sft_reached_target: Option<bool>,
}

/// One chart written with the report.
#[derive(Debug, Clone, Serialize)]
pub struct Plot {
    /// Path relative to the run folder.
    pub file: String,
    /// Title.
    pub title: String,
    /// What the chart shows.
    pub caption: String,
}

/// Facts about the run from `run.json`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunFacts {
    /// Run name (`run.json`, else the folder name).
    pub name: String,
    /// Config file.
    pub config: Option<String>,
    /// Start (Unix ms).
    pub started_unix_ms: Option<u64>,
    /// Finish (Unix ms); `None` for an interrupted run.
    pub finished_unix_ms: Option<u64>,
    /// Whether `run.json` records a finish.
    pub finished: bool,
    /// Minutes from start to finish.
    pub duration_minutes: Option<f64>,
    /// Seconds per stage.
    pub stages: inputs::StageTimes,
    /// Frontier level per family.
    pub frontier_level: BTreeMap<String, u32>,
}

/// Everything in `report.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Schema version of this file.
    pub report_version: u32,
    /// The run.
    pub run: RunFacts,
    /// Headline figures (flattened to the top level).
    #[serde(flatten)]
    pub headline: Headline,
    /// The goals.
    pub goals: Vec<Goal>,
    /// Success per family and level across stages.
    pub success_table: Vec<SuccessRow>,
    /// The evaluation files, per stage key.
    pub eval: BTreeMap<String, EvalFile>,
    /// Training summary.
    pub training: Training,
    /// Charts written.
    pub plots: Vec<Plot>,
    /// Inputs that are absent, one sentence each.
    pub missing: Vec<String>,
    /// Other remarks (partly unreadable inputs, charts that could not be drawn).
    pub notes: Vec<String>,
}

/// What [`fn@write`] produced: paths and the headline figures.
#[derive(Debug, Clone)]
pub struct ReportSummary {
    /// `report.json`.
    pub json: PathBuf,
    /// `report.html`.
    pub html: PathBuf,
    /// The PNG charts.
    pub plots: Vec<PathBuf>,
    /// Headline figures.
    pub headline: Headline,
    /// Goals and whether they were met.
    pub goals: Vec<Goal>,
    /// Inputs that are absent.
    pub missing: Vec<String>,
}

/// Reads the run folder and writes `report.json`, `plots/*.png` and `report.html` into it.
///
/// Works on a finished or an interrupted run: absent inputs are listed in the report's
/// `missing` and the figures that depend on them are `null`. Fails when `run_dir` is not a
/// folder or an output cannot be written.
pub fn write(run_dir: &Path) -> Result<ReportSummary> {
    anyhow::ensure!(
        run_dir.is_dir(),
        "no run folder at {}: the directory does not exist",
        run_dir.display()
    );
    let inputs = Inputs::read(run_dir)?;
    let mut report = build(run_dir, &inputs);
    let plots = charts::draw(run_dir, &inputs, &mut report)?;

    let json = run_dir.join("report.json");
    let text = serde_json::to_string_pretty(&report).context("serialising report.json")?;
    write_atomic(&json, text.as_bytes())?;
    let html = run_dir.join("report.html");
    write_atomic(&html, html::render(&report).as_bytes())?;

    Ok(ReportSummary {
        json,
        html,
        plots,
        headline: report.headline,
        goals: report.goals,
        missing: report.missing,
    })
}

/// Writes through a temporary file and a rename, so a reader never sees half a report.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming into {}", path.display()))
}

/// Computes `report.json`'s content (without the charts).
pub fn build(run_dir: &Path, inputs: &Inputs) -> Report {
    let run = inputs.run.clone().unwrap_or_default();
    let mut notes = inputs.notes.clone();
    let mut missing = inputs.missing.clone();

    let headline = headline::headline(&run, inputs, &mut missing, &mut notes);
    let facts = run_facts(run_dir, &run);
    let goals = goals::goals(&headline, &facts, &run.goals);
    let training = training(inputs);
    if let (Some(false), Some(target), Some(loss)) = (
        training.sft_reached_target,
        training.sft_heldout_loss_target,
        training.sft_final_eval_loss,
    ) {
        notes.push(format!(
            "SFT stopped at its step cap ({} steps) with held-out loss {loss:.4}, above its \
             target {target}: RL started from a policy that had not learnt its \
             demonstrations as well as the config asks (raise [sft] steps)",
            training.sft_steps,
        ));
    }
    notes.extend(absent_metric_keys(&inputs.updates, &inputs.sft));

    Report {
        report_version: 1,
        run: facts,
        headline,
        goals,
        success_table: success_table(&run, inputs),
        eval: inputs
            .eval
            .iter()
            .map(|(s, e)| (s.key().to_string(), e.clone()))
            .collect(),
        training,
        plots: Vec::new(),
        missing,
        notes,
    }
}

fn run_facts(run_dir: &Path, run: &RunInfo) -> RunFacts {
    let duration_minutes = match (run.started_unix_ms, run.finished_unix_ms) {
        (Some(s), Some(f)) if f >= s => Some((f - s) as f64 / 60_000.0),
        _ => None,
    };
    RunFacts {
        name: run.name.clone().unwrap_or_else(|| {
            run_dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| run_dir.display().to_string())
        }),
        config: run.config.clone(),
        started_unix_ms: run.started_unix_ms,
        finished_unix_ms: run.finished_unix_ms,
        finished: run.finished_unix_ms.is_some(),
        duration_minutes,
        stages: run.stages.clone(),
        frontier_level: run.frontier_level.clone(),
    }
}

fn success_table(run: &RunInfo, inputs: &Inputs) -> Vec<SuccessRow> {
    let mut keys: BTreeSet<(String, u32)> = BTreeSet::new();
    for e in inputs.eval.values() {
        for f in &e.families {
            for l in f.levels.iter().filter_map(|l| l.level) {
                keys.insert((f.family.clone(), l));
            }
        }
    }
    let rate = |stage: Stage, f: &str, l: u32| {
        inputs
            .eval
            .get(&stage)
            .and_then(|e| e.level(f, l))
            .and_then(|lv| lv.success_rate)
    };
    keys.into_iter()
        .map(|(family, level)| SuccessRow {
            oracle_tokens: run.oracle_tokens(&family, level),
            random: rate(Stage::Random, &family, level),
            sft: rate(Stage::Sft, &family, level),
            rl: rate(Stage::Rl, &family, level),
            ablation_grpo: rate(Stage::AblationGrpo, &family, level),
            family,
            level,
        })
        .collect()
}

fn mean(xs: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let (s, n) = xs
        .flatten()
        .filter(|x| x.is_finite())
        .fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    (n > 0).then(|| s / n as f64)
}

/// Running sums of one MoE layer's health over the updates averaged.
#[derive(Default)]
struct LayerAcc {
    /// Sum of load shares per expert `[E]`.
    sum: Vec<f64>,
    /// Finite values summed per expert `[E]`.
    n: Vec<usize>,
    max_vio: Vec<f64>,
    router_entropy: Vec<f64>,
}

impl LayerAcc {
    fn add(&mut self, m: &corvid_model::MoeHealth) {
        if self.sum.len() < m.load.len() {
            self.sum.resize(m.load.len(), 0.0);
            self.n.resize(m.load.len(), 0);
        }
        for (j, &v) in m.load.iter().enumerate().filter(|(_, v)| v.is_finite()) {
            self.sum[j] += v;
            self.n[j] += 1;
        }
        self.max_vio.push(m.max_vio);
        self.router_entropy.push(m.router_entropy);
    }

    /// The layer's averages; `dead_experts` is taken from the latest update.
    fn load(self, layer: u32, dead_experts: Option<f64>) -> LayerLoad {
        LayerLoad {
            layer,
            load: self
                .sum
                .iter()
                .zip(&self.n)
                .map(|(s, &n)| if n > 0 { s / n as f64 } else { 0.0 })
                .collect(),
            max_vio: mean(self.max_vio.into_iter().map(Some)),
            router_entropy: mean(self.router_entropy.into_iter().map(Some)),
            dead_experts,
        }
    }
}

/// Per-layer load averaged over the last `EXPERT_LOAD_LAST_N` updates carrying MoE health.
fn expert_load(updates: &[Update]) -> (usize, Vec<LayerLoad>) {
    let recent: Vec<&Update> = updates
        .iter()
        .rev()
        .filter(|u| u.record.moe.iter().any(|m| !m.load.is_empty()))
        .take(EXPERT_LOAD_LAST_N)
        .collect();
    let mut acc: BTreeMap<u32, LayerAcc> = BTreeMap::new();
    for u in &recent {
        for (layer, m) in u.moe_layers() {
            acc.entry(layer).or_default().add(m);
        }
    }
    let dead_in_last = |layer: u32| {
        let (_, m) = recent.first()?.moe_layers().find(|(id, _)| *id == layer)?;
        Some(m.dead_experts as f64)
    };
    let layers = acc
        .into_iter()
        .map(|(layer, a)| a.load(layer, dead_in_last(layer)))
        .collect();
    (recent.len(), layers)
}

fn training(inputs: &Inputs) -> Training {
    let u = &inputs.updates;
    let last = u.last();
    let tail = &u[u.len().saturating_sub(10)..];
    let mean_of =
        |updates: &[Update], fig: fn(&Update) -> f64| mean(updates.iter().map(|l| Some(fig(l))));
    let (expert_load_updates, expert_load) = expert_load(u);
    let final_eval_loss = inputs.sft.iter().rev().find_map(|s| s.eval_loss);
    let target = inputs
        .run
        .as_ref()
        .and_then(|r| r.sft_heldout_loss_target)
        .or(inputs.config_sft_target);
    Training {
        rl_updates: u.len(),
        last_update: last.map(|l| l.record.step),
        last_policy_version: last.map(|l| l.record.policy_version),
        last_wall_s: u.iter().rev().find_map(|l| l.wall_s),
        final_reward_mean: mean_of(tail, |l| l.record.rollout.reward_mean),
        final_success_rate: mean_of(tail, |l| l.record.rollout.success_rate),
        frontier_by_family: u
            .iter()
            .rev()
            .find(|l| !l.frontier().is_empty())
            .map(|l| l.frontier().clone())
            .unwrap_or_default(),
        last_success_by_family_level: u
            .iter()
            .rev()
            .map(Update::success_by_family_level)
            .find(|by_level| !by_level.is_empty())
            .unwrap_or_default(),
        loss_spikes: last.map(|l| l.record.spikes.count),
        mean_tokens_per_s: mean_of(u, |l| l.record.rollout.tokens_per_s),
        mean_staleness: mean_of(u, |l| l.record.rollout.staleness_mean),
        mean_episodes_per_s: mean_of(u, |l| l.record.rollout.episodes_per_s),
        expert_load_updates,
        expert_load,
        sft_steps: inputs.sft.len(),
        sft_final_loss: inputs.sft.iter().rev().find_map(|s| s.loss),
        sft_final_eval_loss: final_eval_loss,
        sft_heldout_loss_target: target,
        sft_reached_target: target.zip(final_eval_loss).map(|(t, l)| l <= t),
    }
}

/// Notes for figures the metrics never carry usably (so a blank chart is explained): a
/// collection that is always empty, a float that is never finite (written as `null`), or
/// `wall_s` without `run.json`'s start time. Every other figure is in every record.
fn absent_metric_keys(updates: &[Update], sft: &[SftStep]) -> Vec<String> {
    type Has = fn(&Update) -> bool;
    let checks: [(&str, Has); 11] = [
        ("wall_s", |u| u.wall_s.is_some()),
        ("reward_mean", |u| u.record.rollout.reward_mean.is_finite()),
        ("success_rate", |u| {
            u.record.rollout.success_rate.is_finite()
        }),
        ("success_by_family_level", |u| {
            !u.success_by_family_level().is_empty()
        }),
        ("frontier", |u| !u.frontier().is_empty()),
        ("kl", |u| u.record.loss.kl.is_finite()),
        ("entropy", |u| u.record.loss.entropy.is_finite()),
        ("policy_loss", |u| u.record.loss.policy.is_finite()),
        ("staleness_mean", |u| {
            u.record.rollout.staleness_mean.is_finite()
        }),
        ("tokens_per_s", |u| {
            u.record.rollout.tokens_per_s.is_finite()
        }),
        ("moe", |u| !u.record.moe.is_empty()),
    ];
    let mut out = Vec::new();
    if !updates.is_empty() {
        for (key, has) in checks {
            if !updates.iter().any(has) {
                out.push(format!("metrics/metrics.jsonl never has a usable `{key}`"));
            }
        }
    }
    if !sft.is_empty() && !sft.iter().any(|s| s.loss.is_some()) {
        out.push("metrics/sft.jsonl never has a usable `loss`".into());
    }
    out
}

#[cfg(test)]
mod tests;
