//! Multi-head latent attention (MLA) with a sigmoid output gate and optional CLA sharing.
//!
//! Shape legend: `b` batch, `t` new tokens, `s` cached keys, `h` heads, `n` nope dims,
//! `r` RoPE dims, `v` value dims, `c` latent rank (`kv_lora_rank`), `d` hidden.
//!
//! Per token, the layer computes a latent `c_kv [c]` (RMS-normalised) and one RoPE key
//! `k_pe [r]` shared by all heads; only these are cached (`c + r` elements per token per
//! latent-owning layer). Two paths compute the same function:
//! - [`Mla::forward_full`] (training): decompress the latent per head with `kv_b_proj` and run
//!   causal `scaled_dot_product_attention`.
//! - [`Mla::forward_absorbed`] (decoding): fold `W_uk` into the query and `W_uv` after the
//!   attention, so attention runs in latent space against the cache and the cache is never
//!   decompressed per head (DeepSeek-V3 `attn_impl="absorb"`).

use tch::{nn, Tensor};

use super::causal::{causal_sdpa, DocSpans};
use super::config::{AttnGate, ModelConfig};
use super::cuda::{CudaError, MlaDecode, MlaKernel};
use super::layers::{Linear, RmsNorm};
use super::mla_cpu;
use super::precision::work_kind;
use super::rope::Rope;

/// A layer's latent for some tokens: what the cache stores.
#[derive(Debug)]
pub struct Latent {
    /// Normalised KV latent `[B, T, c]`.
    pub c_kv_btc: Tensor,
    /// Rotated RoPE key `[B, T, r]`.
    pub k_pe_btr: Tensor,
}

/// A layer's input for some tokens: `x [B, T, d]` and, with a token shift, each token's
/// input `k` tokens back within its sequence, `x_prev[k - 1]` (zeros before a sequence start).
#[derive(Clone, Copy, Debug)]
pub struct LayerInput<'a> {
    /// The normalised layer input.
    pub x_btd: &'a Tensor,
    /// Earlier inputs, one per tap; empty without a shift.
    pub x_prev: &'a [Tensor],
}

/// The attention core of [`Mla::forward_absorbed_lens`] (decoding one token per row).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeCore {
    /// The custom CUDA kernel ([`MlaDecode::run`]); CUDA tensors only.
    Kernel(MlaKernel),
    /// ATen ops in the order of [`Mla::forward_absorbed`] ([`MlaDecode::reference`]); any
    /// device. Gives the same numbers as `forward_absorbed` (tested), so it checks the
    /// length-based masking the kernel uses.
    Reference,
    /// The fused CPU core ([`mla_cpu::decode`]): one pass per row over its visible slots,
    /// without BLAS repacking the cache for every row; fp32 CPU tensors (other dtypes or
    /// devices take [`DecodeCore::Reference`]). The default for models on the CPU.
    Cpu,
}

/// The cached rows one decode step attends to: the layer's latent cache `c_kv [B, S, c]`,
/// `k_pe [B, S, r]` and how many leading slots of each row are visible, `lens [B]`.
#[derive(Clone, Copy, Debug)]
pub struct CacheRows<'a> {
    /// Cached latent.
    pub c_kv_bsc: &'a Tensor,
    /// Cached RoPE key.
    pub k_pe_bsr: &'a Tensor,
    /// Visible slots per row (int32 or int64).
    pub lens_b: &'a Tensor,
}

/// The query projection: full or low-rank.
#[derive(Debug)]
enum QueryProj {
    Full(Linear),
    LowRank { a: Linear, norm: RmsNorm, b: Linear },
}

/// The output gate, chosen in `new`.
#[derive(Debug)]
enum Gate {
    None,
    /// `[H, d]`: one sigmoid per head.
    Headwise(Linear),
    /// `[H·v, d]`: one sigmoid per channel.
    Elementwise(Linear),
}

/// Where this layer's latent comes from.
#[derive(Debug)]
enum LatentSource {
    /// The layer compresses its own input.
    Own {
        kv_a_proj: Linear,
        kv_a_norm: RmsNorm,
        /// `latent_token_shift`: tap `k` (index `k - 1`) feeds the input `k` tokens back into
        /// the latent, zero-initialised; empty without the shift.
        shift_projs: Vec<Linear>,
    },
    /// CLA: the layer reuses the latent of the layer above it in its group.
    Shared,
}

/// One MLA layer.
#[derive(Debug)]
pub struct Mla {
    q: QueryProj,
    /// `query_token_shift`: the previous token's input into the query (into the low-rank
    /// query's first projection when there is one), zero-initialised.
    q_shift_proj: Option<Linear>,
    latent: LatentSource,
    kv_b_proj: Linear,
    o_proj: Linear,
    gate: Gate,
    n_heads: i64,
    nope: i64,
    rope: i64,
    v: i64,
    c: i64,
}

impl Mla {
    /// Creates layer `layer` (its CLA role comes from `cfg.owns_latent(layer)`).
    pub fn new(p: nn::Path, cfg: &ModelConfig, layer: i64) -> Self {
        let d = cfg.hidden_size;
        let h = cfg.num_attention_heads;
        let std = cfg.initializer_range;
        let qk = cfg.qk_head_dim();
        let q = match cfg.q_lora_rank {
            None => QueryProj::Full(Linear::new(&p / "q_proj", d, h * qk, std)),
            Some(r) => QueryProj::LowRank {
                a: Linear::new(&p / "q_a_proj", d, r, std),
                norm: RmsNorm::new(&p / "q_a_layernorm", r, cfg.latent_eps()),
                b: Linear::new(&p / "q_b_proj", r, h * qk, std),
            },
        };
        let q_shift_proj = cfg.query_token_shift.then(|| {
            let out = match cfg.q_lora_rank {
                None => h * qk,
                Some(r) => r,
            };
            Linear::zeros(&p / "q_shift_proj", d, out)
        });
        let latent = if cfg.owns_latent(layer) {
            LatentSource::Own {
                kv_a_proj: Linear::new(
                    &p / "kv_a_proj_with_mqa",
                    d,
                    cfg.kv_lora_rank + cfg.qk_rope_head_dim,
                    std,
                ),
                kv_a_norm: RmsNorm::new(&p / "kv_a_layernorm", cfg.kv_lora_rank, cfg.latent_eps()),
                shift_projs: (1..=cfg.shift_taps())
                    .map(|k| {
                        // Tap 1 keeps the name it had before taps existed (checkpoints load).
                        let name = match k {
                            1 => "kv_shift_proj".to_string(),
                            k => format!("kv_shift_proj_{k}"),
                        };
                        Linear::zeros(&p / name, d, cfg.kv_lora_rank + cfg.qk_rope_head_dim)
                    })
                    .collect(),
            }
        } else {
            LatentSource::Shared
        };
        let gate = match cfg.attn_gate {
            AttnGate::None => Gate::None,
            AttnGate::Headwise => Gate::Headwise(Linear::new(&p / "gate_proj", d, h, std)),
            AttnGate::Elementwise => {
                Gate::Elementwise(Linear::new(&p / "gate_proj", d, h * cfg.v_head_dim, std))
            }
        };
        // Output projection scaled down with depth (GPT-2 style) so deep stacks start stable.
        let o_std = std / (2.0 * cfg.num_hidden_layers as f64).sqrt();
        Mla {
            q,
            q_shift_proj,
            latent,
            kv_b_proj: Linear::new(
                &p / "kv_b_proj",
                cfg.kv_lora_rank,
                h * (cfg.qk_nope_head_dim + cfg.v_head_dim),
                std,
            ),
            o_proj: Linear::new(&p / "o_proj", h * cfg.v_head_dim, d, o_std),
            gate,
            n_heads: h,
            nope: cfg.qk_nope_head_dim,
            rope: cfg.qk_rope_head_dim,
            v: cfg.v_head_dim,
            c: cfg.kv_lora_rank,
        }
    }

    /// Whether this layer computes its own latent (false: CLA-shared).
    pub fn owns_latent(&self) -> bool {
        matches!(self.latent, LatentSource::Own { .. })
    }

    /// How many previous tokens' inputs this layer's latent also sees (`latent_token_shift`,
    /// `latent_shift_taps`); 0 for a layer without the shift or a CLA-shared one.
    pub fn shift_taps(&self) -> usize {
        match &self.latent {
            LatentSource::Own { shift_projs, .. } => shift_projs.len(),
            LatentSource::Shared => 0,
        }
    }

    /// Computes the latent of `x [B, T, d]` at positions `pos_bt`; `None` for a CLA-shared
    /// layer. `x_prev[k - 1]` is each token's input `k` tokens back within its sequence
    /// (zeros before a sequence start), one per tap when the layer shifts tokens into its
    /// latent (empty otherwise).
    pub fn latent(
        &self,
        x_btd: &Tensor,
        x_prev: &[Tensor],
        pos_bt: &Tensor,
        rope: &Rope,
    ) -> Option<Latent> {
        let LatentSource::Own {
            kv_a_proj,
            kv_a_norm,
            shift_projs,
        } = &self.latent
        else {
            return None;
        };
        let (b, t, _) = x_btd.size3().expect("x is [B, T, d]");
        let mut kv = kv_a_proj.forward(x_btd); // [B, T, c + r]
        for (proj, prev_btd) in shift_projs.iter().zip(x_prev) {
            kv += proj.forward(prev_btd);
        }
        let c_kv_btc = kv_a_norm.forward(&kv.narrow(2, 0, self.c));
        let k_pe_bt1r = kv.narrow(2, self.c, self.rope).view([b, t, 1, self.rope]);
        let k_pe_btr = rope.apply(&k_pe_bt1r, pos_bt).view([b, t, self.rope]);
        Some(Latent { c_kv_btc, k_pe_btr })
    }

    /// Query heads: `(q_nope [B, T, H, n], q_pe [B, T, H, r])`, RoPE applied. With
    /// `query_token_shift` the previous input `x_prev[0]` is added through `q_shift_proj`
    /// (validation makes every such layer also shift its latent, so `x_prev` is there).
    fn query(&self, input: LayerInput<'_>, pos_bt: &Tensor, rope: &Rope) -> (Tensor, Tensor) {
        let LayerInput { x_btd, x_prev } = input;
        let (b, t, _) = x_btd.size3().expect("x is [B, T, d]");
        let shift = |y: Tensor| match (&self.q_shift_proj, x_prev.first()) {
            (Some(proj), Some(prev_btd)) => y + proj.forward(prev_btd),
            _ => y,
        };
        let q = match &self.q {
            QueryProj::Full(l) => shift(l.forward(x_btd)),
            QueryProj::LowRank { a, norm, b } => b.forward(&norm.forward(&shift(a.forward(x_btd)))),
        };
        let q_bthk = q.view([b, t, self.n_heads, self.nope + self.rope]);
        let q_nope = q_bthk.narrow(3, 0, self.nope);
        let q_pe = rope.apply(&q_bthk.narrow(3, self.nope, self.rope), pos_bt);
        (q_nope, q_pe)
    }

    /// Applies the gate (from the layer input) and the output projection to `o [B, T, H, v]`.
    fn gate_and_project(&self, x_btd: &Tensor, o_bthv: &Tensor) -> Tensor {
        let (b, t, _) = x_btd.size3().expect("x is [B, T, d]");
        let gated = match &self.gate {
            Gate::None => o_bthv.shallow_clone(),
            Gate::Headwise(g) => o_bthv * g.forward(x_btd).sigmoid().view([b, t, self.n_heads, 1]),
            Gate::Elementwise(g) => {
                o_bthv
                    * g.forward(x_btd)
                        .sigmoid()
                        .view([b, t, self.n_heads, self.v])
            }
        };
        self.o_proj
            .forward(&gated.reshape([b, t, self.n_heads * self.v]))
    }

    /// Training path: causal attention over the whole sequence. `latent` covers the same
    /// tokens as `x` (its own or the CLA owner's). With `docs` (packed rows), attention is
    /// causal within each document ([`causal_sdpa`]).
    pub fn forward_full(
        &self,
        input: LayerInput<'_>,
        latent: &Latent,
        pos_bt: &Tensor,
        rope: &Rope,
        docs: Option<&DocSpans>,
    ) -> Tensor {
        let x_btd = input.x_btd;
        let (b, t, _) = x_btd.size3().expect("x is [B, T, d]");
        let (h, n, r, v) = (self.n_heads, self.nope, self.rope, self.v);
        let (q_nope, q_pe) = self.query(input, pos_bt, rope);
        let q_bhtk = Tensor::cat(&[q_nope, q_pe], 3).transpose(1, 2);
        let kv_bthk = self
            .kv_b_proj
            .forward(&latent.c_kv_btc)
            .view([b, t, h, n + v]);
        let k_pe_bthr = latent
            .k_pe_btr
            .view([b, t, 1, r])
            .expand([b, t, h, r], false);
        let k_bhtk = Tensor::cat(&[kv_bthk.narrow(3, 0, n), k_pe_bthr], 3).transpose(1, 2);
        let v_bhtv = kv_bthk.narrow(3, n, v).transpose(1, 2);
        // Pad V to the query/key width so SDPA can take its flash kernel (CPU and CUDA flash
        // need equal head dims; otherwise it falls back to the math path). Measured on 2 CPU
        // threads at [16, 4, 256, 48/32]: forward 0.12 s unpadded vs 0.019 s padded.
        let qk = n + r;
        let v_pad_bhtk = if v < qk {
            v_bhtv.constant_pad_nd([0, qk - v])
        } else {
            v_bhtv
        };
        let scale = self.softmax_scale(rope);
        let o_bhtk = causal_sdpa(&q_bhtk, &k_bhtk, &v_pad_bhtk, scale, docs);
        let o_bhtv = o_bhtk.narrow(3, 0, v);
        self.gate_and_project(x_btd, &o_bhtv.transpose(1, 2))
    }

    /// Decoding path (absorbed): attends from `x [B, T, d]` to the cached latent
    /// `c_kv [B, S, c]`, `k_pe [B, S, r]`, where `bias_bts` is 0 for visible keys and −inf
    /// otherwise. Never materialises per-head keys or values for the cache.
    pub fn forward_absorbed(
        &self,
        input: LayerInput<'_>,
        pos_bt: &Tensor,
        rope: &Rope,
        c_kv_bsc: &Tensor,
        k_pe_bsr: &Tensor,
        bias_bts: &Tensor,
    ) -> Tensor {
        let x_btd = input.x_btd;
        let (b, t, _) = x_btd.size3().expect("x is [B, T, d]");
        let (h, n, v, c) = (self.n_heads, self.nope, self.v, self.c);
        let s = c_kv_bsc.size()[1];
        let (q_nope, q_pe) = self.query(input, pos_bt, rope);
        let w_hkc = self.kv_b_proj.weight.view([h, n + v, c]);
        let w_uk_hnc = w_hkc.narrow(1, 0, n);
        let w_uv_hvc = w_hkc.narrow(1, n, v);
        // Fold W_uk into the query: q_lat [B, T, H, c].
        let q_lat_bthc = Tensor::einsum("bthn,hnc->bthc", &[&q_nope, &w_uk_hnc], None::<&[i64]>);
        // Scores as cache × query ([B, S, c] · [B, c, T·H]): the long cache operand stays in
        // its row-major layout, so BLAS does not repack it for every row.
        let scores_bsq = c_kv_bsc.bmm(&q_lat_bthc.reshape([b, t * h, c]).transpose(1, 2))
            + k_pe_bsr.bmm(&q_pe.reshape([b, t * h, self.rope]).transpose(1, 2));
        let scores_bths = scores_bsq.transpose(1, 2).view([b, t, h, s]) * self.softmax_scale(rope)
            + bias_bts.view([b, t, 1, s]);
        // Softmax in fp32 (f64 stays f64 for the gradient check).
        let attn_bths = scores_bths
            .softmax(-1, work_kind(x_btd.kind()))
            .to_kind(x_btd.kind());
        let o_lat = attn_bths
            .reshape([b, t * h, s])
            .bmm(c_kv_bsc)
            .view([b, t, h, c]);
        // Unfold W_uv: [B, T, H, v].
        let o_bthv = Tensor::einsum("bthc,hvc->bthv", &[&o_lat, &w_uv_hvc], None::<&[i64]>);
        self.gate_and_project(x_btd, &o_bthv)
    }

    /// Decoding path for exactly one new token per row (`x [B, 1, d]`), with the attention
    /// core chosen by `core`: the same function as [`Mla::forward_absorbed`] where row `b` sees
    /// cache slots `0..lens[b]`, the form the CUDA kernel takes.
    pub fn forward_absorbed_lens(
        &self,
        input: LayerInput<'_>,
        pos_bt: &Tensor,
        rope: &Rope,
        cache: CacheRows<'_>,
        core: DecodeCore,
    ) -> Result<Tensor, CudaError> {
        let x_btd = input.x_btd;
        let (b, t, _) = x_btd.size3()?;
        if t != 1 {
            return Err(CudaError::Input(format!(
                "forward_absorbed_lens decodes one token per row, got {t}"
            )));
        }
        let (h, n, v, c) = (self.n_heads, self.nope, self.v, self.c);
        let (q_nope, q_pe) = self.query(input, pos_bt, rope);
        let w_hkc = self.kv_b_proj.weight.view([h, n + v, c]);
        let w_uk_hnc = w_hkc.narrow(1, 0, n);
        let w_uv_hvc = w_hkc.narrow(1, n, v);
        let q_lat_bhc = Tensor::einsum("bthn,hnc->bthc", &[&q_nope, &w_uk_hnc], None::<&[i64]>)
            .reshape([b, h, c]);
        let q_pe_bhr = q_pe.reshape([b, h, self.rope]);
        let problem = MlaDecode {
            q_lat_bhc: &q_lat_bhc,
            q_pe_bhr: &q_pe_bhr,
            c_kv_bsc: cache.c_kv_bsc,
            k_pe_bsr: cache.k_pe_bsr,
            lens_b: cache.lens_b,
            scale: self.softmax_scale(rope),
        };
        let o_lat_bhc = match core {
            DecodeCore::Kernel(kernel) => problem.run(kernel)?,
            DecodeCore::Reference => problem.reference(None)?,
            DecodeCore::Cpu if mla_cpu::supports(&problem) => mla_cpu::decode(&problem)?,
            DecodeCore::Cpu => problem.reference(None)?,
        };
        let o_bthv = Tensor::einsum(
            "bthc,hvc->bthv",
            &[&o_lat_bhc.view([b, 1, h, c]), &w_uv_hvc],
            None::<&[i64]>,
        );
        Ok(self.gate_and_project(x_btd, &o_bthv))
    }

    fn softmax_scale(&self, rope: &Rope) -> f64 {
        rope.scale_mult / ((self.nope + self.rope) as f64).sqrt()
    }
}
