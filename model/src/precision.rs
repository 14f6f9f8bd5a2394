//! Weight precision: bf16 weights (and so bf16 activations) on CUDA, with every router kept in
//! fp32 (its weight and its selection bias), as DeepSeek-V3 and torchtitan do: routing
//! decisions compare scores that differ in the third digit, which bf16 would blur.
//!
//! The router already computes in fp32 whatever its input's dtype
//! ([`work_kind`]); keeping its parameters in fp32 also keeps their updates exact.
//! Everything else (embedding, attention, experts, norms, the cross-layer mix) follows `kind`.
//! The cast rewrites the variables in place (`set_data`), so a model built on the store before
//! the cast sees it.

use tch::{nn, Device, Kind};

use super::ModelError;

/// The dtype the numerically sensitive steps compute in, whatever the activations' dtype (the
/// router's scores, the absorbed attention's softmax, the cross-layer mix, the balance loss):
/// f64 for an f64 model (the finite-difference gradient check runs in f64 throughout), fp32
/// otherwise.
pub fn work_kind(kind: Kind) -> Kind {
    if kind == Kind::Double {
        Kind::Double
    } else {
        Kind::Float
    }
}

/// Whether variable `name` belongs to a router (`layers.{i}.mlp.gate.weight` or
/// `layers.{i}.mlp.gate.e_score_correction_bias`).
pub fn is_router_param(name: &str) -> bool {
    name.ends_with(".mlp.gate.weight") || name.ends_with(".mlp.gate.e_score_correction_bias")
}

/// The weight dtype for `device`: bf16 on CUDA, fp32 elsewhere.
pub fn weight_kind_for(device: Device) -> Kind {
    if device.is_cuda() {
        Kind::BFloat16
    } else {
        Kind::Float
    }
}

/// Casts every floating-point variable of `vs` to `kind`, except router parameters, which
/// are set to fp32 (to f64 when `kind` is f64). Returns how many variables changed dtype.
pub fn cast_weights(vs: &nn::VarStore, kind: Kind) -> Result<usize, ModelError> {
    if !matches!(
        kind,
        Kind::Float | Kind::BFloat16 | Kind::Half | Kind::Double
    ) {
        return Err(ModelError::Input(format!(
            "weights can be cast to a floating-point dtype only, got {kind:?}"
        )));
    }
    let mut changed = 0;
    for (name, mut var) in vs.variables() {
        if !var.is_floating_point() {
            continue;
        }
        let target = if is_router_param(&name) && kind != Kind::Double {
            Kind::Float
        } else {
            kind
        };
        if var.kind() != target {
            let cast = var.f_to_kind(target)?;
            tch::no_grad(|| var.set_data(&cast));
            changed += 1;
        }
    }
    Ok(changed)
}
