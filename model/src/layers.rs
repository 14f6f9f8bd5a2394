//! Small building blocks: a bias-free linear layer, RMSNorm and the dense SwiGLU FFN.
//! Weights are stored PyTorch-style as `[out, in]` under the name `weight`.

use tch::{nn, Tensor};

/// `y = x · Wᵀ`, no bias.
#[derive(Debug)]
pub struct Linear {
    /// `[out, in]`.
    pub weight: Tensor,
}

impl Linear {
    /// Normal(0, std) init.
    pub fn new(p: nn::Path, in_dim: i64, out_dim: i64, std: f64) -> Self {
        let weight = p.var(
            "weight",
            &[out_dim, in_dim],
            nn::Init::Randn {
                mean: 0.0,
                stdev: std,
            },
        );
        Linear { weight }
    }

    /// Zero init (for layers whose output must start at zero).
    pub fn zeros(p: nn::Path, in_dim: i64, out_dim: i64) -> Self {
        Linear {
            weight: p.var("weight", &[out_dim, in_dim], nn::Init::Const(0.0)),
        }
    }

    /// Applies the layer over the last dim.
    pub fn forward(&self, x: &Tensor) -> Tensor {
        x.matmul(&self.weight.tr())
    }
}

/// RMSNorm with a learned scale initialised to one.
#[derive(Debug)]
pub struct RmsNorm {
    /// `[d]`.
    pub weight: Tensor,
    dim: i64,
    eps: f64,
}

impl RmsNorm {
    /// New norm over `dim` channels.
    pub fn new(p: nn::Path, dim: i64, eps: f64) -> Self {
        RmsNorm {
            weight: p.var("weight", &[dim], nn::Init::Const(1.0)),
            dim,
            eps,
        }
    }

    /// Normalises the last dim: `x · rsqrt(mean(x²) + eps) · weight`, as libtorch's fused
    /// `rms_norm` (one kernel forward and backward instead of five elementwise ops each way).
    pub fn forward(&self, x: &Tensor) -> Tensor {
        x.rms_norm([self.dim], Some(&self.weight), self.eps)
    }
}

/// Dense SwiGLU FFN: `down(silu(gate(x)) · up(x))`. Used for leading dense layers and for the
/// merged shared experts.
#[derive(Debug)]
pub struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    /// `d → f → d`.
    pub fn new(p: nn::Path, d: i64, f: i64, std: f64) -> Self {
        Mlp {
            gate_proj: Linear::new(&p / "gate_proj", d, f, std),
            up_proj: Linear::new(&p / "up_proj", d, f, std),
            down_proj: Linear::new(&p / "down_proj", f, d, std),
        }
    }

    /// Applies the FFN over the last dim.
    pub fn forward(&self, x: &Tensor) -> Tensor {
        self.down_proj
            .forward(&(self.gate_proj.forward(x).silu() * self.up_proj.forward(x)))
    }
}
