//! The headline figures: held-out success at the frontier level of the main family, the
//! frontier's oracle-token ratio to level 1, and the ablation's two arms.
//!
//! Where each comes from, and what it falls back to, is listed in the [`super`] overview. Each
//! figure that cannot be read adds one sentence to the report's `missing`.

use std::collections::BTreeMap;

use serde::Serialize;

use super::inputs::{Ablation, Inputs, RunInfo, Stage, Update};

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
    /// Success at the frontier of every evaluated stage but the random policy's, ablation arms
    /// included (`run.json`'s `arms`; empty without a frontier or in a run.json from before).
    pub arms: BTreeMap<String, Option<f64>>,
}

/// The main family and its frontier level, when the inputs name them.
struct Frontier<'a> {
    family: &'a str,
    level: u32,
}

/// Computes the headline, adding what is missing to `missing` and remarks to `notes`.
pub(super) fn headline(
    run: &RunInfo,
    inputs: &Inputs,
    missing: &mut Vec<String>,
    notes: &mut Vec<String>,
) -> Headline {
    let main_family = main_family(run, inputs);
    let frontier_level = main_family
        .as_deref()
        .and_then(|f| frontier_of(run, &inputs.updates, f));
    match (&main_family, frontier_level) {
        (None, _) => missing.push(
            "the main family (no run.json frontier, no evaluation file): no headline figure".into(),
        ),
        (Some(f), None) => missing.push(format!(
            "the frontier level of {f} (neither run.json nor metrics.jsonl records it)"
        )),
        _ => {}
    }
    let frontier = main_family
        .as_deref()
        .zip(frontier_level)
        .map(|(family, level)| Frontier { family, level });

    let at = |stage: Stage| success_at(inputs, frontier.as_ref(), stage);
    let success = StageSuccess {
        random: at(Stage::Random),
        sft: at(Stage::Sft),
        rl: at(Stage::Rl),
    };
    if let Some(fr) = &frontier {
        missing.extend(unread_stage_success(inputs, fr));
    }
    let tokens_ratio = frontier
        .as_ref()
        .and_then(|fr| tokens_ratio(run, fr, missing));
    let ablation = ablation(run, at(Stage::AblationGrpo), missing, notes);

    Headline {
        main_family,
        frontier_level,
        frontier_tokens_ratio_vs_level1: tokens_ratio,
        success,
        ablation,
        arms: run.arms.clone(),
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
            .find_map(|u| u.frontier().keys().next().cloned())
    })
}

fn frontier_of(run: &RunInfo, updates: &[Update], family: &str) -> Option<u32> {
    run.frontier_level.get(family).copied().or_else(|| {
        updates
            .iter()
            .rev()
            .find_map(|u| u.frontier().get(family).copied())
    })
}

/// Held-out success of `stage` at the frontier.
fn success_at(inputs: &Inputs, frontier: Option<&Frontier>, stage: Stage) -> Option<f64> {
    let fr = frontier?;
    inputs
        .eval
        .get(&stage)?
        .level(fr.family, fr.level)?
        .success_rate
}

/// One sentence per evaluation file present that has no success rate at the frontier.
fn unread_stage_success(inputs: &Inputs, fr: &Frontier) -> Vec<String> {
    let (f, l) = (fr.family, fr.level);
    let mut out = Vec::new();
    for stage in [Stage::Random, Stage::Sft, Stage::Rl] {
        let Some(e) = inputs.eval.get(&stage) else {
            continue;
        };
        match e.level(f, l) {
            None => out.push(format!(
                "eval/{}.json has no {f} level {l} (the frontier): success.{} is null",
                stage.key(),
                stage.key()
            )),
            Some(lv) if lv.success_rate.is_none() => out.push(format!(
                "eval/{}.json has no success rate for {f} level {l}",
                stage.key()
            )),
            Some(_) => {}
        }
    }
    out
}

/// Oracle tokens at the frontier level over level 1, from `run.json`.
fn tokens_ratio(run: &RunInfo, fr: &Frontier, missing: &mut Vec<String>) -> Option<f64> {
    let (f, l) = (fr.family, fr.level);
    match (run.oracle_tokens(f, l), run.oracle_tokens(f, 1)) {
        (Some(t), Some(t1)) if t1 > 0.0 => Some(t / t1),
        _ => {
            missing.push(format!(
                "run.json level_tokens for {f} levels 1 and {l}: the token ratio is null"
            ));
            None
        }
    }
}

/// `run.json`'s ablation, the trajectory-GRPO arm falling back to `grpo_at_frontier` (from
/// `eval/ablation-grpo.json`).
fn ablation(
    run: &RunInfo,
    grpo_at_frontier: Option<f64>,
    missing: &mut Vec<String>,
    notes: &mut Vec<String>,
) -> Ablation {
    let mut ablation = run.ablation.clone();
    if ablation.trajectory_grpo.is_none() {
        ablation.trajectory_grpo = grpo_at_frontier;
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
    ablation
}
