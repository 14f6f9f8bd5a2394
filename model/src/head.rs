//! The logits boundary: per-token log-probs, entropy and their gradients from the final hidden
//! states, without ever holding `[T, V]` logits.
//!
//! For the selected positions `n` (hidden states `h [N, d]`, targets `y [N]`, inverse
//! temperatures `1/τ [N, 1]`) and the head `W [V, d]`:
//!
//! ```text
//! z      = (h · Wᵀ) / τ                      [n, V], one chunk of positions at a time
//! logp_n = z[y] − logsumexp(z)               log π(y) at the sampling temperature
//! H_n    = −Σ_v softmax(z)_v · log softmax(z)_v
//! ```
//!
//! [`score_full`] computes them over all `N` rows at once, with autograd: the reference.
//! [`score_chunked`] computes them a chunk of rows at a time without gradients (scoring,
//! `π_prox`, `π_ref`). [`backward_chunked`] trains through them: for each chunk it builds the
//! chunk's logits from a detached copy of its rows of `h`, hands the chunk's scores to the caller's loss,
//! and runs that loss's backward, which adds into the head's gradient and the copy's; the
//! chunk's logits are freed before the next one. It returns the gradient of the summed loss
//! with respect to `h`, which the caller pushes through the trunk in one backward
//! ([`MoePolicy::backward`](crate::MoePolicy::backward)). A token's loss terms depend only on
//! its own log-prob and entropy, so the sum of the chunks' losses is the loss, and the
//! gradients equal the reference's (tests: `model/tests/logits_boundary.rs`).
//!
//! Shape legend: `n` selected positions, `d` hidden, `v` vocabulary.

use std::ops::Range;

use tch::{Kind, Tensor};

use super::ModelError;

/// Bytes of fp32 logits one chunk may hold: 64 MiB, ~110 positions at Qwen3's 151,936 ids and
/// every position of a short row at a byte vocabulary. Above glibc's 32 MiB ceiling for mapping
/// a block on its own, so each chunk's buffers go back to the system when freed: 32 MiB chunks
/// left 4.9 GB of heap resident at 8K tokens, 64 MiB ones 0.77 GB
/// (`docs/bench/log.md`, 2026-12-06 "long trajectories"). A chunk's backward holds about four
/// such buffers (logits, log-softmax, its exponent, the gradient).
pub const DEFAULT_CHUNK_BYTES: usize = 64 << 20;

/// Rows per chunk so that `[rows, vocab]` fp32 logits fit in `chunk_bytes` (at least one).
pub fn chunk_rows(vocab: i64, chunk_bytes: usize) -> i64 {
    (chunk_bytes as i64 / (vocab.max(1) * 4)).max(1)
}

/// `(start, len)` of each chunk of `rows` rows over `n`.
pub(crate) fn chunks(n: i64, rows: i64) -> impl Iterator<Item = (i64, i64)> {
    let rows = rows.max(1);
    (0..n)
        .step_by(rows as usize)
        .map(move |s| (s, rows.min(n - s)))
}

/// Per-token scores of the selected positions, each `[n]` float32.
#[derive(Debug)]
pub struct TokenScores {
    /// `log π(y)` at the sampling temperature.
    pub logp_n: Tensor,
    /// Entropy of `π` at the sampling temperature (nats).
    pub entropy_n: Tensor,
}

impl TokenScores {
    fn cat(parts: Vec<TokenScores>, device: tch::Device) -> TokenScores {
        if parts.is_empty() {
            let empty = Tensor::zeros([0], (Kind::Float, device));
            return TokenScores {
                logp_n: empty.shallow_clone(),
                entropy_n: empty,
            };
        }
        let (logp, ent): (Vec<Tensor>, Vec<Tensor>) =
            parts.into_iter().map(|s| (s.logp_n, s.entropy_n)).unzip();
        TokenScores {
            logp_n: Tensor::cat(&logp, 0),
            entropy_n: Tensor::cat(&ent, 0),
        }
    }
}

/// Scores of rows `h_nd` from their logits: fp32 log-softmax at `1/τ`, the target's entry
/// and the entropy.
fn scores_of(
    h_nd: &Tensor,
    weight_vd: &Tensor,
    targets_n: &Tensor,
    inv_temp_n1: &Tensor,
) -> TokenScores {
    // `(h/τ)·Wᵀ = (h·Wᵀ)/τ`: scaling the `[n, d]` rows saves a pass over `[n, V]` each way.
    let z_nv = (h_nd * inv_temp_n1.to_kind(h_nd.kind()))
        .matmul(&weight_vd.tr())
        .to_kind(Kind::Float);
    let logp_nv = z_nv.log_softmax(-1, Kind::Float);
    let logp_n = logp_nv
        .gather(-1, &targets_n.unsqueeze(-1), false)
        .squeeze_dim(-1);
    let entropy_n = -(logp_nv.exp() * &logp_nv).sum_dim_intlist(-1, false, Kind::Float);
    TokenScores { logp_n, entropy_n }
}

fn check(
    h_nd: &Tensor,
    weight_vd: &Tensor,
    targets_n: &Tensor,
    inv_temp_n1: &Tensor,
) -> Result<i64, ModelError> {
    let (n, d) = h_nd.size2()?;
    let (_, wd) = weight_vd.size2()?;
    if wd != d || targets_n.size() != [n] || inv_temp_n1.size() != [n, 1] {
        return Err(ModelError::Input(format!(
            "scores need hidden [N, d], head [V, d], targets [N] and 1/temperature [N, 1]; got {:?}, {:?}, {:?}, {:?}",
            h_nd.size(),
            weight_vd.size(),
            targets_n.size(),
            inv_temp_n1.size()
        )));
    }
    Ok(n)
}

/// The reference: every row's scores from the full `[N, V]` logits, with autograd.
pub fn score_full(
    h_nd: &Tensor,
    weight_vd: &Tensor,
    targets_n: &Tensor,
    inv_temp_n1: &Tensor,
) -> Result<TokenScores, ModelError> {
    check(h_nd, weight_vd, targets_n, inv_temp_n1)?;
    Ok(scores_of(h_nd, weight_vd, targets_n, inv_temp_n1))
}

/// The scores `rows` rows at a time, without gradients.
pub fn score_chunked(
    h_nd: &Tensor,
    weight_vd: &Tensor,
    targets_n: &Tensor,
    inv_temp_n1: &Tensor,
    rows: i64,
) -> Result<TokenScores, ModelError> {
    let n = check(h_nd, weight_vd, targets_n, inv_temp_n1)?;
    tch::no_grad(|| {
        let parts = chunks(n, rows)
            .map(|(s, len)| {
                scores_of(
                    &h_nd.narrow(0, s, len),
                    weight_vd,
                    &targets_n.narrow(0, s, len),
                    &inv_temp_n1.narrow(0, s, len),
                )
            })
            .collect();
        Ok(TokenScores::cat(parts, h_nd.device()))
    })
}

/// Trains through the scores `rows` rows at a time: `loss(range, scores)` returns the scalar
/// loss of the rows `range` (their scores carry gradients); its backward runs at once and
/// adds into the head weight's gradient. Returns every row's scores (detached) and
/// `∂ Σ loss / ∂ h_nd`, `[N, d]`, for the trunk's backward.
pub fn backward_chunked(
    h_nd: &Tensor,
    weight_vd: &Tensor,
    targets_n: &Tensor,
    inv_temp_n1: &Tensor,
    rows: i64,
    mut loss: impl FnMut(Range<i64>, &TokenScores) -> Result<Tensor, ModelError>,
) -> Result<(TokenScores, Tensor), ModelError> {
    let n = check(h_nd, weight_vd, targets_n, inv_temp_n1)?;
    // Each chunk's rows are a leaf of their own: a chunk's backward writes `[rows, d]`, never
    // a gradient the size of all `N` rows (which `narrow` of one shared leaf would allocate,
    // zero and add per chunk).
    let grad_nd = tch::no_grad(|| h_nd.zeros_like());
    let mut parts = Vec::new();
    for (s, len) in chunks(n, rows) {
        let leaf = h_nd.narrow(0, s, len).detach().set_requires_grad(true);
        let scores = scores_of(
            &leaf,
            weight_vd,
            &targets_n.narrow(0, s, len),
            &inv_temp_n1.narrow(0, s, len),
        );
        loss(s..s + len, &scores)?.f_backward()?;
        let g = leaf.grad();
        if g.defined() {
            tch::no_grad(|| grad_nd.narrow(0, s, len).copy_(&g));
        }
        parts.push(TokenScores {
            logp_n: scores.logp_n.detach(),
            entropy_n: scores.entropy_n.detach(),
        });
    }
    Ok((TokenScores::cat(parts, h_nd.device()), grad_nd))
}
