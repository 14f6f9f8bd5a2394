//! `SubmitTrajectory`: one client stream folded into the store chunk by chunk.
//!
//! The order is fixed: one header, step chunks with seq 0, 1, 2, … and no gaps,
//! one footer, end of stream. Anything else is INVALID_ARGUMENT with a message
//! that says what arrived and what was expected; the [`TrajectoryWriter`] is
//! dropped on every error path, which deletes whatever was written, so nothing
//! partial remains.
//!
//! With an [`Admission`] the trajectory is also checked against the learner's policy before
//! anything of it is stored: token ids inside the vocabulary, routes of the policy's shape
//! (none for a dense policy), and routes present where the run replays them.

use std::sync::Arc;

use corvid_proto::limits::MAX_STEP_CHUNK_BYTES;
use corvid_proto::pb::{self, trajectory_part::Part};
use corvid_proto::{RouteShape, Step, TrajectoryFooter, TrajectoryHeader};
use prost::Message;
use tonic::{Status, Streaming};

use corvid_store::{Begin, StoreError, TrajectoryStore, TrajectoryWriter};

fn describe(part: &Option<Part>) -> String {
    match part {
        Some(Part::Header(h)) => format!("a header for trajectory {:?}", h.trajectory_id),
        Some(Part::Step(c)) => format!("step chunk seq {}", c.seq),
        Some(Part::Footer(_)) => "a footer".into(),
        None => "an empty part".into(),
    }
}

fn store_status(e: StoreError) -> Status {
    match e {
        StoreError::Invalid { .. } => Status::invalid_argument(e.to_string()),
        StoreError::Busy { .. } => Status::aborted(e.to_string()),
        other => {
            tracing::error!(error = %other, "store failure while ingesting");
            Status::internal(format!("the learner's store failed: {other}"))
        }
    }
}

/// What the learner's policy takes, checked at submit before anything is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// Every token id must be below this.
    pub vocab_size: u32,
    /// The policy's route shape; `None` for a dense policy, which takes no routes.
    pub routes: Option<RouteShape>,
    /// Refuse a trajectory without routes (`[rl] router_replay = "rollout"` with the actors
    /// recording).
    pub require_routes: bool,
}

impl Admission {
    /// Checks the header's route shape against the policy's.
    fn check_header(&self, h: &TrajectoryHeader) -> Result<(), String> {
        match (h.routes, self.routes) {
            (Some(got), None) => Err(format!(
                "header.routes declares {} MoE layers, but the learner's policy is dense; send no routes",
                got.moe_layers
            )),
            (Some(got), Some(want)) if got != want => Err(format!(
                "header.routes is {got:?}, but the learner's policy routes as {want:?}"
            )),
            (None, Some(_)) if self.require_routes => Err(
                "header.routes is missing, but this run replays the actors' routes ([rl] router_replay = \"rollout\"); record them".into(),
            ),
            _ => Ok(()),
        }
    }

    /// Checks step `seq`'s token ids against the vocabulary.
    fn check_step(&self, seq: u64, step: &Step) -> Result<(), String> {
        match step
            .token_ids
            .iter()
            .position(|&id| id >= self.vocab_size)
        {
            Some(i) => Err(format!(
                "step chunk seq {seq}: step.token_ids[{i}] = {} is outside the policy's vocabulary of {}",
                step.token_ids[i], self.vocab_size
            )),
            None => Ok(()),
        }
    }
}

/// Reads one trajectory from `stream` into `store` and acks it after the flush.
pub(super) async fn ingest(
    store: &Arc<TrajectoryStore>,
    admission: Option<&Admission>,
    mut stream: Streaming<pb::TrajectoryPart>,
) -> Result<pb::SubmitAck, Status> {
    let first = stream
        .message()
        .await?
        .ok_or_else(|| Status::invalid_argument("empty stream: expected a header first"))?;
    let header = match first.part {
        Some(Part::Header(h)) => TrajectoryHeader::try_from(h)
            .map_err(|e| Status::invalid_argument(format!("header: {e}")))?,
        other => {
            return Err(Status::invalid_argument(format!(
                "{} arrived before the header; a trajectory starts with its header",
                describe(&other)
            )))
        }
    };
    if let Some(a) = admission {
        a.check_header(&header).map_err(|e| {
            Status::invalid_argument(format!("trajectory {:?}: {e}", header.trajectory_id))
        })?;
    }
    let id = header.trajectory_id.clone();
    match store.begin(header).map_err(store_status)? {
        Begin::Duplicate(rec) => {
            // Already stored: read the resend to its end (so the client sees a clean
            // ack rather than a reset) and change nothing.
            while stream.message().await?.is_some() {}
            let (steps, tokens) = rec.footer.map_or((0, 0), |f| (f.step_count, f.token_count));
            tracing::debug!(trajectory = %id, "duplicate submission acked");
            Ok(pb::SubmitAck {
                trajectory_id: id,
                duplicate: true,
                steps_stored: steps,
                tokens_stored: tokens,
            })
        }
        Begin::New(writer) => fold(writer, admission, stream).await,
    }
}

async fn fold(
    mut writer: TrajectoryWriter,
    admission: Option<&Admission>,
    mut stream: Streaming<pb::TrajectoryPart>,
) -> Result<pb::SubmitAck, Status> {
    let invalid = |w: &TrajectoryWriter, msg: String| {
        Status::invalid_argument(format!("trajectory {:?}: {msg}", w.id()))
    };
    loop {
        let Some(part) = stream.message().await? else {
            return Err(invalid(
                &writer,
                format!(
                    "stream ended after {} step chunks without a footer",
                    writer.steps_appended()
                ),
            ));
        };
        match part.part {
            Some(Part::Step(chunk)) => {
                let size = chunk.encoded_len();
                if size > MAX_STEP_CHUNK_BYTES {
                    return Err(invalid(
                        &writer,
                        format!(
                            "step chunk seq {} is {size} bytes, over the {MAX_STEP_CHUNK_BYTES}-byte limit; split the turn into smaller chunks",
                            chunk.seq
                        ),
                    ));
                }
                let seq = chunk.seq;
                let step = chunk
                    .step
                    .ok_or_else(|| invalid(&writer, format!("step chunk seq {seq} has no step")))
                    .and_then(|s| {
                        Step::try_from(s)
                            .map_err(|e| invalid(&writer, format!("step chunk seq {seq}: {e}")))
                    })?;
                if let Some(a) = admission {
                    a.check_step(seq, &step).map_err(|e| invalid(&writer, e))?;
                }
                writer.append(seq, step).map_err(store_status)?;
            }
            Some(Part::Footer(f)) => {
                let footer = TrajectoryFooter::try_from(f)
                    .map_err(|e| invalid(&writer, format!("footer: {e}")))?;
                if let Some(extra) = stream.message().await? {
                    return Err(invalid(
                        &writer,
                        format!("{} arrived after the footer", describe(&extra.part)),
                    ));
                }
                let id = writer.id().to_owned();
                let rec = writer.finish(footer).await.map_err(store_status)?;
                let footer = rec.footer.unwrap_or(footer);
                return Ok(pb::SubmitAck {
                    trajectory_id: id,
                    duplicate: false,
                    steps_stored: footer.step_count,
                    tokens_stored: footer.token_count,
                });
            }
            other => {
                return Err(invalid(
                    &writer,
                    format!(
                        "{} arrived mid-stream; expected a step chunk or the footer",
                        describe(&other)
                    ),
                ))
            }
        }
    }
}
