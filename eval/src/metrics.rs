//! The figures of an evaluation: what one episode contributes ([`episode_eval`]), one level's
//! figures from its trajectories ([`level_result`]), and the serialised result
//! ([`EvalResult`], the JSON `corvid report` reads).
//!
//! Rates are `None` (JSON `null`) when their denominator is 0: a level whose oracle needs one
//! call has no multi-step completion, a policy that never fails a call has no recovery rate.

use std::collections::{BTreeMap, HashMap};

use anyhow::Result;
use corvid_episode::EpisodeFormat;
use corvid_proto::Trajectory;
use corvid_rewards::{mean_pass_at_k, mean_pass_hat_k, EpisodeEval, EvalMetrics};
use serde::Serialize;

/// One level's figures (rates are `null` when their denominator is 0).
#[derive(Debug, Clone, Serialize)]
pub struct LevelResult {
    /// Level.
    pub level: u32,
    /// Episodes run (instances × k).
    pub episodes: usize,
    /// Solved / scored.
    pub success_rate: Option<f64>,
    /// Parsed calls / call attempts.
    pub tool_call_parse_rate: Option<f64>,
    /// Successful calls / parsed calls.
    pub tool_call_success_rate: Option<f64>,
    /// Solved / scored, over episodes whose oracle needs ≥ 2 calls.
    pub multi_step_completion: Option<f64>,
    /// Solved after a failed call / episodes with a failed call.
    pub failure_recovery_rate: Option<f64>,
    /// Mean pass@k over instances.
    pub pass_at_k: Option<f64>,
    /// Mean pass^k over instances.
    pub pass_hat_k: Option<f64>,
    /// Mean turns per episode.
    pub mean_turns: f64,
    /// Mean tokens per episode.
    pub mean_tokens: f64,
    /// Episodes excluded (infra_error, abandoned).
    pub excluded: usize,
    /// Episodes by termination.
    pub terminations: BTreeMap<String, usize>,
}

/// One family's levels.
#[derive(Debug, Clone, Serialize)]
pub struct FamilyResult {
    /// Family name.
    pub family: String,
    /// Per level, in order.
    pub levels: Vec<LevelResult>,
}

/// The whole evaluation.
#[derive(Debug, Clone, Serialize)]
pub struct EvalResult {
    /// Stage label.
    pub stage: String,
    /// The checkpoint folder, or `random-init`.
    pub checkpoint: String,
    /// Policy version recorded in the episodes' headers.
    pub policy_version: u64,
    /// Instances per level.
    pub episodes_per_level: usize,
    /// Samples per instance.
    pub k: u32,
    /// Sampling temperature.
    pub temperature: f32,
    /// First held-out seed.
    pub seed: u64,
    /// Where the episodes are stored.
    pub store: String,
    /// The label they are stored under (`<label>.<family>.L<level>.s<seed>.k<i>`): a rerun
    /// with `--label` reuses them, or finishes an interrupted evaluation.
    pub label: String,
    /// Per family.
    pub families: Vec<FamilyResult>,
    /// Wall time, seconds.
    pub wall_s: f64,
    /// Generated tokens per second over the run (episodes reused from the store were not
    /// generated again and count for neither).
    pub generated_tokens_per_s: f64,
}

/// What the evaluator metrics need from one episode.
pub fn episode_eval(format: &EpisodeFormat, t: &Trajectory, oracle_calls: u32) -> EpisodeEval {
    // A turn may span several steps; the last piece carries its call and result.
    let mut attempts: BTreeMap<u32, bool> = BTreeMap::new();
    let mut statuses = Vec::new();
    for s in &t.steps {
        let opened = format.attempts_call(&s.token_ids, &s.loss_mask);
        *attempts.entry(s.turn).or_default() |= opened;
        if let (Some(_), Some(r)) = (&s.tool_call, &s.tool_result) {
            statuses.push(r.status);
        }
    }
    EpisodeEval {
        call_attempts: attempts.values().filter(|a| **a).count() as u32,
        call_statuses: statuses,
        success: t.footer.success,
        termination: t.footer.termination,
        oracle_calls,
    }
}

/// Figures for one level from its trajectories (`k` samples per instance); `oracle_calls`
/// maps an instance's seed to the calls its oracle needs.
pub fn level_result(
    format: &EpisodeFormat,
    level: u32,
    trajectories: &[Trajectory],
    oracle_calls: &HashMap<u64, u32>,
    k: u32,
) -> Result<LevelResult> {
    let evals: Vec<EpisodeEval> = trajectories
        .iter()
        .map(|t| {
            episode_eval(
                format,
                t,
                oracle_calls.get(&t.header.task.seed).copied().unwrap_or(0),
            )
        })
        .collect();
    let m = EvalMetrics::from_episodes(&evals);
    let mut per_task: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut terminations: BTreeMap<String, usize> = BTreeMap::new();
    for t in trajectories {
        *terminations
            .entry(t.footer.termination.as_str().to_string())
            .or_default() += 1;
        if t.footer.termination.is_scored() {
            let e = per_task.entry(t.header.task.seed).or_default();
            e.0 += 1;
            e.1 += t.footer.success as u64;
        }
    }
    let tasks: Vec<(u64, u64)> = per_task
        .into_values()
        .filter(|(n, _)| *n >= k as u64)
        .collect();
    let n = trajectories.len().max(1) as f64;
    let turns: usize = trajectories
        .iter()
        .map(|t| {
            let mut seen: Vec<u32> = t.steps.iter().map(|s| s.turn).collect();
            seen.dedup();
            seen.len()
        })
        .sum();
    Ok(LevelResult {
        level,
        episodes: trajectories.len(),
        success_rate: m.success_rate,
        tool_call_parse_rate: m.tool_call_parse_rate,
        tool_call_success_rate: m.tool_call_success_rate,
        multi_step_completion: m.multi_step_completion,
        failure_recovery_rate: m.failure_recovery_rate,
        pass_at_k: mean_pass_at_k(&tasks, k as u64)?,
        pass_hat_k: mean_pass_hat_k(&tasks, k as u64)?,
        mean_turns: turns as f64 / n,
        mean_tokens: trajectories
            .iter()
            .map(|t| t.footer.token_count as f64)
            .sum::<f64>()
            / n,
        excluded: m.excluded,
        terminations,
    })
}
