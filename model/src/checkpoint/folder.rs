//! Policy folders on disk: `config.json` beside the weights, which are one `model.safetensors`
//! or the shards that `model.safetensors.index.json` names (the Hugging Face layout, whose
//! `weight_map` sends each tensor name to its shard file).
//!
//! Weight files are memory-mapped, never read whole into memory: each tensor is copied from
//! the mapping into its variable. [`save`] is the one writer of policy folders.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Component, Path};

use ::safetensors::tensor::TensorView;
use corvid_durable::replace_file;
use memmap2::{Mmap, UncheckedAdvice};
use serde::Deserialize;
use tch::{nn, Device, Kind};

use super::safetensors::{bad, kind_and_shape, load_views, parse, weights_to_bytes, HEADER};
use crate::config::ModelConfig;
use crate::policy::MoePolicy;
use crate::precision::weight_kind_for;
use crate::ModelError;

/// File name of the weights inside a checkpoint folder.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// File name of the config inside a checkpoint folder.
pub const CONFIG_FILE: &str = "config.json";
/// File name of the shard index of a folder whose weights are split over several files.
pub const WEIGHTS_INDEX_FILE: &str = "model.safetensors.index.json";

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ModelError + '_ {
    move |source| ModelError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Writes the policy folder `dir` (made if missing): `model.safetensors` and `config.json`,
/// each replaced whole (temporary, fsync, rename) and the folder fsynced, so a crash at any
/// point leaves every file either old or new. This is the one writer of policy folders: the
/// run checkpoints, the reference policy and exported policies all go through it.
pub fn save(vs: &nn::VarStore, cfg: &ModelConfig, dir: &Path) -> Result<(), ModelError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let weights = dir.join(WEIGHTS_FILE);
    replace_file(&weights, &weights_to_bytes(vs)?).map_err(io(&weights))?;
    let config = dir.join(CONFIG_FILE);
    let text = serde_json::to_string_pretty(cfg).expect("config serialises");
    replace_file(&config, text.as_bytes()).map_err(io(&config))
}

/// The kind most of a folder's weights are stored in (`model.safetensors` or its shards, read
/// through the maps, nothing copied): what an export keeps unless told otherwise.
pub fn stored_kind(dir: &Path) -> Result<Kind, ModelError> {
    with_views(dir, |views, _| {
        let mut counts: Vec<(Kind, usize)> = Vec::new();
        for (name, view) in views {
            let (kind, _) = kind_and_shape(name, view)?;
            match counts.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, n)) => *n += 1,
                None => counts.push((kind, 1)),
            }
        }
        counts
            .into_iter()
            .max_by_key(|(_, n)| *n)
            .map(|(kind, _)| kind)
            .ok_or_else(|| bad(HEADER, "the folder's weights hold no tensors"))
    })
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
    load_weights(&vs, dir)?;
    Ok((vs, model))
}

/// Copies the weights of the folder `dir` into `vs`, as strictly as
/// [`load_weights_from_bytes`](super::load_weights_from_bytes): from `model.safetensors`, or,
/// when the folder has none, from the shards that `model.safetensors.index.json` names.
pub fn load_weights(vs: &nn::VarStore, dir: &Path) -> Result<(), ModelError> {
    with_views(dir, |tensors, _| load_views(vs, tensors))
}

/// Lets the OS drop a mapped tensor's resident pages once its data has been copied out, so a
/// load that releases each tensor after copying it holds about one tensor of the file in
/// memory rather than the whole file.
pub(crate) struct Release<'a> {
    maps: Vec<&'a Mmap>,
}

impl Release<'_> {
    /// Alignment of the released range: a multiple of every page size Linux uses, so that
    /// pages shared with a neighbouring tensor are never released.
    const ALIGN: usize = 64 << 10;

    /// Releases the whole aligned pages inside `view`'s data, if it lies in one of the maps.
    /// Best effort: where the OS refuses the advice the pages simply stay resident.
    pub(crate) fn pages_of(&self, view: &TensorView<'_>) {
        let data = view.data();
        let (ptr, len) = (data.as_ptr() as usize, data.len());
        let Some(map) = self.maps.iter().find(|m| {
            let base = m.as_ptr() as usize;
            ptr >= base && ptr + len <= base + m.len()
        }) else {
            return;
        };
        let offset = ptr - map.as_ptr() as usize;
        let start = offset.next_multiple_of(Self::ALIGN);
        let end = (offset + len) / Self::ALIGN * Self::ALIGN;
        if end > start {
            // SAFETY: the map is a read-only mapping of a file Corvid never writes in place
            // (see `map_file`): MADV_DONTNEED only drops resident pages, and a later read
            // faults them in again from the file with the same bytes.
            let _ = unsafe {
                map.unchecked_advise_range(UncheckedAdvice::DontNeed, start, end - start)
            };
        }
    }
}

/// Memory-maps the weights of the folder `dir` (`model.safetensors`, or the shards that
/// `model.safetensors.index.json` names, checked against the index) and hands every tensor,
/// by name, to `use_views` while the maps live, with a [`Release`] for the pages of tensors
/// it has copied. No tensor data is copied here.
pub(crate) fn with_views<T>(
    dir: &Path,
    use_views: impl FnOnce(&BTreeMap<String, TensorView<'_>>, &Release<'_>) -> Result<T, ModelError>,
) -> Result<T, ModelError> {
    let single = dir.join(WEIGHTS_FILE);
    let index = dir.join(WEIGHTS_INDEX_FILE);
    if !single.exists() && index.exists() {
        return with_shards(dir, &index, use_views);
    }
    let map = map_file(&single)?;
    let file = parse(&map)?;
    let tensors = file
        .iter()
        .map(|(name, view)| (name.to_string(), view))
        .collect();
    use_views(&tensors, &Release { maps: vec![&map] })
}

/// Maps `path` read-only.
fn map_file(path: &Path) -> Result<Mmap, ModelError> {
    let file = File::open(path).map_err(io(path))?;
    // SAFETY: the map is read-only and lives only while one load copies out of it. A file
    // changed in place meanwhile would change the bytes under the parser (or fault, if cut
    // short); Corvid never does that: [`save`] replaces files by rename, which leaves a
    // mapped file as it was.
    unsafe { Mmap::map(&file) }.map_err(io(path))
}

/// The part of `model.safetensors.index.json` that loading reads.
#[derive(Deserialize)]
struct ShardIndex {
    /// Tensor name to the file (in the same folder) that holds it.
    weight_map: BTreeMap<String, String>,
}

/// Maps the shards that the index at `index_path` names and hands their tensors to
/// `use_views`. The index and the shards must agree: each shard holds exactly the tensors the
/// index puts in it.
fn with_shards<T>(
    dir: &Path,
    index_path: &Path,
    use_views: impl FnOnce(&BTreeMap<String, TensorView<'_>>, &Release<'_>) -> Result<T, ModelError>,
) -> Result<T, ModelError> {
    let text = std::fs::read_to_string(index_path).map_err(io(index_path))?;
    let index: ShardIndex = serde_json::from_str(&text)
        .map_err(|e| bad(HEADER, format!("{WEIGHTS_INDEX_FILE}: {e}")))?;
    let mut maps: BTreeMap<&str, Mmap> = BTreeMap::new();
    for (tensor, shard) in &index.weight_map {
        let mut parts = Path::new(shard).components();
        if !matches!(
            (parts.next(), parts.next()),
            (Some(Component::Normal(_)), None)
        ) {
            return Err(bad(
                tensor,
                format!("{WEIGHTS_INDEX_FILE} puts it in {shard:?}, which is not a file name"),
            ));
        }
        if !maps.contains_key(shard.as_str()) {
            maps.insert(shard, map_file(&dir.join(shard))?);
        }
    }
    let mut tensors: BTreeMap<String, TensorView<'_>> = BTreeMap::new();
    for (shard, map) in &maps {
        let file = parse(map).map_err(|e| in_shard(e, shard))?;
        let mut views: Vec<_> = file.iter().collect();
        views.sort_by_key(|(name, _)| *name);
        for (name, view) in views {
            match index.weight_map.get(name) {
                Some(listed) if listed == shard => {
                    tensors.insert(name.to_string(), view);
                }
                Some(listed) => {
                    return Err(bad(
                        name,
                        format!("in {shard}, but {WEIGHTS_INDEX_FILE} puts it in {listed}"),
                    ))
                }
                None => {
                    return Err(bad(
                        name,
                        format!("in {shard}, but not in {WEIGHTS_INDEX_FILE}"),
                    ))
                }
            }
        }
    }
    if let Some((name, shard)) = index
        .weight_map
        .iter()
        .find(|(name, _)| !tensors.contains_key(*name))
    {
        return Err(bad(
            name,
            format!("{WEIGHTS_INDEX_FILE} puts it in {shard}, which does not hold it"),
        ));
    }
    let release = Release {
        maps: maps.values().collect(),
    };
    use_views(&tensors, &release)
}

/// Says which shard a parse error comes from.
fn in_shard(e: ModelError, shard: &str) -> ModelError {
    match e {
        ModelError::Checkpoint { tensor, problem } => ModelError::Checkpoint {
            tensor,
            problem: format!("in {shard}: {problem}"),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::super::safetensors::tensors_to_bytes;
    use super::*;
    use tch::{Kind, Tensor};

    fn tensors() -> BTreeMap<String, Tensor> {
        ["embed", "layer_0", "layer_1", "norm"]
            .into_iter()
            .enumerate()
            .map(|(i, name)| {
                let t = Tensor::arange(6, (Kind::Float, Device::Cpu)).reshape([2, 3]) + i as f64;
                (name.to_string(), t)
            })
            .collect()
    }

    /// A store with the variables of [`tensors`], all zero.
    fn zeroed() -> nn::VarStore {
        let vs = nn::VarStore::new(Device::Cpu);
        for (name, t) in tensors() {
            let _ = vs.root().add(&name, t.zeros_like(), true);
        }
        vs
    }

    fn assert_loaded(vs: &nn::VarStore) {
        let got = vs.variables();
        for (name, t) in tensors() {
            assert!(got[&name].equal(&t), "{name}");
        }
    }

    /// Writes [`tensors`] as two shards and their index, with `edit` applied to the index.
    fn write_shards(dir: &Path, edit: impl FnOnce(&mut BTreeMap<String, String>)) {
        let all = tensors();
        let mut weight_map = BTreeMap::new();
        for (shard, names) in [
            ("model-00001-of-00002.safetensors", ["embed", "layer_0"]),
            ("model-00002-of-00002.safetensors", ["layer_1", "norm"]),
        ] {
            let part: BTreeMap<String, Tensor> = names
                .iter()
                .map(|&n| (n.to_string(), all[n].shallow_clone()))
                .collect();
            std::fs::write(dir.join(shard), tensors_to_bytes(&part).unwrap()).unwrap();
            for n in names {
                weight_map.insert(n.to_string(), shard.to_string());
            }
        }
        edit(&mut weight_map);
        let index = serde_json::json!({"metadata": {"total_size": 96}, "weight_map": weight_map});
        std::fs::write(dir.join(WEIGHTS_INDEX_FILE), index.to_string()).unwrap();
    }

    #[test]
    fn a_single_file_loads_through_a_map() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(WEIGHTS_FILE);
        std::fs::write(&path, tensors_to_bytes(&tensors()).unwrap()).unwrap();
        let vs = zeroed();
        load_weights(&vs, dir.path()).unwrap();
        assert_loaded(&vs);

        std::fs::write(&path, b"").unwrap();
        let e = load_weights(&vs, dir.path()).unwrap_err().to_string();
        assert!(e.contains("`<header>`"), "{e}");
        std::fs::remove_file(&path).unwrap();
        let e = load_weights(&vs, dir.path()).unwrap_err().to_string();
        assert!(e.contains(WEIGHTS_FILE), "{e}");
    }

    #[test]
    fn sharded_weights_load_through_their_index() {
        let dir = tempfile::tempdir().unwrap();
        write_shards(dir.path(), |_| {});
        let vs = zeroed();
        load_weights(&vs, dir.path()).unwrap();
        assert_loaded(&vs);
    }

    #[test]
    fn an_index_that_disagrees_with_its_shards_names_the_tensor() {
        const FIRST: &str = "model-00001-of-00002.safetensors";
        // Each case moves a tensor to a shard in the index, or drops it from the index (None).
        for (tensor, shard, want) in [
            (
                "norm",
                Some(FIRST),
                "`norm`: in model-00002-of-00002.safetensors, but",
            ),
            (
                "layer_1",
                None,
                "`layer_1`: in model-00002-of-00002.safetensors, but not in",
            ),
            (
                "extra",
                Some(FIRST),
                "`extra`: model.safetensors.index.json puts it in",
            ),
            (
                "embed",
                Some("../x.safetensors"),
                "`embed`: model.safetensors.index.json puts it in \"../",
            ),
        ] {
            let dir = tempfile::tempdir().unwrap();
            write_shards(dir.path(), |m| match shard {
                Some(shard) => {
                    m.insert(tensor.into(), shard.into());
                }
                None => {
                    m.remove(tensor);
                }
            });
            let vs = zeroed();
            let e = load_weights(&vs, dir.path()).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }

        let dir = tempfile::tempdir().unwrap();
        write_shards(dir.path(), |_| {});
        let shard = dir.path().join("model-00002-of-00002.safetensors");
        let bytes = std::fs::read(&shard).unwrap();
        std::fs::write(&shard, &bytes[..bytes.len() - 4]).unwrap();
        let e = load_weights(&zeroed(), dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("`norm`: in model-00002-of-00002.safetensors: ") && e.contains("truncated"),
            "{e}"
        );
    }
}
