//! The model configuration: one serde struct, three presets, a `validate()` that names the
//! field and the bad value, and the analytic accounting (parameters, FLOPs, cache bytes) that
//! `corvid model info` prints.
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
    /// Width of the dense FFN in the leading dense layers.
    pub intermediate_size: i64,
    /// Routed experts E.
    pub n_routed_experts: i64,
    /// Shared experts (always on), merged into one FFN of width `n_shared · moe_intermediate`.
    pub n_shared_experts: i64,
    /// Routed experts per token k.
    pub num_experts_per_tok: i64,
    /// Width F of each expert.
    pub moe_intermediate_size: i64,
    /// Router score function.
    pub scoring_func: ScoreFunc,
    /// Renormalise the top-k weights to sum to one.
    pub norm_topk_prob: bool,
    /// Multiplier on the routed output (DeepSeek-V3 uses 2.5 with 8 of 256).
    pub routed_scaling_factor: f64,
    /// Std of Gaussian noise added to router logits for selection, in training only (0 = off).
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
    /// The CPU demo: 2.0M parameters, 0.85M active, learns the hops task in minutes on 2 cores.
    /// Shapes follow `research/learning_feasibility.md` (d128, 4 layers, 4 heads of 32) with
    /// the FFN turned into 8 routed experts (top-2) plus one shared expert.
    pub fn tiny() -> Self {
        Self {
            vocab_size: 264,
            hidden_size: 128,
            num_hidden_layers: 4,
            num_attention_heads: 4,
            q_lora_rank: None,
            kv_lora_rank: 32,
            qk_nope_head_dim: 32,
            qk_rope_head_dim: 16,
            v_head_dim: 32,
            attn_gate: AttnGate::Headwise,
            cross_layer_residual: true,
            latent_token_shift: false,
            latent_shift_taps: 1,
            query_token_shift: false,
            cla_factor: 1,
            rope_theta: 10_000.0,
            rope_scaling: RopeScaling::None,
            max_position_embeddings: 4096,
            first_k_dense_replace: 0,
            intermediate_size: 512,
            n_routed_experts: 8,
            n_shared_experts: 1,
            num_experts_per_tok: 2,
            moe_intermediate_size: 128,
            scoring_func: ScoreFunc::Sigmoid,
            norm_topk_prob: true,
            routed_scaling_factor: 1.0,
            router_noise_std: 0.0,
            expert_act: ExpertAct::Swiglu,
            expert_gate_scale: 1.0,
            expert_init_std: 0.02,
            // CPU: PyTorch 2.11's `_grouped_mm` is a fallback, measured ~7x slower than
            // per-expert matmuls at these shapes (2 threads); k3-shape (GPU) keeps grouped_mm.
            expert_dispatch: ExpertDispatch::Loop,
            balance: BalanceMode::Quantile,
            aux_loss_coef: 1e-2,
            bias_update_rate: 1e-3,
            router_z_loss_coef: 0.0,
            rms_norm_eps: 1e-6,
            tie_word_embeddings: true,
            initializer_range: 0.02,
        }
    }

    /// A larger CPU/GPU model: d256, 6 layers, 8 heads, low-rank query, 16 experts top-2 plus
    /// one shared, one leading dense layer, element-wise gate and CLA2.
    pub fn small() -> Self {
        Self {
            hidden_size: 256,
            num_hidden_layers: 6,
            num_attention_heads: 8,
            q_lora_rank: Some(128),
            kv_lora_rank: 48,
            qk_nope_head_dim: 32,
            qk_rope_head_dim: 16,
            v_head_dim: 32,
            attn_gate: AttnGate::Elementwise,
            cla_factor: 2,
            max_position_embeddings: 8192,
            first_k_dense_replace: 1,
            intermediate_size: 1024,
            n_routed_experts: 16,
            n_shared_experts: 1,
            num_experts_per_tok: 2,
            moe_intermediate_size: 256,
            expert_act: ExpertAct::SoftClipGlu {
                beta: 4.0,
                beta_lin: 25.0,
            },
            ..Self::tiny()
        }
    }

    /// The proportions of the 896-expert, top-16, 2-shared-expert design (Kimi K3 sizes, all
    /// layers MLA): for parameter, FLOP and cache accounting only, never trained here.
    pub fn k3_shape() -> Self {
        Self {
            vocab_size: 163_840,
            hidden_size: 7168,
            num_hidden_layers: 93,
            num_attention_heads: 96,
            q_lora_rank: Some(1536),
            kv_lora_rank: 512,
            qk_nope_head_dim: 128,
            qk_rope_head_dim: 64,
            v_head_dim: 128,
            attn_gate: AttnGate::Elementwise,
            cross_layer_residual: true,
            latent_token_shift: false,
            latent_shift_taps: 1,
            query_token_shift: false,
            cla_factor: 1,
            max_position_embeddings: 262_144,
            first_k_dense_replace: 1,
            intermediate_size: 18_432,
            n_routed_experts: 896,
            n_shared_experts: 2,
            num_experts_per_tok: 16,
            moe_intermediate_size: 3072,
            scoring_func: ScoreFunc::Sigmoid,
            expert_act: ExpertAct::SoftClipGlu {
                beta: 4.0,
                beta_lin: 25.0,
            },
            tie_word_embeddings: false,
            expert_dispatch: ExpertDispatch::GroupedMm,
            ..Self::tiny()
        }
    }

    /// The one-GPU training shape of `corvid bench gpu`: 0.99B parameters in total, 0.20B
    /// active (d1024, 10 layers of which 9 MoE with 32 experts of width 1024, top-4, one
    /// shared expert; 16 heads of nope 64 / RoPE 32 / value 64 on a 256-wide latent). Widths
    /// are multiples of 32 (the tensor-core decode kernel and 16-byte grouped GEMM rows); the
    /// RoPE table covers 64K positions for the 32K-context decode measurement.
    pub fn gpu_1b() -> Self {
        Self {
            vocab_size: 264,
            hidden_size: 1024,
            num_hidden_layers: 10,
            num_attention_heads: 16,
            q_lora_rank: Some(512),
            kv_lora_rank: 256,
            qk_nope_head_dim: 64,
            qk_rope_head_dim: 32,
            v_head_dim: 64,
            attn_gate: AttnGate::Elementwise,
            cross_layer_residual: true,
            latent_token_shift: false,
            latent_shift_taps: 1,
            query_token_shift: false,
            cla_factor: 1,
            max_position_embeddings: 65_536,
            first_k_dense_replace: 1,
            intermediate_size: 4096,
            n_routed_experts: 32,
            n_shared_experts: 1,
            num_experts_per_tok: 4,
            moe_intermediate_size: 1024,
            expert_act: ExpertAct::SoftClipGlu {
                beta: 4.0,
                beta_lin: 25.0,
            },
            expert_dispatch: ExpertDispatch::GroupedMm,
            ..Self::tiny()
        }
    }

    /// A preset by name: `tiny`, `small`, `k3-shape` or `gpu-1b`.
    pub fn preset(name: &str) -> Result<Self, ModelError> {
        match name {
            "tiny" => Ok(Self::tiny()),
            "small" => Ok(Self::small()),
            "k3-shape" | "k3_shape" => Ok(Self::k3_shape()),
            "gpu-1b" | "gpu_1b" => Ok(Self::gpu_1b()),
            other => Err(ModelError::UnknownPreset(other.to_string())),
        }
    }

    /// Parses TOML (missing fields default to `tiny`) and validates.
    pub fn from_toml(text: &str) -> Result<Self, ModelError> {
        let cfg: Self = toml::from_str(text).map_err(|e| ModelError::ConfigParse(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks every constraint the layers rely on; the error names the field and value.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |field: &'static str, value: String, why: &'static str| {
            Err(ModelError::InvalidConfig { field, value, why })
        };
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("kv_lora_rank", self.kv_lora_rank),
            ("qk_nope_head_dim", self.qk_nope_head_dim),
            ("v_head_dim", self.v_head_dim),
            ("cla_factor", self.cla_factor),
            ("max_position_embeddings", self.max_position_embeddings),
            ("n_routed_experts", self.n_routed_experts),
            ("num_experts_per_tok", self.num_experts_per_tok),
            ("moe_intermediate_size", self.moe_intermediate_size),
            ("intermediate_size", self.intermediate_size),
        ];
        for (field, v) in positive {
            if v <= 0 {
                return bad(field, v.to_string(), "must be positive");
            }
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
        if self.n_shared_experts < 0 {
            return bad(
                "n_shared_experts",
                self.n_shared_experts.to_string(),
                "must be >= 0",
            );
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
            RopeScaling::Linear { factor } | RopeScaling::Yarn { factor, .. } if factor < 1.0 => {
                return bad("rope_scaling.factor", factor.to_string(), "must be >= 1");
            }
            RopeScaling::Yarn {
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

    /// Query/key head dim: nope + rope.
    pub fn qk_head_dim(&self) -> i64 {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// Whether layer `i` uses the MoE FFN (false: dense).
    pub fn is_moe_layer(&self, i: i64) -> bool {
        i >= self.first_k_dense_replace
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
        (self.num_hidden_layers + self.cla_factor - 1) / self.cla_factor
    }

    /// Exact parameter counts, matching the variables `MoePolicy::new` creates (tested).
    pub fn param_counts(&self) -> ParamCounts {
        let d = self.hidden_size;
        let h = self.num_attention_heads;
        let (nope, rope, v) = (
            self.qk_nope_head_dim,
            self.qk_rope_head_dim,
            self.v_head_dim,
        );
        let c = self.kv_lora_rank;
        let q = match self.q_lora_rank {
            None => h * (nope + rope) * d,
            Some(r) => r * d + r + h * (nope + rope) * r,
        };
        let q_shift = match (self.query_token_shift, self.q_lora_rank) {
            (false, _) => 0,
            (true, None) => h * (nope + rope) * d,
            (true, Some(r)) => r * d,
        };
        let q = q + q_shift;
        let gate = match self.attn_gate {
            AttnGate::None => 0,
            AttnGate::Headwise => h * d,
            AttnGate::Elementwise => h * v * d,
        };
        let shift = self.shift_taps() as i64 * (c + rope) * d;
        let latent_a = (c + rope) * d + c + shift;
        let attn_common = q + c * h * (nope + v) + d * h * v + gate + 2 * d; // + 2 norms
        let (mut total, mut active) = (0i64, 0i64);
        let f = self.moe_intermediate_size;
        for i in 0..self.num_hidden_layers {
            let mut layer = attn_common;
            if self.owns_latent(i) {
                layer += latent_a;
            }
            if self.cross_layer_residual && i > 0 {
                layer += 2 * d;
            }
            if self.is_moe_layer(i) {
                let router = self.n_routed_experts * d;
                let shared = 3 * d * f * self.n_shared_experts;
                let per_expert = 3 * d * f;
                total += layer + router + shared + self.n_routed_experts * per_expert;
                active += layer + router + shared + self.num_experts_per_tok * per_expert;
            } else {
                let dense = 3 * d * self.intermediate_size;
                total += layer + dense;
                active += layer + dense;
            }
        }
        let embed = self.vocab_size * d;
        let head = if self.tie_word_embeddings {
            0
        } else {
            self.vocab_size * d
        };
        total += embed + head + d;
        active += embed + head + d;
        ParamCounts {
            total,
            active,
            embedding: embed + head,
        }
    }

    /// Forward FLOPs per token at context `ctx`: 2·(active non-embedding params + head) plus
    /// the attention score/value products, 2·H·(d_qk + d_v)·ctx per layer (full attention over
    /// `ctx` earlier tokens; a training token averages ctx/2 under the causal mask).
    pub fn flops_per_token(&self, ctx: i64) -> f64 {
        let p = self.param_counts();
        // The embedding is a lookup (no FLOPs); the head matmul runs even when tied.
        let matmul_params = p.active - p.embedding + self.vocab_size * self.hidden_size;
        let attn = 2 * self.num_attention_heads * (self.qk_head_dim() + self.v_head_dim) * ctx;
        2.0 * matmul_params as f64 + (attn * self.num_hidden_layers) as f64
    }

    /// Cached elements per token, summed over layers: latent + RoPE key per owning layer.
    pub fn cache_elems_per_token(&self) -> i64 {
        self.n_latent_layers() * (self.kv_lora_rank + self.qk_rope_head_dim)
    }

    /// Cached elements per token per layer for multi-head attention with the same head shape:
    /// a full K (d_qk) and V (d_v) for every head.
    pub fn mha_cache_elems_per_token_per_layer(&self) -> i64 {
        self.num_attention_heads * (self.qk_head_dim() + self.v_head_dim)
    }

    /// MHA cache bytes per token per layer over ours (CLA sharing included).
    pub fn kv_ratio_vs_mha(&self) -> f64 {
        let ours_per_layer = self.cache_elems_per_token() as f64 / self.num_hidden_layers as f64;
        self.mha_cache_elems_per_token_per_layer() as f64 / ours_per_layer
    }
}

/// Parameter counts from [`ModelConfig::param_counts`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ParamCounts {
    /// Every parameter.
    pub total: i64,
    /// Parameters one token touches (k routed experts, not E).
    pub active: i64,
    /// Embedding plus untied output head.
    pub embedding: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_validate() {
        for p in ["tiny", "small", "k3-shape", "gpu-1b"] {
            ModelConfig::preset(p).unwrap().validate().unwrap();
        }
    }

    #[test]
    fn gpu_1b_is_about_one_billion_parameters() {
        let p = ModelConfig::gpu_1b().param_counts();
        assert!(
            (0.9e9..1.1e9).contains(&(p.total as f64)),
            "total {}",
            p.total
        );
        assert!(p.active < p.total / 4, "active {}", p.active);
    }

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

    #[test]
    fn toml_defaults_to_tiny() {
        let cfg =
            ModelConfig::from_toml("hidden_size = 64\nattn_gate = \"elementwise\"\n").unwrap();
        assert_eq!(cfg.hidden_size, 64);
        assert_eq!(cfg.num_hidden_layers, ModelConfig::tiny().num_hidden_layers);
        assert!(ModelConfig::from_toml("hidden_sise = 64").is_err());
    }

    #[test]
    fn k3_cache_is_far_below_mha() {
        assert!(ModelConfig::k3_shape().kv_ratio_vs_mha() > 50.0);
    }
}
