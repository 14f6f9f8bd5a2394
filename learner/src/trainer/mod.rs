//! The trainer thread's side of the learner: the policy in its current stage (SFT, then
//! RL), the store reader, the metrics file and the run checkpoints.
//!
//! - This file: [`Trainer`], built fresh or from a checkpoint, its run loop, checkpoints
//!   and the publishing of weights.
//! - `sft_stage.rs`: the SFT stage ([`SftRun`], [`Trainer::sft_step`],
//!   [`Trainer::finish_sft`]) and the handover of its weights to RL.
//! - `rl_stage.rs`: the RL stage, one update at a time ([`Trainer::try_update`]), with the
//!   PPO-ptx demonstrations and the batches that make no update.
//! - `record.rs`: the metrics record of an update and the curriculum and service figures
//!   in it.
//!
//! Exact resume: everything the next update reads — weights, optimizer moments and step,
//! the pending trajectories and the cursor, the curriculum and the dispenser (and their
//! RNGs), the learner's RNG, the spike window — is in the checkpoint; the SFT example stream
//! is a pure function of the step ([`crate::sft_data`]).

mod record;
mod rl_stage;
mod sft_stage;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use corvid_tasks::SplitMix64;
use tch::nn;

use crate::checkpoint::{
    write_policy, CheckpointDir, Restored, RunState, Snapshot, Stage, Totals, STATE_FORMAT,
};
use crate::collect::Collector;
use crate::config::{ConfigError, LearnerConfig, StageRope};
use crate::dispenser::DispenserState;
use crate::learner::{io_err, LearnerError, RunPaths, Shared, StopReason, Summary};
use crate::metrics::{MetricsSink, SpikeDetector, UpdateRecord};
use crate::sft_data::SftData;
use crate::train::sft::SftTrainer;
use crate::train::{RlTrainer, TrainState};
use corvid_model::checkpoint::{policy_to_bytes, WEIGHTS_FILE};
use corvid_model::precision::weight_kind_for;
use corvid_model::{ModelConfig, MoePolicy};
use corvid_store::now_unix_ms;

pub use rl_stage::MAX_UNSCORED_BATCHES_IN_A_ROW;
pub use sft_stage::{SftRecord, SftRun, SFT_METRICS_FILE};

/// The optimizer's state tensors, as a checkpoint saves them.
type OptimizerState = Vec<(String, tch::Tensor)>;

/// The trainer of the current stage. It owns the `VarStore`, the model and the optimizer;
/// the SFT trainer hands them to the RL one.
enum ActiveTrainer {
    /// Supervised fine-tuning.
    Sft(Box<SftTrainer>),
    /// Policy optimisation.
    Rl(Box<RlTrainer>),
}

impl ActiveTrainer {
    /// The trainer of `state.stage` over `(vs, model)`, its optimizer restored from
    /// `optimizer` when the run resumes.
    fn for_stage(
        cfg: &LearnerConfig,
        model_cfg: &ModelConfig,
        (vs, model): (nn::VarStore, MoePolicy),
        state: &RunState,
        optimizer: Option<OptimizerState>,
    ) -> Result<Self, LearnerError> {
        let mut active = match state.stage {
            Stage::Sft => Self::Sft(Box::new(Trainer::sft_trainer(cfg, vs, model, state)?)),
            Stage::Rl => Self::Rl(Box::new(Trainer::rl_trainer(
                cfg, model_cfg, vs, model, state,
            )?)),
        };
        if let Some(opt) = &optimizer {
            active.state_mut().opt.load_state(opt)?;
        }
        Ok(active)
    }

    fn state(&self) -> &TrainState {
        match self {
            Self::Sft(t) => t.state(),
            Self::Rl(t) => t.state(),
        }
    }

    fn state_mut(&mut self) -> &mut TrainState {
        match self {
            Self::Sft(t) => t.state_mut(),
            Self::Rl(t) => t.state_mut(),
        }
    }
}

/// The trainer: owns the policy and everything that changes with an update.
pub struct Trainer {
    cfg: LearnerConfig,
    paths: RunPaths,
    shared: Shared,
    ckpt: CheckpointDir,
    model_cfg: ModelConfig,
    /// `None` only transiently, while SFT hands the policy to RL.
    active: Option<ActiveTrainer>,
    state: RunState,
    collector: Collector,
    metrics: MetricsSink,
    published: bool,
    /// Start time and episode count of the last few RL updates, for a windowed episodes/s
    /// (updates trained back to back from a backlog would otherwise read as bursts).
    recent_updates: std::collections::VecDeque<(Instant, usize)>,
    /// Batches skipped since the last update (none of their episodes scored).
    skipped_in_a_row: u32,
    /// The demonstration stream of the PPO-ptx term, made at its first use.
    ptx_data: Option<SftData>,
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

/// Builds a model on `device` with initial weights fixed by `seed`, stored in `kind` with
/// the routers in fp32 ([`MoePolicy::new_in_kind`]). The trainer passes
/// [`weight_kind_for`]`(device)`: bf16 on CUDA (the optimizer then keeps fp32 master
/// weights, [`crate::train::optim`]), fp32 elsewhere.
pub fn build_model(
    cfg: &ModelConfig,
    device: tch::Device,
    kind: tch::Kind,
    seed: u64,
) -> Result<(nn::VarStore, MoePolicy), LearnerError> {
    tch::manual_seed(seed as i64);
    let vs = nn::VarStore::new(device);
    let model = MoePolicy::new_in_kind(&vs, cfg, kind)?;
    Ok((vs, model))
}

/// Replaces the random initialisation in `vs` with the weights of the policy folder `dir`
/// (`[model] init`), whose `config.json` must equal `model_cfg`.
fn load_init(dir: &Path, model_cfg: &ModelConfig, vs: &nn::VarStore) -> Result<(), LearnerError> {
    let init_cfg = corvid_model::checkpoint::load_config(dir).map_err(|e| {
        LearnerError::RunDir(format!(
            "[model] init = {:?} is not a policy folder (config.json and {WEIGHTS_FILE}, e.g. runs/demo/ref): {e}",
            dir.display().to_string()
        ))
    })?;
    if &init_cfg != model_cfg {
        return Err(LearnerError::RunDir(format!(
            "model.init {} holds a different model config than [model] in the config file ({})",
            dir.display(),
            crate::learner::model_differences(&init_cfg, model_cfg)
        )));
    }
    corvid_model::checkpoint::load_weights(vs, dir)?;
    Ok(())
}

/// Replaces the initialisation in `vs` (a model of `model_cfg`: the folder's config with the
/// run's overrides) with the weights of the Hugging Face folder `dir` (`[model] hf`).
fn load_hf(dir: &Path, model_cfg: &ModelConfig, vs: &nn::VarStore) -> Result<(), LearnerError> {
    let mut hf = corvid_model::arch::read_config(dir)?;
    hf.model = model_cfg.clone();
    let report = corvid_model::arch::load_weights(vs, dir, &hf)?;
    tracing::info!(
        hf = %dir.display(),
        family = hf.family.model_type(),
        tensors = report.tensors_read,
        fp8_dequantised = report.fp8_dequantised,
        skipped = report.skipped.len(),
        "Hugging Face weights loaded"
    );
    Ok(())
}

/// The state of a fresh run: step 0 of the schedule's first stage, the learner's RNG from
/// `cfg.seed`, the dispenser as it was built.
fn fresh_state(cfg: &LearnerConfig, dispenser: DispenserState) -> RunState {
    let m = &cfg.metrics;
    RunState {
        format: STATE_FORMAT,
        seq: 0,
        stage: if cfg.schedule.sft {
            Stage::Sft
        } else {
            Stage::Rl
        },
        sft_step: 0,
        sft_tokens: 0,
        sft_heldout_loss: None,
        rl_step: 0,
        policy_version: 0,
        read_cursor: 0,
        pending: Vec::new(),
        taken_groups: Vec::new(),
        rng: SplitMix64::derive(cfg.seed, "learner"),
        dispenser,
        spikes: SpikeDetector::new(m.spike_k, m.spike_window, m.spike_min_samples),
        totals: Totals::default(),
        reference_policy: None,
        saved_unix_ms: 0,
    }
}

/// Takes the weights of checkpoint `r` into `vs` and cuts the metrics file back to its
/// step; its state and optimizer state to continue from.
fn resumed_state(
    r: Restored,
    vs: &nn::VarStore,
    metrics: &Path,
) -> Result<(RunState, OptimizerState), LearnerError> {
    r.load_weights(vs)?;
    let dropped = MetricsSink::truncate_after(metrics, r.state.rl_step)
        .map_err(io_err("cutting back", metrics))?;
    tracing::info!(
        checkpoint = %r.dir.display(),
        stage = ?r.state.stage,
        sft_step = r.state.sft_step,
        rl_step = r.state.rl_step,
        policy_version = r.state.policy_version,
        cursor = r.state.read_cursor,
        pending = r.state.pending.len(),
        metrics_lines_dropped = dropped,
        "resuming"
    );
    Ok((r.state, r.optimizer))
}

/// The collector at `state`'s cursor, holding again the trajectories read but not yet
/// trained on and the groups already taken. Every pending trajectory must be in the store.
fn restored_collector(
    cfg: &LearnerConfig,
    shared: &Shared,
    state: &RunState,
) -> Result<Collector, LearnerError> {
    let mut collector = Collector::new(
        cfg.rl.group_size,
        Duration::from_secs(cfg.rollout.group_timeout_s),
        state.read_cursor,
    );
    let missing = collector.restore_pending(&shared.store, &state.pending)?;
    collector.restore_taken(state.taken_groups.clone());
    if !missing.is_empty() {
        return Err(LearnerError::RunDir(format!(
            "the checkpoint lists {} pending trajectories the store does not hold (first: {}); is this the run's own store?",
            missing.len(),
            missing[0]
        )));
    }
    Ok(collector)
}

impl Trainer {
    /// Builds the policy (on the calling thread, which must be the one that trains) and the
    /// trainer's state, fresh or from `restored`.
    pub fn new(
        cfg: LearnerConfig,
        paths: RunPaths,
        model_cfg: ModelConfig,
        shared: Shared,
        restored: Option<Restored>,
    ) -> Result<Self, LearnerError> {
        if cfg.threads > 0 {
            tch::set_num_threads(cfg.threads as i32);
        }
        let device = cfg.torch_device()?;
        let ckpt = CheckpointDir::open(&paths.ckpt, cfg.schedule.keep_checkpoints)?;
        let kind = weight_kind_for(device);
        let (vs, model) = match &cfg.model.hf {
            // Every weight comes from the checkpoint or the Hugging Face folder.
            Some(_) => corvid_model::layers::without_init(|| {
                build_model(&model_cfg, device, kind, cfg.seed)
            })?,
            None => build_model(&model_cfg, device, kind, cfg.seed)?,
        };
        if let (Some(src), Some(origin)) = (&cfg.model.hf, &paths.hf_origin) {
            if restored.is_none() || !origin.exists() {
                corvid_model::arch::copy_origin(src, origin)?;
                write_template_kwargs(&cfg, origin)?;
            } else {
                same_tokenizer_files(src, origin)?;
                same_template_kwargs(&cfg, src, origin)?;
            }
        }
        tracing::info!(?device, weights = ?kind, routers = "Float", "policy built");
        // A checkpoint's version runs under the RoPE scaling it was published with, which its
        // `config.json` records, whatever stage the curriculum has reached since.
        let restored_rope = restored.as_ref().map(|r| r.model_config.rope_scaling);
        let (mut state, optimizer) = match restored {
            Some(r) => {
                let (state, optimizer) = resumed_state(r, &vs, &paths.metrics)?;
                (state, Some(optimizer))
            }
            None => {
                if let Some(dir) = &cfg.model.init {
                    load_init(dir, &model_cfg, &vs)?;
                    tracing::info!(init = %dir.display(), "initial weights loaded");
                }
                if let Some(dir) = &cfg.model.hf {
                    load_hf(dir, &model_cfg, &vs)?;
                }
                (fresh_state(&cfg, shared.control.dispenser.state()), None)
            }
        };
        // RL without SFT before it: the starting weights are the KL reference.
        if state.stage == Stage::Rl && state.reference_policy.is_none() {
            write_policy(
                &paths.reference,
                &vs,
                &model_cfg,
                paths.hf_origin.as_deref(),
            )?;
            state.reference_policy = Some(paths.reference.clone());
        }
        let mut active =
            ActiveTrainer::for_stage(&cfg, &model_cfg, (vs, model), &state, optimizer)?;
        if let (Some(rope), ActiveTrainer::Rl(rl)) = (restored_rope, &mut active) {
            if rope != model_cfg.rope_scaling {
                rl.set_rope(rope)?;
            }
        }
        let collector = restored_collector(&cfg, &shared, &state)?;
        let metrics =
            MetricsSink::open(&paths.metrics).map_err(io_err("opening", &paths.metrics))?;
        Ok(Self {
            cfg,
            paths,
            shared,
            ckpt,
            model_cfg,
            active: Some(active),
            state,
            collector,
            metrics,
            published: false,
            recent_updates: std::collections::VecDeque::from([(Instant::now(), 0)]),
            skipped_in_a_row: 0,
            ptx_data: None,
        })
    }

    fn active(&self) -> &ActiveTrainer {
        // Only `sft_to_rl` takes the trainer out, and it always puts one back.
        self.active
            .as_ref()
            .expect("the trainer always holds a stage's trainer")
    }

    /// The learner's state as it would be checkpointed now.
    pub fn state(&self) -> RunState {
        let mut s = self.state.clone();
        s.read_cursor = self.collector.read_cursor();
        s.pending = self.collector.pending_ids();
        s.taken_groups = self.collector.taken_groups();
        s.dispenser = self.shared.control.dispenser.state();
        if let Some(ActiveTrainer::Sft(t)) = &self.active {
            s.sft_tokens = t.tokens_seen();
            s.sft_heldout_loss = t.heldout_loss();
        }
        s
    }

    /// The current weights as safetensors bytes, naming the RoPE scaling they run under when
    /// a context stage scales it ([`policy_to_bytes`]).
    pub fn weights(&self) -> Result<Vec<u8>, LearnerError> {
        let state = self.active().state();
        Ok(policy_to_bytes(
            &state.vs,
            &state.model.config().rope_scaling,
        )?)
    }

    /// The model config the policy runs under now: the run's, with the RoPE scaling of the
    /// current context stage (what a checkpoint's `config.json` records, so that evaluating
    /// or exporting it decodes as the learner trained it).
    fn live_model_config(&self) -> ModelConfig {
        ModelConfig {
            rope_scaling: self.active().state().model.config().rope_scaling,
            ..self.model_cfg.clone()
        }
    }

    /// Puts the RL policy (and its KL reference) under the RoPE scaling of the curriculum's
    /// current context stage (`[rollout.context] stage_rope`), saying so when it changes:
    /// before a new version is published, which is then trained under it until the next.
    fn follow_stage_rope(&mut self) -> Result<(), LearnerError> {
        let stage = self
            .shared
            .curriculum()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .context_tokens();
        let rope = match self.cfg.rollout.context.stage_rope {
            StageRope::None => return Ok(()),
            _ => self.cfg.stage_rope_scaling(stage),
        };
        let Some(ActiveTrainer::Rl(rl)) = self.active.as_mut() else {
            return Ok(());
        };
        if rl.state().model.config().rope_scaling != rope {
            rl.set_rope(rope)?;
            tracing::info!(
                stage_tokens = stage,
                ?rope,
                "the policy follows its context stage's RoPE scaling"
            );
        }
        Ok(())
    }

    /// The curriculum as JSON.
    pub fn curriculum_json(&self) -> String {
        self.shared
            .curriculum()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .save()
    }

    /// The latest record shared with the Prometheus endpoint.
    pub fn latest_record(&self) -> Arc<std::sync::RwLock<Option<UpdateRecord>>> {
        self.metrics.latest()
    }

    /// Writes a run checkpoint now.
    pub fn checkpoint(&mut self) -> Result<PathBuf, LearnerError> {
        let mut state = self.state();
        state.saved_unix_ms = now_unix_ms();
        let curriculum = self
            .shared
            .curriculum()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let active = self.active();
        let model_config = self.live_model_config();
        let saved = self.ckpt.save(Snapshot {
            vs: &active.state().vs,
            model_config: &model_config,
            optimizer: active.state().opt.state_tensors(),
            curriculum: &curriculum,
            state,
            hf_origin: self.paths.hf_origin.as_deref(),
        })?;
        // The checkpoint holds the group counter now: the id reservation can shrink to it.
        self.shared.control.dispenser.trim_group_ids();
        Ok(saved)
    }

    /// Publishes the current weights as the current policy version, under the RoPE scaling
    /// the policy runs under (the blob names it, so actors decode it so). A new version
    /// takes its context stage's first ([`Self::follow_stage_rope`]); a version published
    /// again (on resume) keeps the one it had.
    fn publish(&mut self) -> Result<(), LearnerError> {
        let bytes = self.weights()?;
        let blob = self
            .shared
            .control
            .policies
            .publish(self.state.policy_version, bytes)?;
        self.published = true;
        tracing::info!(version = blob.version, bytes = blob.bytes.len(), sha256 = %blob.sha256, "policy published");
        Ok(())
    }

    /// Runs SFT (if due) and RL until `stop` is set or the update budget is spent, then
    /// writes a checkpoint.
    pub fn run(mut self, stop: &AtomicBool) -> Result<Summary, LearnerError> {
        let done = |t: &mut Self, why: StopReason| -> Result<Summary, LearnerError> {
            let ck = t.checkpoint()?;
            Ok(Summary {
                stopped_by: why,
                rl_step: t.state.rl_step,
                policy_version: t.state.policy_version,
                checkpoint: Some(ck),
            })
        };
        if matches!(self.active, Some(ActiveTrainer::Sft(_))) {
            if !self.sft(stop)? {
                return done(&mut self, StopReason::Signal);
            }
            self.checkpoint()?;
        }
        self.enter_rl()?;
        let poll = Duration::from_millis(self.cfg.schedule.poll_ms.max(1));
        loop {
            if stop.load(Ordering::Relaxed) {
                return done(&mut self, StopReason::Signal);
            }
            let max = self.cfg.schedule.max_updates;
            if max > 0 && self.state.rl_step >= max {
                return done(&mut self, StopReason::MaxUpdates);
            }
            self.poll()?;
            if stop.load(Ordering::Relaxed) {
                // Reading the store can take a while under load: no update starts after a stop.
                return done(&mut self, StopReason::Signal);
            }
            match self.try_update()? {
                Some(_)
                    if self
                        .state
                        .rl_step
                        .is_multiple_of(self.cfg.schedule.checkpoint_every) =>
                {
                    self.checkpoint()?;
                }
                Some(_) => {}
                None => std::thread::sleep(poll),
            }
        }
    }
}

/// The template keywords of a folder's `chat_template_kwargs.json` (none without one).
fn folder_kwargs(dir: &Path) -> Result<serde_json::Map<String, serde_json::Value>, LearnerError> {
    corvid_episode::read_template_kwargs(dir).map_err(|e| {
        LearnerError::Config(ConfigError::Section {
            section: "model",
            message: e.to_string(),
        })
    })
}

/// A resumed run renders with the template keywords it started with (its `hf/` copy): the
/// stored episodes were laid out with them.
fn same_template_kwargs(
    cfg: &LearnerConfig,
    src: &Path,
    origin: &Path,
) -> Result<(), LearnerError> {
    let mut now = folder_kwargs(src)?;
    now.extend(cfg.model.template_kwargs()?);
    let then = folder_kwargs(origin)?;
    if now == then {
        return Ok(());
    }
    Err(LearnerError::Config(ConfigError::Invalid {
        field: "model.chat_template_kwargs".into(),
        value: serde_json::Value::from(now).to_string(),
        why: format!(
            "the run started with {} ({}): the stored episodes were rendered with those; restore them or start a new run",
            serde_json::Value::from(then),
            origin.join(corvid_episode::KWARGS_FILE).display()
        ),
    }))
}

/// Writes the run's `[model] chat_template_kwargs` (over the folder's own) into the folder
/// the run keeps, so that its policy folders render with them.
fn write_template_kwargs(cfg: &LearnerConfig, origin: &Path) -> Result<(), LearnerError> {
    if cfg.model.chat_template_kwargs.is_empty() {
        return Ok(());
    }
    let path = origin.join(corvid_episode::KWARGS_FILE);
    let mut kwargs = folder_kwargs(origin)?;
    kwargs.extend(cfg.model.template_kwargs()?);
    let text = serde_json::to_string_pretty(&kwargs).map_err(|e| {
        LearnerError::Config(ConfigError::Section {
            section: "model",
            message: format!("chat_template_kwargs: {e}"),
        })
    })?;
    std::fs::write(&path, text).map_err(|e| {
        LearnerError::Config(ConfigError::Section {
            section: "model",
            message: format!("writing {}: {e}", path.display()),
        })
    })
}

/// A resumed run's `[model] hf` folder must hold the tokenizer files the run started with
/// (its copy in `origin`): episodes already stored are in those ids.
fn same_tokenizer_files(src: &Path, origin: &Path) -> Result<(), LearnerError> {
    for name in corvid_episode::TOKENIZER_FILES {
        let (a, b) = (
            std::fs::read(src.join(name)).ok(),
            std::fs::read(origin.join(name)).ok(),
        );
        if a != b {
            return Err(LearnerError::Config(ConfigError::Invalid {
                field: "model.hf".into(),
                value: src.display().to_string(),
                why: format!(
                    "its {name} differs from the one this run started with ({}): the stored episodes are in that tokenizer; restore the folder or start a new run",
                    origin.join(name).display()
                ),
            }));
        }
    }
    Ok(())
}

#[cfg(test)]
mod template_kwargs_tests {
    use super::*;

    /// A config whose `[model] chat_template_kwargs` is `kwargs` (set after parsing: a
    /// config without a tokenizer folder refuses them).
    fn config(kwargs: &str) -> LearnerConfig {
        let mut cfg = LearnerConfig::from_toml("").expect("config");
        cfg.model.chat_template_kwargs = toml::from_str(&format!("k = {kwargs}")).map_or_else(
            |e| panic!("{e}"),
            |t: toml::Table| t["k"].as_table().cloned().expect("a table"),
        );
        cfg
    }

    #[test]
    fn a_resumed_run_keeps_the_template_keywords_it_started_with() {
        let src = tempfile::tempdir().unwrap();
        let origin = tempfile::tempdir().unwrap();
        let started = config("{ enable_thinking = false }");
        write_template_kwargs(&started, origin.path()).unwrap();
        assert_eq!(
            folder_kwargs(origin.path()).unwrap(),
            started.model.template_kwargs().unwrap()
        );
        same_template_kwargs(&started, src.path(), origin.path()).expect("the same keywords");
        let e = same_template_kwargs(&config("{}"), src.path(), origin.path())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("chat_template_kwargs") && e.contains("\"enable_thinking\":false"),
            "{e}"
        );
    }
}
