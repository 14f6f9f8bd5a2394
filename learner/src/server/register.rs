//! `Register`: an actor introduces itself and gets an id and the run's settings.
//!
//! Ids are `actor-<n>-<8 hex>`: the counter orders them in logs, the random suffix keeps
//! them unique across learner restarts (the counter restarts, the suffix does not repeat).
//! The registry remembers each actor's name, host, concurrency and when it was last heard
//! from, for logs and metrics; it is not an admission list — an actor whose id the learner
//! does not know (the learner restarted) is still served.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use corvid_proto::{pb, SamplingParams};
use tonic::Status;

use crate::config::LearnerConfig;
use corvid_episode::FormatDescription;
use corvid_model::ModelConfig;

/// Longest actor name or hostname kept, bytes.
const MAX_NAME_BYTES: usize = 256;

/// The run's settings every actor receives.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSettings {
    /// Run name.
    pub run_name: String,
    /// Sampling defaults (each assignment carries its own seed).
    pub sampling: SamplingParams,
    /// Longest context the model takes, tokens.
    pub max_context: u32,
    /// How often actors poll for a newer policy, ms.
    pub policy_poll_interval_ms: u32,
    /// The policy's model config as JSON, so actors build the same model.
    pub model_config_json: String,
    /// The run's episode format, which every actor's must equal.
    pub episode_format: FormatDescription,
    /// Actors record each token's expert ids (`[rollout] record_routes` and an MoE policy).
    pub record_routes: bool,
}

impl RunSettings {
    /// The settings of a learner with `cfg` training `model` in episodes of `format`.
    pub fn new(cfg: &LearnerConfig, model: &ModelConfig, format: &FormatDescription) -> Self {
        let s = cfg.rollout.sampling;
        Self {
            run_name: cfg.run_name.clone(),
            sampling: SamplingParams {
                temperature: s.temperature,
                top_p: s.top_p,
                max_new_tokens: s.max_new_tokens,
                seed: 0,
            },
            max_context: u32::try_from(model.max_position_embeddings).unwrap_or(u32::MAX),
            policy_poll_interval_ms: cfg.rollout.policy_poll_interval_ms,
            model_config_json: serde_json::to_string(model).unwrap_or_default(),
            episode_format: format.clone(),
            record_routes: cfg.rollout.record_routes && model.n_moe_layers() > 0,
        }
    }
}

impl From<RunSettings> for pb::RunSettings {
    fn from(s: RunSettings) -> Self {
        Self {
            run_name: s.run_name,
            sampling: Some(s.sampling.into()),
            max_context: s.max_context,
            policy_poll_interval_ms: s.policy_poll_interval_ms,
            model_config_json: s.model_config_json,
            episode_format_json: serde_json::to_string(&s.episode_format).unwrap_or_default(),
            record_routes: s.record_routes,
        }
    }
}

/// What the learner knows about one actor.
#[derive(Debug, Clone)]
pub struct ActorInfo {
    /// Free-form name it gave.
    pub name: String,
    /// Its host.
    pub hostname: String,
    /// Episodes it runs at once.
    pub concurrency: u32,
    /// When it registered.
    pub registered: Instant,
    /// When it last called.
    pub last_seen: Instant,
    /// Episodes handed to it.
    pub episodes_assigned: u64,
}

/// Registered actors.
#[derive(Debug, Default)]
pub struct ActorRegistry {
    next: AtomicU64,
    actors: Mutex<BTreeMap<String, ActorInfo>>,
}

fn clip(s: String) -> String {
    if s.len() <= MAX_NAME_BYTES {
        return s;
    }
    let mut end = MAX_NAME_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

impl ActorRegistry {
    /// Registers an actor and returns its new id.
    pub fn register(&self, req: pb::RegisterRequest) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        let id = format!("actor-{n}-{}", &suffix[..8]);
        let now = Instant::now();
        let info = ActorInfo {
            name: clip(req.actor_name),
            hostname: clip(req.hostname),
            concurrency: req.concurrency,
            registered: now,
            last_seen: now,
            episodes_assigned: 0,
        };
        tracing::info!(actor = %id, name = %info.name, host = %info.hostname, concurrency = info.concurrency, "actor registered");
        self.lock().insert(id.clone(), info);
        id
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, ActorInfo>> {
        self.actors.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes a call from `id` that was handed `episodes` episodes; returns whether the id
    /// was known. An unknown id is an actor that registered before the learner restarted
    /// (calls are authenticated): it is recorded from now on, with no name or host.
    pub fn seen(&self, id: &str, episodes: u64) -> bool {
        let now = Instant::now();
        let id = clip(id.to_owned());
        let mut actors = self.lock();
        let known = actors.contains_key(&id);
        let a = actors.entry(id).or_insert_with(|| ActorInfo {
            name: String::new(),
            hostname: String::new(),
            concurrency: 0,
            registered: now,
            last_seen: now,
            episodes_assigned: 0,
        });
        a.last_seen = now;
        a.episodes_assigned += episodes;
        known
    }

    /// Registered actors.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none registered.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Actors heard from within `window`.
    pub fn active(&self, window: Duration) -> usize {
        self.lock()
            .values()
            .filter(|a| a.last_seen.elapsed() < window)
            .count()
    }

    /// A copy of every actor's record, by id.
    pub fn snapshot(&self) -> BTreeMap<String, ActorInfo> {
        self.lock().clone()
    }
}

/// The answer to `Register`.
pub(super) fn register(
    registry: &ActorRegistry,
    settings: &RunSettings,
    policy_version: u64,
    req: pb::RegisterRequest,
) -> Result<pb::RegisterResponse, Status> {
    if req.concurrency == 0 {
        return Err(Status::invalid_argument(
            "concurrency is 0; an actor runs at least one episode at a time",
        ));
    }
    let actor_id = registry.register(req);
    Ok(pb::RegisterResponse {
        actor_id,
        settings: Some(settings.clone().into()),
        policy_version,
    })
}
