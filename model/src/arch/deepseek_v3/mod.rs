//! DeepSeek-V3 (`DeepseekV3ForCausalLM`; also Kimi K2, Moonlight, DeepSeek-R1 and V3.1):
//! translation only. The config keys become a [`ModelConfig`] with Corvid's own extras off
//! (no output gate, cross-layer residual, token shift or CLA); the state-dict plan names each
//! Corvid variable's Hugging Face tensors. The math (MLA, sigmoid routing with the selection
//! bias and group limits, YaRN) is the shared layers'. The keys, defaults and parity figures
//! are in this folder's README.

use serde_json::json;

use super::adapter::{Plan, Source};
use super::keys::{Keys, COMMON_METADATA};
use super::{expert_sources, rope_from_keys, HfLayout};
use crate::config::{
    Attention, AttnGate, BalanceMode, ExpertAct, ExpertDispatch, ModelConfig, ScoreFunc,
};
use crate::ModelError;

/// `model_type` of this family.
pub const MODEL_TYPE: &str = "deepseek_v3";

/// transformers' `DeepseekV3Config` defaults, for keys a config may leave out.
mod default {
    pub const VOCAB_SIZE: i64 = 129_280;
    pub const HIDDEN_SIZE: i64 = 7168;
    pub const INTERMEDIATE_SIZE: i64 = 18_432;
    pub const MOE_INTERMEDIATE_SIZE: i64 = 2048;
    pub const NUM_HIDDEN_LAYERS: i64 = 61;
    pub const NUM_ATTENTION_HEADS: i64 = 128;
    pub const N_SHARED_EXPERTS: i64 = 1;
    pub const N_ROUTED_EXPERTS: i64 = 256;
    pub const ROUTED_SCALING_FACTOR: f64 = 2.5;
    pub const KV_LORA_RANK: i64 = 512;
    pub const Q_LORA_RANK: i64 = 1536;
    pub const QK_ROPE_HEAD_DIM: i64 = 64;
    pub const V_HEAD_DIM: i64 = 128;
    pub const QK_NOPE_HEAD_DIM: i64 = 128;
    pub const N_GROUP: i64 = 8;
    pub const TOPK_GROUP: i64 = 4;
    pub const NUM_EXPERTS_PER_TOK: i64 = 8;
    pub const FIRST_K_DENSE_REPLACE: i64 = 3;
    pub const MAX_POSITION_EMBEDDINGS: i64 = 4096;
    pub const RMS_NORM_EPS: f64 = 1e-6;
    pub const INITIALIZER_RANGE: f64 = 0.02;
}

/// The γ of DeepSeek-V3's aux-free bias rule, which Corvid applies when training a loaded
/// checkpoint (the config has no key for it).
const BIAS_UPDATE_RATE: f64 = 1e-3;

/// The epsilon transformers' `DeepseekV3Attention` gives `q_a_layernorm` and `kv_a_layernorm`
/// (their constructor's default, not `rms_norm_eps`).
const LATENT_NORM_EPS: f64 = 1e-6;

/// Reads the keys of a `deepseek_v3` config into Corvid's config and the checkpoint layout.
pub(crate) fn config(keys: &mut Keys) -> Result<(ModelConfig, HfLayout), ModelError> {
    keys.metadata(COMMON_METADATA);
    keys.metadata(&[
        // Expert parallelism of the reference implementation: a deployment setting.
        "ep_size",
        // The reference implementation's training-time auxiliary loss; Corvid balances with the
        // selection bias (aux-free), as DeepSeek-V3 was trained.
        "aux_loss_alpha",
        "seq_aux",
        "output_router_logits",
        "router_aux_loss_coef",
        // Multi-token prediction layers: their tensors are skipped and listed by the loader.
        "num_nextn_predict_layers",
        // FP8 checkpoints: the loader dequantises `*_scale_inv` blocks of this layout.
        "quantization_config",
    ]);
    keys.only("hidden_act", json!("silu"), "SwiGLU experts")?;
    keys.only("attention_bias", json!(false), "bias-free projections")?;
    keys.only("attention_dropout", json!(0.0), "no dropout")?;
    keys.only("scoring_func", json!("sigmoid"), "DeepSeek-V3 routing")?;
    keys.only(
        "topk_method",
        json!("noaux_tc"),
        "group-limited top-k on biased scores",
    )?;
    keys.only(
        "moe_layer_freq",
        json!(1),
        "every layer after first_k_dense_replace is MoE",
    )?;
    let hidden_size = keys.i64_or("hidden_size", default::HIDDEN_SIZE)?;
    let num_attention_heads = keys.i64_or("num_attention_heads", default::NUM_ATTENTION_HEADS)?;
    let kv_heads = keys.i64_or("num_key_value_heads", num_attention_heads)?;
    if kv_heads != num_attention_heads {
        return Err(keys.error(
            "num_key_value_heads",
            format!(
                "{kv_heads}: MLA needs it equal to num_attention_heads ({num_attention_heads})"
            ),
        ));
    }
    let qk_nope_head_dim = keys.i64_or("qk_nope_head_dim", default::QK_NOPE_HEAD_DIM)?;
    let qk_rope_head_dim = keys.i64_or("qk_rope_head_dim", default::QK_ROPE_HEAD_DIM)?;
    // Derived values transformers writes back into the file: they must agree.
    for (key, want) in [
        ("head_dim", qk_rope_head_dim),
        ("qk_head_dim", qk_nope_head_dim + qk_rope_head_dim),
    ] {
        if let Some(v) = keys.opt_i64(key)? {
            if v != want {
                return Err(keys.error(key, format!("{v}, but the head dims make it {want}")));
            }
        }
    }
    // Absent means transformers' default; an explicit null means a full-rank `q_proj`.
    let q_lora_rank = if keys.is_null("q_lora_rank") {
        keys.opt_i64("q_lora_rank")?
    } else {
        Some(keys.i64_or("q_lora_rank", default::Q_LORA_RANK)?)
    };
    let max_position_embeddings =
        keys.i64_or("max_position_embeddings", default::MAX_POSITION_EMBEDDINGS)?;
    let (rope_theta, rope_scaling) = rope_from_keys(keys, true)?;
    let rope_interleave = keys.bool_or("rope_interleave", true)?;
    let initializer_range = keys.f64_or("initializer_range", default::INITIALIZER_RANGE)?;
    let cfg = ModelConfig {
        vocab_size: keys.i64_or("vocab_size", default::VOCAB_SIZE)?,
        hidden_size,
        num_hidden_layers: keys.i64_or("num_hidden_layers", default::NUM_HIDDEN_LAYERS)?,
        num_attention_heads,
        q_lora_rank,
        kv_lora_rank: keys.i64_or("kv_lora_rank", default::KV_LORA_RANK)?,
        qk_nope_head_dim,
        qk_rope_head_dim,
        v_head_dim: keys.i64_or("v_head_dim", default::V_HEAD_DIM)?,
        attention: Attention::Mla,
        attn_gate: AttnGate::None,
        cross_layer_residual: false,
        latent_token_shift: false,
        latent_shift_taps: 1,
        query_token_shift: false,
        cla_factor: 1,
        rope_theta,
        rope_scaling,
        max_position_embeddings,
        first_k_dense_replace: keys
            .i64_or("first_k_dense_replace", default::FIRST_K_DENSE_REPLACE)?,
        mlp_only_layers: Vec::new(),
        decoder_sparse_step: 1,
        intermediate_size: keys.i64_or("intermediate_size", default::INTERMEDIATE_SIZE)?,
        n_routed_experts: keys.i64_or("n_routed_experts", default::N_ROUTED_EXPERTS)?,
        n_shared_experts: keys.i64_or("n_shared_experts", default::N_SHARED_EXPERTS)?,
        num_experts_per_tok: keys.i64_or("num_experts_per_tok", default::NUM_EXPERTS_PER_TOK)?,
        moe_intermediate_size: keys
            .i64_or("moe_intermediate_size", default::MOE_INTERMEDIATE_SIZE)?,
        n_group: keys.i64_or("n_group", default::N_GROUP)?,
        topk_group: keys.i64_or("topk_group", default::TOPK_GROUP)?,
        scoring_func: ScoreFunc::Sigmoid,
        norm_topk_prob: keys.bool_or("norm_topk_prob", true)?,
        routed_scaling_factor: keys
            .f64_or("routed_scaling_factor", default::ROUTED_SCALING_FACTOR)?,
        router_noise_std: 0.0,
        expert_act: ExpertAct::Swiglu,
        expert_gate_scale: 1.0,
        expert_init_std: initializer_range,
        // One grouped GEMM per projection: at checkpoint sizes faster than the per-expert loop
        // on the CPU too (BENCHMARKS.md, Hugging Face checkpoints).
        expert_dispatch: ExpertDispatch::GroupedMm,
        balance: BalanceMode::AuxFree,
        aux_loss_coef: 0.0,
        bias_update_rate: BIAS_UPDATE_RATE,
        router_z_loss_coef: 0.0,
        rms_norm_eps: keys.f64_or("rms_norm_eps", default::RMS_NORM_EPS)?,
        latent_norm_eps: Some(LATENT_NORM_EPS),
        tie_word_embeddings: keys.bool_or("tie_word_embeddings", false)?,
        initializer_range,
    };
    Ok((cfg, HfLayout { rope_interleave }))
}

/// The rows of a head's RoPE part in Corvid's half-split order, from DeepSeek's interleaved
/// pairs: `[0, 2, 4, …, 1, 3, 5, …]` (transformers' `apply_rotary_pos_emb_interleave` reads
/// them in this order before rotating halves).
pub(crate) fn deinterleave(rope: i64) -> Vec<i64> {
    (0..rope).step_by(2).chain((1..rope).step_by(2)).collect()
}

/// The state-dict plan: Corvid's variable names are the checkpoint's without the `model.`
/// prefix, except the stacked experts; with `rope_interleave` the RoPE rows of the query and
/// of the compressed key are de-interleaved; layers past `num_hidden_layers` (multi-token
/// prediction) are skipped.
pub(crate) fn plan(cfg: &ModelConfig, layout: &HfLayout, names: &[&str]) -> Plan {
    let mut plan = Plan::default();
    let hf = |corvid: &str| format!("model.{corvid}");
    let same = |plan: &mut Plan, corvid: String| {
        let source = Source::Same(hf(&corvid));
        plan.sources.insert(corvid, source);
    };
    same(&mut plan, "embed_tokens.weight".into());
    same(&mut plan, "norm.weight".into());
    if !cfg.tie_word_embeddings {
        plan.sources.insert(
            "lm_head.weight".into(),
            Source::Same("lm_head.weight".into()),
        );
    }
    let (h, nope, rope, c) = (
        cfg.num_attention_heads,
        cfg.qk_nope_head_dim,
        cfg.qk_rope_head_dim,
        cfg.kv_lora_rank,
    );
    let qk = nope + rope;
    for i in 0..cfg.num_hidden_layers {
        let p = format!("layers.{i}");
        for norm in ["input_layernorm", "post_attention_layernorm"] {
            same(&mut plan, format!("{p}.{norm}.weight"));
        }
        let attn = format!("{p}.self_attn");
        let q_out = match cfg.q_lora_rank {
            None => "q_proj",
            Some(_) => {
                same(&mut plan, format!("{attn}.q_a_proj.weight"));
                same(&mut plan, format!("{attn}.q_a_layernorm.weight"));
                "q_b_proj"
            }
        };
        for name in ["kv_a_layernorm", "kv_b_proj", "o_proj"] {
            same(&mut plan, format!("{attn}.{name}.weight"));
        }
        let q_name = format!("{attn}.{q_out}.weight");
        let kv_name = format!("{attn}.kv_a_proj_with_mqa.weight");
        if layout.rope_interleave && rope > 0 {
            let perm = deinterleave(rope);
            // q: per head, nope rows then rope rows; kv_a: the latent, then the shared RoPE key.
            let q_rows: Vec<i64> = (0..h)
                .flat_map(|head| {
                    let base = head * qk;
                    (0..nope)
                        .map(move |r| base + r)
                        .chain(perm.iter().map(move |&r| base + nope + r))
                })
                .collect();
            let kv_rows: Vec<i64> = (0..c).chain(perm.iter().map(|&r| c + r)).collect();
            plan.sources
                .insert(q_name.clone(), Source::Rows(hf(&q_name), q_rows));
            plan.sources
                .insert(kv_name.clone(), Source::Rows(hf(&kv_name), kv_rows));
        } else {
            same(&mut plan, q_name);
            same(&mut plan, kv_name);
        }
        let mlp = format!("{p}.mlp");
        if cfg.is_moe_layer(i) {
            same(&mut plan, format!("{mlp}.gate.weight"));
            same(&mut plan, format!("{mlp}.gate.e_score_correction_bias"));
            if cfg.n_shared_experts > 0 {
                for proj in ["gate_proj", "up_proj", "down_proj"] {
                    same(&mut plan, format!("{mlp}.shared_experts.{proj}.weight"));
                }
            }
            expert_sources(&mut plan, &mlp, &hf(&mlp), cfg.n_routed_experts, names);
        } else {
            for proj in ["gate_proj", "up_proj", "down_proj"] {
                same(&mut plan, format!("{mlp}.{proj}.weight"));
            }
        }
    }
    let past = cfg.num_hidden_layers;
    for name in names {
        let layer = name
            .strip_prefix("model.layers.")
            .and_then(|rest| rest.split('.').next())
            .and_then(|n| n.parse::<i64>().ok());
        if layer.is_some_and(|l| l >= past) {
            plan.skip.push((
                name.to_string(),
                "a multi-token-prediction layer (past num_hidden_layers), which the policy does not use",
            ));
        }
    }
    if cfg.tie_word_embeddings {
        plan.skip.push((
            "lm_head.weight".into(),
            "tie_word_embeddings: the head is the embedding",
        ));
    }
    plan
}

/// The DeepSeek-V3 `config.json` of a Corvid-native model (without the dtype, which the export
/// sets), with its RoPE rows as Corvid holds them (`rope_interleave: false`). A model using
/// something DeepSeek-V3 has not (Corvid's output gate, cross-layer residual, token shifts,
/// CLA, grouped-query attention, softmax routing, soft-clipped experts, its own RoPE scalings,
/// dense layers other than the leading ones) is refused, every such feature named.
pub(crate) fn from_corvid(cfg: &ModelConfig) -> Result<(serde_json::Value, HfLayout), ModelError> {
    let mut own = Vec::new();
    let mut refuse = |on: bool, what: &str| {
        if on {
            own.push(what.to_string());
        }
    };
    refuse(cfg.attention != Attention::Mla, "grouped-query attention");
    refuse(
        cfg.attn_gate != AttnGate::None,
        "attn_gate (the output gate)",
    );
    refuse(cfg.cross_layer_residual, "cross_layer_residual");
    refuse(cfg.latent_token_shift, "latent_token_shift");
    refuse(cfg.query_token_shift, "query_token_shift");
    refuse(cfg.cla_factor != 1, "cla_factor (shared latents)");
    refuse(
        cfg.scoring_func != ScoreFunc::Sigmoid,
        "scoring_func softmax",
    );
    refuse(
        cfg.expert_act != ExpertAct::Swiglu,
        "expert_act soft_clip_glu",
    );
    refuse(cfg.expert_gate_scale != 1.0, "expert_gate_scale");
    refuse(
        !cfg.mlp_only_layers.is_empty() || cfg.decoder_sparse_step != 1,
        "dense layers after the first MoE layer (mlp_only_layers, decoder_sparse_step)",
    );
    refuse(!cfg.has_experts(), "no routed experts");
    refuse(
        cfg.latent_eps() != LATENT_NORM_EPS,
        "latent_norm_eps other than 1e-6 (transformers fixes the latent norms' epsilon)",
    );
    let rope = super::rope_parameters(cfg.rope_theta, &cfg.rope_scaling);
    refuse(rope.is_none(), "rope_scaling Corvid's yarn (use hf_yarn)");
    if !own.is_empty() {
        return Err(ModelError::Input(format!(
            "the model uses {}, which DeepSeek-V3 has not: export it as `corvid`",
            own.join(", ")
        )));
    }
    let config = json!({
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": MODEL_TYPE,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "moe_intermediate_size": cfg.moe_intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_attention_heads,
        "n_shared_experts": cfg.n_shared_experts,
        "n_routed_experts": cfg.n_routed_experts,
        "routed_scaling_factor": cfg.routed_scaling_factor,
        "kv_lora_rank": cfg.kv_lora_rank,
        "q_lora_rank": cfg.q_lora_rank,
        "qk_rope_head_dim": cfg.qk_rope_head_dim,
        "v_head_dim": cfg.v_head_dim,
        "qk_nope_head_dim": cfg.qk_nope_head_dim,
        "n_group": cfg.n_group,
        "topk_group": cfg.topk_group,
        "num_experts_per_tok": cfg.num_experts_per_tok,
        "first_k_dense_replace": cfg.first_k_dense_replace,
        "norm_topk_prob": cfg.norm_topk_prob,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings,
        "initializer_range": cfg.initializer_range,
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "rope_interleave": false,
        "rope_parameters": rope,
        "attention_bias": false,
        "attention_dropout": 0.0,
    });
    Ok((
        config,
        HfLayout {
            rope_interleave: false,
        },
    ))
}
