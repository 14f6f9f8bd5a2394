//! The CUDA path on any machine: the kernel APIs refuse CPU tensors and bad shapes with clear
//! errors, the ATen references agree with the model's own paths, the kernel sources compile
//! with NVRTC when NVRTC can be loaded, bf16 models keep their routers in fp32. On a machine
//! with CUDA, every kernel check runs (`gpu_*` tests); without one they print why they skip.

use corvid_model::cuda::check::run_checks;
use corvid_model::cuda::runtime::nvrtc_loadable;
use corvid_model::cuda::MlaKernel;
use corvid_model::cuda::{availability, compile_all, CudaError, DispatchPlan, MlaDecode};
use corvid_model::experts::{Experts, Movement};
use corvid_model::precision::{cast_weights, is_router_param};
use corvid_model::{DecodeCore, ExpertDispatch, ModelConfig, MoePolicy};
use tch::{nn, Device, Kind, Tensor};

mod common;
use common::{max_abs, DecodeInputs};

fn small_cfg() -> ModelConfig {
    ModelConfig {
        hidden_size: 32,
        num_hidden_layers: 3,
        num_attention_heads: 2,
        kv_lora_rank: 16,
        qk_nope_head_dim: 8,
        qk_rope_head_dim: 8,
        v_head_dim: 8,
        n_routed_experts: 8,
        num_experts_per_tok: 2,
        moe_intermediate_size: 16,
        intermediate_size: 32,
        max_position_embeddings: 128,
        ..ModelConfig::tiny()
    }
}

fn input_error(r: Result<Tensor, CudaError>) -> String {
    match r {
        Err(CudaError::Input(msg)) => msg,
        other => panic!("expected an input error, got {other:?}"),
    }
}

#[test]
fn mla_decode_refuses_cpu_tensors() {
    let m = DecodeInputs::new(4, 10, 10, 32, 16, &[10, 3], Kind::Float);
    let msg = input_error(m.problem(0.25).run(MlaKernel::Auto));
    assert!(
        msg.contains("Cpu") && msg.contains("need CUDA tensors"),
        "{msg}"
    );
}

#[test]
fn mla_decode_names_the_bad_argument() {
    let m = DecodeInputs::new(4, 10, 10, 32, 16, &[10, 3], Kind::Float);
    let q_pe = Tensor::randn([2, 5, 16], (Kind::Float, Device::Cpu));
    let msg = input_error(
        MlaDecode {
            q_pe_bhr: &q_pe,
            ..m.problem(0.25)
        }
        .run(MlaKernel::Auto),
    );
    assert!(msg.contains("q_pe") && msg.contains("[2, 5, 16]"), "{msg}");

    let c_kv = Tensor::randn([2, 10, 31], (Kind::Float, Device::Cpu));
    let msg = input_error(
        MlaDecode {
            c_kv_bsc: &c_kv,
            ..m.problem(0.25)
        }
        .run(MlaKernel::Auto),
    );
    assert!(msg.contains("c_kv"), "{msg}");

    let lens = Tensor::from_slice(&[1.0f32, 2.0]);
    let msg = input_error(
        MlaDecode {
            lens_b: &lens,
            ..m.problem(0.25)
        }
        .run(MlaKernel::Auto),
    );
    assert!(
        msg.contains("lens") && msg.contains("int32 or int64"),
        "{msg}"
    );

    let m64 = DecodeInputs::new(4, 10, 10, 32, 16, &[10, 3], Kind::Double);
    let msg = input_error(m64.problem(0.25).run(MlaKernel::Auto));
    assert!(msg.contains("float32 or bfloat16"), "{msg}");

    let k_pe = m.k_pe.to_kind(Kind::BFloat16);
    let msg = input_error(
        MlaDecode {
            k_pe_bsr: &k_pe,
            ..m.problem(0.25)
        }
        .run(MlaKernel::Auto),
    );
    assert!(msg.contains("k_pe is BFloat16"), "{msg}");

    let out = Tensor::zeros([2, 4, 31], (Kind::Float, Device::Cpu));
    let err = m.problem(0.25).run_into(&out, MlaKernel::Auto).unwrap_err();
    assert!(err.to_string().contains("out must be"), "{err}");
}

/// The reference against the softmax written out in f64, row by row; an empty row is zeros.
#[test]
fn mla_reference_matches_the_formula() {
    tch::manual_seed(3);
    let m = DecodeInputs::new(2, 9, 9, 8, 4, &[9, 4, 0], Kind::Double);
    let out = m.problem(0.25).reference(None).unwrap();
    for b in 0..3i64 {
        let len = [9, 4, 0][b as usize];
        for h in 0..2i64 {
            let got = out.get(b).get(h);
            if len == 0 {
                assert_eq!(got.abs().max().double_value(&[]), 0.0);
                continue;
            }
            let ckv = m.c_kv.get(b).narrow(0, 0, len);
            let kpe = m.k_pe.get(b).narrow(0, 0, len);
            let scores = (ckv.mv(&m.q_lat.get(b).get(h)) + kpe.mv(&m.q_pe.get(b).get(h))) * 0.25;
            let p = scores.softmax(0, Kind::Double);
            let want = ckv.tr().mv(&p);
            assert!(max_abs(&got, &want) < 1e-12, "row {b} head {h}");
        }
    }
}

/// The decode path through `forward_absorbed_lens` with the ATen core gives the logits of the
/// matmul path (also for ragged steps where some rows append nothing), so the kernel's
/// length-based masking is the model's.
#[test]
fn reference_decode_core_equals_the_matmul_path() {
    for shift in [false, true] {
        tch::manual_seed(11);
        let cfg = ModelConfig {
            latent_token_shift: shift,
            ..small_cfg()
        };
        let vs = nn::VarStore::new(Device::Cpu);
        let mut model = MoePolicy::new(&vs.root(), &cfg).unwrap();
        let prompt = Tensor::randint(cfg.vocab_size, [3, 12], (Kind::Int64, Device::Cpu));
        let mut cache = model.new_cache(3, 16);
        let _ = model
            .forward_ragged(&mut cache, &prompt, &[12, 5, 9])
            .unwrap();
        let step = Tensor::randint(cfg.vocab_size, [3, 1], (Kind::Int64, Device::Cpu));
        for new_b in [[1, 1, 1], [1, 0, 1]] {
            let mut a = cache.select(&[0, 1, 2]).unwrap();
            let mut b = cache.select(&[0, 1, 2]).unwrap();
            model.set_decode_core(None);
            let want = model.forward_ragged(&mut a, &step, &new_b).unwrap();
            model.set_decode_core(Some(DecodeCore::Reference));
            let got = model.forward_ragged(&mut b, &step, &new_b).unwrap();
            assert_eq!(a.lens(), b.lens());
            for row in 0..3 {
                if new_b[row] == 1 {
                    let d = max_abs(&got.get(row as i64), &want.get(row as i64));
                    assert!(d < 1e-5, "shift {shift} rows {new_b:?} row {row}: {d}");
                }
            }
        }
        // The kernel core on CPU tensors is an error, not a panic.
        model.set_decode_core(Some(DecodeCore::Kernel(MlaKernel::Auto)));
        let err = model.forward_cached(&mut cache, &step).unwrap_err();
        assert!(err.to_string().contains("need CUDA tensors"), "{err}");
    }
}

#[test]
fn dispatch_plan_groups_rows_by_expert_with_aligned_padding() {
    tch::manual_seed(5);
    let (t, k, e, align) = (37i64, 3i64, 6i64, 8i64);
    let scores = Tensor::rand([t, e], (Kind::Float, Device::Cpu));
    let (_, idx) = scores.topk(k, -1, true, true);
    let plan = DispatchPlan::new(&idx, e, align).unwrap();
    let idx_v = Vec::<i64>::try_from(idx.reshape([-1])).unwrap();
    let slot_v = Vec::<i32>::try_from(plan.slot_tk.reshape([-1])).unwrap();
    let src_v = Vec::<i32>::try_from(&plan.src_p).unwrap();
    let offs_v = Vec::<i32>::try_from(&plan.offs_e).unwrap();
    let counts_v = Vec::<i64>::try_from(&plan.counts_e).unwrap();
    assert_eq!(plan.rows, *offs_v.last().unwrap() as i64);
    assert_eq!(src_v.len() as i64, plan.rows);
    let mut start = 0i32;
    for ex in 0..e as usize {
        let end = offs_v[ex];
        assert_eq!((end - start) as i64 % align, 0, "group {ex} is not aligned");
        assert!((end - start) as i64 >= counts_v[ex]);
        // Rows of this expert in routed order occupy the first slots of its group, in order.
        let rows: Vec<usize> = (0..idx_v.len())
            .filter(|&r| idx_v[r] == ex as i64)
            .collect();
        for (i, &r) in rows.iter().enumerate() {
            assert_eq!(slot_v[r], start + i as i32, "row {r} of expert {ex}");
            assert_eq!(src_v[slot_v[r] as usize] as i64, r as i64 / k);
        }
        for p in start + rows.len() as i32..end {
            assert_eq!(src_v[p as usize], -1, "padding slot {p}");
        }
        start = end;
    }
    // The references: dispatch then combine with unit weights sums each token's k copies.
    let x = Tensor::randn([t, 5], (Kind::Float, Device::Cpu));
    let x_pd = plan.dispatch_reference(&x).unwrap();
    let pad_rows = Tensor::from_slice(
        &src_v
            .iter()
            .enumerate()
            .filter(|(_, s)| **s < 0)
            .map(|(p, _)| p as i64)
            .collect::<Vec<_>>(),
    );
    assert_eq!(
        x_pd.index_select(0, &pad_rows)
            .abs()
            .sum(Kind::Float)
            .double_value(&[]),
        0.0
    );
    let ones = Tensor::ones([t, k], (Kind::Float, Device::Cpu));
    let back = plan.combine_reference(&x_pd, &ones).unwrap();
    assert!(max_abs(&back, &(&x * k as f64)) < 1e-5);
}

#[test]
fn dispatch_and_combine_refuse_cpu_tensors_and_bad_shapes() {
    let idx = Tensor::from_slice(&[0i64, 1, 1, 2]).view([2, 2]);
    let plan = DispatchPlan::new(&idx, 3, 4).unwrap();
    let x = Tensor::randn([2, 8], (Kind::Float, Device::Cpu));
    let msg = input_error(plan.dispatch(&x));
    assert!(msg.contains("need CUDA tensors"), "{msg}");
    let x3 = Tensor::randn([3, 8], (Kind::Float, Device::Cpu));
    let msg = input_error(plan.dispatch(&x3));
    assert!(msg.contains("3 tokens") && msg.contains("plan 2"), "{msg}");
    let y = Tensor::randn([plan.rows, 8], (Kind::Float, Device::Cpu));
    let w = Tensor::ones([2, 3], (Kind::Float, Device::Cpu));
    let msg = input_error(plan.combine(&y, &w));
    assert!(msg.contains("weights must be [T, k] = [2, 2]"), "{msg}");
    let w = Tensor::ones([2, 2], (Kind::Float, Device::Cpu));
    let msg = input_error(plan.combine(&y, &w));
    assert!(msg.contains("need CUDA tensors"), "{msg}");
    let bad = Tensor::from_slice(&[0i64, 5]).view([1, 2]);
    let err = DispatchPlan::new(&bad, 3, 4).unwrap_err();
    assert!(err.to_string().contains("outside 0..3"), "{err}");
}

/// Grouped GEMM between the explicit (ATen) dispatch and combine equals the model's grouped
/// and loop paths.
#[test]
fn dispatched_experts_equal_grouped_and_loop_paths() {
    tch::manual_seed(9);
    let cfg = ModelConfig {
        hidden_size: 32,
        moe_intermediate_size: 24,
        n_routed_experts: 6,
        num_experts_per_tok: 2,
        expert_dispatch: ExpertDispatch::GroupedMm,
        ..ModelConfig::small()
    };
    let vs = nn::VarStore::new(Device::Cpu);
    let experts = Experts::new(vs.root() / "experts", &cfg);
    let x = Tensor::randn([41, 32], (Kind::Float, Device::Cpu));
    let scores = Tensor::rand([41, 6], (Kind::Float, Device::Cpu));
    let (w, idx) = scores.topk(2, -1, true, true);
    let want = experts.forward_grouped(&x, &idx, &w);
    let got = experts
        .forward_dispatched(&x, &idx, &w, Movement::Aten)
        .unwrap();
    assert!(max_abs(&got, &want) < 1e-5);
    assert!(max_abs(&got, &experts.forward_loop(&x, &idx, &w)) < 1e-5);
    let err = experts
        .forward_dispatched(&x, &idx, &w, Movement::Kernels)
        .unwrap_err();
    assert!(err.to_string().contains("need CUDA tensors"), "{err}");
}

#[test]
fn bf16_weights_keep_routers_in_fp32() {
    let cfg = small_cfg();
    let vs32 = nn::VarStore::new(Device::Cpu);
    let m32 = MoePolicy::new(&vs32.root(), &cfg).unwrap();
    let mut vs = nn::VarStore::new(Device::Cpu);
    let mut model = MoePolicy::new_in_kind(&vs, &cfg, Kind::BFloat16).unwrap();
    // The fp32 model's values (other tests draw from the global RNG concurrently, so a
    // shared seed would not give both the same initialisation), then bf16 again.
    vs.copy(&vs32).unwrap();
    cast_weights(&vs, Kind::BFloat16).unwrap();
    let mut routers = 0;
    for (name, t) in vs.variables() {
        if is_router_param(&name) {
            routers += 1;
            assert_eq!(t.kind(), Kind::Float, "{name}");
        } else {
            assert_eq!(t.kind(), Kind::BFloat16, "{name}");
        }
    }
    assert_eq!(
        routers,
        2 * cfg.num_hidden_layers,
        "weight and bias per MoE layer"
    );
    // Same initial values (up to bf16 rounding), same forward up to bf16 error.
    let tokens = Tensor::randint(cfg.vocab_size, [2, 10], (Kind::Int64, Device::Cpu));
    let out = model.forward(&tokens, true).unwrap();
    assert_eq!(out.logits_btv.kind(), Kind::BFloat16);
    let want = m32.forward(&tokens, false).unwrap().logits_btv;
    // Mean error: a bf16-rounded router score may flip one token's top-k choice.
    let scale = want.abs().mean(Kind::Float).double_value(&[]);
    let d = (out.logits_btv.to_kind(Kind::Float) - &want)
        .abs()
        .mean(Kind::Float)
        .double_value(&[]);
    assert!(
        d < 0.05 * scale,
        "bf16 logits differ by {d} on average (mean |logit| {scale})"
    );
    // Training runs: gradients reach bf16 weights and fp32 routers alike.
    let loss = out
        .logits_btv
        .reshape([-1, cfg.vocab_size])
        .cross_entropy_for_logits(&tokens.reshape([-1]))
        + out.aux_loss.to_kind(Kind::Float);
    loss.backward();
    let mut with_grad = 0;
    for (name, t) in vs.variables() {
        let g = t.grad();
        if g.defined() {
            with_grad += 1;
            assert_eq!(g.kind(), t.kind(), "{name}");
            assert!(g.isfinite().all().int64_value(&[]) == 1, "{name}");
        }
    }
    assert!(with_grad > 20, "{with_grad} variables got gradients");
    model.update_balance(&out.balance).unwrap();
    for (_, r) in model.routers() {
        assert_eq!(r.bias_e.kind(), Kind::Float);
    }
    // Decoding uses a bf16 cache.
    let mut cache = model.new_cache(2, 16);
    let logits = model.forward_cached(&mut cache, &tokens).unwrap();
    assert!(logits.isfinite().all().int64_value(&[]) == 1);
    assert_eq!(cache.bytes_per_token(), 3 * (16 + 8) * 2);
    // Casting back to fp32 is exact for what bf16 can hold.
    assert!(cast_weights(&vs, Kind::Float).unwrap() > 0);
}

#[test]
fn kernels_report_unavailable_without_cuda() {
    if tch::Cuda::is_available() {
        eprintln!("skipped: CUDA is available here (the test covers CPU-only machines)");
        return;
    }
    match availability(Device::Cuda(0)) {
        Err(CudaError::Unavailable(why)) => assert!(why.contains("no CUDA device"), "{why}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(matches!(
        availability(Device::Cpu),
        Err(CudaError::Unavailable(_))
    ));
}

/// NVRTC compiles every kernel source for Hopper (and an Ampere target) when it can be loaded
/// (the PyTorch wheel ships it); no GPU is needed for this.
#[test]
fn kernel_sources_compile_with_nvrtc() {
    match nvrtc_loadable() {
        Err(e) => {
            eprintln!("skipped: NVRTC cannot be loaded here ({e})");
        }
        Ok(origin) => {
            eprintln!("NVRTC from {origin}");
            let shapes = [(32, 16), (48, 16), (256, 32), (512, 64), (32, 0)];
            for arch in ["sm_90", "sm_80"] {
                let built = compile_all(arch, &shapes).unwrap();
                assert_eq!(built.len(), shapes.len() + 1);
                for (name, bytes) in built {
                    assert!(bytes > 1000, "{arch} {name}: {bytes} bytes of PTX");
                }
            }
        }
    }
}

/// Every kernel check (poisoned outputs, fresh random inputs) on the GPU.
#[test]
fn gpu_kernel_checks_pass() {
    if !tch::Cuda::is_available() {
        eprintln!("skipped: no CUDA device (tch::Cuda::is_available() is false)");
        return;
    }
    let results = run_checks(Device::Cuda(0));
    let failed: Vec<_> = results.iter().filter(|c| !c.passed).collect();
    for c in &results {
        eprintln!(
            "{} [{} {}] rel {:.2e} (aten {:?}) tol {:.1e} unwritten {} {}",
            c.name,
            c.kernel,
            c.dtype,
            c.rel_err,
            c.aten_rel_err,
            c.tolerance,
            c.unwritten,
            c.error.clone().unwrap_or_default()
        );
    }
    assert!(
        failed.is_empty(),
        "{} of {} checks failed",
        failed.len(),
        results.len()
    );
}

/// On a CPU-only machine every check runs up to its kernel call and reports the CUDA error
/// as a failed result (never a panic), so `corvid bench gpu` can always print its table.
#[test]
fn checks_report_errors_instead_of_panicking_on_cpu() {
    let results = run_checks(Device::Cpu);
    assert!(results.len() > 20, "{} checks", results.len());
    for c in &results {
        assert!(!c.passed, "{} passed on the CPU", c.name);
        let err = c.error.as_deref().unwrap_or("");
        assert!(err.contains("need CUDA tensors"), "{}: {err}", c.name);
    }
}
