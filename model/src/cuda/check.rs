//! Every custom kernel against its reference on fresh random inputs, with the output poisoned
//! (filled with NaN) first so an element the kernel never writes fails the check.
//!
//! Error measure: `rel_err = max |out − ref| / max |ref|`, with the reference computed in fp32
//! from the same inputs (for bf16 kernels the yardstick is the exact math on the bf16 inputs,
//! so only the kernel's own roundings count). Tolerances: fp32 1e-4 (summation order), bf16
//! 1.6e-2 (a few roundings of 2⁻⁹ each; a wrong index or a missed tile gives errors of order
//! one). Dispatch moves bits and must be exact. Where an ATen path exists in the same dtype,
//! its error against the same yardstick is reported beside the kernel's (`aten_rel_err`).

use tch::{nn, Device, Kind, Tensor};

use super::mla_decode::{MlaDecode, MlaKernel};
use super::moe_dispatch::DispatchPlan;
use super::CudaError;
use crate::attention::DecodeCore;
use crate::experts::{Experts, Movement};
use crate::{ModelConfig, MoePolicy};

/// Relative tolerance of an fp32 kernel.
pub const TOL_F32: f64 = 1e-4;
/// Relative tolerance of a bf16 kernel.
pub const TOL_BF16: f64 = 1.6e-2;

/// The outcome of one check.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CheckResult {
    /// What was checked, with its shapes.
    pub name: String,
    /// The kernel variant that ran.
    pub kernel: String,
    /// Input dtype.
    pub dtype: String,
    /// `max |out − ref|`.
    pub max_abs_err: f64,
    /// `max |out − ref| / max |ref|`.
    pub rel_err: f64,
    /// The bound `rel_err` must stay under (0: exact).
    pub tolerance: f64,
    /// The ATen path's `rel_err` in the same dtype, where there is one.
    pub aten_rel_err: Option<f64>,
    /// NaN left in the poisoned output (elements never written).
    pub unwritten: i64,
    /// Whether the check passed.
    pub passed: bool,
    /// Why it could not run, if it could not.
    pub error: Option<String>,
}

/// `(max_abs, rel, nan_count)` of `out` against `reference`, in f64.
pub fn compare(out: &Tensor, reference: &Tensor) -> (f64, f64, i64) {
    let o = out.to_kind(Kind::Double);
    let r = reference.to_kind(Kind::Double);
    let nan = o.isnan().sum(Kind::Int64).int64_value(&[]);
    let max_abs = (&o - &r).abs().max().double_value(&[]);
    let scale = r.abs().max().double_value(&[]).max(1e-30);
    (max_abs, max_abs / scale, nan)
}

fn kind_name(kind: Kind) -> String {
    match kind {
        Kind::BFloat16 => "bf16".into(),
        Kind::Float => "f32".into(),
        other => format!("{other:?}"),
    }
}

fn tol(kind: Kind) -> f64 {
    if kind == Kind::BFloat16 {
        TOL_BF16
    } else {
        TOL_F32
    }
}

/// A result from a comparison: passes when nothing is unwritten and `rel ≤ tolerance`.
fn judged(
    name: String,
    kernel: String,
    kind: Kind,
    out: &Tensor,
    yardstick: &Tensor,
    tolerance: f64,
    aten: Option<&Tensor>,
) -> CheckResult {
    let (max_abs_err, rel_err, unwritten) = compare(out, yardstick);
    let aten_rel_err = aten.map(|a| compare(a, yardstick).1);
    CheckResult {
        name,
        kernel,
        dtype: kind_name(kind),
        max_abs_err,
        rel_err,
        tolerance,
        aten_rel_err,
        unwritten,
        passed: unwritten == 0 && rel_err <= tolerance,
        error: None,
    }
}

fn failed(name: String, kernel: &str, kind: Kind, e: &CudaError) -> CheckResult {
    CheckResult {
        name,
        kernel: kernel.into(),
        dtype: kind_name(kind),
        max_abs_err: f64::NAN,
        rel_err: f64::NAN,
        tolerance: tol(kind),
        aten_rel_err: None,
        unwritten: -1,
        passed: false,
        error: Some(e.to_string()),
    }
}

fn nan_like(shape: &[i64], kind: Kind, dev: Device) -> Tensor {
    Tensor::full(shape, f64::NAN, (kind, dev))
}

/// One MLA decode shape: rows `b`, heads `h`, slots `s` (allocated with `spare` more, so the
/// cache is a strided view as in the model), widths `c`, `r`, visible lengths `lens`.
struct MlaCase {
    b: i64,
    h: i64,
    s: i64,
    spare: i64,
    c: i64,
    r: i64,
    lens: Vec<i64>,
}

fn mla_cases() -> Vec<MlaCase> {
    vec![
        // tiny preset widths
        MlaCase {
            b: 2,
            h: 4,
            s: 70,
            spare: 10,
            c: 32,
            r: 16,
            lens: vec![70, 33],
        },
        // gpu-1b widths, 20 heads (not a multiple of 16), one row with one key
        MlaCase {
            b: 3,
            h: 20,
            s: 1000,
            spare: 200,
            c: 256,
            r: 32,
            lens: vec![1000, 1, 517],
        },
        // K3 widths
        MlaCase {
            b: 2,
            h: 16,
            s: 4096,
            spare: 0,
            c: 512,
            r: 64,
            lens: vec![4096, 2500],
        },
        // a long row (many key splits) and an empty row (zeros)
        MlaCase {
            b: 2,
            h: 16,
            s: 40_000,
            spare: 7,
            c: 256,
            r: 32,
            lens: vec![40_000, 0],
        },
        // small model widths the tensor cores cannot take (c % 32 != 0)
        MlaCase {
            b: 2,
            h: 8,
            s: 300,
            spare: 0,
            c: 48,
            r: 16,
            lens: vec![300, 150],
        },
    ]
}

fn check_mla(case: &MlaCase, kind: Kind, kernel: MlaKernel, dev: Device) -> CheckResult {
    let name = format!(
        "mla_decode B{} H{} S{} c{} r{} lens {:?}",
        case.b, case.h, case.s, case.c, case.r, case.lens
    );
    let kname = format!("{kernel:?}").to_lowercase();
    let run = || -> Result<CheckResult, CudaError> {
        let q_lat = Tensor::randn([case.b, case.h, case.c], (kind, dev));
        let q_pe = Tensor::randn([case.b, case.h, case.r], (kind, dev));
        let cap = case.s + case.spare;
        let c_kv_full = Tensor::randn([case.b, cap, case.c], (kind, dev));
        let k_pe_full = Tensor::randn([case.b, cap, case.r], (kind, dev));
        let c_kv = c_kv_full.narrow(1, 0, case.s);
        let k_pe = k_pe_full.narrow(1, 0, case.s);
        let lens = Tensor::from_slice(&case.lens).to_device(dev);
        // Scores with a standard deviation of about 2: a peaked but not one-hot softmax.
        let scale = 2.0 / ((case.c + case.r) as f64).sqrt();
        let problem = MlaDecode {
            q_lat_bhc: &q_lat,
            q_pe_bhr: &q_pe,
            c_kv_bsc: &c_kv,
            k_pe_bsr: &k_pe,
            lens_b: &lens,
            scale,
        };
        let out = nan_like(&[case.b, case.h, case.c], kind, dev);
        let ran = problem.run_into(&out, kernel)?;
        let yardstick = problem.reference(Some(Kind::Float))?;
        let aten = problem.reference(None)?;
        Ok(judged(
            name.clone(),
            format!("{ran:?}").to_lowercase(),
            kind,
            &out,
            &yardstick,
            tol(kind),
            Some(&aten),
        ))
    };
    run().unwrap_or_else(|e| failed(name.clone(), &kname, kind, &e))
}

/// Random top-k routing of `t` tokens over `e` experts and weights that sum to one.
fn routing(t: i64, k: i64, e: i64, dev: Device) -> (Tensor, Tensor) {
    let scores = Tensor::rand([t, e], (Kind::Float, dev));
    let (vals, idx) = scores.topk(k, -1, true, true);
    let w = &vals / vals.sum_dim_intlist(-1, true, Kind::Float);
    (idx, w)
}

fn check_dispatch(t: i64, k: i64, e: i64, d: i64, kind: Kind, dev: Device) -> CheckResult {
    let name = format!("moe_dispatch T{t} k{k} E{e} d{d}");
    let run = || -> Result<CheckResult, CudaError> {
        let (idx, _) = routing(t, k, e, dev);
        let plan = DispatchPlan::new(&idx, e, DispatchPlan::align_for(kind))?;
        let x = Tensor::randn([t, d], (kind, dev));
        let out = nan_like(&[plan.rows, d], kind, dev);
        plan.dispatch_into(&out, &x)?;
        let reference = plan.dispatch_reference(&x)?;
        let word = match (d * kind.elt_size_in_bytes() as i64) % 16 {
            0 => "w16",
            4 | 8 | 12 => "w4",
            _ => "w2",
        };
        Ok(judged(
            name.clone(),
            word.into(),
            kind,
            &out,
            &reference,
            0.0,
            None,
        ))
    };
    run().unwrap_or_else(|e| failed(name.clone(), "dispatch", kind, &e))
}

fn check_combine(t: i64, k: i64, e: i64, d: i64, kind: Kind, dev: Device) -> CheckResult {
    let name = format!("moe_combine T{t} k{k} E{e} d{d}");
    let run = || -> Result<CheckResult, CudaError> {
        let (idx, w) = routing(t, k, e, dev);
        let plan = DispatchPlan::new(&idx, e, DispatchPlan::align_for(kind))?;
        let y = Tensor::randn([plan.rows, d], (kind, dev));
        let out = nan_like(&[t, d], kind, dev);
        plan.combine_into(&out, &y, &w)?;
        let yardstick = plan.combine_reference(&y.to_kind(Kind::Float), &w)?;
        // The ATen path of `Experts::forward_grouped`: weight, then index_add in the dtype.
        let token_r = Tensor::arange(t * k, (Kind::Int64, dev)).divide_scalar_mode(k, "floor");
        let rows = y.index_select(0, &plan.slot_tk.reshape([-1]).to_kind(Kind::Int64));
        let aten = Tensor::zeros([t, d], (kind, dev)).index_add(
            0,
            &token_r,
            &(rows * w.reshape([-1, 1]).to_kind(kind)),
        );
        let kernel = if kind == Kind::BFloat16 && d % 8 == 0 {
            "bf16x8"
        } else {
            "elementwise"
        };
        Ok(judged(
            name.clone(),
            kernel.into(),
            kind,
            &out,
            &yardstick,
            tol(kind) / 2.0,
            Some(&aten),
        ))
    };
    run().unwrap_or_else(|e| failed(name.clone(), "combine", kind, &e))
}

/// A whole expert layer: kernels + grouped GEMM against the fp32 grouped path.
fn check_moe_layer(dev: Device) -> CheckResult {
    let cfg = ModelConfig {
        hidden_size: 256,
        moe_intermediate_size: 512,
        n_routed_experts: 8,
        num_experts_per_tok: 2,
        ..ModelConfig::gpu_1b()
    };
    let (t, k, e, d) = (777, 2, 8, 256);
    let name = format!("experts forward_dispatched T{t} k{k} E{e} d{d} f512");
    let run = || -> Result<CheckResult, CudaError> {
        let mut vs = nn::VarStore::new(dev);
        let experts = Experts::new(vs.root() / "experts", &cfg);
        let (idx, w) = routing(t, k, e, dev);
        let x = Tensor::randn([t, d], (Kind::Float, dev));
        let yardstick = tch::no_grad(|| experts.forward_grouped(&x, &idx, &w));
        vs.bfloat16();
        let xb = x.to_kind(Kind::BFloat16);
        let wb = w.to_kind(Kind::BFloat16);
        let (out, aten) = tch::no_grad(|| -> Result<(Tensor, Tensor), CudaError> {
            Ok((
                experts.forward_dispatched(&xb, &idx, &wb, Movement::Kernels)?,
                experts.forward_grouped(&xb, &idx, &wb),
            ))
        })?;
        Ok(judged(
            name.clone(),
            "dispatch+grouped_mm+combine".into(),
            Kind::BFloat16,
            &out,
            &yardstick,
            2.0 * TOL_BF16,
            Some(&aten),
        ))
    };
    run().unwrap_or_else(|e| failed(name.clone(), "experts", Kind::BFloat16, &e))
}

/// One cached decode step of a small model with the kernel against the same step with the
/// matmul attention (fp32: the SIMT kernel; bf16: tensor cores, router in fp32).
fn check_model_decode(kind: Kind, dev: Device) -> CheckResult {
    let name = "model decode step (tiny widths, 2 layers, 3 rows)".to_string();
    let run = || -> Result<CheckResult, CudaError> {
        tch::manual_seed(7);
        let cfg = ModelConfig {
            num_hidden_layers: 2,
            ..ModelConfig::tiny()
        };
        let vs = nn::VarStore::new(dev);
        let mut model =
            MoePolicy::new_in_kind(&vs, &cfg, kind).map_err(|e| CudaError::Input(e.to_string()))?;
        let prompt = Tensor::randint(cfg.vocab_size, [3, 40], (Kind::Int64, dev));
        let mut cache = model.new_cache(3, 64);
        let model_err = |e: crate::ModelError| CudaError::Input(e.to_string());
        let _ = model
            .forward_cached(&mut cache, &prompt)
            .map_err(model_err)?;
        let next = Tensor::randint(cfg.vocab_size, [3, 1], (Kind::Int64, dev));
        let mut cache_ref = cache.select(&[0, 1, 2]).map_err(model_err)?;
        let reference = model
            .forward_cached(&mut cache_ref, &next)
            .map_err(model_err)?;
        model.set_decode_core(Some(DecodeCore::Kernel(MlaKernel::Auto)));
        let out = model.forward_cached(&mut cache, &next).map_err(model_err)?;
        let tolerance = if kind == Kind::BFloat16 {
            2.0 * TOL_BF16
        } else {
            TOL_F32
        };
        Ok(judged(
            name.clone(),
            "auto".into(),
            kind,
            &out,
            &reference,
            tolerance,
            None,
        ))
    };
    run().unwrap_or_else(|e| failed(name.clone(), "auto", kind, &e))
}

/// Runs every check on `device` (fixed seed). Each failure is a result, never a panic.
pub fn run_checks(device: Device) -> Vec<CheckResult> {
    tch::manual_seed(1234);
    let mut out = Vec::new();
    for case in mla_cases() {
        out.push(check_mla(&case, Kind::Float, MlaKernel::Simt, device));
        out.push(check_mla(&case, Kind::BFloat16, MlaKernel::Simt, device));
        let kernel = if case.c % 32 == 0 {
            MlaKernel::TensorCore
        } else {
            MlaKernel::Auto
        };
        out.push(check_mla(&case, Kind::BFloat16, kernel, device));
    }
    for (d, kind) in [
        (1024, Kind::BFloat16),
        (1001, Kind::BFloat16),
        (1024, Kind::Float),
        (1001, Kind::Float),
    ] {
        out.push(check_dispatch(2000, 4, 16, d, kind, device));
        out.push(check_combine(2000, 4, 16, d, kind, device));
    }
    // Experts that no token picks (E = 64, 50 tokens of top-2) leave empty groups.
    out.push(check_dispatch(50, 2, 64, 512, Kind::BFloat16, device));
    out.push(check_combine(50, 2, 64, 512, Kind::BFloat16, device));
    out.push(check_moe_layer(device));
    out.push(check_model_decode(Kind::Float, device));
    out.push(check_model_decode(Kind::BFloat16, device));
    out
}
