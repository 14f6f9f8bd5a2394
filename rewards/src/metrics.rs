//! Evaluator metrics: tool-call parse and success rates, multi-step completion,
//! failure-recovery rate, pass@k and pass^k.
//!
//! Episodes that ended in `infra_error` or `abandoned` are excluded from every metric
//! (they measure the infrastructure, not the policy); [`EvalMetrics::excluded`] counts them.
//! Calls whose status is `infra_error` are likewise left out of the success rate.

use corvid_proto::{Termination, ToolStatus};

use crate::error::RewardsError;

/// What the evaluator needs to know about one episode.
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeEval {
    /// Turns in which the policy tried to call a tool (opened a `<tool_call>`).
    pub call_attempts: u32,
    /// Result status of each attempt that parsed into a name and JSON arguments.
    pub call_statuses: Vec<ToolStatus>,
    /// Whether the checker accepted the episode.
    pub success: bool,
    /// How it ended.
    pub termination: Termination,
    /// Tool calls the oracle needs for this task (its plan length, without `answer`).
    pub oracle_calls: u32,
}

/// Aggregate evaluator metrics; a rate is `None` when its denominator is 0.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EvalMetrics {
    /// `Σ parsed calls / Σ call attempts`.
    pub tool_call_parse_rate: Option<f64>,
    /// `Σ successful calls / Σ parsed calls whose status is not infra_error`.
    pub tool_call_success_rate: Option<f64>,
    /// `#solved / #episodes` over scored episodes whose oracle needs ≥ 2 calls.
    pub multi_step_completion: Option<f64>,
    /// `#(had a failed call and solved) / #(had a failed call)` over scored episodes.
    pub failure_recovery_rate: Option<f64>,
    /// `#solved / #scored`.
    pub success_rate: Option<f64>,
    /// Scored episodes counted.
    pub scored: usize,
    /// Episodes excluded (infra_error, abandoned).
    pub excluded: usize,
}

fn ratio(num: u64, den: u64) -> Option<f64> {
    (den > 0).then(|| num as f64 / den as f64)
}

/// A call failed through the policy's fault: not a success and not the host's error.
fn is_policy_failure(s: ToolStatus) -> bool {
    !s.is_success() && s != ToolStatus::InfraError
}

impl EvalMetrics {
    /// Computes every metric over `episodes` (formulas on the fields).
    pub fn from_episodes(episodes: &[EpisodeEval]) -> Self {
        let (mut attempts, mut parsed, mut ok, mut judged) = (0u64, 0u64, 0u64, 0u64);
        let (mut multi, mut multi_ok, mut failed, mut recovered, mut solved) =
            (0u64, 0u64, 0u64, 0u64, 0u64);
        let mut scored = 0usize;
        for ep in episodes.iter().filter(|e| e.termination.is_scored()) {
            scored += 1;
            attempts += u64::from(ep.call_attempts);
            parsed += ep.call_statuses.len() as u64;
            for &s in &ep.call_statuses {
                if s != ToolStatus::InfraError {
                    judged += 1;
                    ok += u64::from(s.is_success());
                }
            }
            solved += u64::from(ep.success);
            if ep.oracle_calls >= 2 {
                multi += 1;
                multi_ok += u64::from(ep.success);
            }
            if ep.call_statuses.iter().any(|&s| is_policy_failure(s)) {
                failed += 1;
                recovered += u64::from(ep.success);
            }
        }
        Self {
            tool_call_parse_rate: ratio(parsed, attempts),
            tool_call_success_rate: ratio(ok, judged),
            multi_step_completion: ratio(multi_ok, multi),
            failure_recovery_rate: ratio(recovered, failed),
            success_rate: ratio(solved, scored as u64),
            scored,
            excluded: episodes.len() - scored,
        }
    }
}

fn check_nck(n: u64, c: u64, k: u64) -> Result<(), RewardsError> {
    if c > n {
        return Err(RewardsError::InvalidParameter {
            name: "c",
            value: c.to_string(),
            expected: "at most n (correct samples cannot exceed samples)",
        });
    }
    if k == 0 || k > n {
        return Err(RewardsError::InvalidParameter {
            name: "k",
            value: k.to_string(),
            expected: "1 <= k <= n",
        });
    }
    Ok(())
}

/// Unbiased pass@k (Chen et al. 2021): the probability that at least one of `k` samples
/// drawn without replacement from `n` samples, `c` of them correct, is correct.
///
/// `pass@k = 1 − C(n−c, k) / C(n, k) = 1 − Π_{i=n−c+1}^{n} (1 − k/i)`
///
/// (the product form avoids huge binomials). It is `1` when `n − c < k`.
pub fn pass_at_k(n: u64, c: u64, k: u64) -> Result<f64, RewardsError> {
    check_nck(n, c, k)?;
    if n - c < k {
        return Ok(1.0);
    }
    let prod: f64 = ((n - c + 1)..=n)
        .map(|i| 1.0 - k as f64 / i as f64)
        .product();
    Ok(1.0 - prod)
}

/// Unbiased pass^k (τ-bench): the probability that all `k` samples drawn without
/// replacement from `n`, `c` of them correct, are correct — a reliability measure.
///
/// `pass^k = C(c, k) / C(n, k) = Π_{i=0}^{k−1} (c − i) / (n − i)`; it is `0` when `c < k`.
pub fn pass_hat_k(n: u64, c: u64, k: u64) -> Result<f64, RewardsError> {
    check_nck(n, c, k)?;
    if c < k {
        return Ok(0.0);
    }
    Ok((0..k).map(|i| (c - i) as f64 / (n - i) as f64).product())
}

/// Mean of [`pass_at_k`] over tasks, each given as `(n, c)`; `None` for no tasks.
pub fn mean_pass_at_k(tasks: &[(u64, u64)], k: u64) -> Result<Option<f64>, RewardsError> {
    mean_of(tasks, k, pass_at_k)
}

/// Mean of [`pass_hat_k`] over tasks, each given as `(n, c)`; `None` for no tasks.
pub fn mean_pass_hat_k(tasks: &[(u64, u64)], k: u64) -> Result<Option<f64>, RewardsError> {
    mean_of(tasks, k, pass_hat_k)
}

fn mean_of(
    tasks: &[(u64, u64)],
    k: u64,
    f: fn(u64, u64, u64) -> Result<f64, RewardsError>,
) -> Result<Option<f64>, RewardsError> {
    if tasks.is_empty() {
        return Ok(None);
    }
    let mut sum = 0.0;
    for &(n, c) in tasks {
        sum += f(n, c, k)?;
    }
    Ok(Some(sum / tasks.len() as f64))
}
