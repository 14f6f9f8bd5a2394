//! corvid-learner: the learner process. It hands out work to actors, stores what they send,
//! trains the policy on it and publishes new weights, checkpointing a run so that a killed
//! learner resumes where it stopped.
//!
//! # Brief overview
//!
//! - [`learner::run`] wires the process: the tokio runtime with the gRPC service
//!   ([`server::serve`], [`server::LearnerService`]: register, fetch policy, next tasks,
//!   submit) and the Prometheus endpoint, and the trainer thread ([`Trainer`]).
//! - [`dispenser::TaskDispenser`] decides which task groups go to which actor and hands out
//!   a silent actor's episodes again; [`collect::Collector`] turns stored trajectories into
//!   complete groups for the RL trainer, each episode once.
//! - [`train`] holds the trainers: SFT on oracle demonstrations ([`sft_data`]) and RL with
//!   the loss terms of [`train::loss`].
//! - [`checkpoint`] writes and restores run checkpoints (policy, optimizer, curriculum,
//!   dispenser state); [`policy_store`] keeps the weight blobs actors fetch.
//! - [`config::LearnerConfig`] is the TOML config, checked field by field;
//!   [`metrics::UpdateRecord`] is the metrics line every update appends, and the one schema
//!   `corvid report` and `corvid run` read.
//!
//! The model is `corvid-model`, the episode layout `corvid-episode`, the store
//! `corvid-store`: the learner only runs them.
#![deny(missing_docs)]

pub mod checkpoint;
pub mod collect;
pub mod config;
pub mod dispenser;
pub mod learner;
pub mod metrics;
pub mod policy_store;
pub mod server;
pub mod sft_data;
pub mod train;
pub mod trainer;

pub use config::LearnerConfig;
pub use learner::{
    has_checkpoint, prepare, run, LearnerError, LearnerOptions, Prepared, StopReason, Summary,
};
pub use metrics::UpdateRecord;
pub use trainer::Trainer;
