//! The RL loss, one named function per term. All take per-token tensors `[N]` over the
//! generated (trained-on) tokens only: prompt and tool-output tokens are never selected, so
//! they contribute exactly nothing — not to the sum, not to the token count.
//!
//! Notation: `π_θ` the policy being trained, `π_prox` the policy at the start of the update
//! (decoupled PPO, AReaL arXiv 2505.24298 §5), `μ` the behaviour policy that sampled the
//! token (its log-prob is stored in the trajectory), `π_ref` the frozen SFT policy, `A` the
//! token's advantage.
//!
//! ```text
//! r      = exp(log π_θ − log π_prox)                              importance_ratio
//! w      = min(exp(log π_prox − log μ), C)       (no gradient)     truncated_importance_weight
//! L_pg   = −w · min(r·A, clip(r, 1 − ε_low, 1 + ε_high)·A)         clipped_surrogate
//! KL_k3  = min(exp(x) − x − 1, 10),  x = clamp(log π_ref − log π_θ, ±20)   k3_kl
//! H      = −Σ_v π_θ(v) log π_θ(v)              corvid_model::head (TokenScores::entropy_n)
//! L      = Σ_i [L_pg − c_H·H + c_KL·KL_k3]_i / N  + c_bal·L_balance  (token-level mean, DAPO)
//!          + c_ptx · Σ_j −log π_θ(y_j) / N_demo    over demonstration tokens   summed_nll
//! ```
//!
//! The last term (PPO-ptx, InstructGPT arXiv 2203.02155 §3.5) is the SFT loss on
//! demonstrations mixed into the RL step, off unless `ptx_coef > 0`; SFT uses the same
//! function.
//!
//! Why the decoupled form: actors sample with policies up to `staleness_bound` versions old.
//! Clipping against `μ` would spend the trust region on staleness the learner did not cause;
//! clipping against `π_prox` keeps the PPO trust region about the learner's own step, and
//! `w` corrects the off-policy gap, truncated at `C` (TIS) so one stale, unlikely-under-`μ`
//! token cannot dominate. With one optimizer step per update (`minibatches = 1`) `π_prox` is
//! `π_θ` itself (detached), so `r = 1` and `L_pg` is the TIS-weighted policy gradient
//! `−w·A·log π_θ` in value of gradient; the clip acts from the second minibatch on.
//! On-policy (`π_prox = μ`) `w = 1` and `r = π_θ/μ`: plain PPO with clip-higher.

use tch::{Kind, Tensor};

/// `r = exp(logp_new − logp_prox)`, `[N]`; gradient flows through `logp_new`.
pub fn importance_ratio(logp_new_n: &Tensor, logp_prox_n: &Tensor) -> Tensor {
    (logp_new_n - logp_prox_n.detach()).exp()
}

/// Truncated importance weight `w = min(exp(logp_prox − logp_behaviour), cap)`, `[N]`,
/// detached (a weight, not a path for gradients). Returns `(w, truncated)` where
/// `truncated` is a bool mask of the tokens whose ratio exceeded `cap`.
pub fn truncated_importance_weight(
    logp_prox_n: &Tensor,
    logp_behaviour_n: &Tensor,
    cap: f64,
) -> (Tensor, Tensor) {
    let rho = (logp_prox_n.detach() - logp_behaviour_n).exp();
    let truncated = rho.gt(cap);
    (rho.clamp_max(cap), truncated)
}

/// Per-token clipped surrogate loss with asymmetric clip (clip-higher):
/// `L = −min(r·A, clip(r, 1 − clip_low, 1 + clip_high)·A)`, `[N]`.
///
/// For `A > 0` the objective stops growing once `r > 1 + clip_high`; for `A < 0` once
/// `r < 1 − clip_low`. There the gradient is zero.
pub fn clipped_surrogate(
    ratio_n: &Tensor,
    adv_n: &Tensor,
    clip_low: f64,
    clip_high: f64,
) -> Tensor {
    let unclipped = ratio_n * adv_n;
    let clipped = ratio_n.clamp(1.0 - clip_low, 1.0 + clip_high) * adv_n;
    -unclipped.minimum(&clipped)
}

/// Which tokens the clip is active on, as two bool masks `(low, high)`:
/// low = `A < 0 ∧ r < 1 − clip_low`, high = `A > 0 ∧ r > 1 + clip_high`.
pub fn clip_masks(
    ratio_n: &Tensor,
    adv_n: &Tensor,
    clip_low: f64,
    clip_high: f64,
) -> (Tensor, Tensor) {
    let low = adv_n.lt(0.0).logical_and(&ratio_n.lt(1.0 - clip_low));
    let high = adv_n.gt(0.0).logical_and(&ratio_n.gt(1.0 + clip_high));
    (low, high)
}

/// Bound on the log-ratio `x` inside [`k3_kl`] (verl's `low_var_kl` clamps it at ±20).
pub const K3_LOG_RATIO_CLAMP: f64 = 20.0;
/// Bound on one token's k3 value (verl's `low_var_kl` clamps the result at 10).
pub const K3_MAX: f64 = 10.0;

/// The k3 estimator of `KL(π_θ ‖ π_ref)` per token (Schulman, "Approximating KL
/// divergence"): with `x = log π_ref − log π_θ`, `k3 = exp(x) − x − 1 ≥ 0`, unbiased for
/// tokens sampled from `π_θ`, and low-variance. `[N]`; gradient flows through `logp_new`.
///
/// Clamped as verl's `low_var_kl` is: `x` to `±K3_LOG_RATIO_CLAMP`, the result to at most
/// `K3_MAX`. `exp(x)` is unbounded: one sampled token that the reference finds e^20 times
/// likelier than the policy made an update's mean over ~4,000 tokens 10^5–10^8 and its
/// gradient norm up to 10^9, so after clipping that update trained nothing but that token
/// (`docs/bench/raw/rl-sweep-2026-12-01.md`, run e1). Past the bound the token adds a constant (no
/// gradient); below it the estimator is untouched.
pub fn k3_kl(logp_new_n: &Tensor, logp_ref_n: &Tensor) -> Tensor {
    let x = (logp_ref_n.detach() - logp_new_n).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP);
    (x.exp() - &x - 1.0).clamp_max(K3_MAX)
}

/// Summed negative log-likelihood `Σ_j −log π(y_j)` of the targets' log-probs `logp_n`
/// (temperature 1, fp32; [`corvid_model::head`]), scalar. Divided by the token count it is
/// the SFT cross-entropy.
pub fn summed_nll(logp_n: &Tensor) -> Tensor {
    logp_n.sum(Kind::Float).neg()
}

/// Token-level aggregation: `Σ_i x_i / denom`, scalar. `denom` is the number of generated
/// tokens of the whole optimizer step (all micro-batches), so every token weighs the same
/// whatever trajectory it belongs to (DAPO token-level loss).
pub fn token_sum_over(x_n: &Tensor, denom: f64) -> Tensor {
    x_n.sum(Kind::Float) / denom
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(x: &[f32]) -> Tensor {
        Tensor::from_slice(x)
    }
    fn v(x: &Tensor) -> Vec<f32> {
        Vec::<f32>::try_from(x).unwrap()
    }

    #[test]
    fn k3_matches_its_formula_and_is_bounded_with_no_gradient_past_the_bound() {
        let logp_new = t(&[-0.5, -1.0, -30.0]).set_requires_grad(true);
        let logp_ref = t(&[-0.5, -0.2, -0.01]);
        let kl = k3_kl(&logp_new, &logp_ref);
        let got = v(&kl.detach());
        let x: f32 = -0.2 - -1.0;
        assert!(got[0].abs() < 1e-7, "{got:?}");
        assert!((got[1] - (x.exp() - x - 1.0)).abs() < 1e-6, "{got:?}");
        assert_eq!(got[2], K3_MAX as f32, "{got:?}");
        kl.sum(Kind::Float).backward();
        let g = v(&logp_new.grad());
        // d k3 / d logp_new = 1 − exp(x) inside the bound, 0 past it.
        assert!((g[1] - (1.0 - x.exp())).abs() < 1e-6, "{g:?}");
        assert_eq!(g[2], 0.0, "{g:?}");
    }

    #[test]
    fn surrogate_is_minus_r_times_a_inside_the_clip() {
        let l = clipped_surrogate(&t(&[1.1, 0.9]), &t(&[2.0, -1.0]), 0.2, 0.28);
        let got = v(&l);
        assert!(
            (got[0] + 2.2).abs() < 1e-6 && (got[1] - 0.9).abs() < 1e-6,
            "{got:?}"
        );
    }
}
