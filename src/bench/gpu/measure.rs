//! What `corvid bench gpu` measures on one CUDA device, in this order (the CLI prints the
//! table and writes the JSON):
//!
//! 1. **checks** — [`check::run_checks`](corvid_model::cuda::check::run_checks): every kernel against its reference.
//! 2. **attention** — `scaled_dot_product_attention` forward and forward+backward TFLOP/s in
//!    bf16, causal, with the backend `_fused_sdp_choice` picks (0 math, 1 flash,
//!    2 efficient, 3 cuDNN, 4 overrideable), for the MLA head shapes with V padded to the
//!    query width as `Mla::forward_full` does, and a plain head-128 shape for comparison.
//!    FLOPs count the padded dims (what runs): forward `2·B·H·T²·(d_qk + d_v)/2`, backward
//!    2.5× forward (the FlashAttention convention).
//! 3. **moe** — one expert layer of the preset in bf16 (`_grouped_mm`): forward with ATen
//!    dispatch (`Experts::forward_grouped`) and with the custom kernels
//!    (`Experts::forward_dispatched`), forward+backward with ATen; FLOPs `6·T·k·d·f` forward,
//!    3× that with backward. Plus dispatch+combine alone, kernels against ATen.
//! 4. **decode** — at each context: the attention core alone (one layer, bf16, kernel against
//!    the matmul reference) and whole-model cached decode tokens/s with
//!    `set_decode_core(Some(Kernel))` against the default matmul path. The cache is filled
//!    with random latents (a 32K prefill through `forward_cached` would build a T×S score
//!    matrix), which does not change the cost of a step.
//! 5. **train** — full training steps of the preset in bf16 with fp32 routers: forward,
//!    cross-entropy, backward, the trainer's AdamW (`train::AdamW`: fp32 master weights and
//!    moments for the bf16 parameters, as the trainer runs), and once more with health statistics and the balance update. MFU =
//!    tokens/s · 3 · `flops_per_token(T/2)` / peak.
//!
//! Each section's failure is recorded in `errors` and the next section still runs.

use std::time::Instant;

use tch::{nn, Device, Kind, Tensor};

use corvid_learner::train::{AdamW, OptimConfig};
use corvid_model::attention::DecodeCore;
use corvid_model::cuda::check::{run_checks, CheckResult};
use corvid_model::cuda::runtime::{availability, device_name, nvrtc_loadable};
use corvid_model::cuda::{CudaError, DispatchPlan, MlaDecode, MlaKernel};
use corvid_model::experts::{Experts, Movement};
use corvid_model::{ModelConfig, MoePolicy};

/// H100/H200 SXM dense bf16 peak, TFLOP/s (NVIDIA datasheet).
pub const H200_BF16_PEAK_TFLOPS: f64 = 989.0;

/// Sizes and repetitions of one run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GpuBenchOptions {
    /// The CUDA device.
    #[serde(skip)]
    pub device: Device,
    /// Model shape for the MoE, decode and train sections.
    pub preset_name: String,
    /// Attention batch rows.
    pub attn_batch: i64,
    /// Attention sequence length.
    pub attn_seq: i64,
    /// Tokens through the MoE layer.
    pub moe_tokens: i64,
    /// Rows decoding at once.
    pub decode_batch: i64,
    /// Cache lengths to decode at.
    pub decode_contexts: Vec<i64>,
    /// Timed decode steps per measurement.
    pub decode_steps: usize,
    /// Training rows per step.
    pub train_batch: i64,
    /// Training sequence length.
    pub train_seq: i64,
    /// Timed training steps.
    pub train_steps: usize,
    /// Untimed repetitions before each measurement.
    pub warmup: usize,
    /// Timed repetitions of the kernel-level measurements.
    pub iters: usize,
    /// Dense bf16 peak for MFU, TFLOP/s.
    pub peak_tflops: f64,
    /// Stop after the kernel checks.
    pub checks_only: bool,
}

impl GpuBenchOptions {
    /// The defaults: gpu-1b, sized to finish in a few minutes on one H200.
    pub fn new(device: Device) -> Self {
        Self {
            device,
            preset_name: "gpu-1b".into(),
            attn_batch: 4,
            attn_seq: 4096,
            moe_tokens: 16_384,
            decode_batch: 8,
            decode_contexts: vec![4096, 32_768],
            decode_steps: 20,
            train_batch: 16,
            train_seq: 2048,
            train_steps: 6,
            warmup: 3,
            iters: 20,
            peak_tflops: H200_BF16_PEAK_TFLOPS,
            checks_only: false,
        }
    }
}

/// One attention shape.
#[derive(Clone, Debug, serde::Serialize)]
pub struct AttentionBench {
    /// What the shape is.
    pub label: String,
    /// `[B, H, T]`.
    pub batch: i64,
    /// Heads.
    pub heads: i64,
    /// Sequence length.
    pub seq: i64,
    /// Query/key head dim.
    pub qk_dim: i64,
    /// Value head dim before padding.
    pub v_dim: i64,
    /// Value head dim as run (padded to `qk_dim` when smaller).
    pub v_dim_run: i64,
    /// `_fused_sdp_choice` result.
    pub backend_code: i64,
    /// Its name.
    pub backend: String,
    /// Forward time, ms.
    pub fwd_ms: f64,
    /// Forward TFLOP/s.
    pub fwd_tflops: f64,
    /// Forward + backward time, ms.
    pub fwd_bwd_ms: f64,
    /// Forward + backward TFLOP/s.
    pub fwd_bwd_tflops: f64,
}

/// One expert layer.
#[derive(Clone, Debug, serde::Serialize)]
pub struct MoeBench {
    /// Tokens.
    pub tokens: i64,
    /// Experts per token.
    pub top_k: i64,
    /// Routed experts.
    pub experts: i64,
    /// Hidden width d.
    pub hidden: i64,
    /// Expert width f.
    pub ffn: i64,
    /// Forward, ATen dispatch (`forward_grouped`), ms and TFLOP/s.
    pub fwd_aten_ms: f64,
    /// See `fwd_aten_ms`.
    pub fwd_aten_tflops: f64,
    /// Forward, custom dispatch/combine (`forward_dispatched`), ms and TFLOP/s.
    pub fwd_kernels_ms: f64,
    /// See `fwd_kernels_ms`.
    pub fwd_kernels_tflops: f64,
    /// Forward + backward (ATen dispatch), ms and TFLOP/s.
    pub fwd_bwd_aten_ms: f64,
    /// See `fwd_bwd_aten_ms`.
    pub fwd_bwd_aten_tflops: f64,
    /// Dispatch + combine alone with the kernels, ms (plan excluded).
    pub movement_kernels_ms: f64,
    /// The same with ATen `index_select` + weighted `index_add`, ms.
    pub movement_aten_ms: f64,
}

/// Decode at one context length.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DecodeBench {
    /// Cached tokens per row.
    pub context: i64,
    /// Rows.
    pub batch: i64,
    /// Kernel variant used by the core.
    pub kernel: String,
    /// Attention core of one layer with the kernel, µs per call.
    pub core_kernel_us: f64,
    /// The same with the matmul reference, µs.
    pub core_reference_us: f64,
    /// `core_reference_us / core_kernel_us`.
    pub core_speedup: f64,
    /// Whole-model decode with the kernel, tokens/s (all rows).
    pub model_kernel_tokens_per_s: f64,
    /// Whole-model decode with the matmul path, tokens/s.
    pub model_reference_tokens_per_s: f64,
    /// `model_kernel / model_reference`.
    pub model_speedup: f64,
}

/// Training steps of the preset.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TrainBench {
    /// Preset name.
    pub preset: String,
    /// Parameters in total.
    pub params_total: i64,
    /// Parameters per token.
    pub params_active: i64,
    /// Rows per step.
    pub batch: i64,
    /// Sequence length.
    pub seq: i64,
    /// Mean step time, ms (without health statistics).
    pub step_ms: f64,
    /// Training tokens/s.
    pub tokens_per_s: f64,
    /// Training FLOPs per token (3 × forward at the mean causal context).
    pub flops_per_token: f64,
    /// Achieved TFLOP/s.
    pub tflops: f64,
    /// `tflops / peak`.
    pub mfu: f64,
    /// Tokens/s with health statistics and the balance update (what the trainer runs).
    pub tokens_per_s_with_health: f64,
    /// MFU of that.
    pub mfu_with_health: f64,
    /// Optimizer steps skipped for a non-finite gradient norm.
    pub skipped_updates: usize,
}

/// Everything one run measured.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct GpuReport {
    /// CUDA device name.
    pub device_name: String,
    /// Where NVRTC was loaded from.
    pub nvrtc: String,
    /// The options, as run.
    pub options: Option<GpuBenchOptions>,
    /// Kernel checks.
    pub checks: Vec<CheckResult>,
    /// Whether every check passed.
    pub checks_passed: bool,
    /// Attention shapes.
    pub attention: Vec<AttentionBench>,
    /// The expert layer.
    pub moe: Option<MoeBench>,
    /// Decode per context.
    pub decode: Vec<DecodeBench>,
    /// Training.
    pub train: Option<TrainBench>,
    /// Sections that failed, with why.
    pub errors: Vec<String>,
    /// Wall time of the run, s.
    pub seconds: f64,
}

impl GpuReport {
    /// Whether every check passed and every section ran.
    pub fn ok(&self) -> bool {
        self.checks_passed && self.errors.is_empty()
    }
}

fn cuda_index(device: Device) -> i64 {
    match device {
        Device::Cuda(i) => i as i64,
        _ => 0,
    }
}

/// Mean seconds per call of `f` after `warmup` calls, synchronising the device around the
/// timed loop.
fn timed(
    device: Device,
    warmup: usize,
    iters: usize,
    mut f: impl FnMut() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    let sync = || {
        if device.is_cuda() {
            tch::Cuda::synchronize(cuda_index(device));
        }
    };
    for _ in 0..warmup {
        f()?;
    }
    sync();
    let start = Instant::now();
    for _ in 0..iters.max(1) {
        f()?;
    }
    sync();
    Ok(start.elapsed().as_secs_f64() / iters.max(1) as f64)
}

fn sdp_backend_name(code: i64) -> &'static str {
    match code {
        0 => "math",
        1 => "flash",
        2 => "efficient",
        3 => "cudnn",
        4 => "overrideable",
        _ => "error",
    }
}

pub(crate) fn attention_case(
    label: &str,
    (b, h, t): (i64, i64, i64),
    (dqk, dv): (i64, i64),
    o: &GpuBenchOptions,
) -> Result<AttentionBench, CudaError> {
    let dev = o.device;
    let opts = (Kind::BFloat16, dev);
    let q = Tensor::f_randn([b, h, t, dqk], opts)?.set_requires_grad(true);
    let k = Tensor::f_randn([b, h, t, dqk], opts)?.set_requires_grad(true);
    let v = Tensor::f_randn([b, h, t, dv], opts)?.set_requires_grad(true);
    let dv_run = dv.max(dqk);
    let pad = |v: &Tensor| {
        if dv < dqk {
            v.constant_pad_nd([0, dqk - dv])
        } else {
            v.shallow_clone()
        }
    };
    let code = Tensor::f_internal_fused_sdp_choice(
        &q,
        &k,
        &pad(&v),
        None::<Tensor>,
        0.0,
        true,
        None,
        false,
    )?;
    // Causal SDPA with V padded to the QK width, as `Mla::forward_full` runs it.
    let sdpa = || {
        Tensor::f_scaled_dot_product_attention(
            &q,
            &k,
            &pad(&v),
            None::<Tensor>,
            0.0,
            true,
            None,
            false,
        )
    };
    let fwd_s = timed(dev, o.warmup, o.iters, || {
        let _ = tch::no_grad(sdpa)?;
        Ok(())
    })?;
    let g = Tensor::f_randn([b, h, t, dv], opts)?;
    let fwd_bwd_s = timed(dev, o.warmup, o.iters, || {
        let out = sdpa()?.narrow(3, 0, dv);
        let loss = (out * &g).sum(Kind::Float);
        Tensor::f_run_backward(&[&loss], &[&q, &k, &v], false, false)?;
        Ok(())
    })?;
    let fwd_flops = 2.0 * (b * h) as f64 * (t * t) as f64 * (dqk + dv_run) as f64 / 2.0;
    Ok(AttentionBench {
        label: label.into(),
        batch: b,
        heads: h,
        seq: t,
        qk_dim: dqk,
        v_dim: dv,
        v_dim_run: dv_run,
        backend_code: code,
        backend: sdp_backend_name(code).into(),
        fwd_ms: fwd_s * 1e3,
        fwd_tflops: fwd_flops / fwd_s / 1e12,
        fwd_bwd_ms: fwd_bwd_s * 1e3,
        fwd_bwd_tflops: 3.5 * fwd_flops / fwd_bwd_s / 1e12,
    })
}

/// Random top-k routing with weights summing to one (in `kind`).
fn routing(t: i64, k: i64, e: i64, kind: Kind, dev: Device) -> Result<(Tensor, Tensor), CudaError> {
    let scores = Tensor::f_rand([t, e], (Kind::Float, dev))?;
    let (vals, idx) = scores.f_topk(k, -1, true, true)?;
    let w = &vals / vals.sum_dim_intlist(-1, true, Kind::Float);
    Ok((idx, w.to_kind(kind)))
}

pub(crate) fn moe_bench(cfg: &ModelConfig, o: &GpuBenchOptions) -> Result<MoeBench, CudaError> {
    let dev = o.device;
    let (t, k, e) = (o.moe_tokens, cfg.num_experts_per_tok, cfg.n_routed_experts);
    let (d, f) = (cfg.hidden_size, cfg.moe_intermediate_size);
    let mut vs = nn::VarStore::new(dev);
    let experts = Experts::new(vs.root() / "experts", cfg);
    vs.bfloat16();
    let (idx, w) = routing(t, k, e, Kind::BFloat16, dev)?;
    let x = Tensor::f_randn([t, d], (Kind::BFloat16, dev))?;
    let flops = 6.0 * (t * k) as f64 * (d * f) as f64;
    let fwd_aten = timed(dev, o.warmup, o.iters, || {
        let _ = tch::no_grad(|| experts.forward_grouped(&x, &idx, &w));
        Ok(())
    })?;
    let xg = x.detach().set_requires_grad(true);
    let g = Tensor::f_randn([t, d], (Kind::BFloat16, dev))?;
    let mut inputs = vs.trainable_variables();
    inputs.push(xg.shallow_clone());
    let fwd_bwd = timed(dev, o.warmup, o.iters, || {
        let y = experts.forward_grouped(&xg, &idx, &w);
        let loss = (y * &g).sum(Kind::Float);
        Tensor::f_run_backward(&[&loss], &inputs, false, false)?;
        Ok(())
    })?;
    // Row movement alone, on one plan and one expert output.
    let expert_r = idx.reshape([-1]);
    let order_r = expert_r.argsort_stable(true, 0, false);
    let token_r = order_r.divide_scalar_mode(k, "floor");
    let wt_r1 = w.reshape([-1]).index_select(0, &order_r).unsqueeze(1);
    let y_rd = Tensor::f_randn([t * k, d], (Kind::BFloat16, dev))?;
    let move_aten = timed(dev, o.warmup, o.iters, || {
        let _ = x.f_index_select(0, &token_r)?;
        let _ = x.zeros_like().f_index_add(0, &token_r, &(&y_rd * &wt_r1))?;
        Ok(())
    })?;
    // The custom kernels last (everything above is ATen and runs anywhere).
    let fwd_kernels = timed(dev, o.warmup, o.iters, || {
        let _ = tch::no_grad(|| experts.forward_dispatched(&x, &idx, &w, Movement::Kernels))?;
        Ok(())
    })?;
    let plan = DispatchPlan::new(&idx, e, DispatchPlan::align_for(Kind::BFloat16))?;
    let y_pd = Tensor::f_randn([plan.rows, d], (Kind::BFloat16, dev))?;
    let move_kernels = timed(dev, o.warmup, o.iters, || {
        let _ = plan.dispatch(&x)?;
        let _ = plan.combine(&y_pd, &w)?;
        Ok(())
    })?;
    Ok(MoeBench {
        tokens: t,
        top_k: k,
        experts: e,
        hidden: d,
        ffn: f,
        fwd_aten_ms: fwd_aten * 1e3,
        fwd_aten_tflops: flops / fwd_aten / 1e12,
        fwd_kernels_ms: fwd_kernels * 1e3,
        fwd_kernels_tflops: flops / fwd_kernels / 1e12,
        fwd_bwd_aten_ms: fwd_bwd * 1e3,
        fwd_bwd_aten_tflops: 3.0 * flops / fwd_bwd / 1e12,
        movement_kernels_ms: move_kernels * 1e3,
        movement_aten_ms: move_aten * 1e3,
    })
}

pub(crate) fn decode_bench(
    cfg: &ModelConfig,
    ctx: i64,
    o: &GpuBenchOptions,
) -> Result<DecodeBench, CudaError> {
    let dev = o.device;
    let b = o.decode_batch;
    let (h, c, r) = (
        cfg.num_attention_heads,
        cfg.kv_lora_rank,
        cfg.qk_rope_head_dim,
    );
    let bf = (Kind::BFloat16, dev);
    // The attention core of one layer.
    let q_lat = Tensor::f_randn([b, h, c], bf)?;
    let q_pe = Tensor::f_randn([b, h, r], bf)?;
    let c_kv = Tensor::f_randn([b, ctx, c], bf)?;
    let k_pe = Tensor::f_randn([b, ctx, r], bf)?;
    let lens = Tensor::full([b], ctx, (Kind::Int, dev));
    let problem = MlaDecode {
        q_lat_bhc: &q_lat,
        q_pe_bhr: &q_pe,
        c_kv_bsc: &c_kv,
        k_pe_bsr: &k_pe,
        lens_b: &lens,
        scale: 1.0 / (cfg.qk_head_dim() as f64).sqrt(),
    };
    let core_reference = timed(dev, o.warmup, o.iters, || {
        let _ = problem.reference(None)?;
        Ok(())
    })?;
    // The whole model, cache filled with random latents.
    let cfg = ModelConfig {
        max_position_embeddings: cfg
            .max_position_embeddings
            .max(ctx + (o.warmup + o.decode_steps) as i64 + 1),
        ..cfg.clone()
    };
    tch::manual_seed(0);
    let vs = nn::VarStore::new(dev);
    let mut model = MoePolicy::new_in_kind(&vs, &cfg, Kind::BFloat16)
        .map_err(|e| CudaError::Input(e.to_string()))?;
    let mut cache = model.new_cache(b as usize, ctx + (o.warmup + o.decode_steps) as i64 + 8);
    let rows = vec![ctx; b as usize];
    cache
        .fill_random(&rows)
        .map_err(|e| CudaError::Input(e.to_string()))?;
    let next = Tensor::f_randint(cfg.vocab_size, [b, 1], (Kind::Int64, dev))?;
    let mut tokens_per_s = |core: Option<DecodeCore>| -> Result<f64, CudaError> {
        model.set_decode_core(core);
        cache
            .fill_random(&rows)
            .map_err(|e| CudaError::Input(e.to_string()))?;
        let s = timed(dev, o.warmup, o.decode_steps, || {
            let _ = model
                .forward_cached(&mut cache, &next)
                .map_err(|e| CudaError::Input(e.to_string()))?;
            Ok(())
        })?;
        Ok(b as f64 / s)
    };
    let model_reference = tokens_per_s(None)?;
    // The custom kernel last (everything above is ATen and runs anywhere).
    let out = Tensor::f_empty([b, h, c], bf)?;
    let kernel = problem.run_into(&out, MlaKernel::Auto)?;
    let core_kernel = timed(dev, o.warmup, o.iters, || {
        problem.run_into(&out, MlaKernel::Auto)?;
        Ok(())
    })?;
    let model_kernel = tokens_per_s(Some(DecodeCore::Kernel(MlaKernel::Auto)))?;
    Ok(DecodeBench {
        context: ctx,
        batch: b,
        kernel: format!("{kernel:?}").to_lowercase(),
        core_kernel_us: core_kernel * 1e6,
        core_reference_us: core_reference * 1e6,
        core_speedup: core_reference / core_kernel,
        model_kernel_tokens_per_s: model_kernel,
        model_reference_tokens_per_s: model_reference,
        model_speedup: model_kernel / model_reference,
    })
}

pub(crate) fn train_bench(cfg: &ModelConfig, o: &GpuBenchOptions) -> Result<TrainBench, CudaError> {
    let dev = o.device;
    let (b, t) = (o.train_batch, o.train_seq);
    let model_err = |e: corvid_model::ModelError| CudaError::Input(e.to_string());
    tch::manual_seed(0);
    let vs = nn::VarStore::new(dev);
    let mut model = MoePolicy::new_in_kind(&vs, cfg, Kind::BFloat16).map_err(model_err)?;
    let mut opt =
        AdamW::new(&vs, OptimConfig::default()).map_err(|e| CudaError::Input(e.to_string()))?;
    let tokens = Tensor::f_randint(cfg.vocab_size, [b, t + 1], (Kind::Int64, dev))?;
    let (inp, tgt) = (tokens.narrow(1, 0, t), tokens.narrow(1, 1, t).reshape([-1]));
    let mut skipped = 0usize;
    let mut step = |health: bool| -> Result<(), CudaError> {
        let out = model.forward(&inp, health).map_err(model_err)?;
        let loss = out
            .logits_btv
            .reshape([-1, cfg.vocab_size])
            .cross_entropy_for_logits(&tgt)
            + out.aux_loss.to_kind(Kind::Float);
        loss.f_backward()?;
        if health {
            model.update_balance(&out.balance).map_err(model_err)?;
        }
        if opt.step().is_err() {
            skipped += 1;
        }
        Ok(())
    };
    let step_s = timed(dev, 2, o.train_steps, || step(false))?;
    let step_health_s = timed(dev, 1, o.train_steps, || step(true))?;
    let p = cfg.param_counts();
    let flops_per_token = 3.0 * cfg.flops_per_token(t / 2);
    let tokens_per_s = (b * t) as f64 / step_s;
    let tokens_per_s_with_health = (b * t) as f64 / step_health_s;
    let tflops = tokens_per_s * flops_per_token / 1e12;
    Ok(TrainBench {
        preset: o.preset_name.clone(),
        params_total: p.total,
        params_active: p.active,
        batch: b,
        seq: t,
        step_ms: step_s * 1e3,
        tokens_per_s,
        flops_per_token,
        tflops,
        mfu: tflops / o.peak_tflops,
        tokens_per_s_with_health,
        mfu_with_health: tokens_per_s_with_health * flops_per_token / 1e12 / o.peak_tflops,
        skipped_updates: skipped,
    })
}

/// Runs every section on `o.device`, calling `progress` with the report so far after each
/// one (so a run cut short still leaves its figures). Fails only when CUDA is unavailable.
pub fn run_gpu_bench(
    o: &GpuBenchOptions,
    progress: &mut dyn FnMut(&GpuReport),
) -> Result<GpuReport, CudaError> {
    availability(o.device)?;
    let start = Instant::now();
    let cfg = ModelConfig::preset(&o.preset_name).map_err(|e| CudaError::Input(e.to_string()))?;

    let mut report = GpuReport {
        device_name: device_name(cuda_index(o.device) as usize)?,
        nvrtc: nvrtc_loadable()?,
        options: Some(o.clone()),
        ..GpuReport::default()
    };
    let elapsed = |r: &mut GpuReport| r.seconds = start.elapsed().as_secs_f64();

    eprintln!("[bench gpu] kernel checks");
    report.checks = run_checks(o.device);
    report.checks_passed = report.checks.iter().all(|c| c.passed);
    elapsed(&mut report);
    progress(&report);
    if o.checks_only {
        return Ok(report);
    }

    eprintln!("[bench gpu] attention (scaled_dot_product_attention)");
    let (b, t) = (o.attn_batch, o.attn_seq);
    let qk = cfg.qk_head_dim();
    let k3 = ModelConfig::k3_shape();
    let attn_cases = [
        (
            format!("{} MLA (qk {qk}, v {})", o.preset_name, cfg.v_head_dim),
            (b, cfg.num_attention_heads, t),
            (qk, cfg.v_head_dim),
        ),
        (
            format!(
                "k3-shape MLA (qk {}, v {})",
                k3.qk_head_dim(),
                k3.v_head_dim
            ),
            ((b / 2).max(1), 16, t),
            (k3.qk_head_dim(), k3.v_head_dim),
        ),
        (
            "head 128 (reference shape)".to_string(),
            (b, 16, t),
            (128, 128),
        ),
    ];
    for (label, bht, dims) in attn_cases {
        match attention_case(&label, bht, dims, o) {
            Ok(a) => {
                // Training attention must run on a fused kernel, never the math fallback.
                if !matches!(a.backend_code, 1..=3) {
                    report.errors.push(format!(
                        "attention {label}: SDPA chose the {} backend (code {}), not flash, \
                         efficient or cuDNN",
                        a.backend, a.backend_code
                    ));
                }
                report.attention.push(a);
            }
            Err(e) => report.errors.push(format!("attention {label}: {e}")),
        }
    }
    elapsed(&mut report);
    progress(&report);

    eprintln!("[bench gpu] MoE layer (grouped_mm)");
    match moe_bench(&cfg, o) {
        Ok(m) => report.moe = Some(m),
        Err(e) => report.errors.push(format!("moe: {e}")),
    }
    elapsed(&mut report);
    progress(&report);

    for &ctx in &o.decode_contexts {
        eprintln!("[bench gpu] decode at context {ctx}");
        match decode_bench(&cfg, ctx, o) {
            Ok(d) => report.decode.push(d),
            Err(e) => report.errors.push(format!("decode {ctx}: {e}")),
        }
        elapsed(&mut report);
        progress(&report);
    }

    eprintln!("[bench gpu] train steps ({})", o.preset_name);
    match train_bench(&cfg, o) {
        Ok(tr) => report.train = Some(tr),
        Err(e) => report.errors.push(format!("train: {e}")),
    }
    elapsed(&mut report);
    progress(&report);
    Ok(report)
}

#[cfg(test)]
mod tests {
    //! The sections on the CPU at toy sizes: every ATen step runs (so shapes and dtypes are
    //! right before a GPU is ever lent), and the custom-kernel steps, which come last in each
    //! section, fail with the CUDA error rather than a panic.
    use super::*;

    fn toy(device: Device) -> (ModelConfig, GpuBenchOptions) {
        let cfg = ModelConfig {
            num_hidden_layers: 2,
            first_k_dense_replace: 1,
            expert_dispatch: corvid_model::ExpertDispatch::GroupedMm,
            ..ModelConfig::tiny()
        };
        let mut o = GpuBenchOptions::new(device);
        o.preset_name = "tiny".into();
        o.attn_batch = 1;
        o.attn_seq = 32;
        o.moe_tokens = 40;
        o.decode_batch = 2;
        o.decode_contexts = vec![48];
        o.decode_steps = 2;
        o.train_batch = 2;
        o.train_seq = 16;
        o.train_steps = 1;
        o.warmup = 1;
        o.iters = 1;
        (cfg, o)
    }

    fn is_cuda_error(e: &CudaError) -> bool {
        e.to_string().contains("need CUDA tensors")
    }

    #[test]
    fn aten_sections_run_on_cpu() {
        let (cfg, o) = toy(Device::Cpu);
        let a = attention_case("toy", (1, 2, 32), (24, 16), &o).unwrap();
        assert!(a.fwd_tflops > 0.0 && a.fwd_bwd_tflops > 0.0);
        assert_eq!(a.v_dim_run, 24);
        let t = train_bench(&cfg, &o).unwrap();
        assert!(t.tokens_per_s > 0.0 && t.mfu > 0.0);
        assert_eq!(t.params_total, cfg.param_counts().total);
    }

    #[test]
    fn kernel_steps_fail_cleanly_on_cpu() {
        let (cfg, o) = toy(Device::Cpu);
        let e = moe_bench(&cfg, &o).unwrap_err();
        assert!(is_cuda_error(&e), "{e}");
        let e = decode_bench(&cfg, 48, &o).unwrap_err();
        assert!(is_cuda_error(&e), "{e}");
        let mut progress = |_: &GpuReport| {};
        let e = run_gpu_bench(&o, &mut progress).unwrap_err();
        assert!(matches!(e, CudaError::Unavailable(_)), "{e}");
    }
}
