//! MoE token dispatch and combine around grouped GEMM: the plan (ATen ops, any device), the
//! data movement as custom kernels (`moe_dispatch.cu`) and ATen references for both.
//!
//! Shape legend: `t` tokens, `k` experts per token, `r = t·k` routed rows, `e` experts, `p`
//! rows of the expert-sorted buffer (each expert's group padded to a multiple of `align`),
//! `d` width.
//!
//! Routed row `r = token·k + j` (the `j`-th expert of `token`) goes to slot `slot[token, j]`.
//! Within an expert, rows keep their routed order (a stable sort), so the plan is
//! deterministic. Padding slots read no token (`src = −1`) and are zero, so grouped GEMM
//! computes zeros there; combine never reads them.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use tch::{Device, Kind, Tensor};

use super::runtime::{cuda_ordinal, device_runtime, moe_source};
use super::CudaError;

const DISPATCH_THREADS: u32 = 128;
const COMBINE_THREADS: u32 = 128;
const MODULE: &str = "moe_dispatch";

/// Where every routed row goes in the expert-sorted buffer.
#[derive(Debug)]
pub struct DispatchPlan {
    /// Slot of each routed row `[T, k]`, int32.
    pub slot_tk: Tensor,
    /// Token read by each slot `[P]`, int32, −1 for padding.
    pub src_p: Tensor,
    /// Cumulative padded group ends `[E]`, int32: the `offs` of `_grouped_mm`.
    pub offs_e: Tensor,
    /// Routed rows per expert `[E]`, int64 (before padding).
    pub counts_e: Tensor,
    /// Rows of the buffer, `P = offs_e[E − 1]`.
    pub rows: i64,
    /// Group alignment in rows.
    pub align: i64,
    tokens: i64,
    top_k: i64,
}

impl DispatchPlan {
    /// Rows per group alignment for `kind`: 16 bytes of rows (8 for bf16, 4 for fp32), what
    /// grouped GEMM's backward needs of the offsets (they become the reduction dimension).
    pub fn align_for(kind: Kind) -> i64 {
        (16 / kind.elt_size_in_bytes() as i64).max(1)
    }

    /// Plans the dispatch of `idx [T, k]` (int64 or int32 expert ids in `0..n_experts`) with
    /// groups padded to `align` rows. ATen ops on `idx`'s device; reads back one number
    /// (`P`) and the id range.
    pub fn new(idx_tk: &Tensor, n_experts: i64, align: i64) -> Result<Self, CudaError> {
        let bad = |msg: String| Err(CudaError::Input(format!("moe dispatch plan: {msg}")));
        let Ok((t, k)) = idx_tk.size2() else {
            return bad(format!("idx must be [T, k], got {:?}", idx_tk.size()));
        };
        if !matches!(idx_tk.kind(), Kind::Int64 | Kind::Int) {
            return bad(format!(
                "idx must be int64 or int32, got {:?}",
                idx_tk.kind()
            ));
        }
        if n_experts <= 0 || align <= 0 {
            return bad(format!(
                "n_experts ({n_experts}) and align ({align}) must be positive"
            ));
        }
        let dev = idx_tk.device();
        let expert_r = idx_tk.reshape([-1]).to_kind(Kind::Int64);
        let r = t * k;
        if r > 0 {
            let lo = expert_r.f_min()?.int64_value(&[]);
            let hi = expert_r.f_max()?.int64_value(&[]);
            if lo < 0 || hi >= n_experts {
                return bad(format!(
                    "expert ids span {lo}..={hi}, outside 0..{n_experts}"
                ));
            }
        }
        let counts_e = expert_r.f_bincount(None::<Tensor>, n_experts)?;
        let padded_e = (&counts_e + (align - 1)).divide_scalar_mode(align, "floor") * align;
        let pad_end_e = padded_e.cumsum(0, Kind::Int64);
        let pad_start_e = &pad_end_e - &padded_e;
        let raw_start_e = counts_e.cumsum(0, Kind::Int64) - &counts_e;
        let order_r = expert_r.argsort_stable(true, 0, false);
        let sorted_e = expert_r.index_select(0, &order_r);
        let rank_r = Tensor::arange(r, (Kind::Int64, dev)) - raw_start_e.index_select(0, &sorted_e);
        let slot_sorted = pad_start_e.index_select(0, &sorted_e) + rank_r;
        let slot_r = Tensor::zeros([r], (Kind::Int64, dev)).scatter(0, &order_r, &slot_sorted);
        let rows = pad_end_e.get(n_experts - 1).int64_value(&[]);
        let token_r = Tensor::arange(r, (Kind::Int64, dev)).divide_scalar_mode(k.max(1), "floor");
        let src_p = Tensor::full([rows], -1, (Kind::Int64, dev)).scatter(0, &slot_r, &token_r);
        Ok(DispatchPlan {
            slot_tk: slot_r.view([t, k]).to_kind(Kind::Int),
            src_p: src_p.to_kind(Kind::Int),
            offs_e: pad_end_e.to_kind(Kind::Int),
            counts_e,
            rows,
            align,
            tokens: t,
            top_k: k,
        })
    }

    /// Tokens planned for.
    pub fn tokens(&self) -> i64 {
        self.tokens
    }

    /// Experts per token.
    pub fn top_k(&self) -> i64 {
        self.top_k
    }

    fn check_x(&self, x_td: &Tensor, what: &str) -> Result<(i64, Kind, Device), CudaError> {
        let Ok((t, d)) = x_td.size2() else {
            return Err(CudaError::Input(format!(
                "moe dispatch: {what} must be [T, d], got {:?}",
                x_td.size()
            )));
        };
        if t != self.tokens {
            return Err(CudaError::Input(format!(
                "moe dispatch: {what} has {t} tokens, the plan {}",
                self.tokens
            )));
        }
        check_float(x_td, what)?;
        same_device(x_td.device(), self.src_p.device(), what)?;
        Ok((d, x_td.kind(), x_td.device()))
    }

    fn check_y(&self, y_pd: &Tensor) -> Result<(i64, Kind, Device), CudaError> {
        let Ok((p, d)) = y_pd.size2() else {
            return Err(CudaError::Input(format!(
                "moe combine: y must be [P, d], got {:?}",
                y_pd.size()
            )));
        };
        if p != self.rows {
            return Err(CudaError::Input(format!(
                "moe combine: y has {p} rows, the plan {}",
                self.rows
            )));
        }
        check_float(y_pd, "y")?;
        same_device(y_pd.device(), self.src_p.device(), "y")?;
        Ok((d, y_pd.kind(), y_pd.device()))
    }

    fn check_w(&self, w_tk: &Tensor, device: Device) -> Result<(), CudaError> {
        if w_tk.size() != [self.tokens, self.top_k] {
            return Err(CudaError::Input(format!(
                "moe combine: weights must be [T, k] = [{}, {}], got {:?}",
                self.tokens,
                self.top_k,
                w_tk.size()
            )));
        }
        if !w_tk.is_floating_point() {
            return Err(CudaError::Input(format!(
                "moe combine: weights must be floating point, got {:?}",
                w_tk.kind()
            )));
        }
        same_device(w_tk.device(), device, "weights")
    }

    /// Reference dispatch: `x[src]` with zero padding rows (ATen, any device).
    pub fn dispatch_reference(&self, x_td: &Tensor) -> Result<Tensor, CudaError> {
        let (d, kind, dev) = self.check_x(x_td, "x")?;
        if self.tokens == 0 {
            return Ok(Tensor::zeros([self.rows, d], (kind, dev)));
        }
        let src = self.src_p.to_kind(Kind::Int64);
        let rows = x_td.f_index_select(0, &src.clamp_min(0))?;
        Ok(rows.masked_fill(&src.lt(0).unsqueeze(1), 0.0))
    }

    /// Reference combine: `Σ_j w[t, j] · y[slot[t, j]]` accumulated in fp32, returned in
    /// `y`'s dtype (ATen, any device).
    pub fn combine_reference(&self, y_pd: &Tensor, w_tk: &Tensor) -> Result<Tensor, CudaError> {
        let (d, kind, dev) = self.check_y(y_pd)?;
        self.check_w(w_tk, dev)?;
        let work = if kind == Kind::Double {
            Kind::Double
        } else {
            Kind::Float
        };
        let rows = y_pd
            .f_index_select(0, &self.slot_tk.reshape([-1]).to_kind(Kind::Int64))?
            .view([self.tokens, self.top_k, d])
            .to_kind(work);
        let out = (rows * w_tk.to_kind(work).unsqueeze(-1)).sum_dim_intlist(1, false, work);
        Ok(out.to_kind(kind))
    }

    /// Dispatch kernel into a new `[P, d]` tensor.
    pub fn dispatch(&self, x_td: &Tensor) -> Result<Tensor, CudaError> {
        let (d, kind, dev) = self.check_x(x_td, "x")?;
        let out = Tensor::f_empty([self.rows, d], (kind, dev))?;
        self.dispatch_into(&out, x_td)?;
        Ok(out)
    }

    /// Dispatch kernel into `out` (`[P, d]`, contiguous, `x`'s dtype and device).
    pub fn dispatch_into(&self, out_pd: &Tensor, x_td: &Tensor) -> Result<(), CudaError> {
        let (d, kind, dev) = self.check_x(x_td, "x")?;
        check_out(out_pd, &[self.rows, d], kind, dev, "moe dispatch")?;
        let ordinal = cuda_ordinal(dev, "moe dispatch input x")?;
        let rt = device_runtime(ordinal)?;
        if self.rows == 0 || d == 0 {
            return Ok(());
        }
        // Rows of x must be contiguous; the token stride may be anything.
        let x = if x_td.stride()[1] == 1 {
            x_td.shallow_clone()
        } else {
            x_td.contiguous()
        };
        let elt = kind.elt_size_in_bytes() as i64;
        let row_bytes = d * elt;
        let stride_bytes = x.stride()[0] * elt;
        let (x_ptr, out_ptr) = (x.data_ptr() as u64, out_pd.data_ptr() as u64);
        let aligned = |w: i64| {
            row_bytes % w == 0
                && stride_bytes % w == 0
                && x_ptr % w as u64 == 0
                && out_ptr % w as u64 == 0
        };
        let word = if aligned(16) {
            16
        } else if aligned(4) {
            4
        } else {
            2
        };
        let name = match word {
            16 => "moe_dispatch_w16",
            4 => "moe_dispatch_w4",
            _ => "moe_dispatch_w2",
        };
        let func = rt.function(MODULE, moe_source, name)?;
        let (stride_words, row_words) = (stride_bytes / word, (row_bytes / word) as i32);
        let src_ptr = self.src_p.data_ptr() as u64;
        let cfg = LaunchConfig {
            grid_dim: (self.rows as u32, 1, 1),
            block_dim: (DISPATCH_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let stream = rt.stream();
        let mut launch = stream.launch_builder(&func);
        launch
            .arg(&x_ptr)
            .arg(&stride_words)
            .arg(&src_ptr)
            .arg(&out_ptr)
            .arg(&row_words);
        // SAFETY: matches `moe_dispatch_w*`; src holds P token ids in 0..T (or −1) from the
        // plan, x has T rows of `row_words` words at `stride_words`, out is [P, d]
        // contiguous, and the word size divides both rows and pointers.
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }

    /// Combine kernel into a new `[T, d]` tensor (`y`'s dtype).
    pub fn combine(&self, y_pd: &Tensor, w_tk: &Tensor) -> Result<Tensor, CudaError> {
        let (d, kind, dev) = self.check_y(y_pd)?;
        let out = Tensor::f_empty([self.tokens, d], (kind, dev))?;
        self.combine_into(&out, y_pd, w_tk)?;
        Ok(out)
    }

    /// Combine kernel into `out` (`[T, d]`, contiguous, `y`'s dtype and device).
    pub fn combine_into(
        &self,
        out_td: &Tensor,
        y_pd: &Tensor,
        w_tk: &Tensor,
    ) -> Result<(), CudaError> {
        let (d, kind, dev) = self.check_y(y_pd)?;
        self.check_w(w_tk, dev)?;
        check_out(out_td, &[self.tokens, d], kind, dev, "moe combine")?;
        if kind == Kind::Double {
            return Err(CudaError::Input(
                "moe combine: the kernel takes float32 or bfloat16, got float64".into(),
            ));
        }
        let ordinal = cuda_ordinal(dev, "moe combine input y")?;
        let rt = device_runtime(ordinal)?;
        if self.tokens == 0 || d == 0 {
            return Ok(());
        }
        let y = y_pd.contiguous();
        let w = w_tk.to_kind(Kind::Float).contiguous();
        let (y_ptr, out_ptr) = (y.data_ptr() as u64, out_td.data_ptr() as u64);
        let (slot_ptr, w_ptr) = (self.slot_tk.data_ptr() as u64, w.data_ptr() as u64);
        let k = self.top_k as i32;
        let vec8 = kind == Kind::BFloat16 && d % 8 == 0 && y_ptr % 16 == 0 && out_ptr % 16 == 0;
        let (name, width) = match (kind, vec8) {
            (Kind::BFloat16, true) => ("moe_combine_bf16x8", d / 8),
            (Kind::BFloat16, false) => ("moe_combine_bf16", d),
            _ => ("moe_combine_f32", d),
        };
        let func = rt.function(MODULE, moe_source, name)?;
        let width_i = width as i32;
        let cfg = LaunchConfig {
            grid_dim: (
                self.tokens as u32,
                ((width + COMBINE_THREADS as i64 - 1) / COMBINE_THREADS as i64) as u32,
                1,
            ),
            block_dim: (COMBINE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let stream = rt.stream();
        let mut launch = stream.launch_builder(&func);
        launch
            .arg(&y_ptr)
            .arg(&slot_ptr)
            .arg(&w_ptr)
            .arg(&out_ptr)
            .arg(&k)
            .arg(&width_i);
        // SAFETY: matches `moe_combine_*`; slot holds T·k slots in 0..P from the plan, y is
        // [P, d] and out [T, d], both contiguous (16-byte aligned for the x8 variant), w is
        // fp32 [T, k].
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }
}

fn check_float(t: &Tensor, what: &str) -> Result<(), CudaError> {
    if matches!(t.kind(), Kind::Float | Kind::BFloat16 | Kind::Double) {
        Ok(())
    } else {
        Err(CudaError::Input(format!(
            "moe: {what} must be float32 or bfloat16, got {:?}",
            t.kind()
        )))
    }
}

fn same_device(a: Device, plan: Device, what: &str) -> Result<(), CudaError> {
    if a == plan {
        Ok(())
    } else {
        Err(CudaError::Input(format!(
            "moe: {what} is on {a:?} but the plan is on {plan:?}"
        )))
    }
}

fn check_out(
    out: &Tensor,
    size: &[i64],
    kind: Kind,
    dev: Device,
    what: &str,
) -> Result<(), CudaError> {
    if out.size() != size || out.kind() != kind || out.device() != dev || !out.is_contiguous() {
        return Err(CudaError::Input(format!(
            "{what}: out must be a contiguous {kind:?} {size:?} on {dev:?}, got {:?} {:?} on {:?}",
            out.kind(),
            out.size(),
            out.device()
        )));
    }
    Ok(())
}
