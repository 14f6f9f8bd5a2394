//! The model configuration: one serde struct with the enums of its options, a `validate()`
//! that names the field and the bad value, and the helpers the layers derive from it (head
//! dims, which layers are MoE, which own a latent). The presets live in `presets`, the
//! parameter, FLOP and cache counts (and the size rule `validate` applies with them) in
//! [`accounting`](super::accounting), and whether the weights fit a device in
//! [`fits`](super::fits).
//!
//! Field names follow the Hugging Face DeepSeek-V3 config where one exists (`kv_lora_rank`,
//! `qk_rope_head_dim`, `n_routed_experts`, `first_k_dense_replace`, ...), so a reader who knows
//! those checkpoints can read ours.

use serde::{Deserialize, Serialize};

use super::ModelError;

/// Sigmoid output gate on the attention output, computed from the layer input (Qwen gated
/// attention, position G1: after SDPA, before `o_proj`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttnGate {
    /// No gate.
    None,
    /// One gate per head.
    Headwise,
    /// One gate per head channel (`n_heads * v_head_dim` gates).
    Elementwise,
}

/// The attention of every block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum Attention {
    /// Multi-head latent attention (DeepSeek-V3): `kv_lora_rank`, `q_lora_rank` and the
    /// `qk_*_head_dim` / `v_head_dim` fields shape it; the cache holds the latent.
    Mla,
    /// Grouped-query attention (Qwen3): `num_attention_heads` query heads share
    /// `num_key_value_heads` key/value heads of width `head_dim`, RoPE rotates the whole head,
    /// and with `qk_norm` each query and key head is RMS-normalised before RoPE. The cache
    /// holds every key/value head.
    Gqa {
        /// Key/value heads; divides `num_attention_heads`.
        num_key_value_heads: i64,
        /// Width of every query, key and value head.
        head_dim: i64,
        /// Per-head RMSNorm of queries and keys (`q_norm`, `k_norm`).
        qk_norm: bool,
    },
}

/// How the router turns logits into scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoreFunc {
    /// Softmax over the routed experts (Qwen3-MoE, Mixtral).
    Softmax,
    /// Independent sigmoid per expert (DeepSeek-V3, Kimi K3).
    Sigmoid,
}

/// The expert feed-forward activation.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum ExpertAct {
    /// `silu(g) * u`.
    Swiglu,
    /// Soft-clipped GLU (Kimi K3 "SiTU"): `β·tanh(g/β)·σ(g) · β_lin·tanh(u/β_lin)`.
    /// K3 uses β = 4, β_lin = 25: both gate and up are bounded, which keeps rare huge
    /// activations out of the expert outputs.
    SoftClipGlu {
        /// Gate clip β.
        beta: f64,
        /// Up-projection clip β_lin.
        beta_lin: f64,
    },
}

/// How the experts are evaluated. Both give the same numbers; the test checks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpertDispatch {
    /// Sort rows by expert, then one `_grouped_mm` per projection (fp32/bf16/fp16 only).
    GroupedMm,
    /// Reference: a per-expert loop of plain matmuls. For tests, f64 and small batches.
    Loop,
}

/// Load-balancing rule for the routed experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BalanceMode {
    /// No balancing term (the bias stays zero).
    None,
    /// Switch/GShard auxiliary loss `α·E·Σ f_i·P_i` added to the training loss.
    AuxLoss,
    /// DeepSeek-V3 auxiliary-loss-free bias: `b_i -= γ·sign(load_i − mean)`, mean-centred.
    AuxFree,
    /// Quantile balancing: the bias is set to the k/E quantile of the bias each expert
    /// needed to be selected (histogrammed); no step size.
    Quantile,
}

/// RoPE frequency scaling, used to raise the context window between training stages.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Position interpolation: every frequency divided by `factor`.
    Linear {
        /// Context growth factor.
        factor: f64,
    },
    /// YaRN (arXiv 2309.00071): interpolate low frequencies, keep high ones, ramp in between,
    /// and raise the attention temperature by `(0.1·ln s + 1)²`.
    Yarn {
        /// Context growth factor s.
        factor: f64,
        /// The context the model was trained at before scaling.
        original_max_position_embeddings: i64,
        /// Rotations per original context above which a dimension is kept (DeepSeek: 32).
        beta_fast: f64,
        /// Rotations per original context below which a dimension is interpolated (DeepSeek: 1).
        beta_slow: f64,
    },
    /// YaRN exactly as Hugging Face transformers computes it (`_compute_yarn_parameters`), for
    /// checkpoints trained with it: the ramp runs over dimension indices between the
    /// correction dims of `beta_fast` and `beta_slow` (floored and ceiled when `truncate`),
    /// cos and sin are multiplied by the attention factor, and DeepSeek-V3's attention also
    /// multiplies its softmax scale by `mscale(factor, mscale_all_dim)²`
    /// ([`Rope`](crate::rope::Rope) computes both).
    HfYarn {
        /// Context growth factor s.
        factor: f64,
        /// The context the model was trained at before scaling.
        original_max_position_embeddings: i64,
        /// Rotations over the original context above which a dimension is kept (default 32).
        beta_fast: f64,
        /// Rotations below which a dimension is interpolated (default 1).
        beta_slow: f64,
        /// `mscale` (0 when the config has none).
        mscale: f64,
        /// `mscale_all_dim` (0 when the config has none); non-zero also scales the softmax.
        mscale_all_dim: f64,
        /// An explicit `attention_factor` (the cos/sin multiplier), overriding the mscales.
        attention_factor: Option<f64>,
        /// Round the correction range outward to whole dims (transformers' default: true).
        truncate: bool,
    },
}

impl RopeScaling {
    /// transformers' YaRN with its defaults (β_fast 32, β_slow 1, no mscales, attention
    /// factor `0.1·ln s + 1`, truncated range): `factor` times the `original` context.
    pub fn hf_yarn(factor: f64, original: i64) -> Self {
        RopeScaling::HfYarn {
            factor,
            original_max_position_embeddings: original,
            beta_fast: 32.0,
            beta_slow: 1.0,
            mscale: 0.0,
            mscale_all_dim: 0.0,
            attention_factor: None,
            truncate: true,
        }
    }
}

/// The full model configuration. `#[serde(default)]` fills unspecified fields from `tiny`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// Vocabulary size (the byte tokenizer has 264).
    pub vocab_size: i64,
    /// Residual width d.
    pub hidden_size: i64,
    /// Number of transformer blocks.
    pub num_hidden_layers: i64,
    /// Attention heads.
    pub num_attention_heads: i64,
    /// Low-rank query (None: a single `q_proj`).
    pub q_lora_rank: Option<i64>,
    /// Rank of the cached key/value latent.
    pub kv_lora_rank: i64,
    /// Per-head query/key dims without position information (absorbable into the latent).
    pub qk_nope_head_dim: i64,
    /// Per-head decoupled RoPE dims; the RoPE key is shared by all heads and cached.
    pub qk_rope_head_dim: i64,
    /// Per-head value dims.
    pub v_head_dim: i64,
    /// MLA (the fields above) or grouped-query attention.
    pub attention: Attention,
    /// Output gate on attention.
    pub attn_gate: AttnGate,
    /// Cross-layer attention residual: each layer after the first mixes earlier layers'
    /// attention outputs back in through a zero-initialised residual.
    pub cross_layer_residual: bool,
    /// Token shift into the latent ("smeared keys"): a layer's latent and RoPE key also see
    /// the previous token's layer input through a zero-initialised projection, so a key can
    /// carry "what came before me" — the feature an induction head (content-addressed
    /// copying) needs, which plain attention must first build in an earlier layer. How far back
    /// it reaches is `latent_shift_taps`.
    pub latent_token_shift: bool,
    /// How many previous tokens the shift reaches (1–4; read only with `latent_token_shift`):
    /// tap `k` feeds the input `k` tokens back through its own zero-initialised projection,
    /// so one key can carry a short n-gram such as `": "` before a value to copy. Decoding
    /// caches that many inputs per row and latent layer.
    pub latent_shift_taps: i64,
    /// Token shift into the query ("smeared queries"): each head's query also sees the
    /// previous token's layer input through a zero-initialised projection. With smeared keys
    /// alone a first-layer query knows only its own token, so copying a path with a doubled
    /// letter (`mm3`) finds two keys that follow an `m` and may take the wrong one; a query
    /// that also knows the token before it tells them apart. Needs `latent_token_shift` (the
    /// previous input is the one the latent shift caches) and `cla_factor = 1`.
    pub query_token_shift: bool,
    /// CLA factor: this many adjacent layers share one latent cache (1 = no sharing).
    pub cla_factor: i64,
    /// RoPE base.
    pub rope_theta: f64,
    /// RoPE scaling for long context.
    pub rope_scaling: RopeScaling,
    /// Longest position the RoPE tables cover.
    pub max_position_embeddings: i64,
    /// Leading layers with a dense FFN instead of MoE.
    pub first_k_dense_replace: i64,
    /// Further layers with a dense FFN, by index (Qwen3-MoE `mlp_only_layers`).
    pub mlp_only_layers: Vec<i64>,
    /// Past `first_k_dense_replace`, layer `i` is MoE only when `(i + 1)` is a multiple of this
    /// (Qwen3-MoE `decoder_sparse_step`; 1: every layer).
    pub decoder_sparse_step: i64,
    /// Width of the dense FFN in the leading dense layers.
    pub intermediate_size: i64,
    /// Routed experts E; 0 makes every layer dense (Qwen3) and the MoE fields unused.
    pub n_routed_experts: i64,
    /// Shared experts (always on), merged into one FFN of width `n_shared · moe_intermediate`.
    pub n_shared_experts: i64,
    /// Routed experts per token k.
    pub num_experts_per_tok: i64,
    /// Width F of each expert.
    pub moe_intermediate_size: i64,
    /// Expert groups for group-limited routing (DeepSeek-V3 `n_group`; 1 = no limit): a
    /// token first picks its `topk_group` best groups, each scored by the sum of its two best
    /// biased scores, then its experts from those groups only.
    pub n_group: i64,
    /// Groups a token may route to (`topk_group`; at most `n_group`).
    pub topk_group: i64,
    /// Router score function.
    pub scoring_func: ScoreFunc,
    /// Renormalise the top-k weights to sum to one.
    pub norm_topk_prob: bool,
    /// Multiplier on the routed output (DeepSeek-V3 uses 2.5 with 8 of 256).
    pub routed_scaling_factor: f64,
    /// Std of Gaussian noise added to router logits for selection, in training only (0 = off).
    /// SFT only: RL turns it off (its ratio and KL compare policies scored without noise).
    pub router_noise_std: f64,
    /// Expert activation.
    pub expert_act: ExpertAct,
    /// Multiplier on the expert gate pre-activation ("tuned gate scaling"; 1 = plain).
    pub expert_gate_scale: f64,
    /// Init std of expert weights (truncated normal as in K3; 0.02).
    pub expert_init_std: f64,
    /// Expert evaluation path.
    pub expert_dispatch: ExpertDispatch,
    /// Balancing rule.
    pub balance: BalanceMode,
    /// α of the Switch auxiliary loss (used when `balance = aux_loss`).
    pub aux_loss_coef: f64,
    /// γ of the aux-free bias rule (DeepSeek-V3: 1e-3).
    pub bias_update_rate: f64,
    /// Router z-loss coefficient (ST-MoE: 1e-3; 0 = off).
    pub router_z_loss_coef: f64,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// Epsilon of the low-rank query's and the latent's RMSNorms (`q_a_layernorm`,
    /// `kv_a_layernorm`) when it differs from `rms_norm_eps`: transformers' DeepSeek-V3 builds
    /// those two with 1e-6 whatever the config says. `None`: `rms_norm_eps`.
    pub latent_norm_eps: Option<f64>,
    /// Share the embedding matrix with the output head.
    pub tie_word_embeddings: bool,
    /// Init std of the dense weights.
    pub initializer_range: f64,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self::tiny()
    }
}

impl ModelConfig {
    /// Checks every constraint the layers rely on; the error names the field and value.
    ///
    /// Besides the per-field rules, the whole model must stay within libtorch's sizes: at most
    /// [`MAX_ELEMENTS`](super::accounting::MAX_ELEMENTS) parameters (counted with checked
    /// arithmetic, [`ModelConfig::try_param_counts`]) and RoPE table entries. Whether the
    /// weights fit a device's memory is [`ModelConfig::check_fits`], which the model runs
    /// before it allocates.
    pub fn validate(&self) -> Result<(), ModelError> {
        self.try_param_counts()?;
        self.check_rope_size()
    }

    /// The per-field rules of [`ModelConfig::validate`] (signs, ranges, alignment, options).
    pub(crate) fn validate_fields(&self) -> Result<(), ModelError> {
        let bad = |field: &'static str, value: String, why: &'static str| {
            Err(ModelError::InvalidConfig {
                field,
                value,
                why: why.to_string(),
            })
        };
        let mut positive = vec![
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("cla_factor", self.cla_factor),
            ("max_position_embeddings", self.max_position_embeddings),
            ("intermediate_size", self.intermediate_size),
            ("decoder_sparse_step", self.decoder_sparse_step),
        ];
        if self.attention == Attention::Mla {
            positive.extend([
                ("kv_lora_rank", self.kv_lora_rank),
                ("qk_nope_head_dim", self.qk_nope_head_dim),
                ("v_head_dim", self.v_head_dim),
            ]);
        }
        if self.has_experts() {
            positive.extend([
                ("num_experts_per_tok", self.num_experts_per_tok),
                ("moe_intermediate_size", self.moe_intermediate_size),
            ]);
        }
        for (field, v) in positive {
            if v <= 0 {
                return bad(field, v.to_string(), "must be positive");
            }
        }
        if self.n_routed_experts < 0 {
            return bad(
                "n_routed_experts",
                self.n_routed_experts.to_string(),
                "must be >= 0 (0: a dense model)",
            );
        }
        if let Attention::Gqa {
            num_key_value_heads,
            head_dim,
            ..
        } = self.attention
        {
            if num_key_value_heads <= 0 || self.num_attention_heads % num_key_value_heads != 0 {
                return bad(
                    "attention.num_key_value_heads",
                    num_key_value_heads.to_string(),
                    "must be positive and divide num_attention_heads",
                );
            }
            if head_dim <= 0 || head_dim % 2 != 0 {
                return bad(
                    "attention.head_dim",
                    head_dim.to_string(),
                    "must be positive and even (RoPE rotates pairs)",
                );
            }
            let mla_only = [
                ("attn_gate", self.attn_gate != AttnGate::None),
                ("cla_factor", self.cla_factor != 1),
                ("latent_token_shift", self.latent_token_shift),
                ("query_token_shift", self.query_token_shift),
                ("q_lora_rank", self.q_lora_rank.is_some()),
            ];
            if let Some((field, _)) = mla_only.iter().find(|(_, on)| *on) {
                return bad(
                    field,
                    "set".into(),
                    "is a feature of MLA attention; grouped-query attention has none",
                );
            }
        }
        if self
            .mlp_only_layers
            .iter()
            .any(|&l| !(0..self.num_hidden_layers).contains(&l))
        {
            return bad(
                "mlp_only_layers",
                format!("{:?}", self.mlp_only_layers),
                "every entry must be a layer index in 0..num_hidden_layers",
            );
        }
        if self.qk_rope_head_dim < 0 || self.qk_rope_head_dim % 2 != 0 {
            return bad(
                "qk_rope_head_dim",
                self.qk_rope_head_dim.to_string(),
                "must be even and non-negative",
            );
        }
        if !(1..=4).contains(&self.latent_shift_taps) {
            return bad(
                "latent_shift_taps",
                self.latent_shift_taps.to_string(),
                "must be 1 to 4",
            );
        }
        if self.query_token_shift && (!self.latent_token_shift || self.cla_factor != 1) {
            return bad(
                "query_token_shift",
                "true".into(),
                "needs latent_token_shift = true and cla_factor = 1 (the query reads the previous input the latent shift caches)",
            );
        }
        if let Some(r) = self.q_lora_rank {
            if r <= 0 {
                return bad("q_lora_rank", r.to_string(), "must be positive or absent");
            }
        }
        // `_grouped_mm` needs 16-byte aligned rows: 8 elements covers bf16 and fp32.
        if self.hidden_size % 8 != 0 {
            return bad(
                "hidden_size",
                self.hidden_size.to_string(),
                "must be a multiple of 8 (grouped GEMM rows are 16-byte aligned)",
            );
        }
        if self.has_experts() {
            self.validate_experts()?;
        }
        if self.first_k_dense_replace < 0 || self.first_k_dense_replace > self.num_hidden_layers {
            return bad(
                "first_k_dense_replace",
                self.first_k_dense_replace.to_string(),
                "must be in 0..=num_hidden_layers",
            );
        }
        for (field, v) in [
            ("rope_theta", self.rope_theta),
            ("rms_norm_eps", self.rms_norm_eps),
            ("routed_scaling_factor", self.routed_scaling_factor),
            ("expert_gate_scale", self.expert_gate_scale),
            ("initializer_range", self.initializer_range),
            ("expert_init_std", self.expert_init_std),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return bad(field, v.to_string(), "must be finite and positive");
            }
        }
        for (field, v) in [
            ("router_noise_std", self.router_noise_std),
            ("aux_loss_coef", self.aux_loss_coef),
            ("bias_update_rate", self.bias_update_rate),
            ("router_z_loss_coef", self.router_z_loss_coef),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(field, v.to_string(), "must be finite and >= 0");
            }
        }
        match self.rope_scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor }
            | RopeScaling::Yarn { factor, .. }
            | RopeScaling::HfYarn { factor, .. }
                if !(factor >= 1.0 && factor.is_finite()) =>
            {
                return bad("rope_scaling.factor", factor.to_string(), "must be >= 1");
            }
            RopeScaling::Yarn {
                beta_fast,
                beta_slow,
                original_max_position_embeddings,
                ..
            }
            | RopeScaling::HfYarn {
                beta_fast,
                beta_slow,
                original_max_position_embeddings,
                ..
            } => {
                if beta_fast <= beta_slow {
                    return bad(
                        "rope_scaling.beta_fast",
                        beta_fast.to_string(),
                        "must exceed beta_slow",
                    );
                }
                if original_max_position_embeddings <= 0 {
                    return bad(
                        "rope_scaling.original_max_position_embeddings",
                        original_max_position_embeddings.to_string(),
                        "must be positive",
                    );
                }
            }
            RopeScaling::Linear { .. } => {}
        }
        if let ExpertAct::SoftClipGlu { beta, beta_lin } = self.expert_act {
            if !(beta > 0.0 && beta_lin > 0.0) {
                return bad(
                    "expert_act.beta",
                    format!("{beta}/{beta_lin}"),
                    "must be positive",
                );
            }
        }
        Ok(())
    }

    /// The rules of the routed experts, for a config that has them.
    fn validate_experts(&self) -> Result<(), ModelError> {
        let bad = |field: &'static str, value: String, why: &'static str| {
            Err(ModelError::InvalidConfig {
                field,
                value,
                why: why.to_string(),
            })
        };
        if self.moe_intermediate_size % 8 != 0 {
            return bad(
                "moe_intermediate_size",
                self.moe_intermediate_size.to_string(),
                "must be a multiple of 8 (grouped GEMM rows are 16-byte aligned)",
            );
        }
        if self.num_experts_per_tok >= self.n_routed_experts {
            return bad(
                "num_experts_per_tok",
                self.num_experts_per_tok.to_string(),
                "must be below n_routed_experts (quantile balancing reads the (k+1)-th score)",
            );
        }
        if self.n_group <= 0 || self.n_routed_experts % self.n_group != 0 {
            return bad(
                "n_group",
                self.n_group.to_string(),
                "must be positive and divide n_routed_experts",
            );
        }
        if self.n_group > 1 && self.n_routed_experts / self.n_group < 2 {
            return bad(
                "n_group",
                self.n_group.to_string(),
                "must leave at least 2 experts per group (a group is scored by its two best)",
            );
        }
        if !(1..=self.n_group).contains(&self.topk_group)
            || self.topk_group * (self.n_routed_experts / self.n_group) < self.num_experts_per_tok
        {
            return bad(
                "topk_group",
                self.topk_group.to_string(),
                "must be in 1..=n_group and its groups must hold num_experts_per_tok experts",
            );
        }
        if self.n_shared_experts < 0 {
            return bad(
                "n_shared_experts",
                self.n_shared_experts.to_string(),
                "must be >= 0",
            );
        }
        Ok(())
    }

    /// Epsilon of the `q_a_layernorm` and `kv_a_layernorm` RMSNorms.
    pub fn latent_eps(&self) -> f64 {
        self.latent_norm_eps.unwrap_or(self.rms_norm_eps)
    }

    /// Query/key head dim: nope + rope.
    pub fn qk_head_dim(&self) -> i64 {
        self.qk_nope_head_dim.saturating_add(self.qk_rope_head_dim)
    }

    /// Whether the model has routed experts (false: every layer is dense).
    pub fn has_experts(&self) -> bool {
        self.n_routed_experts > 0
    }

    /// Whether layer `i` uses the MoE FFN (false: dense): past `first_k_dense_replace`, not
    /// in `mlp_only_layers`, and on a `decoder_sparse_step`.
    pub fn is_moe_layer(&self, i: i64) -> bool {
        self.has_experts()
            && i >= self.first_k_dense_replace
            && !self.mlp_only_layers.contains(&i)
            && (i + 1) % self.decoder_sparse_step.max(1) == 0
    }

    /// How many layers are MoE, in closed form (no loop over the layers).
    pub fn n_moe_layers(&self) -> i64 {
        if !self.has_experts() {
            return 0;
        }
        let (l, step) = (
            self.num_hidden_layers.max(0),
            self.decoder_sparse_step.max(1),
        );
        let fk = self.first_k_dense_replace.clamp(0, l);
        // Layers i in fk..l with (i + 1) % step == 0: multiples of step in fk+1..=l.
        let on_step = l / step - fk / step;
        let mut only = self.mlp_only_layers.clone();
        only.sort_unstable();
        only.dedup();
        let kept_dense = only
            .iter()
            .filter(|&&i| (fk..l).contains(&i) && (i + 1) % step == 0)
            .count() as i64;
        on_step - kept_dense
    }

    /// Width of the rotary part of a query/key head: `qk_rope_head_dim` (MLA) or the whole
    /// head (GQA).
    pub fn rope_dim(&self) -> i64 {
        match self.attention {
            Attention::Mla => self.qk_rope_head_dim,
            Attention::Gqa { head_dim, .. } => head_dim,
        }
    }

    /// The widths of a cache layer's two tensors per token: the latent and the RoPE key
    /// (MLA), or every key head and every value head (GQA).
    pub fn cache_widths(&self) -> (i64, i64) {
        match self.attention {
            Attention::Mla => (self.kv_lora_rank, self.qk_rope_head_dim),
            Attention::Gqa {
                num_key_value_heads,
                head_dim,
                ..
            } => {
                let w = num_key_value_heads.saturating_mul(head_dim);
                (w, w)
            }
        }
    }

    /// Taps of the latent token shift: `latent_shift_taps` with the shift on, else 0.
    pub fn shift_taps(&self) -> usize {
        if self.latent_token_shift {
            self.latent_shift_taps.max(0) as usize
        } else {
            0
        }
    }

    /// Whether layer `i` computes its own latent (true) or reuses the previous layer's (CLA).
    pub fn owns_latent(&self, i: i64) -> bool {
        i % self.cla_factor == 0
    }

    /// Number of latent caches (layers that own a latent).
    pub fn n_latent_layers(&self) -> i64 {
        let (l, cla) = (self.num_hidden_layers, self.cla_factor.max(1));
        // ceil(l / cla) without `l + cla - 1`, which can overflow.
        l / cla + i64::from(l % cla != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_names_field_and_value() {
        let cfg = ModelConfig {
            moe_intermediate_size: 130,
            ..ModelConfig::tiny()
        };
        let msg = cfg.validate().unwrap_err().to_string();
        assert!(
            msg.contains("moe_intermediate_size") && msg.contains("130"),
            "{msg}"
        );
        // The query shift reads the input the latent shift caches: without it, refused.
        for cfg in [
            ModelConfig {
                query_token_shift: true,
                ..ModelConfig::tiny()
            },
            ModelConfig {
                query_token_shift: true,
                latent_token_shift: true,
                cla_factor: 2,
                ..ModelConfig::tiny()
            },
        ] {
            let msg = cfg.validate().unwrap_err().to_string();
            assert!(msg.contains("query_token_shift"), "{msg}");
        }
    }
}
