//! The trainer thread's side of the learner: the policy in its current stage (SFT, then
//! RL), the store reader, the metrics file and the run checkpoints.
//!
//! # One update ([`Trainer::try_update`])
//!
//! 1. Ready groups (G trajectories, or closed and idle) are taken from the [`Collector`],
//!    oldest first; trajectories the trainer cannot use (token ids outside the vocabulary,
//!    non-finite behaviour log-probs) are left out and counted.
//! 2. libtorch is seeded from the learner's RNG (saved in every checkpoint), then
//!    [`RlTrainer::update_mixed`] trains on the groups at the current policy version (stale
//!    and unscored episodes are skipped and counted there), with `rl.ptx_tokens` of fresh
//!    `[sft]` demonstrations when the PPO-ptx term is on (`rl.ptx_coef > 0`).
//! 3. The new weights are published as the next version; the trajectories are marked
//!    consumed in the store; one metrics line is written.
//!
//! Exact resume: everything the next update reads — weights, optimizer moments and step,
//! the pending trajectories and the cursor, the curriculum and the dispenser (and their
//! RNGs), the learner's RNG, the spike window — is in the checkpoint; the SFT example stream
//! is a pure function of the step ([`crate::sft_data`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use corvid_tasks::SplitMix64;
use tch::nn;

use crate::checkpoint::{
    write_policy, CheckpointDir, Restored, RunState, Snapshot, Stage, Totals, STATE_FORMAT,
};
use crate::collect::{Collector, LoadedTrajectory};
use crate::config::LearnerConfig;
use crate::learner::{io_err, LearnerError, RunPaths, Shared, StopReason, Summary};
use crate::metrics::{
    CurriculumFigures, LayerHealth, MetricsSink, Rate, ServiceFigures, SpikeDetector, UpdateRecord,
};
use crate::model::checkpoint::{weights_to_bytes, WEIGHTS_FILE};
use crate::model::precision::weight_kind_for;
use crate::model::{ModelConfig, MoePolicy};
use crate::sft_data::SftData;
use crate::store::now_unix_ms;
use crate::train::pack::PackedRow;
use crate::train::sft::SftTrainer;
use crate::train::{Group, RlTrainer, SftLayout, TrainingTrajectory, UpdateStats};

/// Updates in the episodes/s window of the metrics.
const RATE_WINDOW: usize = 8;

/// Batches in a row with no scored episode after which the learner stops with an error
/// (eight batches of `groups_per_update` groups, every episode refused or abandoned).
pub const MAX_UNSCORED_BATCHES_IN_A_ROW: u32 = 8;

/// SFT progress lines go here, beside the RL metrics file.
pub const SFT_METRICS_FILE: &str = "sft.jsonl";

/// SFT steps between progress logs.
const SFT_LOG_EVERY: u64 = 10;

/// The PPO-ptx demonstrations of RL update `n` are the `[sft]` stream's step
/// `PTX_STEP_BASE + n`: examples no SFT step drew, past `mistakes_from_step`, and the same
/// again on resume.
const PTX_STEP_BASE: u64 = 1 << 32;

/// One line of `sft.jsonl`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SftRecord {
    /// SFT step (1-based).
    pub step: u64,
    /// Mean cross-entropy over the step's trained-on tokens.
    pub loss: f64,
    /// The MoE balance loss.
    pub aux_loss: f64,
    /// Trained-on tokens of the step.
    pub tokens: u64,
    /// Trained-on tokens so far.
    pub tokens_seen: u64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Learning rate.
    pub lr: f64,
    /// Held-out loss, on the steps that evaluate it (`sft.eval_every`).
    pub heldout_loss: Option<f64>,
    /// Wall clock, ms since the Unix epoch.
    pub unix_ms: u64,
}

/// The SFT stage in progress: the example stream, the held-out rows (made once), the log.
pub struct SftRun {
    data: SftData,
    heldout: Option<Vec<PackedRow>>,
    /// The SFT step this process last measured the held-out loss at, and the loss, so the
    /// end of SFT does not measure the same weights again.
    measured: Option<(u64, f64)>,
    log: std::fs::File,
    path: PathBuf,
    started: Instant,
    /// Tokens seen when this process took SFT up (a resumed run's earlier ones), left out
    /// of the logged rate.
    tokens_at_start: u64,
}

impl std::fmt::Debug for SftRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SftRun")
            .field("data", &self.data)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl SftRun {
    fn heldout_loss(&mut self, t: &SftTrainer) -> Result<Option<f64>, LearnerError> {
        if self.heldout.is_none() {
            let rows = self
                .data
                .heldout_rows()
                .map_err(|e| LearnerError::Sft(e.to_string()))?;
            self.heldout = Some(rows);
        }
        match self.heldout.as_deref() {
            Some(rows) if !rows.is_empty() => Ok(Some(t.eval_loss(rows)?)),
            _ => Ok(None),
        }
    }

    fn write(&mut self, r: &SftRecord) -> Result<(), LearnerError> {
        let mut line = serde_json::to_vec(r).unwrap_or_default();
        line.push(b'\n');
        std::io::Write::write_all(&mut self.log, &line).map_err(io_err("writing", &self.path))
    }
}

/// The policy and its optimizer, in the trainer of the current stage. The trainers own
/// the `VarStore`, the model and the optimizer; SFT hands them to RL.
enum Policy {
    /// Supervised fine-tuning.
    Sft(Box<SftTrainer>),
    /// Policy optimisation.
    Rl(Box<RlTrainer>),
}

impl Policy {
    fn vs(&self) -> &nn::VarStore {
        match self {
            Policy::Sft(t) => t.var_store(),
            Policy::Rl(t) => t.var_store(),
        }
    }

    fn optimizer_state(&self) -> Vec<(String, tch::Tensor)> {
        match self {
            Policy::Sft(t) => t.optimizer().state_tensors(),
            Policy::Rl(t) => t.optimizer().state_tensors(),
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
    policy: Option<Policy>,
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
    let init_cfg = crate::model::checkpoint::load_config(dir).map_err(|e| {
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
    let path = dir.join(WEIGHTS_FILE);
    let bytes = std::fs::read(&path).map_err(io_err("reading", &path))?;
    crate::model::checkpoint::load_weights_from_bytes(vs, &bytes)?;
    Ok(())
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
        let (vs, model) = build_model(&model_cfg, device, kind, cfg.seed)?;
        tracing::info!(?device, weights = ?kind, routers = "Float", "policy built");
        let m = &cfg.metrics;
        if restored.is_none() {
            if let Some(dir) = &cfg.model.init {
                load_init(dir, &model_cfg, &vs)?;
                tracing::info!(init = %dir.display(), "initial weights loaded");
            }
        }
        let (mut state, optimizer) = match restored {
            Some(r) => {
                r.load_weights(&vs)?;
                let dropped = MetricsSink::truncate_after(&paths.metrics, r.state.rl_step)
                    .map_err(io_err("cutting back", &paths.metrics))?;
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
                (r.state, Some(r.optimizer))
            }
            None => (
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
                    dispenser: shared.control.dispenser.state(),
                    spikes: SpikeDetector::new(m.spike_k, m.spike_window, m.spike_min_samples),
                    totals: Totals::default(),
                    reference_policy: None,
                    saved_unix_ms: 0,
                },
                None,
            ),
        };
        // RL without SFT before it: the starting weights are the KL reference.
        if state.stage == Stage::Rl && state.reference_policy.is_none() {
            write_policy(&paths.reference, &vs, &model_cfg)?;
            state.reference_policy = Some(paths.reference.clone());
        }
        let policy = match state.stage {
            Stage::Sft => {
                let mut t = SftTrainer::new(vs, model, cfg.sft.clone())?;
                if let Some(opt) = &optimizer {
                    t.optimizer_mut().load_state(opt)?;
                }
                t.set_tokens_seen(state.sft_tokens);
                if let Some(loss) = state.sft_heldout_loss {
                    t.record_heldout_loss(loss);
                }
                Policy::Sft(Box::new(t))
            }
            Stage::Rl => {
                let mut t = Self::rl_trainer(&cfg, &model_cfg, vs, model, &state)?;
                if let Some(opt) = &optimizer {
                    t.optimizer_mut().load_state(opt)?;
                }
                Policy::Rl(Box::new(t))
            }
        };
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
        let metrics =
            MetricsSink::open(&paths.metrics).map_err(io_err("opening", &paths.metrics))?;
        Ok(Self {
            cfg,
            paths,
            shared,
            ckpt,
            model_cfg,
            policy: Some(policy),
            state,
            collector,
            metrics,
            published: false,
            recent_updates: std::collections::VecDeque::from([(Instant::now(), 0)]),
            skipped_in_a_row: 0,
            ptx_data: None,
        })
    }

    /// The RL trainer over `(vs, model)`, with the frozen reference when the KL term is on.
    fn rl_trainer(
        cfg: &LearnerConfig,
        model_cfg: &ModelConfig,
        vs: nn::VarStore,
        model: MoePolicy,
        state: &RunState,
    ) -> Result<RlTrainer, LearnerError> {
        let reference = if cfg.rl.kl_coef > 0.0 {
            let dir = state.reference_policy.as_deref().ok_or_else(|| {
                LearnerError::RunDir("rl.kl_coef > 0 but no reference policy was written".into())
            })?;
            let (rvs, rmodel) = crate::model::checkpoint::load(dir, vs.device())?;
            if rmodel.config() != model_cfg {
                return Err(LearnerError::RunDir(format!(
                    "the reference policy in {} has another model config",
                    dir.display()
                )));
            }
            Some((rvs, rmodel))
        } else {
            None
        };
        Ok(RlTrainer::new(vs, model, reference, cfg.rl.clone())?)
    }

    fn policy(&self) -> &Policy {
        // Only `sft_to_rl` takes the policy out, and it always puts one back.
        self.policy
            .as_ref()
            .expect("the trainer always holds a policy")
    }

    /// The learner's state as it would be checkpointed now.
    pub fn state(&self) -> RunState {
        let mut s = self.state.clone();
        s.read_cursor = self.collector.read_cursor();
        s.pending = self.collector.pending_ids();
        s.taken_groups = self.collector.taken_groups();
        s.dispenser = self.shared.control.dispenser.state();
        if let Some(Policy::Sft(t)) = &self.policy {
            s.sft_tokens = t.tokens_seen();
            s.sft_heldout_loss = t.heldout_loss();
        }
        s
    }

    /// The current weights as safetensors bytes.
    pub fn weights(&self) -> Result<Vec<u8>, LearnerError> {
        Ok(weights_to_bytes(self.policy().vs())?)
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
        let policy = self.policy();
        let saved = self.ckpt.save(Snapshot {
            vs: policy.vs(),
            model_config: &self.model_cfg,
            optimizer: policy.optimizer_state(),
            curriculum: &curriculum,
            state,
        })?;
        // The checkpoint holds the group counter now: the id reservation can shrink to it.
        self.shared.control.dispenser.trim_group_ids();
        Ok(saved)
    }

    /// Publishes the current weights as the current policy version.
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

    /// Reads newly finished trajectories and records their outcomes into the curriculum.
    pub fn poll(&mut self) -> Result<usize, LearnerError> {
        let curriculum = Arc::clone(self.shared.curriculum());
        let n = self.collector.poll(&self.shared.store, |t| {
            if !t.footer.termination.is_scored() {
                return;
            }
            let mut c = curriculum.lock().unwrap_or_else(|p| p.into_inner());
            match c.record(&t.header.task.family, t.header.task.level, t.footer.success) {
                Ok(corvid_tasks::LevelChange::None) => {}
                Ok(change) => tracing::info!(family = %t.header.task.family, ?change, "curriculum level changed"),
                Err(e) => tracing::debug!(trajectory = %t.header.trajectory_id, error = %e, "outcome not recorded"),
            }
        })?;
        self.state.totals.trajectories_read += n as u64;
        self.report_waiting();
        Ok(n)
    }

    /// The SFT stage's data stream and log, made once per process (`None` once SFT is done
    /// or when the schedule has none).
    pub fn sft_run(&self) -> Result<Option<SftRun>, LearnerError> {
        let Some(Policy::Sft(t)) = &self.policy else {
            return Ok(None);
        };
        let tokens_at_start = t.tokens_seen();
        let families = self.cfg.families()?;
        let data =
            SftData::new(&self.cfg.sft, &families).map_err(|e| LearnerError::Sft(e.to_string()))?;
        let path = self.paths.metrics.with_file_name(SFT_METRICS_FILE);
        // Lines of steps after the checkpoint a run resumes from are cut, as for RL.
        MetricsSink::truncate_after(&path, self.state.sft_step)
            .map_err(io_err("cutting back", &path))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io_err("opening", &path))?;
        Ok(Some(SftRun {
            data,
            heldout: None,
            measured: None,
            log,
            path,
            started: Instant::now(),
            tokens_at_start,
        }))
    }

    /// One SFT step; false (and no step) once SFT is done.
    pub fn sft_step(&mut self, run: &mut SftRun) -> Result<bool, LearnerError> {
        let Some(Policy::Sft(t)) = self.policy.as_mut() else {
            return Ok(false);
        };
        if t.done() {
            return Ok(false);
        }
        let rows = run
            .data
            .step_rows(self.state.sft_step)
            .map_err(|e| LearnerError::Sft(e.to_string()))?;
        tch::manual_seed((self.state.rng.next_u64() >> 1) as i64);
        let stats = t.step(&rows)?;
        self.state.sft_step += 1;
        let step = self.state.sft_step;
        let every = self.cfg.sft.eval_every;
        let heldout_loss = if every > 0 && step.is_multiple_of(every) {
            run.heldout_loss(t)?
        } else {
            None
        };
        if let Some(loss) = heldout_loss {
            t.record_heldout_loss(loss);
            run.measured = Some((step, loss));
        }
        let record = SftRecord {
            step,
            loss: stats.loss,
            aux_loss: stats.aux_loss,
            tokens: stats.tokens as u64,
            tokens_seen: t.tokens_seen(),
            grad_norm: stats.grad_norm,
            lr: stats.lr,
            heldout_loss,
            unix_ms: now_unix_ms(),
        };
        run.write(&record)?;
        if step.is_multiple_of(SFT_LOG_EVERY) || step == 1 || heldout_loss.is_some() {
            let rate = t.tokens_seen().saturating_sub(run.tokens_at_start) as f64
                / run.started.elapsed().as_secs_f64().max(1e-9);
            tracing::info!(
                step,
                loss = format_args!("{:.4}", stats.loss),
                heldout_loss = ?heldout_loss,
                lr = format_args!("{:.2e}", stats.lr),
                grad_norm = format_args!("{:.3}", stats.grad_norm),
                tokens = t.tokens_seen(),
                tokens_per_s = format_args!("{rate:.0}"),
                "sft"
            );
        }
        Ok(true)
    }

    /// Ends SFT: the final held-out loss, then the weights become the frozen reference
    /// policy (`ref/`) and pass to a fresh RL trainer.
    pub fn finish_sft(&mut self, run: &mut SftRun) -> Result<(), LearnerError> {
        if let Some(Policy::Sft(t)) = self.policy.as_mut() {
            let heldout_loss = match run.measured {
                Some((step, loss)) if step == self.state.sft_step => Some(loss),
                _ => run.heldout_loss(t)?,
            };
            if let Some(loss) = heldout_loss {
                t.record_heldout_loss(loss);
            }
            let target = self.cfg.sft.heldout_loss_target;
            let reached = t.reached_heldout_target();
            tracing::info!(
                steps = self.state.sft_step,
                tokens = t.tokens_seen(),
                heldout_loss = ?heldout_loss,
                heldout_loss_target = ?target,
                dropped = ?run.data.dropped(),
                "sft finished"
            );
            if let (Some(target), false) = (target, reached) {
                tracing::warn!(
                    target,
                    heldout_loss = ?heldout_loss,
                    steps = self.state.sft_step,
                    "sft reached its step cap before the held-out loss target; RL starts from \
                     a policy short of it (raise sft.steps)"
                );
            }
        }
        self.sft_to_rl()
    }

    /// Runs SFT to its end (or until `stop`); returns false when stopped part-way.
    /// Without SFT in the schedule it returns true at once.
    pub fn sft(&mut self, stop: &AtomicBool) -> Result<bool, LearnerError> {
        let Some(mut run) = self.sft_run()? else {
            return Ok(true);
        };
        let every = self.cfg.schedule.sft_checkpoint_every;
        loop {
            if stop.load(Ordering::Relaxed) {
                return Ok(false);
            }
            if !self.sft_step(&mut run)? {
                break;
            }
            if every > 0 && self.state.sft_step.is_multiple_of(every) {
                self.checkpoint()?;
            }
        }
        self.finish_sft(&mut run)?;
        Ok(true)
    }

    /// Ends SFT: the weights become the frozen reference policy (`ref/`), and the policy
    /// passes to a fresh RL trainer.
    fn sft_to_rl(&mut self) -> Result<(), LearnerError> {
        let Some(Policy::Sft(t)) = self.policy.take() else {
            return Ok(());
        };
        self.state.sft_tokens = t.tokens_seen();
        self.state.sft_heldout_loss = t.heldout_loss();
        let (vs, model) = t.into_parts();
        write_policy(&self.paths.reference, &vs, &self.model_cfg)?;
        self.state.reference_policy = Some(self.paths.reference.clone());
        self.state.stage = Stage::Rl;
        let rl = Self::rl_trainer(&self.cfg, &self.model_cfg, vs, model, &self.state)?;
        self.policy = Some(Policy::Rl(Box::new(rl)));
        Ok(())
    }

    /// Starts the RL stage: publishes the current version (1 on a fresh run; the checkpoint's
    /// on resume). The reference policy exists by now ([`Trainer::new`] or SFT wrote it).
    fn enter_rl(&mut self) -> Result<(), LearnerError> {
        if self.published {
            return Ok(());
        }
        if !matches!(self.policy, Some(Policy::Rl(_))) {
            return Err(LearnerError::RunDir(
                "RL cannot start before SFT has finished".into(),
            ));
        }
        if self.state.policy_version == 0 {
            self.state.policy_version = 1;
        }
        self.publish()?;
        if self.cfg.rl.sync {
            self.grant_sync_batch();
        }
        Ok(())
    }

    /// Tells the dispenser how many completed groups wait to be trained (its rule 3).
    fn report_waiting(&self) {
        let d = &self.shared.control.dispenser;
        d.set_waiting(self.collector.ready_groups(&|id| d.is_open(id)));
    }

    /// Synchronous mode: allows the groups the next update still needs — one batch minus
    /// the groups already out or waiting to be trained (after a resume some may be).
    fn grant_sync_batch(&self) {
        let d = &self.shared.control.dispenser;
        let outstanding = d.open_groups() + self.collector.pending_groups();
        let need = self.cfg.rl.groups_per_update.saturating_sub(outstanding);
        d.set_budget(Some(need as u64));
    }

    /// Keeps only trajectories the trainer can use: token ids inside the vocabulary and
    /// finite behaviour log-probs. The rest are counted and logged, never trained on.
    fn trainable(&self, t: LoadedTrajectory) -> Option<TrainingTrajectory> {
        let vocab = self.model_cfg.vocab_size as u64;
        let t = TrainingTrajectory {
            header: t.header,
            footer: t.footer,
            steps: t.steps,
        };
        let bad_token = t
            .steps
            .iter()
            .flat_map(|s| s.token_ids.iter())
            .find(|&&id| u64::from(id) >= vocab);
        let problem = match (bad_token, t.check_trainable()) {
            (Some(id), _) => format!("token id {id} is outside the vocabulary of {vocab}"),
            (None, Err(e)) => e.to_string(),
            (None, Ok(())) => return Some(t),
        };
        tracing::warn!(trajectory = %t.header.trajectory_id, problem, "trajectory not trainable; left out");
        None
    }

    /// One RL update if `rl.groups_per_update` groups are ready; the record written, or
    /// `None` when not enough data has arrived.
    pub fn try_update(&mut self) -> Result<Option<UpdateRecord>, LearnerError> {
        self.enter_rl()?;
        let need = self.cfg.rl.groups_per_update;
        let dispenser = Arc::clone(&self.shared.control.dispenser);
        let is_open = |id: &str| dispenser.is_open(id);
        if self.collector.ready_groups(&is_open) < need {
            return Ok(None);
        }
        let loaded = self.collector.take_ready(need, &is_open);
        self.report_waiting();
        let ids: Vec<String> = loaded
            .iter()
            .flatten()
            .map(|t| t.header.trajectory_id.clone())
            .collect();
        if !loaded
            .iter()
            .flatten()
            .any(|t| t.footer.termination.is_scored())
        {
            self.skip_unscored_batch(&ids, &loaded)?;
            return Ok(None);
        }
        self.skipped_in_a_row = 0;
        let mut invalid = 0u64;
        let groups: Vec<Group> = loaded
            .into_iter()
            .map(|g| {
                let n = g.len();
                let kept: Vec<_> = g.into_iter().filter_map(|t| self.trainable(t)).collect();
                invalid += (n - kept.len()) as u64;
                kept
            })
            .filter(|g| !g.is_empty())
            .collect();

        let started = Instant::now();
        // Every random choice inside the update derives from the learner's saved RNG.
        tch::manual_seed((self.state.rng.next_u64() >> 1) as i64);
        let version = self.state.policy_version;
        let demos = self.ptx_demonstrations()?;
        let Some(Policy::Rl(rl)) = self.policy.as_mut() else {
            unreachable!("enter_rl checked the stage")
        };
        let stats = rl.update_mixed(&groups, version, &demos)?;
        let update_s = started.elapsed().as_secs_f64();
        let mut record = update_record(&stats, &groups, version, self.cfg.rl.staleness_bound);
        if stats.optimizer_steps == 0 && record.rollout.episodes == 0 {
            self.skip_stale_batch(&ids, &stats, invalid)?;
            return Ok(None);
        }

        self.state.rl_step += 1;
        if stats.optimizer_steps > 0 {
            self.state.policy_version += 1;
            self.publish()?;
        }
        self.shared
            .store
            .mark_consumed(ids.iter().map(String::as_str), self.state.rl_step)?;

        record.step = self.state.rl_step;
        record.policy_version = self.state.policy_version;
        record.unix_ms = now_unix_ms();
        record.update_s = update_s;
        record.rollout.invalid_skipped = invalid;
        record.rollout.copies_skipped = self.collector.take_copies();
        record.rollout.episodes_per_s = self.windowed_episodes_per_s(started, ids.len());
        record.rollout.tokens_per_s = stats.total_tokens as f64 / update_s.max(1e-9);
        record.spikes = self.state.spikes.observe(record.loss.policy);
        record.curriculum = self.curriculum_figures();
        record.service = self.service_figures();
        let t = &mut self.state.totals;
        t.episodes_trained += stats.trajectories_used as u64;
        t.tokens_trained += stats.tokens as u64;
        t.stale_skipped += stats.stale_skipped as u64;
        t.unscored_skipped += stats.unscored_excluded as u64;
        t.copies_skipped += record.rollout.copies_skipped;
        self.metrics
            .write(&record)
            .map_err(io_err("writing", &self.paths.metrics))?;
        if record.spikes.spike {
            tracing::warn!(
                step = record.step,
                loss = record.loss.policy,
                mean = record.spikes.window_mean,
                std = record.spikes.window_std,
                "policy loss spike"
            );
        }
        tracing::info!(
            step = record.step,
            version = record.policy_version,
            episodes = record.rollout.episodes,
            reward = format_args!("{:.3}", record.rollout.reward_mean),
            success = format_args!("{:.3}", record.rollout.success_rate),
            loss = format_args!("{:.4}", record.loss.policy),
            kl = format_args!("{:.4}", record.loss.kl),
            stale = stats.stale_skipped,
            seconds = format_args!("{update_s:.2}"),
            "update"
        );
        if self.cfg.rl.sync {
            self.grant_sync_batch();
        }
        Ok(Some(record))
    }

    /// The demonstrations of the next update's PPO-ptx term (`rl.ptx_tokens` of them, from
    /// the `[sft]` stream's levels, mistakes and imports); none when `rl.ptx_coef = 0`.
    fn ptx_demonstrations(&mut self) -> Result<Vec<PackedRow>, LearnerError> {
        if self.cfg.rl.ptx_coef <= 0.0 {
            return Ok(Vec::new());
        }
        let err =
            |e: crate::sft_data::SftDataError| LearnerError::Sft(format!("rl.ptx_coef > 0: {e}"));
        let data = match &mut self.ptx_data {
            Some(d) => d,
            None => {
                let mut sft = self.cfg.sft.clone();
                sft.batch_tokens = self.cfg.rl.ptx_tokens;
                sft.layout = SftLayout::Bucket;
                // Its steps are numbered from PTX_STEP_BASE, past any switch to concat.
                sft.concat_from_step = None;
                let families = self.cfg.families()?;
                self.ptx_data
                    .insert(SftData::new(&sft, &families).map_err(err)?)
            }
        };
        data.step_rows(PTX_STEP_BASE + self.state.rl_step)
            .map_err(err)
    }

    /// Consumes a batch that is no update: its trajectories are marked consumed, the batch
    /// is counted in `batches_skipped` (the Prometheus record shows it; no metrics line is
    /// written) and the policy version stays. In synchronous mode the next batch is granted
    /// here: no new version will grant it, and without it the actors would wait forever.
    fn consume_skipped_batch(&mut self, ids: &[String]) -> Result<(), LearnerError> {
        self.shared
            .store
            .mark_consumed(ids.iter().map(String::as_str), self.state.rl_step)?;
        self.state.totals.batches_skipped += 1;
        self.metrics
            .note_batches_skipped(self.state.totals.batches_skipped);
        if self.cfg.rl.sync {
            self.grant_sync_batch();
        }
        Ok(())
    }

    /// A batch none of whose episodes is scored, trainable and within `rl.staleness_bound`:
    /// usually the trainer fell behind the actors. It is skipped like an unscored batch (no
    /// step, no metrics line of zeros); the actors' rule-3 back-pressure keeps this rare.
    fn skip_stale_batch(
        &mut self,
        ids: &[String],
        stats: &UpdateStats,
        invalid: u64,
    ) -> Result<(), LearnerError> {
        self.consume_skipped_batch(ids)?;
        let t = &mut self.state.totals;
        t.stale_skipped += stats.stale_skipped as u64;
        t.unscored_skipped += stats.unscored_excluded as u64;
        if invalid > 0 && stats.stale_skipped == 0 {
            tracing::warn!(
                episodes = ids.len(),
                invalid,
                "no episode of the batch is trainable (see the warnings above); skipped"
            );
        } else {
            tracing::warn!(
                episodes = ids.len(),
                stale = stats.stale_skipped,
                invalid,
                bound = self.cfg.rl.staleness_bound,
                "no episode of the batch is within rl.staleness_bound policy versions; skipped (the trainer is slower than the actors: fewer actors, or a larger bound)"
            );
        }
        Ok(())
    }

    /// A batch with no scored episode (every one `infra_error` or `abandoned`) has nothing to
    /// learn from: its groups are consumed, but no update is counted and the policy version
    /// stays. [`MAX_UNSCORED_BATCHES_IN_A_ROW`] of them in a row stop the learner with an
    /// error: its actors cannot run the tasks, and waiting would never end a `max_updates` run.
    fn skip_unscored_batch(
        &mut self,
        ids: &[String],
        loaded: &[Vec<LoadedTrajectory>],
    ) -> Result<(), LearnerError> {
        let mut by_termination: BTreeMap<&str, usize> = BTreeMap::new();
        for t in loaded.iter().flatten() {
            *by_termination
                .entry(t.footer.termination.as_str())
                .or_default() += 1;
        }
        self.consume_skipped_batch(ids)?;
        self.state.totals.unscored_skipped += ids.len() as u64;
        self.skipped_in_a_row += 1;
        let why = "actors report infra_error when they cannot build a task (an actor started \
                   without --task-pack for a pack in [tasks] packs, a task spec that differs \
                   between learner and actor) or their sandbox fails; see the actors' logs";
        if self.skipped_in_a_row >= MAX_UNSCORED_BATCHES_IN_A_ROW {
            return Err(LearnerError::Rollout(format!(
                "{} batches in a row had no scored episode (the last: {by_termination:?}); {why}",
                self.skipped_in_a_row
            )));
        }
        tracing::warn!(
            episodes = ids.len(),
            terminations = ?by_termination,
            in_a_row = self.skipped_in_a_row,
            "no episode of this batch is scored, so no update: {why}"
        );
        Ok(())
    }

    /// Episodes per second over the window of the last [`RATE_WINDOW`] updates: the
    /// episodes of the updates after the window's first, over the time since it started.
    fn windowed_episodes_per_s(&mut self, started: Instant, episodes: usize) -> f64 {
        self.recent_updates.push_back((started, episodes));
        while self.recent_updates.len() > RATE_WINDOW + 1 {
            self.recent_updates.pop_front();
        }
        let (first, _) = self.recent_updates[0];
        let n: usize = self.recent_updates.iter().skip(1).map(|(_, n)| n).sum();
        n as f64 / started.duration_since(first).as_secs_f64().max(1e-3)
    }

    fn curriculum_figures(&self) -> CurriculumFigures {
        let c = self
            .shared
            .curriculum()
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        CurriculumFigures {
            frontier: self
                .cfg
                .tasks
                .families
                .iter()
                .filter_map(|f| c.frontier(f).ok().map(|l| (f.clone(), l)))
                .collect(),
            context_tokens: c.context_tokens(),
        }
    }

    fn service_figures(&self) -> ServiceFigures {
        let d = self.shared.control.dispenser.counters();
        ServiceFigures {
            open_groups: self.shared.control.dispenser.open_groups() as u64,
            groups_waiting: self.shared.control.dispenser.waiting() as u64,
            groups_completed: d.groups_completed,
            groups_expired: d.groups_expired,
            episodes_reclaimed: d.episodes_reclaimed,
            actors_active: self.shared.control.actors_active() as u64,
            trajectories_read: self.state.totals.trajectories_read,
            batches_skipped: self.state.totals.batches_skipped,
        }
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
        if matches!(self.policy, Some(Policy::Sft(_))) {
            if !self.sft(stop)? {
                return done(&mut self, StopReason::Signal);
            }
            self.checkpoint()?;
        }
        self.enter_rl()?;
        if self.ckpt.latest()?.is_none() {
            // Once actors can roll out, a run can always be resumed: without this a run
            // without SFT that dies before its first periodic checkpoint could not be.
            self.checkpoint()?;
        }
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

/// The metrics record of an update: the trainer's figures, and the rollout figures of the
/// trained groups.
fn update_record(
    stats: &UpdateStats,
    groups: &[Group],
    version: u64,
    staleness_bound: u64,
) -> UpdateRecord {
    let mut record = UpdateRecord::default();
    let l = &mut record.loss;
    l.policy = stats.policy_loss;
    l.kl = stats.kl;
    l.entropy = stats.entropy;
    l.balance = stats.aux_loss;
    l.ptx = stats.ptx_loss;
    l.clip_frac_low = stats.clip_frac_low;
    l.clip_frac_high = stats.clip_frac_high;
    l.iw_mean = stats.is_weight_mean;
    l.iw_max = stats.is_weight_max;
    l.iw_truncated_frac = stats.is_truncated_frac;
    l.grad_norm = stats.grad_norm;
    l.lr = stats.lr;
    l.optimizer_steps = stats.optimizer_steps as u64;
    l.adv_mean = stats.adv_mean;
    l.adv_abs_mean = stats.adv_abs_mean;
    record.moe = stats.health.iter().map(LayerHealth::from).collect();
    let r = &mut record.rollout;
    r.episodes_trained = stats.trajectories_used as u64;
    r.reward_mean = stats.mean_reward;
    r.success_rate = stats.success_rate;
    r.tokens = stats.tokens as u64;
    r.staleness_mean = stats.mean_lag;
    r.staleness_max = stats.max_lag;
    r.stale_skipped = stats.stale_skipped as u64;
    r.unscored_skipped = stats.unscored_excluded as u64;
    r.uninformative_groups = stats.uninformative_groups as u64;
    r.too_long_skipped = stats.too_long_skipped as u64;
    // Success by task over the scored episodes within the staleness bound, the same ones
    // `mean_reward` and `success_rate` describe.
    for t in groups.iter().flatten() {
        if !t.footer.termination.is_scored() || t.lag(version) > staleness_bound {
            continue;
        }
        r.success_by_task
            .entry(format!("{}/{}", t.header.task.family, t.header.task.level))
            .or_insert_with(Rate::default)
            .add(t.footer.success);
        r.episodes += 1;
    }
    record
}
