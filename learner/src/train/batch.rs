//! From finished trajectories to what the RL loss needs: groups, the selection rules
//! (staleness, unscored terminations), and per-token advantages.
//!
//! Rules, applied by [`select`]:
//! 1. **Staleness.** A trajectory whose `header.policy_version` (the version it started
//!    with, the oldest of its tokens) lags the current version by more than
//!    `staleness_bound` is not trained on; it is counted in [`Selection::stale_skipped`].
//! 2. **Unscored terminations** (`infra_error`, `abandoned`) say nothing about the policy:
//!    they are excluded from baselines and from the loss — never scored as zero — and
//!    counted in [`Selection::unscored_excluded`].
//! 3. **Uninformative groups.** A group whose advantages are all zero (every scored member
//!    had the same return, or only one member is left) gives no policy gradient; with
//!    `RlConfig::drop_uninformative_groups` it is dropped and counted (DAPO's dynamic-sampling filter,
//!    without re-sampling).

use std::collections::BTreeMap;

use corvid_proto::{Trajectory, TurnTotals};
use corvid_rewards::{
    broadcast_to_tokens, episode_reward, step_advantages, trajectory_advantages,
    ProcessRewardAggregation, StepBaseline, StepEpisode, TrajectoryEstimator,
};

use super::config::{AdvantageMode, RlConfig};
use super::TrainError;

/// The episodes of one task instance (one `group_id`).
pub type Group = Vec<Trajectory>;

/// Checks what training relies on: every step's arrays are aligned and every generated
/// token's behaviour log-prob is finite. Values on context tokens are never read (the
/// store's stricter `Step::validate` also wants them 0; training does not care).
pub fn check_trainable(t: &Trajectory) -> Result<(), TrainError> {
    for (i, s) in t.steps.iter().enumerate() {
        let n = s.token_ids.len();
        if s.loss_mask.len() != n || s.logprobs.len() != n {
            return Err(TrainError::Data(format!(
                "trajectory {} step {i}: {n} tokens, {} mask entries, {} log-probs",
                t.header.trajectory_id,
                s.loss_mask.len(),
                s.logprobs.len()
            )));
        }
        if let Some(j) = (0..n).find(|&j| s.loss_mask[j] && !s.logprobs[j].is_finite()) {
            return Err(TrainError::Data(format!(
                "trajectory {} step {i}: log-prob of generated token {j} is {}",
                t.header.trajectory_id, s.logprobs[j]
            )));
        }
    }
    Ok(())
}

/// Groups trajectories by `header.group_id`, groups in order of first appearance and
/// members in input order.
pub fn group_by_id(trajectories: Vec<Trajectory>) -> Vec<Group> {
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    let mut groups: Vec<Group> = Vec::new();
    for t in trajectories {
        match index.get(&t.header.group_id) {
            Some(&i) => groups[i].push(t),
            None => {
                index.insert(t.header.group_id.clone(), groups.len());
                groups.push(vec![t]);
            }
        }
    }
    groups
}

/// A trajectory chosen for training, with the advantage of each of its tokens.
#[derive(Debug, Clone)]
pub struct Scored<'a> {
    /// The trajectory.
    pub trajectory: &'a Trajectory,
    /// Advantage per token, aligned with [`Trajectory::token_ids`]; `0` on tokens
    /// that were not generated.
    pub token_advantages: Vec<f64>,
    /// Which group of the input it came from.
    pub group: usize,
}

/// What [`select`] kept and why it left the rest out.
#[derive(Debug, Clone, Default)]
pub struct Selection<'a> {
    /// Trajectories to train on, group by group.
    pub trajectories: Vec<Scored<'a>>,
    /// The learner's policy version when it selected them: the weights of `π_old`.
    pub current_version: u64,
    /// Groups with at least one trajectory kept.
    pub groups_used: usize,
    /// Trajectories older than the staleness bound (rule 1).
    pub stale_skipped: usize,
    /// Trajectories with an unscored termination (rule 2).
    pub unscored_excluded: usize,
    /// Groups dropped for having only zero advantages (rule 3).
    pub uninformative_groups: usize,
    /// Trajectories in those groups.
    pub uninformative_trajectories: usize,
    /// Scored, fresh trajectories (kept or in uninformative groups): the reward statistics
    /// population.
    pub scored: usize,
    /// Sum of their outcome rewards.
    pub reward_sum: f64,
    /// How many of them succeeded.
    pub successes: usize,
    /// Largest version lag among the kept trajectories.
    pub max_lag: u64,
    /// Mean version lag among the kept trajectories.
    pub mean_lag: f64,
}

/// Per-turn advantages of each member of a group (`None` for unscored members), by the
/// configured estimator.
pub fn turn_advantages(
    group: &[&Trajectory],
    cfg: &RlConfig,
) -> Result<Vec<Option<Vec<f64>>>, TrainError> {
    let turns: Vec<Vec<TurnTotals>> = group.iter().map(|t| t.turns()).collect();
    let terminations: Vec<_> = group.iter().map(|t| t.footer.termination).collect();
    // p_t = clamp(process_weight · (the turn's summed rule components), ±process_clip).
    let aggregation = ProcessRewardAggregation {
        weight: cfg.process_weight,
        clip: cfg.process_clip,
    };
    let rewards: Vec<Vec<f64>> = turns
        .iter()
        .map(|ts| {
            let components: Vec<Vec<f64>> = ts.iter().map(|t| vec![t.process_reward]).collect();
            aggregation.aggregate(&components)
        })
        .collect::<Result<_, _>>()?;
    let estimator = match cfg.advantage {
        AdvantageMode::Step => None,
        AdvantageMode::Grpo => Some(TrajectoryEstimator::Grpo { eps: cfg.adv_eps }),
        AdvantageMode::DrGrpo => Some(TrajectoryEstimator::DrGrpo),
        AdvantageMode::Rloo => Some(TrajectoryEstimator::Rloo),
    };
    match estimator {
        None => {
            let episodes: Vec<StepEpisode<'_>> = group
                .iter()
                .zip(&rewards)
                .map(|(t, p)| StepEpisode {
                    process_rewards: p,
                    outcome: t.footer.outcome_reward as f64,
                    termination: t.footer.termination,
                    state_keys: &[],
                })
                .collect();
            Ok(step_advantages(
                &episodes,
                cfg.gamma,
                StepBaseline::TurnIndex,
                cfg.normalize_step_advantages,
                cfg.adv_eps,
            )?)
        }
        Some(estimator) => {
            // The process rewards are weighted already: R_total = R + 1 · Σ_t p_t.
            let totals: Vec<f64> = group
                .iter()
                .zip(&rewards)
                .map(|(t, p)| episode_reward(t.footer.outcome_reward as f64, p, 1.0))
                .collect();
            let a = trajectory_advantages(&totals, &terminations, estimator)?;
            Ok(a.into_iter()
                .zip(&turns)
                .map(|(a, ts)| a.map(|a| vec![a; ts.len()]))
                .collect())
        }
    }
}

/// Spreads per-turn advantages over a trajectory's tokens: every generated token of turn
/// `t` carries `A_t` (`corvid_rewards::broadcast_to_tokens`), other tokens carry 0.
pub fn tokens_from_turns(
    trajectory: &Trajectory,
    turn_adv: &[f64],
) -> Result<Vec<f64>, TrainError> {
    let per_turn: Vec<usize> = (trajectory.turns().iter())
        .map(|t| t.generated_tokens)
        .collect();
    let generated = broadcast_to_tokens(turn_adv, &per_turn)?;
    // Generated tokens in sequence order belong to turns in order of first appearance only
    // when each turn's steps are contiguous; map through the step turns to be exact.
    let mut turn_index: BTreeMap<u32, usize> = BTreeMap::new();
    for s in &trajectory.steps {
        let next = turn_index.len();
        turn_index.entry(s.turn).or_insert(next);
    }
    let mut offsets: Vec<usize> = Vec::with_capacity(per_turn.len());
    let mut acc = 0;
    for n in &per_turn {
        offsets.push(acc);
        acc += n;
    }
    let mut out = Vec::with_capacity(trajectory.len());
    for s in &trajectory.steps {
        let ti = turn_index[&s.turn];
        for &m in &s.loss_mask {
            if m {
                out.push(generated[offsets[ti]]);
                offsets[ti] += 1;
            } else {
                out.push(0.0);
            }
        }
    }
    Ok(out)
}

/// Applies the selection rules (module doc) to `groups` and computes every kept
/// trajectory's per-token advantages.
pub fn select<'a>(
    groups: &'a [Group],
    current_version: u64,
    cfg: &RlConfig,
) -> Result<Selection<'a>, TrainError> {
    let mut sel = Selection {
        current_version,
        ..Selection::default()
    };
    let mut lag_sum = 0u64;
    for (gi, group) in groups.iter().enumerate() {
        let mut fresh: Vec<&Trajectory> = Vec::with_capacity(group.len());
        for t in group {
            if t.lag(current_version) > cfg.staleness_bound {
                sel.stale_skipped += 1;
            } else {
                check_trainable(t)?;
                fresh.push(t);
            }
        }
        let turn_adv = turn_advantages(&fresh, cfg)?;
        let mut kept = Vec::new();
        for (t, a) in fresh.iter().zip(turn_adv) {
            match a {
                None => sel.unscored_excluded += 1,
                Some(a) => {
                    sel.scored += 1;
                    sel.reward_sum += t.footer.outcome_reward as f64;
                    sel.successes += usize::from(t.footer.success);
                    kept.push(Scored {
                        trajectory: t,
                        token_advantages: tokens_from_turns(t, &a)?,
                        group: gi,
                    })
                }
            }
        }
        if kept.is_empty() {
            continue;
        }
        let informative = kept
            .iter()
            .any(|s| s.token_advantages.iter().any(|a| *a != 0.0));
        if cfg.drop_uninformative_groups && !informative {
            sel.uninformative_groups += 1;
            sel.uninformative_trajectories += kept.len();
            continue;
        }
        sel.groups_used += 1;
        for s in &kept {
            let lag = s.trajectory.lag(current_version);
            sel.max_lag = sel.max_lag.max(lag);
            lag_sum += lag;
        }
        sel.trajectories.extend(kept);
    }
    if !sel.trajectories.is_empty() {
        sel.mean_lag = lag_sum as f64 / sel.trajectories.len() as f64;
    }
    Ok(sel)
}
