//! Streaming trajectories to the learner while they grow, and resending them until acked.
//!
//! Each episode's parts arrive as [`PartEvent`]s. [`stream_trajectory`] appends every part
//! to the episode's journal first (so nothing lives only in memory), then forwards it on a
//! live `SubmitTrajectory` stream — a chunk per turn. When the stream breaks (the learner
//! restarted, the network dropped), the journal is replayed from the start on a new stream
//! under the same trajectory id (the learner is idempotent by id, and drops the partial
//! one), after an exponential back-off. After the footer the journal is durable; the ack
//! deletes it. If the learner stays unreachable the journal moves to the spool's `ready/`
//! folder and [`drain_spool`] submits it when the learner is back.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use corvid_proto::client::AuthedClient;
use corvid_proto::encoded::TrajectoryPart;
use corvid_proto::pb;
use corvid_proto::{Step, TrajectoryFooter, TrajectoryHeader};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use crate::client::{Backoff, LearnerLink, LinkError};
use crate::error::ActorError;
use crate::journal::{JournalReader, JournalWriter};
use crate::spool::Spool;

/// Retry settings for submissions.
#[derive(Debug, Clone)]
pub struct SubmitConfig {
    /// First back-off wait. Default 200 ms.
    pub backoff_initial: Duration,
    /// Longest back-off wait. Default 10 s.
    pub backoff_max: Duration,
    /// Whole-journal resends after the footer before the trajectory is left to the
    /// spool's drainer. Default 4.
    pub attempts_before_spool: u32,
    /// How often an idle drainer looks at the spool. Default 1 s.
    pub drain_poll: Duration,
}

impl Default for SubmitConfig {
    fn default() -> Self {
        Self {
            backoff_initial: Duration::from_millis(200),
            backoff_max: Duration::from_secs(10),
            attempts_before_spool: 4,
            drain_poll: Duration::from_secs(1),
        }
    }
}

impl SubmitConfig {
    fn backoff(&self) -> Backoff {
        Backoff::new(self.backoff_initial, self.backoff_max)
    }
}

/// One part of a growing trajectory, as the engine produces it.
#[derive(Debug, Clone)]
pub enum PartEvent {
    /// The episode started.
    Header(TrajectoryHeader),
    /// A turn finished.
    Step(Step),
    /// The episode ended.
    Footer(TrajectoryFooter),
}

/// How a trajectory's submission ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Submitted {
    /// The learner acked it (`duplicate`: it already had it).
    Acked {
        /// Already stored before this submission.
        duplicate: bool,
        /// Times it was sent again from the start after a broken stream or failed ack.
        resends: u32,
    },
    /// The learner is unreachable: the journal waits in the spool.
    Spooled,
    /// The learner refused it as invalid: set aside in `rejected/`.
    Rejected(String),
    /// It could not even be journaled (disk failure): lost, and logged as such.
    Lost(String),
}

/// Streams the parts of `journal` (records `..limit`, or all) lazily from disk.
fn journal_parts(
    path: PathBuf,
    limit: Option<u64>,
    tx: mpsc::Sender<TrajectoryPart>,
) -> JoinHandle<Result<u64, ActorError>> {
    tokio::task::spawn_blocking(move || {
        let mut r = JournalReader::open(&path)?;
        let mut n = 0;
        while limit.is_none_or(|l| n < l) {
            match r.next_part()? {
                Some(p) => {
                    if tx.blocking_send(p).is_err() {
                        break; // the stream ended (it failed); the caller sees why
                    }
                    n += 1;
                }
                None => break,
            }
        }
        Ok(n)
    })
}

fn receiver_stream(rx: mpsc::Receiver<TrajectoryPart>) -> ReceiverStream<TrajectoryPart> {
    ReceiverStream::new(rx)
}

/// A `SubmitTrajectory` call as a boxed `Send` future (spawnable; naming the type here
/// sidesteps a compiler limitation with tonic's generic client-streaming future).
fn submit_call(
    mut client: AuthedClient,
    parts: ReceiverStream<TrajectoryPart>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<pb::SubmitAck, tonic::Status>> + Send>>
{
    Box::pin(async move {
        client
            .submit_trajectory(tonic::Request::new(parts))
            .await
            .map(tonic::Response::into_inner)
    })
}

/// Submits a finished journal from disk in one stream.
pub async fn submit_journal(link: &LearnerLink, path: &Path) -> Result<pb::SubmitAck, LinkError> {
    let client = link.client().await?;
    let (tx, rx) = mpsc::channel(16);
    let reader = journal_parts(path.to_path_buf(), None, tx);
    let res = submit_call(client, receiver_stream(rx)).await;
    let read = reader
        .await
        .map_err(|e| ActorError::Learner(format!("journal reader panicked: {e}")))?;
    match res {
        Ok(ack) => {
            read?;
            Ok(ack)
        }
        Err(status) => {
            if matches!(
                status.code(),
                Code::Unavailable | Code::Unknown | Code::Cancelled
            ) {
                link.reset().await;
            }
            Err(link.status_error("SubmitTrajectory", status))
        }
    }
}

/// A live `SubmitTrajectory` stream.
struct Live {
    tx: mpsc::Sender<TrajectoryPart>,
    call: JoinHandle<Result<pb::SubmitAck, tonic::Status>>,
    replay: Option<JoinHandle<Result<u64, ActorError>>>,
}

impl Live {
    /// Opens a stream and replays the journal's first `records` parts on it.
    async fn open(link: &LearnerLink, journal: &Path, records: u64) -> Result<Live, LinkError> {
        let client = link.client().await?;
        let (tx, rx) = mpsc::channel(16);
        let call = tokio::spawn(submit_call(client, receiver_stream(rx)));
        let replay =
            (records > 0).then(|| journal_parts(journal.to_path_buf(), Some(records), tx.clone()));
        Ok(Live { tx, call, replay })
    }

    /// Sends one part after the replay; false when the stream is broken.
    async fn send(&mut self, part: TrajectoryPart) -> bool {
        if let Some(r) = self.replay.take() {
            match r.await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "replaying a journal failed");
                    return false;
                }
                Err(e) => {
                    tracing::error!(error = %e, "journal replay panicked");
                    return false;
                }
            }
        }
        if self.call.is_finished() {
            return false;
        }
        self.tx.send(part).await.is_ok()
    }

    /// Ends the stream and waits for the ack.
    async fn finish(self) -> Result<pb::SubmitAck, tonic::Status> {
        if let Some(r) = self.replay {
            let _ = r.await;
        }
        drop(self.tx);
        match self.call.await {
            Ok(r) => r,
            Err(e) => Err(tonic::Status::unknown(format!("submit task failed: {e}"))),
        }
    }
}

/// Everything a trajectory's submission needs.
#[derive(Debug, Clone)]
pub struct Uplink {
    /// The learner.
    pub link: LearnerLink,
    /// Where journals live.
    pub spool: Arc<Spool>,
    /// Retry settings.
    pub cfg: SubmitConfig,
}

/// Journals and streams one trajectory as its parts arrive on `events`, then makes sure
/// the learner has it (or that it waits in the spool).
pub async fn stream_trajectory(
    up: Uplink,
    trajectory_id: String,
    mut events: mpsc::UnboundedReceiver<PartEvent>,
) -> Submitted {
    let path = up.spool.active_path(&trajectory_id);
    let mut journal = match JournalWriter::create(&path) {
        Ok(j) => j,
        Err(e) => {
            tracing::error!(trajectory = %trajectory_id, error = %e, "cannot journal a trajectory; it is lost");
            return Submitted::Lost(e.to_string());
        }
    };
    let mut backoff = up.cfg.backoff();
    let mut live: Option<Live> = None;
    let mut sends: u32 = 0;
    let mut next_try = Instant::now();
    let mut finished = false;
    while let Some(ev) = events.recv().await {
        let is_footer = matches!(ev, PartEvent::Footer(_));
        let part = match ev {
            PartEvent::Header(h) => journal.header(&h),
            PartEvent::Step(s) => journal.step(s),
            PartEvent::Footer(f) => journal.footer(f),
        };
        let part = match part {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(trajectory = %trajectory_id, error = %e, "journal write failed; the trajectory is lost");
                let _ = std::fs::remove_file(&path);
                return Submitted::Lost(e.to_string());
            }
        };
        if let Some(l) = live.as_mut() {
            if !l.send(part).await {
                tracing::warn!(trajectory = %trajectory_id, "trajectory stream broke; will resend from the start");
                if let Some(l) = live.take() {
                    l.call.abort();
                }
                next_try = Instant::now() + backoff.next_delay();
            }
        } else if Instant::now() >= next_try {
            // (Re)open: the journal so far (this part included) goes first.
            if let Err(e) = journal.flush() {
                tracing::error!(error = %e, "journal flush failed");
            }
            match Live::open(&up.link, &path, journal.records()).await {
                Ok(l) => {
                    sends += 1;
                    live = Some(l);
                }
                Err(e) => {
                    tracing::debug!(trajectory = %trajectory_id, error = %e, "learner unreachable; journaling only");
                    next_try = Instant::now() + backoff.next_delay();
                }
            }
        }
        if is_footer {
            finished = true;
            break;
        }
    }
    if !finished {
        // The engine went away without a footer (it crashed): leave the journal for the
        // next start-up's recovery, which closes it as abandoned.
        tracing::error!(trajectory = %trajectory_id, "trajectory ended without a footer");
        if let Some(l) = live.take() {
            l.call.abort();
        }
        let _ = journal.sync();
        return Submitted::Spooled;
    }
    drop(journal);
    if let Some(l) = live.take() {
        match l.finish().await {
            Ok(ack) => return acked(&path, &trajectory_id, &ack, sends),
            Err(status) if status.code() == Code::InvalidArgument => {
                return reject(&up.spool, &path, &trajectory_id, status.message());
            }
            Err(status) => {
                let error = up.link.status_error("SubmitTrajectory", status);
                tracing::warn!(trajectory = %trajectory_id, %error, "live stream failed at the end; resending");
            }
        }
    }
    for attempt in 0..up.cfg.attempts_before_spool {
        if attempt > 0 || Instant::now() < next_try {
            tokio::time::sleep(backoff.next_delay()).await;
        }
        sends += 1;
        match submit_journal(&up.link, &path).await {
            Ok(ack) => return acked(&path, &trajectory_id, &ack, sends),
            Err(LinkError::Status { status, .. }) if status.code() == Code::InvalidArgument => {
                return reject(&up.spool, &path, &trajectory_id, status.message());
            }
            Err(e) => {
                tracing::debug!(trajectory = %trajectory_id, attempt, error = %e, "resend failed");
            }
        }
    }
    match up.spool.mark_ready(&path) {
        Ok(p) => {
            tracing::warn!(trajectory = %trajectory_id, spool = %p.display(), "learner unreachable; trajectory spooled");
            Submitted::Spooled
        }
        Err(e) => {
            tracing::error!(trajectory = %trajectory_id, error = %e, "cannot spool; the journal stays in active/ for the next start");
            Submitted::Spooled
        }
    }
}

fn acked(path: &Path, id: &str, ack: &pb::SubmitAck, sends: u32) -> Submitted {
    tracing::debug!(trajectory = %id, duplicate = ack.duplicate, steps = ack.steps_stored, "trajectory acked");
    if let Err(e) = std::fs::remove_file(path) {
        tracing::warn!(journal = %path.display(), error = %e, "cannot remove an acked journal");
    }
    Submitted::Acked {
        duplicate: ack.duplicate,
        resends: sends.saturating_sub(1),
    }
}

fn reject(spool: &Spool, path: &Path, id: &str, why: &str) -> Submitted {
    tracing::error!(trajectory = %id, %why, "learner refused the trajectory as invalid");
    if let Err(e) = spool.reject(path) {
        tracing::error!(error = %e, "cannot move a refused journal to rejected/");
    }
    Submitted::Rejected(why.to_string())
}

/// Counts of one pass over the spool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrainPass {
    /// Trajectories acked (new or duplicate).
    pub sent: usize,
    /// Trajectories the learner refused (moved to `rejected/`).
    pub rejected: usize,
    /// Trajectories still waiting.
    pub left: usize,
}

/// Submits the spool's ready journals, oldest first, until one fails with a retryable
/// error (the learner is still away) or all are sent.
pub async fn drain_once(up: &Uplink) -> Result<DrainPass, ActorError> {
    let files = up.spool.ready_files()?;
    let mut pass = DrainPass {
        left: files.len(),
        ..DrainPass::default()
    };
    for f in files {
        match submit_journal(&up.link, &f).await {
            Ok(ack) => {
                let id = ack.trajectory_id.clone();
                acked(&f, &id, &ack, 1);
                pass.sent += 1;
                pass.left -= 1;
            }
            Err(LinkError::Status { status, .. }) if status.code() == Code::InvalidArgument => {
                reject(&up.spool, &f, &f.display().to_string(), status.message());
                pass.rejected += 1;
                pass.left -= 1;
            }
            Err(e) => {
                tracing::debug!(error = %e, "spool drain paused: learner unreachable");
                break;
            }
        }
    }
    if pass.sent > 0 {
        tracing::info!(
            sent = pass.sent,
            left = pass.left,
            "spooled trajectories submitted"
        );
    }
    Ok(pass)
}

/// Drains the spool until `stop` turns true: polls when empty, backs off while the learner
/// is unreachable. Returns how many trajectories it submitted.
pub async fn drain_spool(up: Uplink, mut stop: tokio::sync::watch::Receiver<bool>) -> usize {
    let mut backoff = up.cfg.backoff();
    let mut sent = 0;
    loop {
        if *stop.borrow() {
            return sent;
        }
        let pass = drain_once(&up).await;
        if let Ok(p) = &pass {
            sent += p.sent;
        }
        let wait = match pass {
            Ok(p) if p.left == 0 => {
                backoff.reset();
                up.cfg.drain_poll
            }
            Ok(p) if p.sent > 0 => {
                backoff.reset();
                Duration::ZERO
            }
            Ok(_) => backoff.next_delay(),
            Err(e) => {
                tracing::error!(error = %e, "cannot read the spool");
                backoff.next_delay()
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => {}
        }
    }
}
