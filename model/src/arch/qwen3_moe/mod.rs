//! Qwen3-MoE (`Qwen3MoeForCausalLM`, e.g. Qwen3-30B-A3B): translation only. Qwen3's
//! grouped-query attention with q/k norms ([`super::qwen3`]) and, in the layers
//! `decoder_sparse_step` and `mlp_only_layers` pick, softmax top-k routing over routed experts
//! without shared experts or a selection bias (the shared `router`, `experts` and `moe`
//! layers); the other layers keep a dense MLP. The keys, defaults and parity figures are in
//! this folder's README.

use serde_json::json;

use super::adapter::{Plan, Source};
use super::keys::Keys;
use super::qwen3::{attention_config, attention_plan, dense_mlp_plan, same, Defaults};
use super::{expert_sources, HfLayout};
use crate::config::{BalanceMode, ModelConfig, ScoreFunc};
use crate::ModelError;

/// `model_type` of this family.
pub const MODEL_TYPE: &str = "qwen3_moe";

/// transformers' `Qwen3MoeConfig` defaults.
const QWEN3_MOE: Defaults = Defaults {
    vocab_size: 151_936,
    hidden_size: 2048,
    intermediate_size: 6144,
    num_hidden_layers: 24,
    num_attention_heads: 32,
    num_key_value_heads: Some(4),
    head_dim: None,
    max_position_embeddings: 32_768,
};

mod default {
    pub const MOE_INTERMEDIATE_SIZE: i64 = 768;
    pub const NUM_EXPERTS_PER_TOK: i64 = 8;
    pub const NUM_EXPERTS: i64 = 128;
}

/// Reads the keys of a `qwen3_moe` config.
pub(crate) fn config(keys: &mut Keys) -> Result<(ModelConfig, HfLayout), ModelError> {
    // transformers' training-time auxiliary loss runs only with `output_router_logits`; a
    // checkpoint trained or served without it is what Corvid reproduces.
    keys.only(
        "output_router_logits",
        json!(false),
        "no auxiliary balance loss, as transformers without router logits",
    )?;
    keys.metadata(&["router_aux_loss_coef"]);
    let base = attention_config(keys, &QWEN3_MOE)?;
    // transformers 5 writes the count as `num_local_experts` (its `num_experts` attribute's
    // serialised name); hub configs say `num_experts`.
    let experts = match keys.opt_i64("num_experts")? {
        Some(n) => {
            if let Some(m) = keys.opt_i64("num_local_experts")? {
                if m != n {
                    return Err(
                        keys.error("num_local_experts", format!("{m}, but num_experts is {n}"))
                    );
                }
            }
            n
        }
        None => keys.i64_or("num_local_experts", default::NUM_EXPERTS)?,
    };
    let mlp_only_layers = keys.i64_list("mlp_only_layers")?;
    let cfg = ModelConfig {
        mlp_only_layers,
        decoder_sparse_step: keys.i64_or("decoder_sparse_step", 1)?,
        n_routed_experts: experts,
        num_experts_per_tok: keys.i64_or("num_experts_per_tok", default::NUM_EXPERTS_PER_TOK)?,
        moe_intermediate_size: keys
            .i64_or("moe_intermediate_size", default::MOE_INTERMEDIATE_SIZE)?,
        scoring_func: ScoreFunc::Softmax,
        norm_topk_prob: keys.bool_or("norm_topk_prob", false)?,
        routed_scaling_factor: 1.0,
        balance: BalanceMode::None,
        ..base
    };
    Ok((
        cfg,
        HfLayout {
            rope_interleave: false,
        },
    ))
}

/// The state-dict plan: Corvid's names are the checkpoint's without `model.`, except the
/// stacked experts.
pub(crate) fn plan(cfg: &ModelConfig, names: &[&str]) -> Plan {
    let mut plan = attention_plan(cfg);
    for i in 0..cfg.num_hidden_layers {
        if cfg.is_moe_layer(i) {
            let mlp = format!("layers.{i}.mlp");
            same(&mut plan, format!("{mlp}.gate.weight"));
            // Qwen3-MoE selects on the plain scores: Corvid's selection bias stays zero.
            plan.sources
                .insert(format!("{mlp}.gate.e_score_correction_bias"), Source::Zeros);
            expert_sources(
                &mut plan,
                &mlp,
                &format!("model.{mlp}"),
                cfg.n_routed_experts,
                names,
            );
        } else {
            dense_mlp_plan(&mut plan, i);
        }
    }
    plan
}
