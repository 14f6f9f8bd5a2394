//! [`TrainState`]: what a stage trains — the parameters, the policy over them and the
//! optimizer — held by the SFT trainer and then the RL one.

use corvid_model::MoePolicy;
use tch::{nn, Device};

use super::{AdamW, OptimConfig, TrainError};

/// The policy under training. The run checkpoint saves `vs` and `opt`, the weight server
/// publishes `vs`, and a curriculum stage extends `model`'s window; SFT hands the state to
/// RL, which starts a fresh optimizer with its own schedule ([`TrainState::restart_optimizer`]).
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

    /// The same parameters and policy with a fresh optimizer (moments zero, step 0).
    pub fn restart_optimizer(self, optim: OptimConfig) -> Result<Self, TrainError> {
        Self::new(self.vs, self.model, optim)
    }

    /// Where the parameters live.
    pub fn device(&self) -> Device {
        self.vs.device()
    }
}
