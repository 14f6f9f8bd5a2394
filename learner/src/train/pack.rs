//! Sequence packing: several documents per row, each with its own positions (restarting at 0)
//! and document id, so that [`MoePolicy::trunk_packed`](corvid_model::MoePolicy::trunk_packed)
//! keeps attention inside each document.
//!
//! Layout of a row of length `T` holding documents `d_0, d_1, …` then padding:
//!
//! ```text
//! tokens     d0[0] d0[1] … d0[n0−1] d1[0] … | pad …
//! positions  0     1       n0−1     0       | 0 …
//! doc_ids    0     0       0        1       | −1 …
//! targets    d0[1] d0[2] … pad      d1[1] … | pad …      (next token of the same document)
//! loss_mask  m0[1] m0[2] … false    m1[1] … | false …    (is that next token trained on)
//! ```
//!
//! Rows of one micro-batch may differ in length: [`PackedBatch`] pads them to the longest.
//! When every row holds a single document from position 0 (then padding), the batch runs
//! the plain causal trunk: one attention call per row instead of one per document.
//!
//! Shape legend: `b` rows, `t` row length, `n` trained-on tokens.

use std::ops::Range;

use tch::{Device, Kind, Tensor};

use super::config::TrainConfig;
use super::loss::summed_nll;
use super::TrainError;
use corvid_model::{
    head, BalanceStats, Checkpoint, ModelError, MoeHealth, MoePolicy, RouteAgreement, RouteOpts,
    TokenScores, Trunk,
};

/// One packed row; all vectors have the row length.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedRow {
    /// Input token ids (`pad_id` after the last document).
    pub tokens: Vec<i64>,
    /// Position of each token within its document.
    pub positions: Vec<i64>,
    /// Index of the document within the row; `-1` for padding.
    pub doc_ids: Vec<i64>,
    /// The next token of the same document (`pad_id` at a document's last token).
    pub targets: Vec<i64>,
    /// Whether `targets[i]` is trained on.
    pub loss_mask: Vec<bool>,
    /// The episode format's pad id, which [`PackedBatch::new`] fills shorter rows with.
    pub pad_id: u32,
    /// Recorded expert ids of each position (the MoE layers' `k` ids each, `-1` where none),
    /// or empty: the row carries no routes.
    pub routes: Vec<i32>,
}

impl PackedRow {
    /// An empty (all padding) row of length `len`.
    pub fn empty(len: usize, pad_id: u32) -> Self {
        Self {
            tokens: vec![pad_id as i64; len],
            positions: vec![0; len],
            doc_ids: vec![-1; len],
            targets: vec![pad_id as i64; len],
            loss_mask: vec![false; len],
            pad_id,
            routes: Vec::new(),
        }
    }

    /// The row length.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the row has length 0.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Trained-on tokens in the row.
    pub fn trained_tokens(&self) -> usize {
        self.loss_mask.iter().filter(|m| **m).count()
    }

    /// A row holding exactly one document (no padding; `pad_id` is its last target).
    pub fn single(ids: &[u32], mask: &[bool], pad_id: u32) -> Self {
        let mut row = Self::empty(ids.len(), pad_id);
        row.put(0, 0, ids, mask);
        row
    }

    /// Whether the row is one document from position 0, then padding only.
    fn is_single_document(&self) -> bool {
        let n = self.doc_ids.iter().take_while(|d| **d == 0).count();
        self.doc_ids[n..].iter().all(|d| *d == -1)
            && self.positions[..n]
                .iter()
                .enumerate()
                .all(|(i, p)| *p == i as i64)
    }

    /// Writes document `doc` (`ids`, `mask[i]` = token `i` is trained on) at `offset`.
    /// Token 0 of a document is never a target (nothing precedes it).
    pub(crate) fn put(&mut self, offset: usize, doc: i64, ids: &[u32], mask: &[bool]) {
        let n = ids.len();
        for i in 0..n {
            let at = offset + i;
            self.tokens[at] = ids[i] as i64;
            self.positions[at] = i as i64;
            self.doc_ids[at] = doc;
            if i + 1 < n {
                self.targets[at] = ids[i + 1] as i64;
                self.loss_mask[at] = mask[i + 1];
            }
        }
    }
}

/// First-fit decreasing bin packing of `lengths` into bins of `capacity`: returns, per bin,
/// the indices it holds (in the order placed). Lengths above `capacity` are left out and
/// returned second. Deterministic: ties keep input order.
pub fn first_fit_decreasing(lengths: &[usize], capacity: usize) -> (Vec<Vec<usize>>, Vec<usize>) {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by(|&a, &b| lengths[b].cmp(&lengths[a]).then(a.cmp(&b)));
    let mut bins: Vec<(usize, Vec<usize>)> = Vec::new();
    let mut too_long = Vec::new();
    for i in order {
        let len = lengths[i];
        if len > capacity {
            too_long.push(i);
            continue;
        }
        match bins.iter_mut().find(|(used, _)| used + len <= capacity) {
            Some((used, items)) => {
                *used += len;
                items.push(i);
            }
            None => bins.push((len, vec![i])),
        }
    }
    too_long.sort_unstable();
    (bins.into_iter().map(|(_, items)| items).collect(), too_long)
}

/// Splits `items` (in order) into consecutive micro-batches whose padded size — items × the
/// longest item's `len` — stays within `budget` tokens; every micro-batch holds at least one.
pub fn micro_batches<T>(items: &[T], len: impl Fn(&T) -> usize, budget: usize) -> Vec<&[T]> {
    let mut out = Vec::new();
    let (mut start, mut longest) = (0, 0);
    for (i, item) in items.iter().enumerate() {
        let grown = longest.max(len(item));
        if i > start && (i - start + 1) * grown > budget {
            out.push(&items[start..i]);
            (start, longest) = (i, len(item));
        } else {
            longest = grown;
        }
    }
    if start < items.len() {
        out.push(&items[start..]);
    }
    out
}

/// A micro-batch of packed rows as tensors `[B, T]` on one device.
#[derive(Debug)]
pub struct PackedBatch {
    /// Input ids, int64 `[B, T]`.
    pub tokens_bt: Tensor,
    /// Positions, int64 `[B, T]`.
    pub positions_bt: Tensor,
    /// Document ids, int64 `[B, T]`.
    pub doc_ids_bt: Tensor,
    /// Flat indices (into `B·T`) of the trained-on positions, int64 `[N]`.
    pub idx_n: Tensor,
    /// Targets at those positions, int64 `[N]`.
    pub targets_n: Tensor,
    /// `N`.
    pub n_trained: usize,
    /// Every row is one document from position 0 (then padding): the causal forward serves.
    pub single_document: bool,
    /// Recorded expert ids per position, int32 `[B, T, L·k]` on the CPU (`-1` where none),
    /// when some row carries routes. They stay on the host: each MoE layer moves its own
    /// `[n, k]` slice to the device when it routes, not the whole table for the update.
    pub routes_btp: Option<Tensor>,
}

impl PackedBatch {
    /// Stacks rows into tensors (one copy per field), padding shorter rows to the longest.
    pub fn new(rows: &[&PackedRow], device: Device) -> Result<Self, TrainError> {
        let t = rows.iter().map(|r| r.len()).max().unwrap_or(0);
        if rows.is_empty() || rows.iter().any(|r| r.is_empty()) {
            return Err(TrainError::Data("empty micro-batch or row".into()));
        }
        let b = rows.len();
        let pad_id = rows[0].pad_id;
        if let Some(r) = rows.iter().find(|r| r.pad_id != pad_id) {
            return Err(TrainError::Data(format!(
                "rows of one micro-batch pad with {pad_id} and {}",
                r.pad_id
            )));
        }
        // Padding: the pad token at position 0 of no document, never a target.
        let flat = |f: fn(&PackedRow) -> &Vec<i64>, pad: i64| -> Tensor {
            let mut v = Vec::with_capacity(b * t);
            for r in rows {
                v.extend_from_slice(f(r));
                v.resize(v.len() + t - r.len(), pad);
            }
            Tensor::from_slice(&v)
                .view([b as i64, t as i64])
                .to_device(device)
        };
        let mut idx = Vec::new();
        let mut targets = Vec::new();
        for (ri, r) in rows.iter().enumerate() {
            for (i, &m) in r.loss_mask.iter().enumerate() {
                if m {
                    idx.push((ri * t + i) as i64);
                    targets.push(r.targets[i]);
                }
            }
        }
        let routes_btp = match rows.iter().map(|r| r.routes.len() / r.len()).max() {
            Some(per) if per > 0 => {
                let mut v = Vec::with_capacity(b * t * per);
                for r in rows {
                    if r.routes.len() == r.len() * per {
                        v.extend_from_slice(&r.routes);
                    } else {
                        v.resize(v.len() + r.len() * per, -1);
                    }
                    v.resize(v.len() + (t - r.len()) * per, -1);
                }
                Some(Tensor::from_slice(&v).view([b as i64, t as i64, per as i64]))
            }
            _ => None,
        };
        Ok(Self {
            routes_btp,
            tokens_bt: flat(|r| &r.tokens, i64::from(pad_id)),
            positions_bt: flat(|r| &r.positions, 0),
            doc_ids_bt: flat(|r| &r.doc_ids, -1),
            n_trained: idx.len(),
            single_document: rows.iter().all(|r| r.is_single_document()),
            idx_n: Tensor::from_slice(&idx).to_device(device),
            targets_n: Tensor::from_slice(&targets).to_device(device),
        })
    }

    /// The model's trunk over the batch: causal when every row is a single document,
    /// otherwise with the per-document mask; routes given, replayed or recorded as `routes`
    /// says.
    pub fn trunk(
        &self,
        model: &MoePolicy,
        train: bool,
        checkpoint: Checkpoint,
        routes: RouteOpts<'_>,
    ) -> Result<Trunk, ModelError> {
        let packing = (!self.single_document).then_some((&self.positions_bt, &self.doc_ids_bt));
        model.trunk_routed(&self.tokens_bt, packing, train, checkpoint, routes)
    }

    /// The rows' recorded routes as the model's route table `[B, T, L, k]` (on the CPU),
    /// when some row carries them; an error when their width is not the model's `L·k`.
    pub fn recorded_routes(&self, model: &MoePolicy) -> Result<Option<Tensor>, ModelError> {
        let c = model.config();
        let Some(r) = &self.routes_btp else {
            return Ok(None);
        };
        let (b, t, per) = r.size3()?;
        let want = [b, t, c.n_moe_layers(), c.num_experts_per_tok];
        r.f_view(want).map(Some).map_err(|_| {
            ModelError::Input(format!(
                "rows carry {per} route ids per token, but the model routes {} MoE layers × {}",
                want[2], want[3]
            ))
        })
    }

    /// The hidden states of the trained-on positions, `[N, d]`.
    fn hidden_n(&self, trunk: &Trunk) -> Result<Tensor, ModelError> {
        let d = trunk.hidden_btd.size3()?.2;
        Ok(trunk.hidden_btd.view([-1, d]).index_select(0, &self.idx_n))
    }

    /// `log π(target)` and entropy of every trained-on token at `1/τ = inv_temp [N, 1]`,
    /// without gradients and without router noise; never more than one chunk of logits.
    pub fn score(
        &self,
        model: &MoePolicy,
        inv_temp_n1: &Tensor,
        cfg: &TrainConfig,
    ) -> Result<TokenScores, ModelError> {
        Ok(self
            .score_routed(model, inv_temp_n1, cfg, RouteOpts::default())?
            .scores)
    }

    /// [`PackedBatch::score`] with routes given, replayed or recorded as `routes` says.
    pub fn score_routed(
        &self,
        model: &MoePolicy,
        inv_temp_n1: &Tensor,
        cfg: &TrainConfig,
        routes: RouteOpts<'_>,
    ) -> Result<RoutedScores, ModelError> {
        tch::no_grad(|| {
            let trunk = self.trunk(model, false, Checkpoint::None, routes)?;
            let rows = cfg.chunk_rows(model.config().vocab_size);
            let scores = head::score_chunked(
                &self.hidden_n(&trunk)?,
                model.head_weight_vd(),
                &self.targets_n,
                inv_temp_n1,
                rows,
            )?;
            Ok(RoutedScores {
                scores,
                agreement: trunk.agreement,
                routes_btlk: trunk.routes_btlk,
            })
        })
    }

    /// One training forward and backward: the trunk (checkpointed as `cfg` says), then the
    /// head a chunk of trained-on positions at a time, where `loss(range, scores)` gives the
    /// loss of the positions `range` from their scores (with gradients), then the trunk's
    /// backward with `aux_weight ×` the balance loss. Gradients add into the parameters.
    pub fn train(
        &self,
        model: &MoePolicy,
        inv_temp_n1: &Tensor,
        cfg: &TrainConfig,
        aux_weight: f64,
        loss: impl FnMut(Range<i64>, &TokenScores) -> Result<Tensor, ModelError>,
    ) -> Result<Trained, ModelError> {
        let routes = RouteOpts::default();
        self.train_routed(model, inv_temp_n1, cfg, aux_weight, routes, loss)
    }

    /// [`PackedBatch::train`] with routes given or replayed as `routes` says.
    pub fn train_routed(
        &self,
        model: &MoePolicy,
        inv_temp_n1: &Tensor,
        cfg: &TrainConfig,
        aux_weight: f64,
        routes: RouteOpts<'_>,
        loss: impl FnMut(Range<i64>, &TokenScores) -> Result<Tensor, ModelError>,
    ) -> Result<Trained, ModelError> {
        let mut trunk = self.trunk(model, true, cfg.checkpoint, routes)?;
        let (b, t, d) = trunk.hidden_btd.size3()?;
        let rows = cfg.chunk_rows(model.config().vocab_size);
        let (scores, grad_nd) = head::backward_chunked(
            &self.hidden_n(&trunk)?,
            model.head_weight_vd(),
            &self.targets_n,
            inv_temp_n1,
            rows,
            loss,
        )?;
        let grad_btd = Tensor::zeros([b * t, d], (grad_nd.kind(), grad_nd.device()))
            .index_add(0, &self.idx_n, &grad_nd)
            .view([b, t, d]);
        let trained = Trained {
            scores,
            aux_loss: trunk.aux_loss.double_value(&[]),
            health: std::mem::take(&mut trunk.health),
            balance: std::mem::take(&mut trunk.balance),
            agreement: std::mem::take(&mut trunk.agreement),
        };
        model.backward(trunk, &grad_btd, aux_weight)?;
        Ok(trained)
    }

    /// [`PackedBatch::train`] on the cross-entropy at temperature 1 (SFT, PPO-ptx):
    /// `scale · Σ_j −log π_θ(y_j)` over the trained-on tokens. Returns the trunk's statistics
    /// and the unscaled sum.
    pub fn train_nll(
        &self,
        model: &MoePolicy,
        cfg: &TrainConfig,
        scale: f64,
        aux_weight: f64,
    ) -> Result<(Trained, f64), ModelError> {
        let mut nll_sum = 0.0;
        let trained = self.train(model, &self.unit_temperature(), cfg, aux_weight, |_, s| {
            let nll = summed_nll(&s.logp_n);
            nll_sum += nll.double_value(&[]);
            Ok(nll * scale)
        })?;
        Ok((trained, nll_sum))
    }

    /// `1/τ = 1` for every trained-on token (SFT, PPO-ptx).
    pub fn unit_temperature(&self) -> Tensor {
        Tensor::ones(
            [self.n_trained as i64, 1],
            (Kind::Float, self.idx_n.device()),
        )
    }
}

/// What [`PackedBatch::train`] measured.
#[derive(Debug)]
pub struct Trained {
    /// Every trained-on token's scores (detached).
    pub scores: TokenScores,
    /// The balance loss's value.
    pub aux_loss: f64,
    /// Health per MoE layer.
    pub health: Vec<MoeHealth>,
    /// Balance statistics per MoE layer.
    pub balance: BalanceStats,
    /// Per MoE layer, agreement with the given routes (empty when none were given).
    pub agreement: Vec<RouteAgreement>,
}

/// What [`PackedBatch::score_routed`] returns.
#[derive(Debug)]
pub struct RoutedScores {
    /// Every trained-on token's scores.
    pub scores: TokenScores,
    /// Per MoE layer, agreement with the given routes (empty when none were given).
    pub agreement: Vec<RouteAgreement>,
    /// The model's own choice `[B, T, L, k]`, when recording.
    pub routes_btlk: Option<Tensor>,
}

/// `[N]` values of a per-token field of `rows` at the trained-on positions, as float32.
pub(crate) fn gather_trained(rows: &[&PackedRow], field: impl Fn(usize, usize) -> f32) -> Tensor {
    let mut out = Vec::new();
    for (ri, r) in rows.iter().enumerate() {
        for (i, &m) in r.loss_mask.iter().enumerate() {
            if m {
                out.push(field(ri, i));
            }
        }
    }
    Tensor::from_slice(&out).to_kind(Kind::Float)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_batches_stay_within_the_padded_budget() {
        let lens = [9, 8, 8, 5, 4, 4, 4, 30];
        let mbs = micro_batches(&lens, |l| *l, 20);
        // 9+8 (2×9=18) | 8+5 (2×8=16) | 4+4+4 (12; adding 30 would pad to 120) | 30 alone.
        assert_eq!(
            mbs,
            vec![&lens[0..2], &lens[2..4], &lens[4..7], &lens[7..8]]
        );
        assert!(micro_batches(&[] as &[usize], |l| *l, 8).is_empty());
    }

    #[test]
    fn ffd_fills_bins_and_sets_aside_the_too_long() {
        let (bins, long) = first_fit_decreasing(&[3, 7, 2, 9, 5, 4], 8);
        assert_eq!(long, vec![3]);
        // 7 | 5+3 | 4+2 ; every bin within capacity, every short item placed once.
        let lens = [3, 7, 2, 9, 5, 4];
        let mut seen: Vec<usize> = bins.iter().flatten().copied().collect();
        seen.sort_unstable();
        assert_eq!(seen, vec![0, 1, 2, 4, 5]);
        assert!(bins
            .iter()
            .all(|b| b.iter().map(|&i| lens[i]).sum::<usize>() <= 8));
        assert_eq!(bins.len(), 3);
    }

    #[test]
    fn put_shifts_targets_and_mask_by_one() {
        let mut row = PackedRow::empty(6, 0);
        row.put(1, 0, &[10, 11, 12], &[false, true, true]);
        assert_eq!(row.tokens, vec![0, 10, 11, 12, 0, 0]);
        assert_eq!(row.positions, vec![0, 0, 1, 2, 0, 0]);
        assert_eq!(row.doc_ids, vec![-1, 0, 0, 0, -1, -1]);
        assert_eq!(row.targets, vec![0, 11, 12, 0, 0, 0]);
        assert_eq!(row.loss_mask, vec![false, true, true, false, false, false]);
    }
}
