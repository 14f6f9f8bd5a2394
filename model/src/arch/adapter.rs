//! The state-dict adapter every architecture shares: a [`Plan`] says, for each variable of a
//! Corvid model, which Hugging Face tensors it is made of and how ([`Source`]: as is, rows
//! permuted, experts stacked and transposed, or cut out of fused expert tensors). The
//! architecture folders only write plans; this file checks and copies.
//!
//! Loading is all or nothing. Every source tensor must be in the checkpoint with the shape the
//! plan implies, and every tensor of the checkpoint must be used or named as skipped (DeepSeek's
//! multi-token-prediction layers), before a single value is copied. Each variable is filled on
//! its own from the memory-mapped files, whose pages are released once copied, so the
//! checkpoint is never held twice in memory. FP8
//! e4m3 weights with a `<name>_scale_inv` tensor of 128×128 blocks are dequantised on the way.

use std::collections::{BTreeMap, BTreeSet};

use safetensors::tensor::{Dtype, TensorView};
use tch::{nn, Kind, Tensor};

use crate::checkpoint::{kind_and_shape, Release};
use crate::ModelError;

/// Side of the square weight blocks that one `weight_scale_inv` entry scales (DeepSeek-V3).
const FP8_BLOCK: i64 = 128;

/// How one Corvid variable is made from checkpoint tensors.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Source {
    /// One tensor as it is.
    Same(String),
    /// One tensor with its rows reordered: row `i` of the variable is row `rows[i]`.
    Rows(String, Vec<i64>),
    /// Per-expert `[out, in]` tensors stacked into `[E, in, out]` (Corvid's grouped-GEMM layout).
    StackTransposed(Vec<String>),
    /// One half of a fused `gate_up_proj [E, 2f, d]` (0: gate, 1: up), as `[E, d, f]`.
    FusedHalfTransposed(String, i64),
    /// A fused `down_proj [E, d, f]`, as `[E, f, d]`.
    FusedTransposed(String),
    /// Nothing in the checkpoint: the variable is zero (Qwen3-MoE's routers have no selection
    /// bias). An export checks it still is.
    Zeros,
}

impl Source {
    /// The checkpoint tensors this source reads.
    fn names(&self) -> Vec<&str> {
        match self {
            Source::Same(n)
            | Source::Rows(n, _)
            | Source::FusedHalfTransposed(n, _)
            | Source::FusedTransposed(n) => vec![n.as_str()],
            Source::StackTransposed(ns) => ns.iter().map(String::as_str).collect(),
            Source::Zeros => Vec::new(),
        }
    }
}

/// Every variable's source, and the checkpoint tensors left out on purpose.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// Corvid variable name to its source.
    pub sources: BTreeMap<String, Source>,
    /// Checkpoint tensors that are not part of the model, and why (e.g. an MTP layer).
    pub skip: Vec<(String, &'static str)>,
}

/// What a load read and what it left out.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoadReport {
    /// Checkpoint tensors read.
    pub tensors_read: usize,
    /// Tensors dequantised from FP8 e4m3.
    pub fp8_dequantised: usize,
    /// Checkpoint tensors not loaded, each with the reason.
    pub skipped: Vec<(String, String)>,
}

/// A checkpoint tensor as a CPU tensor of its own dtype, FP8 dequantised to fp32 with its
/// block scales. `views` holds every tensor of the checkpoint.
fn read(views: &BTreeMap<String, TensorView<'_>>, name: &str) -> Result<Tensor, ModelError> {
    let view = views.get(name).ok_or_else(|| missing(name))?;
    if view.dtype() == Dtype::F8_E4M3 {
        return dequantise(views, name, view);
    }
    let (kind, shape) = kind_and_shape(name, view)?;
    Ok(Tensor::f_from_data_size(view.data(), &shape, kind)?)
}

/// `w[i, j] · scale_inv[i / 128, j / 128]` in fp32, for an FP8 e4m3 `w [out, in]`.
fn dequantise(
    views: &BTreeMap<String, TensorView<'_>>,
    name: &str,
    view: &TensorView<'_>,
) -> Result<Tensor, ModelError> {
    let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
    let [rows, cols] = shape[..] else {
        return Err(bad(
            name,
            format!("an FP8 tensor must be 2-D, got shape {shape:?}"),
        ));
    };
    let scale_name = scale_name(name);
    let scale_view = views.get(&scale_name).ok_or_else(|| {
        bad(
            name,
            format!("is FP8 e4m3 but the checkpoint has no `{scale_name}` to dequantise it"),
        )
    })?;
    let (scale_kind, scale_shape) = kind_and_shape(&scale_name, scale_view)?;
    let blocks = [
        (rows + FP8_BLOCK - 1) / FP8_BLOCK,
        (cols + FP8_BLOCK - 1) / FP8_BLOCK,
    ];
    if scale_shape != blocks {
        return Err(bad(
            &scale_name,
            format!(
                "shape {scale_shape:?}, but {name} [{rows}, {cols}] in {FP8_BLOCK}x{FP8_BLOCK} blocks needs {blocks:?}"
            ),
        ));
    }
    let w = Tensor::f_from_data_size(view.data(), &shape, Kind::Float8e4m3fn)?.to_kind(Kind::Float);
    let scale = Tensor::f_from_data_size(scale_view.data(), &scale_shape, scale_kind)?
        .to_kind(Kind::Float)
        .repeat_interleave_self_int(FP8_BLOCK, 0, None)
        .repeat_interleave_self_int(FP8_BLOCK, 1, None)
        .narrow(0, 0, rows)
        .narrow(1, 0, cols);
    Ok(w * scale)
}

/// The name of the block-scale tensor of the FP8 weight `name`.
fn scale_name(name: &str) -> String {
    format!("{name}_scale_inv")
}

/// The block-scale tensor of `name`, by its name, when `name` is stored as FP8.
fn fp8_scale<'v, 'a>(
    views: &'v BTreeMap<String, TensorView<'a>>,
    name: &str,
) -> Option<(&'v String, &'v TensorView<'a>)> {
    views.get(name).filter(|v| v.dtype() == Dtype::F8_E4M3)?;
    views.get_key_value(&scale_name(name))
}

fn bad(tensor: &str, problem: impl Into<String>) -> ModelError {
    ModelError::Checkpoint {
        tensor: tensor.to_string(),
        problem: problem.into(),
    }
}

fn missing(name: &str) -> ModelError {
    bad(name, "missing from the checkpoint")
}

/// The shape a checkpoint tensor has, without reading it.
fn shape_of(views: &BTreeMap<String, TensorView<'_>>, name: &str) -> Result<Vec<i64>, ModelError> {
    let view = views.get(name).ok_or_else(|| missing(name))?;
    match view.dtype() {
        // FP8 loads through `dequantise`; other dtypes must be ones Corvid reads.
        Dtype::F8_E4M3 => Ok(view.shape().iter().map(|&d| d as i64).collect()),
        _ => Ok(kind_and_shape(name, view)?.1),
    }
}

/// The shape `source` produces from the checkpoint, checking its parts agree.
fn produced_shape(
    views: &BTreeMap<String, TensorView<'_>>,
    source: &Source,
) -> Result<Vec<i64>, ModelError> {
    match source {
        Source::Same(n) => shape_of(views, n),
        Source::Rows(n, rows) => {
            let shape = shape_of(views, n)?;
            if shape.first() != Some(&(rows.len() as i64)) {
                return Err(bad(
                    n,
                    format!("shape {shape:?} has not the {} rows expected", rows.len()),
                ));
            }
            Ok(shape)
        }
        Source::StackTransposed(names) => {
            let first = shape_of(views, &names[0])?;
            for n in &names[1..] {
                let s = shape_of(views, n)?;
                if s != first {
                    return Err(bad(
                        n,
                        format!("shape {s:?}, but {} has {first:?}", names[0]),
                    ));
                }
            }
            let [out, inp] = first[..] else {
                return Err(bad(
                    &names[0],
                    format!("expected a 2-D expert weight, got {first:?}"),
                ));
            };
            Ok(vec![names.len() as i64, inp, out])
        }
        Source::FusedHalfTransposed(n, _) => match shape_of(views, n)?[..] {
            [e, two_f, d] if two_f % 2 == 0 => Ok(vec![e, d, two_f / 2]),
            ref s => Err(bad(n, format!("expected [E, 2f, d], got {s:?}"))),
        },
        Source::FusedTransposed(n) => match shape_of(views, n)?[..] {
            [e, d, f] => Ok(vec![e, f, d]),
            ref s => Err(bad(n, format!("expected [E, d, f], got {s:?}"))),
        },
        Source::Zeros => unreachable!("fill checks no shape for a zero source"),
    }
}

/// Copies `source`'s value into `var`. `copy_` converts the dtype and lays out a transposed
/// view in one pass, and stacked experts are copied one at a time, so no stacked or converted
/// temporary exists.
fn copy_into(
    views: &BTreeMap<String, TensorView<'_>>,
    source: &Source,
    var: &Tensor,
) -> Result<(), ModelError> {
    let copy = |mut dst: Tensor, src: Tensor| -> Result<(), ModelError> {
        tch::no_grad(|| dst.f_copy_(&src))?;
        Ok(())
    };
    match source {
        Source::Same(n) => copy(var.shallow_clone(), read(views, n)?),
        Source::Rows(n, rows) => copy(
            var.shallow_clone(),
            read(views, n)?.index_select(0, &Tensor::from_slice(rows)),
        ),
        Source::StackTransposed(names) => {
            for (j, n) in names.iter().enumerate() {
                copy(var.get(j as i64), read(views, n)?.tr())?;
            }
            Ok(())
        }
        Source::FusedHalfTransposed(n, half) => {
            let t = read(views, n)?;
            let f = t.size()[1] / 2;
            copy(
                var.shallow_clone(),
                t.narrow(1, half * f, f).transpose(1, 2),
            )
        }
        Source::FusedTransposed(n) => copy(var.shallow_clone(), read(views, n)?.transpose(1, 2)),
        Source::Zeros => {
            let _ = tch::no_grad(|| var.shallow_clone().f_zero_())?;
            Ok(())
        }
    }
}

/// Fills every variable of `vs` from `views` as `plan` says. Nothing is copied unless every
/// variable has a source of its shape and every checkpoint tensor is used or skipped.
pub(crate) fn fill(
    vs: &nn::VarStore,
    views: &BTreeMap<String, TensorView<'_>>,
    release: &Release<'_>,
    plan: &Plan,
) -> Result<LoadReport, ModelError> {
    let vars: BTreeMap<String, Tensor> = vs.variables().into_iter().collect();
    let mut used: BTreeSet<&str> = BTreeSet::new();
    for (name, var) in &vars {
        let source = plan.sources.get(name).ok_or_else(|| {
            bad(
                name,
                "the architecture's adapter has no source for this variable",
            )
        })?;
        if *source == Source::Zeros {
            continue;
        }
        let shape = produced_shape(views, source)?;
        if shape != var.size() {
            return Err(bad(
                source.names()[0],
                format!(
                    "gives {name} the shape {shape:?}, but the config makes it {:?}",
                    var.size()
                ),
            ));
        }
        for n in source.names() {
            used.insert(n);
            if let Some((scale, _)) = fp8_scale(views, n) {
                used.insert(scale);
            }
        }
    }
    let skipped: BTreeSet<&str> = plan.skip.iter().map(|(n, _)| n.as_str()).collect();
    if let Some(extra) = views
        .keys()
        .find(|n| !used.contains(n.as_str()) && !skipped.contains(n.as_str()))
    {
        return Err(bad(
            extra,
            "in the checkpoint but not part of a model of this config (a config that does not match the weights?)",
        ));
    }
    let mut report = LoadReport {
        skipped: plan
            .skip
            .iter()
            .filter(|(n, _)| views.contains_key(n))
            .map(|(n, why)| (n.clone(), why.to_string()))
            .collect(),
        ..LoadReport::default()
    };
    for (name, var) in &vars {
        let source = &plan.sources[name];
        copy_into(views, source, var)?;
        for n in source.names() {
            report.tensors_read += 1;
            release.pages_of(&views[n]);
            if let Some((_, scale)) = fp8_scale(views, n) {
                report.fp8_dequantised += 1;
                release.pages_of(scale);
            }
        }
    }
    Ok(report)
}
