//! Rotary position embedding on the decoupled RoPE dims, with linear and YaRN scaling.
//!
//! Convention: half-split (`rotate_half`, as Qwen/Llama), not DeepSeek's interleaved pairs;
//! a DeepSeek checkpoint loader would have to de-interleave q/k RoPE rows.
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

/// Inverse frequencies per rotated pair, after scaling, and the softmax-scale multiplier.
fn inv_freq(rope_dim: i64, theta: f64, scaling: &RopeScaling) -> (Vec<f64>, f64) {
    let half = rope_dim / 2;
    let base: Vec<f64> = (0..half)
        .map(|i| theta.powf(-(2 * i) as f64 / rope_dim as f64))
        .collect();
    match *scaling {
        RopeScaling::None => (base, 1.0),
        RopeScaling::Linear { factor } => (base.iter().map(|f| f / factor).collect(), 1.0),
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
        } => {
            let l = original_max_position_embeddings as f64;
            let freqs = base
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
            (freqs, mscale * mscale)
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
        let (freqs, scale_mult) = inv_freq(rope_dim, theta, scaling);
        let half = rope_dim / 2;
        let inv_r = Tensor::from_slice(&freqs).to_kind(Kind::Double);
        let pos_p = Tensor::arange(max_pos, (Kind::Double, Device::Cpu));
        // angles [P, R/2]
        let ang_pr = pos_p.unsqueeze(1) * inv_r.view([1, half]);
        Rope {
            cos_pr: ang_pr.cos().to_device(device),
            sin_pr: ang_pr.sin().to_device(device),
            scale_mult,
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
        let plain = inv_freq(16, 10_000.0, &RopeScaling::None).0;
        let (yarn, mult) = inv_freq(
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
