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
//!
//! # Master weights
//!
//! A parameter stored in bf16 or f16 (the weights on CUDA, [`corvid_model::precision`]) gets
//! an fp32 master copy `θ₃₂`: the gradient is upcast to fp32 (and clipped there), `m`, `v`
//! and the update above are computed in fp32 on `θ₃₂`, and the parameter is then set to
//! `θ₃₂` rounded to its dtype. Without it an update smaller than half a bf16 step of the
//! weight (`lr · m̂/√v̂ < 2⁻⁹·|θ|`) would be rounded away every time. fp32 and f64
//! parameters have no master; they are updated in place exactly as before. The masters are
//! part of the state ([`AdamW::state_tensors`], `master.<param>`).

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

/// One parameter, its fp32 master copy if it has one, and its moments.
#[derive(Debug)]
struct ParamState {
    name: String,
    param: Tensor,
    /// fp32 copy of a bf16/f16 parameter, which the update is applied to; `None` for fp32
    /// and f64 parameters (updated in place).
    master: Option<Tensor>,
    /// First moment, in the dtype of the tensor updated (fp32 for a master).
    m: Tensor,
    /// Second moment, likewise.
    v: Tensor,
    decay: bool,
}

/// Whether a parameter of dtype `kind` is updated through an fp32 master copy.
fn needs_master(kind: Kind) -> bool {
    matches!(kind, Kind::BFloat16 | Kind::Half)
}

/// An fp32 copy of `param`, outside the autograd graph.
fn master_of(param: &Tensor) -> Tensor {
    tch::no_grad(|| param.detach().to_kind(Kind::Float))
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
/// The prefix of a master copy in [`AdamW::state_tensors`].
const MASTER_PREFIX: &str = "master.";

impl AdamW {
    /// Takes every variable of `vs` that requires a gradient; moments start at zero.
    /// Weight decay applies to tensors with two or more dimensions (matrices, embeddings).
    /// bf16/f16 parameters get an fp32 master copy of their current value (and fp32
    /// moments).
    pub fn new(vs: &nn::VarStore, cfg: OptimConfig) -> Result<Self, TrainError> {
        cfg.validate()?;
        let vars: BTreeMap<String, Tensor> = vs.variables().into_iter().collect();
        let params = vars
            .into_iter()
            .filter(|(_, t)| t.requires_grad())
            .map(|(name, param)| {
                let decay = param.dim() >= 2;
                let master = needs_master(param.kind()).then(|| master_of(&param));
                let like = master.as_ref().unwrap_or(&param);
                ParamState {
                    m: like.zeros_like(),
                    v: like.zeros_like(),
                    master,
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

    /// How many parameters are updated through an fp32 master copy (the bf16/f16 ones).
    pub fn master_count(&self) -> usize {
        self.params.iter().filter(|p| p.master.is_some()).count()
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
                let g = match (&p.master, grad.defined()) {
                    // fp32 master: the gradient is upcast before it is clipped.
                    (Some(_), true) => {
                        let g32 = grad.to_kind(Kind::Float);
                        if clipped {
                            g32 * scale
                        } else {
                            g32
                        }
                    }
                    (Some(master), false) => master.zeros_like(),
                    (None, true) => {
                        if clipped {
                            &grad * scale
                        } else {
                            grad.shallow_clone()
                        }
                    }
                    (None, false) => p.param.zeros_like(),
                };
                // m ← β1·m + (1 − β1)·g ;  v ← β2·v + (1 − β2)·g²
                let _ = p.m.g_mul_scalar_(b1);
                let _ = p.m.g_add_(&(&g * (1.0 - b1)));
                let _ = p.v.g_mul_scalar_(b2);
                let _ = p.v.addcmul_(&(&g * (1.0 - b2)), &g);
                // The tensor updated: the fp32 master, or the parameter itself.
                let theta = match p.master.as_mut() {
                    Some(master) => master,
                    None => &mut p.param,
                };
                // θ ← θ − lr·λ·θ  (decoupled decay)
                if p.decay && wd > 0.0 {
                    let _ = theta.g_mul_scalar_(1.0 - lr * wd);
                }
                // θ ← θ − lr · m̂ / (sqrt(v̂) + ε)
                let denom = (&p.v / bc2).sqrt() + eps;
                let _ = theta.addcdiv_(&(&p.m * (-lr / bc1)), &denom);
                // The bf16/f16 parameter is the master rounded to its dtype.
                if let Some(master) = &p.master {
                    p.param.copy_(master);
                }
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

    /// The full state: `m.<param>`, `v.<param>` for every parameter, `master.<param>` (fp32)
    /// for every parameter with a master copy, and `step` (int64 scalar). Copies on the
    /// CPU, ready for safetensors.
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let cpu = |t: &Tensor| t.to_device(tch::Device::Cpu).copy();
        let mut out = Vec::with_capacity(3 * self.params.len() + 1);
        for p in &self.params {
            out.push((format!("m.{}", p.name), cpu(&p.m)));
            out.push((format!("v.{}", p.name), cpu(&p.v)));
            if let Some(master) = &p.master {
                out.push((format!("{MASTER_PREFIX}{}", p.name), cpu(master)));
            }
        }
        out.push((
            STEP_KEY.to_string(),
            Tensor::from_slice(&[self.step as i64]).reshape([]),
        ));
        out
    }

    /// Restores a state from [`AdamW::state_tensors`]: every parameter's moments must be
    /// present with its shape, and no tensor may name a parameter the optimizer does not
    /// have; nothing is changed unless the whole state matches.
    ///
    /// Master copies may be present or not, whatever the parameters' dtypes now:
    /// - bf16/f16 parameter, master saved: the master is restored (exact resume);
    /// - bf16/f16 parameter, no master (a state saved by an fp32 run): the master is
    ///   rebuilt from the parameter's current value;
    /// - fp32 parameter, master saved (a bf16 run resumed in fp32): the master is the exact
    ///   value the saved bf16 weight was rounded from, so it is copied into the parameter.
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
        let mut found = Vec::with_capacity(self.params.len());
        for p in &self.params {
            let shaped = |key: &str, t: &'_ Tensor| -> Result<(), TrainError> {
                if t.size() != p.param.size() {
                    return Err(TrainError::OptimState(format!(
                        "`{key}` has shape {:?}, the parameter {:?}",
                        t.size(),
                        p.param.size()
                    )));
                }
                Ok(())
            };
            let get = |key: String| -> Result<&Tensor, TrainError> {
                let t = map
                    .get(key.as_str())
                    .ok_or_else(|| TrainError::OptimState(format!("`{key}` is missing")))?;
                shaped(&key, t)?;
                Ok(t)
            };
            let master_key = format!("{MASTER_PREFIX}{}", p.name);
            let master = match map.get(master_key.as_str()) {
                Some(t) => {
                    shaped(&master_key, t)?;
                    if !t.is_floating_point() {
                        return Err(TrainError::OptimState(format!(
                            "`{master_key}` is {:?}, not floating point",
                            t.kind()
                        )));
                    }
                    Some(*t)
                }
                None => None,
            };
            found.push((
                get(format!("m.{}", p.name))?,
                get(format!("v.{}", p.name))?,
                master,
            ));
        }
        let used = 1 + found
            .iter()
            .map(|(_, _, master)| 2 + usize::from(master.is_some()))
            .sum::<usize>();
        if map.len() != used {
            let known = |key: &str| {
                key == STEP_KEY
                    || self.params.iter().any(|p| {
                        [
                            format!("m.{}", p.name),
                            format!("v.{}", p.name),
                            format!("{MASTER_PREFIX}{}", p.name),
                        ]
                        .iter()
                        .any(|k| k == key)
                    })
            };
            let extra = map.keys().find(|k| !known(k)).copied().unwrap_or("?");
            return Err(TrainError::OptimState(format!(
                "{} tensors, expected {used} (m and v for {} parameters, {} masters, and step); `{extra}` names no parameter",
                map.len(),
                self.params.len(),
                used - 1 - 2 * self.params.len()
            )));
        }
        tch::no_grad(|| {
            for (p, (m, v, saved)) in self.params.iter_mut().zip(found) {
                p.m.copy_(&m.to_kind(p.m.kind()).to_device(p.m.device()));
                p.v.copy_(&v.to_kind(p.v.kind()).to_device(p.v.device()));
                match (p.master.as_mut(), saved) {
                    (Some(master), Some(saved)) => {
                        master.copy_(&saved.to_kind(Kind::Float).to_device(master.device()))
                    }
                    (Some(master), None) => master.copy_(&p.param.to_kind(Kind::Float)),
                    (None, Some(saved)) => p
                        .param
                        .copy_(&saved.to_kind(p.param.kind()).to_device(p.param.device())),
                    (None, None) => {}
                }
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

    /// A store with a bf16 vector `a` (all ones) and an fp32 vector `b` (all ones).
    fn mixed_store() -> (nn::VarStore, Tensor, Tensor) {
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let mut a = vs.root().var("a", &[4], nn::Init::Const(1.0));
        let b = vs.root().var("b", &[4], nn::Init::Const(1.0));
        tch::no_grad(|| a.set_data(&a.to_kind(Kind::BFloat16)));
        (vs, a, b)
    }

    /// `Σ c·x` for both: the gradient is `c` (exact in bf16).
    fn backward_const(a: &Tensor, b: &Tensor, c: f64) {
        ((a.to_kind(Kind::Float) * c).sum(Kind::Float) + (b * c).sum(Kind::Float)).backward();
    }

    fn small_steps_cfg() -> OptimConfig {
        OptimConfig {
            lr: 1e-3,
            betas: [0.9, 0.999],
            eps: 1e-8,
            weight_decay: 0.0,
            warmup_steps: 0,
            total_steps: 0,
            min_lr_ratio: 1.0,
            grad_clip: 0.0,
        }
    }

    fn floats(t: &Tensor) -> Vec<f32> {
        Vec::<f32>::try_from(t.to_kind(Kind::Float).view([-1])).unwrap()
    }

    fn state_of<'a>(state: &'a [(String, Tensor)], key: &str) -> &'a Tensor {
        &state.iter().find(|(n, _)| n == key).unwrap().1
    }

    #[test]
    fn bf16_parameters_accumulate_updates_below_their_rounding_step() {
        let (vs, a, b) = mixed_store();
        let mut opt = AdamW::new(&vs, small_steps_cfg()).unwrap();
        assert_eq!(
            opt.master_count(),
            1,
            "only the bf16 parameter has a master"
        );
        // With a constant gradient, m̂ = g and v̂ = g², so each step moves θ by lr = 1e-3,
        // a quarter of the bf16 spacing below 1.0 (2⁻⁸ ≈ 3.9e-3): rounded away alone.
        let mut pure = Tensor::ones([4], (Kind::BFloat16, tch::Device::Cpu));
        for _ in 0..100 {
            backward_const(&a, &b, 1.0);
            opt.step().unwrap();
            pure = &pure - 1e-3;
        }
        assert_eq!(
            floats(&pure),
            vec![1.0; 4],
            "a pure bf16 update does not move"
        );
        let state = opt.state_tensors();
        let master = state_of(&state, "master.a");
        assert_eq!(master.kind(), Kind::Float);
        for x in floats(master) {
            assert!((x - 0.9).abs() < 1e-5, "master {x}, expected 1 − 100·1e-3");
        }
        assert_eq!(a.kind(), Kind::BFloat16);
        for x in floats(&a) {
            // bf16(0.9) = 0.8984375: the parameter is the master, rounded.
            assert_eq!(x, 0.898_437_5);
        }
        // The fp32 parameter took the same path without a master.
        for x in floats(&b) {
            assert!((x - 0.9).abs() < 1e-5, "{x}");
        }
        assert_eq!(state_of(&state, "m.a").kind(), Kind::Float);
        assert!(!state.iter().any(|(n, _)| n == "master.b"));
    }

    #[test]
    fn an_fp32_parameter_beside_a_bf16_one_is_updated_bit_for_bit_as_alone() {
        let (vs, a, b) = mixed_store();
        let mut opt = AdamW::new(&vs, small_steps_cfg()).unwrap();
        let vs32 = nn::VarStore::new(tch::Device::Cpu);
        let b32 = vs32.root().var("b", &[4], nn::Init::Const(1.0));
        let mut opt32 = AdamW::new(&vs32, small_steps_cfg()).unwrap();
        assert_eq!(opt32.master_count(), 0);
        for i in 0..7 {
            let c = 0.3 + i as f64;
            backward_const(&a, &b, c);
            opt.step().unwrap();
            (&b32 * c).sum(Kind::Float).backward();
            opt32.step().unwrap();
        }
        assert!(b.equal(&b32));
    }

    #[test]
    fn masters_round_trip_through_the_state_and_resume_exactly() {
        let run = |opt: &mut AdamW, a: &Tensor, b: &Tensor| {
            for i in 0..5 {
                backward_const(a, b, 0.5 + (i % 3) as f64);
                opt.step().unwrap();
            }
        };
        let set = |dst: &Tensor, src: &Tensor| {
            tch::no_grad(|| dst.shallow_clone().copy_(src));
        };
        let (vs, a, b) = mixed_store();
        let mut opt = AdamW::new(&vs, small_steps_cfg()).unwrap();
        run(&mut opt, &a, &b);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("optimizer.safetensors");
        opt.save(&path).unwrap();
        let saved = opt.state_tensors();
        let (a_saved, b_saved) = (a.copy(), b.copy());
        run(&mut opt, &a, &b);
        let end = opt.state_tensors();
        let master_end = state_of(&end, "master.a");

        // Resume: the saved weights and the saved state, then the same five steps.
        let (vs2, a2, b2) = mixed_store();
        set(&a2, &a_saved);
        set(&b2, &b_saved);
        let mut opt2 = AdamW::new(&vs2, small_steps_cfg()).unwrap();
        opt2.load(&path).unwrap();
        assert_eq!(opt2.step_count(), 5);
        let loaded = opt2.state_tensors();
        assert_eq!(loaded.len(), saved.len());
        for (name, t) in &loaded {
            assert!(t.equal(state_of(&saved, name)), "{name} differs after load");
        }
        run(&mut opt2, &a2, &b2);
        assert!(a2.equal(&a) && b2.equal(&b));
        assert!(state_of(&opt2.state_tensors(), "master.a").equal(master_end));

        // Without masters in the state they are rebuilt from the (rounded) parameters, and
        // the run no longer continues exactly: the masters carry information.
        let no_masters: Vec<(String, Tensor)> = saved
            .iter()
            .filter(|(n, _)| !n.starts_with(MASTER_PREFIX))
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .collect();
        let (vs3, a3, b3) = mixed_store();
        set(&a3, &a_saved);
        set(&b3, &b_saved);
        let mut opt3 = AdamW::new(&vs3, small_steps_cfg()).unwrap();
        opt3.load_state(&no_masters).unwrap();
        let rebuilt = opt3.state_tensors();
        assert!(state_of(&rebuilt, "master.a").equal(&a_saved.to_kind(Kind::Float)));
        assert!(!state_of(&saved, "master.a").equal(state_of(&rebuilt, "master.a")));
        run(&mut opt3, &a3, &b3);
        assert!(!state_of(&opt3.state_tensors(), "master.a").equal(master_end));

        // A tensor that names no parameter is refused, and nothing changes.
        let mut extra: Vec<(String, Tensor)> = saved
            .iter()
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .collect();
        extra.push((
            "master.c".into(),
            Tensor::zeros([4], (Kind::Float, tch::Device::Cpu)),
        ));
        let before = opt3.state_tensors();
        let err = opt3.load_state(&extra).unwrap_err();
        assert!(
            err.to_string().contains("`master.c` names no parameter"),
            "{err}"
        );
        for (name, t) in opt3.state_tensors() {
            assert!(t.equal(state_of(&before, &name)), "{name} changed");
        }

        // A bf16 state resumed with an fp32 parameter: the master becomes its value.
        let vs5 = nn::VarStore::new(tch::Device::Cpu);
        let a5 = vs5.root().var("a", &[4], nn::Init::Const(1.0));
        let _b5 = vs5.root().var("b", &[4], nn::Init::Const(1.0));
        let mut opt5 = AdamW::new(&vs5, small_steps_cfg()).unwrap();
        assert_eq!(opt5.master_count(), 0);
        opt5.load_state(&saved).unwrap();
        assert!(a5.equal(state_of(&saved, "master.a")));
        assert!(!opt5
            .state_tensors()
            .iter()
            .any(|(n, _)| n.starts_with(MASTER_PREFIX)));
    }
}
