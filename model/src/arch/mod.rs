//! Hugging Face checkpoints: a folder with `config.json` (whose `model_type` names the
//! architecture) and safetensors weights under Hugging Face names, one file or shards with
//! `model.safetensors.index.json`.
//!
//! Each architecture folder holds translation only: its config keys (with transformers'
//! defaults; a key Corvid does not implement is refused with its name and value) and its
//! state-dict plan (names, stacked experts, row layout). The shared pieces are here:
//! - `keys`: reading a config key by key, refusing what is left;
//! - `adapter`: the plan's sources and the all-or-nothing copy from memory-mapped files, with
//!   FP8 e4m3 block dequantisation;
//! - [`read_config`] / [`load`]: dispatch on `model_type`;
//! - [`export`]: the loading plan inverted, written in shards `from_pretrained` reads.
//!
//! Supported: `deepseek_v3` ([`deepseek_v3`]), `qwen3_moe` ([`qwen3_moe`]), `qwen3`
//! ([`qwen3`]), and Corvid's own models in this layout, `corvid` ([`corvid`]).

mod adapter;
pub mod corvid;
pub mod deepseek_v3;
mod export;
mod keys;
pub mod qwen3;
pub mod qwen3_moe;

use std::path::Path;

use tch::{nn, Device};

pub use adapter::LoadReport;
use adapter::{Plan, Source};
use export::copy_companions;
pub use export::{export, export_native, ExportReport};
use keys::Keys;

use corvid_durable::replace_file;

use crate::checkpoint::{self, with_views, CONFIG_FILE};
use crate::config::{ModelConfig, RopeScaling};
use crate::layers::without_init;
use crate::policy::MoePolicy;
use crate::precision::weight_kind_for;
use crate::ModelError;

/// The architectures Corvid loads, by `model_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `deepseek_v3`.
    DeepseekV3,
    /// `qwen3_moe`.
    Qwen3Moe,
    /// `qwen3`.
    Qwen3,
    /// `corvid`: a Corvid-native model.
    Corvid,
}

impl Family {
    /// The `model_type` string.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::DeepseekV3 => deepseek_v3::MODEL_TYPE,
            Family::Qwen3Moe => qwen3_moe::MODEL_TYPE,
            Family::Qwen3 => qwen3::MODEL_TYPE,
            Family::Corvid => corvid::MODEL_TYPE,
        }
    }

    /// The state-dict plan of a model of this family with config `hf` whose variables are
    /// `vars`; `names` are the checkpoint's tensors (empty when exporting: the plan then
    /// writes the hub's layout).
    pub(crate) fn plan(self, hf: &HfConfig, names: &[&str], vars: &[&str]) -> Plan {
        match self {
            Family::DeepseekV3 => deepseek_v3::plan(&hf.model, &hf.layout, names),
            Family::Qwen3Moe => qwen3_moe::plan(&hf.model, names),
            Family::Qwen3 => qwen3::plan(&hf.model),
            Family::Corvid => corvid::plan(vars),
        }
    }
}

/// How a checkpoint lays out tensors that Corvid holds otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HfLayout {
    /// DeepSeek's RoPE rows are interleaved pairs (`rope_interleave`); Corvid rotates halves.
    pub rope_interleave: bool,
}

/// A Hugging Face config read into Corvid's terms.
#[derive(Clone, Debug, PartialEq)]
pub struct HfConfig {
    /// The architecture.
    pub family: Family,
    /// The model it describes.
    pub model: ModelConfig,
    /// The checkpoint's tensor layout.
    pub layout: HfLayout,
}

/// Reads `dir/config.json`: its `model_type` picks the architecture, whose keys become a
/// validated [`ModelConfig`]. An unknown `model_type`, a key Corvid does not implement, or a
/// value it cannot run is an error naming the file and the key.
pub fn read_config(dir: &Path) -> Result<HfConfig, ModelError> {
    let path = dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&path).map_err(|source| ModelError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let mut keys = Keys::parse(&path, &text)?;
    let model_type = keys.str_or("model_type", "")?;
    let (family, (model, layout)) = match model_type.as_str() {
        deepseek_v3::MODEL_TYPE => (Family::DeepseekV3, deepseek_v3::config(&mut keys)?),
        qwen3_moe::MODEL_TYPE => (Family::Qwen3Moe, qwen3_moe::config(&mut keys)?),
        qwen3::MODEL_TYPE => (Family::Qwen3, qwen3::config(&mut keys)?),
        corvid::MODEL_TYPE => (Family::Corvid, corvid::config(&mut keys)?),
        "" => {
            return Err(keys.error(
                "model_type",
                "missing: a Hugging Face config names its architecture",
            ))
        }
        other => {
            return Err(keys.error(
                "model_type",
                format!("\"{other}\" is not an architecture Corvid loads (supported: deepseek_v3, qwen3_moe, qwen3, corvid)"),
            ))
        }
    };
    keys.finish()?;
    model.validate().map_err(|e| ModelError::HfConfig {
        file: path.display().to_string(),
        key: "<config>".into(),
        problem: format!("the model it describes is not one Corvid can build: {e}"),
    })?;
    Ok(HfConfig {
        family,
        model,
        layout,
    })
}

/// Builds the model of the Hugging Face checkpoint in `dir` on `device` and loads its weights:
/// bf16 weights with fp32 routers on CUDA, fp32 elsewhere, whatever the files hold (fp32, bf16,
/// fp16, or FP8 e4m3 with block scales). Nothing is returned unless every tensor loaded.
pub fn load(
    dir: &Path,
    device: Device,
) -> Result<(nn::VarStore, MoePolicy, HfConfig, LoadReport), ModelError> {
    let hf = read_config(dir)?;
    let vs = nn::VarStore::new(device);
    // Every weight is about to be overwritten: build without drawing random ones.
    let model = without_init(|| MoePolicy::new_in_kind(&vs, &hf.model, weight_kind_for(device)))?;
    let report = load_weights(&vs, dir, &hf)?;
    Ok((vs, model, hf, report))
}

/// Copies the weights of the Hugging Face folder `dir` into `vs`, which holds a model of
/// `hf.model` (a run may set training options on top of the checkpoint's config; its shapes
/// must be the checkpoint's). All or nothing, as [`load`].
pub fn load_weights(
    vs: &nn::VarStore,
    dir: &Path,
    hf: &HfConfig,
) -> Result<LoadReport, ModelError> {
    let var_names: Vec<String> = vs.variables().into_keys().collect();
    let vars: Vec<&str> = var_names.iter().map(String::as_str).collect();
    with_views(dir, |views, release| {
        let names: Vec<&str> = views.keys().map(String::as_str).collect();
        let plan = hf.family.plan(hf, &names, &vars);
        adapter::fill(vs, views, release, &plan)
    })
}

/// The folder inside a policy folder that holds the Hugging Face files of the checkpoint its
/// run started from (`config.json`, generation config, tokenizer): with it, a run checkpoint
/// exports as that architecture ([`open`]).
pub const ORIGIN_DIR: &str = "hf";

/// Copies what a policy folder keeps of its Hugging Face origin (`config.json` and the files
/// loaded beside the weights, not the weights) from `src` into `dst`, each file written whole.
pub fn copy_origin(src: &Path, dst: &Path) -> Result<(), ModelError> {
    let from = src.join(CONFIG_FILE);
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| ModelError::Io { path, source }
    };
    let bytes = std::fs::read(&from).map_err(io(&from))?;
    std::fs::create_dir_all(dst).map_err(io(dst))?;
    let to = dst.join(CONFIG_FILE);
    replace_file(&to, &bytes).map_err(io(&to))?;
    copy_companions(src, dst)?;
    Ok(())
}

/// A model opened from a folder by [`open`].
#[derive(Debug)]
pub struct Opened {
    /// Its variables.
    pub vs: nn::VarStore,
    /// The model.
    pub model: MoePolicy,
    /// Its Hugging Face architecture and the folder of its Hugging Face files, when it has
    /// one: a Hugging Face checkpoint, or a policy folder whose run started from one.
    pub hf: Option<(HfConfig, std::path::PathBuf)>,
}

/// Opens any model folder on `device`: a Hugging Face checkpoint (`config.json` with a
/// `model_type`), a policy folder written by a run that started from one (with its origin in
/// [`ORIGIN_DIR`]), or a Corvid policy folder.
pub fn open(dir: &Path, device: Device) -> Result<Opened, ModelError> {
    let origin = dir.join(ORIGIN_DIR);
    if origin.join(CONFIG_FILE).is_file() {
        let (vs, model) = checkpoint::load(dir, device)?;
        let mut hf = read_config(&origin)?;
        // The run's config: the checkpoint's shapes with the run's training options.
        hf.model = model.config().clone();
        return Ok(Opened {
            vs,
            model,
            hf: Some((hf, origin)),
        });
    }
    if is_hf_config(dir)? {
        let (vs, model, hf, _) = load(dir, device)?;
        return Ok(Opened {
            vs,
            model,
            hf: Some((hf, dir.to_path_buf())),
        });
    }
    let (vs, model) = checkpoint::load(dir, device)?;
    Ok(Opened {
        vs,
        model,
        hf: None,
    })
}

/// Whether `dir/config.json` is a Hugging Face config (it names a `model_type`) rather than a
/// Corvid policy folder's.
fn is_hf_config(dir: &Path) -> Result<bool, ModelError> {
    let path = dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&path).map_err(|source| ModelError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| ModelError::HfConfig {
            file: path.display().to_string(),
            key: "<file>".into(),
            problem: format!("not valid JSON: {e}"),
        })?;
    Ok(value.get("model_type").is_some())
}

/// The rotary settings of a config: `rope_theta` and the scaling, from transformers v5's
/// `rope_parameters` or v4's `rope_theta` + `rope_scaling`. Supported rope types: `default`,
/// `linear` and `yarn` (with `mscale` / `mscale_all_dim` where `deepseek_mscale` says the family's
/// attention reads them).
pub(crate) fn rope_from_keys(
    keys: &mut Keys,
    deepseek_mscale: bool,
) -> Result<(f64, RopeScaling), ModelError> {
    let top_theta = keys.opt_f64("rope_theta")?;
    let params = match keys.object("rope_parameters")? {
        Some(p) => Some(p),
        None => keys.object("rope_scaling")?,
    };
    let Some(mut p) = params else {
        return Ok((top_theta.unwrap_or(10_000.0), RopeScaling::None));
    };
    let theta = match p.opt_f64("rope_theta")? {
        Some(t) => t,
        None => top_theta.unwrap_or(10_000.0),
    };
    let kind = match p.str_or("rope_type", "")?.as_str() {
        "" => p.str_or("type", "default")?,
        t => {
            p.metadata(&["type"]);
            t.to_string()
        }
    };
    let scaling = match kind.as_str() {
        "default" => RopeScaling::None,
        // Position interpolation: transformers divides every frequency by the factor.
        "linear" => RopeScaling::Linear {
            factor: p
                .opt_f64("factor")?
                .ok_or_else(|| p.error("factor", "missing: linear scaling needs a factor"))?,
        },
        "yarn" => {
            let factor = p
                .opt_f64("factor")?
                .ok_or_else(|| p.error("factor", "missing: YaRN needs a factor"))?;
            let original = p
                .opt_i64("original_max_position_embeddings")?
                .ok_or_else(|| {
                    p.error(
                        "original_max_position_embeddings",
                        "missing: YaRN needs the pre-scaling context",
                    )
                })?;
            let (mscale, mscale_all_dim) = if deepseek_mscale {
                (p.f64_or("mscale", 0.0)?, p.f64_or("mscale_all_dim", 0.0)?)
            } else {
                (0.0, 0.0)
            };
            RopeScaling::HfYarn {
                factor,
                original_max_position_embeddings: original,
                // transformers reads `beta_fast or 32`: a zero is the default too.
                beta_fast: Some(p.f64_or("beta_fast", 32.0)?)
                    .filter(|&b| b != 0.0)
                    .unwrap_or(32.0),
                beta_slow: Some(p.f64_or("beta_slow", 1.0)?)
                    .filter(|&b| b != 0.0)
                    .unwrap_or(1.0),
                mscale,
                mscale_all_dim,
                attention_factor: p.opt_f64("attention_factor")?,
                truncate: p.bool_or("truncate", true)?,
            }
        }
        other => {
            return Err(p.error(
                "rope_type",
                format!(
                    "\"{other}\" is not supported (Corvid implements default, linear and yarn)"
                ),
            ))
        }
    };
    p.finish()?;
    Ok((theta, scaling))
}

/// transformers v5's `rope_parameters` for `scaling` at base `theta` (what [`rope_from_keys`]
/// reads back); `None` for Corvid's own `yarn`, whose ramp transformers does not compute
/// (`hf_yarn` is transformers' YaRN).
pub(crate) fn rope_parameters(theta: f64, scaling: &RopeScaling) -> Option<serde_json::Value> {
    match *scaling {
        RopeScaling::None => Some(serde_json::json!({"rope_type": "default", "rope_theta": theta})),
        RopeScaling::HfYarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            mscale,
            mscale_all_dim,
            attention_factor,
            truncate,
        } => {
            let mut p = serde_json::json!({
                "rope_type": "yarn",
                "rope_theta": theta,
                "factor": factor,
                "original_max_position_embeddings": original_max_position_embeddings,
                "beta_fast": beta_fast,
                "beta_slow": beta_slow,
                "truncate": truncate,
            });
            // Zero is transformers' default, and the only value families other than
            // DeepSeek's read.
            for (key, v) in [("mscale", mscale), ("mscale_all_dim", mscale_all_dim)] {
                if v != 0.0 {
                    p[key] = serde_json::json!(v);
                }
            }
            if let Some(a) = attention_factor {
                p["attention_factor"] = serde_json::json!(a);
            }
            Some(p)
        }
        RopeScaling::Linear { factor } => Some(serde_json::json!({
            "rope_type": "linear",
            "rope_theta": theta,
            "factor": factor,
        })),
        RopeScaling::Yarn { .. } => None,
    }
}

/// The sources of one MoE layer's stacked experts (`mlp` is Corvid's prefix, `hf_mlp` the
/// checkpoint's): per-expert `experts.{j}.{gate,up,down}_proj.weight` (the hub format), or
/// fused `experts.gate_up_proj` / `experts.down_proj` where the checkpoint has those.
pub(crate) fn expert_sources(
    plan: &mut Plan,
    mlp: &str,
    hf_mlp: &str,
    experts: i64,
    names: &[&str],
) {
    let fused = format!("{hf_mlp}.experts.gate_up_proj");
    if names.contains(&fused.as_str()) {
        plan.sources.insert(
            format!("{mlp}.experts.w_gate"),
            Source::FusedHalfTransposed(fused.clone(), 0),
        );
        plan.sources.insert(
            format!("{mlp}.experts.w_up"),
            Source::FusedHalfTransposed(fused, 1),
        );
        plan.sources.insert(
            format!("{mlp}.experts.w_down"),
            Source::FusedTransposed(format!("{hf_mlp}.experts.down_proj")),
        );
        return;
    }
    for (var, proj) in [
        ("w_gate", "gate_proj"),
        ("w_up", "up_proj"),
        ("w_down", "down_proj"),
    ] {
        let parts = (0..experts)
            .map(|j| format!("{hf_mlp}.experts.{j}.{proj}.weight"))
            .collect();
        plan.sources.insert(
            format!("{mlp}.experts.{var}"),
            Source::StackTransposed(parts),
        );
    }
}
