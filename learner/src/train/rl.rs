//! Policy optimisation from stored trajectories: one [`RlTrainer::train`] per policy version.
//!
//! An update:
//! 1. [`batch::select`](super::batch::select) drops stale and unscored trajectories and
//!    computes per-token advantages (step-level by default). The caller does this for the
//!    whole batch ([`RlTrainer::update`] does it for a caller that has no other use for it).
//! 2. The kept trajectories are split into `minibatches` (one optimizer step each); each
//!    minibatch is laid out one context segment per row (one row for a trajectory that never
//!    folded; every segment carries the episode's advantages), longest first, and run in micro-batches
//!    of at most `micro_batch_tokens` tokens (rows × the longest, padding included; causal
//!    forward, no document mask), gradients accumulated, so memory stays bounded on long
//!    trajectories.
//! 3. With several minibatches, `log π_prox` (the policy before the update) is computed for
//!    every token first, without gradients; with one it is the forward's own log-prob,
//!    detached. `log π_ref` is scored the same way for the KL term.
//! 4. Per micro-batch, the loss of [`super::loss`] (`rl_loss`, one chunk of positions at a
//!    time through [`corvid_model::head`]):
//!    `Σ_i [−w·min(r·A, clip(r)·A) − c_H·H + c_KL·KL_k3]_i / N + c_bal·L_balance·(rows/rows_mb)`
//!    with `N` the generated tokens of the minibatch; the token sums behind the statistics are
//!    named fields of `TokenSums`. A trajectory with a segment longer than `[train]
//!    max_train_tokens` or the model's context is skipped and counted.
//! 5. With `ptx_coef > 0` and demonstrations given, the
//!    minibatch's share of them adds `c_ptx · Σ_j −log π_θ(y_j) / N_demo` over their
//!    assistant tokens (PPO-ptx; temperature 1, as in SFT). Then AdamW, then the router-bias
//!    balance step.
//!
//! Log-probs are taken at each trajectory's sampling temperature (`softmax(logits / T)`, as
//! the sampler did); top-p truncation is not replayed, so with `top_p < 1` the behaviour
//! log-prob is that of the renormalised nucleus and `w` is slightly below the true ratio.

use tch::{nn, Kind, Tensor};

use std::ops::Range;

use super::batch::{select, Group, Scored, Selection};
use super::config::{RlConfig, RouterReplay};
use super::loss::{
    clip_masks, clipped_surrogate, importance_ratio, k3_kl, token_sum_over,
    truncated_importance_weight,
};
use super::pack::{gather_trained, micro_batches, PackedBatch, PackedRow, RoutedScores};
use super::state::TrainState;
use super::TrainError;
use crate::metrics::{LayerRouting, MismatchFigures};
use corvid_model::routes::merge_agreement;
use corvid_model::{
    BalanceStats, MoeHealth, MoePolicy, RopeScaling, RouteAgreement, RouteOpts, TokenScores,
};
use corvid_proto::RouteShape;

/// What one update did; every field is a mean over the generated tokens trained on unless
/// said otherwise.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpdateStats {
    /// Policy-gradient loss `L_pg` per token.
    pub policy_loss: f64,
    /// k3 KL to the reference per token (0 when `kl_coef = 0`).
    pub kl: f64,
    /// Policy entropy per token (nats).
    pub entropy: f64,
    /// MoE balance loss, mean over micro-batches.
    pub aux_loss: f64,
    /// Cross-entropy per demonstration token of the PPO-ptx term (0 when off).
    pub ptx_loss: f64,
    /// Demonstration tokens trained on by the PPO-ptx term.
    pub ptx_tokens: usize,
    /// Fraction of tokens with `A < 0` and `r < 1 − clip_low`.
    pub clip_frac_low: f64,
    /// Fraction of tokens with `A > 0` and `r > 1 + clip_high`.
    pub clip_frac_high: f64,
    /// PPO's `approx_kl`: mean `(r − 1) − log r`, `r = π_θ/π_prox` (0 with one minibatch).
    pub approx_kl: f64,
    /// Train–rollout mismatch, over the generated tokens trained on: the learner's log-prob
    /// before the update against the actor's (`Δ = log π_old − log μ`). With lag 0 it is the
    /// two sides' numerics; a lagged trajectory adds the policy's own change.
    pub mismatch: MismatchFigures,
    /// Mean truncated importance weight `w`.
    pub is_weight_mean: f64,
    /// Largest `w` (at most `tis_cap`).
    pub is_weight_max: f64,
    /// Fraction of tokens whose weight was truncated at `tis_cap`.
    pub is_truncated_frac: f64,
    /// Mean pre-clip gradient norm over the update's optimizer steps.
    pub grad_norm: f64,
    /// Learning rate of the last optimizer step.
    pub lr: f64,
    /// Optimizer steps taken (0 when nothing was left to train on).
    pub optimizer_steps: usize,
    /// Generated tokens trained on.
    pub tokens: usize,
    /// All tokens of the trained trajectories (context included).
    pub total_tokens: usize,
    /// Trajectories trained on.
    pub trajectories_used: usize,
    /// Groups with at least one trajectory trained on.
    pub groups_used: usize,
    /// Trajectories skipped as older than the staleness bound.
    pub stale_skipped: usize,
    /// Trajectories excluded for an unscored termination (infra_error, abandoned).
    pub unscored_excluded: usize,
    /// Groups dropped because all their advantages were zero.
    pub uninformative_groups: usize,
    /// Trajectories skipped for a segment longer than the model's context.
    pub too_long_skipped: usize,
    /// Largest version lag among trajectories trained on.
    pub max_lag: u64,
    /// Mean version lag among trajectories trained on.
    pub mean_lag: f64,
    /// Mean outcome reward of the scored, fresh trajectories (uninformative groups
    /// included: they are part of what the policy achieved).
    pub mean_reward: f64,
    /// Success rate of the same trajectories.
    pub success_rate: f64,
    /// Mean advantage over generated tokens.
    pub adv_mean: f64,
    /// Mean absolute advantage over generated tokens.
    pub adv_abs_mean: f64,
    /// MoE health per layer, from the update's last micro-batch.
    pub health: Vec<MoeHealth>,
}

impl UpdateStats {
    /// The selection's counts, before any training.
    fn selected(sel: &Selection<'_>, lr: f64) -> Self {
        let per_scored = |x: f64| {
            if sel.scored > 0 {
                x / sel.scored as f64
            } else {
                0.0
            }
        };
        UpdateStats {
            groups_used: sel.groups_used,
            stale_skipped: sel.stale_skipped,
            unscored_excluded: sel.unscored_excluded,
            uninformative_groups: sel.uninformative_groups,
            max_lag: sel.max_lag,
            mean_lag: sel.mean_lag,
            mean_reward: per_scored(sel.reward_sum),
            success_rate: per_scored(sel.successes as f64),
            lr,
            ..UpdateStats::default()
        }
    }
}

/// One micro-batch, ready to run: the packed rows as tensors and the per-token inputs of the
/// loss at the trained-on positions (`[N]`).
#[derive(Debug)]
struct MicroBatch {
    batch: PackedBatch,
    rows: usize,
    logp_behaviour_n: Tensor,
    /// 1 where the token was generated by the weights of `π_old` (lag 0), else 0.
    lag0_n: Tensor,
    adv_n: Tensor,
    inv_temp_n1: Tensor,
    /// `log π_prox` per token, when it is not `π_θ` itself (several minibatches).
    logp_prox_n: Option<Tensor>,
    /// `log π_ref` per token, with a KL term.
    logp_ref_n: Option<Tensor>,
    /// The actors' recorded routes `[B, T, L, k]`, when some row carries them.
    actor_routes: Option<Tensor>,
    /// R2: the learner's own choice in the π_prox pass `[B, T, L, k]`.
    old_routes: Option<Tensor>,
}

/// A learner pass over a micro-batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// `π_prox`, the policy before the update (several minibatches).
    Prox,
    /// `π_ref`, the frozen reference.
    Ref,
    /// `π_θ`, the update's forward and backward.
    Update,
}

/// The routes pass `pass` of a micro-batch uses under `mode`. The pass that defines `π_old`
/// (`measured`) compares with the actors' routes for the agreement whatever the mode.
fn pass_routes<'a>(
    mode: RouterReplay,
    pass: Pass,
    measured: bool,
    actor: Option<&'a Tensor>,
    old: Option<&'a Tensor>,
) -> RouteOpts<'a> {
    let compare = RouteOpts {
        given_btlk: actor.filter(|_| measured),
        ..RouteOpts::default()
    };
    match (mode, pass) {
        // R3: the actors' selection in every pass.
        (RouterReplay::Rollout, _) => RouteOpts {
            given_btlk: actor,
            replay: actor.is_some(),
            record: false,
        },
        // R2: π_prox records the learner's own choice; the update's minibatches replay it.
        (RouterReplay::Old, Pass::Prox) => RouteOpts {
            record: true,
            ..compare
        },
        (RouterReplay::Old, Pass::Update) if old.is_some() => RouteOpts {
            given_btlk: old,
            replay: true,
            record: false,
        },
        (_, Pass::Ref) => RouteOpts::default(),
        _ => compare,
    }
}

/// Sums over the update's generated tokens, divided by their count into [`UpdateStats`].
#[derive(Debug, Default)]
struct TokenSums {
    policy_loss: f64,
    kl: f64,
    entropy: f64,
    clip_low: f64,
    clip_high: f64,
    approx_kl: f64,
    is_weight: f64,
    is_truncated: f64,
    adv: f64,
    adv_abs: f64,
    is_weight_max: f64,
    mismatch_k3_kl: f64,
    mult_prob_error: f64,
    logp_abs_diff: f64,
    logp_abs_diff_max: f64,
    ratio_above_2: f64,
    mismatch_k3_kl_lag0: f64,
    lag0_tokens: f64,
    /// Per MoE layer, the learner before the update against the actors' routes.
    agreement: Vec<RouteAgreement>,
    /// Balance loss summed over micro-batches, and their count.
    aux_loss: f64,
    micro_batches: usize,
    /// Summed NLL of the PPO-ptx demonstration tokens.
    ptx_nll: f64,
}

impl TokenSums {
    fn write_means(&self, st: &mut UpdateStats) {
        let n = st.tokens.max(1) as f64;
        st.policy_loss = self.policy_loss / n;
        st.kl = self.kl / n;
        st.entropy = self.entropy / n;
        st.clip_frac_low = self.clip_low / n;
        st.clip_frac_high = self.clip_high / n;
        st.approx_kl = self.approx_kl / n;
        st.is_weight_mean = self.is_weight / n;
        st.is_truncated_frac = self.is_truncated / n;
        st.adv_mean = self.adv / n;
        st.adv_abs_mean = self.adv_abs / n;
        st.is_weight_max = self.is_weight_max;
        let routed: i64 = self.agreement.iter().map(|a| a.tokens).sum();
        let share = |x: f64| (routed > 0).then(|| x / routed as f64);
        st.mismatch = MismatchFigures {
            k3_kl: self.mismatch_k3_kl / n,
            token_mult_prob_error: self.mult_prob_error / n,
            logp_abs_diff_mean: self.logp_abs_diff / n,
            logp_abs_diff_max: self.logp_abs_diff_max,
            ratio_above_2_frac: self.ratio_above_2 / n,
            k3_kl_lag0: (self.lag0_tokens > 0.0)
                .then(|| self.mismatch_k3_kl_lag0 / self.lag0_tokens),
            lag0_tokens: self.lag0_tokens as u64,
            routing_agreement: share(self.agreement.iter().map(|a| a.equal as f64).sum()),
            routing_overlap: share(self.agreement.iter().map(|a| a.overlap).sum()),
            routing_layers: self
                .agreement
                .iter()
                .filter(|a| a.tokens > 0)
                .map(|a| LayerRouting {
                    layer: a.layer,
                    agreement: a.agreement(),
                    overlap: a.overlap_mean(),
                })
                .collect(),
            without_routes: st.mismatch.without_routes,
        };
        st.aux_loss = self.aux_loss / self.micro_batches.max(1) as f64;
        st.ptx_loss = self.ptx_nll / st.ptx_tokens.max(1) as f64;
    }
}

/// The RL loss of the trained-on tokens `range` of `mb`, from their scores under `π_θ`
/// (with gradients), every term of [`super::loss`] over `N = denom` tokens of the minibatch:
/// `Σ_i [−w·min(r·A, clip(r)·A) − c_H·H + c_KL·KL_k3]_i / N`. Adds the terms into `sums`.
fn rl_loss(
    c: &RlConfig,
    mb: &MicroBatch,
    range: Range<i64>,
    scores: &TokenScores,
    denom: f64,
    sums: &mut TokenSums,
) -> Result<Tensor, tch::TchError> {
    let part = |x: &Tensor| x.narrow(0, range.start, range.end - range.start);
    let logp_new = &scores.logp_n;
    let adv = part(&mb.adv_n);
    let logp_prox = match &mb.logp_prox_n {
        Some(p) => part(p),
        None => logp_new.detach(),
    };
    // r = π_θ/π_prox ; w = min(π_prox/μ, C)
    let ratio = importance_ratio(logp_new, &logp_prox);
    let (w, truncated) =
        truncated_importance_weight(&logp_prox, &part(&mb.logp_behaviour_n), c.tis_cap);
    // L_pg = −w · min(r·A, clip(r, 1−ε_low, 1+ε_high)·A)
    let pg = &w * clipped_surrogate(&ratio, &adv, c.clip_low, c.clip_high);
    let ent = &scores.entropy_n;
    let kl = match &mb.logp_ref_n {
        Some(r) => k3_kl(logp_new, &part(r)),
        None => logp_new.zeros_like(),
    };
    let loss = token_sum_over(&pg, denom) - token_sum_over(ent, denom) * c.entropy_coef
        + token_sum_over(&kl, denom) * c.kl_coef;
    let (low, high) = clip_masks(&ratio, &adv, c.clip_low, c.clip_high);
    // approx_kl = (r − 1) − log r, the k3 estimate of KL(π_prox ‖ π_θ) on these tokens.
    let log_r = logp_new.detach() - &logp_prox;
    let approx_kl = log_r.exp() - 1.0 - &log_r;
    // Mismatch: Δ = log π_old − log μ, π_old being π_prox (the policy before this update).
    let delta = &logp_prox - part(&mb.logp_behaviour_n);
    let abs_delta = delta.abs();
    let mismatch_k3 = delta.exp() - 1.0 - &delta;
    let lag0 = part(&mb.lag0_n);
    let f = |x: &Tensor| x.detach().to_kind(Kind::Double).sum(Kind::Double);
    let v = Vec::<f64>::try_from(&Tensor::stack(
        &[
            f(&pg),
            f(&kl),
            f(ent),
            f(&low),
            f(&high),
            f(&w),
            f(&truncated),
            f(&adv),
            f(&adv.abs()),
            w.max().to_kind(Kind::Double),
            f(&approx_kl),
            f(&mismatch_k3),
            f(&abs_delta.exp()),
            f(&abs_delta),
            abs_delta.max().to_kind(Kind::Double),
            f(&delta.exp().gt(2.0)),
            f(&(&mismatch_k3 * &lag0)),
            f(&lag0),
        ],
        0,
    ))?;
    sums.policy_loss += v[0];
    sums.kl += v[1];
    sums.entropy += v[2];
    sums.clip_low += v[3];
    sums.clip_high += v[4];
    sums.is_weight += v[5];
    sums.is_truncated += v[6];
    sums.adv += v[7];
    sums.adv_abs += v[8];
    sums.is_weight_max = sums.is_weight_max.max(v[9]);
    sums.approx_kl += v[10];
    sums.mismatch_k3_kl += v[11];
    sums.mult_prob_error += v[12];
    sums.logp_abs_diff += v[13];
    sums.logp_abs_diff_max = sums.logp_abs_diff_max.max(v[14]);
    sums.ratio_above_2 += v[15];
    sums.mismatch_k3_kl_lag0 += v[16];
    sums.lag0_tokens += v[17];
    Ok(loss)
}

/// Per-token RL inputs of a packed row (aligned with `row`: entry `i` is about target `i`).
struct RlRow {
    row: PackedRow,
    behaviour: Vec<f32>,
    /// 1 where the target was generated at the learner's current version.
    lag0: Vec<f32>,
    adv: Vec<f32>,
    inv_temp: Vec<f32>,
}

/// Lays out trajectories (their tokens, generated mask, behaviour log-probs, token
/// advantages and recorded routes) one context segment per row (one row for an episode that
/// never folded), longest first, so that a micro-batch holds rows of similar length and runs
/// the causal forward without a document mask.
fn pack_trajectories(
    items: &[&Scored<'_>],
    pad_id: u32,
    routes: Option<RouteShape>,
    current_version: u64,
) -> Vec<RlRow> {
    let mut rows: Vec<RlRow> = items
        .iter()
        .flat_map(|s| segment_rows(s, pad_id, routes, current_version))
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.row.len()));
    rows
}

/// The route shape of `model`'s MoE layers (`None` for a dense model).
fn route_shape(model: &MoePolicy) -> Option<RouteShape> {
    let c = model.config();
    RouteShape::of_moe(c.n_moe_layers(), c.num_experts_per_tok, c.n_routed_experts)
}

/// Whether a trajectory carries a route row of the learner's shape `want` for every input
/// position of each segment but its last (counted without unpacking them).
fn has_routes(t: &corvid_proto::Trajectory, want: Option<RouteShape>) -> bool {
    want.is_some_and(|w| {
        t.header.routes == Some(w)
            && t.steps.iter().map(|s| s.routes.len()).sum::<usize>()
                == t.len().saturating_sub(t.segments().len()) * w.bytes_per_token()
    })
}

/// The longest context segment of a trajectory, tokens: its longest training row.
fn longest_segment(t: &corvid_proto::Trajectory) -> usize {
    t.segments()
        .into_iter()
        .map(|r| t.steps[r].iter().map(|s| s.token_ids.len()).sum())
        .max()
        .unwrap_or(0)
}

/// A trajectory's rows, one per context segment, each of its own length; `current_version`
/// is the learner's. The advantages are the trajectory's, token for token, whatever segment a
/// token lies in (the credit rule made them over the whole episode). A segment's routes are
/// its steps' rows, `-1` for its last position, when the trajectory carries routes of the
/// learner's shape `routes` ([`has_routes`]).
fn segment_rows(
    s: &Scored<'_>,
    pad_id: u32,
    routes: Option<RouteShape>,
    current_version: u64,
) -> Vec<RlRow> {
    let t = s.trajectory;
    let shape = routes.filter(|_| has_routes(t, routes));
    let temp = t.header.sampling.temperature;
    let inv = if temp > 0.0 { 1.0 / temp } else { 1.0 };
    let mut out = Vec::new();
    // Where the segment's first token lies in the trajectory.
    let mut offset = 0;
    for seg in t.segments() {
        let steps = &t.steps[seg];
        let ids: Vec<u32> = steps.iter().flat_map(|st| st.token_ids.clone()).collect();
        let len = ids.len();
        let mask: Vec<bool> = steps.iter().flat_map(|st| st.loss_mask.clone()).collect();
        let logp: Vec<f32> = steps.iter().flat_map(|st| st.logprobs.clone()).collect();
        let version: Vec<u64> = steps
            .iter()
            .flat_map(|st| std::iter::repeat_n(st.policy_version, st.token_ids.len()))
            .collect();
        let mut row = PackedRow::single(&ids, &mask, pad_id);
        if let Some(shape) = shape {
            let mut ids: Vec<i32> = steps
                .iter()
                .flat_map(|st| shape.unpack(&st.routes))
                .map(i32::from)
                .collect();
            ids.resize(len * shape.ids_per_token(), -1);
            row.routes = ids;
        }
        let mut r = RlRow {
            row,
            behaviour: vec![0.0; len],
            lag0: vec![0.0; len],
            adv: vec![0.0; len],
            inv_temp: vec![1.0; len],
        };
        // Position `j` predicts token `j + 1`.
        for j in 0..len.saturating_sub(1) {
            r.behaviour[j] = logp[j + 1];
            r.lag0[j] = f32::from(u8::from(version[j + 1] == current_version));
            r.adv[j] = s.token_advantages[offset + j + 1] as f32;
            r.inv_temp[j] = inv;
        }
        out.push(r);
        offset += len;
    }
    out
}

/// The trainer: owns the policy, its parameters, the optimizer and the frozen reference.
#[derive(Debug)]
pub struct RlTrainer {
    state: TrainState,
    reference: Option<(nn::VarStore, MoePolicy)>,
    cfg: RlConfig,
    /// The episode format's pad id (the last target of every row).
    pad_id: u32,
}

impl RlTrainer {
    /// A trainer for `model` (parameters in `vs`). `reference` is the frozen SFT policy for
    /// the KL term; it is required when `cfg.kl_coef > 0` and unused otherwise.
    pub fn new(
        vs: nn::VarStore,
        mut model: MoePolicy,
        reference: Option<(nn::VarStore, MoePolicy)>,
        cfg: RlConfig,
        pad_id: u32,
    ) -> Result<Self, TrainError> {
        cfg.validate()?;
        if model.disable_router_noise() {
            tracing::info!(
                "router_noise_std is off in RL: the ratio and the KL compare policies scored without it"
            );
        }
        if cfg.kl_coef > 0.0 && reference.is_none() {
            return Err(TrainError::Config {
                field: "kl_coef",
                value: cfg.kl_coef.to_string(),
                why: "a KL penalty needs the reference policy (none given)",
            });
        }
        let reference = reference.map(|(mut rvs, m)| {
            rvs.freeze();
            (rvs, m)
        });
        Ok(Self {
            state: TrainState::new(vs, model, cfg.optim.clone())?,
            reference,
            cfg,
            pad_id,
        })
    }

    /// Builds the micro-batches of one minibatch.
    fn micro_batches(
        &self,
        items: &[&Scored<'_>],
        current_version: u64,
    ) -> Result<Vec<MicroBatch>, TrainError> {
        let rows = pack_trajectories(
            items,
            self.pad_id,
            route_shape(&self.state.model),
            current_version,
        );
        let device = self.state.device();
        let mut out = Vec::new();
        for chunk in micro_batches(&rows, |r| r.row.len(), self.cfg.micro_batch_tokens) {
            let refs: Vec<&PackedRow> = chunk.iter().map(|r| &r.row).collect();
            let batch = PackedBatch::new(&refs, device)?;
            let n = batch.n_trained as i64;
            out.push(MicroBatch {
                rows: chunk.len(),
                logp_behaviour_n: gather_trained(&refs, |ri, i| chunk[ri].behaviour[i])
                    .to_device(device),
                lag0_n: gather_trained(&refs, |ri, i| chunk[ri].lag0[i]).to_device(device),
                adv_n: gather_trained(&refs, |ri, i| chunk[ri].adv[i]).to_device(device),
                inv_temp_n1: gather_trained(&refs, |ri, i| chunk[ri].inv_temp[i])
                    .to_device(device)
                    .view([n, 1]),
                logp_prox_n: None,
                logp_ref_n: None,
                actor_routes: batch.recorded_routes(&self.state.model)?,
                old_routes: None,
                batch,
            });
        }
        Ok(out)
    }

    /// One policy update on `groups` (see the module doc): [`select`] at
    /// `current_version`, then [`RlTrainer::train`].
    pub fn update(
        &mut self,
        groups: &[Group],
        current_version: u64,
    ) -> Result<UpdateStats, TrainError> {
        self.update_mixed(groups, current_version, &[])
    }

    /// [`RlTrainer::update`] with demonstrations for the PPO-ptx term.
    pub fn update_mixed(
        &mut self,
        groups: &[Group],
        current_version: u64,
        demos: &[PackedRow],
    ) -> Result<UpdateStats, TrainError> {
        let sel = select(groups, current_version, &self.cfg)?;
        self.train(&sel, demos, true)
    }

    /// The loss and its backward pass exactly as [`RlTrainer::update_mixed`] computes them,
    /// but no optimizer or balance step: the gradients (of every minibatch, summed) stay in
    /// the parameters. For tests and diagnostics; `optimizer_steps` is 0.
    pub fn backward_only(
        &mut self,
        groups: &[Group],
        current_version: u64,
        demos: &[PackedRow],
    ) -> Result<UpdateStats, TrainError> {
        let sel = select(groups, current_version, &self.cfg)?;
        self.train(&sel, demos, false)
    }

    /// Trains on a selection (its trajectories and their advantages, made by [`select`]):
    /// one optimizer step per minibatch when `take_steps`, else gradients only. `demos`
    /// (packed rows, trained on where their loss mask is set) are split across the
    /// minibatches for the PPO-ptx term, ignored when `ptx_coef = 0`. With nothing left to
    /// train on it takes no step and says so (`optimizer_steps = 0`).
    pub fn train(
        &mut self,
        sel: &Selection<'_>,
        demos: &[PackedRow],
        take_steps: bool,
    ) -> Result<UpdateStats, TrainError> {
        self.state.opt.zero_grad();
        let mut st = UpdateStats::selected(sel, self.state.opt.current_lr());
        // A segment (a row) longer than the context (or `max_train_tokens`) is skipped and
        // counted with its trajectory.
        let max_pos = self.state.model.config().max_position_embeddings as usize;
        let max_len = match self.cfg.train.max_train_tokens {
            0 => max_pos,
            n => n.min(max_pos),
        };
        let (fit, too_long): (Vec<&Scored<'_>>, Vec<&Scored<'_>>) = sel
            .trajectories
            .iter()
            .partition(|s| longest_segment(s.trajectory) <= max_len);
        st.too_long_skipped = too_long.len();
        // Trainable = at least one generated token that is a target (not the first token).
        let fit: Vec<&Scored<'_>> = fit
            .into_iter()
            .filter(|s| {
                s.trajectory
                    .steps
                    .iter()
                    .flat_map(|x| x.loss_mask.iter())
                    .skip(1)
                    .any(|m| *m)
            })
            .collect();
        if fit.is_empty() {
            return Ok(st);
        }
        let want = route_shape(&self.state.model);
        st.mismatch.without_routes = fit
            .iter()
            .filter(|s| !has_routes(s.trajectory, want))
            .count();
        if st.mismatch.without_routes > 0 && self.cfg.router_replay == RouterReplay::Rollout {
            tracing::warn!(
                trajectories = st.mismatch.without_routes,
                "router_replay = \"rollout\": trajectories without recorded routes train on the learner's own routing"
            );
        }
        let n_mini = self.cfg.minibatches.min(fit.len());
        let per_mini = fit.len().div_ceil(n_mini);
        let mut minis: Vec<Vec<MicroBatch>> = fit
            .chunks(per_mini)
            .map(|c| self.micro_batches(c, sel.current_version))
            .collect::<Result<_, _>>()?;
        let mut sums = TokenSums::default();
        // π_prox: the policy before this update's first step.
        if minis.len() > 1 {
            for mb in minis.iter_mut().flatten() {
                let s = self.score(&self.state.model, mb, Pass::Prox)?;
                merge_agreement(&mut sums.agreement, &s.agreement);
                mb.logp_prox_n = Some(s.scores.logp_n);
                // Kept on the host until the update's forward routes by them.
                mb.old_routes = s
                    .routes_btlk
                    .map(|r| r.to_device(tch::Device::Cpu).to_kind(Kind::Int));
            }
        }
        // π_ref: the frozen reference, for the KL term.
        if let (Some((_, r)), true) = (&self.reference, self.cfg.kl_coef > 0.0) {
            for mb in minis.iter_mut().flatten() {
                mb.logp_ref_n = Some(self.score(r, mb, Pass::Ref)?.scores.logp_n);
            }
        }
        // PPO-ptx: each minibatch's share of the demonstrations.
        let demo_shares: Vec<&[PackedRow]> = if self.cfg.ptx_coef > 0.0 && !demos.is_empty() {
            demos.chunks(demos.len().div_ceil(minis.len())).collect()
        } else {
            Vec::new()
        };
        let mut grad_norm_sum = 0.0;
        // With one minibatch π_old is the update's own forward: it measures the agreement.
        let update_is_old = minis.len() == 1;
        for (mi, mbs) in minis.iter().enumerate() {
            let demos = demo_shares.get(mi).copied().unwrap_or_default();
            let Some(balance) =
                self.minibatch_backward(mbs, demos, update_is_old, &mut sums, &mut st)?
            else {
                continue;
            };
            if !take_steps {
                grad_norm_sum = self.state.opt.grad_norm();
                continue;
            }
            // AdamW zeroes the gradients for the next minibatch.
            let s = self.state.opt.step()?;
            if self.cfg.update_balance_bias {
                self.state.model.update_balance(&balance)?;
            }
            grad_norm_sum += s.grad_norm;
            st.lr = s.lr;
            st.optimizer_steps += 1;
        }
        sums.write_means(&mut st);
        st.grad_norm = grad_norm_sum / st.optimizer_steps.max(1) as f64;
        st.trajectories_used = fit.len();
        st.total_tokens = fit.iter().map(|s| s.trajectory.len()).sum();
        Ok(st)
    }

    /// `log π(target)` of every trained-on token of `mb` under `model`, without gradients,
    /// routed as `pass` is under `[rl] router_replay`.
    fn score(
        &self,
        model: &MoePolicy,
        mb: &MicroBatch,
        pass: Pass,
    ) -> Result<RoutedScores, TrainError> {
        let routes = pass_routes(
            self.cfg.router_replay,
            pass,
            pass == Pass::Prox,
            mb.actor_routes.as_ref(),
            mb.old_routes.as_ref(),
        );
        Ok(mb
            .batch
            .score_routed(model, &mb.inv_temp_n1, &self.cfg.train, routes)?)
    }

    /// The gradients of one minibatch's loss (its trajectories and its share of the
    /// demonstrations), added into the parameters; returns the balance statistics of its
    /// forwards, or `None` when it has no generated token to train on.
    fn minibatch_backward(
        &self,
        mbs: &[MicroBatch],
        demos: &[PackedRow],
        update_is_old: bool,
        sums: &mut TokenSums,
        st: &mut UpdateStats,
    ) -> Result<Option<BalanceStats>, TrainError> {
        let c = &self.cfg;
        let n_tokens: usize = mbs.iter().map(|m| m.batch.n_trained).sum();
        let n_rows: usize = mbs.iter().map(|m| m.rows).sum();
        if n_tokens == 0 {
            return Ok(None);
        }
        let mut balance = BalanceStats::default();
        for mb in mbs.iter().filter(|mb| mb.batch.n_trained > 0) {
            let aux_weight = c.aux_loss_scale * mb.rows as f64 / n_rows as f64;
            let routes = pass_routes(
                c.router_replay,
                Pass::Update,
                update_is_old,
                mb.actor_routes.as_ref(),
                mb.old_routes.as_ref(),
            );
            let trained = mb.batch.train_routed(
                &self.state.model,
                &mb.inv_temp_n1,
                &c.train,
                aux_weight,
                routes,
                |range, scores| Ok(rl_loss(c, mb, range, scores, n_tokens as f64, sums)?),
            )?;
            if update_is_old {
                merge_agreement(&mut sums.agreement, &trained.agreement);
            }
            sums.aux_loss += trained.aux_loss;
            sums.micro_batches += 1;
            balance.merge(&trained.balance);
            st.health = trained.health;
            st.tokens += mb.batch.n_trained;
        }
        // L_ptx = c_ptx · Σ_j −log π_θ(y_j) / N_demo over this share's demonstrations.
        let n_demo: usize = demos.iter().map(PackedRow::trained_tokens).sum();
        for chunk in micro_batches(demos, PackedRow::len, c.micro_batch_tokens) {
            let refs: Vec<&PackedRow> = chunk.iter().collect();
            let b = PackedBatch::new(&refs, self.state.device())?;
            if b.n_trained == 0 {
                continue;
            }
            let (trained, nll) =
                b.train_nll(&self.state.model, &c.train, c.ptx_coef / n_demo as f64, 0.0)?;
            sums.ptx_nll += nll;
            st.ptx_tokens += b.n_trained;
            balance.merge(&trained.balance);
        }
        Ok(Some(balance))
    }

    /// The configuration.
    pub fn config(&self) -> &RlConfig {
        &self.cfg
    }

    /// The policy under training: parameters, model, optimizer.
    pub fn state(&self) -> &TrainState {
        &self.state
    }

    /// The policy under training, mutably (restore the optimizer, extend the window).
    pub fn state_mut(&mut self) -> &mut TrainState {
        &mut self.state
    }

    /// Puts the policy and the KL reference under the RoPE scaling `rope` (a context stage's),
    /// their positions unchanged: both score a trajectory at the same positions the same way.
    pub fn set_rope(&mut self, rope: RopeScaling) -> Result<(), TrainError> {
        let max_pos = self.state.model.config().max_position_embeddings;
        self.state.model.extend_context(max_pos, rope)?;
        if let Some((_, reference)) = self.reference.as_mut() {
            reference.extend_context(max_pos, rope)?;
        }
        Ok(())
    }

    /// Whether a reference policy is loaded.
    pub fn has_reference(&self) -> bool {
        self.reference.is_some()
    }

    /// Gives back the policy under training.
    pub fn into_state(self) -> TrainState {
        self.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which table each pass routes by or compares with, per mode: `(given, replay, record)`
    /// with `given` naming the table (`a` the actors', `o` R2's recorded one, `-` none).
    fn table(mode: RouterReplay, pass: Pass, measured: bool) -> (char, bool, bool) {
        let (a, o) = (
            Tensor::zeros([1], tch::kind::INT64_CPU),
            Tensor::ones([1], tch::kind::INT64_CPU),
        );
        let r = pass_routes(mode, pass, measured, Some(&a), Some(&o));
        let given = match r.given_btlk {
            Some(g) if g.int64_value(&[0]) == 0 => 'a',
            Some(_) => 'o',
            None => '-',
        };
        (given, r.replay, r.record)
    }

    #[test]
    fn each_pass_routes_as_its_mode_says() {
        use Pass::*;
        use RouterReplay::*;
        // Off: compare in the measured pass only.
        assert_eq!(table(Off, Prox, true), ('a', false, false));
        assert_eq!(table(Off, Update, false), ('-', false, false));
        assert_eq!(table(Off, Update, true), ('a', false, false));
        assert_eq!(table(Off, Ref, false), ('-', false, false));
        // R3: the actors' routes in every pass.
        for pass in [Prox, Ref, Update] {
            assert_eq!(table(Rollout, pass, false), ('a', true, false));
        }
        // R2: π_prox records (and compares); the update replays what it recorded.
        assert_eq!(table(Old, Prox, true), ('a', false, true));
        assert_eq!(table(Old, Update, false), ('o', true, false));
        assert_eq!(table(Old, Ref, false), ('-', false, false));
        // Without a recorded table (one minibatch) R2's update compares like Off.
        let a = Tensor::zeros([1], tch::kind::INT64_CPU);
        let r = pass_routes(Old, Update, true, Some(&a), None);
        assert!(r.given_btlk.is_some() && !r.replay);
    }

    /// A folded trajectory trains as one row per segment: each row is its segment's ids,
    /// every position's advantage is the trajectory's for the token it predicts, and a
    /// segment's routes are its own steps' rows with none for its last position.
    #[test]
    fn a_folded_trajectory_is_one_row_per_segment_with_the_episodes_advantages() {
        use corvid_proto::{synthetic, Step, Trajectory};
        let shape = RouteShape {
            moe_layers: 1,
            experts_per_token: 1,
            routed_experts: 8,
        };
        // Segment 0: context 3 tokens + 2 generated; segment 1: context 4 + 3 generated.
        let step = |segment: u32, ctx: &[u32], gen: &[u32]| {
            let mut s = Step::context(segment, ctx.to_vec());
            s.token_ids.extend_from_slice(gen);
            s.loss_mask.extend(std::iter::repeat_n(true, gen.len()));
            s.logprobs.extend(std::iter::repeat_n(-0.5, gen.len()));
            s.policy_version = 3;
            s.segment = segment;
            // One row per token, one fewer where the segment opens.
            let n = ctx.len() + gen.len() - 1;
            s.routes = (0..n).map(|i| (segment as u8 * 4 + i as u8) % 8).collect();
            s
        };
        let mut header = synthetic::header("folded", "hops", 1, 3);
        header.routes = Some(shape);
        let t = Trajectory {
            header,
            steps: vec![
                step(0, &[1, 2, 3], &[4, 5]),
                step(1, &[1, 2, 9, 9], &[6, 7, 8]),
            ],
            footer: synthetic::footer(
                "folded",
                synthetic::Shape {
                    steps: 2,
                    tokens_per_step: 6,
                },
            ),
        };
        assert_eq!(t.segments(), vec![0..1, 1..2]);
        assert!(has_routes(&t, Some(shape)));
        let adv: Vec<f64> = (0..t.len()).map(|i| i as f64).collect();
        let scored = Scored {
            trajectory: &t,
            token_advantages: adv,
            group: 0,
        };
        let rows = segment_rows(&scored, 0, Some(shape), 3);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].row.tokens, vec![1, 2, 3, 4, 5]);
        assert_eq!(rows[1].row.tokens, vec![1, 2, 9, 9, 6, 7, 8]);
        // Position j predicts token j + 1: the second row's tokens are 5.. of the trajectory.
        assert_eq!(rows[0].adv, vec![1.0, 2.0, 3.0, 4.0, 0.0]);
        assert_eq!(rows[1].adv, vec![6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 0.0]);
        assert_eq!(
            rows[1].behaviour,
            vec![0.0, 0.0, 0.0, -0.5, -0.5, -0.5, 0.0]
        );
        assert_eq!(rows[1].lag0[3..6], [1.0, 1.0, 1.0]);
        assert_eq!(rows[0].row.routes, vec![0, 1, 2, 3, -1]);
        assert_eq!(rows[1].row.routes, vec![4, 5, 6, 7, 0, 1, -1]);
        assert_eq!(longest_segment(&t), 7);
        // Rows of a trajectory without a segment's worth of routes carry none.
        let mut short = t.clone();
        short.steps[1].routes.pop();
        assert!(!has_routes(&short, Some(shape)));
        let scored = Scored {
            trajectory: &short,
            ..scored
        };
        assert!(segment_rows(&scored, 0, Some(shape), 3)
            .iter()
            .all(|r| r.row.routes.is_empty()));
    }
}
