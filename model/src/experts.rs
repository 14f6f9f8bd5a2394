//! Routed experts: dropless dispatch by sorting rows per expert and one grouped GEMM per
//! projection, with a per-expert loop as the reference.
//!
//! Shape legend: `t` tokens, `k` experts per token, `r = t·k` routed rows, `e` experts,
//! `d` hidden, `f` expert width.
//!
//! Grouped path: `argsort_stable` the `[T·k]` expert ids, gather the rows, `bincount` →
//! `cumsum` gives int32 offsets, then `_grouped_mm(x_rd, w_edf, offs)` for gate and up, the
//! activation, `_grouped_mm(a_rf, w_efd, offs)` for down, scale by the combine weight and
//! `index_add` back to tokens. No capacity factor: every routed row is computed.
//! `_grouped_mm` needs fp32/bf16/fp16 and 16-byte aligned rows (d, f multiples of 8: checked
//! by `ModelConfig::validate`); its backward needs a materialised upstream gradient.

use tch::{nn, Kind, Tensor};

use super::config::{ExpertAct, ExpertDispatch, ModelConfig};
use super::cuda::{CudaError, DispatchPlan};
use super::layers::normal_var;

/// Who moves the rows in [`Experts::forward_dispatched`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Movement {
    /// The custom CUDA dispatch and combine kernels (CUDA tensors only, no autograd).
    Kernels,
    /// Their ATen references (any device; autograd flows through them).
    Aten,
}

/// All routed experts of one layer, stored stacked.
#[derive(Debug)]
pub struct Experts {
    w_gate_edf: Tensor,
    w_up_edf: Tensor,
    w_down_efd: Tensor,
    act: ExpertAct,
    gate_scale: f64,
    dispatch: ExpertDispatch,
}

/// Normal(0, std) truncated at ±2σ, as torchtitan's `trunc_normal_`.
fn trunc_normal(p: &nn::Path, name: &str, dims: &[i64], std: f64) -> Tensor {
    let mut w = normal_var(p, name, dims, std);
    tch::no_grad(|| {
        let _ = w.clamp_(-2.0 * std, 2.0 * std);
    });
    w
}

impl Experts {
    /// `E` experts of shape `d → f → d`. The down projection's std is scaled with depth.
    pub fn new(p: nn::Path, cfg: &ModelConfig) -> Self {
        let (e, d, f) = (
            cfg.n_routed_experts,
            cfg.hidden_size,
            cfg.moe_intermediate_size,
        );
        let std = cfg.expert_init_std;
        let down_std = std / (2.0 * cfg.num_hidden_layers as f64).sqrt();
        Experts {
            w_gate_edf: trunc_normal(&p, "w_gate", &[e, d, f], std),
            w_up_edf: trunc_normal(&p, "w_up", &[e, d, f], std),
            w_down_efd: trunc_normal(&p, "w_down", &[e, f, d], down_std),
            act: cfg.expert_act,
            gate_scale: cfg.expert_gate_scale,
            dispatch: cfg.expert_dispatch,
        }
    }

    /// The GLU activation on gate `g` and up `u`.
    fn activate(&self, g: &Tensor, u: &Tensor) -> Tensor {
        let g = g * self.gate_scale;
        match self.act {
            ExpertAct::Swiglu => g.silu() * u,
            ExpertAct::SoftClipGlu { beta, beta_lin } => {
                (&g / beta).tanh() * beta * g.sigmoid() * ((u / beta_lin).tanh() * beta_lin)
            }
        }
    }

    /// Combined expert output `[T, d]` for tokens `x [T, d]` routed to `idx [T, k]` with
    /// weights `w [T, k]`.
    pub fn forward(&self, x_td: &Tensor, idx_tk: &Tensor, w_tk: &Tensor) -> Tensor {
        match self.dispatch {
            ExpertDispatch::GroupedMm => self.forward_grouped(x_td, idx_tk, w_tk),
            ExpertDispatch::Loop => self.forward_loop(x_td, idx_tk, w_tk),
        }
    }

    /// Fast path: one `_grouped_mm` per projection.
    pub fn forward_grouped(&self, x_td: &Tensor, idx_tk: &Tensor, w_tk: &Tensor) -> Tensor {
        let k = idx_tk.size()[1];
        let n_experts = self.w_gate_edf.size()[0];
        let expert_r = idx_tk.reshape([-1]);
        let order_r = expert_r.argsort_stable(true, 0, false);
        let token_r = order_r.divide_scalar_mode(k, "floor");
        let counts_e = expert_r.bincount(None::<Tensor>, n_experts);
        let offs_e = counts_e.cumsum(0, Kind::Int);
        let x_rd = x_td.index_select(0, &token_r);
        let none = None::<Tensor>;
        let g_rf = x_rd.internal_grouped_mm(&self.w_gate_edf, Some(&offs_e), none.as_ref(), None);
        let u_rf = x_rd.internal_grouped_mm(&self.w_up_edf, Some(&offs_e), none.as_ref(), None);
        let a_rf = self.activate(&g_rf, &u_rf);
        let y_rd = a_rf.internal_grouped_mm(&self.w_down_efd, Some(&offs_e), none.as_ref(), None);
        let wt_r1 = w_tk.reshape([-1]).index_select(0, &order_r).unsqueeze(1);
        x_td.zeros_like().index_add(0, &token_r, &(y_rd * wt_r1))
    }

    /// Grouped GEMM between an explicit dispatch and combine ([`DispatchPlan`]): rows sorted
    /// by expert into groups padded to 16 bytes of rows (zero rows, so grouped GEMM's
    /// backward gets aligned offsets), combined by gathering each token's `k` rows and
    /// summing them weighted in fp32. `Movement::Kernels` is the inference path on CUDA.
    pub fn forward_dispatched(
        &self,
        x_td: &Tensor,
        idx_tk: &Tensor,
        w_tk: &Tensor,
        movement: Movement,
    ) -> Result<Tensor, CudaError> {
        let n_experts = self.w_gate_edf.size()[0];
        let plan = DispatchPlan::new(idx_tk, n_experts, DispatchPlan::align_for(x_td.kind()))?;
        let x_pd = match movement {
            Movement::Kernels => plan.dispatch(x_td)?,
            Movement::Aten => plan.dispatch_reference(x_td)?,
        };
        let offs = Some(&plan.offs_e);
        let none = None::<&Tensor>;
        let g_pf = x_pd.f_internal_grouped_mm(&self.w_gate_edf, offs, none, None)?;
        let u_pf = x_pd.f_internal_grouped_mm(&self.w_up_edf, offs, none, None)?;
        let a_pf = self.activate(&g_pf, &u_pf);
        let y_pd = a_pf.f_internal_grouped_mm(&self.w_down_efd, offs, none, None)?;
        match movement {
            Movement::Kernels => plan.combine(&y_pd, w_tk),
            Movement::Aten => plan.combine_reference(&y_pd, w_tk),
        }
    }

    /// Routed experts `E`.
    pub fn n_experts(&self) -> i64 {
        self.w_gate_edf.size()[0]
    }

    /// Reference path, for tests, f64 and CPU: the grouped path's sort by expert, then a loop
    /// of plain matmuls over the experts that got rows (each on its slice of the sorted rows,
    /// with that expert's weights as views from `unbind`, whose backward writes each weight's
    /// gradient once), and one weighted `index_add` back to tokens.
    pub fn forward_loop(&self, x_td: &Tensor, idx_tk: &Tensor, w_tk: &Tensor) -> Tensor {
        let k = idx_tk.size()[1];
        let n_experts = self.w_gate_edf.size()[0];
        let expert_r = idx_tk.reshape([-1]);
        let order_r = expert_r.argsort_stable(true, 0, false);
        let token_r = order_r.divide_scalar_mode(k, "floor");
        let counts_e = Vec::<i64>::try_from(expert_r.bincount(None::<Tensor>, n_experts))
            .expect("expert counts are int64");
        let x_rd = x_td.index_select(0, &token_r);
        let (w_gate, w_up, w_down) = (
            self.w_gate_edf.unbind(0),
            self.w_up_edf.unbind(0),
            self.w_down_efd.unbind(0),
        );
        let mut ys = Vec::new();
        let mut start = 0;
        for (e, &n) in counts_e.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let x_nd = x_rd.narrow(0, start, n);
            let a_nf = self.activate(&x_nd.matmul(&w_gate[e]), &x_nd.matmul(&w_up[e]));
            ys.push(a_nf.matmul(&w_down[e]));
            start += n;
        }
        if ys.is_empty() {
            return x_td.zeros_like();
        }
        let wt_r1 = w_tk.reshape([-1]).index_select(0, &order_r).unsqueeze(1);
        x_td.zeros_like()
            .index_add(0, &token_r, &(Tensor::cat(&ys, 0) * wt_r1))
    }

    /// Zeroes every expert weight (for the "initialisation reaches the experts" test).
    pub fn zero_(&mut self) {
        tch::no_grad(|| {
            let _ = self.w_gate_edf.zero_();
            let _ = self.w_up_edf.zero_();
            let _ = self.w_down_efd.zero_();
        });
    }
}
