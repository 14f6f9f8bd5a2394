//! Per-layer MoE health, computed under `no_grad` on every training forward.
//!
//! With counts `c_e` over `T` tokens (`Σ c_e = T·k`), mean load `c̄ = T·k/E` and load share
//! `L_e = c_e / (T·k)`:
//! - `max_vio = (max_e c_e − c̄) / c̄` (Loss-Free Balancing, arXiv 2408.15664);
//! - `cv = std_e(c_e) / mean_e(c_e)`;
//! - `load_entropy = −Σ L_e ln L_e / ln E` (1 = perfectly even);
//! - `router_entropy = mean_t −Σ_e p_te ln p_te`, with sigmoid scores normalised per token;
//! - `dead_experts = #{e : c_e = 0}` in this batch.

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

/// Health of one MoE layer for one batch. The metrics line records it as it is.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MoeHealth {
    /// Layer index.
    pub layer: i64,
    /// Load share per expert, summing to one.
    pub load: Vec<f64>,
    /// Maximal violation of the even load.
    pub max_vio: f64,
    /// Coefficient of variation of the counts.
    pub cv: f64,
    /// Normalised load entropy in [0, 1].
    pub load_entropy: f64,
    /// Mean per-token router entropy (nats).
    pub router_entropy: f64,
    /// Experts that received no token.
    pub dead_experts: i64,
}

/// MaxVio of assignment counts.
pub fn max_vio(counts: &[f64]) -> f64 {
    let mean = counts.iter().sum::<f64>() / counts.len() as f64;
    if mean == 0.0 {
        return 0.0;
    }
    (counts.iter().cloned().fold(f64::MIN, f64::max) - mean) / mean
}

impl MoeHealth {
    /// Computes the metrics from counts `[E]` and unbiased scores `[T, E]`.
    pub fn compute(layer: i64, counts_e: &[f64], scores_te: &Tensor) -> Self {
        let n = counts_e.len() as f64;
        let total: f64 = counts_e.iter().sum();
        let mean = total / n;
        let var = counts_e.iter().map(|c| (c - mean).powi(2)).sum::<f64>() / n;
        let load: Vec<f64> = counts_e.iter().map(|c| c / total.max(1.0)).collect();
        let ent: f64 = load.iter().filter(|l| **l > 0.0).map(|l| -l * l.ln()).sum();
        let router_entropy = tch::no_grad(|| {
            let s = scores_te.to_kind(Kind::Double);
            let p = &s / (s.sum_dim_intlist(-1, true, None) + 1e-20);
            let h_t = -(&p * (&p + 1e-20).log()).sum_dim_intlist(-1, false, None);
            h_t.mean(Kind::Double).double_value(&[])
        });
        MoeHealth {
            layer,
            load,
            max_vio: max_vio(counts_e),
            cv: if mean > 0.0 { var.sqrt() / mean } else { 0.0 },
            load_entropy: if n > 1.0 { ent / n.ln() } else { 1.0 },
            router_entropy,
            dead_experts: counts_e.iter().filter(|c| **c == 0.0).count() as i64,
        }
    }
}
