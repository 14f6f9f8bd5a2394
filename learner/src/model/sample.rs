//! Sampling with temperature and top-p (nucleus), returning the sampled token's log-prob.
//!
//! The log-prob is that of the distribution actually sampled from: `softmax(logits / T)`
//! restricted to the nucleus and renormalised. With `top_p = 1` that is exactly what
//! [`super::MoePolicy::token_logprobs`] recomputes at the same temperature, so RL importance
//! ratios start at one. Temperature 0 is greedy; its log-prob is that of `softmax(logits)`.
//! Randomness comes from libtorch's generator (`tch::manual_seed`).

use tch::{Kind, Tensor};

use super::ModelError;

/// Sampling parameters.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SamplingParams {
    /// Softmax temperature (0 = greedy).
    pub temperature: f64,
    /// Nucleus mass in (0, 1] (1 = off).
    pub top_p: f64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
        }
    }
}

/// Samples one token per row of `logits [B, V]`: `(tokens [B] int64, logp [B] f32)`.
pub fn sample(logits_bv: &Tensor, params: SamplingParams) -> Result<(Tensor, Tensor), ModelError> {
    if !(params.temperature >= 0.0 && params.top_p > 0.0 && params.top_p <= 1.0) {
        return Err(ModelError::Input(format!(
            "sampling needs temperature >= 0 and top_p in (0, 1], got {} and {}",
            params.temperature, params.top_p
        )));
    }
    tch::no_grad(|| {
        let logits = logits_bv.f_to_kind(Kind::Float)?;
        if params.temperature == 0.0 {
            let tok_b = logits.f_argmax(-1, false)?;
            let logp_b = logits
                .f_log_softmax(-1, Kind::Float)?
                .f_gather(-1, &tok_b.unsqueeze(-1), false)?
                .squeeze_dim(-1);
            return Ok((tok_b, logp_b));
        }
        let mut logp_bv = (logits / params.temperature).f_log_softmax(-1, Kind::Float)?;
        if params.top_p < 1.0 {
            let (sorted, order) = logp_bv.sort(-1, true);
            let cum = sorted.exp().cumsum(-1, Kind::Float);
            // Drop a token when the mass before it already reaches top_p (the first stays).
            let drop_sorted = (cum - sorted.exp()).ge(params.top_p);
            let drop_bv = drop_sorted.zeros_like().scatter(-1, &order, &drop_sorted);
            logp_bv = logp_bv
                .masked_fill(&drop_bv, f64::NEG_INFINITY)
                .f_log_softmax(-1, Kind::Float)?;
        }
        let tok_b = logp_bv.exp().f_multinomial(1, false)?.squeeze_dim(-1);
        let logp_b = logp_bv
            .f_gather(-1, &tok_b.unsqueeze(-1), false)?
            .squeeze_dim(-1);
        Ok((tok_b, logp_b))
    })
}
