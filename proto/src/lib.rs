//! The protocol between Corvid actors and the learner, and the domain types every
//! other Corvid crate speaks.
//!
//! # Brief overview
//!
//! - [`pb`] holds the code generated from `corvid/v1/learner.proto` (prost messages,
//!   the tonic `Learner` client); [`received`] the server, which takes each step as the
//!   bytes that came. Nothing outside this crate and the gRPC edges of the learner and
//!   actor touches them.
//! - [`types`] holds the domain types: [`TaskRef`], [`TrajectoryHeader`], [`Step`],
//!   [`TrajectoryFooter`] and friends, with validated conversions to and from the
//!   wire ([`TryFrom`] from `pb`, [`From`] into `pb`).
//! - [`synthetic`] makes deterministic trajectories for tests and benchmarks.
//! - [`limits`] fixes the message and chunk sizes both sides enforce.
//! - [`checked`] checks a step once at the trajectory edge ([`CheckedStep`]) and keeps the
//!   bytes the store writes.
//! - [`routes`] packs and checks the expert ids an MoE actor records per token
//!   ([`RouteShape`]).
//! - [`auth`] builds and checks the shared-token metadata; [`client`] connects
//!   with it and turns a trajectory into the part stream `SubmitTrajectory` takes.
//!
//! ```
//! use corvid_proto::{Step, ProtoError};
//! let step = Step::generated(0, vec![7, 8], vec![-0.1, -0.2], 3);
//! let wire = corvid_proto::pb::Step::from(step.clone());
//! assert_eq!(Step::try_from(wire)?, step);
//! # Ok::<(), ProtoError>(())
//! ```
#![deny(missing_docs)]

pub mod assignment;
pub mod auth;
pub mod checked;
pub mod client;
pub mod limits;
pub mod routes;
pub mod synthetic;
pub mod trajectory;
pub mod types;

/// Code generated from `corvid/v1/learner.proto`: its messages and the `Learner` client.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("corvid.v1");
}

/// The `Learner` server, generated from `learner.proto` with `StepChunk.step` received as
/// the bytes that came (the same on the wire as the `Step` message clients send), so that
/// the learner checks a step once and stores exactly what arrived ([`checked`]). Every
/// other type is [`pb`]'s.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod received {
    include!(concat!(env!("OUT_DIR"), "/received/corvid.v1.rs"));
}

/// The standard gRPC health protocol's messages and client (`grpc.health.v1`), which the
/// learner serves beside `corvid.v1.Learner`.
pub use tonic_health::pb as health;

pub use assignment::{Assignment, ContextFold, Fold};
pub use checked::{CheckedStep, StepRules};
pub use routes::RouteShape;
pub use trajectory::{step_segments, Trajectory, TurnTotals};
pub use types::{
    validate_trajectory_id, ProtoError, SamplingParams, Step, StepTimings, TaskRef, Termination,
    ToolCall, ToolResult, ToolStatus, TrajectoryFooter, TrajectoryHeader,
};
