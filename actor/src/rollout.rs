//! The batched generation engine: many episodes decode together on one latent cache.
//! It is one file past ~800 lines because it is one mechanism: admission, ragged prefill,
//! decode steps and weight swaps all act on the same cache rows.
//!
//! # How a turn flows
//!
//! Every episode owns one row of a single `KvCache` (left-aligned, per-row lengths) from
//! admission to its end; rows never move, so nothing is copied when turns start and end.
//!
//! 1. An episode whose context is queued (the prompt, or a tool message) is *ready*. Ready
//!    episodes are prefilled — only the tokens not yet in their row, so a new turn costs
//!    its new tokens (prefix reuse). Ready rows of similar pending lengths are prefilled in
//!    one ragged `[k, T]` forward ([`MoePolicy::forward_ragged_last`]: each row appends its own
//!    count, the rest is padding); the last real position's logits give each its first
//!    generated token.
//! 2. Prefilled episodes *decode*: every decode step is one forward over the cache's low
//!    rows, appending each decoding row's latest token (rows waiting on a tool append
//!    nothing) and drawing the next from the [`TokenChooser`] (exact id, behaviour
//!    log-prob, policy version recorded).
//! 3. A row whose turn ends (`</tool_call>`, `<|end|>`, `max_new_tokens`, or the end of the
//!    context budget) stops decoding; its call goes to the episode's sandbox worker
//!    (`crate::tools`) while the others decode on.
//! 4. The tool's result (or the parse error of a malformed call) is queued as the next
//!    turn's context, masked, and the episode is ready again — or it ends: `answered`,
//!    `max_turns`, `context_full` (the budget ended mid-turn, or leaves no room for the
//!    next one; see [`crate::episode::MIN_TURN_TOKENS`]) after the checker ran, or
//!    `infra_error` when the sandbox failed.
//!
//! # Weight swaps
//!
//! A new policy is swapped in only between turns: once an update is pending, no episode
//! starts a new turn; when the last row of the batch has finished its turn, the weights are
//! replaced and every cached row is emptied, because latents computed under the old
//! weights are stale. Each episode then re-prefills its whole sequence under the new
//! weights at its next turn, so every recorded log-prob is exactly that of the weights
//! whose version is recorded with it.
//!
//! The engine runs on one thread (tch tensors stay there); other threads talk to it through
//! an [`EngineHandle`].

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use corvid_episode::EpisodeFormat;
use corvid_model::{KvCache, MoePolicy};
use corvid_proto::{
    Fold, RouteShape, Step, Termination, Trajectory, TrajectoryFooter, TrajectoryHeader,
};
use corvid_tasks::{TaskEnv, Verdict};
use serde::Serialize;
use tch::{Kind, Tensor};

use crate::episode::{EpisodeRun, EpisodeSpec, Next, Phase, TurnCall};
use crate::error::ActorError;
use crate::policy::{LoadedPolicy, PolicyUpdate};
use crate::sampler::{ChoiceContext, NucleusSampler, TokenChooser};
use crate::tools::{Job, ToolEvent, Worker};

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Episodes run at once (and the largest decode batch). Default 8.
    pub max_concurrency: usize,
    /// Longest a tool call, workspace creation or checker may take before the episode is
    /// ended as `infra_error`. The sandbox enforces its own, much shorter, limits; this is
    /// the last line against a stuck host. Default 120 s.
    pub tool_timeout: Duration,
    /// How long the idle engine waits for news before re-checking deadlines. Default 20 ms.
    pub idle_wait: Duration,
    /// How episodes become token ids: the run's format, which the learner trains in.
    pub format: EpisodeFormat,
    /// Record every token's expert ids in the steps (an MoE policy; ignored for a dense
    /// one). Default false.
    pub record_routes: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_concurrency: 8,
            tool_timeout: Duration::from_secs(120),
            idle_wait: Duration::from_millis(20),
            format: EpisodeFormat::default(),
            record_routes: false,
        }
    }
}

/// `now + d`, or, when that does not fit in an [`Instant`] (a timeout of, say, 1e19 s),
/// an instant a century away (failing that, a day): no setting can make a deadline panic.
pub(crate) fn instant_after(now: Instant, d: Duration) -> Instant {
    const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);
    const DAY: Duration = Duration::from_secs(24 * 3600);
    now.checked_add(d)
        .or_else(|| now.checked_add(100 * YEAR))
        .or_else(|| now.checked_add(DAY))
        .unwrap_or(now)
}

/// Receives trajectories as they grow: the header when an episode starts, each step when
/// its turn's tool result is in, the footer at the end. Calls for one trajectory come in
/// that order.
pub trait TrajectorySink {
    /// An episode started.
    fn header(&mut self, header: &TrajectoryHeader);
    /// A turn finished.
    fn step(&mut self, trajectory_id: &str, step: Step);
    /// The episode ended.
    fn footer(&mut self, trajectory_id: &str, footer: TrajectoryFooter);
}

/// A sink that keeps whole trajectories in memory (evaluation, tests, benchmarks).
#[derive(Debug, Default)]
pub struct CollectSink {
    open: HashMap<String, (TrajectoryHeader, Vec<Step>)>,
    /// Finished trajectories, in the order they finished.
    pub finished: Vec<Trajectory>,
}

impl TrajectorySink for CollectSink {
    fn header(&mut self, header: &TrajectoryHeader) {
        self.open
            .insert(header.trajectory_id.clone(), (header.clone(), Vec::new()));
    }
    fn step(&mut self, id: &str, step: Step) {
        if let Some((_, steps)) = self.open.get_mut(id) {
            steps.push(step);
        }
    }
    fn footer(&mut self, id: &str, footer: TrajectoryFooter) {
        if let Some((header, steps)) = self.open.remove(id) {
            self.finished.push(Trajectory {
                header,
                steps,
                footer,
            });
        }
    }
}

/// Counters of one engine run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RolloutStats {
    /// Episodes finished (any termination).
    pub episodes: u64,
    /// Episodes by termination (`answered`, `max_turns`, ...).
    pub terminations: std::collections::BTreeMap<String, u64>,
    /// Checker passes.
    pub successes: u64,
    /// Tokens the policy generated.
    pub generated_tokens: u64,
    /// Context tokens prefilled (prompts, tool messages, re-prefills after swaps).
    pub prefill_tokens: u64,
    /// Of those, tokens re-prefilled because the weights changed.
    pub reprefill_tokens: u64,
    /// Batched decode steps.
    pub decode_steps: u64,
    /// Sum over decode steps of the batch size.
    pub decode_rows: u64,
    /// Time in model forwards (prefill and decode), seconds.
    pub forward_s: f64,
    /// Sum over tool calls and checkers of their wall time, seconds.
    pub tool_s: f64,
    /// Sum over episodes of their wall time, seconds.
    pub episode_s: f64,
    /// Wall time of the run, seconds.
    pub wall_s: f64,
    /// Weight swaps performed.
    pub weight_swaps: u64,
    /// Episodes queued but never started (shutdown came first).
    pub unstarted: u64,
}

enum Msg {
    Episode(Box<EpisodeSpec>),
    Policy(PolicyUpdate),
    Shutdown(Duration),
    Close,
    Tool(u64, ToolEvent),
}

/// Talks to a running engine from any thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: Sender<Msg>,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EngineHandle")
    }
}

impl EngineHandle {
    fn send(&self, m: Msg) -> Result<(), ActorError> {
        self.tx
            .send(m)
            .map_err(|_| ActorError::EngineGone("its channel is closed".into()))
    }

    /// Queues an episode; it starts when a slot is free.
    pub fn start_episode(&self, spec: EpisodeSpec) -> Result<(), ActorError> {
        self.send(Msg::Episode(Box::new(spec)))
    }

    /// Hands over newer weights; they are swapped in at the next point where no episode is
    /// mid-turn.
    pub fn update_policy(&self, update: PolicyUpdate) -> Result<(), ActorError> {
        self.send(Msg::Policy(update))
    }

    /// Stops starting episodes; in-flight ones may finish within `grace`, the rest are
    /// ended as `abandoned`. `run` returns when none is left.
    pub fn shutdown(&self, grace: Duration) -> Result<(), ActorError> {
        self.send(Msg::Shutdown(grace))
    }

    /// No more episodes will come: `run` returns once the queued and running ones finished.
    pub fn close(&self) -> Result<(), ActorError> {
        self.send(Msg::Close)
    }
}

/// The batched rollout engine over one policy and one task environment.
pub struct RolloutEngine<'p> {
    policy: &'p mut LoadedPolicy,
    env: TaskEnv,
    format: EpisodeFormat,
    cfg: EngineConfig,
    chooser: Box<dyn TokenChooser>,
    tx: Sender<Msg>,
    rx: Receiver<Msg>,
    queue: VecDeque<EpisodeSpec>,
    episodes: HashMap<u64, Slot>,
    next_key: u64,
    /// Episodes generating their turn, whatever their rows.
    decoding: Vec<u64>,
    /// One row per running episode (`Slot::row`); created at the first prefill.
    cache: Option<KvCache>,
    /// Rows no episode owns; the lowest is handed out first, so decode steps over the
    /// low rows stay short when few episodes run.
    free_rows: BTreeSet<usize>,
    pending_policy: Option<PolicyUpdate>,
    shutdown_at: Option<Instant>,
    closed: bool,
    stats: RolloutStats,
    /// The layout of the routes this engine records: `None` unless recording is on and the
    /// policy has MoE layers (a weight swap keeps the config).
    routes: Option<RouteShape>,
}

struct Slot {
    run: EpisodeRun,
    worker: Option<Worker>,
    /// This episode's row of the engine's cache.
    row: usize,
}

impl std::fmt::Debug for RolloutEngine<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RolloutEngine")
            .field("version", &self.policy.version())
            .field("episodes", &self.episodes.len())
            .field("decoding", &self.decoding.len())
            .finish_non_exhaustive()
    }
}

impl<'p> RolloutEngine<'p> {
    /// An engine decoding with `policy` in `env`, sampling with [`NucleusSampler`].
    pub fn new(policy: &'p mut LoadedPolicy, env: TaskEnv, cfg: EngineConfig) -> Self {
        let (tx, rx) = mpsc::channel();
        let rows = cfg.max_concurrency.max(1);
        let c = policy.model().config();
        let routes =
            RouteShape::of_moe(c.n_moe_layers(), c.num_experts_per_tok, c.n_routed_experts)
                .filter(|_| cfg.record_routes);
        Self {
            routes,
            policy,
            env,
            format: cfg.format.clone(),
            cfg,
            chooser: Box::new(NucleusSampler),
            tx,
            rx,
            queue: VecDeque::new(),
            episodes: HashMap::new(),
            next_key: 0,
            decoding: Vec::new(),
            cache: None,
            free_rows: (0..rows).collect(),
            pending_policy: None,
            shutdown_at: None,
            closed: false,
            stats: RolloutStats::default(),
        }
    }

    /// Uses `chooser` to pick tokens (e.g. [`crate::sampler::ScriptedTokens`]).
    pub fn with_chooser(mut self, chooser: Box<dyn TokenChooser>) -> Self {
        self.chooser = chooser;
        self
    }

    /// Uses `format` for prompts, tool messages and call parsing.
    pub fn with_format(mut self, format: EpisodeFormat) -> Self {
        self.format = format;
        self
    }

    /// A handle for other threads.
    pub fn handle(&self) -> EngineHandle {
        EngineHandle {
            tx: self.tx.clone(),
        }
    }

    /// Runs until it is closed (or shut down) and every episode has finished, feeding
    /// `sink` as trajectories grow.
    pub fn run(&mut self, sink: &mut dyn TrajectorySink) -> Result<RolloutStats, ActorError> {
        let t0 = Instant::now();
        loop {
            let busy = !self.decoding.is_empty() || self.can_prefill();
            if busy {
                while let Ok(m) = self.rx.try_recv() {
                    self.handle_msg(m, sink);
                }
            } else {
                if self.finished() {
                    break;
                }
                match self.rx.recv_timeout(self.cfg.idle_wait) {
                    Ok(m) => {
                        self.handle_msg(m, sink);
                        while let Ok(m) = self.rx.try_recv() {
                            self.handle_msg(m, sink);
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => {
                        return Err(ActorError::EngineGone("message channel closed".into()))
                    }
                }
            }
            self.admit(sink);
            self.check_deadlines(sink);
            self.maybe_swap_weights()?;
            self.prefill_ready(sink)?;
            self.park_finished_turns(sink)?;
            self.decode_step()?;
            self.park_finished_turns(sink)?;
        }
        self.stats.wall_s = t0.elapsed().as_secs_f64();
        Ok(std::mem::take(&mut self.stats))
    }

    /// The version of the weights in use.
    pub fn policy_version(&self) -> u64 {
        self.policy.version()
    }

    fn finished(&self) -> bool {
        (self.closed || self.shutdown_at.is_some())
            && self.episodes.is_empty()
            && (self.queue.is_empty() || self.shutdown_at.is_some())
    }

    fn can_prefill(&self) -> bool {
        self.pending_policy.is_none() && self.episodes.values().any(|s| s.run.phase == Phase::Ready)
    }

    fn handle_msg(&mut self, m: Msg, sink: &mut dyn TrajectorySink) {
        match m {
            Msg::Episode(spec) => {
                if self.shutdown_at.is_some() {
                    self.stats.unstarted += 1;
                } else {
                    self.queue.push_back(*spec);
                }
            }
            Msg::Policy(u) => {
                if u.version > self.policy.version()
                    && self
                        .pending_policy
                        .as_ref()
                        .is_none_or(|p| u.version > p.version)
                {
                    tracing::info!(
                        version = u.version,
                        "new policy pending; swapping between turns"
                    );
                    self.pending_policy = Some(u);
                }
            }
            Msg::Shutdown(grace) => {
                let at = instant_after(Instant::now(), grace);
                self.shutdown_at = Some(self.shutdown_at.map_or(at, |t| t.min(at)));
                self.stats.unstarted += self.queue.len() as u64;
                self.queue.clear();
            }
            Msg::Close => self.closed = true,
            Msg::Tool(key, ev) => self.on_tool_event(key, ev, sink),
        }
    }

    fn admit(&mut self, sink: &mut dyn TrajectorySink) {
        if self.shutdown_at.is_some() {
            return;
        }
        while self.episodes.len() < self.cfg.max_concurrency.max(1) {
            let Some(spec) = self.queue.pop_front() else {
                break;
            };
            let key = self.next_key;
            self.next_key += 1;
            let max_pos = usize::try_from(self.policy.model().config().max_position_embeddings)
                .unwrap_or(usize::MAX);
            let mut run = EpisodeRun::new(
                spec,
                self.policy.version(),
                &self.format,
                &self.env,
                max_pos,
            );
            run.header.routes = self.routes;
            sink.header(&run.header);
            if let Some(why) = run.start_error.take() {
                tracing::error!(episode = %run.header.trajectory_id, "{why}");
                self.end(run, Termination::InfraError, None, sink);
                continue;
            }
            let tx = self.tx.clone();
            let notes = (run.fold == Fold::Notes)
                .then(|| run.spec.context.as_ref().map(|c| c.notes_path.clone()))
                .flatten();
            let worker = Worker::spawn(
                self.env.clone(),
                run.spec.task.clone(),
                notes,
                tx,
                move |ev| Msg::Tool(key, ev),
            );
            run.deadline = Some(instant_after(Instant::now(), self.cfg.tool_timeout));
            match worker {
                Ok(w) => {
                    let row = self
                        .free_rows
                        .pop_first()
                        .expect("a free row for every admitted episode");
                    self.episodes.insert(
                        key,
                        Slot {
                            run,
                            worker: Some(w),
                            row,
                        },
                    );
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot start a sandbox worker thread");
                    self.end(run, Termination::InfraError, None, sink);
                }
            }
        }
    }

    /// Records the footer of a finished episode.
    fn end(
        &mut self,
        run: EpisodeRun,
        termination: Termination,
        verdict: Option<&Verdict>,
        sink: &mut dyn TrajectorySink,
    ) {
        let footer = run.footer(&self.format, termination, verdict);
        self.stats.episodes += 1;
        *self
            .stats
            .terminations
            .entry(termination.as_str().to_string())
            .or_default() += 1;
        self.stats.successes += u64::from(footer.success);
        self.stats.episode_s += run.started.elapsed().as_secs_f64();
        tracing::debug!(trajectory = %run.spec.trajectory_id, termination = %termination, success = footer.success, "episode finished");
        sink.footer(&run.spec.trajectory_id, footer);
    }

    fn finish_key(
        &mut self,
        key: u64,
        termination: Termination,
        verdict: Option<&Verdict>,
        sink: &mut dyn TrajectorySink,
    ) {
        if let Some(slot) = self.episodes.remove(&key) {
            self.decoding.retain(|k| *k != key);
            // An empty row costs decode steps over the low rows nothing in attention width.
            if let Some(c) = self.cache.as_mut() {
                c.reset_row(slot.row);
            }
            self.free_rows.insert(slot.row);
            self.end(slot.run, termination, verdict, sink);
        }
    }

    /// Sends a job to the episode's worker, or ends the episode if the worker is gone.
    fn dispatch(&mut self, key: u64, job: Job, phase: Phase, sink: &mut dyn TrajectorySink) {
        let deadline = instant_after(Instant::now(), self.cfg.tool_timeout);
        let Some(slot) = self.episodes.get_mut(&key) else {
            return;
        };
        let sent = slot.worker.as_ref().is_some_and(|w| w.send(job));
        if sent {
            slot.run.phase = phase;
            slot.run.deadline = Some(deadline);
        } else {
            tracing::error!(trajectory = %slot.run.spec.trajectory_id, "sandbox worker is gone");
            self.finish_key(key, Termination::InfraError, None, sink);
        }
    }

    fn emit_steps(&mut self, key: u64, steps: Vec<Step>, sink: &mut dyn TrajectorySink) {
        if let Some(slot) = self.episodes.get(&key) {
            let id = slot.run.spec.trajectory_id.clone();
            for s in steps {
                sink.step(&id, s);
            }
        }
    }

    fn after_turn(&mut self, key: u64, next: Next, sink: &mut dyn TrajectorySink) {
        match next {
            Next::Turn => {
                if let Some(slot) = self.episodes.get_mut(&key) {
                    slot.run.phase = Phase::Ready;
                    slot.run.deadline = None;
                }
            }
            Next::Check(t) => {
                if let Some(slot) = self.episodes.get_mut(&key) {
                    slot.run.next_after_check = Some(t);
                }
                self.dispatch(key, Job::Check, Phase::Checking, sink);
            }
            Next::End(t) => self.finish_key(key, t, None, sink),
        }
    }

    fn on_tool_event(&mut self, key: u64, ev: ToolEvent, sink: &mut dyn TrajectorySink) {
        let Some(slot) = self.episodes.get_mut(&key) else {
            return; // ended already (timeout, shutdown)
        };
        match (slot.run.phase, ev) {
            (Phase::Starting, ToolEvent::Started(Ok(()))) => {
                if slot.run.next_turn_fits() {
                    slot.run.phase = Phase::Ready;
                    slot.run.deadline = None;
                    slot.run.turn_started = Instant::now();
                } else {
                    slot.run.next_after_check = Some(Termination::ContextFull);
                    self.dispatch(key, Job::Check, Phase::Checking, sink);
                }
            }
            (Phase::Starting, ToolEvent::Started(Err(e))) => {
                tracing::error!(trajectory = %slot.run.spec.trajectory_id, error = %e, "workspace could not be created");
                self.finish_key(key, Termination::InfraError, None, sink);
            }
            (
                Phase::Tool,
                ToolEvent::Called {
                    out,
                    process_reward,
                    wall,
                    notes,
                },
            ) => {
                self.stats.tool_s += wall.as_secs_f64();
                let Some(TurnCall::Call(call)) = slot.run.pending_call.take() else {
                    tracing::error!("tool result without a pending call");
                    self.finish_key(key, Termination::InfraError, None, sink);
                    return;
                };
                if let Some(detail) = &out.infra_detail {
                    tracing::error!(trajectory = %slot.run.spec.trajectory_id, detail = %detail, "sandbox infrastructure failure");
                }
                let (steps, next) =
                    slot.run
                        .finish_call(&self.format, call, &out, process_reward, wall, notes);
                self.emit_steps(key, steps, sink);
                self.after_turn(key, next, sink);
            }
            (Phase::Checking, ToolEvent::Checked { verdict, wall }) => {
                self.stats.tool_s += wall.as_secs_f64();
                let t = slot.run.next_after_check.unwrap_or(Termination::MaxTurns);
                self.finish_key(key, t, Some(&verdict), sink);
            }
            (_, ToolEvent::Crashed(why)) => {
                tracing::error!(trajectory = %slot.run.spec.trajectory_id, panic = %why, "sandbox worker crashed");
                self.finish_key(key, Termination::InfraError, None, sink);
            }
            (phase, ev) => {
                tracing::warn!(?phase, event = ?ev, "unexpected sandbox event ignored");
            }
        }
    }

    fn check_deadlines(&mut self, sink: &mut dyn TrajectorySink) {
        let now = Instant::now();
        if self.shutdown_at.is_some_and(|t| now >= t) && !self.episodes.is_empty() {
            let keys: Vec<u64> = self.episodes.keys().copied().collect();
            tracing::warn!(
                episodes = keys.len(),
                "grace period over: abandoning in-flight episodes"
            );
            self.decoding.clear();
            let mut keys = keys;
            keys.sort_unstable();
            for key in keys {
                self.finish_key(key, Termination::Abandoned, None, sink);
            }
            return;
        }
        let late: Vec<u64> = self
            .episodes
            .iter()
            .filter(|(_, s)| {
                matches!(s.run.phase, Phase::Starting | Phase::Tool | Phase::Checking)
                    && s.run.deadline.is_some_and(|d| now >= d)
            })
            .map(|(k, _)| *k)
            .collect();
        for key in late {
            if let Some(slot) = self.episodes.get(&key) {
                tracing::error!(trajectory = %slot.run.spec.trajectory_id, phase = ?slot.run.phase, timeout_s = self.cfg.tool_timeout.as_secs_f64(), "sandbox did not answer in time");
            }
            self.finish_key(key, Termination::InfraError, None, sink);
        }
    }

    fn maybe_swap_weights(&mut self) -> Result<(), ActorError> {
        if !self.decoding.is_empty() {
            return Ok(());
        }
        let Some(update) = self.pending_policy.take() else {
            return Ok(());
        };
        self.policy.load(&update.bytes, update.version)?;
        for slot in self.episodes.values_mut() {
            self.stats.reprefill_tokens += slot.run.cached as u64;
            slot.run.cached = 0;
        }
        if let Some(c) = self.cache.as_mut() {
            c.reset_all();
        }
        self.stats.weight_swaps += 1;
        tracing::info!(version = update.version, "policy swapped in");
        Ok(())
    }

    /// Prefills every ready episode; each then decodes.
    fn prefill_ready(&mut self, _sink: &mut dyn TrajectorySink) -> Result<(), ActorError> {
        if self.pending_policy.is_some() || self.shutdown_at.is_some_and(|t| Instant::now() >= t) {
            return Ok(());
        }
        let mut ready: Vec<(usize, u64)> = self
            .episodes
            .iter()
            .filter(|(_, s)| s.run.phase == Phase::Ready)
            .map(|(k, s)| (s.run.history.len() - s.run.cached, *k))
            .collect();
        if ready.is_empty() {
            return Ok(());
        }
        ready.sort_unstable();
        for bucket in prefill_buckets(&ready) {
            self.prefill(bucket)?;
        }
        Ok(())
    }

    /// One ragged forward appending each episode's pending context to its row.
    fn prefill(&mut self, keys: Vec<u64>) -> Result<(), ActorError> {
        let model = self.policy.model();
        let dev = self.policy.var_store().device();
        let version = self.policy.version();
        let rows_total = self.cfg.max_concurrency.max(1);
        let cache = self
            .cache
            .get_or_insert_with(|| model.new_cache(rows_total, INITIAL_CACHE_TOKENS));
        let mut rows = Vec::with_capacity(keys.len());
        let mut new = Vec::with_capacity(keys.len());
        for key in &keys {
            let slot = self.episodes.get_mut(key).expect("ready key exists");
            // The row holds exactly the cached prefix; anything else (a fresh episode, new
            // weights) starts the row over.
            if slot.run.cached == 0 || cache.lens()[slot.row] != slot.run.cached as i64 {
                cache.reset_row(slot.row);
                slot.run.cached = 0;
            }
            rows.push(slot.row);
            new.push((slot.run.history.len() - slot.run.cached) as i64);
        }
        let t = new.iter().copied().max().unwrap_or(0);
        let k = keys.len();
        let recording = self.routes.is_some();
        let mut tokens = vec![0i64; k * t as usize];
        for (i, key) in keys.iter().enumerate() {
            let r = &self.episodes[key].run;
            for (j, &x) in r.history[r.cached..].iter().enumerate() {
                tokens[i * t as usize + j] = i64::from(x);
            }
        }
        let t0 = Instant::now();
        let mut sub = cache.select(&rows)?;
        let tokens_bt = Tensor::from_slice(&tokens)
            .view([k as i64, t])
            .to_device(dev);
        // Logits only at each row's last token: the one position sampled from.
        let (logits_kv, routes) = forward_last(model, &mut sub, &tokens_bt, &new, recording)?;
        cache.put(&rows, &sub)?;
        let flat = logits_to_vec(&logits_kv)?;
        self.stats.forward_s += t0.elapsed().as_secs_f64();
        self.stats.prefill_tokens += new.iter().sum::<i64>() as u64;
        let v = flat.len() / k;
        for (i, key) in keys.iter().enumerate() {
            let r = &mut self.episodes.get_mut(key).expect("ready key exists").run;
            if let Some(routes) = &routes {
                r.record_routes(r.cached, routes.row(i, new[i] as usize));
            }
            r.cached = r.history.len();
            draw_next(self.chooser.as_mut(), r, &flat[i * v..(i + 1) * v], version)?;
            self.stats.generated_tokens += 1;
            r.phase = Phase::Decoding;
            self.decoding.push(*key);
        }
        Ok(())
    }

    /// Stops decoding rows whose turn ended and sends their calls to the sandbox.
    fn park_finished_turns(&mut self, sink: &mut dyn TrajectorySink) -> Result<(), ActorError> {
        let stop = self.format.stop_ids();
        let (leaving, staying): (Vec<u64>, Vec<u64>) = self
            .decoding
            .iter()
            .partition(|k| self.episodes[*k].run.turn_over(&stop));
        if leaving.is_empty() {
            return Ok(());
        }
        self.decoding = staying;
        for key in leaving {
            let slot = self.episodes.get_mut(&key).expect("decoding key exists");
            if slot.run.summarizing {
                let (steps, next) = slot.run.finish_summary(&self.format);
                self.emit_steps(key, steps, sink);
                self.after_turn(key, next, sink);
                continue;
            }
            if slot.run.cut_by_context(&stop) {
                slot.run.generate_us = slot.run.turn_started.elapsed().as_micros() as u64;
                let (steps, next) = slot.run.finish_cut();
                self.emit_steps(key, steps, sink);
                self.after_turn(key, next, sink);
                continue;
            }
            match slot.run.end_generation(&self.format) {
                TurnCall::Call(call) => {
                    let call = call.clone();
                    self.dispatch(key, Job::Call(call), Phase::Tool, sink);
                }
                TurnCall::Malformed(err) => {
                    let err = err.clone();
                    slot.run.pending_call = None;
                    let (steps, next) = slot.run.finish_malformed(&self.format, &err);
                    self.emit_steps(key, steps, sink);
                    self.after_turn(key, next, sink);
                }
            }
        }
        Ok(())
    }

    /// One batched decode step: appends each decoding row's latest token and draws the next.
    /// The forward covers rows `0..=highest decoding row`; the others in that range append
    /// nothing.
    fn decode_step(&mut self) -> Result<(), ActorError> {
        if self.decoding.is_empty() {
            return Ok(());
        }
        let model: &MoePolicy = self.policy.model();
        let dev = self.policy.var_store().device();
        let version = self.policy.version();
        let cache = self
            .cache
            .as_mut()
            .ok_or_else(|| ActorError::invalid("decode cache", "missing"))?;
        let rows: Vec<usize> = self.decoding.iter().map(|k| self.episodes[k].row).collect();
        let n = rows.iter().copied().max().unwrap_or(0) + 1;
        let mut tokens = vec![0i64; n];
        let mut new = vec![0i64; n];
        for (key, &row) in self.decoding.iter().zip(&rows) {
            let r = &self.episodes[key].run;
            tokens[row] = i64::from(r.history[r.cached]);
            new[row] = 1;
        }
        let t0 = Instant::now();
        let tokens_bt = Tensor::from_slice(&tokens)
            .view([n as i64, 1])
            .to_device(dev);
        let recording = self.routes.is_some();
        let (logits, routes) = cache.with_prefix(n, 1, |c| {
            forward_last(model, c, &tokens_bt, &new, recording)
        })?;
        let idx =
            Tensor::from_slice(&rows.iter().map(|&r| r as i64).collect::<Vec<_>>()).to_device(dev);
        let flat = logits_to_vec(&logits.index_select(0, &idx))?;
        self.stats.forward_s += t0.elapsed().as_secs_f64();
        self.stats.decode_steps += 1;
        self.stats.decode_rows += rows.len() as u64;
        let v = flat.len() / rows.len();
        for (i, key) in self.decoding.iter().enumerate() {
            let r = &mut self.episodes.get_mut(key).expect("decoding key exists").run;
            if let Some(routes) = &routes {
                r.record_routes(r.cached, routes.row(rows[i], 1));
            }
            r.cached += 1;
            draw_next(self.chooser.as_mut(), r, &flat[i * v..(i + 1) * v], version)?;
            self.stats.generated_tokens += 1;
        }
        Ok(())
    }
}

/// Expert ids of one forward's appended tokens, on the host: `[B, T, L·k]` row-major.
struct ForwardRoutes {
    ids: Vec<u16>,
    t: usize,
    per_token: usize,
}

impl ForwardRoutes {
    fn new(routes_btlk: &Tensor) -> Result<Self, ActorError> {
        let (_, t, l, k) = routes_btlk.size4().map_err(ActorError::from)?;
        let flat = routes_btlk
            .to_kind(Kind::Int)
            .to_device(tch::Device::Cpu)
            .reshape([-1]);
        let ids = Vec::<i32>::try_from(&flat)
            .map_err(ActorError::from)?
            .into_iter()
            .map(|i| i as u16)
            .collect();
        Ok(Self {
            ids,
            t: t as usize,
            per_token: (l * k) as usize,
        })
    }

    /// Row `b`'s first `n` tokens' ids.
    fn row(&self, b: usize, n: usize) -> &[u16] {
        let start = b * self.t * self.per_token;
        &self.ids[start..start + n * self.per_token]
    }
}

/// [`MoePolicy::forward_ragged_last`], with the appended tokens' expert ids when `recording`.
fn forward_last(
    model: &MoePolicy,
    cache: &mut KvCache,
    tokens_bt: &Tensor,
    new: &[i64],
    recording: bool,
) -> Result<(Tensor, Option<ForwardRoutes>), ActorError> {
    if !recording {
        return Ok((model.forward_ragged_last(cache, tokens_bt, new)?, None));
    }
    let (logits, routes) = model.forward_ragged_last_routed(cache, tokens_bt, new)?;
    Ok((logits, Some(ForwardRoutes::new(&routes)?)))
}

/// Draws an episode's next token from the logits of its last position and records it
/// (id, behaviour log-prob, policy version).
fn draw_next(
    chooser: &mut dyn TokenChooser,
    r: &mut EpisodeRun,
    logits: &[f32],
    version: u64,
) -> Result<(), ActorError> {
    let choice = chooser.choose(
        ChoiceContext {
            trajectory_id: &r.spec.trajectory_id,
            turn: r.turn,
            generated: &r.generated,
            sampling: &r.spec.sampling,
            rng: &mut r.rng,
        },
        logits,
    )?;
    r.push_generated(choice.token, choice.logprob, version);
    Ok(())
}

/// Slots per row the cache starts with; it doubles as sequences grow.
const INITIAL_CACHE_TOKENS: i64 = 512;

/// Splits ready episodes, sorted by pending length, into prefill batches that waste at
/// most a third of their `[k, T]` forward on padding.
fn prefill_buckets(sorted: &[(usize, u64)]) -> Vec<Vec<u64>> {
    let mut out: Vec<Vec<u64>> = Vec::new();
    let mut real = 0usize;
    for &(n, key) in sorted {
        match out.last_mut() {
            // Sorted ascending, so `n` is the bucket's new longest row.
            Some(b) if 2 * n * (b.len() + 1) <= 3 * (real + n) => {
                b.push(key);
                real += n;
            }
            _ => {
                out.push(vec![key]);
                real = n;
            }
        }
    }
    out
}

/// Logits `[k, 1, V]` (any float kind, any device) as one flat `Vec<f32>`.
fn logits_to_vec(logits: &Tensor) -> Result<Vec<f32>, ActorError> {
    Ok(Vec::<f32>::try_from(
        logits
            .to_kind(Kind::Float)
            .to_device(tch::Device::Cpu)
            .contiguous()
            .view([-1]),
    )?)
}

/// Runs `specs` to completion with `policy` in `env` and returns every trajectory (in the
/// order they finished) and the run's counters. `chooser` defaults to [`NucleusSampler`]
/// (each episode's temperature, top-p and seed; temperature 0 is greedy).
pub fn run_episodes(
    policy: &mut LoadedPolicy,
    env: &TaskEnv,
    specs: Vec<EpisodeSpec>,
    cfg: EngineConfig,
    chooser: Option<Box<dyn TokenChooser>>,
) -> Result<(Vec<Trajectory>, RolloutStats), ActorError> {
    let mut sink = CollectSink::default();
    let stats = run_episodes_into(policy, env, specs, cfg, chooser, &mut sink)?;
    Ok((sink.finished, stats))
}

/// [`run_episodes`], handing each trajectory to `sink` as it grows instead of collecting
/// them (for example to store evaluation episodes as they run).
pub fn run_episodes_into(
    policy: &mut LoadedPolicy,
    env: &TaskEnv,
    specs: Vec<EpisodeSpec>,
    cfg: EngineConfig,
    chooser: Option<Box<dyn TokenChooser>>,
    sink: &mut dyn TrajectorySink,
) -> Result<RolloutStats, ActorError> {
    let mut engine = RolloutEngine::new(policy, env.clone(), cfg);
    if let Some(c) = chooser {
        engine = engine.with_chooser(c);
    }
    let h = engine.handle();
    for s in specs {
        h.start_episode(s)?;
    }
    h.close()?;
    engine.run(sink)
}
