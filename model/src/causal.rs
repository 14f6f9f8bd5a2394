//! Causal attention over the tokens of a training forward: within each row, or within each
//! document of a packed row, never materialising a `[T, T]` mask.
//!
//! A packed row holds documents one after another ([`DocSpans`]: runs of equal document ids).
//! Causal attention within each document is causal attention over that run alone, so
//! [`causal_sdpa`] runs libtorch's causal `scaled_dot_product_attention` (flash on CPU and
//! CUDA) once per run: memory linear in the row. [`DocSpans::dense_mask_b1tt`] builds the
//! block-diagonal causal mask that does the same in one call with `O(T²)` memory: the
//! reference the tests hold it equal to (`model/tests/logits_boundary.rs`).
//!
//! Shape legend: `b` rows, `h` heads, `t` tokens, `k` head width.

use tch::{Device, Kind, Tensor};

use super::ModelError;

/// The documents of each row of a packed batch: `(start, len)` of every run of equal
/// document ids, in order, covering the row (padding is a run of its own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocSpans {
    /// Per row, its runs.
    pub rows: Vec<Vec<(i64, i64)>>,
}

impl DocSpans {
    /// The runs of `doc_ids [B, T]` (int64; a document's tokens are contiguous, as packing
    /// lays them out).
    pub fn from_doc_ids(doc_ids_bt: &Tensor) -> Result<Self, ModelError> {
        let (b, t) = doc_ids_bt.size2()?;
        let ids = Vec::<i64>::try_from(doc_ids_bt.to_device(Device::Cpu).reshape([-1]))?;
        let rows = (0..b as usize)
            .map(|r| {
                let row = &ids[r * t as usize..(r + 1) * t as usize];
                let mut runs = Vec::new();
                let mut start = 0;
                for i in 1..=row.len() {
                    if i == row.len() || row[i] != row[start] {
                        runs.push((start as i64, (i - start) as i64));
                        start = i;
                    }
                }
                runs
            })
            .collect();
        Ok(Self { rows })
    }

    /// The block-diagonal causal mask `[B, 1, T, T]` (`true` = may attend) of these runs:
    /// the reference for [`causal_sdpa`], `O(T²)` memory.
    pub fn dense_mask_b1tt(&self, t: i64, device: Device) -> Tensor {
        let doc: Vec<i64> = self
            .rows
            .iter()
            .flat_map(|runs| {
                runs.iter()
                    .enumerate()
                    .flat_map(|(i, &(_, len))| std::iter::repeat_n(i as i64, len as usize))
            })
            .collect();
        let doc_bt = Tensor::from_slice(&doc)
            .view([self.rows.len() as i64, t])
            .to_device(device);
        let same_btt = doc_bt.unsqueeze(2).eq_tensor(&doc_bt.unsqueeze(1));
        let causal_tt = Tensor::ones([t, t], (Kind::Bool, device)).tril(0);
        same_btt.logical_and(&causal_tt).unsqueeze(1)
    }
}

/// Causal attention `[B, H, T, K]` of `q`, `k`, `v` (`[B, H, T, K]` each, equal widths for the
/// flash kernels): within each row, or with `docs` within each of its documents.
pub fn causal_sdpa(
    q_bhtk: &Tensor,
    k_bhtk: &Tensor,
    v_bhtk: &Tensor,
    scale: f64,
    docs: Option<&DocSpans>,
) -> Tensor {
    let sdpa = |q: &Tensor, k: &Tensor, v: &Tensor| {
        Tensor::scaled_dot_product_attention(q, k, v, None::<&Tensor>, 0.0, true, scale, false)
    };
    let Some(docs) = docs else {
        return sdpa(q_bhtk, k_bhtk, v_bhtk);
    };
    let rows: Vec<Tensor> = docs
        .rows
        .iter()
        .enumerate()
        .map(|(b, runs)| {
            let b = b as i64;
            let (q, k, v) = (
                q_bhtk.narrow(0, b, 1),
                k_bhtk.narrow(0, b, 1),
                v_bhtk.narrow(0, b, 1),
            );
            if runs.len() == 1 {
                return sdpa(&q, &k, &v);
            }
            let parts: Vec<Tensor> = runs
                .iter()
                .map(|&(s, n)| sdpa(&q.narrow(2, s, n), &k.narrow(2, s, n), &v.narrow(2, s, n)))
                .collect();
            Tensor::cat(&parts, 2)
        })
        .collect();
    Tensor::cat(&rows, 0)
}
