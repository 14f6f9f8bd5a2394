//! Cross-layer attention residual sharing: `cross_layer_residual(state, attn_out)`.
//!
//! Layer `l > 0` mixes the attention outputs of layers `0..l` back into its own:
//!
//! ```text
//! w_j   = softmax_j( query_l · rmsnorm(a_j) )          (depth-wise attention, AttnRes-style)
//! out_l = a_l + scale_l ⊙ Σ_j w_j · a_j
//! ```
//!
//! `query_l` and `scale_l` are `[d]` and zero-initialised, so at initialisation the layer is a
//! plain transformer layer and the mix (a uniform average) is switched in only as far as
//! training asks for it. Keys are normalised and the softmax runs in fp32, as in torchtitan's
//! `kimi_k3/attn_res.py`. The mix is per token, so it works unchanged on decode steps.

use tch::{nn, Kind, Tensor};

/// Attention outputs `[B, T, d]` of the layers run so far, in order.
#[derive(Debug, Default)]
pub struct CrossLayerState {
    outs: Vec<Tensor>,
}

impl CrossLayerState {
    /// Empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one layer's attention output.
    pub fn push(&mut self, attn_out_btd: &Tensor) {
        self.outs.push(attn_out_btd.shallow_clone());
    }

    /// Number of layers recorded.
    pub fn len(&self) -> usize {
        self.outs.len()
    }

    /// True before the first layer.
    pub fn is_empty(&self) -> bool {
        self.outs.is_empty()
    }
}

/// The learned, zero-initialised residual of one layer.
#[derive(Debug)]
pub struct CrossLayerResidual {
    query_d: Tensor,
    scale_d: Tensor,
    eps: f64,
}

impl CrossLayerResidual {
    /// Creates `query` and `scale`, both zero.
    pub fn new(p: nn::Path, d: i64, eps: f64) -> Self {
        CrossLayerResidual {
            query_d: p.var("query", &[d], nn::Init::Const(0.0)),
            scale_d: p.var("scale", &[d], nn::Init::Const(0.0)),
            eps,
        }
    }

    /// `attn_out + scale ⊙ mix(state)`; returns `attn_out` unchanged when `state` is empty.
    pub fn forward(&self, state: &CrossLayerState, attn_out_btd: &Tensor) -> Tensor {
        if state.is_empty() {
            return attn_out_btd.shallow_clone();
        }
        let kind = attn_out_btd.kind();
        let work = if kind == Kind::Double {
            Kind::Double
        } else {
            Kind::Float
        };
        let hist_nbtd = Tensor::stack(&state.outs, 0).to_kind(work);
        let keys = &hist_nbtd * (hist_nbtd.square().mean_dim(-1, true, None) + self.eps).rsqrt();
        let logits_nbt = (keys * self.query_d.to_kind(work)).sum_dim_intlist(-1, false, None);
        let w_nbt1 = logits_nbt.softmax(0, work).unsqueeze(-1);
        let mix_btd = (w_nbt1 * hist_nbtd)
            .sum_dim_intlist(0, false, None)
            .to_kind(kind);
        attn_out_btd + &self.scale_d * mix_btd
    }
}
