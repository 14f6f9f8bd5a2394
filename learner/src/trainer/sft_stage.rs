//! The SFT stage of the [`Trainer`]: supervised steps on the `[sft]` demonstration stream,
//! one `sft.jsonl` line each, the held-out loss every `sft.eval_every` steps, and at the end
//! the handover of the weights to RL, which takes them as its frozen reference policy.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tch::nn;

use super::{ActiveTrainer, Trainer};
use crate::checkpoint::{write_policy, RunState, Stage};
use crate::config::LearnerConfig;
use crate::learner::{io_err, LearnerError};
use crate::metrics::MetricsSink;
use crate::sft_data::SftData;
use crate::train::config::SftConfig;
use crate::train::pack::PackedRow;
use crate::train::sft::SftTrainer;
use crate::train::TrainState;
use corvid_model::MoePolicy;
use corvid_store::now_unix_ms;

/// SFT progress lines go here, beside the RL metrics file.
pub const SFT_METRICS_FILE: &str = "sft.jsonl";

/// SFT steps between progress logs.
const SFT_LOG_EVERY: u64 = 10;

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

impl Trainer {
    /// The SFT trainer over `(vs, model)`, at the tokens seen and held-out loss of `state`.
    pub(super) fn sft_trainer(
        cfg: &LearnerConfig,
        vs: nn::VarStore,
        model: MoePolicy,
        state: &RunState,
    ) -> Result<SftTrainer, LearnerError> {
        let sft = SftConfig {
            train: cfg.train.clone(),
            ..cfg.sft.clone()
        };
        let mut t = SftTrainer::new(vs, model, sft)?;
        t.set_tokens_seen(state.sft_tokens);
        if let Some(loss) = state.sft_heldout_loss {
            t.record_heldout_loss(loss);
        }
        Ok(t)
    }

    /// The SFT stage's data stream and log, made once per process (`None` once SFT is done
    /// or when the schedule has none).
    pub fn sft_run(&self) -> Result<Option<SftRun>, LearnerError> {
        let Some(ActiveTrainer::Sft(t)) = &self.active else {
            return Ok(None);
        };
        let tokens_at_start = t.tokens_seen();
        let families = self.cfg.families()?;
        let data = SftData::new(&self.cfg.sft, &families, self.cfg.episode_format()?)
            .map_err(|e| LearnerError::Sft(e.to_string()))?
            .folding(
                self.cfg.sft_context(),
                self.cfg.rollout.sampling.max_new_tokens,
            );
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
        let Some(ActiveTrainer::Sft(t)) = self.active.as_mut() else {
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
        if let Some(ActiveTrainer::Sft(t)) = self.active.as_mut() {
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
        // Only an SFT stage hands over; any other stage keeps its trainer.
        if !matches!(self.active, Some(ActiveTrainer::Sft(_))) {
            return Ok(());
        }
        let Some(ActiveTrainer::Sft(t)) = self.active.take() else {
            return Ok(());
        };
        self.state.sft_tokens = t.tokens_seen();
        self.state.sft_heldout_loss = t.heldout_loss();
        let TrainState { vs, model, .. } = t.into_state();
        write_policy(
            &self.paths.reference,
            &vs,
            &self.model_cfg,
            self.paths.hf_origin.as_deref(),
        )?;
        self.state.reference_policy = Some(self.paths.reference.clone());
        self.state.stage = Stage::Rl;
        let rl = Self::rl_trainer(&self.cfg, &self.model_cfg, vs, model, &self.state)?;
        self.active = Some(ActiveTrainer::Rl(Box::new(rl)));
        Ok(())
    }
}
