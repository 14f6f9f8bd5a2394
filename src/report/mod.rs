//! The end-of-run report: `report.json`, PNG charts under `plots/` and a self-contained
//! `report.html`, computed from what a run folder holds (see [`inputs`]).
//!
//! The headline figures are held-out success rates at the *frontier level of the main family*:
//!
//! - main family: `run.json`'s `main_family`; else the only family of `run.json`'s
//!   `frontier_level`; else the first family of `eval/rl.json`, `eval/sft.json`, `eval/random.json`;
//! - frontier level: `run.json`'s `frontier_level[main]`; else the last `frontier[main]` of
//!   `metrics/metrics.jsonl`;
//! - `success.<stage>`: `success_rate` of that family and level in `eval/<stage>.json`;
//! - `frontier_tokens_ratio_vs_level1`: `level_tokens[main][frontier] / level_tokens[main]["1"]`
//!   (oracle tokens, from `run.json`);
//! - `ablation.step_level`, `ablation.trajectory_grpo`: from `run.json`; the second falls back to
//!   `eval/ablation-grpo.json` at the frontier.
//!
//! Goals (targets overridable in `run.json`'s `goals`): RL beats SFT-only at the frontier by
//! ≥ 15 points; the curriculum reaches a level with ≥ 4× the oracle tokens of level 1; the run
//! finishes within 20 minutes. A goal that cannot be measured is reported `met: false`,
//! `measured: null`, with a note saying which input is missing. Nothing here is tuned to make a
//! goal pass: the figures are read, not chosen.

mod html;
pub mod inputs;
mod plots;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

use inputs::{Ablation, EvalFile, Inputs, RunInfo, SftStep, Stage, UpdateMetrics};
use plots::{HeatMap, Panel, Series};

/// Default goal: RL minus SFT-only success at the frontier, in points.
pub const GOAL_RL_MINUS_SFT_POINTS: f64 = 15.0;
/// Default goal: oracle tokens at the frontier level over level 1.
pub const GOAL_FRONTIER_TOKENS_RATIO: f64 = 4.0;
/// Default goal: wall-clock minutes of the whole run.
pub const GOAL_MAX_MINUTES: f64 = 20.0;
/// The expert-load heat map averages the last this many updates that carry MoE health.
pub const EXPERT_LOAD_LAST_N: usize = 10;

/// Held-out success at the frontier, per stage.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StageSuccess {
    /// The randomly initialised policy.
    pub random: Option<f64>,
    /// After SFT.
    pub sft: Option<f64>,
    /// After RL.
    pub rl: Option<f64>,
}

/// The headline figures (top-level keys of `report.json`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Headline {
    /// The family the figures are taken at.
    pub main_family: Option<String>,
    /// Frontier level of the main family.
    pub frontier_level: Option<u32>,
    /// Oracle tokens at the frontier level over level 1.
    pub frontier_tokens_ratio_vs_level1: Option<f64>,
    /// Success at the frontier per stage, in `[0, 1]`.
    pub success: StageSuccess,
    /// Success at the frontier of the two credit-assignment variants.
    pub ablation: Ablation,
}

/// One goal of the demo and whether the run met it.
#[derive(Debug, Clone, Serialize)]
pub struct Goal {
    /// What the goal asks, in words.
    pub name: String,
    /// The target value (`measured >= target`, or `<=` for durations; see `comparison`).
    pub target: f64,
    /// `">="` or `"<="`.
    pub comparison: &'static str,
    /// Unit of `target` and `measured`.
    pub unit: &'static str,
    /// The measured value; `None` when an input is missing.
    pub measured: Option<f64>,
    /// Whether the goal is met (false when not measured).
    pub met: bool,
    /// One sentence: met, missed by how much, or which input is missing.
    pub note: String,
}

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

    let plot_dir = run_dir.join("plots");
    std::fs::create_dir_all(&plot_dir)
        .with_context(|| format!("creating {}", plot_dir.display()))?;
    let mut plot_paths = Vec::new();
    for (file, title, caption, draw) in charts(&inputs) {
        let rel = format!("plots/{file}");
        let path = run_dir.join(&rel);
        let drawn = match draw {
            Chart::Lines(panels) => plots::line_panels(&path, &panels),
            Chart::Heat(map) => plots::heat_map(&path, &map),
            Chart::NoData(why) => {
                report.missing.push(format!("{title} chart: {why}"));
                // A chart from an earlier report of this run must not pass for a current one.
                let _ = std::fs::remove_file(&path);
                continue;
            }
        };
        match drawn {
            Ok(()) => {
                plot_paths.push(path);
                report.plots.push(Plot {
                    file: rel,
                    title: title.into(),
                    caption,
                });
            }
            Err(e) => {
                tracing::warn!("{title} chart not drawn: {e:#}");
                report
                    .notes
                    .push(format!("{title} chart could not be drawn: {e:#}"));
            }
        }
    }

    let json = run_dir.join("report.json");
    let text = serde_json::to_string_pretty(&report).context("serialising report.json")?;
    write_atomic(&json, text.as_bytes())?;
    let html = run_dir.join("report.html");
    write_atomic(&html, html::render(&report).as_bytes())?;

    Ok(ReportSummary {
        json,
        html,
        plots: plot_paths,
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

    let main_family = main_family(&run, inputs);
    let frontier_level = main_family
        .as_deref()
        .and_then(|f| frontier_of(&run, &inputs.updates, f));
    match (&main_family, frontier_level) {
        (None, _) => missing.push(
            "the main family (no run.json frontier, no evaluation file): no headline figure".into(),
        ),
        (Some(f), None) => missing.push(format!(
            "the frontier level of {f} (neither run.json nor metrics.jsonl records it)"
        )),
        _ => {}
    }

    let at_frontier = |stage: Stage| -> Option<f64> {
        let (f, l) = (main_family.as_deref()?, frontier_level?);
        inputs.eval.get(&stage)?.level(f, l)?.success_rate
    };
    let success = StageSuccess {
        random: at_frontier(Stage::Random),
        sft: at_frontier(Stage::Sft),
        rl: at_frontier(Stage::Rl),
    };
    if let (Some(f), Some(l)) = (&main_family, frontier_level) {
        for stage in [Stage::Random, Stage::Sft, Stage::Rl] {
            let Some(e) = inputs.eval.get(&stage) else {
                continue;
            };
            match e.level(f, l) {
                None => missing.push(format!(
                    "eval/{}.json has no {f} level {l} (the frontier): success.{} is null",
                    stage.key(),
                    stage.key()
                )),
                Some(lv) if lv.success_rate.is_none() => missing.push(format!(
                    "eval/{}.json has no success rate for {f} level {l}",
                    stage.key()
                )),
                Some(_) => {}
            }
        }
    }

    let tokens_ratio = match (&main_family, frontier_level) {
        (Some(f), Some(l)) => match (run.oracle_tokens(f, l), run.oracle_tokens(f, 1)) {
            (Some(t), Some(t1)) if t1 > 0.0 => Some(t / t1),
            _ => {
                missing.push(format!(
                    "run.json level_tokens for {f} levels 1 and {l}: the token ratio is null"
                ));
                None
            }
        },
        _ => None,
    };

    let mut ablation = run.ablation.clone();
    if ablation.trajectory_grpo.is_none() {
        ablation.trajectory_grpo = at_frontier(Stage::AblationGrpo);
        if ablation.trajectory_grpo.is_some() {
            notes.push("ablation.trajectory_grpo read from eval/ablation-grpo.json".into());
        }
    }
    if ablation.step_level.is_none() {
        missing.push("run.json ablation.step_level (step-level credit arm)".into());
    }
    if ablation.trajectory_grpo.is_none() {
        missing.push(
            "ablation.trajectory_grpo (neither run.json nor eval/ablation-grpo.json has it)".into(),
        );
    }

    let headline = Headline {
        main_family: main_family.clone(),
        frontier_level,
        frontier_tokens_ratio_vs_level1: tokens_ratio,
        success,
        ablation,
    };
    let facts = run_facts(run_dir, &run);
    let goals = goals(&headline, &facts, &run);
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

fn main_family(run: &RunInfo, inputs: &Inputs) -> Option<String> {
    if let Some(f) = &run.main_family {
        return Some(f.clone());
    }
    if run.frontier_level.len() == 1 {
        return run.frontier_level.keys().next().cloned();
    }
    for stage in [Stage::Rl, Stage::Sft, Stage::Random] {
        if let Some(f) = inputs.eval.get(&stage).and_then(|e| e.families.first()) {
            return Some(f.family.clone());
        }
    }
    run.frontier_level.keys().next().cloned().or_else(|| {
        inputs
            .updates
            .iter()
            .rev()
            .find_map(|u| u.frontier.keys().next().cloned())
    })
}

fn frontier_of(run: &RunInfo, updates: &[UpdateMetrics], family: &str) -> Option<u32> {
    run.frontier_level.get(family).copied().or_else(|| {
        updates
            .iter()
            .rev()
            .find_map(|u| u.frontier.get(family).copied())
    })
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

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

fn goals(h: &Headline, facts: &RunFacts, run: &RunInfo) -> Vec<Goal> {
    let at = match (&h.main_family, h.frontier_level) {
        (Some(f), Some(l)) => format!("{f} level {l}"),
        _ => "the frontier".into(),
    };

    let target = run
        .goals
        .rl_minus_sft_points
        .unwrap_or(GOAL_RL_MINUS_SFT_POINTS);
    let rl_vs_sft = match (h.success.rl, h.success.sft) {
        (Some(rl), Some(sft)) => {
            let d = 100.0 * (rl - sft);
            let met = d >= target;
            Goal {
                name: format!("RL beats SFT-only at the frontier by >= {target} points"),
                target,
                comparison: ">=",
                unit: "points",
                measured: Some(d),
                met,
                note: format!(
                    "{}: at {at}, SFT + RL {} vs SFT only {} ({d:+.1} points)",
                    if met { "met" } else { "MISSED" },
                    pct(rl),
                    pct(sft)
                ),
            }
        }
        (rl, sft) => {
            let absent: Vec<&str> = [("success.rl", rl), ("success.sft", sft)]
                .iter()
                .filter(|(_, v)| v.is_none())
                .map(|(k, _)| *k)
                .collect();
            Goal {
                name: format!("RL beats SFT-only at the frontier by >= {target} points"),
                target,
                comparison: ">=",
                unit: "points",
                measured: None,
                met: false,
                note: format!(
                    "not measured: {} missing (see `missing`)",
                    absent.join(" and ")
                ),
            }
        }
    };

    let target = run
        .goals
        .frontier_tokens_ratio
        .unwrap_or(GOAL_FRONTIER_TOKENS_RATIO);
    let name = format!("curriculum reaches a level with >= {target}x the tokens of level 1");
    let tokens = match h.frontier_tokens_ratio_vs_level1 {
        Some(r) => Goal {
            name,
            target,
            comparison: ">=",
            unit: "x",
            measured: Some(r),
            met: r >= target,
            note: format!(
                "{}: frontier {at} has {r:.2}x the oracle tokens of level 1",
                if r >= target { "met" } else { "MISSED" }
            ),
        },
        None => Goal {
            name,
            target,
            comparison: ">=",
            unit: "x",
            measured: None,
            met: false,
            note: "not measured: the frontier level or run.json's level_tokens is missing".into(),
        },
    };

    let target = run.goals.max_minutes.unwrap_or(GOAL_MAX_MINUTES);
    let name = format!("run finished within {target} minutes");
    let time = match facts.duration_minutes {
        Some(m) => Goal {
            name,
            target,
            comparison: "<=",
            unit: "minutes",
            measured: Some(m),
            met: m <= target,
            note: format!(
                "{}: the run took {m:.1} minutes",
                if m <= target { "met" } else { "MISSED" }
            ),
        },
        None => Goal {
            name,
            target,
            comparison: "<=",
            unit: "minutes",
            measured: None,
            met: false,
            note: if facts.started_unix_ms.is_none() {
                "not measured: run.json has no start time".into()
            } else {
                "not measured: run.json has no finish time (the run was interrupted or is still running)"
                    .into()
            },
        },
    };
    vec![rl_vs_sft, tokens, time]
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

/// Per-layer load averaged over the last `EXPERT_LOAD_LAST_N` updates carrying MoE health.
fn expert_load(updates: &[UpdateMetrics]) -> (usize, Vec<LayerLoad>) {
    let recent: Vec<&UpdateMetrics> = updates
        .iter()
        .rev()
        .filter(|u| u.moe.iter().any(|m| !m.load.is_empty()))
        .take(EXPERT_LOAD_LAST_N)
        .collect();
    #[derive(Default)]
    struct Acc {
        /// Sum of load shares per expert `[E]`.
        sum: Vec<f64>,
        /// Finite values summed per expert `[E]`.
        n: Vec<usize>,
        max_vio: Vec<f64>,
        router_entropy: Vec<f64>,
    }
    let mut acc: BTreeMap<u32, Acc> = BTreeMap::new();
    for u in &recent {
        for (i, m) in u.moe.iter().enumerate() {
            let layer = m.layer.unwrap_or(i as u32);
            let a = acc.entry(layer).or_default();
            if a.sum.len() < m.load.len() {
                a.sum.resize(m.load.len(), 0.0);
                a.n.resize(m.load.len(), 0);
            }
            for (j, &v) in m.load.iter().enumerate().filter(|(_, v)| v.is_finite()) {
                a.sum[j] += v;
                a.n[j] += 1;
            }
            a.max_vio.extend(m.max_vio);
            a.router_entropy.extend(m.router_entropy);
        }
    }
    let last = recent.first();
    let layers = acc
        .into_iter()
        .map(|(layer, a)| LayerLoad {
            layer,
            load: a
                .sum
                .iter()
                .zip(&a.n)
                .map(|(s, &n)| if n > 0 { s / n as f64 } else { 0.0 })
                .collect(),
            max_vio: mean(a.max_vio.into_iter().map(Some)),
            router_entropy: mean(a.router_entropy.into_iter().map(Some)),
            dead_experts: last.and_then(|u| {
                u.moe
                    .iter()
                    .enumerate()
                    .find(|(i, m)| m.layer.unwrap_or(*i as u32) == layer)
                    .and_then(|(_, m)| m.dead_experts)
            }),
        })
        .collect();
    (recent.len(), layers)
}

fn training(inputs: &Inputs) -> Training {
    let u = &inputs.updates;
    let last = u.last();
    let tail = &u[u.len().saturating_sub(10)..];
    let (expert_load_updates, expert_load) = expert_load(u);
    let final_eval_loss = inputs.sft.iter().rev().find_map(|s| s.eval_loss);
    let target = inputs
        .run
        .as_ref()
        .and_then(|r| r.sft_heldout_loss_target)
        .or(inputs.config_sft_target);
    Training {
        rl_updates: u.len(),
        last_update: last.and_then(|l| l.update),
        last_policy_version: u.iter().rev().find_map(|l| l.policy_version),
        last_wall_s: u.iter().rev().find_map(|l| l.wall_s),
        final_reward_mean: mean(tail.iter().map(|l| l.reward_mean)),
        final_success_rate: mean(tail.iter().map(|l| l.success_rate)),
        frontier_by_family: u
            .iter()
            .rev()
            .find(|l| !l.frontier.is_empty())
            .map(|l| l.frontier.clone())
            .unwrap_or_default(),
        last_success_by_family_level: u
            .iter()
            .rev()
            .find(|l| !l.success_by_family_level.is_empty())
            .map(|l| l.success_by_family_level.clone())
            .unwrap_or_default(),
        loss_spikes: u.iter().rev().find_map(|l| l.loss_spikes),
        mean_tokens_per_s: mean(u.iter().map(|l| l.tokens_per_s)),
        mean_staleness: mean(u.iter().map(|l| l.staleness_mean)),
        mean_episodes_per_s: mean(u.iter().map(|l| l.episodes_per_s)),
        expert_load_updates,
        expert_load,
        sft_steps: inputs.sft.len(),
        sft_final_loss: inputs.sft.iter().rev().find_map(|s| s.loss),
        sft_final_eval_loss: final_eval_loss,
        sft_heldout_loss_target: target,
        sft_reached_target: target.zip(final_eval_loss).map(|(t, l)| l <= t),
    }
}

/// Notes for metric keys the logs never carry (so a blank chart is explained).
fn absent_metric_keys(updates: &[UpdateMetrics], sft: &[SftStep]) -> Vec<String> {
    type Has = fn(&UpdateMetrics) -> bool;
    let checks: [(&str, Has); 13] = [
        ("wall_s", |u| u.wall_s.is_some()),
        ("reward_mean", |u| u.reward_mean.is_some()),
        ("success_rate", |u| u.success_rate.is_some()),
        ("success_by_family_level", |u| {
            !u.success_by_family_level.is_empty()
        }),
        ("frontier", |u| !u.frontier.is_empty()),
        ("kl", |u| u.kl.is_some()),
        ("entropy", |u| u.entropy.is_some()),
        ("policy_loss", |u| u.policy_loss.is_some()),
        ("staleness_mean", |u| u.staleness_mean.is_some()),
        ("tokens_per_s", |u| u.tokens_per_s.is_some()),
        ("moe", |u| !u.moe.is_empty()),
        ("update", |u| u.update.is_some()),
        ("loss_spikes", |u| u.loss_spikes.is_some()),
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

/// A chart to draw, or why there is nothing to draw.
enum Chart {
    Lines(Vec<Panel>),
    Heat(HeatMap),
    NoData(String),
}

/// X of each update: its `update` number, else its 1-based line number.
fn update_x(updates: &[UpdateMetrics]) -> Vec<f64> {
    updates
        .iter()
        .enumerate()
        .map(|(i, u)| u.update.map_or((i + 1) as f64, |n| n as f64))
        .collect()
}

fn series(label: &str, xs: &[f64], ys: impl Iterator<Item = Option<f64>>) -> Series {
    Series {
        label: label.into(),
        points: xs.iter().copied().zip(ys).collect(),
    }
}

fn lines_or_none(panels: Vec<Panel>, why: &str) -> Chart {
    let panels: Vec<Panel> = panels.into_iter().filter(Panel::has_data).collect();
    if panels.is_empty() {
        Chart::NoData(why.into())
    } else {
        Chart::Lines(panels)
    }
}

/// The report's charts: file name, title, caption, content.
fn charts(inputs: &Inputs) -> Vec<(&'static str, &'static str, String, Chart)> {
    let u = &inputs.updates;
    let xs = update_x(u);
    let panel = |title: &str, y: &str, series: Vec<Series>, y_range, step| Panel {
        title: title.into(),
        x_label: "update".into(),
        y_label: y.into(),
        series,
        y_range,
        step,
    };
    let no_rl = "no RL update recorded yet";
    let mut out = Vec::new();

    // Reward, then success: overall and, per family, at that update's frontier level.
    let families: BTreeSet<&String> = u
        .iter()
        .flat_map(|l| l.frontier.keys().chain(l.success_by_family_level.keys()))
        .collect();
    let mut success = vec![series("all", &xs, u.iter().map(|l| l.success_rate))];
    for f in &families {
        success.push(series(
            &format!("{f} @ frontier"),
            &xs,
            u.iter().map(|l| {
                let level = l.frontier.get(*f)?;
                *l.success_by_family_level.get(*f)?.get(&level.to_string())?
            }),
        ));
    }
    out.push((
        "reward_success.png",
        "Reward and success",
        "Training batches: mean episode reward per update; success rate overall and, per \
         family, at that update's frontier level (drops mark promotions)."
            .to_string(),
        lines_or_none(
            vec![
                panel(
                    "Mean episode reward",
                    "reward",
                    vec![series("reward", &xs, u.iter().map(|l| l.reward_mean))],
                    None,
                    false,
                ),
                panel("Success rate", "success", success, Some((0.0, 1.0)), false),
            ],
            no_rl,
        ),
    ));

    // Frontier over wall-clock time when every line has it, else over updates.
    let by_time = !u.is_empty() && u.iter().all(|l| l.wall_s.is_some());
    let fx: Vec<f64> = if by_time {
        u.iter().map(|l| l.wall_s.unwrap_or(0.0) / 60.0).collect()
    } else {
        xs.clone()
    };
    let frontier_series = families
        .iter()
        .map(|f| {
            series(
                f,
                &fx,
                u.iter().map(|l| l.frontier.get(*f).map(|&v| v as f64)),
            )
        })
        .collect();
    let mut frontier_panel = panel(
        "Curriculum frontier level",
        "level",
        frontier_series,
        None,
        true,
    );
    if by_time {
        frontier_panel.x_label = "minutes since start".into();
    }
    out.push((
        "frontier.png",
        "Frontier level",
        format!(
            "The curriculum's frontier level per family over {}.",
            if by_time {
                "wall-clock time"
            } else {
                "updates"
            }
        ),
        lines_or_none(vec![frontier_panel], "no `frontier` in the metrics"),
    ));

    out.push((
        "kl_entropy.png",
        "KL and entropy",
        "KL to the reference policy and mean token entropy of the policy, per update.".into(),
        lines_or_none(
            vec![
                panel(
                    "KL to the reference policy",
                    "KL (nats)",
                    vec![series("kl", &xs, u.iter().map(|l| l.kl))],
                    None,
                    false,
                ),
                panel(
                    "Policy entropy",
                    "entropy (nats/token)",
                    vec![series("entropy", &xs, u.iter().map(|l| l.entropy))],
                    None,
                    false,
                ),
            ],
            "no `kl` or `entropy` in the metrics",
        ),
    ));

    out.push((
        "policy_update.png",
        "Policy update",
        "Per update: share of tokens clipped below (1 - eps_low) and above (1 + eps_high), \
         importance weights of the learner over the behaviour policy (mean and largest), and \
         the gradient norm before clipping."
            .into(),
        lines_or_none(
            vec![
                panel(
                    "Clip fractions",
                    "share of tokens",
                    vec![
                        series("low", &xs, u.iter().map(|l| l.clip_frac_low)),
                        series("high", &xs, u.iter().map(|l| l.clip_frac_high)),
                    ],
                    None,
                    false,
                ),
                panel(
                    "Importance weights",
                    "weight",
                    vec![
                        series("mean", &xs, u.iter().map(|l| l.is_weight_mean)),
                        series("max", &xs, u.iter().map(|l| l.is_weight_max)),
                    ],
                    None,
                    false,
                ),
                panel(
                    "Gradient norm",
                    "norm",
                    vec![series("grad norm", &xs, u.iter().map(|l| l.grad_norm))],
                    None,
                    false,
                ),
            ],
            "no clip fractions, importance weights or gradient norms in the metrics",
        ),
    ));

    let (n, layers) = expert_load(u);
    let rows: Vec<Vec<f64>> = layers.iter().map(|l| l.load.clone()).collect();
    let max_e = rows.iter().map(Vec::len).max().unwrap_or(0);
    let max_load = rows.iter().flatten().copied().fold(0.0, f64::max);
    let heat = if rows.is_empty() || max_e == 0 {
        Chart::NoData(if u.is_empty() {
            no_rl.into()
        } else {
            "no `moe` load in the metrics".into()
        })
    } else {
        Chart::Heat(HeatMap {
            title: format!("Expert load per layer, mean of the last {n} update(s)"),
            x_label: "expert".into(),
            y_label: "layer".into(),
            // Even load is 1/E: the scale reaches at least twice that, so even sits mid-scale.
            scale_max: max_load.max(2.0 / max_e as f64),
            rows,
        })
    };
    out.push((
        "expert_load.png",
        "Expert load",
        format!(
            "Share of routed tokens per expert (columns) and layer (rows), averaged over the \
             last {n} update(s). Even load is 1/E per expert."
        ),
        heat,
    ));

    let layer_ids: BTreeSet<u32> = u
        .iter()
        .flat_map(|l| {
            l.moe
                .iter()
                .enumerate()
                .map(|(i, m)| m.layer.unwrap_or(i as u32))
        })
        .collect();
    let routing = layer_ids
        .iter()
        .map(|&layer| {
            series(
                &format!("layer {layer}"),
                &xs,
                u.iter().map(|l| {
                    l.moe
                        .iter()
                        .enumerate()
                        .find(|(i, m)| m.layer.unwrap_or(*i as u32) == layer)
                        .and_then(|(_, m)| m.router_entropy)
                }),
            )
        })
        .collect();
    out.push((
        "routing_entropy.png",
        "Routing entropy",
        "Mean per-token router entropy per MoE layer, per update.".into(),
        lines_or_none(
            vec![panel(
                "Router entropy per layer",
                "entropy (nats)",
                routing,
                None,
                false,
            )],
            "no `moe[].router_entropy` in the metrics",
        ),
    ));

    let s = &inputs.sft;
    let sx: Vec<f64> = s
        .iter()
        .enumerate()
        .map(|(i, st)| st.step.map_or((i + 1) as f64, |n| n as f64))
        .collect();
    out.push((
        "sft_loss.png",
        "SFT loss",
        "Supervised fine-tuning: training loss per step and held-out loss where measured.".into(),
        lines_or_none(
            vec![Panel {
                title: "SFT loss".into(),
                x_label: "step".into(),
                y_label: "cross-entropy (nats/token)".into(),
                series: vec![
                    series("train", &sx, s.iter().map(|st| st.loss)),
                    series("held-out", &sx, s.iter().map(|st| st.eval_loss)),
                ],
                y_range: None,
                step: false,
            }],
            "no SFT step recorded",
        ),
    ));
    out
}

#[cfg(test)]
mod tests;
