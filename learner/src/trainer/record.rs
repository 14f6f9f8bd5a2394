//! The metrics record of an RL update ([`UpdateRecord`]): the trainer's figures and the
//! rollout figures of the trained groups ([`update_record`]), then the step, rates, spike
//! check, curriculum and service figures the [`Trainer`] adds once the update counts.

use std::time::Instant;

use super::Trainer;
use crate::metrics::{CurriculumFigures, Rate, ServiceFigures, UpdateRecord};
use crate::train::{Group, UpdateStats};
use corvid_model::RopeScaling;
use corvid_store::now_unix_ms;

/// Updates in the episodes/s window of the metrics.
const RATE_WINDOW: usize = 8;

/// The metrics record of an update: the trainer's figures, and the rollout figures of the
/// trained groups.
pub(super) fn update_record(
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
    l.approx_kl = stats.approx_kl;
    l.iw_mean = stats.is_weight_mean;
    l.iw_max = stats.is_weight_max;
    l.iw_truncated_frac = stats.is_truncated_frac;
    l.grad_norm = stats.grad_norm;
    l.lr = stats.lr;
    l.optimizer_steps = stats.optimizer_steps as u64;
    l.adv_mean = stats.adv_mean;
    l.adv_abs_mean = stats.adv_abs_mean;
    record.mismatch = stats.mismatch.clone();
    record.moe = stats.health.clone();
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
        r.template_divergent_episodes += u64::from(t.footer.template_divergent);
        let folds = t.segments().len().saturating_sub(1) as u64;
        r.folded_episodes += u64::from(folds > 0);
        r.folds += folds;
        r.episode_tokens_mean += t.len() as f64;
    }
    if r.episodes > 0 {
        r.episode_tokens_mean /= r.episodes as f64;
    }
    record
}

impl Trainer {
    /// Completes `record` of the update that started at `started`, took `update_s` and
    /// trained on `episodes` episodes (`invalid` left out): step and version, rates, the
    /// spike check (which moves the spike window), curriculum and service figures.
    pub(super) fn finish_record(
        &mut self,
        record: &mut UpdateRecord,
        stats: &UpdateStats,
        started: Instant,
        update_s: f64,
        episodes: usize,
        invalid: u64,
    ) {
        record.step = self.state.rl_step;
        record.policy_version = self.state.policy_version;
        record.unix_ms = now_unix_ms();
        record.update_s = update_s;
        record.rollout.invalid_skipped = invalid;
        record.rollout.copies_skipped = self.collector.take_copies();
        record.rollout.episodes_per_s = self.windowed_episodes_per_s(started, episodes);
        record.rollout.tokens_per_s = stats.total_tokens as f64 / update_s.max(1e-9);
        record.spikes = self.state.spikes.observe(record.loss.policy);
        record.curriculum = self.curriculum_figures();
        record.service = self.service_figures();
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
            rope_factor: match self.active().state().model.config().rope_scaling {
                RopeScaling::None => 1.0,
                RopeScaling::Linear { factor }
                | RopeScaling::Yarn { factor, .. }
                | RopeScaling::HfYarn { factor, .. } => factor,
            },
        }
    }

    fn service_figures(&self) -> ServiceFigures {
        let d = self.shared.control.dispenser.counters();
        ServiceFigures {
            open_groups: self.shared.control.dispenser.open_groups() as u64,
            groups_waiting: self.shared.control.dispenser.waiting() as u64,
            groups_completed: d.groups_completed,
            groups_expired: d.groups_expired,
            episodes_issued: d.episodes_issued,
            episodes_reclaimed: d.episodes_reclaimed,
            actors_active: self.shared.control.actors_active() as u64,
            trajectories_read: self.state.totals.trajectories_read,
            batches_skipped: self.state.totals.batches_skipped,
        }
    }
}
