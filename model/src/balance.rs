//! Load balancing for the routed experts: Switch auxiliary loss, router z-loss, the
//! auxiliary-loss-free bias rule and quantile balancing.
//!
//! Shape legend: `t` tokens, `e` experts, `k` experts per token, `b` histogram bins.
//!
//! Quantile balancing (Su, kexue.fm/archives/11619; torchtitan `kimi_k3/quantile_balance.py`):
//! token `t` picks expert `e` when `s_te + b_e` beats the cutoff `c_t` (midway between the
//! k-th and (k+1)-th biased scores; see `router.rs` for why not the (k+1)-th itself), so the bias `e` needs is `r_te = c_t − s_te`. For every expert to receive a k/E
//! share of tokens, set `b_e` to the k/E quantile of `r_·e`, then mean-centre. There is no step
//! size. `r` is accumulated in a per-expert histogram of [`QB_BINS`] bins over
//! `[min b − 1, max b + 1]` so micro-batches (and data-parallel ranks) can be summed before
//! the update; [`exact_quantile`] is the sort-based reference it is tested against.

use tch::{Kind, Tensor};

use super::config::BalanceMode;

/// Histogram bins for quantile balancing (torchtitan uses 1000).
pub const QB_BINS: i64 = 1000;

/// Switch/GShard auxiliary loss `E · Σ_e f_e · P_e` (without α): `f_e` is the fraction of
/// (token, slot) assignments to `e` (no gradient), `P_e` the mean normalised score.
pub fn switch_aux_loss(scores_te: &Tensor, idx_tk: &Tensor) -> Tensor {
    let (t, e) = scores_te.size2().expect("scores are [T, E]");
    let counts_e = idx_tk.reshape([-1]).bincount(None::<Tensor>, e);
    switch_aux_share(scores_te, &counts_e, t, idx_tk.size()[1])
}

/// The share of [`switch_aux_loss`] that the tokens of `scores_te` contribute when they are
/// a slice of a forward of `n_total` tokens whose assignment counts were `counts_e [E]`:
/// `E · Σ_e f_e · Σ_{t ∈ slice} p_te / n_total`. The shares of a partition sum to the loss.
pub fn switch_aux_share(scores_te: &Tensor, counts_e: &Tensor, n_total: i64, k: i64) -> Tensor {
    let (kind, e) = (scores_te.kind(), scores_te.size()[1]);
    let f_e = counts_e.to_kind(kind).to_device(scores_te.device()) / (n_total * k) as f64;
    let probs_te = scores_te / (scores_te.sum_dim_intlist(-1, true, None) + 1e-20);
    let p_e = probs_te.sum_dim_intlist(0, false, None) / n_total as f64;
    (f_e * p_e).sum(kind) * e as f64
}

/// ST-MoE router z-loss `mean_t (logsumexp_e logits_te)²` (without its coefficient).
pub fn router_z_loss(logits_te: &Tensor) -> Tensor {
    router_z_share(logits_te, logits_te.size()[0])
}

/// The share of [`router_z_loss`] of a slice of a forward of `n_total` tokens:
/// `Σ_{t ∈ slice} (logsumexp_e logits_te)² / n_total`.
pub fn router_z_share(logits_te: &Tensor, n_total: i64) -> Tensor {
    logits_te
        .logsumexp([-1], false)
        .square()
        .sum(logits_te.kind())
        / n_total as f64
}

/// What one layer's balance rule needs from a forward, summed over micro-batches.
#[derive(Debug)]
pub struct LayerBalanceStats {
    /// Assignment counts `[E]` (f64, CPU).
    pub counts_e: Tensor,
    /// Quantile balancing only: histogram `[E, QB_BINS]` of needed bias (f64, CPU).
    pub hist_eb: Option<Tensor>,
    /// Histogram range low edge.
    pub lo: f64,
    /// Histogram range high edge.
    pub hi: f64,
    /// Experts per token.
    pub top_k: i64,
}

impl LayerBalanceStats {
    /// Adds another micro-batch's statistics (same bias, so the same histogram range).
    pub fn merge(&mut self, other: &LayerBalanceStats) {
        self.counts_e = &self.counts_e + &other.counts_e;
        if let (Some(a), Some(b)) = (&self.hist_eb, &other.hist_eb) {
            self.hist_eb = Some(a + b);
        }
    }
}

/// Histogram `[E, bins]` of the needed bias `r_te = cutoff_t − s_te` over `[lo, hi]`
/// (values outside land in the edge bins).
pub fn needed_bias_histogram(
    scores_te: &Tensor,
    cutoff_t: &Tensor,
    lo: f64,
    hi: f64,
    bins: i64,
) -> Tensor {
    tch::no_grad(|| {
        let (_, e) = scores_te.size2().expect("scores are [T, E]");
        let r_te = cutoff_t.unsqueeze(1).to_kind(Kind::Double) - scores_te.to_kind(Kind::Double);
        let bin_te = ((r_te - lo) * (bins as f64 / (hi - lo)))
            .floor()
            .clamp(0.0, (bins - 1) as f64)
            .to_kind(Kind::Int64);
        let hist_eb = Tensor::zeros([e, bins], (Kind::Double, scores_te.device()));
        let ones = Tensor::ones_like(&bin_te).to_kind(Kind::Double);
        hist_eb
            .scatter_add(1, &bin_te.tr().contiguous(), &ones.tr().contiguous())
            .to_device(tch::Device::Cpu)
    })
}

/// The `q`-quantile per expert read off a histogram, linearly interpolated inside the bin.
pub fn histogram_quantile(hist_eb: &Tensor, lo: f64, hi: f64, q: f64) -> Vec<f64> {
    let (e, bins) = hist_eb.size2().expect("histogram is [E, bins]");
    let flat = Vec::<f64>::try_from(hist_eb.to_kind(Kind::Double).reshape([-1]))
        .expect("histogram converts to f64");
    let width = (hi - lo) / bins as f64;
    (0..e as usize)
        .map(|ex| {
            let row = &flat[ex * bins as usize..(ex + 1) * bins as usize];
            let total: f64 = row.iter().sum();
            let target = q * total;
            let mut cum = 0.0;
            for (i, &c) in row.iter().enumerate() {
                if c > 0.0 && cum + c >= target {
                    return lo + (i as f64 + (target - cum) / c) * width;
                }
                cum += c;
            }
            hi
        })
        .collect()
}

/// Reference: the exact `q`-quantile per expert of `r_te = cutoff_t − s_te`.
pub fn exact_quantile(scores_te: &Tensor, cutoff_t: &Tensor, q: f64) -> Vec<f64> {
    let r_te = cutoff_t.unsqueeze(1).to_kind(Kind::Double) - scores_te.to_kind(Kind::Double);
    let q_e = r_te.quantile_scalar(q, 0, false, "linear");
    Vec::<f64>::try_from(q_e).expect("quantile converts to f64")
}

/// New bias for one layer, or `None` when the rule does not touch the bias.
pub fn updated_bias(
    mode: BalanceMode,
    bias_e: &[f64],
    stats: &LayerBalanceStats,
    rate: f64,
) -> Option<Vec<f64>> {
    let n = bias_e.len() as f64;
    let mut new = match mode {
        BalanceMode::None | BalanceMode::AuxLoss => return None,
        BalanceMode::AuxFree => {
            let counts = Vec::<f64>::try_from(&stats.counts_e).expect("counts convert to f64");
            let mean = counts.iter().sum::<f64>() / n;
            bias_e
                .iter()
                .zip(&counts)
                .map(|(b, c)| b - rate * (c - mean).signum() * f64::from(u8::from(*c != mean)))
                .collect::<Vec<_>>()
        }
        BalanceMode::Quantile => {
            let hist = stats.hist_eb.as_ref()?;
            let q = stats.top_k as f64 / n;
            histogram_quantile(hist, stats.lo, stats.hi, q)
        }
    };
    let mean = new.iter().sum::<f64>() / n;
    new.iter_mut().for_each(|b| *b -= mean);
    Some(new)
}

/// The histogram range for a bias: `[min b − 1, max b + 1]` (scores lie in [0, 1]).
pub fn histogram_range(bias_e: &[f64]) -> (f64, f64) {
    let lo = bias_e.iter().cloned().fold(f64::INFINITY, f64::min) - 1.0;
    let hi = bias_e.iter().cloned().fold(f64::NEG_INFINITY, f64::max) + 1.0;
    (lo, hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantile_matches_exact_quantile() {
        tch::manual_seed(0);
        let scores_te = Tensor::rand([4096, 8], (Kind::Float, tch::Device::Cpu));
        let (top, _) = scores_te.topk(3, -1, true, true);
        let cutoff_t = top.select(1, 2);
        let (lo, hi) = histogram_range(&[0.0; 8]);
        let hist = needed_bias_histogram(&scores_te, &cutoff_t, lo, hi, QB_BINS);
        let approx = histogram_quantile(&hist, lo, hi, 0.25);
        let exact = exact_quantile(&scores_te, &cutoff_t, 0.25);
        for (a, b) in approx.iter().zip(&exact) {
            assert!(
                (a - b).abs() < 2.0 * (hi - lo) / QB_BINS as f64,
                "{a} vs {b}"
            );
        }
    }
}
