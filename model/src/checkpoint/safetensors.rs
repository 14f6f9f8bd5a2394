//! The safetensors format through Hugging Face's `safetensors` crate: weights to bytes and
//! back, and the strict copy of parsed tensors into a VarStore.
//!
//! The crate parses and validates: the 8-byte little-endian header length, the JSON header
//! `{name: {dtype, shape, data_offsets}}`, offsets that tile the data exactly, sizes that match
//! shape and dtype. Where its error does not say which tensor is at fault, [`explain`] reads the
//! header again to find it, so every error is a [`ModelError::Checkpoint`] naming a tensor, or
//! `<header>` when the fault is the file's as a whole. Loading is strict: every variable of the
//! model present with its shape, no tensor left over, and nothing copied unless all of that
//! holds. F32, F64, BF16, F16 and I64 tensors are cast into each variable's kind.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

use ::safetensors::tensor::{Dtype, SafeTensorError, TensorInfo, TensorView, View};
use ::safetensors::SafeTensors;
use serde_json::{Map, Value};
use tch::{nn, Device, Kind, TchError, Tensor};

use crate::{ModelError, RopeScaling};

/// The name errors give when the fault is the file's (its length, its header), not a tensor's.
pub(super) const HEADER: &str = "<header>";

/// Bytes of the length prefix before the JSON header.
const LEN_BYTES: usize = 8;

pub(super) fn bad(tensor: &str, problem: impl Into<String>) -> ModelError {
    ModelError::Checkpoint {
        tensor: tensor.to_string(),
        problem: problem.into(),
    }
}

fn kind_of(dtype: Dtype) -> Option<Kind> {
    Some(match dtype {
        Dtype::F32 => Kind::Float,
        Dtype::F64 => Kind::Double,
        Dtype::BF16 => Kind::BFloat16,
        Dtype::F16 => Kind::Half,
        Dtype::I64 => Kind::Int64,
        _ => return None,
    })
}

fn dtype_of(kind: Kind) -> Option<Dtype> {
    Some(match kind {
        Kind::Float => Dtype::F32,
        Kind::Double => Dtype::F64,
        Kind::BFloat16 => Dtype::BF16,
        Kind::Half => Dtype::F16,
        Kind::Int64 => Dtype::I64,
        _ => return None,
    })
}

/// Serialises every variable of `vs` to safetensors bytes, each in its own dtype (bf16
/// weights stay bf16: half the bytes to send to actors; the loaders cast). The same store
/// always gives the same bytes.
pub fn weights_to_bytes(vs: &nn::VarStore) -> Result<Vec<u8>, ModelError> {
    let vars: BTreeMap<String, Tensor> = vs.variables().into_iter().collect();
    tensors_to_bytes(&vars)
}

/// The safetensors metadata key of the RoPE scaling a policy blob runs under, when it is not
/// its model config's own: a run whose context stages scale RoPE
/// ([`policy_to_bytes`]) publishes each version with the scaling it was trained under.
pub const ROPE_METADATA_KEY: &str = "corvid.rope_scaling";

/// [`weights_to_bytes`] of a policy whose RoPE runs under `rope`, written in the metadata
/// ([`ROPE_METADATA_KEY`]) when it is not `None`, so that whoever loads the blob
/// ([`rope_in_bytes`]) decodes under the scaling the weights were trained under.
pub fn policy_to_bytes(vs: &nn::VarStore, rope: &RopeScaling) -> Result<Vec<u8>, ModelError> {
    let vars: BTreeMap<String, Tensor> = vs.variables().into_iter().collect();
    let rope = match rope {
        RopeScaling::None => None,
        r => Some(serde_json::to_string(r).map_err(|e| bad(HEADER, e.to_string()))?),
    };
    tensors_to_bytes_with(&vars, rope.map(|r| (ROPE_METADATA_KEY.to_string(), r)))
}

/// The RoPE scaling safetensors `bytes` name in their metadata ([`ROPE_METADATA_KEY`]), if
/// any; an unreadable one is an error naming the key.
pub fn rope_in_bytes(bytes: &[u8]) -> Result<Option<RopeScaling>, ModelError> {
    let (_, metadata) = SafeTensors::read_metadata(bytes).map_err(|e| explain(bytes, &e))?;
    metadata
        .metadata()
        .as_ref()
        .and_then(|m| m.get(ROPE_METADATA_KEY))
        .map(|json| {
            serde_json::from_str(json).map_err(|e| {
                bad(
                    HEADER,
                    format!("metadata {ROPE_METADATA_KEY} {json:?}: {e}"),
                )
            })
        })
        .transpose()
}

/// Serialises `tensors` to safetensors bytes with the metadata `{"format": "pt"}`. The crate
/// orders the data by dtype (widest first), then by name.
pub(crate) fn tensors_to_bytes(tensors: &BTreeMap<String, Tensor>) -> Result<Vec<u8>, ModelError> {
    tensors_to_bytes_with(tensors, None)
}

/// [`tensors_to_bytes`] with one more metadata entry.
fn tensors_to_bytes_with(
    tensors: &BTreeMap<String, Tensor>,
    extra: Option<(String, String)>,
) -> Result<Vec<u8>, ModelError> {
    let failure = RefCell::new(None);
    let views = tensors
        .iter()
        .map(|(name, t)| Ok((name.as_str(), Outgoing::new(name, t, &failure)?)))
        .collect::<Result<Vec<_>, ModelError>>()?;
    let mut metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    let several = extra.is_some();
    metadata.extend(extra);
    let bytes = ::safetensors::serialize(views, Some(metadata))
        .map_err(|e| bad(HEADER, format!("serialising: {e}")))?;
    match failure.into_inner() {
        Some((name, e)) => Err(bad(&name, format!("copying to the host: {e}"))),
        None if several => sorted_metadata(bytes),
        None => Ok(bytes),
    }
}

/// `bytes` with the header's `__metadata__` entries in key order: the crate writes them in its
/// `HashMap`'s order, which differs between maps, and the same weights must give the same
/// bytes (actors check a blob's SHA-256; a resumed learner republishes the same version).
fn sorted_metadata(mut bytes: Vec<u8>) -> Result<Vec<u8>, ModelError> {
    let n = bytes
        .get(..LEN_BYTES)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or_else(|| bad(HEADER, "serialised without a header"))? as usize;
    let header = std::str::from_utf8(&bytes[LEN_BYTES..LEN_BYTES + n])
        .map_err(|e| bad(HEADER, e.to_string()))?;
    let prefix = "{\"__metadata__\":";
    let rest = header
        .strip_prefix(prefix)
        .ok_or_else(|| bad(HEADER, "serialised without its metadata first"))?;
    let mut entries =
        serde_json::Deserializer::from_str(rest).into_iter::<BTreeMap<String, String>>();
    let sorted = match entries.next() {
        Some(Ok(map)) => serde_json::to_string(&map).map_err(|e| bad(HEADER, e.to_string()))?,
        _ => return Err(bad(HEADER, "serialised metadata that is not a string map")),
    };
    let (from, to) = (
        LEN_BYTES + prefix.len(),
        LEN_BYTES + prefix.len() + entries.byte_offset(),
    );
    // The same entries written compactly in another order: the same length.
    if to - from != sorted.len() {
        return Err(bad(HEADER, "serialised metadata of an unexpected length"));
    }
    bytes[from..to].copy_from_slice(sorted.as_bytes());
    Ok(bytes)
}

/// One variable on its way into the file. Its bytes are copied to the host only when the
/// crate writes them, so the whole model is never held twice; a copy that fails is kept in
/// `failure` (the crate's [`View`] cannot return an error) and reported once the crate is done.
struct Outgoing<'a> {
    name: &'a str,
    tensor: &'a Tensor,
    dtype: Dtype,
    shape: Vec<usize>,
    len: usize,
    failure: &'a RefCell<Option<(String, TchError)>>,
}

impl<'a> Outgoing<'a> {
    fn new(
        name: &'a str,
        tensor: &'a Tensor,
        failure: &'a RefCell<Option<(String, TchError)>>,
    ) -> Result<Self, ModelError> {
        let kind = tensor.kind();
        let dtype = dtype_of(kind).ok_or_else(|| {
            bad(
                name,
                format!("unsupported dtype {kind:?} (F32, F64, BF16, F16 and I64 are written)"),
            )
        })?;
        let shape = tensor
            .size()
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| bad(name, format!("dimension {d} < 0"))))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            name,
            tensor,
            dtype,
            shape,
            len: tensor.numel() * kind.elt_size_in_bytes(),
            failure,
        })
    }

    fn host_bytes(&self) -> Result<Vec<u8>, TchError> {
        let t = self.tensor.f_to_device(Device::Cpu)?.f_contiguous()?;
        let mut out = vec![0u8; self.len];
        t.f_copy_data_u8(&mut out, t.numel())?;
        Ok(out)
    }
}

impl View for Outgoing<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        match self.host_bytes() {
            Ok(bytes) => Cow::Owned(bytes),
            Err(e) => {
                self.failure
                    .borrow_mut()
                    .get_or_insert((self.name.to_string(), e));
                Cow::Borrowed(&[])
            }
        }
    }

    fn data_len(&self) -> usize {
        self.len
    }
}

/// Parses safetensors bytes (a whole file, in memory or memory-mapped) without copying any
/// tensor data.
pub(super) fn parse(bytes: &[u8]) -> Result<SafeTensors<'_>, ModelError> {
    SafeTensors::deserialize(bytes).map_err(|e| explain(bytes, &e))
}

/// Parses safetensors bytes into named CPU tensors (each in the file's dtype).
pub fn read_safetensors(bytes: &[u8]) -> Result<BTreeMap<String, Tensor>, ModelError> {
    let file = parse(bytes)?;
    let mut out = BTreeMap::new();
    for (name, view) in file.iter() {
        let (kind, shape) = kind_and_shape(name, &view)?;
        out.insert(
            name.to_string(),
            Tensor::f_from_data_size(view.data(), &shape, kind)?,
        );
    }
    Ok(out)
}

/// Loads safetensors bytes into `vs`: every variable must be present with its shape, and no
/// other tensor; each is converted to its variable's dtype. A refused file changes nothing.
pub fn load_weights_from_bytes(vs: &nn::VarStore, bytes: &[u8]) -> Result<(), ModelError> {
    let file = parse(bytes)?;
    let tensors: BTreeMap<String, TensorView<'_>> = file
        .iter()
        .map(|(name, view)| (name.to_string(), view))
        .collect();
    load_views(vs, &tensors)
}

/// Copies `tensors` into the variables of `vs`, each cast to its variable's kind. Every
/// variable must be there with its shape and every tensor must be a variable; nothing is
/// copied unless all of them pass, so a refused file leaves `vs` as it was.
pub(super) fn load_views(
    vs: &nn::VarStore,
    tensors: &BTreeMap<String, TensorView<'_>>,
) -> Result<(), ModelError> {
    let checked: BTreeMap<&str, (Kind, Vec<i64>)> = tensors
        .iter()
        .map(|(name, view)| Ok((name.as_str(), kind_and_shape(name, view)?)))
        .collect::<Result<_, ModelError>>()?;
    let vars: BTreeMap<String, Tensor> = vs.variables().into_iter().collect();
    let mut copies = Vec::with_capacity(vars.len());
    for (name, var) in &vars {
        let (view, (kind, shape)) = tensors
            .get(name)
            .zip(checked.get(name.as_str()))
            .ok_or_else(|| bad(name, "missing from the checkpoint"))?;
        if *shape != var.size() {
            return Err(bad(
                name,
                format!(
                    "shape mismatch: checkpoint {shape:?}, model {:?}",
                    var.size()
                ),
            ));
        }
        copies.push((var, view, *kind, shape));
    }
    if let Some(extra) = tensors.keys().find(|name| !vars.contains_key(*name)) {
        return Err(bad(
            extra,
            "in the checkpoint but not in the model (config mismatch?)",
        ));
    }
    for (var, view, kind, shape) in copies {
        // The crate checked that the view holds exactly `shape` elements of `kind`.
        let src = Tensor::f_from_data_size(view.data(), shape, kind)?;
        let mut dst = var.shallow_clone();
        tch::no_grad(|| dst.f_copy_(&src))?;
    }
    Ok(())
}

/// The tch kind and shape of a parsed tensor, or why it cannot become one.
pub(crate) fn kind_and_shape(
    name: &str,
    view: &TensorView<'_>,
) -> Result<(Kind, Vec<i64>), ModelError> {
    let dtype = view.dtype();
    let kind = kind_of(dtype).ok_or_else(|| {
        bad(
            name,
            format!("unsupported dtype {dtype} (F32, F64, BF16, F16 and I64 load)"),
        )
    })?;
    let shape = view
        .shape()
        .iter()
        .map(|&d| i64::try_from(d))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| bad(name, format!("shape {:?} is too large", view.shape())))?;
    Ok((kind, shape))
}

/// Turns the crate's error into one that names the tensor at fault. The crate names a tensor
/// only for a bad offset; for the other faults of a header that is JSON the header is read
/// again here, entry by entry and in data order, to find the first tensor that breaks the
/// check the crate made.
fn explain(bytes: &[u8], e: &SafeTensorError) -> ModelError {
    let len = bytes.len();
    let claimed = bytes
        .first_chunk::<LEN_BYTES>()
        .map(|b| u64::from_le_bytes(*b))
        .unwrap_or(0);
    match e {
        SafeTensorError::HeaderTooSmall => bad(
            HEADER,
            format!("{e}: the file is {len} bytes, shorter than the 8-byte header length"),
        ),
        SafeTensorError::HeaderTooLarge => bad(
            HEADER,
            format!("{e}: the first 8 bytes give a header of {claimed} bytes (the limit is 100 MB), the file has {len}"),
        ),
        SafeTensorError::InvalidHeaderLength => bad(
            HEADER,
            format!(
                "{e}: truncated, the header is {claimed} bytes but the file has {} after the length",
                len.saturating_sub(LEN_BYTES)
            ),
        ),
        SafeTensorError::InvalidHeader(_) => bad(HEADER, e.to_string()),
        _ => {
            let head_end = usize::try_from(claimed)
                .ok()
                .and_then(|n| n.checked_add(LEN_BYTES))
                .filter(|&end| end <= len);
            let Some(head_end) = head_end else {
                return bad(HEADER, e.to_string());
            };
            let entries = match header_entries(&bytes[LEN_BYTES..head_end], e) {
                Ok(entries) => entries,
                Err(located) => return located,
            };
            match e {
                SafeTensorError::InvalidHeaderDeserialization(_) => bad(HEADER, e.to_string()),
                _ => locate(entries, len - head_end, e),
            }
        }
    }
}

/// The header's tensor entries, or the error naming the first entry (by name) that is not a
/// tensor entry the crate accepts.
fn header_entries(
    head: &[u8],
    e: &SafeTensorError,
) -> Result<Vec<(String, TensorInfo)>, ModelError> {
    let header: Map<String, Value> =
        serde_json::from_slice(head).map_err(|_| bad(HEADER, e.to_string()))?;
    let mut entries = Vec::with_capacity(header.len());
    for (name, entry) in header {
        if name == "__metadata__" {
            serde_json::from_value::<Option<HashMap<String, String>>>(entry).map_err(|err| {
                bad(
                    HEADER,
                    format!(
                        "invalid JSON in header: __metadata__ must map strings to strings: {err}"
                    ),
                )
            })?;
            continue;
        }
        let info = serde_json::from_value::<TensorInfo>(entry)
            .map_err(|err| bad(&name, format!("invalid JSON in header: {err}")))?;
        entries.push((name, info));
    }
    Ok(entries)
}

/// The first tensor, in data order, whose entry breaks the crate's checks against `data_len`
/// bytes of data: offsets that do not follow on from the tensor before, a size that is not
/// shape times dtype, data past the end of the file.
fn locate(
    mut entries: Vec<(String, TensorInfo)>,
    data_len: usize,
    e: &SafeTensorError,
) -> ModelError {
    entries.sort_by_key(|(_, info)| info.data_offsets);
    let mut end = 0;
    for (name, info) in &entries {
        let (start, stop) = info.data_offsets;
        let (shape, dtype) = (&info.shape, info.dtype);
        if start != end || stop < start {
            return bad(
                name,
                format!("{e}: data_offsets [{start}, {stop}] should start at byte {end}, where the data before it ends"),
            );
        }
        let bits = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .and_then(|n| n.checked_mul(dtype.bitsize()));
        let Some(bits) = bits else {
            return bad(name, format!("{e}: shape {shape:?} {dtype} is too large"));
        };
        if bits % 8 != 0 {
            return bad(
                name,
                format!("{e}: shape {shape:?} {dtype} is not a whole number of bytes"),
            );
        }
        if stop - start != bits / 8 {
            return bad(
                name,
                format!(
                    "{e}: data_offsets [{start}, {stop}] hold {} bytes, shape {shape:?} {dtype} needs {}",
                    stop - start,
                    bits / 8
                ),
            );
        }
        if stop > data_len {
            return bad(
                name,
                format!("{e}: truncated, the data ends at byte {data_len} but the tensor needs bytes {start}..{stop}"),
            );
        }
        end = stop;
    }
    if end < data_len {
        return bad(
            HEADER,
            format!(
                "{e}: {} bytes follow the last tensor's data",
                data_len - end
            ),
        );
    }
    bad(HEADER, e.to_string())
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

    /// Each file's error contains both strings: the name (`tensor` or `<header>`) and what.
    fn assert_errors<const N: usize>(cases: [(Vec<u8>, &str, &str); N]) {
        for (bytes, names, what) in cases {
            let e = read_safetensors(&bytes).unwrap_err().to_string();
            assert!(e.contains(names) && e.contains(what), "{e}");
        }
    }

    /// A store holding `vars` as they are (kinds kept).
    fn store(vars: &[(&str, Tensor)]) -> nn::VarStore {
        let vs = nn::VarStore::new(Device::Cpu);
        for (name, t) in vars {
            let _ = vs
                .root()
                .add(name, t.shallow_clone(), t.is_floating_point());
        }
        vs
    }

    fn var(vs: &nn::VarStore, name: &str) -> Tensor {
        vs.variables()[name].shallow_clone()
    }

    /// A policy blob names its RoPE scaling (none when unscaled), loads back like any weights,
    /// and the same weights always give the same bytes, whatever order the crate's map took.
    #[test]
    fn a_policy_blob_names_its_rope_and_its_bytes_are_deterministic() {
        let vs = store(&[
            ("aw", Tensor::from_slice(&[1.0f32, 2.0])),
            ("bw", Tensor::from_slice(&[3.0f32])),
        ]);
        let rope = RopeScaling::Linear { factor: 2.0 };
        let first = policy_to_bytes(&vs, &rope).unwrap();
        for _ in 0..16 {
            assert!(policy_to_bytes(&vs, &rope).unwrap() == first);
        }
        assert_eq!(rope_in_bytes(&first).unwrap(), Some(rope));
        let header = String::from_utf8_lossy(&first[8..]).to_string();
        let (c, f) = (
            header.find(ROPE_METADATA_KEY).unwrap(),
            header.find("\"format\"").unwrap(),
        );
        assert!(c < f, "metadata in key order: {header}");
        let plain = policy_to_bytes(&vs, &RopeScaling::None).unwrap();
        assert!(plain == weights_to_bytes(&vs).unwrap());
        assert_eq!(rope_in_bytes(&plain).unwrap(), None);
        let other = store(&[
            ("aw", Tensor::from_slice(&[0.0f32, 0.0])),
            ("bw", Tensor::from_slice(&[0.0f32])),
        ]);
        load_weights_from_bytes(&other, &first).unwrap();
        assert!(var(&other, "aw").equal(&var(&vs, "aw")));
        // A metadata value that is not a scaling is named.
        let bad_rope = file(
            r#"{"__metadata__":{"corvid.rope_scaling":"{\"type\":\"cubic\"}"},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
            &[0; 4],
        );
        let e = rope_in_bytes(&bad_rope).unwrap_err().to_string();
        assert!(e.contains(ROPE_METADATA_KEY) && e.contains("cubic"), "{e}");
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
        assert_errors([
            (huge_len, "`<header>`", "too large"),
            (
                // [-2, -4] multiplies to 8 elements, the size of the data.
                file(
                    r#"{"w":{"dtype":"F32","shape":[-2,-4],"data_offsets":[0,32]}}"#,
                    &[0; 32],
                ),
                "`w`",
                "expected usize",
            ),
            (
                file(
                    r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}"#,
                    &[],
                ),
                "`w`",
                "too large",
            ),
        ]);
    }

    #[test]
    fn every_bad_file_names_its_tensor_or_the_header() {
        let w = r#""w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}"#;
        assert_errors([
            (vec![], "`<header>`", "shorter than the 8-byte"),
            (vec![1, 0, 0], "`<header>`", "shorter than the 8-byte"),
            (file("{}", &[])[..9].to_vec(), "`<header>`", "truncated"),
            (file("{not json", &[]), "`<header>`", "invalid JSON"),
            (file(r#"[1, 2]"#, &[]), "`<header>`", "invalid JSON"),
            (
                file(&format!(r#"{{{w},"__metadata__":{{"n":1}}}}"#), &[0; 8]),
                "`<header>`",
                "__metadata__",
            ),
            (
                file(
                    r#"{"q":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}}"#,
                    &[0; 8],
                ),
                "`q`",
                "unknown variant",
            ),
            (
                file(
                    r#"{"q":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}}"#,
                    &[0; 8],
                ),
                "`q`",
                "unsupported dtype I32",
            ),
            (
                file(
                    r#"{"q":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
                    &[0; 8],
                ),
                "`q`",
                "hold 8 bytes, shape [3] F32 needs 12",
            ),
            (
                file(
                    &format!(r#"{{{w},"v":{{"dtype":"F32","shape":[1],"data_offsets":[12,16]}}}}"#),
                    &[0; 16],
                ),
                "`v`",
                "should start at byte 8",
            ),
            (
                file(
                    &format!(r#"{{{w},"v":{{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}}}"#),
                    &[0; 10],
                ),
                "`v`",
                "truncated, the data ends at byte 10",
            ),
            (
                file(&format!("{{{w}}}"), &[0; 12]),
                "`<header>`",
                "4 bytes follow",
            ),
        ]);
    }

    #[test]
    fn bytes_round_trip_each_variable_in_its_own_kind() {
        let vs = store(&[
            (
                "f32",
                Tensor::from_slice(&[1.5f32, -2.0, 3.25]).reshape([3, 1]),
            ),
            (
                "bf16",
                Tensor::from_slice(&[0.5f32, 7.0]).to_kind(Kind::BFloat16),
            ),
            ("f64", Tensor::from_slice(&[1e-300f64])),
            ("i64", Tensor::from_slice(&[-3i64, 9])),
            ("scalar", Tensor::from(4.0f32)),
        ]);
        let bytes = weights_to_bytes(&vs).unwrap();
        assert_eq!(bytes, weights_to_bytes(&vs).unwrap(), "deterministic");
        let read = read_safetensors(&bytes).unwrap();
        for (name, t) in vs.variables() {
            assert_eq!(read[&name].kind(), t.kind(), "{name}");
            assert!(read[&name].equal(&t), "{name}");
        }

        // Into a store of other kinds: each tensor is cast to its variable's kind.
        let other = store(&[
            ("f32", Tensor::zeros([3, 1], (Kind::BFloat16, Device::Cpu))),
            ("bf16", Tensor::zeros([2], (Kind::Float, Device::Cpu))),
            ("f64", Tensor::zeros([1], (Kind::Float, Device::Cpu))),
            ("i64", Tensor::zeros([2], (Kind::Double, Device::Cpu))),
            (
                "scalar",
                Tensor::zeros([0i64; 0], (Kind::Half, Device::Cpu)),
            ),
        ]);
        load_weights_from_bytes(&other, &bytes).unwrap();
        for (name, t) in vs.variables() {
            let got = var(&other, &name);
            assert!(got.equal(&t.to_kind(got.kind())), "{name}");
        }
    }

    #[test]
    fn files_in_the_hand_written_layout_load() {
        // Tensors by name, offsets in that order, `__metadata__` first, the header padded with
        // spaces to a multiple of 8: the layout policy folders have been written in.
        let header = r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F64","shape":[2],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[2],"data_offsets":[16,20]},"c":{"dtype":"F16","shape":[1],"data_offsets":[20,22]},"d":{"dtype":"I64","shape":[1],"data_offsets":[22,30]}}"#;
        let mut header = header.to_string();
        while !header.len().is_multiple_of(8) {
            header.push(' ');
        }
        let mut data = Vec::new();
        data.extend(0.25f64.to_le_bytes());
        data.extend((-2.0f64).to_le_bytes());
        data.extend(0x3FC0u16.to_le_bytes()); // bf16 1.5
        data.extend(0xC000u16.to_le_bytes()); // bf16 -2
        data.extend(0x3E00u16.to_le_bytes()); // f16 1.5
        data.extend(7i64.to_le_bytes());
        let vs = store(&[
            ("a", Tensor::zeros([2], (Kind::Float, Device::Cpu))),
            ("b", Tensor::zeros([2], (Kind::Float, Device::Cpu))),
            ("c", Tensor::zeros([1], (Kind::Float, Device::Cpu))),
            ("d", Tensor::zeros([1], (Kind::Int64, Device::Cpu))),
        ]);
        load_weights_from_bytes(&vs, &file(&header, &data)).unwrap();
        assert!(var(&vs, "a").equal(&Tensor::from_slice(&[0.25f32, -2.0])));
        assert!(var(&vs, "b").equal(&Tensor::from_slice(&[1.5f32, -2.0])));
        assert!(var(&vs, "c").equal(&Tensor::from_slice(&[1.5f32])));
        assert!(var(&vs, "d").equal(&Tensor::from_slice(&[7i64])));
    }

    #[test]
    fn loading_is_strict_and_a_refused_file_changes_nothing() {
        let ones = |shape: &[i64]| Tensor::ones(shape, (Kind::Float, Device::Cpu));
        let bytes = weights_to_bytes(&store(&[("a", ones(&[2])), ("b", ones(&[3]))])).unwrap();
        let zeros = |shape: &[i64]| Tensor::zeros(shape, (Kind::Float, Device::Cpu));
        for (vars, want) in [
            (
                vec![("a", zeros(&[2])), ("b", zeros(&[3])), ("c", zeros(&[1]))],
                "`c`: missing from the checkpoint",
            ),
            (
                vec![("a", zeros(&[2])), ("b", zeros(&[4]))],
                "`b`: shape mismatch: checkpoint [3], model [4]",
            ),
            (
                vec![("a", zeros(&[2]))],
                "`b`: in the checkpoint but not in the model",
            ),
        ] {
            let vs = store(&vars);
            let e = load_weights_from_bytes(&vs, &bytes)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{e}");
            assert!(var(&vs, "a").equal(&zeros(&[2])), "{want}: `a` was written");
        }
    }

    #[test]
    fn unsupported_kinds_are_named_when_written() {
        let vs = store(&[("ids", Tensor::from_slice(&[1i32, 2]))]);
        let e = weights_to_bytes(&vs).unwrap_err().to_string();
        assert!(
            e.contains("`ids`") && e.contains("unsupported dtype Int"),
            "{e}"
        );
    }
}
