//! AdamW written out by hand, so that its state can be saved and restored bit for bit
//! (tch's built-in optimizer cannot export its moments).
//!
//! For each trainable parameter `θ` with gradient `g` at step `t` (1-based):
//!
//! ```text
//! g      ← g · min(1, clip / ‖g_all‖₂)          global-norm clipping over all parameters
//! m      ← β1·m + (1 − β1)·g
//! v      ← β2·v + (1 − β2)·g²
//! m̂      = m / (1 − β1ᵗ),  v̂ = v / (1 − β2ᵗ)     bias correction
//! θ      ← θ − lr_t·λ·θ                          decoupled weight decay (matrices only)
//! θ      ← θ − lr_t · m̂ / (sqrt(v̂) + ε)
//! ```
//!
//! `lr_t` is [`lr_at`]: linear warm-up, then cosine decay to `min_lr_ratio · lr`.
//! Parameters without a gradient this step (an expert no token was routed to) are treated as
//! having a zero gradient, exactly like `torch.optim.AdamW` with `zero_grad(set_to_none=False)`.

use std::collections::BTreeMap;
use std::path::Path;

use tch::{nn, Kind, Tensor};

use super::config::OptimConfig;
use super::TrainError;

/// The learning rate of optimizer step `step` (0-based: the first step is 0).
///
/// - warm-up, `step < W`: `lr · (step + 1) / W`;
/// - then, with `p = min(1, (step − W) / max(1, total − W))`:
///   `lr · (ρ + (1 − ρ) · ½ (1 + cos(π p)))`, `ρ = min_lr_ratio`; it stays at `ρ · lr` after
///   `total_steps`.
pub fn lr_at(cfg: &OptimConfig, step: u64) -> f64 {
    if step < cfg.warmup_steps {
        return cfg.lr * (step + 1) as f64 / cfg.warmup_steps as f64;
    }
    let span = cfg.total_steps.saturating_sub(cfg.warmup_steps).max(1);
    let p = ((step - cfg.warmup_steps) as f64 / span as f64).min(1.0);
    let rho = cfg.min_lr_ratio;
    cfg.lr * (rho + (1.0 - rho) * 0.5 * (1.0 + (std::f64::consts::PI * p).cos()))
}

/// What one optimizer step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OptimStepStats {
    /// Global L2 norm of the gradient before clipping.
    pub grad_norm: f64,
    /// The learning rate used.
    pub lr: f64,
    /// Whether the gradient was scaled down.
    pub clipped: bool,
}

/// One parameter and its moments.
#[derive(Debug)]
struct ParamState {
    name: String,
    param: Tensor,
    m: Tensor,
    v: Tensor,
    decay: bool,
}

/// AdamW over the trainable variables of a `VarStore` (sorted by name).
#[derive(Debug)]
pub struct AdamW {
    cfg: OptimConfig,
    params: Vec<ParamState>,
    step: u64,
}

/// The name of the step counter in [`AdamW::state_tensors`].
const STEP_KEY: &str = "step";

impl AdamW {
    /// Takes every variable of `vs` that requires a gradient; moments start at zero.
    /// Weight decay applies to tensors with two or more dimensions (matrices, embeddings).
    pub fn new(vs: &nn::VarStore, cfg: OptimConfig) -> Result<Self, TrainError> {
        cfg.validate()?;
        let vars: BTreeMap<String, Tensor> = vs.variables().into_iter().collect();
        let params = vars
            .into_iter()
            .filter(|(_, t)| t.requires_grad())
            .map(|(name, param)| {
                let decay = param.dim() >= 2;
                ParamState {
                    m: param.zeros_like(),
                    v: param.zeros_like(),
                    name,
                    param,
                    decay,
                }
            })
            .collect();
        Ok(Self {
            cfg,
            params,
            step: 0,
        })
    }

    /// Optimizer steps taken so far.
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// The configuration.
    pub fn config(&self) -> &OptimConfig {
        &self.cfg
    }

    /// The learning rate the next step will use.
    pub fn current_lr(&self) -> f64 {
        lr_at(&self.cfg, self.step)
    }

    /// Sets all gradients to zero (call before accumulating a new step's gradients;
    /// [`AdamW::step`] also leaves them zeroed).
    pub fn zero_grad(&mut self) {
        for p in &mut self.params {
            p.param.zero_grad();
        }
    }

    /// Global L2 norm of the current gradients (undefined gradients count as zero).
    pub fn grad_norm(&self) -> f64 {
        let sq: Vec<Tensor> = self
            .params
            .iter()
            .filter_map(|p| {
                let g = p.param.grad();
                g.defined()
                    .then(|| g.to_kind(Kind::Double).square().sum(Kind::Double))
            })
            .collect();
        if sq.is_empty() {
            return 0.0;
        }
        Tensor::stack(&sq, 0)
            .sum(Kind::Double)
            .sqrt()
            .double_value(&[])
    }

    /// Clips the global gradient norm, applies one AdamW update at the scheduled rate and
    /// zeroes the gradients. A non-finite gradient norm skips the update (moments and step
    /// count untouched, gradients zeroed) and is reported as an error.
    pub fn step(&mut self) -> Result<OptimStepStats, TrainError> {
        let grad_norm = self.grad_norm();
        if !grad_norm.is_finite() {
            self.zero_grad();
            return Err(TrainError::Data(format!(
                "gradient norm is {grad_norm}; update skipped"
            )));
        }
        let clip = self.cfg.grad_clip;
        let clipped = clip > 0.0 && grad_norm > clip;
        let scale = if clipped {
            clip / (grad_norm + 1e-6)
        } else {
            1.0
        };
        let lr = lr_at(&self.cfg, self.step);
        let t = (self.step + 1) as i32;
        let [b1, b2] = self.cfg.betas;
        let bc1 = 1.0 - b1.powi(t);
        let bc2 = 1.0 - b2.powi(t);
        let (eps, wd) = (self.cfg.eps, self.cfg.weight_decay);
        tch::no_grad(|| {
            for p in &mut self.params {
                let grad = p.param.grad();
                let g = if grad.defined() {
                    if clipped {
                        &grad * scale
                    } else {
                        grad.shallow_clone()
                    }
                } else {
                    p.param.zeros_like()
                };
                // m ← β1·m + (1 − β1)·g ;  v ← β2·v + (1 − β2)·g²
                let _ = p.m.g_mul_scalar_(b1);
                let _ = p.m.g_add_(&(&g * (1.0 - b1)));
                let _ = p.v.g_mul_scalar_(b2);
                let _ = p.v.addcmul_(&(&g * (1.0 - b2)), &g);
                // θ ← θ − lr·λ·θ  (decoupled decay)
                if p.decay && wd > 0.0 {
                    let _ = p.param.g_mul_scalar_(1.0 - lr * wd);
                }
                // θ ← θ − lr · m̂ / (sqrt(v̂) + ε)
                let denom = (&p.v / bc2).sqrt() + eps;
                let _ = p.param.addcdiv_(&(&p.m * (-lr / bc1)), &denom);
            }
        });
        self.zero_grad();
        self.step += 1;
        Ok(OptimStepStats {
            grad_norm,
            lr,
            clipped,
        })
    }

    /// The full state: `m.<param>`, `v.<param>` for every parameter and `step` (int64
    /// scalar). Copies on the CPU, ready for safetensors.
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::with_capacity(2 * self.params.len() + 1);
        for p in &self.params {
            out.push((
                format!("m.{}", p.name),
                p.m.to_device(tch::Device::Cpu).copy(),
            ));
            out.push((
                format!("v.{}", p.name),
                p.v.to_device(tch::Device::Cpu).copy(),
            ));
        }
        out.push((
            STEP_KEY.to_string(),
            Tensor::from_slice(&[self.step as i64]).reshape([]),
        ));
        out
    }

    /// Restores a state from [`AdamW::state_tensors`]: every parameter's moments must be
    /// present with its shape; nothing is changed unless the whole state matches.
    pub fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<(), TrainError> {
        let map: BTreeMap<&str, &Tensor> = state.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let step_t = map
            .get(STEP_KEY)
            .ok_or_else(|| TrainError::OptimState("`step` is missing".into()))?;
        if step_t.numel() != 1 || step_t.kind() != Kind::Int64 {
            return Err(TrainError::OptimState(format!(
                "`step` must be one int64, got {:?} {:?}",
                step_t.kind(),
                step_t.size()
            )));
        }
        let step = step_t.int64_value(&[]);
        if step < 0 {
            return Err(TrainError::OptimState(format!("`step` is {step}")));
        }
        let expected = 2 * self.params.len() + 1;
        if map.len() != expected {
            return Err(TrainError::OptimState(format!(
                "{} tensors, expected {expected} (m and v for {} parameters, and step)",
                map.len(),
                self.params.len()
            )));
        }
        let mut pairs = Vec::with_capacity(self.params.len());
        for p in &self.params {
            let get = |key: String| -> Result<&Tensor, TrainError> {
                let t = map
                    .get(key.as_str())
                    .ok_or_else(|| TrainError::OptimState(format!("`{key}` is missing")))?;
                if t.size() != p.param.size() {
                    return Err(TrainError::OptimState(format!(
                        "`{key}` has shape {:?}, the parameter {:?}",
                        t.size(),
                        p.param.size()
                    )));
                }
                Ok(t)
            };
            pairs.push((get(format!("m.{}", p.name))?, get(format!("v.{}", p.name))?));
        }
        tch::no_grad(|| {
            for (p, (m, v)) in self.params.iter_mut().zip(pairs) {
                p.m.copy_(&m.to_kind(p.m.kind()).to_device(p.m.device()));
                p.v.copy_(&v.to_kind(p.v.kind()).to_device(p.v.device()));
            }
        });
        self.step = step as u64;
        Ok(())
    }

    /// Writes [`AdamW::state_tensors`] to a safetensors file.
    pub fn save(&self, path: &Path) -> Result<(), TrainError> {
        Ok(Tensor::write_safetensors(&self.state_tensors(), path)?)
    }

    /// Reads a file written by [`AdamW::save`] and restores it.
    pub fn load(&mut self, path: &Path) -> Result<(), TrainError> {
        let state = Tensor::read_safetensors(path)?;
        self.load_state(&state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_warms_up_linearly_then_decays_to_the_floor() {
        let cfg = OptimConfig {
            lr: 1.0,
            warmup_steps: 4,
            total_steps: 14,
            min_lr_ratio: 0.1,
            ..OptimConfig::default()
        };
        assert!((lr_at(&cfg, 0) - 0.25).abs() < 1e-12);
        assert!((lr_at(&cfg, 3) - 1.0).abs() < 1e-12);
        assert!((lr_at(&cfg, 4) - 1.0).abs() < 1e-12);
        // Half-way through the decay: 0.1 + 0.9 · 0.5.
        assert!((lr_at(&cfg, 9) - 0.55).abs() < 1e-12);
        assert!((lr_at(&cfg, 14) - 0.1).abs() < 1e-12);
        assert!((lr_at(&cfg, 100) - 0.1).abs() < 1e-12);
    }

    #[test]
    fn one_step_matches_the_formula_by_hand() {
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let w = vs.root().var("w", &[2, 1], nn::Init::Const(1.0));
        let cfg = OptimConfig {
            lr: 0.1,
            betas: [0.9, 0.99],
            eps: 1e-8,
            weight_decay: 0.5,
            warmup_steps: 0,
            total_steps: 0,
            min_lr_ratio: 1.0,
            grad_clip: 0.0,
        };
        let mut opt = AdamW::new(&vs, cfg).unwrap();
        // loss = 3·w0 − 4·w1 → g = (3, −4), ‖g‖ = 5.
        let loss = (&w * Tensor::from_slice(&[3.0f32, -4.0]).view([2, 1])).sum(Kind::Float);
        loss.backward();
        let s = opt.step().unwrap();
        assert!((s.grad_norm - 5.0).abs() < 1e-6);
        // m̂ = g, v̂ = g², step = lr·g/|g| = ±0.1; decay: 1 − 0.1·0.5 = 0.95.
        let got = Vec::<f32>::try_from(w.view([-1])).unwrap();
        assert!((got[0] - (0.95 - 0.1)).abs() < 1e-6, "{got:?}");
        assert!((got[1] - (0.95 + 0.1)).abs() < 1e-6, "{got:?}");
        assert!(!w.grad().defined() || w.grad().abs().sum(Kind::Float).double_value(&[]) == 0.0);
    }

    #[test]
    fn clipping_scales_the_gradient_to_the_bound() {
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let w = vs.root().var("w", &[2], nn::Init::Const(0.0));
        let cfg = OptimConfig {
            lr: 1.0,
            betas: [0.0, 0.0],
            weight_decay: 0.0,
            warmup_steps: 0,
            min_lr_ratio: 1.0,
            grad_clip: 1.0,
            ..OptimConfig::default()
        };
        let mut opt = AdamW::new(&vs, cfg).unwrap();
        (&w * Tensor::from_slice(&[30.0f32, -40.0]))
            .sum(Kind::Float)
            .backward();
        let s = opt.step().unwrap();
        assert!(s.clipped && (s.grad_norm - 50.0).abs() < 1e-4);
        // With β = 0 the step is lr · sign(g) whatever the scale; check m holds the clipped g.
        let state = opt.state_tensors();
        let m = Vec::<f32>::try_from(&state[0].1).unwrap();
        assert!(
            (m[0] - 0.6).abs() < 1e-5 && (m[1] + 0.8).abs() < 1e-5,
            "{m:?}"
        );
    }
}
