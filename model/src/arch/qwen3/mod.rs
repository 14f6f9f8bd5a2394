//! Qwen3 (`Qwen3ForCausalLM`, 0.6B–32B): translation only. Grouped-query attention with
//! per-head q/k RMSNorm ([`Attention::Gqa`], the shared `gqa` layer) and a dense SwiGLU MLP in
//! every layer. Qwen3-MoE ([`super::qwen3_moe`]) shares this attention: `attention_config`
//! reads its keys and `attention_plan` names its tensors for both. The keys, defaults and
//! parity figures are in this folder's README.

use serde_json::json;

use super::adapter::{Plan, Source};
use super::keys::{Keys, COMMON_METADATA};
use super::{rope_from_keys, HfLayout};
use crate::config::{
    Attention, AttnGate, BalanceMode, ExpertAct, ExpertDispatch, ModelConfig, ScoreFunc,
};
use crate::ModelError;

/// `model_type` of this family.
pub const MODEL_TYPE: &str = "qwen3";

/// The defaults of the keys a Qwen3-family config may leave out; they differ between
/// `Qwen3Config` and `Qwen3MoeConfig`.
pub(crate) struct Defaults {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    /// `None`: `num_attention_heads`.
    pub num_key_value_heads: Option<i64>,
    /// `None`: `hidden_size / num_attention_heads`.
    pub head_dim: Option<i64>,
    pub max_position_embeddings: i64,
}

/// transformers' `Qwen3Config` defaults.
const QWEN3: Defaults = Defaults {
    vocab_size: 151_936,
    hidden_size: 4096,
    intermediate_size: 22_016,
    num_hidden_layers: 32,
    num_attention_heads: 32,
    num_key_value_heads: None,
    head_dim: Some(128),
    max_position_embeddings: 32_768,
};

const RMS_NORM_EPS: f64 = 1e-6;
const INITIALIZER_RANGE: f64 = 0.02;

/// Reads the keys a `qwen3` config shares with `qwen3_moe` (attention, norms, RoPE, the dense
/// MLP width) into a dense [`ModelConfig`]; the caller adds experts.
pub(crate) fn attention_config(keys: &mut Keys, d: &Defaults) -> Result<ModelConfig, ModelError> {
    keys.metadata(COMMON_METADATA);
    keys.only("hidden_act", json!("silu"), "SwiGLU MLPs")?;
    keys.only("attention_bias", json!(false), "bias-free projections")?;
    keys.only("attention_dropout", json!(0.0), "no dropout")?;
    keys.only(
        "use_sliding_window",
        json!(false),
        "full attention in every layer",
    )?;
    // With the window off transformers ignores these (and nulls `sliding_window`).
    keys.metadata(&["sliding_window", "max_window_layers"]);
    if let Some(bad) = keys
        .str_list("layer_types")?
        .into_iter()
        .find(|t| t != "full_attention")
    {
        return Err(keys.error(
            "layer_types",
            format!("\"{bad}\" is not supported (Corvid implements full_attention)"),
        ));
    }
    let hidden_size = keys.i64_or("hidden_size", d.hidden_size)?;
    let num_attention_heads = keys.i64_or("num_attention_heads", d.num_attention_heads)?;
    let num_key_value_heads = keys.i64_or(
        "num_key_value_heads",
        d.num_key_value_heads.unwrap_or(num_attention_heads),
    )?;
    let head_dim = match d.head_dim {
        Some(h) => keys.i64_or("head_dim", h)?,
        None => keys.i64_or("head_dim", hidden_size / num_attention_heads.max(1))?,
    };
    let (rope_theta, rope_scaling) = rope_from_keys(keys, false)?;
    let initializer_range = keys.f64_or("initializer_range", INITIALIZER_RANGE)?;
    Ok(ModelConfig {
        vocab_size: keys.i64_or("vocab_size", d.vocab_size)?,
        hidden_size,
        num_hidden_layers: keys.i64_or("num_hidden_layers", d.num_hidden_layers)?,
        num_attention_heads,
        // The MLA fields are unused with grouped-query attention.
        q_lora_rank: None,
        kv_lora_rank: 0,
        qk_nope_head_dim: 0,
        qk_rope_head_dim: 0,
        v_head_dim: 0,
        attention: Attention::Gqa {
            num_key_value_heads,
            head_dim,
            qk_norm: true,
        },
        attn_gate: AttnGate::None,
        cross_layer_residual: false,
        latent_token_shift: false,
        latent_shift_taps: 1,
        query_token_shift: false,
        cla_factor: 1,
        rope_theta,
        rope_scaling,
        max_position_embeddings: keys
            .i64_or("max_position_embeddings", d.max_position_embeddings)?,
        first_k_dense_replace: 0,
        mlp_only_layers: Vec::new(),
        decoder_sparse_step: 1,
        intermediate_size: keys.i64_or("intermediate_size", d.intermediate_size)?,
        // Dense: no experts (Qwen3-MoE sets them).
        n_routed_experts: 0,
        n_shared_experts: 0,
        num_experts_per_tok: 0,
        moe_intermediate_size: 0,
        n_group: 1,
        topk_group: 1,
        scoring_func: ScoreFunc::Softmax,
        norm_topk_prob: false,
        routed_scaling_factor: 1.0,
        router_noise_std: 0.0,
        expert_act: ExpertAct::Swiglu,
        expert_gate_scale: 1.0,
        expert_init_std: initializer_range,
        // One grouped GEMM per projection: at checkpoint sizes faster than the per-expert loop
        // on the CPU too (BENCHMARKS.md, Hugging Face checkpoints).
        expert_dispatch: ExpertDispatch::GroupedMm,
        balance: BalanceMode::None,
        aux_loss_coef: 0.0,
        bias_update_rate: 0.0,
        router_z_loss_coef: 0.0,
        rms_norm_eps: keys.f64_or("rms_norm_eps", RMS_NORM_EPS)?,
        latent_norm_eps: None,
        tie_word_embeddings: keys.bool_or("tie_word_embeddings", false)?,
        initializer_range,
    })
}

/// Reads the keys of a `qwen3` config.
pub(crate) fn config(keys: &mut Keys) -> Result<(ModelConfig, HfLayout), ModelError> {
    let cfg = attention_config(keys, &QWEN3)?;
    Ok((
        cfg,
        HfLayout {
            rope_interleave: false,
        },
    ))
}

/// Adds `corvid`'s source, the same tensor under `model.`.
pub(crate) fn same(plan: &mut Plan, corvid: String) {
    let source = Source::Same(format!("model.{corvid}"));
    plan.sources.insert(corvid, source);
}

/// The tensors every Qwen3-family checkpoint holds outside the MLPs: embeddings, head, norms
/// and grouped-query attention, under the checkpoint's names without `model.`.
pub(crate) fn attention_plan(cfg: &ModelConfig) -> Plan {
    let mut plan = Plan::default();
    same(&mut plan, "embed_tokens.weight".into());
    same(&mut plan, "norm.weight".into());
    if cfg.tie_word_embeddings {
        plan.skip.push((
            "lm_head.weight".into(),
            "tie_word_embeddings: the head is the embedding",
        ));
    } else {
        plan.sources.insert(
            "lm_head.weight".into(),
            Source::Same("lm_head.weight".into()),
        );
    }
    for i in 0..cfg.num_hidden_layers {
        let p = format!("layers.{i}");
        for norm in ["input_layernorm", "post_attention_layernorm"] {
            same(&mut plan, format!("{p}.{norm}.weight"));
        }
        for name in ["q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"] {
            same(&mut plan, format!("{p}.self_attn.{name}.weight"));
        }
    }
    plan
}

/// The dense MLP of layer `i`.
pub(crate) fn dense_mlp_plan(plan: &mut Plan, i: i64) {
    for proj in ["gate_proj", "up_proj", "down_proj"] {
        same(plan, format!("layers.{i}.mlp.{proj}.weight"));
    }
}

/// The state-dict plan: Corvid's names are the checkpoint's without `model.`.
pub(crate) fn plan(cfg: &ModelConfig) -> Plan {
    let mut plan = attention_plan(cfg);
    for i in 0..cfg.num_hidden_layers {
        dense_mlp_plan(&mut plan, i);
    }
    plan
}
