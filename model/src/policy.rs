//! The policy: embedding → blocks (MLA or grouped-query attention + cross-layer residual,
//! dense or MoE FFN) → norm → head.
//!
//! Shape legend: `b` batch, `t` time, `s` cache slots in use, `k` token-shift taps, `d` hidden,
//! `v` vocabulary.

// `x = x + y` on purpose: tch's `+=` is in-place `add_`, which would clobber tensors autograd
// saved for the backward (RMSNorm keeps its input).
#![allow(clippy::assign_op_pattern)]

use tch::{nn, Device, Kind, Tensor};

use super::attention::{CacheRows, DecodeCore, Latent, LayerInput, Mla};
use super::balance::{updated_bias, LayerBalanceStats};
use super::cache::KvCache;
use super::causal::DocSpans;
use super::config::{Attention, ModelConfig, RopeScaling};
use super::cross_layer::{CrossLayerResidual, CrossLayerState};
use super::gqa::Gqa;
use super::health::MoeHealth;
use super::layers::{normal_var, Linear, Mlp, RmsNorm};
use super::moe::{MoeAux, MoeLayer, Select};
use super::rope::Rope;
use super::routes::{RouteAgreement, RouteOpts};
use super::ModelError;

mod trunk;

/// Default tokens per slice of a checkpointed block's FFN rerun: slices of 4,096 take the
/// demo model's 64K-token step from +1,850 to +1,488 MiB at the same speed; smaller ones
/// gain little more (`docs/bench/log.md`, "Long trajectories").
pub const DEFAULT_RECOMPUTE_SLICE_TOKENS: i64 = 4096;
pub use trunk::{Checkpoint, Trunk};

/// The FFN of a block, chosen in `new` from `first_k_dense_replace`.
#[derive(Debug)]
enum Ffn {
    Dense(Mlp),
    Moe(MoeLayer),
}

/// The attention of a block, chosen in `new` from `cfg.attention`.
#[derive(Debug)]
enum Attn {
    Mla(Mla),
    Gqa(Gqa),
}

impl Attn {
    /// Token-shift taps of the layer's latent (0 for GQA).
    fn shift_taps(&self) -> usize {
        match self {
            Attn::Mla(m) => m.shift_taps(),
            Attn::Gqa(_) => 0,
        }
    }
}

/// One transformer block: `x + mix(attn(norm(x)))`, then `x + ffn(norm(x))`, where `mix` is
/// the cross-layer residual (the identity without one).
#[derive(Debug)]
struct Block {
    attn_norm: RmsNorm,
    attn: Attn,
    cross: Option<CrossLayerResidual>,
    ffn_norm: RmsNorm,
    ffn: Ffn,
    /// Which of the cache's latent layers this block writes or reads: `layer / cla_factor`
    /// (a CLA-shared block reads its owner's).
    latent_slot: usize,
}

impl Block {
    /// Whether the block computes its own latent (MLA, not CLA-shared).
    fn owns_latent(&self) -> bool {
        matches!(&self.attn, Attn::Mla(m) if m.owns_latent())
    }

    /// The block's output `[B, T, d]` for `x [B, T, d]`, and in a training forward an MoE
    /// block's balance terms. `ctx` says how attention reaches its keys and carries what
    /// later blocks need (the CLA latent, the cross-layer history, the cache).
    /// `noise_te` replays the router noise of an earlier forward of the same block
    /// (activation recompute).
    fn forward(
        &self,
        x_btd: &Tensor,
        ctx: &mut BlockCtx<'_>,
        noise_te: Option<&Tensor>,
    ) -> Result<(Tensor, Option<MoeAux>), ModelError> {
        let x = self.attend(x_btd, ctx)?;
        Ok(self.ffn(&x, ctx.train, noise_te, &mut ctx.routes))
    }

    /// Whether the FFN is an MoE layer.
    fn is_moe(&self) -> bool {
        matches!(self.ffn, Ffn::Moe(_))
    }

    /// The FFN half: `x + ffn(norm(x))` `[B, T, d]`, and in a training forward an MoE
    /// block's balance terms. An MoE block takes its given routes from `routes` and leaves
    /// its own choice there.
    fn ffn(
        &self,
        x_btd: &Tensor,
        train: bool,
        noise_te: Option<&Tensor>,
        routes: &mut RouteState<'_>,
    ) -> (Tensor, Option<MoeAux>) {
        let h = self.ffn_norm.forward(x_btd);
        let (y, aux) = match &self.ffn {
            Ffn::Dense(m) => (m.forward(&h), None),
            Ffn::Moe(m) => {
                let given_tk = routes.next_layer();
                let sel = Select {
                    noise_te,
                    given_tk: given_tk.as_ref(),
                    replay: routes.opts.replay,
                };
                let out = m.forward_select(&h, train, sel);
                routes.keep(out.own_idx_tk, out.agreement);
                (out.y_btd, out.aux)
            }
        };
        (x_btd + y, aux)
    }

    /// The attention half: `x + mix(attention(norm(x)))` `[B, T, d]`, the FFN's input.
    fn attend(&self, x_btd: &Tensor, ctx: &mut BlockCtx<'_>) -> Result<Tensor, ModelError> {
        let h = self.attn_norm.forward(x_btd);
        let h_prev = ctx.prev_inputs(&h, self.attn.shift_taps(), self.latent_slot);
        let input = LayerInput {
            x_btd: &h,
            x_prev: &h_prev,
        };
        let a = ctx.attention(&self.attn, input, self.latent_slot)?;
        let mixed = match &self.cross {
            Some(c) => c.forward(&mut ctx.cross, &a),
            None => a.shallow_clone(),
        };
        ctx.cross.push(&a);
        Ok(x_btd + mixed)
    }

    /// The FFN half on a slice of tokens `x_nd [n, d]` of a forward of `n_total` tokens:
    /// `x + ffn(norm(x))` and, for an MoE block in a training forward (`counts_e`, the
    /// forward's assignment counts, given), the slice's share of its balance loss. Per token
    /// but for that loss, so a checkpointed backward reruns it slice by slice.
    fn ffn_slice(
        &self,
        x_nd: &Tensor,
        sel: Select<'_>,
        counts_e: Option<&Tensor>,
        n_total: i64,
    ) -> (Tensor, Option<Tensor>) {
        match (&self.ffn, counts_e) {
            (Ffn::Moe(m), Some(c)) => {
                let (y, loss) = m.forward_slice(&self.ffn_norm.forward(x_nd), sel, c, n_total);
                (x_nd + y, Some(loss))
            }
            (Ffn::Moe(m), None) => {
                let out = m.forward_select(&self.ffn_norm.forward(&x_nd.unsqueeze(0)), false, sel);
                (x_nd + out.y_btd.squeeze_dim(0), None)
            }
            (Ffn::Dense(m), _) => (x_nd + m.forward(&self.ffn_norm.forward(x_nd)), None),
        }
    }
}

/// What the blocks of one forward share: positions, how attention reaches its keys, and the
/// state one block leaves for the next.
struct BlockCtx<'a> {
    /// RoPE positions `[B, T]`; in a full forward also the positions within each sequence
    /// at which the token shift stops.
    pos_bt: Tensor,
    rope: &'a Rope,
    /// Attention outputs of the blocks run so far (the cross-layer residual's input).
    cross: CrossLayerState,
    /// Router noise on, and MoE blocks report their balance terms.
    train: bool,
    attend: Attend<'a>,
    /// Routes given to the MoE blocks, and their own choices.
    routes: RouteState<'a>,
}

/// The routes of one forward: those given to its MoE blocks, and what the blocks chose.
struct RouteState<'a> {
    opts: RouteOpts<'a>,
    /// MoE blocks run so far.
    moe_seen: usize,
    /// Per MoE block, its own choice `[n, k]` (with `opts.record`).
    own: Vec<Tensor>,
    /// Per MoE block, its agreement with the given routes (when given).
    agreement: Vec<RouteAgreement>,
    /// The latest MoE block's given routes `[n, k]` (a checkpointed forward keeps them).
    last_given: Option<Tensor>,
}

impl<'a> RouteState<'a> {
    fn new(opts: RouteOpts<'a>) -> Self {
        Self {
            opts,
            moe_seen: 0,
            own: Vec::new(),
            agreement: Vec::new(),
            last_given: None,
        }
    }

    /// The next MoE block's given routes `[n, k]`.
    fn next_layer(&mut self) -> Option<Tensor> {
        let j = self.moe_seen;
        self.moe_seen += 1;
        self.last_given = self.opts.layer(j);
        self.last_given.as_ref().map(Tensor::shallow_clone)
    }

    /// Keeps an MoE block's own choice (when recording) and agreement.
    fn keep(&mut self, own_idx_tk: Tensor, agreement: Option<RouteAgreement>) {
        if self.opts.record {
            self.own.push(own_idx_tk);
        }
        self.agreement.extend(agreement);
    }

    /// The recorded choices as `[B, T, L, k]` (with `opts.record`).
    fn recorded(&mut self, (b, t): (i64, i64), k: i64, device: Device) -> Option<Tensor> {
        if !self.opts.record {
            return None;
        }
        Some(if self.own.is_empty() {
            Tensor::zeros([b, t, 0, k], (Kind::Int64, device))
        } else {
            Tensor::stack(&std::mem::take(&mut self.own), 1).view([b, t, -1, k])
        })
    }
}

/// How a block's attention reaches its keys, and where its latent goes.
enum Attend<'a> {
    /// Training or scoring: attention over the tokens of this forward, the latent
    /// decompressed per head ([`Mla::forward_full`]).
    Full {
        /// The documents of packed rows (attention is causal within each); `None` is plain
        /// causal attention over each row.
        docs: Option<&'a DocSpans>,
        /// The latest latent-owning block's latent, which CLA-shared blocks reuse.
        latent: Option<Latent>,
    },
    /// Cached decoding ([`MoePolicy::cached_ctx`]): each owning block writes its latent
    /// into the cache, and every block attends in latent space over slots `0..s`.
    Cached {
        cache: &'a mut KvCache,
        /// Cache slots the tokens are written to `[B, T]` (their positions, not clamped).
        slot_bt: Tensor,
        /// Slots in use (not the cache's spare capacity).
        s: i64,
        /// `latent_token_shift`: the gather index `[B, k, d]` of the inputs each row keeps,
        /// and per tap `k` (index `k - 1`) whether a token has an input `k` back, `[B, T, 1]`.
        shift: Option<(Tensor, Vec<Tensor>)>,
        keys: CachedKeys,
    },
}

/// Which absorbed attention reads the cache.
enum CachedKeys {
    /// A decode step (one token per row) through a core of
    /// [`Mla::forward_absorbed_lens`]; row `b` sees slots `0..lens[b]`.
    Core { core: DecodeCore, lens_b: Tensor },
    /// The matmul path of [`Mla::forward_absorbed`]; the mask `[B, T, S]` is 0 for visible
    /// keys, −inf past each token's position.
    Matmul { bias_bts: Tensor },
}

impl BlockCtx<'_> {
    /// Each token's inputs `1..=taps` tokens back within its sequence (zeros before a
    /// sequence start), one `[B, T, d]` per tap; empty when `taps` is 0.
    fn prev_inputs(&mut self, h_btd: &Tensor, taps: usize, latent_slot: usize) -> Vec<Tensor> {
        match &mut self.attend {
            Attend::Full { .. } => (1..=taps as i64)
                .map(|k| token_shift(h_btd, &self.pos_bt, k))
                .collect(),
            Attend::Cached {
                cache,
                shift: Some((keep_bkd, valid_k_bt1)),
                ..
            } if taps > 0 => {
                let hist = cache.push_inputs(latent_slot, h_btd, keep_bkd); // [B, taps + t, d]
                                                                            // The history holds the config's taps, those of every shifting layer.
                let (taps, t) = (valid_k_bt1.len() as i64, h_btd.size()[1]);
                // Token j's input k back sits at `taps + j - k`.
                (1..=taps)
                    .zip(valid_k_bt1.iter())
                    .map(|(k, valid_bt1)| hist.narrow(1, taps - k, t) * valid_bt1)
                    .collect()
            }
            Attend::Cached { .. } => Vec::new(),
        }
    }

    /// The block's attention output `[B, T, d]`.
    fn attention(
        &mut self,
        attn: &Attn,
        input: LayerInput<'_>,
        cache_slot: usize,
    ) -> Result<Tensor, ModelError> {
        match attn {
            Attn::Mla(mla) => self.mla_attention(mla, input, cache_slot),
            Attn::Gqa(gqa) => Ok(self.gqa_attention(gqa, input.x_btd, cache_slot)),
        }
    }

    /// Grouped-query attention: over this forward's tokens, or (cached) the new tokens'
    /// keys and values written to the cache, then attention over slots `0..s`.
    fn gqa_attention(&mut self, gqa: &Gqa, x_btd: &Tensor, cache_slot: usize) -> Tensor {
        let (pos_bt, rope) = (&self.pos_bt, self.rope);
        match &mut self.attend {
            Attend::Full { docs, .. } => gqa.forward_full(x_btd, pos_bt, rope, *docs),
            Attend::Cached {
                cache,
                slot_bt,
                s,
                keys,
                ..
            } => {
                let p = gqa.project(x_btd, pos_bt, rope);
                cache.write(cache_slot, slot_bt, &p.k_btw, &p.v_btw);
                let (k_bsw, v_bsw) = cache.read(cache_slot, *s);
                let bias_bts = match keys {
                    CachedKeys::Matmul { bias_bts } => bias_bts.shallow_clone(),
                    // A decode step (one token per row): row `b` sees slots `0..lens[b]`.
                    CachedKeys::Core { lens_b, .. } => {
                        let key_s = Tensor::arange(*s, (Kind::Int64, lens_b.device()));
                        let hidden_bs = key_s
                            .unsqueeze(0)
                            .ge_tensor(&lens_b.to_kind(Kind::Int64).unsqueeze(1));
                        Tensor::zeros(hidden_bs.size(), (Kind::Float, lens_b.device()))
                            .masked_fill(&hidden_bs, f64::NEG_INFINITY)
                            .unsqueeze(1)
                    }
                };
                gqa.attend_cached(&p.q_bthe, &k_bsw, &v_bsw, &bias_bts)
            }
        }
    }

    /// The block's latent (its own, or the CLA owner's), then its MLA output `[B, T, d]`.
    fn mla_attention(
        &mut self,
        mla: &Mla,
        input: LayerInput<'_>,
        latent_slot: usize,
    ) -> Result<Tensor, ModelError> {
        let (pos_bt, rope) = (&self.pos_bt, self.rope);
        let own = mla.latent(input.x_btd, input.x_prev, pos_bt, rope);
        match &mut self.attend {
            Attend::Full { docs, latent } => {
                if own.is_some() {
                    *latent = own;
                }
                let lat = latent.as_ref().expect("layer 0 always owns a latent");
                Ok(mla.forward_full(input, lat, pos_bt, rope, *docs))
            }
            Attend::Cached {
                cache,
                slot_bt,
                s,
                keys,
                ..
            } => {
                if let Some(lat) = own {
                    cache.write(latent_slot, slot_bt, &lat.c_kv_btc, &lat.k_pe_btr);
                }
                let (c_kv_bsc, k_pe_bsr) = cache.read(latent_slot, *s);
                Ok(match keys {
                    CachedKeys::Core { core, lens_b } => {
                        let rows = CacheRows {
                            c_kv_bsc: &c_kv_bsc,
                            k_pe_bsr: &k_pe_bsr,
                            lens_b,
                        };
                        mla.forward_absorbed_lens(input, pos_bt, rope, rows, *core)?
                    }
                    CachedKeys::Matmul { bias_bts } => {
                        mla.forward_absorbed(input, pos_bt, rope, &c_kv_bsc, &k_pe_bsr, bias_bts)
                    }
                })
            }
        }
    }
}

/// Balance statistics of every MoE layer for one forward; sum micro-batches with
/// [`BalanceStats::merge`] and hand the total to [`MoePolicy::update_balance`].
#[derive(Debug, Default)]
pub struct BalanceStats {
    /// `(layer index, statistics)` per MoE layer.
    pub layers: Vec<(i64, LayerBalanceStats)>,
}

impl BalanceStats {
    /// Adds another micro-batch (taken with the same bias).
    pub fn merge(&mut self, other: &BalanceStats) {
        if self.layers.is_empty() {
            self.layers = other
                .layers
                .iter()
                .map(|(l, s)| {
                    (
                        *l,
                        LayerBalanceStats {
                            counts_e: s.counts_e.copy(),
                            hist_eb: s.hist_eb.as_ref().map(|h| h.copy()),
                            lo: s.lo,
                            hi: s.hi,
                            top_k: s.top_k,
                        },
                    )
                })
                .collect();
            return;
        }
        for ((_, a), (_, b)) in self.layers.iter_mut().zip(&other.layers) {
            a.merge(b);
        }
    }
}

/// What a training forward returns.
#[derive(Debug)]
pub struct ForwardOutput {
    /// Logits `[B, T, V]`.
    pub logits_btv: Tensor,
    /// Sum over MoE layers of the weighted balance losses (Switch aux, z-loss); add it to the
    /// training loss. Zero in quantile / aux-free mode without z-loss.
    pub aux_loss: Tensor,
    /// Health per MoE layer (empty when `train` is false).
    pub health: Vec<MoeHealth>,
    /// Balance statistics per MoE layer (empty when `train` is false).
    pub balance: BalanceStats,
}

/// The MoE policy model. Build it on the root of a `VarStore` so checkpoint names are stable.
#[derive(Debug)]
pub struct MoePolicy {
    cfg: ModelConfig,
    embed_vd: Tensor,
    blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    rope: Rope,
    device: Device,
    /// Decode steps (one token per row) through [`Mla::forward_absorbed_lens`] with this
    /// core; `None`: the matmul path of `forward_absorbed` for every append. New models on
    /// the CPU take [`DecodeCore::Cpu`], others `None`.
    decode_core: Option<DecodeCore>,
    /// Tokens per slice when a checkpointed backward reruns a block's FFN
    /// ([`MoePolicy::set_recompute_slice_tokens`]).
    recompute_slice_tokens: i64,
}

impl MoePolicy {
    /// Creates every parameter under `vs` (names: `embed_tokens.weight`,
    /// `layers.{i}.self_attn.*`, `layers.{i}.mlp.*`, `norm.weight`, `lm_head.weight`).
    ///
    /// Every way of building a model comes here first: before any tensor is allocated,
    /// [`ModelConfig::check_fits`] refuses an invalid config, one past libtorch's sizes and one
    /// whose weights exceed the memory of `vs`'s device, with an error naming the field.
    pub fn new(vs: &nn::Path, cfg: &ModelConfig) -> Result<Self, ModelError> {
        Self::build(vs, cfg, Kind::Float)
    }

    /// [`MoePolicy::new`], with the memory check sized for weights that end up in `kind`.
    fn build(vs: &nn::Path, cfg: &ModelConfig, kind: Kind) -> Result<Self, ModelError> {
        cfg.check_fits(vs.device(), kind)?;
        let d = cfg.hidden_size;
        let embed_vd = normal_var(
            &(vs / "embed_tokens"),
            "weight",
            &[cfg.vocab_size, d],
            cfg.initializer_range,
        );
        let mut blocks = Vec::new();
        for i in 0..cfg.num_hidden_layers {
            let p = vs / "layers" / i;
            let ffn = if cfg.is_moe_layer(i) {
                Ffn::Moe(MoeLayer::new(&p / "mlp", cfg, i))
            } else {
                Ffn::Dense(Mlp::new(
                    &p / "mlp",
                    d,
                    cfg.intermediate_size,
                    cfg.initializer_range,
                ))
            };
            blocks.push(Block {
                attn_norm: RmsNorm::new(&p / "input_layernorm", d, cfg.rms_norm_eps),
                attn: match cfg.attention {
                    Attention::Mla => Attn::Mla(Mla::new(&p / "self_attn", cfg, i)),
                    Attention::Gqa { .. } => Attn::Gqa(Gqa::new(&p / "self_attn", cfg)),
                },
                cross: (cfg.cross_layer_residual && i > 0)
                    .then(|| CrossLayerResidual::new(&p / "cross_layer", d, cfg.rms_norm_eps)),
                ffn_norm: RmsNorm::new(&p / "post_attention_layernorm", d, cfg.rms_norm_eps),
                ffn,
                latent_slot: (i / cfg.cla_factor) as usize,
            });
        }
        let lm_head = (!cfg.tie_word_embeddings)
            .then(|| Linear::new(vs / "lm_head", d, cfg.vocab_size, cfg.initializer_range));
        Ok(MoePolicy {
            cfg: cfg.clone(),
            embed_vd,
            blocks,
            norm: RmsNorm::new(vs / "norm", d, cfg.rms_norm_eps),
            lm_head,
            rope: Rope::new(
                cfg.rope_dim(),
                cfg.rope_theta,
                &cfg.rope_scaling,
                cfg.max_position_embeddings,
                vs.device(),
            ),
            device: vs.device(),
            decode_core: (vs.device() == Device::Cpu).then_some(DecodeCore::Cpu),
            recompute_slice_tokens: DEFAULT_RECOMPUTE_SLICE_TOKENS,
        })
    }

    /// [`MoePolicy::new`], then every weight cast to `kind` except the routers, which stay
    /// fp32 ([`precision::cast_weights`](super::precision::cast_weights)): bf16 weights and
    /// activations on CUDA with fp32 routing. `Kind::Float` leaves everything as `new` does.
    pub fn new_in_kind(
        vs: &nn::VarStore,
        cfg: &ModelConfig,
        kind: Kind,
    ) -> Result<Self, ModelError> {
        let model = Self::build(&vs.root(), cfg, kind)?;
        super::precision::cast_weights(vs, kind)?;
        Ok(model)
    }

    /// Chooses how decode steps (appends of one token per row) attend: `Some(core)` routes
    /// them through [`Mla::forward_absorbed_lens`] (the custom CUDA kernel, the fused CPU
    /// core, or their ATen reference); `None` keeps the matmul path. The default is
    /// `Some(DecodeCore::Cpu)` for a model on the CPU and `None` elsewhere.
    pub fn set_decode_core(&mut self, core: Option<DecodeCore>) {
        self.decode_core = core;
    }

    /// Sets how many tokens a checkpointed backward reruns a block's FFN on at a time
    /// (default [`DEFAULT_RECOMPUTE_SLICE_TOKENS`]); any value gives the same gradients.
    pub fn set_recompute_slice_tokens(&mut self, tokens: i64) {
        self.recompute_slice_tokens = tokens.max(1);
    }

    /// The decode core set by [`MoePolicy::set_decode_core`].
    pub fn decode_core(&self) -> Option<DecodeCore> {
        self.decode_core
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Raises the context window between training stages: new RoPE scaling and length.
    /// Weights are unchanged; caches built before keep their (old-table) RoPE keys, so start
    /// new caches after calling this.
    pub fn extend_context(
        &mut self,
        max_position_embeddings: i64,
        scaling: RopeScaling,
    ) -> Result<(), ModelError> {
        let cfg = ModelConfig {
            max_position_embeddings,
            rope_scaling: scaling,
            ..self.cfg.clone()
        };
        cfg.check_fits(self.device, Kind::Float)?;
        self.rope = Rope::new(
            cfg.rope_dim(),
            cfg.rope_theta,
            &scaling,
            max_position_embeddings,
            self.device,
        );
        self.cfg = cfg;
        Ok(())
    }

    fn check_tokens(&self, tokens_bt: &Tensor, offset: i64) -> Result<(i64, i64), ModelError> {
        let (b, t) = self.check_ids(tokens_bt)?;
        if offset + t > self.cfg.max_position_embeddings {
            return Err(ModelError::Input(format!(
                "position {} exceeds max_position_embeddings {}",
                offset + t,
                self.cfg.max_position_embeddings
            )));
        }
        Ok((b, t))
    }

    /// Checks shape `[B, T]`, dtype int64 and the id range.
    fn check_ids(&self, tokens_bt: &Tensor) -> Result<(i64, i64), ModelError> {
        let (b, t) = tokens_bt.size2().map_err(|_| {
            ModelError::Input(format!("tokens must be [B, T], got {:?}", tokens_bt.size()))
        })?;
        if tokens_bt.kind() != Kind::Int64 {
            return Err(ModelError::Input(format!(
                "tokens must be int64, got {:?}",
                tokens_bt.kind()
            )));
        }
        if b * t > 0 {
            let lo = tokens_bt.f_min()?.int64_value(&[]);
            let hi = tokens_bt.f_max()?.int64_value(&[]);
            if lo < 0 || hi >= self.cfg.vocab_size {
                return Err(ModelError::Input(format!(
                    "token id out of range: min {lo}, max {hi}, vocab_size {}",
                    self.cfg.vocab_size
                )));
            }
        }
        Ok((b, t))
    }

    fn embed(&self, tokens_bt: &Tensor, b: i64, t: i64) -> Tensor {
        self.embed_vd
            .index_select(0, &tokens_bt.reshape([-1]))
            .view([b, t, self.cfg.hidden_size])
    }

    /// The head's weight `[V, d]`: `lm_head`, or the embedding when tied.
    pub fn head_weight_vd(&self) -> &Tensor {
        match &self.lm_head {
            Some(l) => &l.weight,
            None => &self.embed_vd,
        }
    }

    /// Logits `[.., V]` of final hidden states (after the final norm, as
    /// [`Trunk::hidden_btd`]). Training and scoring never call this over a whole row: they
    /// go through [`head`](crate::head) a chunk of positions at a time.
    pub fn logits(&self, hidden_btd: &Tensor) -> Tensor {
        hidden_btd.matmul(&self.head_weight_vd().tr())
    }

    /// Final norm, then logits: the decoding path, over the positions it samples from.
    fn head(&self, x_btd: &Tensor) -> Tensor {
        self.logits(&self.norm.forward(x_btd))
    }

    /// Forward over a batch `tokens [B, T]` (int64), causal within each row, with logits
    /// `[B, T, V]` at every position: the reference path ([`MoePolicy::trunk`] then
    /// [`MoePolicy::logits`]) for inspection, parity tests and `corvid model logits`. With
    /// `train`, router noise is on and health and balance statistics are returned.
    pub fn forward(&self, tokens_bt: &Tensor, train: bool) -> Result<ForwardOutput, ModelError> {
        let trunk = self.trunk(tokens_bt, train, Checkpoint::None)?;
        Ok(self.with_logits(trunk))
    }

    /// [`MoePolicy::forward`] over packed rows ([`MoePolicy::trunk_packed`]).
    pub fn forward_packed(
        &self,
        tokens_bt: &Tensor,
        positions_bt: &Tensor,
        doc_ids_bt: &Tensor,
        train: bool,
    ) -> Result<ForwardOutput, ModelError> {
        let trunk =
            self.trunk_packed(tokens_bt, positions_bt, doc_ids_bt, train, Checkpoint::None)?;
        Ok(self.with_logits(trunk))
    }

    fn with_logits(&self, trunk: Trunk) -> ForwardOutput {
        ForwardOutput {
            logits_btv: self.logits(&trunk.hidden_btd),
            aux_loss: trunk.aux_loss,
            health: trunk.health,
            balance: trunk.balance,
        }
    }

    /// The blocks and the final norm over `tokens [B, T]` (int64), causal within each row:
    /// the final hidden states, which [`head`](crate::head) turns into per-token scores.
    /// With [`Checkpoint::Blocks`] each block's activations are recomputed in
    /// [`MoePolicy::backward`] instead of kept.
    pub fn trunk(
        &self,
        tokens_bt: &Tensor,
        train: bool,
        checkpoint: Checkpoint,
    ) -> Result<Trunk, ModelError> {
        self.trunk_routed(tokens_bt, None, train, checkpoint, RouteOpts::default())
    }

    /// [`MoePolicy::trunk`] over packed rows: each row holds several documents, told apart
    /// by `doc_ids [B, T]` (int64; any value, equal within a document, e.g. `-1` for
    /// padding). `positions [B, T]` (int64) are the RoPE positions, restarting at 0 in each
    /// document. Attention is causal within a document and never crosses documents (one
    /// causal attention per document: [`causal`](crate::causal)), so every document's hidden
    /// states equal those of running it alone. A document's tokens are contiguous.
    pub fn trunk_packed(
        &self,
        tokens_bt: &Tensor,
        positions_bt: &Tensor,
        doc_ids_bt: &Tensor,
        train: bool,
        checkpoint: Checkpoint,
    ) -> Result<Trunk, ModelError> {
        let packing = Some((positions_bt, doc_ids_bt));
        self.trunk_routed(tokens_bt, packing, train, checkpoint, RouteOpts::default())
    }

    /// [`MoePolicy::trunk`], or with `packing = (positions, doc_ids)`
    /// [`MoePolicy::trunk_packed`], with routes compared, replayed or recorded as `routes`
    /// says ([`routes`](crate::routes)): [`Trunk::agreement`] per MoE layer when routes are
    /// given, [`Trunk::routes_btlk`] when recording.
    pub fn trunk_routed(
        &self,
        tokens_bt: &Tensor,
        packing: Option<(&Tensor, &Tensor)>,
        train: bool,
        checkpoint: Checkpoint,
        routes: RouteOpts<'_>,
    ) -> Result<Trunk, ModelError> {
        let (b, t) = match packing {
            None => self.check_tokens(tokens_bt, 0)?,
            Some(_) => self.check_ids(tokens_bt)?,
        };
        if let Some(g) = routes.given_btlk {
            self.check_routes(g, (b, t))?;
        }
        let Some((positions_bt, doc_ids_bt)) = packing else {
            let pos_bt = Tensor::arange(t, (Kind::Int64, self.device))
                .unsqueeze(0)
                .expand([b, t], false);
            return self.run_trunk(tokens_bt, pos_bt, None, train, checkpoint, routes);
        };
        for (name, x) in [("positions", positions_bt), ("doc_ids", doc_ids_bt)] {
            if x.size() != [b, t] || x.kind() != Kind::Int64 {
                return Err(ModelError::Input(format!(
                    "{name} must be int64 [{b}, {t}] like tokens, got {:?} {:?}",
                    x.kind(),
                    x.size()
                )));
            }
        }
        if b * t > 0 {
            let lo = positions_bt.f_min()?.int64_value(&[]);
            let hi = positions_bt.f_max()?.int64_value(&[]);
            if lo < 0 || hi >= self.cfg.max_position_embeddings {
                return Err(ModelError::Input(format!(
                    "positions span {lo}..={hi}, outside 0..{}",
                    self.cfg.max_position_embeddings
                )));
            }
        }
        let positions_bt = positions_bt.to_device(self.device);
        let docs = DocSpans::from_doc_ids(doc_ids_bt)?;
        self.run_trunk(
            tokens_bt,
            positions_bt,
            Some(docs),
            train,
            checkpoint,
            routes,
        )
    }

    /// Checks a route table for tokens `(b, t)`: integer `[B, T, L, k]` with this model's MoE
    /// layers and `k`, each row either all `-1` (no route) or `k` distinct experts.
    fn check_routes(&self, routes_btlk: &Tensor, (b, t): (i64, i64)) -> Result<(), ModelError> {
        let want = [b, t, self.cfg.n_moe_layers(), self.cfg.num_experts_per_tok];
        let integer = matches!(routes_btlk.kind(), Kind::Int64 | Kind::Int | Kind::Int16);
        if routes_btlk.size() != want || !integer {
            return Err(ModelError::Input(format!(
                "routes must be integer {want:?} (tokens, MoE layers, k), got {:?} {:?}",
                routes_btlk.kind(),
                routes_btlk.size()
            )));
        }
        if routes_btlk.numel() > 0 {
            let lo = routes_btlk.f_min()?.int64_value(&[]);
            let hi = routes_btlk.f_max()?.int64_value(&[]);
            if lo < -1 || hi >= self.cfg.n_routed_experts {
                return Err(ModelError::Input(format!(
                    "route ids span {lo}..={hi}, outside -1..{}",
                    self.cfg.n_routed_experts
                )));
            }
            let k = want[3];
            let given_btl = routes_btlk.ge(0).sum_dim_intlist(-1, false, Kind::Int64);
            if given_btl
                .gt(0)
                .logical_and(&given_btl.lt(k))
                .any()
                .int64_value(&[])
                != 0
            {
                return Err(ModelError::Input(
                    "a route row mixes -1 with expert ids: give all k experts or none".into(),
                ));
            }
            let sorted = routes_btlk.sort(-1, false).0;
            let (lo_k, hi_k) = (sorted.narrow(3, 0, k - 1), sorted.narrow(3, 1, k - 1));
            if hi_k
                .eq_tensor(&lo_k)
                .logical_and(&lo_k.ge(0))
                .any()
                .int64_value(&[])
                != 0
            {
                return Err(ModelError::Input(
                    "a route row names the same expert twice".into(),
                ));
            }
        }
        Ok(())
    }

    /// Log-probabilities `[B, T]` of `targets [B, T]` under `logits [B, T, V] / temperature`.
    pub fn token_logprobs(
        logits_btv: &Tensor,
        targets_bt: &Tensor,
        temperature: f64,
    ) -> Result<Tensor, ModelError> {
        let logp_btv = (logits_btv / temperature).f_log_softmax(-1, logits_btv.kind())?;
        Ok(logp_btv
            .f_gather(-1, &targets_bt.unsqueeze(-1), false)?
            .squeeze_dim(-1))
    }

    /// A new latent cache for `batch` sequences, in the model's dtype and device.
    pub fn new_cache(&self, batch: usize, capacity: i64) -> KvCache {
        KvCache::new(
            &self.cfg,
            batch,
            capacity,
            self.embed_vd.kind(),
            self.device,
        )
    }

    /// Appends `tokens [B, T]` to every sequence of `cache` (each at its own length) and
    /// returns their logits `[B, T, V]`. Prefill, a new turn on a reused cache, and a batched
    /// decode step are all this call. Uses the absorbed latent attention; runs without
    /// gradients.
    pub fn forward_cached(
        &self,
        cache: &mut KvCache,
        tokens_bt: &Tensor,
    ) -> Result<Tensor, ModelError> {
        let (b, t) = self.check_ids(tokens_bt)?;
        let new_b = vec![t; b as usize];
        Ok(self
            .append_rows(cache, tokens_bt, (b, t), &new_b, false, false)?
            .0)
    }

    /// Like [`forward_cached`](Self::forward_cached) for rows that append different numbers
    /// of tokens: row `b` appends the first `new_b[b]` tokens of `tokens_bt[b]` (the rest is
    /// padding) and its cache advances by exactly that many. A row with `new_b[b] == 0` is
    /// left as it was. So a batch can prefill turns of different lengths in one forward, and
    /// a decode step can run over rows of which only some are generating.
    ///
    /// Padding never reaches real tokens: a query at position `p` sees only keys at
    /// positions `<= p`, and a padded token sits after every real token of its row; what
    /// padding writes into the cache lies beyond the row's length and is overwritten by the
    /// row's next real tokens before any query can see it. Logits at padded positions are
    /// meaningless.
    pub fn forward_ragged(
        &self,
        cache: &mut KvCache,
        tokens_bt: &Tensor,
        new_b: &[i64],
    ) -> Result<Tensor, ModelError> {
        let bt = self.check_ids(tokens_bt)?;
        Ok(self
            .append_rows(cache, tokens_bt, bt, new_b, false, false)?
            .0)
    }

    /// [`forward_ragged`](Self::forward_ragged), returning logits `[B, V]` only at each row's
    /// last appended token (what a sampler draws from; a row appending nothing gets its
    /// first padded position's, which mean nothing). A prefill of `T` tokens so computes one
    /// row of logits instead of `T`.
    pub fn forward_ragged_last(
        &self,
        cache: &mut KvCache,
        tokens_bt: &Tensor,
        new_b: &[i64],
    ) -> Result<Tensor, ModelError> {
        let bt = self.check_ids(tokens_bt)?;
        Ok(self
            .append_rows(cache, tokens_bt, bt, new_b, true, false)?
            .0)
    }

    /// [`forward_ragged_last`](Self::forward_ragged_last), also returning every appended
    /// token's expert ids `[B, T, L, k]` (int64; `L` MoE layers in layer order; padded
    /// positions' ids mean nothing): what the actor records for routing replay.
    pub fn forward_ragged_last_routed(
        &self,
        cache: &mut KvCache,
        tokens_bt: &Tensor,
        new_b: &[i64],
    ) -> Result<(Tensor, Tensor), ModelError> {
        let bt = self.check_ids(tokens_bt)?;
        let (logits, routes) = self.append_rows(cache, tokens_bt, bt, new_b, true, true)?;
        Ok((logits, routes.expect("recorded")))
    }

    /// The body of [`forward_cached`](Self::forward_cached),
    /// [`forward_ragged`](Self::forward_ragged) and
    /// [`forward_ragged_last`](Self::forward_ragged_last), for tokens of shape `(b, t)` whose
    /// ids `check_ids` has accepted; with `record`, also the tokens' expert ids.
    fn append_rows(
        &self,
        cache: &mut KvCache,
        tokens_bt: &Tensor,
        (b, t): (i64, i64),
        new_b: &[i64],
        last_only: bool,
        record: bool,
    ) -> Result<(Tensor, Option<Tensor>), ModelError> {
        tch::no_grad(|| {
            let mut ctx = self.cached_ctx(cache, (b, t), new_b)?;
            if record {
                ctx.routes = RouteState::new(RouteOpts::record());
            }
            let mut x = self.embed(tokens_bt, b, t);
            for blk in &self.blocks {
                x = blk.forward(&x, &mut ctx, None)?.0;
            }
            let routes = ctx
                .routes
                .recorded((b, t), self.cfg.num_experts_per_tok, self.device);
            drop(ctx); // gives the cache back
            cache.advance_rows(new_b);
            if !last_only {
                return Ok((self.head(&x), routes));
            }
            let last_b = new_b.iter().map(|n| (n - 1).max(0)).collect::<Vec<_>>();
            let idx_b11 = Tensor::from_slice(&last_b)
                .to_device(self.device)
                .view([b, 1, 1])
                .expand([b, 1, self.cfg.hidden_size], false);
            let logits = self.head(&x.gather(1, &idx_b11, false)).squeeze_dim(1);
            Ok((logits, routes))
        })
    }

    /// Checks that `new_b` fits the cache and the position table, grows the cache for `t`
    /// more tokens per row, and sets up what every block of the append shares: positions,
    /// the token-shift gather and which attention reads the cache.
    fn cached_ctx<'a>(
        &'a self,
        cache: &'a mut KvCache,
        (b, t): (i64, i64),
        new_b: &[i64],
    ) -> Result<BlockCtx<'a>, ModelError> {
        if b as usize != cache.batch() || new_b.len() != cache.batch() {
            return Err(ModelError::Input(format!(
                "tokens have batch {b} and {} row lengths but the cache holds {} sequences",
                new_b.len(),
                cache.batch()
            )));
        }
        let max_pos = self.cfg.max_position_embeddings;
        for (row, (&len, &n)) in cache.lens().iter().zip(new_b).enumerate() {
            if !(0..=t).contains(&n) {
                return Err(ModelError::Input(format!(
                    "row {row} appends {n} tokens but the batch has {t} per row"
                )));
            }
            if len + n > max_pos {
                return Err(ModelError::Input(format!(
                    "row {row}: position {} exceeds max_position_embeddings {max_pos}",
                    len + n
                )));
            }
        }
        let max_len = cache.lens().iter().copied().max().unwrap_or(0);
        cache.ensure_capacity(max_len + t);
        let lens_b1 = Tensor::from_slice(cache.lens())
            .to_device(self.device)
            .unsqueeze(1);
        let new_b1 = Tensor::from_slice(new_b)
            .to_device(self.device)
            .unsqueeze(1);
        // Cache slots the tokens are written to; padding may run past the position
        // table, so RoPE sees positions clamped to it (padding only).
        let pos_bt = &lens_b1 + Tensor::arange(t, (Kind::Int64, self.device)).unsqueeze(0);
        let rope_pos_bt = pos_bt.clamp_max(max_pos - 1);
        // latent_token_shift: after this step a row keeps the `taps` inputs ending at its
        // last real token, i.e. from index `new` of `[last_h (taps) ; h (t)]` on (a row
        // appending nothing keeps what it had). Tap `k` of a token exists only at positions
        // `>= k` (not before a sequence start: a fresh or reset row); the same for every
        // layer.
        let taps = self.cfg.shift_taps() as i64;
        let shift = (taps > 0).then(|| {
            let keep_bk = &new_b1 + Tensor::arange(taps, (Kind::Int64, self.device));
            let keep_bkd = keep_bk
                .unsqueeze(-1)
                .expand([b, taps, self.cfg.hidden_size], false);
            let valid_k_bt1: Vec<Tensor> = (1..=taps)
                .map(|k| pos_bt.ge(k).unsqueeze(-1).to_kind(self.embed_vd.kind()))
                .collect();
            (keep_bkd, valid_k_bt1)
        });
        let s = max_len + t;
        let keys = match self.decode_core {
            // Decode steps through the chosen core see slots 0..=pos, as the mask does. The
            // cores are MLA's; grouped-query attention masks by the same lengths.
            Some(core) if t == 1 => CachedKeys::Core {
                core,
                lens_b: (pos_bt.select(1, 0) + 1).clamp_max(s),
            },
            _ => {
                let key_s = Tensor::arange(s, (Kind::Int64, self.device)).view([1, 1, s]);
                let visible_bts = key_s.le_tensor(&pos_bt.unsqueeze(-1));
                CachedKeys::Matmul {
                    bias_bts: Tensor::zeros([b, t, s], (self.embed_vd.kind(), self.device))
                        .masked_fill(&visible_bts.logical_not(), f64::NEG_INFINITY),
                }
            }
        };
        Ok(BlockCtx {
            pos_bt: rope_pos_bt,
            rope: &self.rope,
            cross: CrossLayerState::new(),
            train: false,
            routes: RouteState::new(RouteOpts::default()),
            attend: Attend::Cached {
                cache,
                slot_bt: pos_bt,
                s,
                shift,
                keys,
            },
        })
    }

    /// The balance-bias step the trainer calls after each optimizer step, with the statistics
    /// of the forwards since the last call. No-op for `aux_loss` / `none`.
    pub fn update_balance(&mut self, stats: &BalanceStats) -> Result<(), ModelError> {
        for (layer, s) in &stats.layers {
            let blk = self.blocks.get_mut(*layer as usize).ok_or_else(|| {
                ModelError::Input(format!("balance stats for missing layer {layer}"))
            })?;
            let Ffn::Moe(moe) = &mut blk.ffn else {
                return Err(ModelError::Input(format!("layer {layer} is dense")));
            };
            let bias = Vec::<f64>::try_from(moe.router.bias_e.to_kind(Kind::Double))?;
            if let Some(new) = updated_bias(moe.balance_mode(), &bias, s, self.cfg.bias_update_rate)
            {
                let new_t = Tensor::from_slice(&new)
                    .to_kind(moe.router.bias_e.kind())
                    .to_device(self.device);
                tch::no_grad(|| moe.router.bias_e.copy_(&new_t));
            }
        }
        Ok(())
    }

    /// Zeroes every routed expert weight (tests: initialisation must reach the experts).
    pub fn zero_routed_experts(&mut self) {
        for blk in &mut self.blocks {
            if let Ffn::Moe(m) = &mut blk.ffn {
                m.experts.zero_();
            }
        }
    }

    /// Turns router selection noise (`router_noise_std`) off in every MoE layer; returns
    /// whether any layer had it. RL does this: its loss compares `π_θ` with `π_prox`,
    /// `π_ref` and the actors' `μ`, all scored without noise, so a noisy training forward
    /// would put the noise into the importance ratio and the KL.
    pub fn disable_router_noise(&mut self) -> bool {
        let mut any = false;
        for blk in &mut self.blocks {
            if let Ffn::Moe(m) = &mut blk.ffn {
                any |= m.router.disable_noise();
            }
        }
        any
    }

    /// The MoE layers' routers, for inspection and tests: `(layer, router)`.
    pub fn routers(&self) -> Vec<(i64, &super::router::Router)> {
        self.blocks
            .iter()
            .enumerate()
            .filter_map(|(i, b)| match &b.ffn {
                Ffn::Moe(m) => Some((i as i64, &m.router)),
                Ffn::Dense(_) => None,
            })
            .collect()
    }
}

/// Each token's input `k` tokens back within its sequence: `x [B, T, d]` shifted right by
/// `k`, with zeros where that would cross a sequence start (positions `< k`, also inside
/// packed rows).
fn token_shift(x_btd: &Tensor, pos_bt: &Tensor, k: i64) -> Tensor {
    let (b, t, d) = x_btd.size3().expect("x is [B, T, d]");
    let k = k.min(t);
    let zeros = Tensor::zeros([b, k, d], (x_btd.kind(), x_btd.device()));
    let shifted = Tensor::cat(&[zeros, x_btd.narrow(1, 0, t - k)], 1);
    shifted * pos_bt.ge(k).unsqueeze(-1).to_kind(x_btd.kind())
}
