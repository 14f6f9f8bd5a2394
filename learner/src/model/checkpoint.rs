//! Checkpoints: safetensors with the VarStore's stable names, plus the config as JSON beside.
//!
//! The safetensors format is written and read here directly (8-byte little-endian header
//! length, JSON header `{name: {dtype, shape, data_offsets}}`, raw little-endian data) so a
//! bad file gets an error that names the tensor and the problem, and so weights can go to and
//! from bytes for streaming to actors. Loading is strict: every model tensor must be present
//! with the same shape; extra tensors are an error too.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};
use tch::{nn, Device, Kind, Tensor};

use super::config::ModelConfig;
use super::model::MoePolicy;
use super::precision::weight_kind_for;
use super::ModelError;

/// File name of the weights inside a checkpoint folder.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// File name of the config inside a checkpoint folder.
pub const CONFIG_FILE: &str = "config.json";

fn dtype_name(kind: Kind) -> Result<&'static str, ModelError> {
    Ok(match kind {
        Kind::Float => "F32",
        Kind::Double => "F64",
        Kind::BFloat16 => "BF16",
        Kind::Half => "F16",
        Kind::Int64 => "I64",
        other => {
            return Err(ModelError::Checkpoint {
                tensor: String::new(),
                problem: format!("unsupported dtype {other:?}"),
            })
        }
    })
}

fn kind_of(name: &str) -> Option<Kind> {
    Some(match name {
        "F32" => Kind::Float,
        "F64" => Kind::Double,
        "BF16" => Kind::BFloat16,
        "F16" => Kind::Half,
        "I64" => Kind::Int64,
        _ => return None,
    })
}

/// Serialises every variable of `vs` (sorted by name) to safetensors bytes, each in its own
/// dtype (bf16 weights stay bf16: half the bytes to send to actors; the loaders cast).
pub fn weights_to_bytes(vs: &nn::VarStore) -> Result<Vec<u8>, ModelError> {
    let vars: BTreeMap<String, Tensor> = vs.variables().into_iter().collect();
    let mut header = serde_json::Map::new();
    let mut data: Vec<u8> = Vec::new();
    for (name, t) in &vars {
        let t = t.to_device(Device::Cpu).contiguous();
        let numel = t.numel();
        let elem = t.kind().elt_size_in_bytes();
        let start = data.len();
        data.resize(start + numel * elem, 0);
        t.f_copy_data_u8(&mut data[start..], numel)?;
        header.insert(
            name.clone(),
            json!({"dtype": dtype_name(t.kind()).map_err(|e| rename(e, name))?, "shape": t.size(), "data_offsets": [start, data.len()]}),
        );
    }
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut head = serde_json::to_vec(&Value::Object(header)).expect("header serialises");
    while !head.len().is_multiple_of(8) {
        head.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + head.len() + data.len());
    out.extend_from_slice(&(head.len() as u64).to_le_bytes());
    out.extend_from_slice(&head);
    out.extend_from_slice(&data);
    Ok(out)
}

fn rename(e: ModelError, name: &str) -> ModelError {
    match e {
        ModelError::Checkpoint { problem, .. } => ModelError::Checkpoint {
            tensor: name.to_string(),
            problem,
        },
        other => other,
    }
}

fn bad(tensor: &str, problem: impl Into<String>) -> ModelError {
    ModelError::Checkpoint {
        tensor: tensor.to_string(),
        problem: problem.into(),
    }
}

/// Parses safetensors bytes into named CPU tensors, checking every offset and size.
pub fn read_safetensors(bytes: &[u8]) -> Result<BTreeMap<String, Tensor>, ModelError> {
    let header_len = bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize)
        .ok_or_else(|| {
            bad(
                "<header>",
                format!(
                    "file is {} bytes, shorter than the 8-byte header length",
                    bytes.len()
                ),
            )
        })?;
    let head_end = header_len.saturating_add(8);
    let head = bytes.get(8..head_end).ok_or_else(|| {
        bad(
            "<header>",
            format!(
                "truncated: header says {header_len} bytes, file has {}",
                bytes.len().saturating_sub(8)
            ),
        )
    })?;
    let header: serde_json::Map<String, Value> =
        serde_json::from_slice(head).map_err(|e| bad("<header>", format!("not JSON: {e}")))?;
    let data = &bytes[head_end..];
    let mut out = BTreeMap::new();
    for (name, info) in header {
        if name == "__metadata__" {
            continue;
        }
        let dtype = info["dtype"]
            .as_str()
            .ok_or_else(|| bad(&name, "missing dtype"))?;
        let kind =
            kind_of(dtype).ok_or_else(|| bad(&name, format!("unsupported dtype {dtype}")))?;
        let shape: Vec<i64> = info["shape"]
            .as_array()
            .ok_or_else(|| bad(&name, "missing shape"))?
            .iter()
            .map(|v| {
                v.as_i64()
                    .filter(|&d| d >= 0)
                    .ok_or_else(|| bad(&name, "shape entries must be integers >= 0"))
            })
            .collect::<Result<_, _>>()?;
        let offs = info["data_offsets"]
            .as_array()
            .filter(|a| a.len() == 2)
            .ok_or_else(|| bad(&name, "data_offsets must be [start, end]"))?;
        let (start, end) = (
            offs[0].as_u64().unwrap_or(u64::MAX) as usize,
            offs[1].as_u64().unwrap_or(u64::MAX) as usize,
        );
        // Sizes from the file are checked: a product that overflows is a bad header.
        let want = shape
            .iter()
            .try_fold(kind.elt_size_in_bytes(), |n, &d| n.checked_mul(d as usize))
            .ok_or_else(|| bad(&name, format!("shape {shape:?} is too large")))?;
        if end < start || end - start != want {
            return Err(bad(&name, format!("data_offsets [{start}, {end}] hold {} bytes, shape {shape:?} {dtype} needs {want}", end.saturating_sub(start))));
        }
        let raw = data.get(start..end).ok_or_else(|| {
            bad(
                &name,
                format!(
                    "truncated: data ends at byte {} but the tensor needs bytes {start}..{end}",
                    data.len()
                ),
            )
        })?;
        out.insert(name, Tensor::f_from_data_size(raw, &shape, kind)?);
    }
    Ok(out)
}

/// Loads safetensors bytes into `vs`: every variable must be present with its shape; the
/// dtype is converted to the store's.
pub fn load_weights_from_bytes(vs: &nn::VarStore, bytes: &[u8]) -> Result<(), ModelError> {
    let mut file = read_safetensors(bytes)?;
    let vars: BTreeMap<String, Tensor> = vs.variables().into_iter().collect();
    for (name, var) in &vars {
        let src = file
            .remove(name)
            .ok_or_else(|| bad(name, "missing from the checkpoint"))?;
        if src.size() != var.size() {
            return Err(bad(
                name,
                format!(
                    "shape mismatch: checkpoint {:?}, model {:?}",
                    src.size(),
                    var.size()
                ),
            ));
        }
        let mut dst = var.shallow_clone();
        tch::no_grad(|| dst.f_copy_(&src.to_kind(var.kind())))?;
    }
    if let Some(extra) = file.keys().next() {
        return Err(bad(
            extra,
            "in the checkpoint but not in the model (config mismatch?)",
        ));
    }
    Ok(())
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ModelError + '_ {
    move |source| ModelError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Writes `dir/model.safetensors` and `dir/config.json`.
pub fn save(vs: &nn::VarStore, cfg: &ModelConfig, dir: &Path) -> Result<(), ModelError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let weights = dir.join(WEIGHTS_FILE);
    std::fs::write(&weights, weights_to_bytes(vs)?).map_err(io(&weights))?;
    let config = dir.join(CONFIG_FILE);
    let text = serde_json::to_string_pretty(cfg).expect("config serialises");
    std::fs::write(&config, text).map_err(io(&config))?;
    Ok(())
}

/// Reads the config of a checkpoint folder.
pub fn load_config(dir: &Path) -> Result<ModelConfig, ModelError> {
    let path = dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    let cfg: ModelConfig = serde_json::from_str(&text)
        .map_err(|e| ModelError::ConfigParse(format!("{}: {e}", path.display())))?;
    cfg.validate()?;
    Ok(cfg)
}

/// Builds a model from a checkpoint folder on `device`, its weights in
/// [`weight_kind_for`]`(device)` (bf16 on CUDA, fp32 elsewhere; routers fp32) whatever dtype
/// the file holds.
pub fn load(dir: &Path, device: Device) -> Result<(nn::VarStore, MoePolicy), ModelError> {
    let cfg = load_config(dir)?;
    let vs = nn::VarStore::new(device);
    let model = MoePolicy::new_in_kind(&vs, &cfg, weight_kind_for(device))?;
    let path = dir.join(WEIGHTS_FILE);
    let bytes = std::fs::read(&path).map_err(io(&path))?;
    load_weights_from_bytes(&vs, &bytes)?;
    Ok((vs, model))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A safetensors file with `header` as its JSON header and `data` after it.
    fn file(header: &str, data: &[u8]) -> Vec<u8> {
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend(header.as_bytes());
        b.extend(data);
        b
    }

    #[test]
    fn hostile_headers_are_errors_not_panics_or_wraps() {
        let ok = file(
            r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
            &[0; 8],
        );
        assert_eq!(read_safetensors(&ok).unwrap()["w"].size(), [2]);
        let mut huge_len = u64::MAX.to_le_bytes().to_vec();
        huge_len.extend(b"{}");
        for (bytes, what) in [
            (huge_len, "truncated"),
            (
                // [-2, -4] multiplies to 8 elements, the size of the data.
                file(
                    r#"{"w":{"dtype":"F32","shape":[-2,-4],"data_offsets":[0,32]}}"#,
                    &[0; 32],
                ),
                "integers >= 0",
            ),
            (
                file(
                    r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}"#,
                    &[],
                ),
                "too large",
            ),
        ] {
            let e = read_safetensors(&bytes).unwrap_err().to_string();
            assert!(e.contains(what), "{e}");
        }
    }
}
