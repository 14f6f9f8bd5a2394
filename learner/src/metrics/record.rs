//! The metrics schema: [`UpdateRecord`], one line of `metrics.jsonl` per RL update, and the
//! figure groups it is made of. `corvid report` and `corvid run` read these lines back, so a
//! field added later carries `#[serde(default)]` and older files still parse.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use corvid_model::MoeHealth;

/// Success counts of one `family/level`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Rate {
    /// Scored episodes.
    pub episodes: u64,
    /// Of which succeeded.
    pub successes: u64,
    /// `successes / episodes` (0 when there are none).
    pub rate: f64,
}

impl Rate {
    /// Adds one episode.
    pub fn add(&mut self, success: bool) {
        self.episodes += 1;
        self.successes += u64::from(success);
        self.rate = self.successes as f64 / self.episodes as f64;
    }
}

/// What the update trained on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RolloutFigures {
    /// Scored episodes within the staleness bound: what the reward and success figures
    /// describe.
    pub episodes: u64,
    /// Of those, episodes trained on (groups whose advantages are all zero are not).
    pub episodes_trained: u64,
    /// Mean outcome reward of the scored episodes.
    pub reward_mean: f64,
    /// Fraction that succeeded.
    pub success_rate: f64,
    /// Success by `family/level`.
    pub success_by_task: BTreeMap<String, Rate>,
    /// Generated (trained-on) tokens.
    pub tokens: u64,
    /// Episodes consumed per second of wall time since the previous update.
    pub episodes_per_s: f64,
    /// Trained tokens per second of the update's own compute.
    pub tokens_per_s: f64,
    /// Mean policy-version lag of the trained episodes.
    pub staleness_mean: f64,
    /// Largest lag.
    pub staleness_max: u64,
    /// Episodes skipped because they were older than the staleness bound.
    pub stale_skipped: u64,
    /// Episodes left out because they were not scored (infra error, abandoned).
    pub unscored_skipped: u64,
    /// Groups left out because every advantage in them was zero.
    pub uninformative_groups: u64,
    /// Episodes longer than the model's context, left out.
    pub too_long_skipped: u64,
    /// Episodes left out as untrainable (token ids outside the vocabulary, non-finite
    /// behaviour log-probs).
    pub invalid_skipped: u64,
    /// Second copies of episodes read since the previous update, stored but not trained on
    /// (an actor taken for gone finished them after all; absent in metrics written before).
    #[serde(default)]
    pub copies_skipped: u64,
    /// Of the scored episodes, those whose finished conversation the model's chat template
    /// renders otherwise than the ids the policy saw (a template that rewrites history;
    /// the run's start-up note says how). Always 0 in Corvid's byte layout.
    #[serde(default)]
    pub template_divergent_episodes: u64,
    /// Of the scored episodes, those that folded their context at least once (`[rollout.context]`;
    /// absent in metrics written before folding existed).
    #[serde(default)]
    pub folded_episodes: u64,
    /// Their context folds (new segments opened), summed.
    #[serde(default)]
    pub folds: u64,
    /// Mean tokens of a scored episode over all its segments.
    #[serde(default)]
    pub episode_tokens_mean: f64,
}

/// The loss terms and their diagnostics (means over the generated tokens trained on).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LossFigures {
    /// The clipped-surrogate policy loss.
    pub policy: f64,
    /// k3 estimate of KL(π_θ ‖ π_ref) at generated tokens (0 when off).
    pub kl: f64,
    /// Mean entropy of the policy at generated tokens.
    pub entropy: f64,
    /// The MoE balance loss.
    pub balance: f64,
    /// Cross-entropy per demonstration token of the PPO-ptx term (0 when off; absent in
    /// metrics written before it existed).
    #[serde(default)]
    pub ptx: f64,
    /// PPO's `approx_kl`: mean `(r − 1) − log r` with `r = π_θ/π_prox`, how far the
    /// update's optimizer steps moved the policy on its own tokens (0 with one minibatch,
    /// where `π_prox` is `π_θ`; absent in metrics written before it existed).
    #[serde(default)]
    pub approx_kl: f64,
    /// Fraction of tokens clipped at `1 − ε_low` (negative advantage side).
    pub clip_frac_low: f64,
    /// Fraction clipped at `1 + ε_high` (positive advantage side).
    pub clip_frac_high: f64,
    /// Mean truncated importance weight `w = min(π_prox/μ, tis_cap)`.
    pub iw_mean: f64,
    /// Largest `w` (at most `tis_cap`).
    pub iw_max: f64,
    /// Fraction of tokens whose weight was truncated at the cap.
    pub iw_truncated_frac: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Learning rate of the last optimizer step.
    pub lr: f64,
    /// Optimizer steps of the update (0 when nothing was left to train on).
    pub optimizer_steps: u64,
    /// Mean advantage over generated tokens.
    pub adv_mean: f64,
    /// Mean absolute advantage over generated tokens.
    pub adv_abs_mean: f64,
}

/// The loss-spike figures of one update.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpikeFigures {
    /// This update's policy loss was a spike.
    pub spike: bool,
    /// Spikes so far in the run.
    pub count: u64,
    /// Mean of the window the loss was compared with.
    pub window_mean: f64,
    /// Std of that window.
    pub window_std: f64,
}

/// The curriculum after the update.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CurriculumFigures {
    /// Frontier level per family.
    pub frontier: BTreeMap<String, u32>,
    /// Context window of the current stage, tokens.
    pub context_tokens: u32,
    /// The RoPE scaling factor the published policy runs under (1: unscaled; a context stage
    /// scales it with `[rollout.context] stage_rope`). Absent in metrics written before: 1.
    #[serde(default = "one")]
    pub rope_factor: f64,
}

fn one() -> f64 {
    1.0
}

impl Default for CurriculumFigures {
    fn default() -> Self {
        Self {
            frontier: BTreeMap::new(),
            context_tokens: 0,
            rope_factor: 1.0,
        }
    }
}

/// The service side at the update.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServiceFigures {
    /// Groups handed out and not yet completed.
    pub open_groups: u64,
    /// Completed groups waiting for the trainer after this update (they hold new groups
    /// back: tasks, rule 3; absent in metrics written before).
    #[serde(default)]
    pub groups_waiting: u64,
    /// Groups completed so far.
    pub groups_completed: u64,
    /// Groups expired so far.
    pub groups_expired: u64,
    /// Episodes handed out so far, handed-out-again ones included (absent in metrics
    /// written before).
    #[serde(default)]
    pub episodes_issued: u64,
    /// Episodes taken back from silent actors and handed out again, so far.
    #[serde(default)]
    pub episodes_reclaimed: u64,
    /// Actors heard from within `[rollout] actor_timeout_s`.
    pub actors_active: u64,
    /// Finished trajectories the trainer has read from the store, over the whole run.
    pub trajectories_read: u64,
    /// Batches consumed without an update (no scored episode), over the whole run.
    #[serde(default)]
    pub batches_skipped: u64,
}

/// The learner against the actors on the trained tokens, `Δ = log π_old − log μ` (the
/// learner's log-prob before the update minus the actor's), over generated tokens.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MismatchFigures {
    /// k3 estimate of `KL(μ ‖ π_old)`, mean `e^Δ − 1 − Δ` (the R3 paper's train–rollout KL).
    pub k3_kl: f64,
    /// Mean `e^|Δ|` (NeMo-RL's `token_mult_prob_error`; 1 when the sides agree).
    pub token_mult_prob_error: f64,
    /// Mean `|Δ|`.
    pub logp_abs_diff_mean: f64,
    /// Largest `|Δ|`.
    pub logp_abs_diff_max: f64,
    /// Fraction of tokens with `π_old/μ > 2`.
    pub ratio_above_2_frac: f64,
    /// `k3_kl` over the tokens generated by the weights of `π_old` itself (their step's
    /// `policy_version` is the learner's): the numerics' share of the mismatch, without the
    /// policy's own change since older tokens were generated. `None` when no such token
    /// was trained on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k3_kl_lag0: Option<f64>,
    /// The tokens `k3_kl_lag0` is over.
    #[serde(default)]
    pub lag0_tokens: u64,
    /// Fraction of (token, MoE layer) pairs where the learner before the update chose the
    /// same top-k set as the actor's recorded routes; `None` when no trajectory trained on
    /// carried routes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_agreement: Option<f64>,
    /// Mean `|learner ∩ actor| / k` over the same pairs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_overlap: Option<f64>,
    /// The two per MoE layer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routing_layers: Vec<LayerRouting>,
    /// Trajectories trained on without recorded routes (their tokens are not in the
    /// agreement; a replay run trains them on the learner's own routing).
    #[serde(default)]
    pub without_routes: usize,
}

/// Routing agreement of one MoE layer ([`MismatchFigures::routing_agreement`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LayerRouting {
    /// The layer's index in the model.
    pub layer: i64,
    /// Fraction of tokens with equal top-k sets.
    pub agreement: f64,
    /// Mean `|learner ∩ actor| / k`.
    pub overlap: f64,
}

/// One line of the metrics file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UpdateRecord {
    /// RL update index (1-based).
    pub step: u64,
    /// Policy version published after the update.
    pub policy_version: u64,
    /// Wall clock, ms since the Unix epoch.
    pub unix_ms: u64,
    /// Seconds the update took.
    pub update_s: f64,
    /// What was trained on.
    pub rollout: RolloutFigures,
    /// Loss terms.
    pub loss: LossFigures,
    /// Train–rollout mismatch.
    #[serde(default)]
    pub mismatch: MismatchFigures,
    /// MoE health per layer.
    pub moe: Vec<MoeHealth>,
    /// Loss spikes.
    pub spikes: SpikeFigures,
    /// Curriculum.
    pub curriculum: CurriculumFigures,
    /// Service.
    pub service: ServiceFigures,
}
