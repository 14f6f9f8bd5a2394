//! Truncated importance weights for stale behaviour policies.

use crate::error::{check_finite, RewardsError};

/// Per-token truncated importance weights and how many were cut.
#[derive(Debug, Clone, PartialEq)]
pub struct TruncatedWeights {
    /// `w_i = min(exp(logp_cur_i − logp_beh_i), cap)`.
    pub weights: Vec<f64>,
    /// Fraction of tokens whose ratio exceeded the cap (logged as `loss/tis_frac`).
    pub truncated_fraction: f64,
}

/// Truncated importance sampling (TIS) weights from log-probs:
///
/// `ρ_i = exp(log π_θ(a_i) − log μ(a_i))`, `w_i = min(ρ_i, cap)`
///
/// where `π_θ` is the current policy and `μ` the behaviour policy that sampled the token
/// (possibly several versions old). Truncating from above bounds the variance a stale,
/// unlikely-under-μ token can inject; ratios below 1 are kept as they are.
/// `cap` must be `>= 1` (a cap below 1 would also reweight on-policy tokens).
pub fn truncated_importance_weights(
    current_logp: &[f64],
    behaviour_logp: &[f64],
    cap: f64,
) -> Result<TruncatedWeights, RewardsError> {
    if cap.is_nan() || cap < 1.0 {
        return Err(RewardsError::InvalidParameter {
            name: "cap",
            value: cap.to_string(),
            expected: "a cap >= 1 (use f64::INFINITY for no truncation)",
        });
    }
    if current_logp.len() != behaviour_logp.len() {
        return Err(RewardsError::LengthMismatch {
            what: "behaviour_logp",
            expected: current_logp.len(),
            got: behaviour_logp.len(),
        });
    }
    check_finite("current_logp", current_logp)?;
    check_finite("behaviour_logp", behaviour_logp)?;
    let mut cut = 0usize;
    let weights: Vec<f64> = current_logp
        .iter()
        .zip(behaviour_logp)
        .map(|(c, b)| {
            let ratio = (c - b).exp();
            if ratio > cap {
                cut += 1;
                cap
            } else {
                ratio
            }
        })
        .collect();
    let truncated_fraction = if weights.is_empty() {
        0.0
    } else {
        cut as f64 / weights.len() as f64
    };
    Ok(TruncatedWeights {
        weights,
        truncated_fraction,
    })
}
