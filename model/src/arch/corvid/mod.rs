//! Corvid's own architecture (`model_type = "corvid"`): a model Corvid initialised, written in
//! the Hugging Face folder layout so the same commands load, run and export it. Translation is
//! the identity: `config.json` is the [`ModelConfig`] (every field, serde's names) beside the
//! `PretrainedConfig` keys that do not change the forward, and each variable is stored under its
//! own name with `model.` in front (`lm_head.weight` as it is), experts stacked as Corvid holds
//! them. transformers has no class for it; a Corvid-native model that uses none of Corvid's own
//! features also exports as DeepSeek-V3 (`deepseek_v3::from_corvid`).

use serde_json::{json, Value};

use super::adapter::{Plan, Source};
use super::keys::{Keys, COMMON_METADATA};
use super::HfLayout;
use crate::config::ModelConfig;
use crate::ModelError;

/// `model_type` of this family.
pub const MODEL_TYPE: &str = "corvid";

/// Reads a `corvid` config: the [`ModelConfig`] fields, by name; an unknown one is refused.
pub(crate) fn config(keys: &mut Keys) -> Result<(ModelConfig, HfLayout), ModelError> {
    keys.metadata(COMMON_METADATA);
    let fields = keys.take_all();
    let cfg: ModelConfig =
        serde_json::from_value(Value::Object(fields)).map_err(|e| ModelError::HfConfig {
            file: keys.file().to_string(),
            key: "<config>".into(),
            problem: format!("not a Corvid model config: {e}"),
        })?;
    Ok((
        cfg,
        HfLayout {
            rope_interleave: false,
        },
    ))
}

/// The `config.json` of `cfg` as this family (without the dtype, which the export sets).
pub(crate) fn config_json(cfg: &ModelConfig) -> Value {
    let mut v = serde_json::to_value(cfg).expect("a model config serialises");
    if let Some(obj) = v.as_object_mut() {
        obj.insert("model_type".into(), json!(MODEL_TYPE));
        obj.insert("architectures".into(), json!(["CorvidForCausalLM"]));
    }
    v
}

/// The state-dict plan: every variable of `vars` under `model.` (the head as it is).
pub(crate) fn plan(vars: &[&str]) -> Plan {
    let mut plan = Plan::default();
    for &var in vars {
        let name = match var {
            "lm_head.weight" => var.to_string(),
            _ => format!("model.{var}"),
        };
        plan.sources.insert(var.to_string(), Source::Same(name));
    }
    plan
}
