//! The model configuration: one serde struct, three presets, a `validate()` that names the
//! field and the bad value, and the analytic accounting (parameters, FLOPs, cache bytes) that
//! `corvid model info` prints.
//!
//! Field names follow the Hugging Face DeepSeek-V3 config where one exists (`kv_lora_rank`,
//! `qk_rope_head_dim`, `n_routed_experts`, `first_k_dense_replace`, ...), so a reader who knows
//! those checkpoints can read ours.

use serde::{Deserialize, Serialize};
use tch::{Device, Kind};

use super::ModelError;

/// The most parameters a config may have, and the most entries its RoPE tables may have: at
/// 8 bytes each (f64, the widest dtype a model is cast to) their bytes still fit the `i64`
/// sizes libtorch keeps, so no tensor dimension, element count or byte count can overflow.
/// [`ModelConfig::validate`] refuses configs past it, naming the field that drives the size.
pub const MAX_ELEMENTS: i64 = i64::MAX / 8;

/// Bytes per parameter as [`MoePolicy::new`](super::MoePolicy::new) creates them: fp32 (the
/// bf16 cast of [`MoePolicy::new_in_kind`](super::MoePolicy::new_in_kind) comes after).
pub const BUILD_BYTES_PER_PARAM: u64 = 4;

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
    ///
    /// Besides the per-field rules, the whole model must stay within libtorch's sizes: at most
    /// [`MAX_ELEMENTS`] parameters (counted with checked arithmetic,
    /// [`ModelConfig::try_param_counts`]) and RoPE table entries. Whether the weights fit a
    /// device's memory is [`ModelConfig::check_fits`], which the model runs before it allocates.
    pub fn validate(&self) -> Result<(), ModelError> {
        self.try_param_counts()?;
        self.check_rope_size()
    }

    /// The per-field rules of [`ModelConfig::validate`] (signs, ranges, alignment, options).
    fn validate_fields(&self) -> Result<(), ModelError> {
        let bad = |field: &'static str, value: String, why: &'static str| {
            Err(ModelError::InvalidConfig {
                field,
                value,
                why: why.to_string(),
            })
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
        self.qk_nope_head_dim.saturating_add(self.qk_rope_head_dim)
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
        let (l, cla) = (self.num_hidden_layers, self.cla_factor.max(1));
        // ceil(l / cla) without `l + cla - 1`, which can overflow.
        l / cla + i64::from(l % cla != 0)
    }

    /// The parameter groups `MoePolicy::new` creates, in closed form over the layers: each is
    /// a constant times a product of config values, so a huge value is counted (and refused)
    /// without building or looping over anything.
    fn param_parts(&self) -> Vec<Part> {
        let f = Factor::field;
        let l = self.num_hidden_layers;
        let fk = self.first_k_dense_replace.clamp(0, l);
        let layers = f("num_hidden_layers", l);
        let layers_of = |n: i64, label| Factor::counted("num_hidden_layers", l, n.into(), label);
        let moe_layers = layers_of(
            l - fk,
            "MoE layers (num_hidden_layers - first_k_dense_replace)",
        );
        let dense_layers = f("first_k_dense_replace", fk);
        let latent_layers = layers_of(
            self.n_latent_layers(),
            "latent layers (num_hidden_layers / cla_factor)",
        );
        let cross_n = if self.cross_layer_residual { l - 1 } else { 0 };
        let cross_layers = layers_of(cross_n, "(num_hidden_layers - 1)");
        let d = f("hidden_size", self.hidden_size);
        let v_size = f("vocab_size", self.vocab_size);
        let h = f("num_attention_heads", self.num_attention_heads);
        let nope = f("qk_nope_head_dim", self.qk_nope_head_dim);
        let rope = f("qk_rope_head_dim", self.qk_rope_head_dim);
        let v = f("v_head_dim", self.v_head_dim);
        let c = f("kv_lora_rank", self.kv_lora_rank);
        let qk = Factor::sum(nope, rope, "(qk_nope_head_dim + qk_rope_head_dim)");
        let c_rope = Factor::sum(c, rope, "(kv_lora_rank + qk_rope_head_dim)");
        let e = f("n_routed_experts", self.n_routed_experts);
        let ff = f("moe_intermediate_size", self.moe_intermediate_size);
        let part = Part::new;
        let mut parts = vec![part("the token embedding", 1, &[v_size, d]).embedding()];
        if !self.tie_word_embeddings {
            parts.push(part("the output head", 1, &[v_size, d]).embedding());
        }
        parts.push(part("the final norm", 1, &[d]));
        match self.q_lora_rank {
            None => parts.push(part("the query projections", 1, &[layers, h, qk, d])),
            Some(r) => {
                let r = f("q_lora_rank", r);
                parts.push(part("the low-rank query projections", 1, &[layers, r, d]));
                parts.push(part("the low-rank query norms", 1, &[layers, r]));
                parts.push(part("the query up-projections", 1, &[layers, h, qk, r]));
            }
        }
        if self.query_token_shift {
            match self.q_lora_rank {
                None => parts.push(part("the query shifts", 1, &[layers, h, qk, d])),
                Some(r) => parts.push(part(
                    "the query shifts",
                    1,
                    &[layers, f("q_lora_rank", r), d],
                )),
            }
        }
        match self.attn_gate {
            AttnGate::None => {}
            AttnGate::Headwise => parts.push(part("the attention gates", 1, &[layers, h, d])),
            AttnGate::Elementwise => parts.push(part("the attention gates", 1, &[layers, h, v, d])),
        }
        parts.push(part(
            "the key/value up-projections",
            1,
            &[
                layers,
                c,
                h,
                Factor::sum(nope, v, "(qk_nope_head_dim + v_head_dim)"),
            ],
        ));
        parts.push(part(
            "the attention output projections",
            1,
            &[layers, h, v, d],
        ));
        parts.push(part("the layer norms", 2, &[layers, d]));
        parts.push(part(
            "the latent projections",
            1,
            &[latent_layers, c_rope, d],
        ));
        parts.push(part("the latent norms", 1, &[latent_layers, c]));
        let taps = self.shift_taps() as i128;
        if taps > 0 {
            parts.push(part("the latent shifts", taps, &[latent_layers, c_rope, d]));
        }
        parts.push(part("the cross-layer residuals", 2, &[cross_layers, d]));
        parts.push(part("the routers", 1, &[moe_layers, e, d]));
        parts.push(part(
            "the shared experts",
            3,
            &[
                moe_layers,
                f("n_shared_experts", self.n_shared_experts),
                ff,
                d,
            ],
        ));
        parts.push(part("the routed experts", 3, &[moe_layers, e, d, ff]).routed());
        parts.push(part(
            "the dense FFNs",
            3,
            &[
                dense_layers,
                d,
                f("intermediate_size", self.intermediate_size),
            ],
        ));
        parts
    }

    /// Exact parameter counts, matching the variables `MoePolicy::new` creates (tested),
    /// computed with checked arithmetic. Refuses (naming the field that drives the size, with
    /// its value) a config that breaks a rule of [`ModelConfig::validate`] or whose count
    /// passes [`MAX_ELEMENTS`]; nothing overflows whatever the values.
    pub fn try_param_counts(&self) -> Result<ParamCounts, ModelError> {
        // The counting below relies on the signs and ranges these rules guarantee.
        self.validate_fields()?;
        let parts = self.param_parts();
        let max = i128::from(MAX_ELEMENTS);
        let k = i128::from(self.num_experts_per_tok);
        let e = i128::from(self.n_routed_experts);
        let (mut total, mut active, mut embedding) = (Some(0i128), Some(0i128), 0i128);
        for p in &parts {
            let n = p.count().filter(|&n| n <= max);
            total = total.zip(n).and_then(|(t, n)| t.checked_add(n));
            // k of the E routed experts per token (k < E, so this cannot exceed `n`).
            let n_active = if p.routed { n.map(|n| n / e * k) } else { n };
            active = active.zip(n_active).and_then(|(a, n)| a.checked_add(n));
            if p.embedding {
                embedding += n.unwrap_or(0);
            }
        }
        match (total, active) {
            (Some(total), Some(active)) if total <= max => Ok(ParamCounts {
                total: total as i64,
                active: active as i64,
                embedding: embedding as i64,
            }),
            _ => {
                let approx: f64 = parts.iter().map(Part::approx).sum();
                let p = largest_part(&parts);
                let x = p.largest();
                Err(ModelError::InvalidConfig {
                    field: x.field,
                    value: x.value.to_string(),
                    why: format!(
                        "the model would have {approx:.3e} parameters, more than the \
                         {MAX_ELEMENTS} libtorch can size (their bytes must fit an i64); \
                         the largest part is {} ({} = {:.3e})",
                        p.what,
                        p.expr(),
                        p.approx()
                    ),
                })
            }
        }
    }

    /// [`ModelConfig::try_param_counts`] for a config that passed [`ModelConfig::validate`]
    /// (the presets, every parsed or loaded config). A config it refuses gets every count
    /// saturated at `i64::MAX` instead of a panic.
    pub fn param_counts(&self) -> ParamCounts {
        self.try_param_counts().unwrap_or(ParamCounts {
            total: i64::MAX,
            active: i64::MAX,
            embedding: i64::MAX,
        })
    }

    /// The RoPE tables are built in f64 on the CPU: `max_position_embeddings` positions times
    /// `qk_rope_head_dim / 2 + 1` entries must stay within [`MAX_ELEMENTS`].
    fn check_rope_size(&self) -> Result<(), ModelError> {
        let per_pos = i128::from(self.qk_rope_head_dim / 2 + 1);
        let n = i128::from(self.max_position_embeddings) * per_pos;
        if n > i128::from(MAX_ELEMENTS) {
            return Err(ModelError::InvalidConfig {
                field: "max_position_embeddings",
                value: self.max_position_embeddings.to_string(),
                why: format!(
                    "the RoPE tables would have {n} entries (max_position_embeddings x \
                     (qk_rope_head_dim / 2 + 1)), more than the {MAX_ELEMENTS} libtorch can size"
                ),
            });
        }
        Ok(())
    }

    /// What building this model takes, in bytes, before any tensor exists: the parameters at
    /// `max(4, size of kind)` bytes each (fp32 as built, or the wider dtype they are cast to),
    /// the fp32 router biases, and the f64 RoPE tables (computed on the CPU, then kept on the
    /// model's device). Validates first.
    pub fn build_bytes(&self, kind: Kind) -> Result<BuildBytes, ModelError> {
        // `validate`, counting the parameters once.
        let p = self.try_param_counts()?;
        self.check_rope_size()?;
        let per_param = BUILD_BYTES_PER_PARAM.max(kind.elt_size_in_bytes() as u64);
        // Validated: every value below is non-negative and their products fit MAX_ELEMENTS.
        let moe_layers = (self.num_hidden_layers - self.first_k_dense_replace) as u128;
        let positions = self.max_position_embeddings as u128;
        let half = (self.qk_rope_head_dim / 2) as u128;
        Ok(BuildBytes {
            params: p.total,
            bytes_per_param: per_param,
            weights: p.total as u128 * u128::from(per_param),
            router_biases: moe_layers * self.n_routed_experts as u128 * 4,
            rope_device: 2 * positions * half * 8,
            rope_host: positions * (1 + 3 * half) * 8,
        })
    }

    /// Refuses, before anything is allocated, a config whose weights cannot fit the memory of
    /// `device` (built in `kind`, see [`ModelConfig::build_bytes`]), and a CUDA device libtorch
    /// does not see. The memory is the CPU's `MemTotal` (`/proc/meminfo`) or the CUDA device's
    /// total memory (from the driver); where it cannot be read, only the size rules of
    /// [`ModelConfig::validate`] apply. [`MoePolicy::new`](super::MoePolicy::new) runs this.
    pub fn check_fits(&self, device: Device, kind: Kind) -> Result<(), ModelError> {
        let need = self.build_bytes(kind)?;
        let host = host_memory_bytes().map(|b| (b, "MemTotal in /proc/meminfo"));
        match device {
            Device::Cpu => self.check_memory(
                &need,
                need.weights + need.router_biases,
                need.rope_host,
                "cpu",
                host,
            ),
            Device::Cuda(i) => {
                let count = tch::Cuda::device_count();
                if i as i64 >= count {
                    return Err(ModelError::Device(format!(
                        "the model is to be built on cuda:{i}, but libtorch sees {count} CUDA \
                         device(s)"
                    )));
                }
                let total = super::cuda::runtime::device_total_memory(i);
                self.check_memory(
                    &need,
                    need.weights + need.router_biases,
                    need.rope_device,
                    &format!("cuda:{i}"),
                    total.map(|b| (b, "total memory from the CUDA driver")),
                )?;
                // The RoPE tables are computed on the host before they move to the device.
                self.check_memory(&need, 0, need.rope_host, "cpu", host)
            }
            _ => Ok(()),
        }
    }

    /// Refuses `weights + tables` bytes on `device`, whose memory is `limit` (bytes, and where
    /// that figure comes from; `None`: unknown, nothing refused). The error names the field
    /// that drives the larger of the two.
    fn check_memory(
        &self,
        need: &BuildBytes,
        weights: u128,
        tables: u128,
        device: &str,
        limit: Option<(u64, &str)>,
    ) -> Result<(), ModelError> {
        let Some((limit, source)) = limit else {
            return Ok(());
        };
        let bytes = weights + tables;
        if bytes <= u128::from(limit) {
            return Ok(());
        }
        let (field, value, largest) = if tables > weights {
            let what = format!(
                "the f64 RoPE tables (max_position_embeddings x qk_rope_head_dim / 2 entries, {})",
                fmt_bytes(tables)
            );
            (
                "max_position_embeddings",
                self.max_position_embeddings,
                what,
            )
        } else {
            let parts = self.param_parts();
            let p = largest_part(&parts);
            let x = p.largest();
            let what = format!("{} ({} = {:.3e} parameters)", p.what, p.expr(), p.approx());
            (x.field, x.value, what)
        };
        let breakdown = if weights > 0 {
            format!(
                "{} parameters x {} bytes = {}, plus {} of RoPE tables and router biases",
                need.params,
                need.bytes_per_param,
                fmt_bytes(need.weights),
                fmt_bytes(bytes - need.weights)
            )
        } else {
            "the RoPE tables, computed in f64 on the host".to_string()
        };
        Err(ModelError::TooLarge {
            device: device.to_string(),
            field,
            detail: format!(
                "{field} = {value}: building the model takes {} on {device} ({breakdown}), \
                 more than the {} of memory it has ({source}); the largest part is {largest}",
                fmt_bytes(bytes),
                fmt_bytes(u128::from(limit)),
            ),
        })
    }

    /// Forward FLOPs per token at context `ctx`: 2·(active non-embedding params + head) plus
    /// the attention score/value products, 2·H·(d_qk + d_v)·ctx per layer (full attention over
    /// `ctx` earlier tokens; a training token averages ctx/2 under the causal mask).
    pub fn flops_per_token(&self, ctx: i64) -> f64 {
        let p = self.param_counts();
        // The embedding is a lookup (no FLOPs); the head matmul runs even when tied.
        let matmul_params =
            (p.active - p.embedding) as f64 + self.vocab_size as f64 * self.hidden_size as f64;
        let attn = 2.0
            * self.num_attention_heads as f64
            * (self.qk_head_dim() as f64 + self.v_head_dim as f64)
            * ctx as f64;
        2.0 * matmul_params + attn * self.num_hidden_layers as f64
    }

    /// Cached elements per token, summed over layers: latent + RoPE key per owning layer.
    pub fn cache_elems_per_token(&self) -> i64 {
        self.n_latent_layers()
            .saturating_mul(self.kv_lora_rank.saturating_add(self.qk_rope_head_dim))
    }

    /// Cached elements per token per layer for multi-head attention with the same head shape:
    /// a full K (d_qk) and V (d_v) for every head.
    pub fn mha_cache_elems_per_token_per_layer(&self) -> i64 {
        self.num_attention_heads
            .saturating_mul(self.qk_head_dim().saturating_add(self.v_head_dim))
    }

    /// MHA cache bytes per token per layer over ours (CLA sharing included).
    pub fn kv_ratio_vs_mha(&self) -> f64 {
        let ours_per_layer = self.cache_elems_per_token() as f64 / self.num_hidden_layers as f64;
        self.mha_cache_elems_per_token_per_layer() as f64 / ours_per_layer
    }
}

/// One factor of a parameter group: the config field errors name, its value, the number it
/// contributes (the MoE layers of `num_hidden_layers`, say, or `nope + rope`) and how the
/// group's formula shows it.
#[derive(Clone, Copy, Debug)]
struct Factor {
    field: &'static str,
    value: i64,
    n: i128,
    label: &'static str,
}

impl Factor {
    /// A config field as it is.
    fn field(field: &'static str, value: i64) -> Self {
        Self::counted(field, value, value.into(), field)
    }

    /// `n`, shown as `label`, derived from the field `field` of value `value`.
    fn counted(field: &'static str, value: i64, n: i128, label: &'static str) -> Self {
        Factor {
            field,
            value,
            n,
            label,
        }
    }

    /// `a + b` (two i64 fit an i128) shown as `label`, named after the larger.
    fn sum(a: Factor, b: Factor, label: &'static str) -> Self {
        let named = if b.n > a.n { b } else { a };
        Factor {
            n: a.n + b.n,
            label,
            ..named
        }
    }
}

/// A parameter group: `k` times the product of its factors.
#[derive(Clone, Debug)]
struct Part {
    what: &'static str,
    k: i128,
    factors: Vec<Factor>,
    /// Counted in [`ParamCounts::embedding`].
    embedding: bool,
    /// The routed experts: a token touches `num_experts_per_tok` of `n_routed_experts`.
    routed: bool,
}

impl Part {
    fn new(what: &'static str, k: i128, factors: &[Factor]) -> Self {
        Part {
            what,
            k,
            factors: factors.to_vec(),
            embedding: false,
            routed: false,
        }
    }

    fn embedding(self) -> Self {
        Part {
            embedding: true,
            ..self
        }
    }

    fn routed(self) -> Self {
        Part {
            routed: true,
            ..self
        }
    }

    /// The exact count; `None` past `i128`.
    fn count(&self) -> Option<i128> {
        if self.factors.iter().any(|f| f.n == 0) {
            return Some(0);
        }
        self.factors
            .iter()
            .try_fold(self.k, |acc, f| acc.checked_mul(f.n))
    }

    /// The count as a float (never overflows: a few factors below 2^64).
    fn approx(&self) -> f64 {
        self.factors
            .iter()
            .fold(self.k as f64, |acc, f| acc * f.n as f64)
    }

    /// The factor that drives the size: the largest.
    fn largest(&self) -> Factor {
        self.factors
            .iter()
            .copied()
            .max_by_key(|f| f.n)
            .unwrap_or(Factor::field("hidden_size", 0))
    }

    /// `num_hidden_layers x 3 x hidden_size x ...`.
    fn expr(&self) -> String {
        let mut names: Vec<String> = self.factors.iter().map(|f| f.label.to_string()).collect();
        if self.k != 1 {
            names.insert(1.min(names.len()), self.k.to_string());
        }
        names.join(" x ")
    }
}

/// The part with the most parameters.
fn largest_part(parts: &[Part]) -> &Part {
    parts
        .iter()
        .max_by(|a, b| a.approx().total_cmp(&b.approx()))
        .expect("a model has parts")
}

/// `MemTotal` of `/proc/meminfo` in bytes, where there is one.
pub fn host_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_total(&text)
}

/// The `MemTotal:  N kB` line of a `/proc/meminfo` text, in bytes.
fn parse_mem_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line["MemTotal:".len()..].split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    let unit = match words.next() {
        None => 1,
        Some(u) if u.eq_ignore_ascii_case("kb") => 1024,
        Some(_) => return None,
    };
    n.checked_mul(unit)
}

/// `1.5 GiB`.
fn fmt_bytes(bytes: u128) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut x = bytes as f64;
    let mut unit = 0;
    while x >= 1024.0 && unit + 1 < UNITS.len() {
        x /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{x:.1} {}", UNITS[unit])
    }
}

/// What building a model takes, from [`ModelConfig::build_bytes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuildBytes {
    /// Parameters ([`ParamCounts::total`]).
    pub params: i64,
    /// Bytes per parameter while building.
    pub bytes_per_param: u64,
    /// `params x bytes_per_param`.
    pub weights: u128,
    /// The fp32 router selection biases (not parameters: no gradient).
    pub router_biases: u128,
    /// The f64 RoPE cos/sin tables kept on the model's device.
    pub rope_device: u128,
    /// The f64 RoPE tables computed on the CPU while building (positions, angles, cos, sin).
    pub rope_host: u128,
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
    use proptest::prelude::Strategy as _;

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

    /// The loop the counting replaced (per layer, plain i64): the reference for small configs.
    fn loop_counts(cfg: &ModelConfig) -> ParamCounts {
        let d = cfg.hidden_size;
        let h = cfg.num_attention_heads;
        let (nope, rope, v) = (cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim);
        let c = cfg.kv_lora_rank;
        let q = match cfg.q_lora_rank {
            None => h * (nope + rope) * d,
            Some(r) => r * d + r + h * (nope + rope) * r,
        };
        let q_shift = match (cfg.query_token_shift, cfg.q_lora_rank) {
            (false, _) => 0,
            (true, None) => h * (nope + rope) * d,
            (true, Some(r)) => r * d,
        };
        let gate = match cfg.attn_gate {
            AttnGate::None => 0,
            AttnGate::Headwise => h * d,
            AttnGate::Elementwise => h * v * d,
        };
        let shift = cfg.shift_taps() as i64 * (c + rope) * d;
        let latent_a = (c + rope) * d + c + shift;
        let attn_common = q + q_shift + c * h * (nope + v) + d * h * v + gate + 2 * d;
        let (mut total, mut active) = (0i64, 0i64);
        let f = cfg.moe_intermediate_size;
        for i in 0..cfg.num_hidden_layers {
            let mut layer = attn_common;
            if cfg.owns_latent(i) {
                layer += latent_a;
            }
            if cfg.cross_layer_residual && i > 0 {
                layer += 2 * d;
            }
            if cfg.is_moe_layer(i) {
                let router = cfg.n_routed_experts * d;
                let shared = 3 * d * f * cfg.n_shared_experts;
                let per_expert = 3 * d * f;
                total += layer + router + shared + cfg.n_routed_experts * per_expert;
                active += layer + router + shared + cfg.num_experts_per_tok * per_expert;
            } else {
                let dense = 3 * d * cfg.intermediate_size;
                total += layer + dense;
                active += layer + dense;
            }
        }
        let embed = cfg.vocab_size * d;
        let head = if cfg.tie_word_embeddings { 0 } else { embed };
        ParamCounts {
            total: total + embed + head + d,
            active: active + embed + head + d,
            embedding: embed + head,
        }
    }

    #[test]
    fn closed_form_counts_match_the_per_layer_loop() {
        let mut cfgs: Vec<ModelConfig> = ["tiny", "small", "k3-shape", "gpu-1b"]
            .iter()
            .map(|p| ModelConfig::preset(p).unwrap())
            .collect();
        cfgs.extend([
            ModelConfig {
                latent_token_shift: true,
                latent_shift_taps: 3,
                query_token_shift: true,
                q_lora_rank: Some(24),
                tie_word_embeddings: false,
                attn_gate: AttnGate::None,
                ..ModelConfig::tiny()
            },
            ModelConfig {
                cla_factor: 3,
                num_hidden_layers: 7,
                first_k_dense_replace: 2,
                n_shared_experts: 0,
                cross_layer_residual: false,
                latent_token_shift: true,
                ..ModelConfig::small()
            },
            ModelConfig {
                num_hidden_layers: 1,
                first_k_dense_replace: 1,
                qk_rope_head_dim: 0,
                ..ModelConfig::tiny()
            },
        ]);
        for cfg in cfgs {
            assert_eq!(
                cfg.try_param_counts().unwrap(),
                loop_counts(&cfg),
                "{cfg:?}"
            );
            assert_eq!(cfg.param_counts(), loop_counts(&cfg));
        }
    }

    /// A config whose `field` is `value` (serde, so any field by name).
    fn with(field: &str, value: serde_json::Value) -> ModelConfig {
        let mut v = serde_json::to_value(ModelConfig::tiny()).unwrap();
        v[field] = value;
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn absurd_sizes_are_refused_naming_the_field() {
        const HUGE: i64 = 1 << 62;
        for (field, value, named) in [
            ("vocab_size", HUGE, "vocab_size"),
            ("vocab_size", i64::MAX, "vocab_size"),
            ("hidden_size", HUGE, "hidden_size"),
            ("hidden_size", 1 << 52, "hidden_size"),
            ("n_routed_experts", HUGE, "n_routed_experts"),
            ("n_routed_experts", 1 << 50, "n_routed_experts"),
            ("moe_intermediate_size", HUGE, "moe_intermediate_size"),
            ("num_hidden_layers", HUGE, "num_hidden_layers"),
            ("num_hidden_layers", i64::MAX, "num_hidden_layers"),
            ("num_attention_heads", HUGE, "num_attention_heads"),
            ("kv_lora_rank", i64::MAX, "kv_lora_rank"),
            ("qk_nope_head_dim", i64::MAX, "qk_nope_head_dim"),
            ("qk_rope_head_dim", HUGE, "qk_rope_head_dim"),
            ("v_head_dim", i64::MAX, "v_head_dim"),
            ("n_shared_experts", HUGE, "n_shared_experts"),
            ("max_position_embeddings", HUGE, "max_position_embeddings"),
            (
                "max_position_embeddings",
                i64::MAX,
                "max_position_embeddings",
            ),
        ] {
            let cfg = with(field, value.into());
            let Err(err) = cfg.validate() else {
                panic!("{field} = {value} passed");
            };
            let msg = err.to_string();
            assert!(
                msg.contains(&format!("{named} = {value}")),
                "{field} = {value}: {msg}"
            );
            if field != "max_position_embeddings" {
                assert!(msg.contains("parameters"), "{msg}");
                let err = cfg.try_param_counts().unwrap_err().to_string();
                assert!(err.contains(named), "{err}");
            }
            // Nothing panics on a refused config: the counts saturate.
            let _ = (cfg.param_counts(), cfg.flops_per_token(i64::MAX));
            let _ = (cfg.cache_elems_per_token(), cfg.kv_ratio_vs_mha());
            assert!(cfg.build_bytes(Kind::Float).is_err());
            assert!(cfg.check_fits(Device::Cpu, Kind::Float).is_err());
        }
        // A dense FFN width only counts where there are dense layers.
        let cfg = ModelConfig {
            intermediate_size: HUGE,
            ..ModelConfig::tiny()
        };
        cfg.validate().unwrap();
        let msg = ModelConfig {
            first_k_dense_replace: 1,
            ..cfg
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(
            msg.contains(&format!("intermediate_size = {HUGE}")),
            "{msg}"
        );
        assert!(msg.contains("the dense FFNs"), "{msg}");
    }

    #[test]
    fn weights_past_the_device_memory_are_refused_before_allocating() {
        // Valid for libtorch (below MAX_ELEMENTS) but 512 TiB of fp32 weights.
        let cfg = ModelConfig {
            vocab_size: 1 << 40,
            ..ModelConfig::tiny()
        };
        cfg.validate().unwrap();
        let need = cfg.build_bytes(Kind::Float).unwrap();
        assert_eq!(need.weights, cfg.param_counts().total as u128 * 4);
        let limit = Some((64 << 30, "a test limit"));
        let err = cfg
            .check_memory(&need, need.weights, need.rope_host, "cpu", limit)
            .unwrap_err();
        assert!(matches!(
            err,
            ModelError::TooLarge {
                field: "vocab_size",
                ..
            }
        ));
        let msg = err.to_string();
        for part in [
            "vocab_size = 1099511627776",
            "512.0 TiB",
            "64.0 GiB",
            "a test limit",
            "the token embedding",
        ] {
            assert!(msg.contains(part), "{part:?} missing from {msg}");
        }
        // Where the memory is known (Linux), the real check refuses it too, and so does
        // every model constructor, with an error instead of libtorch's allocation panic.
        if host_memory_bytes().is_some() {
            let msg = cfg
                .check_fits(Device::Cpu, Kind::Float)
                .unwrap_err()
                .to_string();
            assert!(
                msg.contains("vocab_size") && msg.contains("MemTotal"),
                "{msg}"
            );
            let vs = tch::nn::VarStore::new(Device::Cpu);
            let err = crate::model::MoePolicy::new(&vs.root(), &cfg).unwrap_err();
            assert!(err.to_string().contains("vocab_size"), "{err}");
            assert!(vs.variables().is_empty(), "nothing was allocated");
            let err = crate::model::MoePolicy::new_in_kind(&vs, &cfg, Kind::BFloat16).unwrap_err();
            assert!(err.to_string().contains("vocab_size"), "{err}");
            // Huge RoPE tables are named by their field.
            let cfg = ModelConfig {
                max_position_embeddings: 1 << 40,
                ..ModelConfig::tiny()
            };
            let err = crate::model::MoePolicy::new(&vs.root(), &cfg).unwrap_err();
            assert!(
                matches!(
                    err,
                    ModelError::TooLarge {
                        field: "max_position_embeddings",
                        ..
                    }
                ),
                "{err}"
            );
        }
        // The k3 shape is for accounting only: counted, never built on this machine.
        let k3 = ModelConfig::k3_shape();
        assert!(k3.param_counts().total > 1_000_000_000_000);
        let err = k3
            .check_memory(
                &k3.build_bytes(Kind::Float).unwrap(),
                k3.build_bytes(Kind::Float).unwrap().weights,
                0,
                "cpu",
                limit,
            )
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, ModelError::TooLarge { .. }) && msg.contains("the routed experts"),
            "{msg}"
        );
    }

    #[test]
    fn presets_fit_and_absent_devices_are_refused() {
        for cfg in [ModelConfig::tiny(), ModelConfig::small()] {
            cfg.check_fits(Device::Cpu, Kind::Float).unwrap();
        }
        let need = ModelConfig::gpu_1b().build_bytes(Kind::BFloat16).unwrap();
        assert_eq!(need.bytes_per_param, 4, "built in fp32, then cast");
        assert!(need.weights < 5 << 30, "{need:?}");
        assert_eq!(
            ModelConfig::tiny()
                .build_bytes(Kind::Double)
                .unwrap()
                .bytes_per_param,
            8
        );
        let err = ModelConfig::tiny()
            .check_fits(Device::Cuda(4096), Kind::BFloat16)
            .unwrap_err();
        assert!(matches!(err, ModelError::Device(_)), "{err}");
        assert!(err.to_string().contains("cuda:4096"), "{err}");
    }

    #[test]
    fn mem_total_parses() {
        let text = "MemTotal:       24683584 kB\nMemFree:  1 kB\n";
        assert_eq!(parse_mem_total(text), Some(24683584 * 1024));
        assert_eq!(parse_mem_total("MemFree: 1 kB\n"), None);
        assert_eq!(parse_mem_total("MemTotal: lots\n"), None);
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(3 << 29), "1.5 GiB");
    }

    proptest::proptest! {
        /// Whatever the sizes, validating, counting and sizing return; nothing overflows.
        #[test]
        fn any_sizes_give_an_answer_not_a_panic(
            vals in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::num::i64::ANY,
                    (0i64..64).prop_map(|s| 1i64 << s),
                    -2i64..300,
                ],
                13,
            ),
            q_lora in proptest::option::of(proptest::num::i64::ANY),
            ctx in proptest::num::i64::ANY,
        ) {
            let cfg = ModelConfig {
                vocab_size: vals[0],
                hidden_size: vals[1],
                num_hidden_layers: vals[2],
                num_attention_heads: vals[3],
                kv_lora_rank: vals[4],
                qk_nope_head_dim: vals[5],
                qk_rope_head_dim: vals[6],
                v_head_dim: vals[7],
                cla_factor: vals[8],
                max_position_embeddings: vals[9],
                n_routed_experts: vals[10],
                moe_intermediate_size: vals[11],
                n_shared_experts: vals[12],
                q_lora_rank: q_lora,
                ..ModelConfig::small()
            };
            let ok = cfg.validate().is_ok();
            let counts = cfg.try_param_counts();
            proptest::prop_assert!(!ok || counts.is_ok());
            if let Ok(p) = counts {
                proptest::prop_assert!(p.total <= MAX_ELEMENTS && p.active <= p.total);
                proptest::prop_assert!(p.embedding <= p.total);
            }
            let _ = (cfg.param_counts(), cfg.flops_per_token(ctx));
            let _ = (cfg.cache_elems_per_token(), cfg.kv_ratio_vs_mha());
            let _ = cfg.build_bytes(Kind::Float);
            let limit = Some((1u64 << 30, "test"));
            if let Ok(need) = cfg.build_bytes(Kind::Float) {
                let _ = cfg.check_memory(&need, need.weights, need.rope_host, "cpu", limit);
            }
        }
    }
}
