//! The named configs: `tiny` (the CPU demo), `small`, and the two GPU-scale shapes built on one
//! shared base, `k3_shape` (for accounting only) and `gpu_1b` (the one-GPU bench).
//! [`ModelConfig::preset`] picks one by name; [`ModelConfig::from_toml`] fills the fields a TOML
//! file leaves out from `tiny`.

use super::config::{
    Attention, AttnGate, BalanceMode, ExpertAct, ExpertDispatch, ModelConfig, RopeScaling,
    ScoreFunc,
};
use super::ModelError;

/// Kimi K3's expert activation: gate clipped at β = 4, up-projection at β_lin = 25.
const K3_SOFT_CLIP_GLU: ExpertAct = ExpertAct::SoftClipGlu {
    beta: 4.0,
    beta_lin: 25.0,
};

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
            attention: Attention::Mla,
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
            mlp_only_layers: Vec::new(),
            decoder_sparse_step: 1,
            intermediate_size: 512,
            n_routed_experts: 8,
            n_shared_experts: 1,
            num_experts_per_tok: 2,
            moe_intermediate_size: 128,
            n_group: 1,
            topk_group: 1,
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
            latent_norm_eps: None,
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
            expert_act: K3_SOFT_CLIP_GLU,
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
            max_position_embeddings: 262_144,
            intermediate_size: 18_432,
            n_routed_experts: 896,
            n_shared_experts: 2,
            num_experts_per_tok: 16,
            moe_intermediate_size: 3072,
            scoring_func: ScoreFunc::Sigmoid,
            tie_word_embeddings: false,
            ..Self::gpu_scale()
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
            max_position_embeddings: 65_536,
            intermediate_size: 4096,
            n_routed_experts: 32,
            n_shared_experts: 1,
            num_experts_per_tok: 4,
            moe_intermediate_size: 1024,
            ..Self::gpu_scale()
        }
    }

    /// What the GPU-scale shapes share, the DeepSeek-V3 / K3 layout: an element-wise attention
    /// gate, cross-layer residuals, one leading dense layer, K3's soft-clipped GLU experts
    /// evaluated with grouped GEMMs, and the copying aids of the CPU demo off (no token shifts,
    /// no CLA). The remaining fields come from `tiny`; each shape sets its own sizes.
    fn gpu_scale() -> Self {
        Self {
            attn_gate: AttnGate::Elementwise,
            cross_layer_residual: true,
            latent_token_shift: false,
            latent_shift_taps: 1,
            query_token_shift: false,
            cla_factor: 1,
            first_k_dense_replace: 1,
            expert_act: K3_SOFT_CLIP_GLU,
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
    fn toml_defaults_to_tiny() {
        let cfg =
            ModelConfig::from_toml("hidden_size = 64\nattn_gate = \"elementwise\"\n").unwrap();
        assert_eq!(cfg.hidden_size, 64);
        assert_eq!(cfg.num_hidden_layers, ModelConfig::tiny().num_hidden_layers);
        assert!(ModelConfig::from_toml("hidden_sise = 64").is_err());
    }
}
