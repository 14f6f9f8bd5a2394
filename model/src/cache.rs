//! The KV cache: per cache layer two tensors, `part1 [B, S, w1]` and `part2 [B, S, w2]`, plus
//! each sequence's length. With MLA a cache layer is a latent-owning layer, `part1` its
//! normalised latent `c_kv` and `part2` its rotated RoPE key `k_pe`; with grouped-query
//! attention it is every layer, `part1` its rotated keys and `part2` its values, heads
//! flattened (`[B, S, g·e]`). [`ModelConfig::cache_widths`] gives the widths.
//!
//! Rows are left-aligned: row `b` holds positions `0..lens[b]`, and slots beyond are padding
//! that the attention mask hides. So one cache serves a batch of sequences of different
//! lengths, and appending a new turn to a sequence costs only the new tokens (prefix reuse).
//! Capacity grows by doubling.

use tch::{Device, Kind, Tensor};

use super::config::ModelConfig;
use super::ModelError;

/// The KV cache of a batch of sequences.
#[derive(Debug)]
pub struct KvCache {
    /// Per cache layer: the latent (MLA) or the keys (GQA), `[B, capacity, width1]`.
    pub(crate) part1: Vec<Tensor>,
    /// Per cache layer: the RoPE key (MLA) or the values (GQA), `[B, capacity, width2]`.
    pub(crate) part2: Vec<Tensor>,
    /// `latent_token_shift` only: each row's last `latent_shift_taps` layer inputs
    /// `[B, taps, d]` (oldest first) per latent layer, the "previous tokens" of the row's next
    /// token. Empty otherwise.
    pub(crate) last_h: Vec<Tensor>,
    lens: Vec<i64>,
    capacity: i64,
    width1: i64,
    width2: i64,
}

impl KvCache {
    /// An empty cache for `batch` sequences with room for `capacity` tokens each.
    pub fn new(cfg: &ModelConfig, batch: usize, capacity: i64, kind: Kind, device: Device) -> Self {
        let n = cfg.n_latent_layers() as usize;
        let (width1, width2) = cfg.cache_widths();
        let b = batch as i64;
        let cap = capacity.max(1);
        KvCache {
            part1: (0..n)
                .map(|_| Tensor::zeros([b, cap, width1], (kind, device)))
                .collect(),
            part2: (0..n)
                .map(|_| Tensor::zeros([b, cap, width2], (kind, device)))
                .collect(),
            last_h: match cfg.shift_taps() as i64 {
                0 => Vec::new(),
                taps => (0..n)
                    .map(|_| Tensor::zeros([b, taps, cfg.hidden_size], (kind, device)))
                    .collect(),
            },
            lens: vec![0; batch],
            capacity: cap,
            width1,
            width2,
        }
    }

    /// Number of sequences.
    pub fn batch(&self) -> usize {
        self.lens.len()
    }

    /// Tokens cached per sequence.
    pub fn lens(&self) -> &[i64] {
        &self.lens
    }

    /// Allocated slots per sequence.
    pub fn capacity(&self) -> i64 {
        self.capacity
    }

    /// Bytes cached for one token (all layers).
    pub fn bytes_per_token(&self) -> i64 {
        let elem = self
            .part1
            .first()
            .map_or(4, |t| t.kind().elt_size_in_bytes() as i64);
        self.part1.len() as i64 * (self.width1 + self.width2) * elem
    }

    /// Bytes holding live tokens (excluding padding and spare capacity).
    pub fn used_bytes(&self) -> i64 {
        self.lens.iter().sum::<i64>() * self.bytes_per_token()
    }

    /// Grows every layer to hold at least `needed` tokens per sequence.
    pub(crate) fn ensure_capacity(&mut self, needed: i64) {
        if needed <= self.capacity {
            return;
        }
        let new_cap = needed.max(2 * self.capacity);
        let grow = |t: &Tensor| {
            let (b, s, w) = t.size3().expect("cache is [B, S, w]");
            let pad = Tensor::zeros([b, new_cap - s, w], (t.kind(), t.device()));
            Tensor::cat(&[t, &pad], 1)
        };
        self.part1 = self.part1.iter().map(grow).collect();
        self.part2 = self.part2.iter().map(grow).collect();
        self.capacity = new_cap;
    }

    /// Writes new tokens' two parts (MLA: latent and RoPE key; GQA: keys and values) at
    /// positions `pos_bt` into layer slot `slot`.
    pub(crate) fn write(
        &mut self,
        slot: usize,
        pos_bt: &Tensor,
        part1_btw: &Tensor,
        part2_btw: &Tensor,
    ) {
        let (b, t) = pos_bt.size2().expect("positions are [B, T]");
        let idx_c = pos_bt.unsqueeze(-1).expand([b, t, self.width1], false);
        let idx_r = pos_bt.unsqueeze(-1).expand([b, t, self.width2], false);
        let _ = self.part1[slot].scatter_(1, &idx_c, part1_btw);
        let _ = self.part2[slot].scatter_(1, &idx_r, part2_btw);
    }

    /// Layer slot `slot`'s two parts at positions `0..s`: `(part1 [B, s, w1], part2 [B, s, w2])`,
    /// views of the cache.
    pub(crate) fn read(&self, slot: usize, s: i64) -> (Tensor, Tensor) {
        (
            self.part1[slot].narrow(1, 0, s),
            self.part2[slot].narrow(1, 0, s),
        )
    }

    /// `latent_token_shift`: returns layer slot `slot`'s kept inputs followed by the new ones,
    /// `[last_h (taps) ; h (t)]` as `[B, taps + t, d]`, and keeps the `taps` of them that
    /// `keep_bkd` (a gather index along time, `[B, taps, d]`) picks for the next append.
    pub(crate) fn push_inputs(&mut self, slot: usize, h_btd: &Tensor, keep_bkd: &Tensor) -> Tensor {
        let hist = Tensor::cat(&[&self.last_h[slot], h_btd], 1);
        self.last_h[slot] = hist.gather(1, keep_bkd, false);
        hist
    }

    /// Advances sequence `b` by `new_b[b]` tokens (after all layers have written).
    pub(crate) fn advance_rows(&mut self, new_b: &[i64]) {
        self.lens.iter_mut().zip(new_b).for_each(|(l, n)| *l += n);
    }

    /// Fills every slot with standard-normal values and sets row `b`'s length to `lens[b]`:
    /// a cache shaped as a long prefill leaves it, without running one (benchmarks of decode
    /// steps at long contexts, whose cost does not depend on the values).
    pub fn fill_random(&mut self, lens: &[i64]) -> Result<(), ModelError> {
        if lens.len() != self.lens.len() || lens.iter().any(|&l| l < 0 || l > self.capacity) {
            return Err(ModelError::Input(format!(
                "fill_random: {} row lengths for {} rows of capacity {}: {lens:?}",
                lens.len(),
                self.lens.len(),
                self.capacity
            )));
        }
        tch::no_grad(|| -> Result<(), ModelError> {
            for t in self.part1.iter_mut().chain(self.part2.iter_mut()) {
                let noise = t.f_randn_like()?;
                t.f_copy_(&noise)?;
            }
            Ok(())
        })?;
        self.lens.copy_from_slice(lens);
        Ok(())
    }

    /// Empties sequence `row` (its slots are reused by whatever is appended next).
    pub fn reset_row(&mut self, row: usize) {
        if let Some(l) = self.lens.get_mut(row) {
            *l = 0;
        }
    }

    /// Empties every sequence, e.g. when new weights make every cached latent stale.
    pub fn reset_all(&mut self) {
        self.lens.iter_mut().for_each(|l| *l = 0);
    }

    /// Writes `sub` (e.g. rows taken out with [`select`](Self::select) and then extended)
    /// back into rows `rows` of this cache.
    pub fn put(&mut self, rows: &[usize], sub: &KvCache) -> Result<(), ModelError> {
        if rows.len() != sub.batch()
            || sub.part1.len() != self.part1.len()
            || sub.last_h.len() != self.last_h.len()
            || sub.width1 != self.width1
            || sub.width2 != self.width2
        {
            return Err(ModelError::Input(format!(
                "put of {} cache rows into {} slots (or from another config)",
                sub.batch(),
                rows.len()
            )));
        }
        if let Some(bad) = rows.iter().find(|r| **r >= self.batch()) {
            return Err(ModelError::Input(format!(
                "cache row {bad} out of range (batch {})",
                self.batch()
            )));
        }
        self.ensure_capacity(sub.capacity);
        let dev = self.part1.first().map_or(Device::Cpu, |t| t.device());
        let idx =
            Tensor::from_slice(&rows.iter().map(|r| *r as i64).collect::<Vec<_>>()).to_device(dev);
        let s = sub.capacity;
        for (dst, src) in self.part1.iter_mut().zip(&sub.part1) {
            let _ = dst.narrow(1, 0, s).index_copy_(0, &idx, src);
        }
        for (dst, src) in self.part2.iter_mut().zip(&sub.part2) {
            let _ = dst.narrow(1, 0, s).index_copy_(0, &idx, src);
        }
        for (dst, src) in self.last_h.iter_mut().zip(&sub.last_h) {
            let _ = dst.index_copy_(0, &idx, src);
        }
        for (&r, &len) in rows.iter().zip(&sub.lens) {
            self.lens[r] = len;
        }
        Ok(())
    }

    /// Runs `f` on the first `n` rows as a cache of their own that shares this one's
    /// storage (no copy), with room for `extra` more tokens per row; their lengths come
    /// back afterwards. A decode step over the low rows of a mostly idle cache uses it.
    pub fn with_prefix<R>(&mut self, n: usize, extra: i64, f: impl FnOnce(&mut KvCache) -> R) -> R {
        let n = n.min(self.batch());
        let needed = self.lens[..n].iter().copied().max().unwrap_or(0) + extra;
        self.ensure_capacity(needed);
        let mut view = KvCache {
            part1: self
                .part1
                .iter()
                .map(|t| t.narrow(0, 0, n as i64))
                .collect(),
            part2: self
                .part2
                .iter()
                .map(|t| t.narrow(0, 0, n as i64))
                .collect(),
            last_h: self
                .last_h
                .iter()
                .map(|t| t.narrow(0, 0, n as i64))
                .collect(),
            lens: self.lens[..n].to_vec(),
            capacity: self.capacity,
            width1: self.width1,
            width2: self.width2,
        };
        let r = f(&mut view);
        if view.capacity == self.capacity {
            self.lens[..n].copy_from_slice(&view.lens);
            // The forward replaces `last_h` rather than writing into the view.
            for (dst, src) in self.last_h.iter_mut().zip(&view.last_h) {
                dst.narrow(0, 0, n as i64).copy_(src);
            }
        } else {
            // `f` appended more than `extra`: the view grew into tensors of its own.
            let rows: Vec<usize> = (0..n).collect();
            self.put(&rows, &view)
                .expect("a view of this cache fits back into it");
        }
        r
    }

    /// Keeps the sequences `rows` (in that order), e.g. to drop finished episodes.
    pub fn select(&self, rows: &[usize]) -> Result<KvCache, ModelError> {
        if let Some(bad) = rows.iter().find(|r| **r >= self.batch()) {
            return Err(ModelError::Input(format!(
                "cache row {bad} out of range (batch {})",
                self.batch()
            )));
        }
        let dev = self.part1.first().map_or(Device::Cpu, |t| t.device());
        let idx =
            Tensor::from_slice(&rows.iter().map(|r| *r as i64).collect::<Vec<_>>()).to_device(dev);
        Ok(KvCache {
            part1: self.part1.iter().map(|t| t.index_select(0, &idx)).collect(),
            part2: self.part2.iter().map(|t| t.index_select(0, &idx)).collect(),
            last_h: self
                .last_h
                .iter()
                .map(|t| t.index_select(0, &idx))
                .collect(),
            lens: rows.iter().map(|r| self.lens[*r]).collect(),
            capacity: self.capacity,
            width1: self.width1,
            width2: self.width2,
        })
    }

    /// Stacks caches (each possibly of a different length and capacity) into one batch, so
    /// prompts prefilled one by one can then decode together.
    pub fn concat(caches: &[KvCache]) -> Result<KvCache, ModelError> {
        let first = caches
            .first()
            .ok_or_else(|| ModelError::Input("concat of zero caches".into()))?;
        let cap = caches.iter().map(|c| c.capacity).max().unwrap_or(1);
        let mut grown = Vec::with_capacity(caches.len());
        for c in caches {
            if c.part1.len() != first.part1.len()
                || c.last_h.len() != first.last_h.len()
                || c.width1 != first.width1
                || c.width2 != first.width2
            {
                return Err(ModelError::Input(
                    "concat of caches from different configs".into(),
                ));
            }
            let mut c2 = KvCache {
                part1: c.part1.iter().map(|t| t.shallow_clone()).collect(),
                part2: c.part2.iter().map(|t| t.shallow_clone()).collect(),
                last_h: c.last_h.iter().map(|t| t.shallow_clone()).collect(),
                lens: c.lens.clone(),
                capacity: c.capacity,
                width1: c.width1,
                width2: c.width2,
            };
            c2.ensure_capacity(cap);
            // ensure_capacity may double past `cap`; cut back so all agree.
            c2.part1 = c2.part1.iter().map(|t| t.narrow(1, 0, cap)).collect();
            c2.part2 = c2.part2.iter().map(|t| t.narrow(1, 0, cap)).collect();
            grown.push(c2);
        }
        let n = first.part1.len();
        Ok(KvCache {
            part1: (0..n)
                .map(|l| Tensor::cat(&grown.iter().map(|c| &c.part1[l]).collect::<Vec<_>>(), 0))
                .collect(),
            part2: (0..n)
                .map(|l| Tensor::cat(&grown.iter().map(|c| &c.part2[l]).collect::<Vec<_>>(), 0))
                .collect(),
            last_h: (0..first.last_h.len())
                .map(|l| Tensor::cat(&grown.iter().map(|c| &c.last_h[l]).collect::<Vec<_>>(), 0))
                .collect(),
            lens: grown.iter().flat_map(|c| c.lens.clone()).collect(),
            capacity: cap,
            width1: first.width1,
            width2: first.width2,
        })
    }
}
