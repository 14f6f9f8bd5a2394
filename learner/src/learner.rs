//! The learner process: serve, collect, train, publish, checkpoint.
//!
//! # Threads
//!
//! - The **tokio runtime** serves gRPC ([`crate::server`]) and the Prometheus endpoint;
//!   nothing on it touches a tensor.
//! - The **trainer thread** (one `std::thread`) owns the model, the optimizers and the
//!   metrics file. After each update it serialises the weights and publishes them into the
//!   [`PolicyStore`]; the handlers stream those bytes. The curriculum and the dispenser are
//!   shared behind mutexes with short critical sections.
//!
//! # The loop ([`Trainer::run`], in [`crate::trainer`])
//!
//! 1. **SFT** (if `schedule.sft` and not done): oracle demonstrations, then the result is
//!    written once to `ref/` as the frozen reference policy, and a checkpoint is taken.
//! 2. **Publish** the current weights as the current policy version (1 after SFT).
//! 3. **RL**, until stopped or `schedule.max_updates`:
//!    - read newly finished trajectories after the store cursor
//!      ([`Collector`](crate::collect::Collector)) and record each scored outcome into the
//!      curriculum;
//!    - when `rl.groups_per_update` groups are ready, form the batch (stale and unscored
//!      episodes left out and counted), seed libtorch from the learner's RNG, update;
//!    - publish the new version, mark the trajectories consumed, write one metrics line;
//!    - every `schedule.checkpoint_every` updates, write a run checkpoint.
//!
//!    Asynchronous (default): actors keep rolling with the last version while the update
//!    runs. Synchronous (`rl.sync`): the dispenser opens exactly one batch of groups per
//!    version, so every episode of an update was sampled from the version it updates.
//! 4. **Stop** (SIGTERM, ctrl-c): the trainer finishes the step it is in, writes a
//!    checkpoint and returns; then the server stops.
//!
//! `--resume` rebuilds everything from the newest checkpoint ([`crate::checkpoint`]): the
//! same weights are republished under the same version, the dispenser continues its groups,
//! the collector reloads its pending trajectories and reads on from the same cursor, and
//! the metrics file is cut back to the checkpoint's step.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use corvid_tasks::{Curriculum, TasksError};

use crate::checkpoint::{CheckpointDir, CheckpointError, Restored};
use crate::config::{ConfigError, LearnerConfig};
use crate::dispenser::group_ids::{resume_past, GroupIds};
use crate::dispenser::{DispenseError, DispenserConfig, DispenserState, TaskDispenser};
use crate::metrics::{serve_prometheus, LiveGauges};
use crate::policy_store::{PolicyStore, PublishError};
use crate::server::{serve, ActorRegistry, Admission, Control, LearnerService, RunSettings};
use crate::train::{RouterReplay, TrainError};
pub use crate::trainer::Trainer;
use corvid_model::{ModelConfig, ModelError};
use corvid_store::{StoreError, TrajectoryStore};

/// Everything that can stop a learner.
#[derive(Debug, thiserror::Error)]
pub enum LearnerError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A file operation failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The trajectory store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The run's store folder was refused.
    #[error(transparent)]
    StoreOpen(#[from] corvid_store::OpenError),
    /// A checkpoint could not be written or read.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The model failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A trainer failed.
    #[error(transparent)]
    Train(#[from] TrainError),
    /// Tasks or the curriculum failed.
    #[error(transparent)]
    Tasks(#[from] TasksError),
    /// The dispenser failed.
    #[error(transparent)]
    Dispense(#[from] DispenseError),
    /// Publishing weights failed.
    #[error("publishing the policy: {0}")]
    Publish(#[from] PublishError),
    /// The run folder does not fit the request (`--resume` without a checkpoint, a fresh
    /// start over an existing run, a checkpoint of another model).
    #[error("{0}")]
    RunDir(String),
    /// The gRPC server failed.
    #[error("gRPC server: {0}")]
    Serve(#[from] tonic::transport::Error),
    /// The SFT demonstrations could not be made.
    #[error("{0}")]
    Sft(String),
    /// Rollouts cannot go on (actors that cannot run the tasks).
    #[error("{0}")]
    Rollout(String),
    /// The trainer thread panicked.
    #[error("the trainer thread panicked: {0}")]
    Panicked(String),
}

pub(crate) fn io_err<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> LearnerError + 'a {
    move |source| LearnerError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Options that are not part of the config file.
#[derive(Debug, Clone, Copy, Default)]
pub struct LearnerOptions {
    /// Continue from the newest checkpoint.
    pub resume: bool,
}

/// The files and folders of a run.
#[derive(Debug, Clone)]
pub struct RunPaths {
    /// The run folder.
    pub run_dir: PathBuf,
    /// The sled trajectory store.
    pub store: PathBuf,
    /// Run checkpoints.
    pub ckpt: PathBuf,
    /// The frozen reference policy (SFT result).
    pub reference: PathBuf,
    /// The metrics JSONL file.
    pub metrics: PathBuf,
    /// The resolved config, as the run used it.
    pub config: PathBuf,
    /// The shared token, and whether it may be created.
    pub token: (PathBuf, bool),
    /// `[model] hf`: the run's copy of the Hugging Face files it started from (config,
    /// tokenizer), which every policy folder it writes carries.
    pub hf_origin: Option<PathBuf>,
}

impl RunPaths {
    /// The paths of `cfg`'s run.
    pub fn new(cfg: &LearnerConfig) -> Self {
        let run_dir = cfg.run_dir();
        Self {
            store: run_dir.join("store"),
            ckpt: run_dir.join("ckpt"),
            reference: run_dir.join("ref"),
            metrics: cfg.metrics_path(),
            config: run_dir.join("config.toml"),
            token: cfg.token_path(),
            hf_origin: cfg
                .model
                .hf
                .as_ref()
                .map(|_| run_dir.join(corvid_model::arch::ORIGIN_DIR)),
            run_dir,
        }
    }
}

/// Reads the token file; creates it with a random token (mode 0600) when `may_create` and
/// it does not exist.
pub fn load_or_create_token(path: &Path, may_create: bool) -> Result<String, LearnerError> {
    if may_create && !path.exists() {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
        }
        let token = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        let mut f = opts
            .open(path)
            .map_err(io_err("creating the token file", path))?;
        std::io::Write::write_all(&mut f, format!("{token}\n").as_bytes())
            .map_err(io_err("writing the token file", path))?;
        tracing::info!(path = %path.display(), "created a new shared token");
    }
    corvid_proto::auth::read_token_file(path).map_err(io_err("reading the token file", path))
}

/// What the server and the trainer share.
#[derive(Debug, Clone)]
pub struct Shared {
    /// The trajectory store.
    pub store: Arc<TrajectoryStore>,
    /// Settings, dispenser, policies, actors.
    pub control: Arc<Control>,
}

impl Shared {
    /// The curriculum (shared with the dispenser).
    pub fn curriculum(&self) -> &Arc<Mutex<Curriculum>> {
        self.control.dispenser.curriculum()
    }
}

/// A run opened and ready to serve and train.
#[derive(Debug)]
pub struct Prepared {
    /// The config.
    pub cfg: LearnerConfig,
    /// The paths.
    pub paths: RunPaths,
    /// The policy's config.
    pub model_config: ModelConfig,
    /// Store and control plane.
    pub shared: Shared,
    /// The checkpoint resumed from.
    pub restored: Option<Restored>,
    /// The shared token.
    pub token: String,
}

/// Whether the run folder of `cfg` holds a run checkpoint, the one `--resume` continues from.
pub fn has_checkpoint(cfg: &LearnerConfig) -> Result<bool, LearnerError> {
    let paths = RunPaths::new(cfg);
    if !paths.ckpt.exists() {
        return Ok(false);
    }
    let ckpt = CheckpointDir::open(&paths.ckpt, cfg.schedule.keep_checkpoints)?;
    Ok(ckpt.latest()?.is_some())
}

/// Opens the run folder: checks it against `resume`, reads the checkpoint, opens the store,
/// and builds the curriculum, dispenser and policy store.
///
/// A process that is restarted in place (a Kubernetes pod) asks [`has_checkpoint`] first
/// and resumes exactly when it is true.
pub fn prepare(cfg: LearnerConfig, resume: bool) -> Result<Prepared, LearnerError> {
    cfg.validate()?;
    let paths = RunPaths::new(&cfg);
    std::fs::create_dir_all(&paths.run_dir).map_err(io_err("creating", &paths.run_dir))?;
    let ckpt = CheckpointDir::open(&paths.ckpt, cfg.schedule.keep_checkpoints)?;
    let latest = ckpt.latest()?;
    let model_config = cfg.model.resolve()?;
    let families = cfg.family_levels()?;
    let restored = match (resume, latest) {
        (true, None) => {
            return Err(LearnerError::RunDir(format!(
                "--resume: no checkpoint in {}; start without --resume",
                paths.ckpt.display()
            )))
        }
        (false, Some(p)) => {
            return Err(LearnerError::RunDir(format!(
                "{} already holds run checkpoints (newest {}); pass --resume to continue it, or choose another --run-dir",
                paths.run_dir.display(),
                p.display()
            )))
        }
        (true, Some(p)) => {
            let r = CheckpointDir::load(&p)?;
            // A checkpoint records the RoPE scaling of its context stage; the trainer puts the
            // policy back under it from the saved curriculum.
            let base = match cfg.rollout.context.stage_rope {
                crate::config::StageRope::None => r.model_config.clone(),
                _ => ModelConfig {
                    rope_scaling: model_config.rope_scaling,
                    ..r.model_config.clone()
                },
            };
            if base != model_config {
                return Err(LearnerError::RunDir(format!(
                    "the checkpoint {} holds a different model config than [model] in the config file ({}); resume with the run's own config ({})",
                    p.display(),
                    model_differences(&r.model_config, &model_config),
                    paths.config.display()
                )));
            }
            // The curriculum resumes as saved; a config that now sets other levels would be
            // ignored without a word, so it is refused.
            for (name, max) in &families {
                let saved = r.curriculum.progress(name).map(|f| f.max_level).ok();
                if saved != Some(*max) {
                    return Err(LearnerError::RunDir(format!(
                        "the checkpoint {} has a curriculum with {}, the config's [tasks] \
                         gives {name} levels 1..={max}; resume with the run's own config ({}) \
                         or start another --run-dir",
                        p.display(),
                        saved.map_or(format!("no {name}"), |l| format!("{name} up to level {l}")),
                        paths.config.display()
                    )));
                }
            }
            Some(r)
        }
        (false, None) => None,
    };
    std::fs::write(&paths.config, cfg.to_toml()).map_err(io_err("writing", &paths.config))?;
    let token = load_or_create_token(&paths.token.0, paths.token.1)?;
    // A resumed run reads the store its checkpoint counts; a missing one is refused, not
    // made anew.
    let store = Arc::new(match restored {
        Some(_) => corvid_store::open_existing(&paths.store)?,
        None => corvid_store::open_or_create(&paths.store)?,
    });
    if restored.is_none() && store.finished_since(0).next().is_some() {
        // Trajectories without a checkpoint: a fresh policy would train on another
        // policy's episodes as if they were its own.
        return Err(LearnerError::RunDir(format!(
            "{} holds trajectories but no run checkpoint; start the run in another --run-dir",
            paths.store.display()
        )));
    }

    let (curriculum, dispenser_state) = match &restored {
        Some(r) => {
            // Progress resumes as saved; the thresholds, shares and windows are the config
            // file's, as every other setting is, so an edited config is never silently
            // ignored on resume (the log line below says when they differ).
            let mut c = r.curriculum.clone();
            if c.reconfigure(cfg.curriculum.clone())? {
                tracing::info!(
                    "curriculum settings from the config file replace the checkpoint's: {:?}",
                    cfg.curriculum
                );
            }
            (c, r.state.dispenser.clone())
        }
        None => {
            let names: Vec<(&str, u32)> = families.iter().map(|(n, l)| (n.as_str(), *l)).collect();
            let mut d = DispenserState::new(cfg.seed);
            if cfg.rl.sync {
                // Synchronous: no group opens before the trainer grants the first batch.
                d.budget = Some(0);
            }
            (
                Curriculum::new(cfg.curriculum.clone(), &names, cfg.seed)?,
                d,
            )
        }
    };
    // Rule 7 of the dispenser: a learner killed after its last checkpoint may have handed
    // out groups that checkpoint never saw; the next group starts past all of them.
    let group_ids = GroupIds::open(&paths.run_dir).map_err(DispenseError::from)?;
    let mut dispenser_state = dispenser_state;
    if let Some(was) = resume_past(&mut dispenser_state, &group_ids) {
        tracing::warn!(
            checkpoint_next = format_args!("g{was:08}"),
            next = format_args!("g{:08}", dispenser_state.next_group),
            "groups may have been handed out after the last checkpoint (the learner did not stop cleanly); new groups start past them, with fresh draws"
        );
    }
    let registry = cfg.families()?;
    let family_objs = families
        .iter()
        .map(|(name, _)| registry.get(name))
        .collect::<Result<Vec<_>, _>>()?;
    let max_context = u32::try_from(model_config.max_position_embeddings).unwrap_or(u32::MAX);
    if cfg.rollout.context.window_tokens > max_context {
        return Err(ConfigError::Invalid {
            field: "rollout.context.window_tokens".into(),
            value: cfg.rollout.context.window_tokens.to_string(),
            why: format!("expected at most the model's {max_context} positions"),
        }
        .into());
    }
    let dispenser = TaskDispenser::new(
        DispenserConfig::from_learner(&cfg, max_context),
        family_objs,
        Arc::new(Mutex::new(curriculum)),
        dispenser_state,
    )?
    .with_group_ids(group_ids);
    if let Some(r) = &restored {
        // Trajectories stored after the checkpoint complete their episodes again (rule 4),
        // so none of them is handed out a second time and no group waits out its timeout
        // for an episode it already has.
        for item in store.finished_since(r.state.read_cursor) {
            let (_, rec) = item?;
            let h = &rec.header;
            dispenser.complete(&h.group_id, &h.actor_id, h.sampling.seed);
        }
    }
    let format = cfg.episode_format()?;
    for note in format.chat_format().map(|c| c.notes()).unwrap_or_default() {
        tracing::warn!("{note}");
    }
    let control = Arc::new(Control {
        settings: RunSettings::new(&cfg, &model_config, &format.description()),
        dispenser: Arc::new(dispenser),
        policies: Arc::new(PolicyStore::new(cfg.rollout.keep_policy_versions)),
        actors: Arc::new(ActorRegistry::default()),
    });
    Ok(Prepared {
        cfg,
        paths,
        model_config,
        shared: Shared { store, control },
        restored,
        token,
    })
}

/// Why a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// SIGTERM, ctrl-c or a caller's stop flag.
    Signal,
    /// `schedule.max_updates` reached.
    MaxUpdates,
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StopReason::Signal => "stop requested",
            StopReason::MaxUpdates => "update budget reached",
        })
    }
}

/// How a run ended.
#[derive(Debug, Clone)]
pub struct Summary {
    /// Why.
    pub stopped_by: StopReason,
    /// RL updates done.
    pub rl_step: u64,
    /// Latest policy version.
    pub policy_version: u64,
    /// The checkpoint written at the end.
    pub checkpoint: Option<PathBuf>,
}

/// Resolves on ctrl-c or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => tracing::info!("ctrl-c: writing a checkpoint, then stopping"),
        _ = term => tracing::info!("SIGTERM: writing a checkpoint, then stopping"),
    }
}

/// Runs a learner until `shutdown` resolves (then checkpoints) or the update budget is
/// spent: serves gRPC and Prometheus on the current tokio runtime and trains on a
/// dedicated thread.
pub async fn run(
    cfg: LearnerConfig,
    opts: LearnerOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<Summary, LearnerError> {
    let resume = opts.resume;
    // The address first: a port another learner holds is refused before a run folder is
    // made or a store opened.
    let addr = cfg.listen_addr()?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(io_err("binding the gRPC address", Path::new(&cfg.listen)))?;
    // The Prometheus address too: a scrape of an address another learner holds would answer
    // with that run's figures.
    let metrics_listener = match cfg.metrics.prometheus.as_str() {
        "" => None,
        text => {
            let addr: std::net::SocketAddr = text
                .parse()
                .map_err(|_| LearnerError::RunDir(format!("metrics.prometheus = {text:?}")))?;
            let listener = tokio::net::TcpListener::bind(addr).await.map_err(io_err(
                "binding the Prometheus address (another learner may hold it: give this one \
                 --prometheus ADDR, or --prometheus \"\" to turn it off)",
                Path::new(text),
            ))?;
            Some(listener)
        }
    };
    let prepared = tokio::task::spawn_blocking(move || prepare(cfg, resume))
        .await
        .map_err(|e| LearnerError::Panicked(e.to_string()))??;
    let Prepared {
        cfg,
        paths,
        model_config,
        shared,
        restored,
        token,
    } = prepared;
    tracing::info!(
        run = %cfg.run_name,
        run_dir = %paths.run_dir.display(),
        "resolved learner config:\n{}",
        cfg.to_toml()
    );

    tracing::info!(addr = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), token_file = %paths.token.0.display(), "serving corvid.v1.Learner");
    let (server_stop, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let admission = admission(&cfg, &model_config);
    tracing::info!(
        record_routes = admission.routes.is_some() && cfg.rollout.record_routes,
        router_replay = ?cfg.rl.router_replay,
        "actors {} each token's expert ids",
        if admission.routes.is_some() && cfg.rollout.record_routes { "record" } else { "do not record" }
    );
    let service = LearnerService::new(Arc::clone(&shared.store))
        .with_control(Arc::clone(&shared.control))
        .with_admission(admission);
    let health = service.health();
    let mut server = tokio::spawn(serve(listener, service, token, async {
        let _ = server_stopped.await;
    }));

    // The trainer thread: builds the model and trains; the record handle comes back first
    // so the Prometheus endpoint can serve it.
    let stop = Arc::new(AtomicBool::new(false));
    let (latest_tx, latest_rx) = tokio::sync::oneshot::channel();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    {
        let stop = Arc::clone(&stop);
        let shared = shared.clone();
        let cfg = cfg.clone();
        std::thread::Builder::new()
            .name("corvid-trainer".into())
            .spawn(move || {
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let trainer = Trainer::new(cfg, paths, model_config, shared, restored)?;
                    let _ = latest_tx.send(trainer.latest_record());
                    trainer.run(&stop)
                }))
                .unwrap_or_else(|p| {
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    Err(LearnerError::Panicked(msg))
                });
                let _ = done_tx.send(result);
            })
            .map_err(io_err("starting the trainer thread", Path::new("")))?;
    }

    let (metrics_stop, metrics_stopped) = tokio::sync::oneshot::channel::<()>();
    let mut metrics_task = None;
    if let Some(l) = metrics_listener {
        if let Ok(latest) = latest_rx.await {
            tracing::info!(addr = %cfg.metrics.prometheus, "serving Prometheus metrics at /metrics");
            let s = shared.clone();
            let live: LiveGauges = Arc::new(move || live_gauges(&s));
            metrics_task = Some(tokio::spawn(serve_prometheus(l, latest, live, async {
                let _ = metrics_stopped.await;
            })));
        }
    }

    tokio::pin!(shutdown);
    tokio::pin!(done_rx);
    let result = tokio::select! {
        r = &mut done_rx => r,
        _ = &mut shutdown => {
            stop.store(true, Ordering::Relaxed);
            // Probes and actors see the stop while the trainer writes its checkpoint.
            health.stopping().await;
            (&mut done_rx).await
        }
        r = &mut server => {
            // The server ended on its own: an error. Stop the trainer cleanly first.
            stop.store(true, Ordering::Relaxed);
            let trained = (&mut done_rx).await;
            return match r {
                Ok(Err(e)) => Err(LearnerError::Serve(e)),
                Ok(Ok(())) => trained.map_err(|e| LearnerError::Panicked(e.to_string()))?,
                Err(e) => Err(LearnerError::Panicked(e.to_string())),
            };
        }
    };
    let _ = server_stop.send(());
    let _ = metrics_stop.send(());
    if let Ok(Err(e)) = server.await {
        tracing::error!(error = %e, "gRPC server ended with an error");
    }
    if let Some(t) = metrics_task {
        let _ = t.await;
    }
    result.map_err(|e| LearnerError::Panicked(e.to_string()))?
}

/// What the policy of `model` takes at submit under `cfg`.
fn admission(cfg: &LearnerConfig, model: &ModelConfig) -> Admission {
    let routes = corvid_proto::RouteShape::of_moe(
        model.n_moe_layers(),
        model.num_experts_per_tok,
        model.n_routed_experts,
    );
    Admission {
        vocab_size: u32::try_from(model.vocab_size).unwrap_or(u32::MAX),
        require_routes: routes.is_some()
            && cfg.rollout.record_routes
            && cfg.rl.router_replay == RouterReplay::Rollout,
        routes,
    }
}

/// The fields in which two model configs differ, as `field: checkpoint X, config Y`.
pub(crate) fn model_differences(checkpoint: &ModelConfig, config: &ModelConfig) -> String {
    let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) = (
        serde_json::to_value(checkpoint),
        serde_json::to_value(config),
    ) else {
        return "the configs do not serialize".into();
    };
    let null = serde_json::Value::Null;
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .filter_map(|k| {
            let (x, y) = (a.get(k).unwrap_or(&null), b.get(k).unwrap_or(&null));
            (x != y).then(|| format!("{k}: checkpoint {x}, config {y}"))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Service gauges read at request time.
fn live_gauges(s: &Shared) -> Vec<(String, f64)> {
    let d = s.control.dispenser.counters();
    vec![
        (
            "actors_registered".to_owned(),
            s.control.actors.len() as f64,
        ),
        ("actors_active".to_owned(), s.control.actors_active() as f64),
        (
            "groups_open".to_owned(),
            s.control.dispenser.open_groups() as f64,
        ),
        (
            "groups_waiting".to_owned(),
            s.control.dispenser.waiting() as f64,
        ),
        ("groups_opened_total".to_owned(), d.groups_opened as f64),
        (
            "groups_completed_total".to_owned(),
            d.groups_completed as f64,
        ),
        ("groups_expired_total".to_owned(), d.groups_expired as f64),
        ("episodes_issued_total".to_owned(), d.episodes_issued as f64),
        (
            "episodes_reclaimed_total".to_owned(),
            d.episodes_reclaimed as f64,
        ),
        (
            "instances_refused_total".to_owned(),
            d.instances_refused as f64,
        ),
        (
            "policy_version_published".to_owned(),
            s.control.policies.latest_version() as f64,
        ),
    ]
}
