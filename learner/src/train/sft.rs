//! Supervised fine-tuning: packed rows, cross-entropy on the assistant's tokens only.
//!
//! `L = (1/N) Σ_{i: mask_i} −log π_θ(x_i | x_<i)` over the `N` trained-on tokens of the step
//! (all micro-batches together), plus the model's MoE balance loss. Prompt, user and tool
//! tokens are context only.

use tch::nn;

use super::config::SftConfig;
use super::loss::summed_nll;
use super::pack::{first_fit_decreasing, micro_batches, PackedBatch, PackedRow};
use super::state::TrainState;
use super::TrainError;
use corvid_model::{BalanceStats, MoeHealth, MoePolicy};

/// One training document: token ids and which of them are trained on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    /// Token ids of the whole transcript.
    pub ids: Vec<u32>,
    /// `mask[i]`: token `i` is the assistant's output and is trained on.
    pub mask: Vec<bool>,
}

impl Example {
    /// An episode's steps as one example: all tokens, trained on where `loss_mask` is set
    /// (the policy's own turns; prompts and tool output are context).
    pub fn from_steps(steps: &[corvid_proto::Step]) -> Self {
        Self {
            ids: steps
                .iter()
                .flat_map(|s| s.token_ids.iter().copied())
                .collect(),
            mask: steps
                .iter()
                .flat_map(|s| s.loss_mask.iter().copied())
                .collect(),
        }
    }
}

/// The result of [`pack`] or [`fn@concat`].
#[derive(Debug, Clone, PartialEq)]
pub struct Packing {
    /// Rows of length `seq_len` ([`pack`]) or at most `seq_len` ([`fn@concat`]).
    pub rows: Vec<PackedRow>,
    /// Indices of the examples longer than `seq_len` (left out).
    pub too_long: Vec<usize>,
}

/// Bins `examples` first-fit decreasing by length into rows of at most `seq_len` tokens:
/// `(example indices per row, indices of the examples longer than seq_len)`. Examples whose
/// `ids` and `mask` differ in length are an error.
fn bin_examples(
    examples: &[Example],
    seq_len: usize,
) -> Result<(Vec<Vec<usize>>, Vec<usize>), TrainError> {
    if let Some((i, e)) = examples
        .iter()
        .enumerate()
        .find(|(_, e)| e.ids.len() != e.mask.len())
    {
        return Err(TrainError::Data(format!(
            "example {i}: {} ids but {} mask entries",
            e.ids.len(),
            e.mask.len()
        )));
    }
    let lengths: Vec<usize> = examples.iter().map(|e| e.ids.len()).collect();
    Ok(first_fit_decreasing(&lengths, seq_len))
}

/// Packs `examples` into rows of `seq_len` tokens (first-fit decreasing), each example a
/// document with positions from 0. Examples whose `ids` and `mask` differ in length are an
/// error; examples longer than `seq_len` are left out and listed in [`Packing::too_long`].
pub fn pack(examples: &[Example], seq_len: usize, pad_id: u32) -> Result<Packing, TrainError> {
    let (bins, too_long) = bin_examples(examples, seq_len)?;
    let rows = bins
        .into_iter()
        .map(|items| {
            let mut row = PackedRow::empty(seq_len, pad_id);
            let mut offset = 0;
            for (doc, &i) in items.iter().enumerate() {
                row.put(offset, doc as i64, &examples[i].ids, &examples[i].mask);
                offset += examples[i].ids.len();
            }
            row
        })
        .collect();
    Ok(Packing { rows, too_long })
}

/// Concatenates `examples` into rows of at most `seq_len` tokens, as GPT pretraining joins
/// documents: the examples of a row (chosen first-fit decreasing, then kept in input order)
/// run one after another as a single causal document, positions running on, no mask
/// between them, no padding. A later example is trained at the positions the ones before it
/// leave, so the policy meets its own format far past the length of any one demonstration.
/// Same errors and `too_long` as [`pack`].
pub fn concat(examples: &[Example], seq_len: usize, pad_id: u32) -> Result<Packing, TrainError> {
    let (bins, too_long) = bin_examples(examples, seq_len)?;
    let rows = bins
        .into_iter()
        .map(|mut items| {
            items.sort_unstable();
            let ids: Vec<u32> = items
                .iter()
                .flat_map(|&i| examples[i].ids.iter().copied())
                .collect();
            let mask: Vec<bool> = items
                .iter()
                .flat_map(|&i| examples[i].mask.iter().copied())
                .collect();
            PackedRow::single(&ids, &mask, pad_id)
        })
        .collect();
    Ok(Packing { rows, too_long })
}

/// What one SFT step did.
#[derive(Debug, Clone, PartialEq)]
pub struct SftStepStats {
    /// Mean cross-entropy over the trained-on tokens (nats/token), before the step.
    pub loss: f64,
    /// The balance loss (mean over micro-batches).
    pub aux_loss: f64,
    /// Trained-on tokens.
    pub tokens: usize,
    /// All tokens in the rows, padding included.
    pub row_tokens: usize,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Learning rate used.
    pub lr: f64,
    /// MoE health per layer, of the step's last micro-batch.
    pub health: Vec<MoeHealth>,
}

/// SFT trainer: owns the policy, its `VarStore` and the optimizer.
#[derive(Debug)]
pub struct SftTrainer {
    state: TrainState,
    cfg: SftConfig,
    tokens_seen: u64,
    /// The latest held-out loss measured ([`SftTrainer::record_heldout_loss`]).
    heldout_loss: Option<f64>,
}

impl SftTrainer {
    /// A trainer for `model`, whose parameters live in `vs`.
    pub fn new(vs: nn::VarStore, model: MoePolicy, cfg: SftConfig) -> Result<Self, TrainError> {
        cfg.validate()?;
        Ok(Self {
            state: TrainState::new(vs, model, cfg.optim.clone())?,
            cfg,
            tokens_seen: 0,
            heldout_loss: None,
        })
    }

    /// `rows` in micro-batches of at most `micro_batch_tokens` (padding included).
    fn micro_batches<'a>(&self, rows: &'a [PackedRow]) -> Vec<Vec<&'a PackedRow>> {
        micro_batches(rows, PackedRow::len, self.cfg.micro_batch_tokens)
            .into_iter()
            .map(|mb| mb.iter().collect())
            .collect()
    }

    /// One optimizer step on `rows` (run in micro-batches, gradients accumulated): the loss
    /// is the mean cross-entropy over all trained-on tokens of `rows`.
    pub fn step(&mut self, rows: &[PackedRow]) -> Result<SftStepStats, TrainError> {
        let n_total: usize = rows.iter().map(PackedRow::trained_tokens).sum();
        if n_total == 0 {
            return Err(TrainError::Data("no trained-on token in the batch".into()));
        }
        let device = self.state.device();
        let micro = self.micro_batches(rows);
        let n_micro = micro.len();
        self.state.opt.zero_grad();
        let (mut ce_sum, mut aux_sum) = (0.0, 0.0);
        let mut balance = BalanceStats::default();
        let mut health = Vec::new();
        for refs in &micro {
            let batch = PackedBatch::new(refs, device)?;
            // Token mean over the whole step; the balance loss is averaged over micro-batches.
            // L_sft = Σ_j −log π_θ(y_j) / N, in fp32 whatever the weights' dtype.
            let (trained, ce) = batch.train_nll(
                &self.state.model,
                &self.cfg.train,
                1.0 / n_total as f64,
                1.0 / n_micro as f64,
            )?;
            ce_sum += ce;
            aux_sum += trained.aux_loss;
            balance.merge(&trained.balance);
            health = trained.health;
        }
        let s = self.state.opt.step()?;
        self.state.model.update_balance(&balance)?;
        self.tokens_seen += n_total as u64;
        Ok(SftStepStats {
            loss: ce_sum / n_total as f64,
            aux_loss: aux_sum / n_micro as f64,
            tokens: n_total,
            row_tokens: rows.iter().map(PackedRow::len).sum(),
            grad_norm: s.grad_norm,
            lr: s.lr,
            health,
        })
    }

    /// Mean cross-entropy over the trained-on tokens of `rows`, without gradients (the
    /// held-out loss). Router noise is off.
    pub fn eval_loss(&self, rows: &[PackedRow]) -> Result<f64, TrainError> {
        let n_total: usize = rows.iter().map(PackedRow::trained_tokens).sum();
        if n_total == 0 {
            return Err(TrainError::Data("no trained-on token to evaluate".into()));
        }
        let device = self.state.device();
        let mut ce_sum = 0.0;
        tch::no_grad(|| -> Result<(), TrainError> {
            for refs in self.micro_batches(rows) {
                let batch = PackedBatch::new(&refs, device)?;
                let scores = batch.score(
                    &self.state.model,
                    &batch.unit_temperature(),
                    &self.cfg.train,
                )?;
                ce_sum += summed_nll(&scores.logp_n).double_value(&[]);
            }
            Ok(())
        })?;
        Ok(ce_sum / n_total as f64)
    }

    /// Whether a stopping rule is reached: `steps`, `token_budget`, or
    /// `heldout_loss_target` ([`SftTrainer::reached_heldout_target`]).
    pub fn done(&self) -> bool {
        (self.cfg.steps > 0 && self.state.opt.step_count() >= self.cfg.steps)
            || (self.cfg.token_budget > 0 && self.tokens_seen >= self.cfg.token_budget)
            || self.reached_heldout_target()
    }

    /// Whether the latest held-out loss is at or below `heldout_loss_target`.
    pub fn reached_heldout_target(&self) -> bool {
        matches!(
            (self.heldout_loss, self.cfg.heldout_loss_target),
            (Some(loss), Some(target)) if loss <= target
        )
    }

    /// Records a held-out loss measured on the current weights (restore a checkpoint's the
    /// same way), for `heldout_loss_target`.
    pub fn record_heldout_loss(&mut self, loss: f64) {
        self.heldout_loss = Some(loss);
    }

    /// The latest held-out loss recorded.
    pub fn heldout_loss(&self) -> Option<f64> {
        self.heldout_loss
    }

    /// Trained-on tokens seen so far (restore with [`SftTrainer::set_tokens_seen`]).
    pub fn tokens_seen(&self) -> u64 {
        self.tokens_seen
    }

    /// Restores the token count on resume.
    pub fn set_tokens_seen(&mut self, tokens: u64) {
        self.tokens_seen = tokens;
    }

    /// The configuration.
    pub fn config(&self) -> &SftConfig {
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

    /// Gives back the policy under training (to hand it to the RL trainer).
    pub fn into_state(self) -> TrainState {
        self.state
    }
}
