//! Trainer configuration: the optimizer, the SFT stage and the RL stage.
//!
//! Every struct is `#[serde(default, deny_unknown_fields)]`: a TOML table may set any subset
//! of fields, a misspelt field is an error, and each field's doc comment gives its default.
//! [`OptimConfig::validate`], [`SftConfig::validate`] and [`RlConfig::validate`] name the
//! bad field and value.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::TrainError;
use corvid_model::Checkpoint;

fn bad(field: &'static str, value: impl ToString, why: &'static str) -> TrainError {
    TrainError::Config {
        field,
        value: value.to_string(),
        why,
    }
}

/// How a training row becomes a loss, shared by SFT and RL (`[train]`): activation
/// checkpointing, the logits chunk, and the longest row trained on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// `none` keeps every block's activations for the backward; `blocks` keeps each block's
    /// inputs and reruns one block at a time in the backward (about one more forward of
    /// compute, activation memory linear in the row's tokens with a small slope). Default
    /// `none`.
    pub checkpoint: Checkpoint,
    /// Longest trajectory RL trains on, in tokens; longer ones are skipped and counted
    /// (`too_long_skipped`), never cut. `0`: the model's current context
    /// (`max_position_embeddings`, which follows the curriculum's context stage). Default `0`.
    pub max_train_tokens: usize,
    /// MiB of fp32 logits one chunk of positions may hold: log-probs, entropy and their
    /// gradients are computed that many positions at a time, never over a whole row
    /// (`corvid_model::head`, which says why 64 and not 32). Default `64`.
    pub logit_chunk_mib: usize,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            checkpoint: Checkpoint::None,
            max_train_tokens: 0,
            logit_chunk_mib: 64,
        }
    }
}

impl TrainConfig {
    /// Checks ranges; names the first bad field.
    pub fn validate(&self) -> Result<(), TrainError> {
        if self.logit_chunk_mib == 0 {
            return Err(bad("logit_chunk_mib", 0, "must be > 0"));
        }
        Ok(())
    }

    /// Positions per logits chunk at vocabulary `vocab`.
    pub fn chunk_rows(&self, vocab: i64) -> i64 {
        corvid_model::head::chunk_rows(vocab, self.logit_chunk_mib << 20)
    }
}

/// AdamW with linear warm-up, cosine decay to a floor, and global-norm gradient clipping.
///
/// Defaults are those of the 2-core feasibility probe (`research/learning_feasibility.md`):
/// lr 1e-3, betas (0.9, 0.98), weight decay 0.01, 100 warm-up steps, decay to 0.1×, clip 1.0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OptimConfig {
    /// Peak learning rate, reached at the end of warm-up. Default `1e-3`.
    pub lr: f64,
    /// Adam `(β1, β2)`: decay rates of the first and second moment. Default `[0.9, 0.98]`.
    pub betas: [f64; 2],
    /// Adam `ε` added to `sqrt(v̂)`. Default `1e-8`.
    pub eps: f64,
    /// Decoupled weight decay `λ` (AdamW: `θ ← θ − lr·λ·θ`), applied to matrices only
    /// (tensors with 2 or more dimensions); norms, biases and router biases are not decayed.
    /// Default `0.01`.
    pub weight_decay: f64,
    /// Steps of linear warm-up from `lr / warmup_steps` to `lr`. Default `100`.
    pub warmup_steps: u64,
    /// Step at which the cosine decay reaches its floor; the rate stays at the floor after.
    /// Default `1000`.
    pub total_steps: u64,
    /// The floor of the cosine decay as a fraction of `lr`. Default `0.1`.
    pub min_lr_ratio: f64,
    /// Largest global L2 norm of the gradient; larger gradients are scaled down to it.
    /// `0` turns clipping off (the norm is still measured). Default `1.0`.
    pub grad_clip: f64,
}

impl Default for OptimConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            betas: [0.9, 0.98],
            eps: 1e-8,
            weight_decay: 0.01,
            warmup_steps: 100,
            total_steps: 1000,
            min_lr_ratio: 0.1,
            grad_clip: 1.0,
        }
    }
}

impl OptimConfig {
    /// Checks ranges; names the first bad field as `optim.<field>` (the table lives under
    /// `[sft]` or `[rl]`, which prefix it).
    pub fn validate(&self) -> Result<(), TrainError> {
        if !(self.lr.is_finite() && self.lr >= 0.0) {
            return Err(bad("optim.lr", self.lr, "must be a finite value >= 0"));
        }
        for (i, b) in self.betas.iter().enumerate() {
            if !(0.0..1.0).contains(b) {
                return Err(bad(
                    if i == 0 {
                        "optim.betas[0]"
                    } else {
                        "optim.betas[1]"
                    },
                    b,
                    "must be in [0, 1)",
                ));
            }
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return Err(bad("optim.eps", self.eps, "must be a finite value > 0"));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return Err(bad(
                "optim.weight_decay",
                self.weight_decay,
                "must be a finite value >= 0",
            ));
        }
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return Err(bad(
                "optim.min_lr_ratio",
                self.min_lr_ratio,
                "must be in [0, 1]",
            ));
        }
        if !(self.grad_clip.is_finite() && self.grad_clip >= 0.0) {
            return Err(bad(
                "optim.grad_clip",
                self.grad_clip,
                "must be a finite value >= 0 (0 = off)",
            ));
        }
        Ok(())
    }
}

/// How SFT lays demonstrations out in rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SftLayout {
    /// Several demonstrations per row of `seq_len` (first-fit decreasing), attention kept
    /// inside each document: no padding, every row the same length.
    Pack,
    /// One demonstration per row; rows sorted by length share a micro-batch padded to its
    /// longest, and run the plain causal trunk (one attention call per row, a short row
    /// costs only its own length).
    Bucket,
    /// Several demonstrations per row of at most `seq_len`, one after another in a single
    /// causal context (no document mask, positions running on), as GPT pretraining joins
    /// documents. A policy trained on single short demonstrations breaks down past their
    /// length (the hops-3 answer turn starts at positions 338-350, past level 2's;
    /// docs/bench/log.md, 2026-12-02 "hops 3 fails past a position"); here later
    /// demonstrations are trained at positions up to `seq_len`.
    Concat,
}

/// Supervised fine-tuning on oracle demonstrations (and imported transcripts).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SftConfig {
    /// `[train]`, copied in by the learner (not a field of `[sft]`).
    #[serde(skip)]
    pub train: TrainConfig,
    /// Optimizer steps to run. `0` means "until `token_budget`". Default `600`.
    pub steps: u64,
    /// Stop once this many trained-on (masked-in) tokens have been seen; `0` = no budget, stop
    /// at `steps`. When both are set the first reached wins. Default `0`.
    pub token_budget: u64,
    /// Tokens per optimizer step: rows × `seq_len`, padding included, with `layout = "pack"`
    /// or `"concat"` (at most: a concatenated row is not padded);
    /// demonstration tokens with `layout = "bucket"`. Default `8192`.
    pub batch_tokens: usize,
    /// Length of a packed row; examples longer than this are dropped and counted.
    /// Default `512`.
    pub seq_len: usize,
    /// How demonstrations become rows. Default `pack`.
    pub layout: SftLayout,
    /// First step laid out as [`SftLayout::Concat`], whatever `layout` says; the steps before
    /// it use `layout`. Concat from step 0 delays the moment a from-scratch policy learns to
    /// copy (held-out loss 0.24 at step 850, where bucket rows reach 0.03 by 800), so a run
    /// switches once it copies (800 for the demo's model). Held-out rows keep `layout`'s.
    /// Default none (never).
    pub concat_from_step: Option<u64>,
    /// Tokens per forward/backward; a step's rows are run in micro-batches of at most this
    /// many tokens and the gradients accumulated, bounding memory. Default `8192`.
    pub micro_batch_tokens: usize,
    /// Task levels to draw demonstrations from, per family, e.g. `{ hops = [1, 2] }`.
    /// Default `{ hops = [1, 2] }`.
    pub levels: BTreeMap<String, Vec<u32>>,
    /// Levels per family that join `levels` from step `late_levels_from_step` on, e.g.
    /// `{ hops = [3] }`. A from-scratch policy learns to copy later when long demonstrations
    /// with filler are in the mix from step 0 (held-out loss 0.28 at step 900 with hops 3 and
    /// ~80 bytes of filler per file from the start, 0.10 with hops 1-2 alone, on one 2-core
    /// AVX2-only 2.45 GHz EPYC; docs/bench/log.md, 2026-12-02 "on a slower machine the
    /// shipped demo takes 31.8 minutes and does not learn"), so a run can add them once it
    /// copies. Their held-out examples are in the held-out loss from step 0. Default empty.
    pub late_levels: BTreeMap<String, Vec<u32>>,
    /// First step that also draws from `late_levels`. Default `0`.
    pub late_levels_from_step: u64,
    /// Seed of the training example stream (instance seeds are drawn from it). Default `0`.
    pub seed: u64,
    /// Held-out examples per (family, level) for the held-out loss. Default `32`.
    pub heldout_per_level: usize,
    /// First instance seed of the held-out set; training seeds are kept below it so the two
    /// never overlap. Default `1 << 40`.
    pub heldout_seed_base: u64,
    /// Steps between held-out evaluations (`0` = only at the end). Default `100`.
    pub eval_every: u64,
    /// Stop SFT at the first held-out evaluation whose loss is at or below this, with
    /// `steps` (or `token_budget`) as the cap. The step at which a from-scratch policy
    /// learns to copy differs between machines for the same example stream (their float
    /// results differ: held-out loss 0.005 at step 1,000 on one 2-core machine, 0.093 on
    /// another; docs/bench/log.md, 2026-12-02 "SFT stops on a held-out loss target"), so a
    /// target, not a step count, makes RL start from the same kind of policy everywhere.
    /// Needs `eval_every > 0`. Default none (run to `steps`).
    pub heldout_loss_target: Option<f64>,
    /// JSONL files of chat transcripts with tool calls to train on as well, one
    /// `{"messages": [...]}` object per line in the OpenAI format (what `corvid replay export
    /// --format chat` writes). Each step draws from them as from one more (family, level)
    /// pair. Default empty.
    pub import: Vec<std::path::PathBuf>,
    /// Chance, before each call of a demonstration (the final `answer` included), of a
    /// mistake first — a mistyped path or a broken call — and the real error it gets back,
    /// with the mistake's tokens left out of the loss, so demonstrations teach recovery
    /// without teaching the mistake ([`corvid_episode::Mistakes`]). In `[0, 1)`. Default `0`.
    pub mistake_rate: f64,
    /// First SFT step whose demonstrations make mistakes (`mistake_rate`); earlier steps
    /// are the plain oracle's. Demonstrations with mistakes are longer for the same calls
    /// learnt, which delays the moment a from-scratch policy learns to copy paths, so the
    /// demo starts them once it copies. The held-out set always has them. Default `0`.
    pub mistakes_from_step: u64,
    /// Recover from a mistyped `read_file` path by first reading again the file the path was
    /// copied from, instead of retrying at once ([`corvid_episode::Mistakes::reread`]).
    /// Default `false`.
    pub mistake_reread: bool,
    /// Optimizer settings.
    pub optim: OptimConfig,
}

impl Default for SftConfig {
    fn default() -> Self {
        Self {
            train: TrainConfig::default(),
            steps: 600,
            token_budget: 0,
            batch_tokens: 8192,
            seq_len: 512,
            layout: SftLayout::Pack,
            concat_from_step: None,
            micro_batch_tokens: 8192,
            levels: BTreeMap::from([("hops".to_string(), vec![1, 2])]),
            late_levels: BTreeMap::new(),
            late_levels_from_step: 0,
            seed: 0,
            heldout_per_level: 32,
            heldout_seed_base: 1 << 40,
            eval_every: 100,
            heldout_loss_target: None,
            import: Vec::new(),
            mistake_rate: 0.0,
            mistakes_from_step: 0,
            mistake_reread: false,
            optim: OptimConfig::default(),
        }
    }
}

impl SftConfig {
    /// Checks ranges; names the first bad field.
    pub fn validate(&self) -> Result<(), TrainError> {
        self.train.validate()?;
        if self.steps == 0 && self.token_budget == 0 {
            return Err(bad(
                "steps",
                0,
                "steps and token_budget cannot both be 0 (no stopping rule)",
            ));
        }
        if self.seq_len == 0 {
            return Err(bad("seq_len", 0, "must be > 0"));
        }
        if self.batch_tokens < self.seq_len {
            return Err(bad(
                "batch_tokens",
                self.batch_tokens,
                "must be at least seq_len (one row)",
            ));
        }
        if self.micro_batch_tokens < self.seq_len {
            return Err(bad(
                "micro_batch_tokens",
                self.micro_batch_tokens,
                "must be at least seq_len (one row)",
            ));
        }
        for (field, levels) in [("levels", &self.levels), ("late_levels", &self.late_levels)] {
            if levels.values().any(|l| l.contains(&0)) {
                return Err(bad(field, format!("{levels:?}"), "levels start at 1"));
            }
        }
        for (family, late) in &self.late_levels {
            let early = self
                .levels
                .get(family)
                .map(Vec::as_slice)
                .unwrap_or_default();
            if let Some(l) = late.iter().find(|l| early.contains(l)) {
                return Err(bad(
                    "late_levels",
                    format!("{family} level {l}"),
                    "is in `levels` too: name each level in one of them",
                ));
            }
        }
        if let Some(target) = self.heldout_loss_target {
            if !(target.is_finite() && target > 0.0) {
                return Err(bad("heldout_loss_target", target, "must be a loss > 0"));
            }
            if self.eval_every == 0 {
                return Err(bad(
                    "heldout_loss_target",
                    target,
                    "needs eval_every > 0: with 0 the held-out loss is only measured at the end",
                ));
            }
        }
        if !(0.0..1.0).contains(&self.mistake_rate) {
            return Err(bad("mistake_rate", self.mistake_rate, "must be in [0, 1)"));
        }
        if let (Some(from), SftLayout::Concat) = (self.concat_from_step, self.layout) {
            return Err(bad(
                "concat_from_step",
                from,
                "switches to layout = \"concat\", which is already the layout: remove one",
            ));
        }
        self.optim.validate()
    }

    /// The layout of step `step`: concat from `concat_from_step` on, else `layout`.
    pub fn layout_at(&self, step: u64) -> SftLayout {
        match self.concat_from_step {
            Some(from) if step >= from => SftLayout::Concat,
            _ => self.layout,
        }
    }

    /// Packed rows per optimizer step: `batch_tokens / seq_len`.
    pub fn rows_per_step(&self) -> usize {
        (self.batch_tokens / self.seq_len.max(1)).max(1)
    }
}

/// How RL advantages are computed (see `corvid_rewards`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdvantageMode {
    /// Step-level, critic-free: each turn's discounted return-to-go (process rewards after it
    /// plus the outcome) baselined within the group by turn index; every generated token of
    /// turn `t` carries `A_t` (`corvid_rewards::step_advantages`).
    Step,
    /// Trajectory-level GRPO: `A_i = (R_i − mean) / (std + eps)` with
    /// `R_i = outcome + Σ_t p_t` (weighted, clipped `p_t`), shared by all tokens of the episode.
    Grpo,
    /// Trajectory-level Dr.GRPO: `A_i = R_i − mean` (no std scaling).
    DrGrpo,
    /// Trajectory-level RLOO: `A_i = R_i − mean of the others`.
    Rloo,
}

/// Which expert selection the learner's passes over a trajectory use (`[rl] router_replay`).
/// Only the selection is replayed; the gates are always the learner's own dense scores at
/// the replayed ids, so the router keeps its gradient (`corvid_model::routes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouterReplay {
    /// The learner routes by its own choice (the mismatch is still measured).
    #[default]
    Off,
    /// R3: every pass (π_θ, π_prox, π_ref) routes by the actor's recorded selection; a
    /// trajectory without routes is trained on the learner's own and counted.
    Rollout,
    /// R2: the π_prox pass records the learner's own selection and the update's
    /// minibatches route by it (with one minibatch π_prox is the update's own forward, so
    /// this changes nothing).
    Old,
}

/// Asynchronous policy optimisation from stored trajectories.
///
/// The loss (see `train::loss`, each term a named function):
/// `L = L_pg − entropy_coef·H + kl_coef·KL_k3 + aux_loss_scale·L_balance
///      + ptx_coef·CE_demo`, with the
/// decoupled-PPO surrogate `L_pg = −w · min(r·A, clip(r, 1−clip_low, 1+clip_high)·A)`,
/// `r = π_θ/π_prox`, `w = min(π_prox/μ, tis_cap)`, averaged over generated tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RlConfig {
    /// `[train]`, copied in by the learner (not a field of `[rl]`).
    #[serde(skip)]
    pub train: TrainConfig,
    /// `step` (turn-level credit, the default) or the trajectory-level baselines `grpo`,
    /// `dr_grpo`, `rloo` for comparison. Default `step`.
    pub advantage: AdvantageMode,
    /// Per-turn discount `γ` of the step-level returns. Default `1.0`.
    pub gamma: f64,
    /// Weight of process rewards: step level scales each `p_t` by it; trajectory level uses
    /// `R = outcome + Σ_t p_t` over the weighted, clipped `p_t`. `0` = outcome only.
    /// Default `1.0`.
    pub process_weight: f64,
    /// Largest magnitude of one turn's process reward after weighting:
    /// `p_t = clamp(process_weight · Σ_j c_{t,j}, −process_clip, process_clip)`
    /// (`corvid_rewards::ProcessRewardAggregation`), so a turn where many rules fire (one
    /// `shell` command reading many needed files) cannot outweigh an outcome of 1.
    /// Default `1.0`.
    pub process_clip: f64,
    /// Divide step-level advantages by the bucket's std (+`adv_eps`). Default `false`: a
    /// bucket of failed episodes whose returns differ only by small process rewards (or f32
    /// rounding of them) has a tiny std, and dividing by it blows those differences up to the
    /// scale of a real success against a failure (why `configs/demo.toml` turned it off).
    pub normalize_step_advantages: bool,
    /// `eps` added to the std in GRPO and normalised step advantages. Default `1e-6`.
    pub adv_eps: f64,
    /// Lower clip `ε_low`: the ratio is clipped at `1 − clip_low`. Default `0.2`.
    pub clip_low: f64,
    /// Upper clip `ε_high` (clip-higher, DAPO): the ratio is clipped at `1 + clip_high`;
    /// larger than `clip_low` so low-probability tokens with positive advantage can still
    /// grow (keeps entropy from collapsing). Default `0.28`.
    pub clip_high: f64,
    /// Cap of the truncated importance weight `w = min(π_prox/μ, tis_cap)` that corrects for
    /// the behaviour policy `μ` being older than the learner. Must be `>= 1`. Default `2.0`.
    pub tis_cap: f64,
    /// Largest lag in policy versions (`current − header.policy_version`) a trajectory may
    /// have and still be trained on; older ones are skipped and counted. Default `4`.
    pub staleness_bound: u64,
    /// Weight of the KL penalty to the frozen reference (SFT) policy, k3 estimator
    /// `KL ≈ exp(logp_ref − logp) − (logp_ref − logp) − 1`. `0` turns it off and skips the
    /// reference forward. Default `0.0`.
    pub kl_coef: f64,
    /// Weight of the entropy bonus (`−entropy_coef · H` in the loss, `H` the full-vocabulary
    /// entropy of the policy at generated tokens). Default `0.0`.
    pub entropy_coef: f64,
    /// Weight `γ_ptx` of the supervised cross-entropy on demonstrations mixed into every
    /// optimizer step (InstructGPT's PPO-ptx): `+ ptx_coef · CE_demo`, `CE_demo` the mean
    /// over the demonstrations' assistant tokens. The learner draws fresh demonstrations from
    /// the `[sft]` stream (its levels, mistakes and imports) for each update. `0` = off.
    /// Default `0.0`.
    pub ptx_coef: f64,
    /// Demonstration tokens per update when `ptx_coef > 0` (split across the minibatches).
    /// Default `4096`.
    pub ptx_tokens: usize,
    /// Multiplier on the model's own balance loss (Switch aux loss and router z-loss, already
    /// weighted by `aux_loss_coef` / `router_z_loss_coef` of the model config). Default `1.0`.
    pub aux_loss_scale: f64,
    /// Update the routers' balance bias (aux-free / quantile modes) after every optimizer
    /// step from the step's routing statistics. Default `true`.
    pub update_balance_bias: bool,
    /// Drop groups whose advantages are all zero (every scored member had the same return):
    /// they carry no policy gradient and would only dilute the token mean (DAPO's dynamic
    /// sampling filter, without re-sampling). Counted in the update statistics.
    /// Default `true`.
    pub drop_uninformative_groups: bool,
    /// Groups (task instances) per policy update. Default `8`.
    pub groups_per_update: usize,
    /// Episodes per group (G), requested from actors per task instance. Default `8`.
    pub group_size: usize,
    /// Optimizer steps per update: the update's trajectories are split into this many
    /// minibatches. With more than one, `π_prox` (the policy at the start of the update) is
    /// recomputed in a gradient-free pass and the PPO clip becomes active. Default `1`.
    pub minibatches: usize,
    /// Tokens per forward/backward (rows padded to the longest in the micro-batch); bounds
    /// memory on long trajectories. Default `4096`.
    pub micro_batch_tokens: usize,
    /// Synchronous mode: actors wait for each new policy version before rolling out again
    /// (on-policy; for comparison). Asynchronous by default. Default `false`.
    pub sync: bool,
    /// `off`, `rollout` (R3) or `old` (R2): see [`RouterReplay`]. Default `off`.
    pub router_replay: RouterReplay,
    /// Optimizer settings. Default: [`OptimConfig::default`] with `lr = 2e-4`,
    /// `warmup_steps = 10`. A `[rl.optim]` table that names some fields keeps these RL
    /// defaults for the others (not the SFT-scale struct defaults: `lr = 1e-3` would be 5×).
    #[serde(deserialize_with = "rl_optim")]
    pub optim: OptimConfig,
}

/// `[rl.optim]` as written: each field `None` where the table leaves it out.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OptimFields {
    lr: Option<f64>,
    betas: Option<[f64; 2]>,
    eps: Option<f64>,
    weight_decay: Option<f64>,
    warmup_steps: Option<u64>,
    total_steps: Option<u64>,
    min_lr_ratio: Option<f64>,
    grad_clip: Option<f64>,
}

/// Reads `[rl.optim]` over the RL defaults ([`RlConfig::default`]'s `optim`).
fn rl_optim<'de, D: serde::Deserializer<'de>>(d: D) -> Result<OptimConfig, D::Error> {
    let f = OptimFields::deserialize(d)?;
    let base = RlConfig::default().optim;
    Ok(OptimConfig {
        lr: f.lr.unwrap_or(base.lr),
        betas: f.betas.unwrap_or(base.betas),
        eps: f.eps.unwrap_or(base.eps),
        weight_decay: f.weight_decay.unwrap_or(base.weight_decay),
        warmup_steps: f.warmup_steps.unwrap_or(base.warmup_steps),
        total_steps: f.total_steps.unwrap_or(base.total_steps),
        min_lr_ratio: f.min_lr_ratio.unwrap_or(base.min_lr_ratio),
        grad_clip: f.grad_clip.unwrap_or(base.grad_clip),
    })
}

impl Default for RlConfig {
    fn default() -> Self {
        Self {
            train: TrainConfig::default(),
            advantage: AdvantageMode::Step,
            gamma: 1.0,
            process_weight: 1.0,
            process_clip: 1.0,
            normalize_step_advantages: false,
            adv_eps: 1e-6,
            clip_low: 0.2,
            clip_high: 0.28,
            tis_cap: 2.0,
            staleness_bound: 4,
            kl_coef: 0.0,
            entropy_coef: 0.0,
            ptx_coef: 0.0,
            ptx_tokens: 4096,
            aux_loss_scale: 1.0,
            update_balance_bias: true,
            drop_uninformative_groups: true,
            groups_per_update: 8,
            group_size: 8,
            minibatches: 1,
            micro_batch_tokens: 4096,
            sync: false,
            router_replay: RouterReplay::Off,
            optim: OptimConfig {
                lr: 2e-4,
                warmup_steps: 10,
                ..OptimConfig::default()
            },
        }
    }
}

impl RlConfig {
    /// Checks ranges; names the first bad field.
    pub fn validate(&self) -> Result<(), TrainError> {
        self.train.validate()?;
        if !(self.gamma.is_finite() && (0.0..=1.0).contains(&self.gamma)) {
            return Err(bad("gamma", self.gamma, "must be in [0, 1]"));
        }
        if !self.process_weight.is_finite() {
            return Err(bad("process_weight", self.process_weight, "must be finite"));
        }
        if !(self.process_clip.is_finite() && self.process_clip >= 0.0) {
            return Err(bad(
                "process_clip",
                self.process_clip,
                "must be a finite value >= 0",
            ));
        }
        if !(self.adv_eps.is_finite() && self.adv_eps >= 0.0) {
            return Err(bad("adv_eps", self.adv_eps, "must be a finite value >= 0"));
        }
        if !((0.0..1.0).contains(&self.clip_low)) {
            return Err(bad("clip_low", self.clip_low, "must be in [0, 1)"));
        }
        if !(self.clip_high.is_finite() && self.clip_high >= 0.0) {
            return Err(bad(
                "clip_high",
                self.clip_high,
                "must be a finite value >= 0",
            ));
        }
        if self.tis_cap.is_nan() || self.tis_cap < 1.0 {
            return Err(bad("tis_cap", self.tis_cap, "must be >= 1 (inf = no cap)"));
        }
        for (field, v) in [
            ("kl_coef", self.kl_coef),
            ("entropy_coef", self.entropy_coef),
            ("ptx_coef", self.ptx_coef),
            ("aux_loss_scale", self.aux_loss_scale),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(bad(field, v, "must be a finite value >= 0"));
            }
        }
        if self.groups_per_update == 0 {
            return Err(bad("groups_per_update", 0, "must be > 0"));
        }
        if self.group_size == 0 {
            return Err(bad("group_size", 0, "must be > 0"));
        }
        if self.minibatches == 0 {
            return Err(bad("minibatches", 0, "must be > 0"));
        }
        if self.micro_batch_tokens == 0 {
            return Err(bad("micro_batch_tokens", 0, "must be > 0"));
        }
        if self.ptx_coef > 0.0 && self.ptx_tokens == 0 {
            return Err(bad("ptx_tokens", 0, "must be > 0 when ptx_coef > 0"));
        }
        self.optim.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_toml_takes_defaults_and_unknown_fields_are_rejected() {
        let rl: RlConfig = toml::from_str("clip_high = 0.3\n[optim]\nlr = 1e-4\n").unwrap();
        assert_eq!(rl.clip_high, 0.3);
        assert_eq!(rl.clip_low, 0.2);
        assert_eq!(rl.optim.lr, 1e-4);
        // A partial [rl.optim] keeps the RL defaults, not OptimConfig's SFT-scale ones.
        assert_eq!(rl.optim.warmup_steps, 10);
        let rl: RlConfig = toml::from_str("[optim]\ngrad_clip = 0.5\n").unwrap();
        assert_eq!(rl.optim.lr, RlConfig::default().optim.lr);
        assert_eq!(rl.optim.grad_clip, 0.5);
        assert!(toml::from_str::<RlConfig>("[optim]\nlr_max = 1.0\n").is_err());
        assert!(toml::from_str::<RlConfig>("clip_hihg = 0.3").is_err());
        let sft: SftConfig = toml::from_str("seq_len = 256\n[levels]\nhops = [1, 2, 3]\n").unwrap();
        assert_eq!(sft.levels["hops"], vec![1, 2, 3]);
        assert!(sft.validate().is_ok());
        let adv: RlConfig = toml::from_str("advantage = \"grpo\"").unwrap();
        assert_eq!(adv.advantage, AdvantageMode::Grpo);
    }

    #[test]
    fn validate_names_the_field() {
        let cfg = RlConfig {
            tis_cap: 0.5,
            ..RlConfig::default()
        };
        match cfg.validate() {
            Err(TrainError::Config { field, .. }) => assert_eq!(field, "tis_cap"),
            other => panic!("expected a config error, got {other:?}"),
        }
        assert!(RlConfig::default().validate().is_ok());
        assert!(SftConfig::default().validate().is_ok());
    }

    #[test]
    fn late_levels_must_be_new_levels() {
        let sft: SftConfig =
            toml::from_str("late_levels = { hops = [3] }\nlate_levels_from_step = 800\n").unwrap();
        assert_eq!(sft.late_levels["hops"], vec![3]);
        assert!(sft.validate().is_ok());
        for late in ["{ hops = [2] }", "{ hops = [0] }"] {
            let sft: SftConfig = toml::from_str(&format!("late_levels = {late}")).unwrap();
            match sft.validate() {
                Err(TrainError::Config { field, .. }) => assert_eq!(field, "late_levels", "{late}"),
                other => panic!("{late}: expected a late_levels error, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_heldout_loss_target_must_be_a_positive_loss_measured_during_sft() {
        let sft: SftConfig = toml::from_str("heldout_loss_target = 0.01").unwrap();
        assert_eq!(sft.heldout_loss_target, Some(0.01));
        assert!(sft.validate().is_ok());
        for bad_toml in [
            "heldout_loss_target = 0.0",
            "heldout_loss_target = -1.0",
            "heldout_loss_target = nan",
            "heldout_loss_target = 0.01\neval_every = 0",
        ] {
            let sft: SftConfig = toml::from_str(bad_toml).unwrap();
            match sft.validate() {
                Err(TrainError::Config { field, .. }) => {
                    assert_eq!(field, "heldout_loss_target", "{bad_toml}")
                }
                other => panic!("{bad_toml}: expected a heldout_loss_target error, got {other:?}"),
            }
        }
    }
}
