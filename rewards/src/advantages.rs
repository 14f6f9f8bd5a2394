//! Advantage estimators: trajectory-level GRPO, Dr.GRPO and RLOO, and step-level
//! critic-free advantages baselined within the group by turn index or by a state key.
//!
//! A *group* is the G episodes of one task instance. Episodes whose termination is not
//! scored ([`Termination::is_scored`] is false: `infra_error`, `abandoned`) say nothing
//! about the policy: they are left out of every mean and standard deviation and get
//! advantage `None` — never a zero reward, which would drag the baseline down and punish
//! the policy for a sandbox crash.
//!
//! Departures from the reference implementations (verl `core_algos.py`):
//! 1. A group with a single scored episode gives advantage `0` (no comparison, no
//!    credit); verl falls back to mean 0 / std 1 there, i.e. the raw reward.
//! 2. The standard deviation is the unbiased one (divide by `n - 1`), as `torch.std`;
//!    it is only taken over scored episodes.

use std::collections::HashMap;

use corvid_proto::Termination;

use crate::error::{check_finite, check_gamma, RewardsError};
use crate::returns::returns_to_go;

/// Trajectory-level estimator: one advantage per episode, shared by all its tokens.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TrajectoryEstimator {
    /// GRPO: `A_i = (R_i − mean(R)) / (std(R) + eps)`.
    Grpo {
        /// Added to the std so that a group of equal rewards gives 0, not NaN.
        eps: f64,
    },
    /// Dr.GRPO (no std): `A_i = R_i − mean(R)`; removes the difficulty bias of std scaling.
    DrGrpo,
    /// RLOO: `A_i = R_i − (Σ_{j≠i} R_j) / (n − 1) = n/(n−1) · (R_i − mean(R))`.
    Rloo,
}

/// Mean and unbiased standard deviation of `xs` (`std = 0` for fewer than 2 values).
fn mean_std(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, 0.0);
    }
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// Trajectory-level advantages of one group.
///
/// `rewards[i]` is episode `i`'s scalar reward (see [`crate::episode_reward`]),
/// `terminations[i]` how it ended. With `S` the scored episodes and `n = |S|`:
///
/// - GRPO: `A_i = (R_i − μ_S) / (σ_S + eps)`, `σ_S` the unbiased std over `S`;
/// - Dr.GRPO: `A_i = R_i − μ_S`;
/// - RLOO: `A_i = R_i − (Σ_{j∈S, j≠i} R_j) / (n − 1)`.
///
/// Unscored episodes get `None`; if `n < 2` every scored episode gets `0`.
/// The reward of an unscored episode is never read (it may be NaN).
pub fn trajectory_advantages(
    rewards: &[f64],
    terminations: &[Termination],
    estimator: TrajectoryEstimator,
) -> Result<Vec<Option<f64>>, RewardsError> {
    if terminations.len() != rewards.len() {
        return Err(RewardsError::LengthMismatch {
            what: "terminations",
            expected: rewards.len(),
            got: terminations.len(),
        });
    }
    if let TrajectoryEstimator::Grpo { eps } = estimator {
        if !(eps >= 0.0 && eps.is_finite()) {
            return Err(RewardsError::InvalidParameter {
                name: "eps",
                value: eps.to_string(),
                expected: "a finite value >= 0",
            });
        }
    }
    let scored: Vec<f64> = rewards
        .iter()
        .zip(terminations)
        .filter(|(_, t)| t.is_scored())
        .map(|(r, _)| *r)
        .collect();
    check_finite("rewards (scored episodes)", &scored)?;
    let n = scored.len();
    let (mean, std) = mean_std(&scored);
    let sum: f64 = scored.iter().sum();
    Ok(rewards
        .iter()
        .zip(terminations)
        .map(|(&r, t)| {
            if !t.is_scored() {
                return None;
            }
            if n < 2 {
                return Some(0.0);
            }
            Some(match estimator {
                TrajectoryEstimator::Grpo { eps } => (r - mean) / (std + eps),
                TrajectoryEstimator::DrGrpo => r - mean,
                TrajectoryEstimator::Rloo => r - (sum - r) / (n as f64 - 1.0),
            })
        })
        .collect())
}

/// What a turn's return is compared against in [`step_advantages`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepBaseline {
    /// Turns with the same index `t` across the group's episodes form one bucket.
    TurnIndex,
    /// Turns with the same state key (for example a hash of the files read so far, in the
    /// spirit of GiGPO's anchor states) form one bucket, wherever they occur.
    StateKey,
}

/// One episode of a group, as the step-level estimator sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepEpisode<'a> {
    /// Process reward `p_t` of each turn.
    pub process_rewards: &'a [f64],
    /// Outcome reward `R`, paid at the last turn.
    pub outcome: f64,
    /// How the episode ended; unscored episodes are excluded.
    pub termination: Termination,
    /// State key of each turn; required (same length as `process_rewards`) for
    /// [`StepBaseline::StateKey`], ignored otherwise.
    pub state_keys: &'a [u64],
}

/// Step-level critic-free advantages of one group.
///
/// For each scored episode `i` and turn `t`, the return-to-go
/// `G_{i,t} = Σ_{k=t}^{T_i−1} γ^{k−t} p_{i,k} + γ^{T_i−1−t} R_i` (see [`returns_to_go`])
/// is put in a bucket `b(i,t)` — the turn index `t`, or the state key `s_{i,t}`. Then
///
/// `A_{i,t} = (G_{i,t} − mean_b) / (std_b + eps)` if `normalize`, else `G_{i,t} − mean_b`,
///
/// with mean and unbiased std over the bucket's scored members. A turn alone in its
/// bucket (no other episode reached that turn or state) gets `A = 0`: without a
/// comparison there is no credit. Unscored episodes get `None` and enter no bucket.
pub fn step_advantages(
    episodes: &[StepEpisode<'_>],
    gamma: f64,
    baseline: StepBaseline,
    normalize: bool,
    eps: f64,
) -> Result<Vec<Option<Vec<f64>>>, RewardsError> {
    check_gamma(gamma)?;
    if !(eps >= 0.0 && eps.is_finite()) {
        return Err(RewardsError::InvalidParameter {
            name: "eps",
            value: eps.to_string(),
            expected: "a finite value >= 0",
        });
    }
    // Returns-to-go of scored episodes.
    let mut returns: Vec<Option<Vec<f64>>> = Vec::with_capacity(episodes.len());
    for ep in episodes {
        if !ep.termination.is_scored() {
            returns.push(None);
            continue;
        }
        if baseline == StepBaseline::StateKey && ep.state_keys.len() != ep.process_rewards.len() {
            return Err(RewardsError::LengthMismatch {
                what: "state_keys",
                expected: ep.process_rewards.len(),
                got: ep.state_keys.len(),
            });
        }
        returns.push(Some(returns_to_go(ep.process_rewards, ep.outcome, gamma)?));
    }
    let key = |ep: &StepEpisode<'_>, t: usize| -> u64 {
        match baseline {
            StepBaseline::TurnIndex => t as u64,
            StepBaseline::StateKey => ep.state_keys[t],
        }
    };
    let mut buckets: HashMap<u64, Vec<f64>> = HashMap::new();
    for (ep, g) in episodes.iter().zip(&returns) {
        if let Some(g) = g {
            for (t, &gt) in g.iter().enumerate() {
                buckets.entry(key(ep, t)).or_default().push(gt);
            }
        }
    }
    let stats: HashMap<u64, (usize, f64, f64)> = buckets
        .into_iter()
        .map(|(k, xs)| {
            let (m, s) = mean_std(&xs);
            (k, (xs.len(), m, s))
        })
        .collect();
    Ok(episodes
        .iter()
        .zip(returns)
        .map(|(ep, g)| {
            g.map(|g| {
                g.iter()
                    .enumerate()
                    .map(|(t, &gt)| {
                        let (n, mean, std) =
                            stats.get(&key(ep, t)).copied().unwrap_or((1, gt, 0.0));
                        if n < 2 {
                            0.0
                        } else if normalize {
                            (gt - mean) / (std + eps)
                        } else {
                            gt - mean
                        }
                    })
                    .collect()
            })
        })
        .collect())
}

/// Gives every generated token of turn `t` its turn's advantage:
/// `out = [A_0; n_0] ++ [A_1; n_1] ++ …` with `n_t = generated_per_turn[t]`.
pub fn broadcast_to_tokens(
    turn_advantages: &[f64],
    generated_per_turn: &[usize],
) -> Result<Vec<f64>, RewardsError> {
    if turn_advantages.len() != generated_per_turn.len() {
        return Err(RewardsError::LengthMismatch {
            what: "generated_per_turn",
            expected: turn_advantages.len(),
            got: generated_per_turn.len(),
        });
    }
    Ok(turn_advantages
        .iter()
        .zip(generated_per_turn)
        .flat_map(|(&a, &n)| std::iter::repeat_n(a, n))
        .collect())
}
