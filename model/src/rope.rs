//! Rotary position embedding on the decoupled RoPE dims, with linear and YaRN scaling.
//!
//! Convention: half-split (`rotate_half`, as Qwen/Llama), not DeepSeek's interleaved pairs:
//! the DeepSeek-V3 adapter de-interleaves the q/k RoPE rows of checkpoints with
//! `rope_interleave` (`arch::deepseek_v3`), which gives the same attention scores.
//! Positions are a `[B, T]` tensor, so rows of a batch may sit at different offsets
//! (batched decode over sequences of different lengths).

use tch::{Device, Kind, Tensor};

use super::config::RopeScaling;

/// Precomputed cos/sin tables `[max_pos, rope/2]` plus the attention-scale multiplier.
#[derive(Debug)]
pub struct Rope {
    cos_pr: Tensor,
    sin_pr: Tensor,
    /// Multiplier on the softmax scale (YaRN's `mscale²`; 1 otherwise).
    pub scale_mult: f64,
    /// Positions covered.
    pub max_pos: i64,
}

/// What a scaling rule makes of the plain RoPE frequencies.
struct Scaled {
    /// Inverse frequency per rotated pair.
    inv_freq: Vec<f64>,
    /// Multiplier on the softmax scale.
    softmax_mult: f64,
    /// Multiplier on the cos and sin tables (transformers' `attention_scaling`).
    table_mult: f64,
}

/// YaRN's attention temperature `0.1·m·ln s + 1` (1 for `s <= 1`), as transformers'
/// `get_mscale` / DeepSeek's `yarn_get_mscale`.
fn yarn_mscale(s: f64, m: f64) -> f64 {
    if s <= 1.0 {
        1.0
    } else {
        0.1 * m * s.ln() + 1.0
    }
}

/// Inverse frequencies per rotated pair after scaling, and the two multipliers.
fn inv_freq(rope_dim: i64, theta: f64, scaling: &RopeScaling) -> Scaled {
    let half = rope_dim / 2;
    let base: Vec<f64> = (0..half)
        .map(|i| theta.powf(-(2 * i) as f64 / rope_dim as f64))
        .collect();
    let plain = |inv_freq| Scaled {
        inv_freq,
        softmax_mult: 1.0,
        table_mult: 1.0,
    };
    match *scaling {
        RopeScaling::None => plain(base),
        RopeScaling::Linear { factor } => plain(base.iter().map(|f| f / factor).collect()),
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
        } => {
            let l = original_max_position_embeddings as f64;
            let inv_freq = base
                .iter()
                .map(|&f| {
                    // Rotations this dimension makes over the original context.
                    let rotations = l * f / (2.0 * std::f64::consts::PI);
                    // 0: interpolate fully (slow dims), 1: keep (fast dims).
                    let keep = ((rotations - beta_slow) / (beta_fast - beta_slow)).clamp(0.0, 1.0);
                    f / factor * (1.0 - keep) + f * keep
                })
                .collect();
            let mscale = 0.1 * factor.ln() + 1.0;
            Scaled {
                inv_freq,
                softmax_mult: mscale * mscale,
                table_mult: 1.0,
            }
        }
        RopeScaling::HfYarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            mscale,
            mscale_all_dim,
            attention_factor,
            truncate,
        } => {
            let dim = rope_dim as f64;
            let l = original_max_position_embeddings as f64;
            // The dimension index at which a frequency makes `rotations` turns over `l`.
            let correction_dim = |rotations: f64| {
                dim * (l / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln())
            };
            let (mut low, mut high) = (correction_dim(beta_fast), correction_dim(beta_slow));
            if truncate {
                (low, high) = (low.floor(), high.ceil());
            }
            let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
            if low == high {
                high += 0.001;
            }
            let inv_freq = base
                .iter()
                .enumerate()
                .map(|(i, &f)| {
                    // 0 below `low` (keep the frequency), 1 above `high` (interpolate).
                    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    let keep = 1.0 - ramp;
                    f / factor * (1.0 - keep) + f * keep
                })
                .collect();
            let table_mult =
                attention_factor.unwrap_or(if mscale != 0.0 && mscale_all_dim != 0.0 {
                    yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
                } else {
                    yarn_mscale(factor, 1.0)
                });
            let softmax_mult = if mscale_all_dim != 0.0 {
                yarn_mscale(factor, mscale_all_dim).powi(2)
            } else {
                1.0
            };
            Scaled {
                inv_freq,
                softmax_mult,
                table_mult,
            }
        }
    }
}

impl Rope {
    /// Builds the tables for `max_pos` positions.
    pub fn new(
        rope_dim: i64,
        theta: f64,
        scaling: &RopeScaling,
        max_pos: i64,
        device: Device,
    ) -> Self {
        let scaled = inv_freq(rope_dim, theta, scaling);
        let half = rope_dim / 2;
        let inv_r = Tensor::from_slice(&scaled.inv_freq).to_kind(Kind::Double);
        let pos_p = Tensor::arange(max_pos, (Kind::Double, Device::Cpu));
        // angles [P, R/2]
        let ang_pr = pos_p.unsqueeze(1) * inv_r.view([1, half]);
        Rope {
            cos_pr: (ang_pr.cos() * scaled.table_mult).to_device(device),
            sin_pr: (ang_pr.sin() * scaled.table_mult).to_device(device),
            scale_mult: scaled.softmax_mult,
            max_pos,
        }
    }

    /// Rotates `x [B, T, H, R]` (H may be 1) at positions `pos_bt [B, T]` (int64).
    pub fn apply(&self, x_bthr: &Tensor, pos_bt: &Tensor) -> Tensor {
        let (b, t, _, r) = x_bthr.size4().expect("rope input is [B, T, H, R]");
        if r == 0 {
            return x_bthr.shallow_clone();
        }
        let half = r / 2;
        let flat = pos_bt.reshape([-1]);
        let cos = self
            .cos_pr
            .index_select(0, &flat)
            .view([b, t, 1, half])
            .to_kind(x_bthr.kind());
        let sin = self
            .sin_pr
            .index_select(0, &flat)
            .view([b, t, 1, half])
            .to_kind(x_bthr.kind());
        let x1 = x_bthr.narrow(3, 0, half);
        let x2 = x_bthr.narrow(3, half, half);
        Tensor::cat(&[&x1 * &cos - &x2 * &sin, &x2 * &cos + &x1 * &sin], 3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yarn_keeps_fast_dims_and_stretches_slow_ones() {
        let plain = inv_freq(16, 10_000.0, &RopeScaling::None).inv_freq;
        let Scaled {
            inv_freq: yarn,
            softmax_mult: mult,
            ..
        } = inv_freq(
            16,
            10_000.0,
            &RopeScaling::Yarn {
                factor: 4.0,
                original_max_position_embeddings: 256,
                beta_fast: 32.0,
                beta_slow: 1.0,
            },
        );
        assert!((yarn[0] - plain[0]).abs() < 1e-12, "fastest dim kept");
        assert!(
            (yarn[7] - plain[7] / 4.0).abs() < 1e-12,
            "slowest dim interpolated"
        );
        assert!(mult > 1.0);
    }
}
