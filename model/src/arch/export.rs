//! Writing a model back as a Hugging Face checkpoint that `from_pretrained` reads: the plan
//! that loaded it, inverted (each stacked expert tensor split into the hub's per-expert
//! tensors, de-interleaved RoPE rows put back), in safetensors shards of at most
//! `max_shard_bytes` with `model.safetensors.index.json` when there is more than one, beside
//! the source's `config.json` (its dtype updated, an FP8 `quantization_config` dropped: the
//! weights are no longer FP8) and the files a user loads with it (generation config,
//! tokenizer, chat template).
//!
//! Routers stay fp32 whatever the export dtype, as transformers keeps them
//! (`_keep_in_fp32_modules_strict`). The output folder must be new or empty, so an export
//! never overwrites a model; every file is written whole (temporary, fsync, rename).

use std::collections::BTreeMap;
use std::path::Path;

use corvid_durable::replace_file;
use serde_json::{json, Value};
use tch::{nn, Kind, Tensor};

use super::adapter::Source;
use super::{corvid, deepseek_v3, Family, HfConfig, HfLayout};
use crate::checkpoint::{tensors_to_bytes, CONFIG_FILE, WEIGHTS_FILE, WEIGHTS_INDEX_FILE};
use crate::config::ModelConfig;
use crate::ModelError;

/// Files copied from the source folder when present: what a user loads beside the weights.
const COPIED: &[&str] = &[
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "chat_template_kwargs.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
];

/// What an export wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportReport {
    /// Tensors written.
    pub tensors: usize,
    /// Weight files written (1: `model.safetensors`; more: shards with an index).
    pub shards: usize,
    /// Bytes of tensor data.
    pub bytes: u64,
    /// Files copied from the source folder.
    pub copied: Vec<String>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ModelError + '_ {
    move |source| ModelError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Whether a checkpoint tensor stays fp32 in any export (the router and its bias).
fn keeps_fp32(name: &str) -> bool {
    name.ends_with(".mlp.gate.weight") || name.ends_with(".e_score_correction_bias")
}

/// The safetensors/transformers name of a dtype, for `config.json`.
fn dtype_name(kind: Kind) -> Result<&'static str, ModelError> {
    Ok(match kind {
        Kind::Float => "float32",
        Kind::BFloat16 => "bfloat16",
        Kind::Half => "float16",
        other => {
            return Err(ModelError::Input(format!(
                "export dtype {other:?}: float32, bfloat16 or float16 are written"
            )))
        }
    })
}

/// The checkpoint tensors of a model loaded from `hf`, by their Hugging Face names: views of
/// the variables (transposed experts, re-ordered RoPE rows), not yet cast, so the model is not
/// copied here.
fn hf_tensors(vs: &nn::VarStore, hf: &HfConfig) -> Result<BTreeMap<String, Tensor>, ModelError> {
    let vars: BTreeMap<String, Tensor> = vs.variables().into_iter().collect();
    let var_names: Vec<&str> = vars.keys().map(String::as_str).collect();
    // No checkpoint names: the plan writes the hub's per-expert layout.
    let plan = hf.family.plan(hf, &[], &var_names);
    let mut out = BTreeMap::new();
    for (var_name, var) in &vars {
        let source = plan
            .sources
            .get(var_name)
            .ok_or_else(|| ModelError::Checkpoint {
                tensor: var_name.clone(),
                problem: "the architecture's adapter has no checkpoint name for this variable"
                    .into(),
            })?;
        let var = var.detach();
        match source {
            Source::Same(n) => {
                out.insert(n.clone(), var);
            }
            Source::Rows(n, rows) => {
                let mut inverse = vec![0i64; rows.len()];
                for (i, &r) in rows.iter().enumerate() {
                    inverse[r as usize] = i as i64;
                }
                let t = var.index_select(0, &Tensor::from_slice(&inverse).to_device(var.device()));
                out.insert(n.clone(), t);
            }
            Source::StackTransposed(names) => {
                for (j, n) in names.iter().enumerate() {
                    out.insert(n.clone(), var.get(j as i64).tr());
                }
            }
            Source::FusedHalfTransposed(..) | Source::FusedTransposed(_) => {
                unreachable!("a plan built without checkpoint names writes per-expert tensors")
            }
            Source::Zeros => {
                if var.abs().max().double_value(&[]) != 0.0 {
                    return Err(ModelError::Checkpoint {
                        tensor: var_name.clone(),
                        problem: format!(
                            "is not zero, and a {} checkpoint has no tensor to hold it",
                            hf.family.model_type()
                        ),
                    });
                }
            }
        }
    }
    Ok(out)
}

/// Writes the model in `vs`, loaded from the Hugging Face folder `source` (whose config is
/// `hf`), as a Hugging Face checkpoint in `out` with its weights in `dtype` (routers fp32).
pub fn export(
    vs: &nn::VarStore,
    hf: &HfConfig,
    source: &Path,
    out: &Path,
    dtype: Kind,
    max_shard_bytes: u64,
) -> Result<ExportReport, ModelError> {
    let config_path = source.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&config_path).map_err(io(&config_path))?;
    let mut config: Value = serde_json::from_str(&text).map_err(|e| ModelError::HfConfig {
        file: config_path.display().to_string(),
        key: "<file>".into(),
        problem: format!("not valid JSON: {e}"),
    })?;
    // A policy trained under a context stage's RoPE scaling (a run's `stage_rope`) exports
    // with it, so that transformers decodes it as it was trained.
    if hf.model.rope_scaling != super::read_config(source)?.model.rope_scaling {
        let rope = super::rope_parameters(hf.model.rope_theta, &hf.model.rope_scaling).ok_or_else(
            || {
                ModelError::Input(format!(
                    "the model runs under {:?}, which transformers' rope_parameters cannot hold",
                    hf.model.rope_scaling
                ))
            },
        )?;
        if let Some(c) = config.as_object_mut() {
            c.remove("rope_scaling");
            c.insert("rope_parameters".into(), rope);
        }
    }
    write(vs, hf, config, Some(source), out, (dtype, max_shard_bytes))
}

/// Writes a Corvid-native model (`vs` holding a model of `cfg`) as a Hugging Face checkpoint of
/// `family` in `out`: [`Family::Corvid`] for any model, [`Family::DeepseekV3`] for one without
/// Corvid's own features (the error names each one it has).
pub fn export_native(
    vs: &nn::VarStore,
    cfg: &ModelConfig,
    family: Family,
    out: &Path,
    dtype: Kind,
    max_shard_bytes: u64,
) -> Result<ExportReport, ModelError> {
    let (config, layout) = match family {
        Family::Corvid => (
            corvid::config_json(cfg),
            HfLayout {
                rope_interleave: false,
            },
        ),
        Family::DeepseekV3 => deepseek_v3::from_corvid(cfg)?,
        other => {
            return Err(ModelError::Input(format!(
                "a Corvid-native model exports as corvid or deepseek_v3, not {}",
                other.model_type()
            )))
        }
    };
    let hf = HfConfig {
        family,
        model: cfg.clone(),
        layout,
    };
    write(vs, &hf, config, None, out, (dtype, max_shard_bytes))
}

/// The body of [`export`] and [`export_native`]: `config` becomes `config.json` (its dtype
/// set, an FP8 `quantization_config` dropped), the files a user loads beside the weights are
/// copied from `companions`.
fn write(
    vs: &nn::VarStore,
    hf: &HfConfig,
    mut config: Value,
    companions: Option<&Path>,
    out: &Path,
    (dtype, max_shard_bytes): (Kind, u64),
) -> Result<ExportReport, ModelError> {
    let dtype_str = dtype_name(dtype)?;
    if max_shard_bytes == 0 {
        return Err(ModelError::Input("max shard size must be positive".into()));
    }
    if out.exists() {
        let mut entries = std::fs::read_dir(out).map_err(io(out))?;
        if entries.next().is_some() {
            return Err(ModelError::Input(format!(
                "{} exists and is not empty: an export writes a new folder and never overwrites one",
                out.display()
            )));
        }
    }
    let tensors = hf_tensors(vs, hf)?;
    let kind_of = |name: &str| if keeps_fp32(name) { Kind::Float } else { dtype };
    // Shards in name order, each closed before it would pass the limit.
    let mut shards: Vec<BTreeMap<String, Tensor>> = vec![BTreeMap::new()];
    let (mut in_shard, mut total) = (0u64, 0u64);
    for (name, t) in tensors {
        let bytes = (t.numel() * kind_of(&name).elt_size_in_bytes()) as u64;
        if in_shard > 0 && in_shard + bytes > max_shard_bytes {
            shards.push(BTreeMap::new());
            in_shard = 0;
        }
        in_shard += bytes;
        total += bytes;
        shards.last_mut().expect("one shard").insert(name, t);
    }
    std::fs::create_dir_all(out).map_err(io(out))?;
    let n = shards.len();
    let count = shards.iter().map(BTreeMap::len).sum();
    let mut weight_map = serde_json::Map::new();
    for (i, shard) in shards.iter().enumerate() {
        let file = if n == 1 {
            WEIGHTS_FILE.to_string()
        } else {
            format!("model-{:05}-of-{n:05}.safetensors", i + 1)
        };
        let path = out.join(&file);
        // One shard at a time is cast and serialised, so an export holds at most one shard
        // beside the model.
        let cast: BTreeMap<String, Tensor> = shard
            .iter()
            .map(|(name, t)| {
                (
                    name.clone(),
                    t.to_device(tch::Device::Cpu)
                        .to_kind(kind_of(name))
                        .contiguous(),
                )
            })
            .collect();
        replace_file(&path, &tensors_to_bytes(&cast)?).map_err(io(&path))?;
        for name in shard.keys() {
            weight_map.insert(name.clone(), json!(file));
        }
    }
    if n > 1 {
        let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        let path = out.join(WEIGHTS_INDEX_FILE);
        let text = serde_json::to_string_pretty(&index).expect("index serialises");
        replace_file(&path, text.as_bytes()).map_err(io(&path))?;
    }
    if let Some(obj) = config.as_object_mut() {
        obj.remove("quantization_config");
        let key = if obj.contains_key("torch_dtype") {
            "torch_dtype"
        } else {
            "dtype"
        };
        obj.insert(key.into(), json!(dtype_str));
    }
    let path = out.join(CONFIG_FILE);
    let text = serde_json::to_string_pretty(&config).expect("config serialises");
    replace_file(&path, text.as_bytes()).map_err(io(&path))?;
    let copied = match companions {
        Some(source) => copy_companions(source, out)?,
        None => Vec::new(),
    };
    Ok(ExportReport {
        tensors: count,
        shards: n,
        bytes: total,
        copied,
    })
}

/// Copies the files a user loads beside the weights (generation config, tokenizer, chat
/// template) that `source` has into `out`, each written whole; returns their names.
pub(crate) fn copy_companions(source: &Path, out: &Path) -> Result<Vec<String>, ModelError> {
    let mut copied = Vec::new();
    for file in COPIED {
        let from = source.join(file);
        if from.is_file() {
            let bytes = std::fs::read(&from).map_err(io(&from))?;
            let to = out.join(file);
            replace_file(&to, &bytes).map_err(io(&to))?;
            copied.push(file.to_string());
        }
    }
    Ok(copied)
}
