//! Per-turn process-reward aggregation and discounted returns.
//!
//! Notation used in every doc comment of this crate: an episode has turns `t = 0..T`,
//! `p_t` is the process reward of turn `t`, `R` the outcome reward of the episode and
//! `γ` the per-turn discount.

use crate::error::{check_finite, check_gamma, RewardsError};

/// How the components of one turn's process reward are combined into `p_t`.
///
/// `p_t = clamp(weight · Σ_j c_{t,j}, -clip, +clip)` where `c_{t,j}` are the rule
/// components (for example `+0.1` for reading a needed file, `-0.05` for repeating a call).
/// The clip keeps a pathological turn (many rules firing at once) from dwarfing the
/// outcome reward, which is what the task is actually about.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProcessRewardAggregation {
    /// Scale applied to the summed components (0 turns process rewards off).
    pub weight: f64,
    /// Largest magnitude a turn's aggregated reward may have.
    pub clip: f64,
}

impl Default for ProcessRewardAggregation {
    /// `weight = 1`, `clip = 1`: components pass through unless they exceed the outcome scale.
    fn default() -> Self {
        Self {
            weight: 1.0,
            clip: 1.0,
        }
    }
}

impl ProcessRewardAggregation {
    /// Aggregates each turn's components: `p_t = clamp(weight · Σ_j c_{t,j}, -clip, clip)`.
    ///
    /// `components[t]` lists the rule components of turn `t`; an empty list gives `p_t = 0`.
    pub fn aggregate(&self, components: &[Vec<f64>]) -> Result<Vec<f64>, RewardsError> {
        if !(self.clip >= 0.0 && self.clip.is_finite()) {
            return Err(RewardsError::InvalidParameter {
                name: "clip",
                value: self.clip.to_string(),
                expected: "a finite value >= 0",
            });
        }
        if !self.weight.is_finite() {
            return Err(RewardsError::InvalidParameter {
                name: "weight",
                value: self.weight.to_string(),
                expected: "a finite value",
            });
        }
        components
            .iter()
            .map(|c| {
                check_finite("components", c)?;
                Ok((self.weight * c.iter().sum::<f64>()).clamp(-self.clip, self.clip))
            })
            .collect()
    }
}

/// Discounted returns of a reward sequence: `G_t = Σ_{k=t}^{T-1} γ^{k-t} r_k`.
///
/// Computed backwards, `G_{T-1} = r_{T-1}`, `G_t = r_t + γ G_{t+1}` (CleanRL-style).
/// An empty slice gives an empty vector.
pub fn discounted_returns(rewards: &[f64], gamma: f64) -> Result<Vec<f64>, RewardsError> {
    check_gamma(gamma)?;
    check_finite("rewards", rewards)?;
    let mut out = vec![0.0; rewards.len()];
    let mut next = 0.0;
    for t in (0..rewards.len()).rev() {
        next = rewards[t] + gamma * next;
        out[t] = next;
    }
    Ok(out)
}

/// Each turn's return-to-go with the outcome paid at the last turn:
///
/// `G_t = Σ_{k=t}^{T-1} γ^{k-t} p_k + γ^{T-1-t} R`
///
/// i.e. [`discounted_returns`] of `p` with `R` added to the last turn's reward. A turn's own
/// process reward counts towards its return (it is the immediate consequence of its action).
/// An episode with no turns has no returns (empty vector): `R` then has nowhere to go, and
/// the caller should treat it at trajectory level.
pub fn returns_to_go(
    process_rewards: &[f64],
    outcome: f64,
    gamma: f64,
) -> Result<Vec<f64>, RewardsError> {
    check_finite("outcome", &[outcome])?;
    let mut r = process_rewards.to_vec();
    if let Some(last) = r.last_mut() {
        *last += outcome;
    }
    discounted_returns(&r, gamma)
}

/// The scalar episode reward used by trajectory-level estimators:
/// `R_total = R + λ · Σ_t p_t`, with `λ` = `process_weight`.
pub fn episode_reward(outcome: f64, process_rewards: &[f64], process_weight: f64) -> f64 {
    outcome + process_weight * process_rewards.iter().sum::<f64>()
}
