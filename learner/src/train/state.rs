//! [`TrainState`]: what a stage trains — the parameters, the policy over them and the
//! optimizer — held by the SFT trainer and then the RL one.

use corvid_model::MoePolicy;
use tch::{nn, Device};

use super::{AdamW, OptimConfig, TrainError};

/// The policy under training. The run checkpoint saves `vs` and `opt`, the weight server
/// publishes `vs`, and a curriculum stage extends `model`'s window. SFT hands `vs` and `model`
/// to RL, which starts a fresh optimizer with its own schedule.
#[derive(Debug)]
pub struct TrainState {
    /// The parameters.
    pub vs: nn::VarStore,
    /// The policy, reading its weights from `vs`.
    pub model: MoePolicy,
    /// The optimizer over `vs`'s trainable variables.
    pub opt: AdamW,
}

impl TrainState {
    /// `model` over `vs`, with a fresh optimizer configured by `optim`.
    pub fn new(vs: nn::VarStore, model: MoePolicy, optim: OptimConfig) -> Result<Self, TrainError> {
        let opt = AdamW::new(&vs, optim)?;
        Ok(Self { vs, model, opt })
    }

    /// Where the parameters live.
    pub fn device(&self) -> Device {
        self.vs.device()
    }
}
