//! The protocol between Corvid actors and the learner, and the domain types every
//! other Corvid crate speaks.
//!
//! # Brief overview
//!
//! - [`pb`] holds the prost messages generated from `corvid/v1/learner.proto`;
//!   [`encoded`] the tonic `Learner` client and server, which carry each step as its
//!   encoded bytes (an actor encodes a step once, the learner stores the bytes that came).
//!   Nothing outside this crate and the gRPC edges of the learner and actor touches them.
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
mod step_scan;
pub mod synthetic;
pub mod trajectory;
pub mod types;

/// Code generated from `corvid/v1/learner.proto`: its messages.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("corvid.v1");
}

/// The `Learner` client and server, generated from `learner.proto` with `StepChunk.step` as
/// the step's encoded bytes (on the wire the same as the `Step` message): an actor encodes
/// a step once for its journal and the stream, and the learner checks the bytes that came
/// once and stores them as they are ([`checked`]). Every other type is [`pb`]'s.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod encoded {
    include!(concat!(env!("OUT_DIR"), "/encoded/corvid.v1.rs"));
}

impl encoded::TrajectoryPart {
    /// The header's part.
    pub fn header(h: TrajectoryHeader) -> Self {
        Self {
            part: Some(encoded::trajectory_part::Part::Header(h.into())),
        }
    }

    /// Step chunk `seq`, the step encoded once.
    pub fn step(seq: u64, step: Step) -> Self {
        use prost::Message;
        let bytes = pb::Step::from(step).encode_to_vec();
        Self {
            part: Some(encoded::trajectory_part::Part::Step(encoded::StepChunk {
                seq,
                step: Some(bytes.into()),
            })),
        }
    }

    /// The footer's part.
    pub fn footer(f: TrajectoryFooter) -> Self {
        Self {
            part: Some(encoded::trajectory_part::Part::Footer(f.into())),
        }
    }
}

impl From<pb::TrajectoryPart> for encoded::TrajectoryPart {
    /// The same part, its step (if any) encoded.
    fn from(p: pb::TrajectoryPart) -> Self {
        use encoded::trajectory_part::Part as E;
        use pb::trajectory_part::Part as P;
        use prost::Message;
        let part = p.part.map(|part| match part {
            P::Header(h) => E::Header(h),
            P::Footer(f) => E::Footer(f),
            P::Step(c) => E::Step(encoded::StepChunk {
                seq: c.seq,
                step: c.step.map(|s| s.encode_to_vec().into()),
            }),
        });
        Self { part }
    }
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
