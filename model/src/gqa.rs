//! Grouped-query attention (GQA) with per-head q/k RMSNorm, as Qwen3 and Qwen3-MoE run it.
//!
//! Shape legend: `b` batch, `t` new tokens, `s` cached keys, `h` query heads, `g` key/value
//! heads (`h` is a multiple of `g`; query head `i` reads key/value head `i / (h / g)`), `e`
//! head width, `d` hidden.
//!
//! Per token the layer projects `h` query heads and `g` key and value heads, RMS-normalises
//! each query and key head over its width (`q_norm`, `k_norm`; before RoPE), rotates queries and
//! keys over the whole head, and attends with scale `1/√e`. The cache holds every rotated key
//! head and every value head, `[B, S, g·e]` each. Two paths compute the same function (tested):
//! - [`Gqa::forward_full`] (training): causal `scaled_dot_product_attention` over the tokens of
//!   the forward;
//! - [`Gqa::attend_cached`] (decoding): the new tokens' queries against cached keys, with an
//!   additive mask.

use tch::{nn, Tensor};

use super::causal::{causal_sdpa, DocSpans};
use super::config::{Attention, ModelConfig};
use super::layers::{Linear, RmsNorm};
use super::precision::work_kind;
use super::rope::Rope;

/// What one forward of a GQA layer produces before attention: rotated queries
/// `[B, T, H, e]`, rotated keys and values `[B, T, g·e]` (the cache's layout).
#[derive(Debug)]
pub struct GqaProjection {
    /// Queries, normalised and rotated.
    pub q_bthe: Tensor,
    /// Keys, normalised and rotated, heads flattened.
    pub k_btw: Tensor,
    /// Values, heads flattened.
    pub v_btw: Tensor,
}

/// One grouped-query attention layer.
#[derive(Debug)]
pub struct Gqa {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    /// `q_norm`, `k_norm` over the head width; `None` without `qk_norm`.
    qk_norm: Option<(RmsNorm, RmsNorm)>,
    n_heads: i64,
    n_kv_heads: i64,
    head_dim: i64,
}

impl Gqa {
    /// Creates the layer's projections under `p` (`q_proj`, `k_proj`, `v_proj`, `o_proj`,
    /// `q_norm`, `k_norm`: Hugging Face's names). Panics unless `cfg.attention` is GQA.
    pub fn new(p: nn::Path, cfg: &ModelConfig) -> Self {
        let Attention::Gqa {
            num_key_value_heads: g,
            head_dim: e,
            qk_norm,
        } = cfg.attention
        else {
            panic!(
                "Gqa::new on a config whose attention is {:?}",
                cfg.attention
            );
        };
        let (d, h, std) = (
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.initializer_range,
        );
        let o_std = std / (2.0 * cfg.num_hidden_layers as f64).sqrt();
        Gqa {
            q_proj: Linear::new(&p / "q_proj", d, h * e, std),
            k_proj: Linear::new(&p / "k_proj", d, g * e, std),
            v_proj: Linear::new(&p / "v_proj", d, g * e, std),
            o_proj: Linear::new(&p / "o_proj", h * e, d, o_std),
            qk_norm: qk_norm.then(|| {
                (
                    RmsNorm::new(&p / "q_norm", e, cfg.rms_norm_eps),
                    RmsNorm::new(&p / "k_norm", e, cfg.rms_norm_eps),
                )
            }),
            n_heads: h,
            n_kv_heads: g,
            head_dim: e,
        }
    }

    /// Projects `x [B, T, d]` at positions `pos_bt` into rotated queries, keys and values.
    pub fn project(&self, x_btd: &Tensor, pos_bt: &Tensor, rope: &Rope) -> GqaProjection {
        let (b, t, _) = x_btd.size3().expect("x is [B, T, d]");
        let (h, g, e) = (self.n_heads, self.n_kv_heads, self.head_dim);
        let q_bthe = self.q_proj.forward(x_btd).view([b, t, h, e]);
        let k_btge = self.k_proj.forward(x_btd).view([b, t, g, e]);
        let (q_bthe, k_btge) = match &self.qk_norm {
            Some((q_norm, k_norm)) => (q_norm.forward(&q_bthe), k_norm.forward(&k_btge)),
            None => (q_bthe, k_btge),
        };
        GqaProjection {
            q_bthe: rope.apply(&q_bthe, pos_bt),
            k_btw: rope.apply(&k_btge, pos_bt).reshape([b, t, g * e]),
            v_btw: self.v_proj.forward(x_btd),
        }
    }

    /// `[B, S, g·e]` keys or values as `[B, H, S, e]`: each key/value head repeated for the
    /// `h / g` query heads that read it (transformers' `repeat_kv`).
    fn heads_bhse(&self, x_bsw: &Tensor) -> Tensor {
        let (b, s, _) = x_bsw.size3().expect("keys/values are [B, S, g·e]");
        let (h, g, e) = (self.n_heads, self.n_kv_heads, self.head_dim);
        x_bsw
            .view([b, s, g, 1, e])
            .expand([b, s, g, h / g, e], false)
            .reshape([b, s, h, e])
            .transpose(1, 2)
    }

    /// The output projection of attention outputs `o [B, H, T, e]`.
    fn project_out(&self, o_bhte: &Tensor) -> Tensor {
        let (b, _, t, _) = o_bhte.size4().expect("attention output is [B, H, T, e]");
        self.o_proj.forward(
            &o_bhte
                .transpose(1, 2)
                .reshape([b, t, self.n_heads * self.head_dim]),
        )
    }

    fn scale(&self) -> f64 {
        1.0 / (self.head_dim as f64).sqrt()
    }

    /// Training path: causal attention over the tokens of this forward; with `docs` (packed
    /// rows) causal within each document ([`causal_sdpa`]).
    pub fn forward_full(
        &self,
        x_btd: &Tensor,
        pos_bt: &Tensor,
        rope: &Rope,
        docs: Option<&DocSpans>,
    ) -> Tensor {
        let p = self.project(x_btd, pos_bt, rope);
        let o_bhte = causal_sdpa(
            &p.q_bthe.transpose(1, 2),
            &self.heads_bhse(&p.k_btw),
            &self.heads_bhse(&p.v_btw),
            self.scale(),
            docs,
        );
        self.project_out(&o_bhte)
    }

    /// Decoding path: the new tokens' queries `q [B, T, H, e]` attend to cached keys and
    /// values `[B, S, g·e]` (the new tokens' own already written), where `bias_bts` is 0 for
    /// visible keys and −inf otherwise. Each key/value head serves its `r = H / g` query heads
    /// in one batched matmul over the cache as it lies (no per-query-head copy of the cache).
    /// Scores and softmax in fp32.
    pub fn attend_cached(
        &self,
        q_bthe: &Tensor,
        k_bsw: &Tensor,
        v_bsw: &Tensor,
        bias_bts: &Tensor,
    ) -> Tensor {
        let (b, t, h, e) = q_bthe.size4().expect("queries are [B, T, H, e]");
        let s = k_bsw.size()[1];
        let g = self.n_kv_heads;
        let r = h / g;
        let kind = q_bthe.kind();
        let work = work_kind(kind);
        // Query head `j·r + i` reads key/value head `j`: [B, g, r·T, e].
        let q_bgqe = q_bthe
            .view([b, t, g, r, e])
            .permute([0, 2, 3, 1, 4])
            .reshape([b, g, r * t, e])
            .to_kind(work);
        let k_bges = k_bsw.view([b, s, g, e]).permute([0, 2, 3, 1]).to_kind(work);
        let v_bgse = v_bsw.view([b, s, g, e]).permute([0, 2, 1, 3]);
        let scores_bgrts = q_bgqe.matmul(&k_bges).view([b, g, r, t, s]) * self.scale()
            + bias_bts.view([b, 1, 1, t, s]).to_kind(work);
        let attn_bgqs = scores_bgrts
            .softmax(-1, work)
            .to_kind(kind)
            .view([b, g, r * t, s]);
        // [B, g, r·T, e] → [B, H, T, e] (head `j·r + i`).
        let o_bhte = attn_bgqs.matmul(&v_bgse).view([b, h, t, e]);
        self.project_out(&o_bhte)
    }
}
