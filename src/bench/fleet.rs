//! `corvid bench fleet`: many actor streams from other hosts into one learner.
//!
//! Two roles, each its own process, so that the learner side and the actor side can run on
//! different network hosts (`scripts/bench_fleet.sh` makes them network namespaces joined
//! by a bridge):
//!
//! - **`serve`** opens a fresh [`TrajectoryStore`] and serves it with the learner's own
//!   [`serve`] / [`LearnerService`] (auth, size limits, HTTP/2 windows, the submit path that
//!   validates each chunk, writes it and acks after the flush). It walks the store's
//!   finish order as it grows and stops once `--expect` trajectories are stored (or on
//!   SIGTERM/SIGINT, or at `--deadline-s`); then it prints what the store holds, the rate
//!   from the first trajectory begun to the last one finished and flushed, and the growth of
//!   this process's peak RSS over its RSS before anything arrived.
//! - **`send`** opens `--streams` connections (one per stream, as separate actors would),
//!   and on each submits `--trajectories` synthetic trajectories one after another, with ids
//!   `<name>-s<stream>-t<k>`. Nothing is retried: a failed submit is counted, its error
//!   reported, and the stream goes on with its next trajectory.
//!
//! Nothing lost is checked without shipping id lists around: both sides print an
//! order-independent digest of their ids (the wrapping sum of each id's 64-bit FNV-1a
//! hash), the senders' over the ids they saw acknowledged, the server's over the ids its
//! store holds. The senders' digests summed (wrapping) equal the server's, and their acked
//! counts sum to the stored count, exactly when the acked set is the stored set (up to a
//! 2^-64 chance). The server also reads back the steps of a sample of stored trajectories
//! and compares them with the synthetic content they were generated from, and counts the
//! trajectories that a reader of the finish order keeping one cursor (as the trainer does,
//! polling every 10 ms here) read past before they committed (`cursor_skipped`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context, Result};
use clap::{Args, Subcommand};
use corvid_learner::server::{serve, LearnerService};
use corvid_proto::client::{check_token, connect, learner_endpoint, AuthedClient};
use corvid_proto::encoded::TrajectoryPart;
use corvid_proto::limits::{MAX_STEPS_PER_TRAJECTORY, MAX_STEP_CHUNK_BYTES};
use corvid_proto::pb;
use corvid_proto::synthetic::{self, Shape};
use corvid_store::TrajectoryStore;
use prost::Message;
use serde::Serialize;
use tokio::net::TcpListener;

/// Many concurrent actor streams from other hosts into one learner (two roles).
#[derive(Args, Debug)]
#[command(
    after_help = "Examples (scripts/bench_fleet.sh runs these across network namespaces):
  corvid bench fleet serve --store /tmp/fleet-store --listen 10.77.0.1:50051 --expect 2048 --json
  corvid bench fleet send --learner http://10.77.0.1:50051 --name a1 --streams 32 \\
      --trajectories 32 --tokens 16000 --json"
)]
pub struct FleetArgs {
    #[command(subcommand)]
    role: Role,
}

#[derive(Subcommand, Debug)]
enum Role {
    /// The learner side: serve a fresh store until the expected trajectories are stored.
    Serve(ServeArgs),
    /// The actor side: concurrent streams each submitting synthetic trajectories.
    Send(SendArgs),
}

/// The learner side: serve a fresh store until the expected trajectories are stored.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  corvid bench fleet serve --store /tmp/fleet-store --listen 0.0.0.0:50051 --expect 2048 --json
  corvid bench fleet serve --store /tmp/s --listen 127.0.0.1:50051 --expect 64 --deadline-s 60

Prints `listening on ADDR` on stderr once it accepts connections, and one JSON object (with
--json) or a sentence on stdout when it stops. Exits 1 when fewer than --expect trajectories
were stored or a read-back check failed.")]
pub struct ServeArgs {
    /// Folder for the store; must not exist yet (the benchmark measures a fresh store).
    #[arg(long, value_name = "DIR")]
    store: PathBuf,
    /// Address to listen on, e.g. 0.0.0.0:50051 or 10.77.0.1:50051.
    #[arg(long, value_name = "ADDR")]
    listen: SocketAddr,
    /// The token every sender must present.
    #[arg(long, default_value = "bench")]
    token: String,
    /// Stop once this many trajectories are stored.
    #[arg(long, value_name = "N")]
    expect: u64,
    /// Stop after this many seconds even if fewer were stored.
    #[arg(long, default_value_t = 900, value_name = "SECS")]
    deadline_s: u64,
    /// Print one JSON object instead of a sentence.
    #[arg(long)]
    json: bool,
}

/// The actor side: concurrent streams each submitting synthetic trajectories.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  corvid bench fleet send --learner http://10.77.0.1:50051 --name a1 --streams 32 \\
      --trajectories 32 --tokens 16000 --json
  corvid bench fleet send --learner http://127.0.0.1:50051 --name t --streams 2 --trajectories 4

Exits 1 when any submit failed (each failure is counted and its error reported; none is
retried).")]
pub struct SendArgs {
    /// The learner, http://HOST:PORT.
    #[arg(long, value_name = "URL")]
    learner: String,
    /// The learner's token.
    #[arg(long, default_value = "bench")]
    token: String,
    /// Prefix of this host's trajectory ids (`<name>-s<stream>-t<k>`); unique per host.
    #[arg(long)]
    name: String,
    /// Concurrent streams, each on its own connection (as separate actors).
    #[arg(long, default_value_t = 32, value_name = "N")]
    streams: usize,
    /// Trajectories each stream submits, one after another.
    #[arg(long, default_value_t = 32, value_name = "K")]
    trajectories: u64,
    /// Tokens per trajectory (a multiple of --tokens-per-step).
    #[arg(long, default_value_t = 16_000, value_name = "T")]
    tokens: u64,
    /// Tokens per step: one chunk on the wire, one turn of the episode.
    #[arg(long, default_value_t = 1000, value_name = "S")]
    tokens_per_step: u32,
    /// Print one JSON object instead of a sentence.
    #[arg(long)]
    json: bool,
}

/// Runs the selected role.
pub fn run(args: FleetArgs) -> Result<ExitCode> {
    match args.role {
        Role::Serve(a) => run_serve(a),
        Role::Send(a) => run_send(a),
    }
}

// ------------------------------------------------------------------ ids and digests

/// The id of trajectory `k` of stream `stream` of host `name`.
fn trajectory_id(name: &str, stream: usize, k: u64) -> String {
    format!("{name}-s{stream:03}-t{k:06}")
}

/// 64-bit FNV-1a of an id.
fn id_hash(id: &str) -> u64 {
    id.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// An order-independent digest of a set of ids: the wrapping sum of their hashes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Digest(u64);

impl Digest {
    fn add(&mut self, id: &str) {
        self.0 = self.0.wrapping_add(id_hash(id));
    }

    fn merge(&mut self, other: Digest) {
        self.0 = self.0.wrapping_add(other.0);
    }

    /// 16 hex digits (what bash's `$((0x…))` reads back as a wrapping 64-bit integer).
    fn hex(self) -> String {
        format!("{:016x}", self.0)
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// CPU time this process has used so far (user + system, all threads), in seconds.
fn cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one `rusage` into the buffer it is given, which is valid and
    // zeroed (so fully initialised even if the call failed).
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

fn per_s(n: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        n as f64 / seconds
    } else {
        0.0
    }
}

// ------------------------------------------------------------------ serve

/// Why the server stopped watching.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum EndedBy {
    /// The expected count was stored.
    Expected,
    /// SIGTERM or SIGINT.
    Signal,
    /// `--deadline-s` passed.
    Deadline,
    /// The gRPC server stopped by itself (it failed).
    ServerStopped,
}

/// What the watch over a serving store measured.
#[derive(Debug, Clone, Copy)]
struct Watched {
    ended_by: EndedBy,
    /// Seconds from the first trajectory begun to the last one finished (and, when all
    /// expected arrived, flushed).
    seconds: f64,
    rss_before: u64,
    peak_rss: u64,
    /// Trajectories a reader keeping only its last position in the finish order saw.
    cursor_seen: u64,
    /// CPU seconds this process used from the first trajectory begun to the end.
    cpu_s: f64,
}

/// What the store holds once the server stopped, and the read-back check.
#[derive(Debug, Clone, Default)]
struct Stored {
    trajectories: u64,
    steps: u64,
    tokens: u64,
    open_left: u64,
    disk_bytes: u64,
    digest: Digest,
    sample_checked: u64,
    sample_mismatches: Vec<String>,
}

/// The server role's report.
#[derive(Debug, Serialize)]
struct ServeReport {
    role: &'static str,
    listen: String,
    expected: u64,
    ended_by: EndedBy,
    complete: bool,
    trajectories_stored: u64,
    steps_stored: u64,
    tokens_stored: u64,
    open_left: u64,
    seconds: f64,
    trajectories_per_s: f64,
    tokens_per_s: f64,
    /// CPU seconds the learner process used over `seconds` (all its threads).
    cpu_s: f64,
    rss_before_mb: f64,
    peak_rss_mb: f64,
    peak_rss_growth_mb: f64,
    disk_mb: f64,
    ids_digest: String,
    sample_checked: u64,
    sample_mismatches: Vec<String>,
    /// Stored trajectories that a reader walking the finish order with a single cursor
    /// (as the trainer does) skipped during the run: their position was read past before
    /// their finish committed.
    cursor_skipped: u64,
}

fn check_token_flag(token: &str) -> Result<()> {
    check_token(token).map_err(|e| anyhow::anyhow!("--token: {e}"))
}

fn run_serve(args: ServeArgs) -> Result<ExitCode> {
    ensure!(args.expect > 0, "--expect must be at least 1");
    ensure!(args.deadline_s > 0, "--deadline-s must be at least 1");
    check_token_flag(&args.token)?;
    if args.store.symlink_metadata().is_ok() {
        bail!(
            "--store {}: already exists; the fleet benchmark measures a fresh store \
             (name a folder that does not exist)",
            args.store.display()
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("corvid-learner-io")
        .build()
        .context("starting the async runtime")?;
    let (listen, watched, store) = rt.block_on(async {
        let listener = TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("--listen {}: cannot listen there", args.listen))?;
        let local = listener.local_addr()?;
        // Opened once the address is ours, so a refused --listen leaves no store behind.
        let store = Arc::new(TrajectoryStore::open(&args.store).with_context(|| {
            format!("--store {}: cannot create the store", args.store.display())
        })?);
        let stop = stop_signal()?;
        eprintln!(
            "corvid bench fleet serve: listening on {local}, expecting {} trajectories",
            args.expect
        );
        let watched = serve_and_watch(
            Arc::clone(&store),
            listener,
            &args.token,
            args.expect,
            Duration::from_secs(args.deadline_s),
            stop,
        )
        .await?;
        anyhow::Ok((local, watched, store))
    })?;
    drop(rt);
    let stored = account(&store)?;
    let report = serve_report(listen, args.expect, watched, stored);
    let ok = report.complete && report.sample_mismatches.is_empty() && report.open_left == 0;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "stored {} of {} trajectories ({} tokens) in {:.2} s: {:.1} trajectories/s, {:.0} \
             tokens/s; peak RSS +{:.1} MiB; ended by {:?}; {} read back, {} mismatched",
            report.trajectories_stored,
            report.expected,
            report.tokens_stored,
            report.seconds,
            report.trajectories_per_s,
            report.tokens_per_s,
            report.peak_rss_growth_mb,
            report.ended_by,
            report.sample_checked,
            report.sample_mismatches.len()
        );
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn serve_report(listen: SocketAddr, expected: u64, w: Watched, s: Stored) -> ServeReport {
    ServeReport {
        role: "serve",
        listen: listen.to_string(),
        expected,
        ended_by: w.ended_by,
        complete: s.trajectories >= expected,
        trajectories_stored: s.trajectories,
        steps_stored: s.steps,
        tokens_stored: s.tokens,
        open_left: s.open_left,
        seconds: w.seconds,
        trajectories_per_s: per_s(s.trajectories, w.seconds),
        tokens_per_s: per_s(s.tokens, w.seconds),
        cpu_s: w.cpu_s,
        rss_before_mb: mb(w.rss_before),
        peak_rss_mb: mb(w.peak_rss),
        peak_rss_growth_mb: mb(w.peak_rss.saturating_sub(w.rss_before)),
        disk_mb: mb(s.disk_bytes),
        ids_digest: s.digest.hex(),
        sample_checked: s.sample_checked,
        sample_mismatches: s.sample_mismatches,
        cursor_skipped: s.trajectories.saturating_sub(w.cursor_seen),
    }
}

/// Resolves on the first SIGTERM or SIGINT.
fn stop_signal() -> Result<impl std::future::Future<Output = ()> + Send> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

/// Serves `store` on `listener` until `expect` trajectories are stored, `stop` resolves or
/// `deadline` passes, then stops the server (waiting at most 10 s for open streams).
async fn serve_and_watch(
    store: Arc<TrajectoryStore>,
    listener: TcpListener,
    token: &str,
    expect: u64,
    deadline: Duration,
    stop: impl std::future::Future<Output = ()> + Send,
) -> Result<Watched> {
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let mut server = tokio::spawn(serve(
        listener,
        LearnerService::new(Arc::clone(&store)),
        token.to_owned(),
        async {
            let _ = server_stopped.await;
        },
    ));
    super::reset_peak_rss();
    let rss_before = super::rss_bytes().unwrap_or(0);
    let deadline = tokio::time::Instant::now() + deadline;
    tokio::pin!(stop);

    let mut first: Option<Instant> = None;
    let mut cpu_at_first = 0.0;
    let mut last: Option<Instant> = None;
    let mut seen = FinishOrder::default();
    let ended_by = loop {
        // Tight while waiting for the first trajectory (it dates the start), looser after.
        let period = Duration::from_millis(if first.is_none() { 1 } else { 10 });
        tokio::select! {
            _ = &mut stop => break EndedBy::Signal,
            _ = tokio::time::sleep_until(deadline) => break EndedBy::Deadline,
            _ = tokio::time::sleep(period) => {}
        }
        if server.is_finished() {
            break EndedBy::ServerStopped;
        }
        let now = Instant::now();
        if first.is_none() {
            // A header arriving opens a record: the first trajectory byte is here.
            let stats = store.stats().context("reading the store's counts")?;
            if stats.open + stats.finished > 0 {
                first = Some(now);
                cpu_at_first = cpu_seconds();
            }
        }
        if seen.poll(&store)? {
            last = Some(now);
        }
        if seen.count >= expect {
            break EndedBy::Expected;
        }
    };
    if ended_by == EndedBy::Expected {
        // Acks follow the flush: flushing once more dates the last ack from above.
        let s = Arc::clone(&store);
        tokio::task::spawn_blocking(move || s.flush_sync())
            .await
            .context("flushing the store")??;
        last = Some(Instant::now());
    }
    let peak_rss = super::peak_rss_bytes().unwrap_or(0);
    let cpu_s = if first.is_some() {
        cpu_seconds() - cpu_at_first
    } else {
        0.0
    };
    let seconds = match (first, last) {
        (Some(f), Some(l)) => l.saturating_duration_since(f).as_secs_f64(),
        _ => 0.0,
    };
    let _ = stop_server.send(());
    match tokio::time::timeout(Duration::from_secs(10), &mut server).await {
        Ok(joined) => {
            let served = joined.context("the gRPC server task panicked")?;
            if let Err(e) = served {
                eprintln!("corvid bench fleet serve: the gRPC server failed: {e}");
            }
        }
        Err(_) => {
            eprintln!("corvid bench fleet serve: open streams did not end within 10 s; stopped");
            server.abort();
        }
    }
    seen.poll(&store)?;
    Ok(Watched {
        ended_by,
        seconds,
        rss_before,
        peak_rss,
        cursor_seen: seen.cursor_seen,
        cpu_s,
    })
}

/// Counts finished trajectories by walking the store's finish order as it grows, and
/// counts what a reader that keeps only its last position (as the trainer's cursor does)
/// would have seen.
///
/// A position is drawn before the finish's transaction commits, so two finishes at once
/// can commit out of order: position 7 may appear after 8 was read. This walk therefore
/// keeps every position it has not seen below the highest one it has, and walks from the
/// lowest of those each time.
#[derive(Debug, Default)]
struct FinishOrder {
    /// Every position up to here has been seen.
    low: u64,
    /// Positions above `low` already seen.
    above: std::collections::BTreeSet<u64>,
    /// Distinct finished trajectories seen.
    count: u64,
    /// The last position a cursor-keeping reader would have read.
    cursor: u64,
    /// What that reader saw.
    cursor_seen: u64,
}

impl FinishOrder {
    /// Reads what finished since the last poll; whether anything new was seen.
    fn poll(&mut self, store: &TrajectoryStore) -> Result<bool> {
        let before = self.count;
        for item in store.finished_since(self.low) {
            let (seq, _) = item.context("reading the store's finish order")?;
            if seq > self.cursor {
                self.cursor = seq;
                self.cursor_seen += 1;
            }
            if seq > self.low && self.above.insert(seq) {
                self.count += 1;
            }
        }
        while self.above.remove(&(self.low + 1)) {
            self.low += 1;
        }
        Ok(self.count > before)
    }
}

/// Trajectories read back and compared with their synthetic content.
const SAMPLE: u64 = 32;

/// Counts what `store` holds and reads back a sample of it.
fn account(store: &TrajectoryStore) -> Result<Stored> {
    let stats = store.stats().context("reading the store's counts")?;
    let mut s = Stored {
        open_left: stats.open,
        disk_bytes: stats.disk_bytes,
        ..Stored::default()
    };
    let mut finished = Vec::new();
    for item in store.finished_since(0) {
        let (_, rec) = item.context("reading the store's finish order")?;
        let id = rec.header.trajectory_id.clone();
        let Some(footer) = rec.footer else {
            bail!("trajectory {id} is listed as finished without a footer");
        };
        s.trajectories += 1;
        s.steps += footer.step_count;
        s.tokens += footer.token_count;
        s.digest.add(&id);
        finished.push((id, footer.step_count, footer.token_count));
    }
    ensure!(
        s.trajectories == stats.finished,
        "the finish order lists {} trajectories, the records {}",
        s.trajectories,
        stats.finished
    );
    let every = (finished.len() as u64).div_ceil(SAMPLE).max(1) as usize;
    for (id, steps, tokens) in finished.iter().step_by(every) {
        s.sample_checked += 1;
        if let Some(why) = check_content(store, id, *steps, *tokens)? {
            s.sample_mismatches.push(format!("{id}: {why}"));
        }
    }
    Ok(s)
}

/// Whether stored trajectory `id` holds exactly its synthetic steps; the reason if not.
fn check_content(
    store: &TrajectoryStore,
    id: &str,
    steps: u64,
    tokens: u64,
) -> Result<Option<String>> {
    if steps == 0 || !tokens.is_multiple_of(steps) {
        return Ok(Some(format!(
            "{tokens} tokens in {steps} steps is no synthetic shape"
        )));
    }
    let Ok(tokens_per_step) = u32::try_from(tokens / steps) else {
        return Ok(Some(format!("{} tokens a step", tokens / steps)));
    };
    let shape = Shape {
        steps,
        tokens_per_step,
    };
    let Some(stored) = store.steps(id).context("reading stored steps")? else {
        return Ok(Some("not in the store".into()));
    };
    let mut n = 0u64;
    let mut expected = synthetic::steps(id, shape);
    for step in stored {
        let step = step.context("reading a stored step")?;
        match expected.next() {
            Some(want) if want == step => n += 1,
            Some(_) => return Ok(Some(format!("step {n} differs from what was sent"))),
            None => return Ok(Some(format!("more than {steps} steps"))),
        }
    }
    Ok((n != steps).then(|| format!("{n} of {steps} steps")))
}

// ------------------------------------------------------------------ send

/// A checked sender plan.
#[derive(Debug, Clone)]
struct Plan {
    learner: String,
    token: String,
    name: String,
    streams: usize,
    trajectories: u64,
    shape: Shape,
}

impl Plan {
    fn check(a: &SendArgs) -> Result<Self> {
        learner_endpoint(&a.learner).map_err(|e| anyhow::anyhow!("--learner: {e}"))?;
        check_token_flag(&a.token)?;
        ensure!(
            (1..=4096).contains(&a.streams),
            "--streams {}: must be between 1 and 4096",
            a.streams
        );
        ensure!(a.trajectories > 0, "--trajectories must be at least 1");
        ensure!(
            (1..=1_000_000).contains(&a.tokens_per_step),
            "--tokens-per-step {}: must be between 1 and 1000000",
            a.tokens_per_step
        );
        ensure!(a.tokens > 0, "--tokens must be at least 1");
        let per_step = u64::from(a.tokens_per_step);
        ensure!(
            a.tokens.is_multiple_of(per_step),
            "--tokens {} is not a multiple of --tokens-per-step {}",
            a.tokens,
            a.tokens_per_step
        );
        let shape = Shape {
            steps: a.tokens / per_step,
            tokens_per_step: a.tokens_per_step,
        };
        ensure!(
            shape.steps <= MAX_STEPS_PER_TRAJECTORY,
            "--tokens {} / --tokens-per-step {} is {} steps, above the learner's {} a trajectory",
            a.tokens,
            a.tokens_per_step,
            shape.steps,
            MAX_STEPS_PER_TRAJECTORY
        );
        let chunk = pb::Step::from(synthetic::step("size", 0, shape)).encoded_len();
        ensure!(
            chunk <= MAX_STEP_CHUNK_BYTES,
            "--tokens-per-step {}: a step encodes to {chunk} bytes, above the learner's chunk \
             limit of {MAX_STEP_CHUNK_BYTES}",
            a.tokens_per_step
        );
        let last = trajectory_id(&a.name, a.streams - 1, a.trajectories - 1);
        corvid_proto::validate_trajectory_id(&last).map_err(|e| {
            anyhow::anyhow!("--name {:?}: ids like {last:?} are invalid: {e}", a.name)
        })?;
        Ok(Self {
            learner: a.learner.clone(),
            token: a.token.clone(),
            name: a.name.clone(),
            streams: a.streams,
            trajectories: a.trajectories,
            shape,
        })
    }
}

/// What one stream saw.
#[derive(Debug, Default)]
struct StreamTally {
    acked: u64,
    duplicates: u64,
    failed: u64,
    tokens_acked: u64,
    digest: Digest,
    /// Seconds each acked submit took.
    latencies: Vec<f64>,
    errors: Vec<String>,
}

impl StreamTally {
    fn fail(&mut self, n: u64, why: String) {
        self.failed += n;
        self.errors.push(why);
    }
}

/// The sender role's report.
#[derive(Debug, Serialize)]
struct SendReport {
    role: &'static str,
    name: String,
    learner: String,
    streams: usize,
    trajectories_per_stream: u64,
    tokens_per_trajectory: u64,
    tokens_per_step: u32,
    attempted: u64,
    acked: u64,
    duplicates: u64,
    failed: u64,
    tokens_acked: u64,
    seconds: f64,
    trajectories_per_s: f64,
    tokens_per_s: f64,
    /// CPU seconds this sender used over `seconds` (all its threads).
    cpu_s: f64,
    submit_ms_p50: f64,
    submit_ms_p99: f64,
    submit_ms_max: f64,
    ids_digest: String,
    /// Distinct error messages with how often each came (at most 10).
    errors: Vec<(String, u64)>,
    started_unix_ms: u64,
    finished_unix_ms: u64,
}

fn run_send(args: SendArgs) -> Result<ExitCode> {
    let plan = Plan::check(&args)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("corvid-actor-io")
        .build()
        .context("starting the async runtime")?;
    let report = rt.block_on(send(plan));
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{}: {} of {} trajectories acked ({} duplicates, {} failed), {} tokens in {:.2} s: \
             {:.1} trajectories/s, {:.0} tokens/s; submit p50 {:.0} ms, p99 {:.0} ms",
            report.name,
            report.acked,
            report.attempted,
            report.duplicates,
            report.failed,
            report.tokens_acked,
            report.seconds,
            report.trajectories_per_s,
            report.tokens_per_s,
            report.submit_ms_p50,
            report.submit_ms_p99
        );
        for (e, n) in &report.errors {
            println!("  {n}x {e}");
        }
    }
    Ok(if report.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Connects every stream, then runs them all at once; never fails: what goes wrong is
/// counted in the report.
async fn send(plan: Plan) -> SendReport {
    let plan = Arc::new(plan);
    // Connect first, so the clock measures submits, not handshakes.
    let clients =
        futures::future::join_all((0..plan.streams).map(|_| connect(&plan.learner, &plan.token)))
            .await;
    let started_unix_ms = unix_ms();
    let start = Instant::now();
    let cpu_at_start = cpu_seconds();
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(stream, client)| {
            let plan = Arc::clone(&plan);
            tokio::spawn(async move {
                let mut tally = StreamTally::default();
                match client {
                    Ok(client) => submit_all(&plan, stream, client, &mut tally).await,
                    Err(e) => tally.fail(plan.trajectories, e.to_string()),
                }
                tally
            })
        })
        .collect();
    let mut all = StreamTally::default();
    for task in tasks {
        let tally = task.await.unwrap_or_else(|e| {
            let mut t = StreamTally::default();
            t.fail(0, format!("a stream's task panicked: {e}"));
            t
        });
        all.acked += tally.acked;
        all.duplicates += tally.duplicates;
        all.failed += tally.failed;
        all.tokens_acked += tally.tokens_acked;
        all.digest.merge(tally.digest);
        all.latencies.extend(tally.latencies);
        all.errors.extend(tally.errors);
    }
    let seconds = start.elapsed().as_secs_f64();
    let cpu_s = cpu_seconds() - cpu_at_start;
    let mut errors: Vec<(String, u64)> = Vec::new();
    for e in all.errors {
        if let Some((_, n)) = errors.iter_mut().find(|(m, _)| *m == e) {
            *n += 1;
        } else if errors.len() < 10 {
            errors.push((e, 1));
        }
    }
    all.latencies.sort_by(f64::total_cmp);
    let quantile = |q: f64| -> f64 {
        let n = all.latencies.len();
        if n == 0 {
            return 0.0;
        }
        let i = ((q * n as f64).ceil() as usize).clamp(1, n) - 1;
        all.latencies[i] * 1e3
    };
    SendReport {
        role: "send",
        name: plan.name.clone(),
        learner: plan.learner.clone(),
        streams: plan.streams,
        trajectories_per_stream: plan.trajectories,
        tokens_per_trajectory: plan.shape.tokens(),
        tokens_per_step: plan.shape.tokens_per_step,
        attempted: plan.streams as u64 * plan.trajectories,
        acked: all.acked,
        duplicates: all.duplicates,
        failed: all.failed,
        tokens_acked: all.tokens_acked,
        seconds,
        trajectories_per_s: per_s(all.acked, seconds),
        tokens_per_s: per_s(all.tokens_acked, seconds),
        cpu_s,
        submit_ms_p50: quantile(0.5),
        submit_ms_p99: quantile(0.99),
        submit_ms_max: quantile(1.0),
        ids_digest: all.digest.hex(),
        errors,
        started_unix_ms,
        finished_unix_ms: unix_ms(),
    }
}

/// The parts of synthetic trajectory `id` — header, steps with seq 0, 1, …, footer — made
/// one at a time as the stream is polled, as `corvid_proto::client::trajectory_parts` makes
/// them, but as a named type: tonic's client-streaming future over a boxed or opaque stream
/// cannot be proved `Send` for spawning (a "higher-ranked lifetime error").
struct SyntheticParts {
    id: String,
    shape: Shape,
    /// 0: the header; 1..=steps: step `next - 1`; steps + 1: the footer; then done.
    next: u64,
}

impl SyntheticParts {
    fn new(id: &str, shape: Shape) -> Self {
        Self {
            id: id.to_owned(),
            shape,
            next: 0,
        }
    }
}

impl Iterator for SyntheticParts {
    type Item = TrajectoryPart;

    fn next(&mut self) -> Option<TrajectoryPart> {
        let n = self.next;
        let part = if n == 0 {
            TrajectoryPart::header(synthetic::header(&self.id, "fleet", 1, 0))
        } else if n <= self.shape.steps {
            let seq = n - 1;
            TrajectoryPart::step(seq, synthetic::step(&self.id, seq, self.shape))
        } else if n == self.shape.steps + 1 {
            TrajectoryPart::footer(synthetic::footer(&self.id, self.shape))
        } else {
            return None;
        };
        self.next += 1;
        Some(part)
    }
}

/// Submits stream `stream`'s trajectories one after another on `client`.
async fn submit_all(plan: &Plan, stream: usize, mut client: AuthedClient, tally: &mut StreamTally) {
    let shape = plan.shape;
    for k in 0..plan.trajectories {
        let id = trajectory_id(&plan.name, stream, k);
        let parts = futures::stream::iter(SyntheticParts::new(&id, shape));
        let t0 = Instant::now();
        match client.submit_trajectory(tonic::Request::new(parts)).await {
            Ok(ack) => {
                let ack = ack.into_inner();
                if ack.trajectory_id != id || ack.tokens_stored != shape.tokens() {
                    tally.fail(
                        1,
                        format!(
                            "an ack for {:?} with {} tokens came for {id:?} with {}",
                            ack.trajectory_id,
                            ack.tokens_stored,
                            shape.tokens()
                        ),
                    );
                    continue;
                }
                tally.acked += 1;
                tally.duplicates += u64::from(ack.duplicate);
                tally.tokens_acked += ack.tokens_stored;
                tally.digest.add(&id);
                tally.latencies.push(t0.elapsed().as_secs_f64());
            }
            Err(status) => tally.fail(1, format!("{:?}: {}", status.code(), status.message())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        fleet: FleetArgs,
    }

    fn send_args(extra: &[&str]) -> SendArgs {
        let mut argv = vec!["corvid", "send"];
        for (flag, default) in [("--learner", "http://127.0.0.1:1"), ("--name", "a1")] {
            if !extra.contains(&flag) {
                argv.extend([flag, default]);
            }
        }
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv).map(|c| c.fleet.role) {
            Ok(Role::Send(a)) => a,
            other => panic!("{other:?}"),
        }
    }

    fn plan_error(extra: &[&str]) -> String {
        let err = Plan::check(&send_args(extra)).expect_err("refused");
        format!("{err:#}")
    }

    #[test]
    fn synthetic_parts_are_the_clients_parts() {
        use futures::StreamExt;
        let shape = Shape {
            steps: 4,
            tokens_per_step: 9,
        };
        let ours: Vec<_> = SyntheticParts::new("x-s000-t000000", shape).collect();
        let theirs: Vec<_> = futures::executor::block_on(
            corvid_proto::client::trajectory_parts(
                synthetic::header("x-s000-t000000", "fleet", 1, 0),
                synthetic::steps("x-s000-t000000", shape),
                synthetic::footer("x-s000-t000000", shape),
            )
            .collect(),
        );
        assert_eq!(ours.len(), 6);
        assert_eq!(ours, theirs);
    }

    #[test]
    fn bad_sender_input_names_its_flag() {
        assert!(Plan::check(&send_args(&[])).is_ok());
        for (extra, flag) in [
            (&["--streams", "0"][..], "--streams"),
            (&["--trajectories", "0"], "--trajectories"),
            (&["--tokens", "1500"], "--tokens 1500 is not a multiple"),
            (&["--tokens-per-step", "0"], "--tokens-per-step"),
            (&["--name", "a b"], "--name \"a b\""),
            (&["--token", "t\u{7f}"], "--token"),
            (&["--learner", "10.0.0.1:50051"], "--learner"),
        ] {
            let msg = plan_error(extra);
            assert!(msg.contains(flag), "{extra:?}: {msg}");
        }
    }

    #[test]
    fn serve_refuses_an_existing_store_folder() {
        let dir = tempfile::tempdir().unwrap();
        let argv = [
            "corvid",
            "serve",
            "--store",
            dir.path().to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--expect",
            "1",
        ];
        let Ok(Role::Serve(args)) = Cli::try_parse_from(argv).map(|c| c.fleet.role) else {
            panic!("parses");
        };
        let msg = format!("{:#}", run_serve(args).expect_err("refused"));
        assert!(
            msg.contains("--store") && msg.contains("already exists"),
            "{msg}"
        );
        let bad = Cli::try_parse_from(["corvid", "serve", "--store", "x", "--listen", "nowhere"]);
        assert!(bad.unwrap_err().to_string().contains("--listen"));
    }

    #[test]
    fn every_acked_trajectory_is_stored_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let store = Arc::new(TrajectoryStore::open(dir.path().join("store")).unwrap());
        let (watched, senders) = rt.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            let server = tokio::spawn(serve_and_watch(
                Arc::clone(&store),
                listener,
                "tok",
                2 * 3 * 4,
                Duration::from_secs(60),
                std::future::pending(),
            ));
            let plan = |name: &str| Plan {
                learner: url.clone(),
                token: "tok".into(),
                name: name.into(),
                streams: 3,
                trajectories: 4,
                shape: Shape {
                    steps: 5,
                    tokens_per_step: 30,
                },
            };
            let (a, b) = tokio::join!(send(plan("a1")), send(plan("a2")));
            (server.await.unwrap().unwrap(), [a, b])
        });
        assert_eq!(watched.ended_by, EndedBy::Expected);
        assert!(watched.cursor_seen <= 24);
        let stored = account(&store).unwrap();
        let mut digest = Digest::default();
        for s in &senders {
            assert_eq!((s.failed, s.duplicates), (0, 0), "{s:?}");
            assert_eq!(s.tokens_acked, s.acked * 150);
            digest.merge(Digest(u64::from_str_radix(&s.ids_digest, 16).unwrap()));
        }
        assert_eq!(senders[0].acked + senders[1].acked, stored.trajectories);
        assert_eq!(stored.trajectories, 24);
        assert_eq!(stored.tokens, 24 * 150);
        assert_eq!(digest, stored.digest);
        assert_eq!(stored.open_left, 0);
        assert_eq!(stored.sample_checked, 24);
        assert!(
            stored.sample_mismatches.is_empty(),
            "{:?}",
            stored.sample_mismatches
        );

        // A second round with the same ids is acked as duplicates, and a wrong token fails,
        // counted, never retried.
        let (dup, refused) = rt.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let server = tokio::spawn(serve(
                listener,
                LearnerService::new(Arc::clone(&store)),
                "tok",
                async {
                    let _ = stopped.await;
                },
            ));
            let plan = |token: &str| Plan {
                learner: url.clone(),
                token: token.into(),
                name: "a1".into(),
                streams: 1,
                trajectories: 2,
                shape: Shape {
                    steps: 5,
                    tokens_per_step: 30,
                },
            };
            let dup = send(plan("tok")).await;
            let refused = send(plan("wrong")).await;
            let _ = stop.send(());
            server.await.unwrap().unwrap();
            (dup, refused)
        });
        assert_eq!((dup.acked, dup.duplicates, dup.failed), (2, 2, 0));
        assert_eq!((refused.acked, refused.failed), (0, 2));
        assert_eq!(refused.errors.len(), 1, "{:?}", refused.errors);
        assert!(
            refused.errors[0].0.contains("Unauthenticated"),
            "{:?}",
            refused.errors
        );
    }
}
