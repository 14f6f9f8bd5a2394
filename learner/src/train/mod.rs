//! The trainers: a hand-written AdamW whose state can be saved and restored exactly, SFT with
//! sequence packing, and asynchronous policy optimisation with step-level credit.
//!
//! # Public API
//!
//! - [`config`]: [`OptimConfig`], [`SftConfig`], [`RlConfig`], and [`TrainConfig`] (`[train]`:
//!   activation checkpointing, the logits chunk, `max_train_tokens`), serde, documented
//!   defaults.
//! - [`optim::AdamW`]: `new(&VarStore, OptimConfig)`, `step() -> OptimStepStats` (global-norm
//!   clip, scheduled LR, zeroes gradients), `zero_grad()`, `step_count()`, `current_lr()`,
//!   `state_tensors() -> Vec<(String, Tensor)>`, `load_state(&[(String, Tensor)])`,
//!   `save(path)` / `load(path)`; [`optim::lr_at`] is the schedule.
//! - [`pack`]: [`pack::PackedRow`] (tokens, positions restarting per document, document
//!   ids, next-token targets, loss mask), [`pack::first_fit_decreasing`],
//!   [`pack::PackedBatch`] (rows as `[B, T]` tensors; `train` runs the trunk, the chunked
//!   head with the caller's per-token loss and the backward; `score` the log-probs without
//!   gradients).
//! - [`sft`]: [`sft::Example`] `{ ids, mask }` (`Example::from_steps` for an episode),
//!   [`sft::pack`]`(examples, seq_len, pad_id) -> Packing { rows, too_long }`,
//!   [`sft::SftTrainer`]`::{new(vs, model, cfg), step(&rows) -> SftStepStats,
//!   eval_loss(&rows) -> f64, done(), tokens_seen(), into_state()}`.
//! - [`batch`]: [`Trajectory`](corvid_proto::Trajectory) `{ header, steps, footer }`,
//!   [`batch::Group`] (= `Vec<Trajectory>`), [`batch::group_by_id`],
//!   [`batch::select`] (staleness, unscored terminations, uninformative groups; advantages),
//!   [`batch::turn_advantages`], [`batch::tokens_from_turns`].
//! - [`loss`]: each RL loss term as its own function, formulas in the module doc.
//! - [`rl`]: [`rl::RlTrainer`]`::{new(vs, model, reference, cfg), train(&selection, &demos,
//!   take_steps) -> UpdateStats}`, and `update(&groups, current_version)` /
//!   `update_mixed(.., &demos)` (PPO-ptx) / `backward_only(..)`, which select first.
//! - [`state`]: [`TrainState`] `{ vs, model, opt }`, the policy under training.
//! - The model side: [`MoePolicy::trunk_packed`](corvid_model::MoePolicy::trunk_packed)
//!   `(tokens, positions, doc_ids, train, checkpoint)` runs packed rows, attention causal
//!   within each document; [`corvid_model::head`] turns hidden states into scores.
//!
//! Each trainer owns a [`TrainState`]; `state()` / `state_mut()` give the run checkpoint,
//! the weight server and the curriculum access to it, and `into_state()` hands it from SFT
//! to RL.

pub mod batch;
pub mod config;
pub mod loss;
pub mod optim;
pub mod pack;
pub mod rl;
pub mod sft;
pub mod state;

pub use batch::Group;
pub use config::{
    AdvantageMode, OptimConfig, RlConfig, RouterReplay, SftConfig, SftLayout, TrainConfig,
};
pub use optim::{lr_at, AdamW, OptimStepStats};
pub use rl::{RlTrainer, UpdateStats};
pub use sft::{Example, SftStepStats, SftTrainer};
pub use state::TrainState;

use corvid_model::ModelError;

/// Everything that can go wrong configuring or running a trainer.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A config field has a bad value.
    #[error("invalid trainer config: {field} = {value}: {why}")]
    Config {
        /// The field.
        field: &'static str,
        /// Its value.
        value: String,
        /// The rule it breaks.
        why: &'static str,
    },
    /// Training data that cannot be used (misaligned arrays, empty batch, too long).
    #[error("training data: {0}")]
    Data(String),
    /// Optimizer state that does not match the model (restore).
    #[error("optimizer state: {0}")]
    OptimState(String),
    /// The model rejected its input or failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// An advantage or weight computation rejected its input.
    #[error("advantages: {0}")]
    Rewards(#[from] corvid_rewards::RewardsError),
    /// libtorch reported an error.
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}
