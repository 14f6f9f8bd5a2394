//! Small building blocks: a bias-free linear layer, RMSNorm and the dense SwiGLU FFN, and the
//! one random initialiser every layer draws its weights with ([`normal_var`]).
//! Weights are stored PyTorch-style as `[out, in]` under the name `weight`.

use std::cell::Cell;

use tch::{nn, Tensor};

thread_local! {
    /// Set while [`without_init`] builds a model whose weights a checkpoint will overwrite.
    static SKIP_INIT: Cell<bool> = const { Cell::new(false) };
}

/// Runs `build` with random initialisation off: every weight [`normal_var`] would draw starts
/// at zero instead. For a model about to load a checkpoint, drawing a billion normals (and
/// their temporaries) is wasted work; transformers' `no_init_weights` skips it the same way.
/// Builds on other threads are not affected.
pub fn without_init<T>(build: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SKIP_INIT.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SKIP_INIT.with(|s| s.replace(true)));
    build()
}

/// A variable drawn from Normal(0, std) (zero inside [`without_init`]).
pub fn normal_var(p: &nn::Path, name: &str, dims: &[i64], std: f64) -> Tensor {
    let init = if SKIP_INIT.with(Cell::get) {
        nn::Init::Const(0.0)
    } else {
        nn::Init::Randn {
            mean: 0.0,
            stdev: std,
        }
    };
    p.var(name, dims, init)
}

/// `y = x · Wᵀ`, no bias.
#[derive(Debug)]
pub struct Linear {
    /// `[out, in]`.
    pub weight: Tensor,
}

impl Linear {
    /// Normal(0, std) init.
    pub fn new(p: nn::Path, in_dim: i64, out_dim: i64, std: f64) -> Self {
        Linear {
            weight: normal_var(&p, "weight", &[out_dim, in_dim], std),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    #[test]
    fn without_init_leaves_weights_zero_and_restores_random_init() {
        let vs = nn::VarStore::new(Device::Cpu);
        let skipped = without_init(|| Linear::new(vs.root() / "a", 8, 4, 0.02));
        assert_eq!(
            skipped.weight.abs().sum(tch::Kind::Float).double_value(&[]),
            0.0
        );
        let drawn = Linear::new(vs.root() / "b", 8, 4, 0.02);
        assert!(drawn.weight.abs().sum(tch::Kind::Float).double_value(&[]) > 0.0);
    }
}
