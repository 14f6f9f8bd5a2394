//! `SubmitTrajectory`: one client stream folded into the store chunk by chunk.
//!
//! The order is fixed: one header, step chunks with seq 0, 1, 2, … and no gaps,
//! one footer, end of stream. Anything else is INVALID_ARGUMENT with a message
//! that says what arrived and what was expected; the [`TrajectoryWriter`] is
//! dropped on every error path, which deletes whatever was written, so nothing
//! partial remains.
//!
//! Each step is checked once, here, as it arrives ([`CheckedStep::received`]): its own
//! invariants, its routes against the header's shape and, with an [`Admission`], its token
//! ids against the policy's vocabulary; the header is checked against the policy's route
//! shape (none for a dense policy) and, where the run replays routes, for having them. A
//! step is stored as the bytes that came, written on tokio's blocking pool while the next
//! step is received and checked. Nothing of a refused trajectory is stored or acked.

use std::sync::Arc;

use corvid_proto::encoded::{trajectory_part::Part, TrajectoryPart};
use corvid_proto::limits::MAX_STEP_CHUNK_BYTES;
use corvid_proto::pb;
use corvid_proto::{CheckedStep, RouteShape, StepRules, TrajectoryFooter, TrajectoryHeader};
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
}

/// Reads one trajectory from `stream` into `store` and acks it after the flush.
pub(super) async fn ingest(
    store: &Arc<TrajectoryStore>,
    admission: Option<&Admission>,
    mut stream: Streaming<TrajectoryPart>,
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
        Begin::New(writer) => {
            let rules = writer.rules(admission.map(|a| a.vocab_size));
            fold(writer, rules, stream).await
        }
    }
}

/// Checked steps that may wait while the writer is busy (each at most
/// [`MAX_STEP_CHUNK_BYTES`]); past this the stream waits for the write.
const STEPS_WAITING: usize = 8;

/// The trajectory's writer: idle, or writing a batch of steps on tokio's blocking pool (the
/// write hands it back with the result).
enum Slot {
    Idle(Box<TrajectoryWriter>),
    Writing(tokio::task::JoinHandle<(TrajectoryWriter, Result<(), StoreError>)>),
}

impl Slot {
    /// Whether a write is still running.
    fn busy(&self) -> bool {
        matches!(self, Slot::Writing(w) if !w.is_finished())
    }

    /// The writer, once its batch is written; a failed write drops the writer (deleting what
    /// it wrote) on the blocking pool and returns the store's error.
    async fn ready(self, id: &str) -> Result<TrajectoryWriter, Status> {
        let write = match self {
            Slot::Idle(w) => return Ok(*w),
            Slot::Writing(write) => write,
        };
        let (writer, result) = write.await.map_err(|e| {
            Status::internal(format!("trajectory {id:?}: writing steps stopped: {e}"))
        })?;
        match result {
            Ok(()) => Ok(writer),
            Err(e) => {
                discard(writer).await;
                Err(store_status(e))
            }
        }
    }

    /// Starts writing `steps` once the writer is ready.
    async fn write(self, id: &str, steps: Vec<(u64, CheckedStep)>) -> Result<Slot, Status> {
        let mut writer = self.ready(id).await?;
        Ok(Slot::Writing(tokio::task::spawn_blocking(move || {
            let result = steps
                .into_iter()
                .try_for_each(|(seq, step)| writer.append_checked(seq, step));
            (writer, result)
        })))
    }
}

/// Drops `writer` on the blocking pool, which deletes what it wrote, and waits for that.
async fn discard(writer: TrajectoryWriter) {
    tokio::task::spawn_blocking(move || drop(writer)).await.ok();
}

/// Checks each step as it arrives and writes the steps checked so far on tokio's blocking
/// pool, one write at a time: checks overlap writes, a write takes every step that arrived
/// during the one before (so a fast stream pays one hand-off per batch, not per step), no
/// write blocks an RPC worker, and a stream waiting between turns holds no thread. Finishes
/// the trajectory after its footer. On any error the writer is dropped, which deletes what
/// it wrote, before the error is returned.
async fn fold(
    writer: TrajectoryWriter,
    mut rules: StepRules,
    mut stream: Streaming<TrajectoryPart>,
) -> Result<pb::SubmitAck, Status> {
    let id = writer.id().to_owned();
    let invalid = |msg: String| Status::invalid_argument(format!("trajectory {id:?}: {msg}"));
    let mut slot = Slot::Idle(Box::new(writer));
    let mut waiting: Vec<(u64, CheckedStep)> = Vec::new();
    let mut chunks = 0u64;
    let received: Result<TrajectoryFooter, Status> = loop {
        let part = match stream.message().await {
            Ok(Some(part)) => part,
            Ok(None) => {
                break Err(invalid(format!(
                    "stream ended after {chunks} step chunks without a footer"
                )))
            }
            Err(status) => break Err(status),
        };
        match part.part {
            Some(Part::Step(chunk)) => {
                let size = chunk.encoded_len();
                if size > MAX_STEP_CHUNK_BYTES {
                    break Err(invalid(format!(
                        "step chunk seq {} is {size} bytes, over the {MAX_STEP_CHUNK_BYTES}-byte limit; split the turn into smaller chunks",
                        chunk.seq
                    )));
                }
                let seq = chunk.seq;
                let Some(bytes) = chunk.step else {
                    break Err(invalid(format!("step chunk seq {seq} has no step")));
                };
                let step = match CheckedStep::received(seq, bytes, &mut rules) {
                    Ok(step) => step,
                    Err(e) => break Err(invalid(e.to_string())),
                };
                waiting.push((seq, step));
                chunks += 1;
                if !slot.busy() || waiting.len() >= STEPS_WAITING {
                    slot = slot.write(&id, std::mem::take(&mut waiting)).await?;
                }
            }
            Some(Part::Footer(f)) => {
                let footer = match TrajectoryFooter::try_from(f) {
                    Ok(footer) => footer,
                    Err(e) => break Err(invalid(format!("footer: {e}"))),
                };
                break match stream.message().await {
                    Ok(None) => Ok(footer),
                    Ok(Some(extra)) => Err(invalid(format!(
                        "{} arrived after the footer",
                        describe(&extra.part)
                    ))),
                    Err(status) => Err(status),
                };
            }
            other => {
                break Err(invalid(format!(
                    "{} arrived mid-stream; expected a step chunk or the footer",
                    describe(&other)
                )))
            }
        }
    };
    // The last write's outcome first: a store error is why a stream stops being stored.
    let footer = match received {
        Ok(footer) => footer,
        Err(status) => {
            discard(slot.ready(&id).await?).await;
            return Err(status);
        }
    };
    if !waiting.is_empty() {
        slot = slot.write(&id, waiting).await?;
    }
    let writer = slot.ready(&id).await?;
    let rec = writer.finish(footer).await.map_err(store_status)?;
    let footer = rec.footer.unwrap_or(footer);
    Ok(pb::SubmitAck {
        trajectory_id: id,
        duplicate: false,
        steps_stored: footer.step_count,
        tokens_stored: footer.token_count,
    })
}
