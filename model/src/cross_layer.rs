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

use tch::{nn, Tensor};

use super::precision::work_kind;

/// Attention outputs `[B, T, d]` of the layers run so far, in order, and their normalised
/// keys (computed once, when a later layer first needs them, not once per later layer).
#[derive(Debug, Default)]
pub struct CrossLayerState {
    outs: Vec<Tensor>,
    /// `rmsnorm(out_j)` in the working precision, for `j < keys.len()`.
    keys: Vec<Tensor>,
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

    /// The last layer's attention output.
    pub fn last(&self) -> Option<Tensor> {
        self.outs.last().map(Tensor::shallow_clone)
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
    /// Normalises the outputs in `state` that have no key yet (all layers share one eps).
    pub fn forward(&self, state: &mut CrossLayerState, attn_out_btd: &Tensor) -> Tensor {
        if state.is_empty() {
            return attn_out_btd.shallow_clone();
        }
        let kind = attn_out_btd.kind();
        let work = work_kind(kind);
        let d = self.query_d.size()[0];
        for j in state.keys.len()..state.outs.len() {
            let key = state.outs[j]
                .to_kind(work)
                .rms_norm([d], None::<Tensor>, self.eps);
            state.keys.push(key);
        }
        // logits_j = key_j · query  → [n, B, T]; softmax over the layers j in fp32.
        let query_d = self.query_d.to_kind(work);
        let logits: Vec<Tensor> = state.keys.iter().map(|k| k.matmul(&query_d)).collect();
        let w_nbt = Tensor::stack(&logits, 0).softmax(0, work);
        let mut mix_btd: Option<Tensor> = None;
        for (j, out) in state.outs.iter().enumerate() {
            let term = w_nbt.get(j as i64).unsqueeze(-1) * out.to_kind(work);
            mix_btd = Some(match mix_btd {
                None => term,
                Some(m) => m + term,
            });
        }
        let mix_btd = mix_btd.expect("state is not empty").to_kind(kind);
        attn_out_btd + &self.scale_d * mix_btd
    }
}
