//! Absorbed MLA decode attention: the attention core of
//! [`Mla::forward_absorbed`](crate::attention::Mla::forward_absorbed) for one query
//! token per row, over the latent cache, as a custom kernel (`mla_decode.cu`).
//!
//! Shape legend: `b` rows, `h` heads, `s` cache slots, `c` latent rank, `r` RoPE width.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use tch::{Device, Kind, Tensor};

use super::runtime::{cuda_ordinal, device_runtime, mla_source, DeviceRuntime};
use super::CudaError;

/// Which kernel computes the attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MlaKernel {
    /// Tensor cores when the inputs allow them (bf16, `c % 32 == 0`, `(c + r) % 16 == 0`,
    /// 16-byte aligned rows, compute capability ≥ 8.0), else the plain kernel.
    Auto,
    /// One block per (row, head), plain FMA; any dtype and width.
    Simt,
    /// `mma.sync` bf16 tensor cores with the keys split across blocks; an error when the
    /// inputs do not allow it.
    TensorCore,
}

/// Tensor-core kernel tiling (must match `mla_decode.cu`).
const TC_TK: i64 = 32;
const TC_HEADS: i64 = 16;
const TC_THREADS: u32 = 128;
const SIMT_THREADS: u32 = 128;
const COMBINE_THREADS: u32 = 128;
const COMBINE_MAX_SPLIT: i64 = 1024;

/// Shared memory of one tensor-core block (the `TC_SMEM_BYTES` macro of the kernel).
fn tc_smem_bytes(c: i64, r: i64) -> i64 {
    let ds = c + r + 8;
    let ps = TC_TK + 8;
    (TC_HEADS * ds + TC_TK * ds) * 2 + TC_HEADS * TC_TK * 4 + TC_HEADS * ps * 2 + 3 * TC_HEADS * 4
}

/// Sizes read off validated inputs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub(crate) b: i64,
    pub(crate) h: i64,
    pub(crate) s: i64,
    pub(crate) c: i64,
    pub(crate) r: i64,
    pub(crate) kind: Kind,
    pub(crate) device: Device,
}

/// One decode-attention problem: per row `b` and head `h`,
/// `out[b, h] = softmax_s(scale · (q_lat[b, h] · c_kv[b, s] + q_pe[b, h] · k_pe[b, s])) · c_kv[b, s]`
/// over the visible slots `s < lens[b]`; a row with no visible slot gets zeros.
#[derive(Clone, Copy, Debug)]
pub struct MlaDecode<'a> {
    /// Query folded into latent space `[B, H, c]` (`q_nope · W_uk`).
    pub q_lat_bhc: &'a Tensor,
    /// RoPE part of the query `[B, H, r]` (`r` may be 0).
    pub q_pe_bhr: &'a Tensor,
    /// Cached latent `[B, S, c]`; each slot's `c` values contiguous (a narrowed cache is fine).
    pub c_kv_bsc: &'a Tensor,
    /// Cached RoPE key `[B, S, r]`, laid out like `c_kv`.
    pub k_pe_bsr: &'a Tensor,
    /// Visible slots per row `[B]`, int32 or int64 (clamped to `0..=S`).
    pub lens_b: &'a Tensor,
    /// Softmax scale.
    pub scale: f64,
}

fn size_str(t: &Tensor) -> String {
    format!("{:?}", t.size())
}

/// `t [B, S, w]` with each slot's `w` values contiguous and the slots of a row one after
/// another: `t` itself when it already is (the batch may be strided, as in a narrowed cache),
/// else a contiguous copy. Both decode cores read the cache this way.
pub(crate) fn slot_rows(t: &Tensor, w: i64) -> Tensor {
    let st = t.stride();
    if st[2] == 1 && (st[1] == w || t.size()[1] <= 1) && st[0] >= 0 {
        t.shallow_clone()
    } else {
        t.contiguous()
    }
}

impl MlaDecode<'_> {
    /// Checks shapes, dtypes and devices; names the first bad argument.
    pub(crate) fn dims(&self) -> Result<Dims, CudaError> {
        let bad = |msg: String| Err(CudaError::Input(format!("mla_decode: {msg}")));
        let q = self.q_lat_bhc;
        let Ok((b, h, c)) = q.size3() else {
            return bad(format!("q_lat must be [B, H, c], got {}", size_str(q)));
        };
        let Ok((b2, h2, r)) = self.q_pe_bhr.size3() else {
            return bad(format!(
                "q_pe must be [B, H, r], got {}",
                size_str(self.q_pe_bhr)
            ));
        };
        if (b2, h2) != (b, h) {
            return bad(format!(
                "q_pe {} does not match q_lat {} in B, H",
                size_str(self.q_pe_bhr),
                size_str(q)
            ));
        }
        let Ok((b3, s, c3)) = self.c_kv_bsc.size3() else {
            return bad(format!(
                "c_kv must be [B, S, c], got {}",
                size_str(self.c_kv_bsc)
            ));
        };
        if b3 != b || c3 != c {
            return bad(format!(
                "c_kv {} does not match q_lat {} (B {b}, c {c})",
                size_str(self.c_kv_bsc),
                size_str(q)
            ));
        }
        if self.k_pe_bsr.size() != [b, s, r] {
            return bad(format!(
                "k_pe must be [B, S, r] = [{b}, {s}, {r}], got {}",
                size_str(self.k_pe_bsr)
            ));
        }
        if self.lens_b.size() != [b] {
            return bad(format!(
                "lens must be [B] = [{b}], got {}",
                size_str(self.lens_b)
            ));
        }
        if !matches!(self.lens_b.kind(), Kind::Int | Kind::Int64) {
            return bad(format!(
                "lens must be int32 or int64, got {:?}",
                self.lens_b.kind()
            ));
        }
        let kind = q.kind();
        if !matches!(kind, Kind::Float | Kind::BFloat16 | Kind::Double) {
            return bad(format!(
                "q_lat must be float32 or bfloat16 (float64 for the reference), got {kind:?}"
            ));
        }
        for (name, t) in [
            ("q_pe", self.q_pe_bhr),
            ("c_kv", self.c_kv_bsc),
            ("k_pe", self.k_pe_bsr),
        ] {
            if t.kind() != kind {
                return bad(format!("{name} is {:?} but q_lat is {kind:?}", t.kind()));
            }
        }
        if b > 65_535 {
            return bad(format!("at most 65,535 rows per launch, got {b}"));
        }
        if !self.scale.is_finite() {
            return bad(format!("scale must be finite, got {}", self.scale));
        }
        let device = q.device();
        for (name, t) in [
            ("q_pe", self.q_pe_bhr),
            ("c_kv", self.c_kv_bsc),
            ("k_pe", self.k_pe_bsr),
            ("lens", self.lens_b),
        ] {
            if t.device() != device {
                return bad(format!(
                    "{name} is on {:?} but q_lat is on {device:?}",
                    t.device()
                ));
            }
        }
        Ok(Dims {
            b,
            h,
            s,
            c,
            r,
            kind,
            device,
        })
    }

    /// The reference with ATen ops in the order of `Mla::forward_absorbed` (bmm scores,
    /// scale, −inf bias past `lens`, fp32 softmax, bmm with the cache), computed in `kind`
    /// (`None`: the inputs' dtype; `Some(Kind::Float)` gives the fp32 yardstick for bf16
    /// inputs). Runs on any device. Rows with no visible slot get zeros.
    pub fn reference(&self, kind: Option<Kind>) -> Result<Tensor, CudaError> {
        let d = self.dims()?;
        let kind = kind.unwrap_or(d.kind);
        let q_lat = self.q_lat_bhc.to_kind(kind);
        let c_kv = self.c_kv_bsc.to_kind(kind);
        // [B, S, H]: the cache operand row-major, as in forward_absorbed.
        let nope_bsh = c_kv.f_bmm(&q_lat.transpose(1, 2))?;
        let scores_bsh = if d.r > 0 {
            let q_pe = self.q_pe_bhr.to_kind(kind);
            let k_pe = self.k_pe_bsr.to_kind(kind);
            nope_bsh.f_add(&k_pe.f_bmm(&q_pe.transpose(1, 2))?)?
        } else {
            nope_bsh
        };
        let lens_b1 = self.lens_b.to_kind(Kind::Int64).unsqueeze(1);
        let slot_1s = Tensor::arange(d.s, (Kind::Int64, d.device)).unsqueeze(0);
        let hidden_b1s = slot_1s.ge_tensor(&lens_b1).unsqueeze(1);
        let bias_b1s = Tensor::zeros([d.b, 1, d.s], (kind, d.device))
            .masked_fill(&hidden_b1s, f64::NEG_INFINITY);
        let scores_bhs = scores_bsh.transpose(1, 2) * self.scale + bias_b1s;
        let soft_kind = crate::precision::work_kind(kind);
        let attn_bhs = scores_bhs.softmax(-1, soft_kind).to_kind(kind);
        let out_bhc = attn_bhs.f_bmm(&c_kv)?;
        let empty_b11 = lens_b1.le(0).unsqueeze(2);
        Ok(out_bhc.masked_fill(&empty_b11, 0.0))
    }

    /// Runs the kernel into a new `[B, H, c]` tensor.
    pub fn run(&self, kernel: MlaKernel) -> Result<Tensor, CudaError> {
        let d = self.dims()?;
        let out = Tensor::f_empty([d.b, d.h, d.c], (d.kind, d.device))?;
        self.run_into(&out, kernel)?;
        Ok(out)
    }

    /// Runs the kernel into `out` (`[B, H, c]`, contiguous, dtype and device of the inputs);
    /// returns the kernel that ran.
    pub fn run_into(&self, out: &Tensor, kernel: MlaKernel) -> Result<MlaKernel, CudaError> {
        let d = self.dims()?;
        if out.size() != [d.b, d.h, d.c] || out.kind() != d.kind || out.device() != d.device {
            return Err(CudaError::Input(format!(
                "mla_decode: out must be {:?} [{}, {}, {}] on {:?}, got {:?} {} on {:?}",
                d.kind,
                d.b,
                d.h,
                d.c,
                d.device,
                out.kind(),
                size_str(out),
                out.device()
            )));
        }
        if !out.is_contiguous() {
            return Err(CudaError::Input(
                "mla_decode: out must be contiguous".into(),
            ));
        }
        if d.kind == Kind::Double {
            return Err(CudaError::Input(
                "mla_decode: the kernels take float32 or bfloat16, got Double".into(),
            ));
        }
        let ordinal = cuda_ordinal(d.device, "mla_decode input q_lat")?;
        let rt = device_runtime(ordinal)?;
        if d.b == 0 || d.h == 0 || d.c == 0 {
            return Ok(kernel);
        }
        let c_kv = slot_rows(self.c_kv_bsc, d.c);
        let k_pe = slot_rows(self.k_pe_bsr, d.r);
        let q_lat = self.q_lat_bhc.contiguous();
        let q_pe = self.q_pe_bhr.contiguous();
        let lens = self.lens_b.f_to_kind(Kind::Int)?.contiguous();
        let tc_ok = self.tensor_core_ok(&d, &rt, &c_kv, &k_pe);
        let use_tc = match (kernel, tc_ok) {
            (MlaKernel::Simt, _) => false,
            (MlaKernel::Auto, ok) => ok.is_ok(),
            (MlaKernel::TensorCore, Ok(())) => true,
            (MlaKernel::TensorCore, Err(why)) => {
                return Err(CudaError::Input(format!(
                    "mla_decode: the tensor-core kernel cannot take these inputs: {why}"
                )))
            }
        };
        let args = KernelArgs {
            q_lat: q_lat.data_ptr() as u64,
            q_pe: q_pe.data_ptr() as u64,
            c_kv: c_kv.data_ptr() as u64,
            ckv_bstride: c_kv.stride()[0],
            k_pe: k_pe.data_ptr() as u64,
            kpe_bstride: k_pe.stride()[0],
            lens: lens.data_ptr() as u64,
            s: d.s as i32,
            h: d.h as i32,
            scale: self.scale as f32,
            out: out.data_ptr() as u64,
        };
        if use_tc {
            launch_tc(&rt, &d, &args)?;
            Ok(MlaKernel::TensorCore)
        } else {
            launch_simt(&rt, &d, &args)?;
            Ok(MlaKernel::Simt)
        }
    }

    /// Why the tensor-core kernel cannot run here (Ok: it can).
    fn tensor_core_ok(
        &self,
        d: &Dims,
        rt: &DeviceRuntime,
        c_kv: &Tensor,
        k_pe: &Tensor,
    ) -> Result<(), String> {
        if d.kind != Kind::BFloat16 {
            return Err(format!("dtype {:?} (needs bfloat16)", d.kind));
        }
        if d.c % 32 != 0 || (d.c + d.r) % 16 != 0 {
            return Err(format!(
                "c = {}, r = {} (needs c % 32 == 0 and (c + r) % 16 == 0)",
                d.c, d.r
            ));
        }
        if rt.cc_major < 8 {
            return Err(format!("compute capability {}.x (needs 8.0+)", rt.cc_major));
        }
        let smem = tc_smem_bytes(d.c, d.r);
        if smem > rt.smem_optin {
            return Err(format!(
                "{smem} bytes of shared memory per block (device allows {})",
                rt.smem_optin
            ));
        }
        for (name, t) in [("c_kv", c_kv), ("k_pe", k_pe)] {
            if !(t.data_ptr() as usize).is_multiple_of(16) || t.stride()[0] % 8 != 0 {
                return Err(format!("{name} rows are not 16-byte aligned"));
            }
        }
        Ok(())
    }
}

/// Kernel arguments shared by both paths (device pointers as u64).
struct KernelArgs {
    q_lat: u64,
    q_pe: u64,
    c_kv: u64,
    ckv_bstride: i64,
    k_pe: u64,
    kpe_bstride: i64,
    lens: u64,
    s: i32,
    h: i32,
    scale: f32,
    out: u64,
}

fn module_key(d: &Dims) -> String {
    format!("mla_decode_c{}_r{}", d.c, d.r)
}

fn launch_simt(rt: &DeviceRuntime, d: &Dims, a: &KernelArgs) -> Result<(), CudaError> {
    let name = if d.kind == Kind::BFloat16 {
        "mla_decode_simt_bf16"
    } else {
        "mla_decode_simt_f32"
    };
    let func = rt.function(&module_key(d), || mla_source(d.c, d.r), name)?;
    let stream = rt.stream();
    let cfg = LaunchConfig {
        grid_dim: (d.h as u32, d.b as u32, 1),
        block_dim: (SIMT_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut launch = stream.launch_builder(&func);
    launch
        .arg(&a.q_lat)
        .arg(&a.q_pe)
        .arg(&a.c_kv)
        .arg(&a.ckv_bstride)
        .arg(&a.k_pe)
        .arg(&a.kpe_bstride)
        .arg(&a.lens)
        .arg(&a.s)
        .arg(&a.h)
        .arg(&a.scale)
        .arg(&a.out);
    // SAFETY: the argument list matches `mla_decode_simt_*` in mla_decode.cu; every pointer
    // is a live CUDA tensor of the validated shape, kept alive by the caller until after the
    // launch is enqueued on the stream libtorch orders its own work on.
    unsafe { launch.launch(cfg) }?;
    Ok(())
}

/// Splits over keys: enough blocks to fill the device about four times over, whole tiles per
/// split, at most `COMBINE_MAX_SPLIT` splits.
fn split_plan(rt: &DeviceRuntime, d: &Dims) -> (i64, i64) {
    let tiles = ((d.s + TC_TK - 1) / TC_TK).max(1);
    let base_blocks = d.b * ((d.h + TC_HEADS - 1) / TC_HEADS);
    let want = ((4 * rt.sm_count + base_blocks - 1) / base_blocks).clamp(1, tiles);
    let want = want.min(COMBINE_MAX_SPLIT);
    let tiles_per_split = (tiles + want - 1) / want;
    let split_len = tiles_per_split * TC_TK;
    let n_split = ((d.s + split_len - 1) / split_len).max(1);
    (n_split, split_len)
}

fn launch_tc(rt: &DeviceRuntime, d: &Dims, a: &KernelArgs) -> Result<(), CudaError> {
    let key = module_key(d);
    let func = rt.function(&key, || mla_source(d.c, d.r), "mla_decode_tc_bf16")?;
    let combine = rt.function(&key, || mla_source(d.c, d.r), "mla_decode_combine_bf16")?;
    let smem = tc_smem_bytes(d.c, d.r);
    rt.allow_smem(&func, smem)?;
    let (n_split, split_len) = split_plan(rt, d);
    let ws_o = Tensor::f_empty([d.b * d.h * n_split * d.c], (Kind::Float, d.device))?;
    let ws_ml = Tensor::f_empty([d.b * d.h * n_split * 2], (Kind::Float, d.device))?;
    let (ws_o_ptr, ws_ml_ptr) = (ws_o.data_ptr() as u64, ws_ml.data_ptr() as u64);
    let (n_split_i, split_len_i) = (n_split as i32, split_len as i32);
    let stream = rt.stream();
    let cfg = LaunchConfig {
        grid_dim: (
            n_split as u32,
            ((d.h + TC_HEADS - 1) / TC_HEADS) as u32,
            d.b as u32,
        ),
        block_dim: (TC_THREADS, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    let mut launch = stream.launch_builder(&func);
    launch
        .arg(&a.q_lat)
        .arg(&a.q_pe)
        .arg(&a.c_kv)
        .arg(&a.ckv_bstride)
        .arg(&a.k_pe)
        .arg(&a.kpe_bstride)
        .arg(&a.lens)
        .arg(&a.s)
        .arg(&a.h)
        .arg(&n_split_i)
        .arg(&split_len_i)
        .arg(&a.scale)
        .arg(&ws_o_ptr)
        .arg(&ws_ml_ptr);
    // SAFETY: the argument list matches `mla_decode_tc_bf16`; the inputs passed
    // `tensor_core_ok` (dtype, widths, 16-byte rows) and the workspaces hold
    // B·H·n_split·(c | 2) floats; all stay alive until the launches are enqueued.
    unsafe { launch.launch(cfg) }?;
    let cfg = LaunchConfig {
        grid_dim: ((d.b * d.h) as u32, 1, 1),
        block_dim: (COMBINE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut launch = stream.launch_builder(&combine);
    launch
        .arg(&ws_o_ptr)
        .arg(&ws_ml_ptr)
        .arg(&n_split_i)
        .arg(&a.out);
    // SAFETY: matches `mla_decode_combine_bf16`; `out` is a contiguous bf16 [B, H, c] and
    // n_split <= COMBINE_MAX_SPLIT.
    unsafe { launch.launch(cfg) }?;
    Ok(())
}
