//! The Corvid learner: the MoE policy, its trainers, the gRPC service actors talk
//! to, and the durable trajectory store.
//!
//! # Brief overview
//!
//! - [`store::TrajectoryStore`] keeps every trajectory in sled: acked means durable,
//!   and no half-written trajectory is ever visible to readers.
//! - [`server::LearnerService`] implements the `corvid.v1.Learner` gRPC service;
//!   [`server::serve`] runs it on a listener with authentication and size limits.
//! - [`model`] is the policy: latent attention with gating and cross-layer sharing,
//!   balanced sparse experts, cached decoding.
//! - [`tokenizer`] is the byte-level tokenizer and chat template.
#![deny(missing_docs)]

pub mod checkpoint;
pub mod collect;
pub mod config;
pub mod durable;
pub mod episode;
pub mod learner;
pub mod metrics;
pub mod model;
pub mod policy_store;
pub mod server;
pub mod sft_data;
pub mod store;
pub mod tokenizer;
pub mod train;
pub mod trainer;
