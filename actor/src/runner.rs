//! The actor process: register, keep N episodes running, sync weights, stream every
//! trajectory, and shut down without losing one.
//!
//! Threads and tasks:
//!
//! - the **engine thread** owns the model (tch) and runs [`RolloutEngine::run`]; its sink
//!   forwards every header, step and footer to the router without blocking;
//! - the **router** (tokio) gives each trajectory a [`stream_trajectory`] task that
//!   journals and streams it;
//! - the **feeder** asks `NextTasks` for as many assignments as there are free slots,
//!   rebuilds each instance ([`TaskResolver`]) and queues it on the engine; an instance
//!   whose spec hash differs from the learner's is not run but submitted as an
//!   `infra_error` trajectory without steps, so the learner sees it and never scores it;
//! - the **policy poller** asks `PolicyInfo` every poll interval and, when a newer version
//!   exists, fetches and checks it in the background and hands it to the engine, which keeps
//!   rolling on the old weights until the swap point;
//! - the **drainer** submits spooled trajectories whenever the learner is reachable.
//!
//! Shutdown: when `shutdown` resolves (SIGTERM/Ctrl-C in the CLI), the feeder stops, the
//! engine lets in-flight episodes finish for `shutdown_grace` and ends the rest as
//! `abandoned`; every trajectory is then acked or spooled, and the spool is drained for at
//! most `final_drain`. With `max_episodes`, the actor stops asking for work after that
//! many and exits once they all finished.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use corvid_episode::{ChatFormat, EpisodeFormat, FormatDescription, ToolCallSyntax};
use corvid_proto::{Fold, Termination, TrajectoryFooter, TrajectoryHeader};
use corvid_sandbox::Sandbox;
use corvid_tasks::TaskEnv;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot, watch, Notify};

use crate::client::{Backoff, LearnerLink, LinkError, Registration};
use crate::episode::{unix_ms, EpisodeSpec};
use crate::error::ActorError;
use crate::policy::{LoadedPolicy, PolicyUpdate};
use crate::rollout::{
    instant_after, EngineConfig, EngineHandle, RolloutEngine, RolloutStats, TrajectorySink,
};
use crate::spool::Spool;
use crate::submit::{
    drain_once, drain_spool, stream_trajectory, PartEvent, SubmitConfig, Submitted, Uplink,
};
use crate::tasks::TaskResolver;
use corvid_proto::Assignment;

/// Everything `corvid actor` is configured with.
#[derive(Debug, Clone)]
pub struct ActorConfig {
    /// The learner, e.g. `http://127.0.0.1:50051`.
    pub learner_url: String,
    /// The run's shared token.
    pub token: String,
    /// Free-form name for the learner's logs. Default `actor`.
    pub name: String,
    /// Episodes at once. Default 8.
    pub concurrency: usize,
    /// Stop after this many episodes (None: run until shut down).
    pub max_episodes: Option<u64>,
    /// Spool folder (one per actor process). Default `.corvid/spool`.
    pub spool_dir: PathBuf,
    /// Device for the model. Default CPU.
    pub device: tch::Device,
    /// The weights' dtype (routers stay fp32); `None`: bf16 on CUDA, fp32 on the CPU
    /// ([`corvid_model::weight_kind_for`]). bf16 on the CPU is an actor whose numerics differ
    /// from an fp32 learner's.
    pub dtype: Option<tch::Kind>,
    /// tch intra-op threads (0: leave libtorch's default). Default 1: on a shared CPU,
    /// contending OpenMP threads made small-batch decoding ~20x slower.
    pub threads: i32,
    /// How long in-flight episodes may finish after a shutdown request. Default 30 s.
    pub shutdown_grace: Duration,
    /// How long to keep trying to empty the spool before exiting. Default 10 s.
    pub final_drain: Duration,
    /// Retry settings for submissions.
    pub submit: SubmitConfig,
    /// Engine settings (`max_concurrency` is set from `concurrency`).
    pub engine: EngineConfig,
    /// Task packs the learner may assign from.
    pub task_packs: Vec<PathBuf>,
    /// Parent folder for episode workspaces (default: the system temp folder).
    pub workspace_dir: Option<PathBuf>,
    /// The model's tokenizer folder (`tokenizer.json`, `tokenizer_config.json`, its chat
    /// template) for a run in a model's own format; none for Corvid's byte layout. Its files
    /// must be the run's (same SHA-256), or the actor refuses to start.
    pub tokenizer_dir: Option<PathBuf>,
}

impl ActorConfig {
    /// Defaults for a learner at `learner_url` with `token`.
    pub fn new(learner_url: impl Into<String>, token: impl Into<String>) -> Self {
        Self {
            learner_url: learner_url.into(),
            token: token.into(),
            name: "actor".into(),
            concurrency: 8,
            max_episodes: None,
            spool_dir: PathBuf::from(".corvid/spool"),
            device: tch::Device::Cpu,
            dtype: None,
            threads: 1,
            shutdown_grace: Duration::from_secs(30),
            final_drain: Duration::from_secs(10),
            submit: SubmitConfig::default(),
            engine: EngineConfig::default(),
            task_packs: Vec::new(),
            workspace_dir: None,
            tokenizer_dir: None,
        }
    }
}

/// Reads the run's shared token from `path` (the first line, trimmed; visible ASCII only,
/// as `corvid_proto::auth::read_token_file` checks it). The error names the file once and
/// says what is wrong: missing, unreadable, a folder, empty, or the offending byte.
pub fn read_token_file(path: &std::path::Path) -> Result<String, ActorError> {
    corvid_proto::auth::read_token_file(path).map_err(|error| ActorError::TokenFile {
        path: path.to_path_buf(),
        error,
    })
}

/// What an actor run did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ActorReport {
    /// Id the learner gave this actor ("" if it never registered).
    pub actor_id: String,
    /// Journals recovered from a previous run at start-up.
    pub recovered: usize,
    /// Assignments received.
    pub assigned: u64,
    /// Assignments refused because the task spec differs (submitted as infra errors).
    pub refused: u64,
    /// Trajectories finished (any termination, refusals included).
    pub finished: u64,
    /// Acked by the learner while streaming (new).
    pub acked: u64,
    /// Acked as duplicates (the learner already had them).
    pub duplicates: u64,
    /// Left to the spool during the run.
    pub spooled: u64,
    /// Refused by the learner as invalid.
    pub rejected: u64,
    /// Lost (could not be journaled).
    pub lost: u64,
    /// Whole-trajectory resends after broken streams or failed acks.
    pub resends: u64,
    /// Spooled trajectories submitted by the drainer (during the run and at exit).
    pub drained: usize,
    /// Trajectories still in the spool at exit.
    pub spool_left: usize,
    /// Policy versions swapped in after the first.
    pub policy_updates: u64,
    /// The engine's counters.
    pub engine: RolloutStats,
}

/// This actor's episode format: the byte layout, or the model's own from `tokenizer_dir`
/// with the run's tool-call syntax; refused, naming both hashes, unless it is the run's.
pub fn episode_format(
    tokenizer_dir: Option<&Path>,
    run: &FormatDescription,
) -> Result<EpisodeFormat, ActorError> {
    let format = match tokenizer_dir {
        None => EpisodeFormat::default(),
        Some(dir) => {
            let syntax = ToolCallSyntax::from_name(&run.tool_call_format)
                .map_err(|e| ActorError::invalid("the run's episode format", e))?;
            let chat = ChatFormat::from_folder_with(dir, syntax, &run.chat_template_kwargs)
                .map_err(|e| ActorError::invalid("--tokenizer", e.to_string()))?;
            for note in chat.notes() {
                tracing::warn!("{note}");
            }
            EpisodeFormat::chat(chat)
        }
    };
    match run.mismatch(&format.description()) {
        None => Ok(format),
        Some(why) => Err(ActorError::invalid(
            "episode format",
            format!(
                "{why}; start the actor with {}",
                if run.layout == "byte" {
                    "no --tokenizer".to_string()
                } else {
                    "--tokenizer naming the run's tokenizer folder (runs/<name>/hf)".to_string()
                }
            ),
        )),
    }
}

/// Forwards the engine's output to the router without blocking the engine thread.
struct ChannelSink {
    tx: mpsc::UnboundedSender<(String, PartEvent)>,
}

impl TrajectorySink for ChannelSink {
    fn header(&mut self, h: &TrajectoryHeader) {
        let _ = self
            .tx
            .send((h.trajectory_id.clone(), PartEvent::Header(h.clone())));
    }
    fn step(&mut self, id: &str, step: corvid_proto::Step) {
        let _ = self.tx.send((id.to_string(), PartEvent::Step(step)));
    }
    fn footer(&mut self, id: &str, footer: TrajectoryFooter) {
        let _ = self.tx.send((id.to_string(), PartEvent::Footer(footer)));
    }
}

#[derive(Debug, Default)]
struct RouterCounts {
    finished: u64,
    acked: u64,
    duplicates: u64,
    spooled: u64,
    rejected: u64,
    lost: u64,
    resends: u64,
}

/// Gives each trajectory its streaming task; returns when the input closed and every
/// task ended.
async fn route(
    up: Uplink,
    mut rx: mpsc::UnboundedReceiver<(String, PartEvent)>,
    open: Arc<AtomicU64>,
    slot_freed: Arc<Notify>,
) -> RouterCounts {
    let mut lanes: HashMap<String, mpsc::UnboundedSender<PartEvent>> = HashMap::new();
    let mut tasks = tokio::task::JoinSet::new();
    let mut c = RouterCounts::default();
    let tally = |c: &mut RouterCounts, r: Result<Submitted, tokio::task::JoinError>| match r {
        Ok(Submitted::Acked { duplicate, resends }) => {
            if duplicate {
                c.duplicates += 1;
            } else {
                c.acked += 1;
            }
            c.resends += u64::from(resends);
        }
        Ok(Submitted::Spooled) => c.spooled += 1,
        Ok(Submitted::Rejected(_)) => c.rejected += 1,
        Ok(Submitted::Lost(_)) => c.lost += 1,
        Err(e) => {
            tracing::error!(error = %e, "a submission task failed");
            c.lost += 1;
        }
    };
    loop {
        tokio::select! {
            msg = rx.recv() => {
                let Some((id, ev)) = msg else { break };
                let is_footer = matches!(ev, PartEvent::Footer(_));
                if matches!(ev, PartEvent::Header(_)) {
                    let (tx, lane_rx) = mpsc::unbounded_channel();
                    tasks.spawn(stream_trajectory(up.clone(), id.clone(), lane_rx));
                    lanes.insert(id.clone(), tx);
                }
                match lanes.get(&id) {
                    Some(lane) => {
                        let _ = lane.send(ev);
                    }
                    None => tracing::error!(trajectory = %id, "part for an unknown trajectory"),
                }
                if is_footer {
                    lanes.remove(&id);
                    c.finished += 1;
                    open.fetch_sub(1, Ordering::SeqCst);
                    slot_freed.notify_one();
                }
            }
            Some(r) = tasks.join_next(), if !tasks.is_empty() => tally(&mut c, r),
        }
    }
    // Lanes without a footer (engine crash) end now; their journals stay for recovery.
    lanes.clear();
    while let Some(r) = tasks.join_next().await {
        tally(&mut c, r);
    }
    c
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into())
}

/// Retries `f` with back-off until it succeeds, fails for good, or `stop` turns true.
async fn retry<T, F, Fut>(
    what: &str,
    backoff: &mut Backoff,
    stop: &mut watch::Receiver<bool>,
    mut f: F,
) -> Result<Option<T>, ActorError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, LinkError>>,
{
    loop {
        if *stop.borrow() {
            return Ok(None);
        }
        match f().await {
            Ok(v) => {
                backoff.reset();
                return Ok(Some(v));
            }
            Err(e) if e.is_retryable() => {
                let d = backoff.next_delay();
                tracing::info!(error = %e, retry_in_ms = d.as_millis() as u64, "{what}: learner not ready");
                tokio::select! {
                    _ = tokio::time::sleep(d) => {}
                    _ = stop.changed() => {}
                }
            }
            Err(e) => return Err(ActorError::Learner(format!("{what}: {e}"))),
        }
    }
}

/// An `infra_error` trajectory without steps for an assignment the actor cannot run.
fn refusal(actor_id: &str, id: String, a: &Assignment, version: u64) -> [(String, PartEvent); 2] {
    let header = TrajectoryHeader {
        trajectory_id: id.clone(),
        task: a.task.clone(),
        actor_id: actor_id.to_string(),
        policy_version: version,
        sampling: a.sampling,
        group_id: a.group_id.clone(),
        started_unix_ms: unix_ms(),
        routes: None,
        context: None,
    };
    let footer = TrajectoryFooter {
        outcome_reward: 0.0,
        success: false,
        termination: Termination::InfraError,
        step_count: 0,
        token_count: 0,
        generated_token_count: 0,
        wall_ms: 0,
        finished_unix_ms: unix_ms(),
        template_divergent: false,
    };
    [
        (id.clone(), PartEvent::Header(header)),
        (id, PartEvent::Footer(footer)),
    ]
}

struct Feeder {
    link: LearnerLink,
    reg: Registration,
    cfg: ActorConfig,
    engine: EngineHandle,
    parts: mpsc::UnboundedSender<(String, PartEvent)>,
    open: Arc<AtomicU64>,
    slot_freed: Arc<Notify>,
    resolver: Arc<TaskResolver>,
    version: Arc<AtomicU64>,
}

#[derive(Debug, Default)]
struct FeedCounts {
    assigned: u64,
    refused: u64,
}

impl Feeder {
    fn trajectory_id(&self, n: u64) -> String {
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        format!("{}.{n}-{}", self.reg.actor_id, &suffix[..8])
    }

    /// Keeps the engine supplied until `stop`, or `max_episodes` were handed out.
    async fn run(self, mut stop: watch::Receiver<bool>) -> Result<FeedCounts, ActorError> {
        let mut counts = FeedCounts::default();
        let mut backoff =
            Backoff::new(self.cfg.submit.backoff_initial, self.cfg.submit.backoff_max);
        let concurrency = self.cfg.concurrency.max(1) as u64;
        loop {
            if *stop.borrow() {
                break;
            }
            if self.cfg.max_episodes.is_some_and(|m| counts.assigned >= m) {
                break;
            }
            let open = self.open.load(Ordering::SeqCst);
            if open >= concurrency {
                tokio::select! {
                    _ = self.slot_freed.notified() => {}
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = stop.changed() => {}
                }
                continue;
            }
            let mut want = concurrency - open;
            if let Some(m) = self.cfg.max_episodes {
                want = want.min(m - counts.assigned);
            }
            let got = match self
                .link
                .next_tasks(&self.reg.actor_id, u32::try_from(want).unwrap_or(u32::MAX))
                .await
            {
                Ok(v) => {
                    backoff.reset();
                    v
                }
                Err(e) if e.is_retryable() => {
                    let d = backoff.next_delay();
                    tracing::info!(error = %e, "NextTasks failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(d) => {}
                        _ = stop.changed() => {}
                    }
                    continue;
                }
                Err(e) => return Err(ActorError::Learner(format!("NextTasks: {e}"))),
            };
            if got.is_empty() {
                // Back-pressure: the learner has no group open for us right now.
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    _ = stop.changed() => {}
                }
                continue;
            }
            if *stop.borrow() {
                // The engine takes no episode once stopping; the learner hands these out
                // again after `actor_timeout_s` of silence.
                tracing::info!(
                    assignments = got.len(),
                    "stopping: assignments that arrived after the stop are left to the learner"
                );
                break;
            }
            for a in got {
                counts.assigned += 1;
                self.open.fetch_add(1, Ordering::SeqCst);
                let id = self.trajectory_id(counts.assigned);
                let resolver = self.resolver.clone();
                let task_ref = a.task.clone();
                let resolved = tokio::task::spawn_blocking(move || resolver.resolve(&task_ref))
                    .await
                    .map_err(|e| ActorError::Task {
                        task: a.task.instance_key(),
                        why: format!("instance generation panicked: {e}"),
                    })
                    .and_then(|r| r);
                match resolved {
                    Ok(task) => {
                        let spec = EpisodeSpec {
                            trajectory_id: id,
                            actor_id: self.reg.actor_id.clone(),
                            task,
                            group_id: a.group_id.clone(),
                            max_turns: a.max_turns,
                            // A folding episode's budget spans its segments; only its
                            // window is capped at the model's positions.
                            context_budget: match &a.context {
                                Some(c) if c.fold != Fold::None => a.context_budget,
                                _ => a.context_budget.min(self.reg.max_context.max(1)),
                            },
                            sampling: a.sampling,
                            context: a.context.clone(),
                        };
                        if let Err(e) = self.engine.start_episode(spec) {
                            if *stop.borrow() {
                                // The stop came while this answer was on its way and the
                                // engine has already ended: as above.
                                tracing::info!(group = %a.group_id, "stopping: an assignment is left to the learner");
                                return Ok(counts);
                            }
                            return Err(e);
                        }
                    }
                    Err(e) => {
                        tracing::error!(error = %e, group = %a.group_id, "assignment refused; reported as infra_error");
                        counts.refused += 1;
                        let version = self.version.load(Ordering::SeqCst);
                        for p in refusal(&self.reg.actor_id, id, &a, version) {
                            let _ = self.parts.send(p);
                        }
                    }
                }
            }
        }
        Ok(counts)
    }
}

/// Polls `PolicyInfo` as `actor_id` (which keeps the actor's episodes its own at the
/// learner) and hands newer weights to the engine.
async fn poll_policy(
    link: LearnerLink,
    actor_id: String,
    engine: EngineHandle,
    interval: Duration,
    version: Arc<AtomicU64>,
    mut stop: watch::Receiver<bool>,
) -> u64 {
    let mut updates = 0;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.changed() => {}
        }
        if *stop.borrow() {
            return updates;
        }
        let known = version.load(Ordering::SeqCst);
        let info = match link.policy_info(&actor_id).await {
            Ok(i) => i,
            Err(e) => {
                tracing::debug!(error = %e, "PolicyInfo failed");
                continue;
            }
        };
        if info.version <= known {
            continue;
        }
        let fetched = match link.fetch_policy(info.version).await {
            Err(LinkError::Status { status, .. }) if status.code() == tonic::Code::NotFound => {
                link.fetch_policy(0).await
            }
            r => r,
        };
        match fetched {
            Ok(u) if u.version > known => {
                tracing::info!(
                    version = u.version,
                    bytes = u.bytes.len(),
                    "fetched a newer policy"
                );
                version.store(u.version, Ordering::SeqCst);
                if engine.update_policy(u).is_err() {
                    return updates;
                }
                updates += 1;
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "fetching the newer policy failed; will retry"),
        }
    }
}

/// Runs an actor until `shutdown` resolves or `max_episodes` are done.
pub async fn run_actor(
    cfg: ActorConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<ActorReport, ActorError> {
    let mut report = ActorReport::default();
    let spool = Arc::new(Spool::open(&cfg.spool_dir)?);
    let rec = spool.recover()?;
    report.recovered = rec.sealed + rec.finished;
    if report.recovered > 0 {
        tracing::info!(
            sealed = rec.sealed,
            finished = rec.finished,
            "recovered journals from a previous run"
        );
    }
    if rec.rejected > 0 {
        tracing::warn!(
            rejected = rec.rejected,
            folder = %spool.root().join("rejected").display(),
            "journals from a previous run could not be read; they were set aside, not submitted"
        );
    }
    let link = LearnerLink::new(&cfg.learner_url, &cfg.token);
    let up = Uplink {
        link: link.clone(),
        spool: spool.clone(),
        cfg: cfg.submit.clone(),
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let drainer = tokio::spawn(drain_spool(up.clone(), stop_rx.clone()));
    tokio::pin!(shutdown);

    // Register and get the first weights, unless asked to stop first.
    let mut backoff = Backoff::new(cfg.submit.backoff_initial, cfg.submit.backoff_max);
    let setup = async {
        let mut stop = stop_rx.clone();
        let host = hostname();
        // The learner says over the standard health protocol when it hands out work (after
        // SFT); until then the actor waits with back-off.
        let serving = retry("Health", &mut backoff, &mut stop, || link.serving()).await?;
        if serving.is_none() {
            return Ok(None);
        }
        let reg = retry("Register", &mut backoff, &mut stop, || {
            link.register(&cfg.name, &host, cfg.concurrency as u32)
        })
        .await?;
        let Some(reg) = reg else { return Ok(None) };
        let policy = retry("FetchPolicy", &mut backoff, &mut stop, || {
            link.fetch_policy(0)
        })
        .await?;
        Ok::<_, ActorError>(policy.map(|p| (reg, p)))
    };
    let setup = tokio::select! {
        r = setup => r?,
        _ = &mut shutdown => None,
    };
    let Some((reg, first)) = setup else {
        let _ = stop_tx.send(true);
        report.drained += drainer.await.unwrap_or(0);
        report.spool_left = spool.ready_files()?.len();
        return Ok(report);
    };
    report.actor_id = reg.actor_id.clone();
    tracing::info!(actor = %reg.actor_id, run = %reg.run_name, policy = first.version, "registered");

    // The engine thread.
    let (parts_tx, parts_rx) = mpsc::unbounded_channel();
    let (handle_tx, handle_rx) = oneshot::channel();
    let (done_tx, mut done_rx) = oneshot::channel::<Result<RolloutStats, ActorError>>();
    let mut env = TaskEnv::new(
        Sandbox::builder()
            .search_tool(true)
            .build()
            .map_err(|e| ActorError::invalid("sandbox", e.to_string()))?,
    );
    if let Some(d) = &cfg.workspace_dir {
        std::fs::create_dir_all(d).map_err(ActorError::io(d))?;
        env = env.with_workspace_parent(d.clone());
    }
    let engine_cfg = EngineConfig {
        max_concurrency: cfg.concurrency.max(1),
        format: episode_format(cfg.tokenizer_dir.as_deref(), &reg.episode_format)?,
        record_routes: reg.record_routes,
        ..cfg.engine.clone()
    };
    let (model_cfg, device, threads) = (reg.model_config.clone(), cfg.device, cfg.threads);
    let dtype = cfg.dtype;
    let sink_tx = parts_tx.clone();
    let first_for_engine: PolicyUpdate = first.clone();
    std::thread::Builder::new()
        .name("rollout-engine".into())
        .spawn(move || {
            let result = (|| {
                if threads > 0 {
                    tch::set_num_threads(threads);
                }
                let kind = dtype.unwrap_or_else(|| corvid_model::weight_kind_for(device));
                let mut policy = LoadedPolicy::random_in(&model_cfg, device, kind)?;
                policy.load(&first_for_engine.bytes, first_for_engine.version)?;
                let mut engine = RolloutEngine::new(&mut policy, env, engine_cfg);
                let _ = handle_tx.send(engine.handle());
                let mut sink = ChannelSink { tx: sink_tx };
                engine.run(&mut sink)
            })();
            let _ = done_tx.send(result);
        })
        .map_err(|e| ActorError::EngineGone(format!("cannot start the engine thread: {e}")))?;
    let engine = match handle_rx.await {
        Ok(h) => h,
        Err(_) => {
            let err = match done_rx.await {
                Ok(Err(e)) => e,
                _ => ActorError::EngineGone("the engine thread ended during start-up".into()),
            };
            let _ = stop_tx.send(true);
            let _ = drainer.await;
            return Err(err);
        }
    };

    let open = Arc::new(AtomicU64::new(0));
    let slot_freed = Arc::new(Notify::new());
    let version = Arc::new(AtomicU64::new(first.version));
    let router = tokio::spawn(route(
        up.clone(),
        parts_rx,
        open.clone(),
        slot_freed.clone(),
    ));
    let poller = tokio::spawn(poll_policy(
        link.clone(),
        reg.actor_id.clone(),
        engine.clone(),
        reg.policy_poll_interval,
        version.clone(),
        stop_rx.clone(),
    ));
    let feeder = Feeder {
        link: link.clone(),
        reg: reg.clone(),
        cfg: cfg.clone(),
        engine: engine.clone(),
        parts: parts_tx,
        open,
        slot_freed,
        resolver: Arc::new(TaskResolver::new(&cfg.task_packs)?),
        version,
    };
    let (feed_stop_tx, feed_stop_rx) = watch::channel(false);
    let mut feeder = tokio::spawn(feeder.run(feed_stop_rx));

    // Run until asked to stop, the episode budget is handed out, or the engine fails.
    let mut engine_result: Option<Result<RolloutStats, ActorError>> = None;
    let mut feed_result = None;
    let mut shutting_down = false;
    tokio::select! {
        _ = &mut shutdown => shutting_down = true,
        r = &mut feeder => feed_result = Some(r),
        r = &mut done_rx => engine_result = Some(r.unwrap_or_else(|_| Err(ActorError::EngineGone("no result".into())))),
    }
    let _ = feed_stop_tx.send(true);
    if shutting_down {
        tracing::info!(
            grace_s = cfg.shutdown_grace.as_secs_f64(),
            "shutting down: finishing in-flight episodes"
        );
        let _ = engine.shutdown(cfg.shutdown_grace);
    } else {
        let _ = engine.close();
    }
    let feed = match feed_result {
        Some(r) => r,
        None => feeder.await,
    };
    let feed = feed.map_err(|e| ActorError::EngineGone(format!("feeder task failed: {e}")))?;
    if engine_result.is_none() {
        // Wait for the engine to finish its episodes; a late shutdown request shortens it.
        tokio::select! {
            r = &mut done_rx => engine_result = Some(r.unwrap_or_else(|_| Err(ActorError::EngineGone("no result".into())))),
            _ = &mut shutdown, if !shutting_down => {
                let _ = engine.shutdown(cfg.shutdown_grace);
                engine_result = Some(done_rx.await.unwrap_or_else(|_| Err(ActorError::EngineGone("no result".into()))));
            }
        }
    }
    drop(engine);
    let counts = router
        .await
        .map_err(|e| ActorError::EngineGone(format!("router task failed: {e}")))?;
    let _ = stop_tx.send(true);
    report.policy_updates = poller.await.unwrap_or(0);
    report.drained += drainer.await.unwrap_or(0);

    // Last chance for spooled trajectories.
    let deadline = instant_after(Instant::now(), cfg.final_drain);
    loop {
        let pass = drain_once(&up).await?;
        report.drained += pass.sent;
        if pass.left == 0 || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    report.spool_left = spool.ready_files()?.len();
    let feed = feed?;
    report.assigned = feed.assigned;
    report.refused = feed.refused;
    report.finished = counts.finished;
    report.acked = counts.acked;
    report.duplicates = counts.duplicates;
    report.spooled = counts.spooled;
    report.rejected = counts.rejected;
    report.lost = counts.lost;
    report.resends = counts.resends;
    match engine_result {
        Some(Ok(stats)) => report.engine = stats,
        Some(Err(e)) => return Err(e),
        None => {}
    }
    if report.spool_left > 0 {
        tracing::warn!(left = report.spool_left, spool = %spool.root().display(), "trajectories remain spooled; the next actor start submits them");
    }
    Ok(report)
}

#[cfg(test)]
mod format_tests {
    use super::*;

    fn chatml() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tokenizer/tests/fixtures/chatml_tools")
    }

    #[test]
    fn an_actor_takes_the_runs_format_and_refuses_other_tokenizer_files() {
        let run = EpisodeFormat::chat(
            ChatFormat::from_folder(&chatml(), ToolCallSyntax::Hermes).unwrap(),
        )
        .description();
        let same = episode_format(Some(&chatml()), &run).unwrap();
        assert_eq!(same.description(), run);
        // The same folder with one more added token: another tokenizer.
        let tmp = tempfile::tempdir().unwrap();
        for f in [
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja",
        ] {
            std::fs::copy(chatml().join(f), tmp.path().join(f)).unwrap();
        }
        let config = std::fs::read_to_string(tmp.path().join("tokenizer_config.json")).unwrap();
        std::fs::write(
            tmp.path().join("tokenizer_config.json"),
            format!("{config}\n"),
        )
        .unwrap();
        let mine = EpisodeFormat::chat(
            ChatFormat::from_folder(tmp.path(), ToolCallSyntax::Hermes).unwrap(),
        )
        .description();
        let err = episode_format(Some(tmp.path()), &run)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&run.tokenizer_sha256) && err.contains(&mine.tokenizer_sha256),
            "{err}"
        );
        // A byte actor for a chat run, and the other way round.
        let err = episode_format(None, &run).unwrap_err().to_string();
        assert!(
            err.contains("--tokenizer naming the run's tokenizer folder"),
            "{err}"
        );
        let byte = EpisodeFormat::default().description();
        let err = episode_format(Some(&chatml()), &byte)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no --tokenizer"), "{err}");
    }
}
