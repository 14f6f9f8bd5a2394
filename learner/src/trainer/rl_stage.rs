//! The RL stage of the [`Trainer`]: reading finished trajectories, one update at a time,
//! and the batches that make no update.
//!
//! # One update ([`Trainer::try_update`])
//!
//! 1. Ready groups (G trajectories, or closed and idle) are taken from the [`Collector`],
//!    oldest first; trajectories the trainer cannot use (token ids outside the vocabulary,
//!    non-finite behaviour log-probs) are left out and counted.
//! 2. libtorch is seeded from the learner's RNG (saved in every checkpoint); [`select`]
//!    keeps the trajectories to learn from at the current policy version (stale and
//!    unscored episodes are skipped and counted) and computes their advantages; then
//!    [`RlTrainer::train`] trains on them, with `rl.ptx_tokens` of fresh `[sft]`
//!    demonstrations when the PPO-ptx term is on (`rl.ptx_coef > 0`).
//! 3. The new weights are published as the next version; the trajectories are marked
//!    consumed in the store; one metrics line is written.
//!
//! A batch with no scored episode, or none within `rl.staleness_bound`, is consumed without
//! an update ([`MAX_UNSCORED_BATCHES_IN_A_ROW`] of the first kind stop the learner).
//!
//! [`Collector`]: crate::collect::Collector

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use corvid_proto::Trajectory;
use tch::nn;

use super::record::update_record;
use super::{ActiveTrainer, Trainer};
use crate::checkpoint::RunState;
use crate::collect::LoadedTrajectory;
use crate::config::LearnerConfig;
use crate::learner::{io_err, LearnerError};
use crate::metrics::UpdateRecord;
use crate::sft_data::SftData;
use crate::train::batch::{check_trainable, select};
use crate::train::config::RlConfig;
use crate::train::pack::PackedRow;
use crate::train::{Group, RlTrainer, SftLayout, UpdateStats};
use corvid_model::{ModelConfig, MoePolicy};

/// Batches in a row with no scored episode after which the learner stops with an error
/// (eight batches of `groups_per_update` groups, every episode refused or abandoned).
pub const MAX_UNSCORED_BATCHES_IN_A_ROW: u32 = 8;

/// The PPO-ptx demonstrations of RL update `n` are the `[sft]` stream's step
/// `PTX_STEP_BASE + n`: examples no SFT step drew, past `mistakes_from_step`, and the same
/// again on resume.
const PTX_STEP_BASE: u64 = 1 << 32;

impl Trainer {
    /// The RL trainer over `(vs, model)`, with the frozen reference when the KL term is on.
    pub(super) fn rl_trainer(
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
            let (rvs, rmodel) = corvid_model::checkpoint::load(dir, vs.device())?;
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
        Ok(RlTrainer::new(
            vs,
            model,
            reference,
            RlConfig {
                train: cfg.train.clone(),
                ..cfg.rl.clone()
            },
            cfg.episode_format()?.pad_id(),
        )?)
    }

    /// Reads newly finished trajectories and records their outcomes into the curriculum.
    pub fn poll(&mut self) -> Result<usize, LearnerError> {
        let curriculum = Arc::clone(self.shared.curriculum());
        let n = self.collector.poll(&self.shared.store, |t| {
            if !t.trajectory.footer.termination.is_scored() {
                return;
            }
            let mut c = curriculum.lock().unwrap_or_else(|p| p.into_inner());
            match c.record(&t.trajectory.header.task.family, t.trajectory.header.task.level, t.trajectory.footer.success) {
                Ok(corvid_tasks::LevelChange::None) => {}
                Ok(change) => tracing::info!(family = %t.trajectory.header.task.family, ?change, "curriculum level changed"),
                Err(e) => tracing::debug!(trajectory = %t.trajectory.header.trajectory_id, error = %e, "outcome not recorded"),
            }
        })?;
        self.state.totals.trajectories_read += n as u64;
        self.report_waiting();
        Ok(n)
    }

    /// Starts the RL stage: writes the run's first checkpoint if it has none, then publishes
    /// the current version (1 on a fresh run; the checkpoint's on resume). The reference
    /// policy exists by now ([`Trainer::new`] or SFT wrote it).
    pub(super) fn enter_rl(&mut self) -> Result<(), LearnerError> {
        if self.published {
            return Ok(());
        }
        if !matches!(self.active, Some(ActiveTrainer::Rl(_))) {
            return Err(LearnerError::RunDir(
                "RL cannot start before SFT has finished".into(),
            ));
        }
        if self.state.policy_version == 0 {
            self.state.policy_version = 1;
            self.follow_stage_rope()?;
        }
        // Actors roll out as soon as a policy is published. A checkpoint before that means a
        // store never holds trajectories without one: a learner killed at any point can be
        // resumed (`--resume-if-any`), which a run without SFT killed before its first
        // periodic checkpoint otherwise could not be.
        if self.ckpt.latest()?.is_none() {
            self.checkpoint()?;
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
    fn trainable(&self, t: LoadedTrajectory) -> Option<Trajectory> {
        let vocab = self.model_cfg.vocab_size as u64;
        let t = t.trajectory;
        let bad_token = t
            .steps
            .iter()
            .flat_map(|s| s.token_ids.iter())
            .find(|&&id| u64::from(id) >= vocab);
        let problem = match (bad_token, check_trainable(&t)) {
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
            .map(|t| t.trajectory.header.trajectory_id.clone())
            .collect();
        if !loaded
            .iter()
            .flatten()
            .any(|t| t.trajectory.footer.termination.is_scored())
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
        let Some(ActiveTrainer::Rl(rl)) = self.active.as_mut() else {
            unreachable!("enter_rl checked the stage")
        };
        // Selection and advantages are the whole batch's; the trainer only computes.
        let selection = select(&groups, version, rl.config())?;
        let stats = rl.train(&selection, &demos, true)?;
        let update_s = started.elapsed().as_secs_f64();
        let mut record = update_record(&stats, &groups, version, self.cfg.rl.staleness_bound);
        if stats.optimizer_steps == 0 && record.rollout.episodes == 0 {
            self.skip_stale_batch(&ids, &stats, invalid)?;
            return Ok(None);
        }

        self.state.rl_step += 1;
        if stats.optimizer_steps > 0 {
            self.state.policy_version += 1;
            self.follow_stage_rope()?;
            self.publish()?;
        }
        self.shared
            .store
            .mark_consumed(ids.iter().map(String::as_str), self.state.rl_step)?;

        self.finish_record(&mut record, &stats, started, update_s, ids.len(), invalid);
        let t = &mut self.state.totals;
        t.episodes_trained += stats.trajectories_used as u64;
        t.tokens_trained += stats.tokens as u64;
        t.stale_skipped += stats.stale_skipped as u64;
        t.unscored_skipped += stats.unscored_excluded as u64;
        t.copies_skipped += record.rollout.copies_skipped;
        self.metrics
            .write(&record)
            .map_err(io_err("writing", &self.paths.metrics))?;
        log_update(&record, &stats, update_s);
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
                let data = SftData::new(&sft, &families, self.cfg.episode_format()?)
                    .map_err(err)?
                    .folding(
                        self.cfg.sft_context(),
                        self.cfg.rollout.sampling.max_new_tokens,
                    );
                self.ptx_data.insert(data)
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
                .entry(t.trajectory.footer.termination.as_str())
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
}

/// The log lines of a written update: a warning on a policy-loss spike, then the update.
fn log_update(record: &UpdateRecord, stats: &UpdateStats, update_s: f64) {
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
}
