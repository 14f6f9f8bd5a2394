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
//! `π_prox`, `π_ref`). [`backward_chunked`] trains through them a chunk at a time: it hands
//! the chunk's scores (as leaves) to the caller's loss, backpropagates that loss to them
//! (`g_y = ∂L/∂logp_n`, `g_H = ∂L/∂H_n`, `[n]` each), then writes the logits' gradient
//! by hand into the chunk's own buffer,
//!
//! ```text
//! ∂L/∂z = g_y · (onehot(y) − p) − g_H · p ⊙ (log p + H)      p = softmax(z)
//!       = p ⊙ (−g_H · (log p + H) − g_y) + g_y · onehot(y)
//! ```
//!
//! and adds `∂L/∂z · W` into the gradient of `h` and `(∂L/∂z)ᵀ · h` into the head's. Two
//! `[rows, V]` fp32 buffers serve every chunk (log p, then the gradient; p), so with fp32
//! weights a chunk maps no fresh `[n, V]` memory (bf16 weights add the matmul's bf16 output
//! and the gradient's bf16 copy), and no pass over `[n, V]` is spent on autograd's copies. It
//! returns the gradient of the summed loss with respect to `h`, which the caller pushes
//! through the trunk in one backward ([`MoePolicy::backward`](crate::MoePolicy::backward)).
//! A token's loss terms depend only on its own log-prob and entropy, so the sum of the
//! chunks' losses is the loss, and the gradients equal the reference's (tests:
//! `model/tests/logits_boundary.rs`).
//!
//! Shape legend: `n` selected positions, `d` hidden, `v` vocabulary.

use std::ops::Range;

use tch::{Kind, Tensor};

use super::ModelError;

/// Bytes of fp32 logits one chunk may hold: 64 MiB, ~110 positions at Qwen3's 151,936 ids and
/// every position of a short row at a byte vocabulary. Above glibc's 32 MiB ceiling for mapping
/// a block on its own, so the buffers go back to the system when freed: 32 MiB chunks
/// left 4.9 GB of heap resident at 8K tokens, 64 MiB ones 0.77 GB
/// (`docs/bench/log.md`, 2026-12-06 "long trajectories"). Scoring and training hold two such
/// buffers (log p and p) for all their chunks.
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

/// Two `[rows, V]` fp32 buffers that every chunk of one call reuses.
struct ChunkBuffers {
    logp_rv: Tensor,
    p_rv: Tensor,
}

impl ChunkBuffers {
    fn new(rows: i64, n: i64, vocab: i64, device: tch::Device) -> Self {
        let rows = rows.min(n).max(1);
        ChunkBuffers {
            logp_rv: Tensor::empty([rows, vocab], (Kind::Float, device)),
            p_rv: Tensor::empty([rows, vocab], (Kind::Float, device)),
        }
    }

    /// The scores of rows `hs_nd` (already scaled by `1/τ`), without gradients; leaves
    /// `log p` and `p` in the first `n` rows of the buffers, returned as `[n, V]` views.
    fn scores(
        &self,
        hs_nd: &Tensor,
        weight_vd: &Tensor,
        targets_n: &Tensor,
    ) -> (TokenScores, Tensor, Tensor) {
        let n = hs_nd.size()[0];
        let mut logp_nv = self.logp_rv.narrow(0, 0, n);
        let p_nv = self.p_rv.narrow(0, 0, n);
        if weight_vd.kind() == Kind::Float {
            let _ = hs_nd.matmul_out(&logp_nv, &weight_vd.tr());
        } else {
            logp_nv.copy_(&hs_nd.matmul(&weight_vd.tr()));
        }
        // Softmax and log-softmax in the two buffers: z − max → p's buffer, exp in place,
        // normalise; log p = z − (max + log Σ).
        let (max_n1, _) = logp_nv.max_dim(-1, true);
        let mut p_nv = logp_nv.sub_out(&p_nv, &max_n1);
        let _ = p_nv.exp_();
        let sum_n1 = p_nv.sum_dim_intlist(-1, true, Kind::Float);
        let _ = logp_nv.g_sub_(&(max_n1 + sum_n1.log()));
        let _ = p_nv.g_div_(&sum_n1);
        let logp_n = logp_nv
            .gather(-1, &targets_n.unsqueeze(-1), false)
            .squeeze_dim(-1);
        // H = −Σ_v p·log p, a batched dot product (no `[n, V]` temporary).
        let entropy_n = -p_nv.unsqueeze(1).bmm(&logp_nv.unsqueeze(2)).view([n]);
        (TokenScores { logp_n, entropy_n }, logp_nv, p_nv)
    }
}

/// `h · (1/τ)` in `h`'s dtype.
fn scaled(h_nd: &Tensor, inv_temp_n1: &Tensor) -> Tensor {
    h_nd * inv_temp_n1.to_kind(h_nd.kind())
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
        let buf = ChunkBuffers::new(rows, n, weight_vd.size()[0], h_nd.device());
        let parts = chunks(n, rows)
            .map(|(s, len)| {
                let hs = scaled(&h_nd.narrow(0, s, len), &inv_temp_n1.narrow(0, s, len));
                buf.scores(&hs, weight_vd, &targets_n.narrow(0, s, len)).0
            })
            .collect();
        Ok(TokenScores::cat(parts, h_nd.device()))
    })
}

/// Trains through the scores `rows` rows at a time: `loss(range, scores)` returns the scalar
/// loss of the rows `range` (their scores carry gradients); its gradient goes into the head
/// weight's at once. Returns every row's scores (detached) and `∂ Σ loss / ∂ h_nd`, `[N, d]`,
/// for the trunk's backward.
pub fn backward_chunked(
    h_nd: &Tensor,
    weight_vd: &Tensor,
    targets_n: &Tensor,
    inv_temp_n1: &Tensor,
    rows: i64,
    mut loss: impl FnMut(Range<i64>, &TokenScores) -> Result<Tensor, ModelError>,
) -> Result<(TokenScores, Tensor), ModelError> {
    let n = check(h_nd, weight_vd, targets_n, inv_temp_n1)?;
    let (vocab, d) = weight_vd.size2()?;
    let device = h_nd.device();
    let (buf, grad_nd, mut grad_w_vd) = tch::no_grad(|| {
        (
            ChunkBuffers::new(rows, n, vocab, device),
            h_nd.zeros_like(),
            Tensor::zeros([vocab, d], (Kind::Float, device)),
        )
    });
    let mut parts = Vec::new();
    for (s, len) in chunks(n, rows) {
        let inv_temp = inv_temp_n1.narrow(0, s, len);
        let targets = targets_n.narrow(0, s, len);
        let hs_nd = tch::no_grad(|| scaled(&h_nd.narrow(0, s, len), &inv_temp));
        let (scores, mut g_nv, p_nv) = tch::no_grad(|| buf.scores(&hs_nd, weight_vd, &targets));
        // The caller's loss on leaf scores: its backward stops at `g_y` and `g_H`.
        let leaves = TokenScores {
            logp_n: scores.logp_n.set_requires_grad(true),
            entropy_n: scores.entropy_n.set_requires_grad(true),
        };
        let l = loss(s..s + len, &leaves)?;
        if l.requires_grad() {
            l.f_backward()?;
        }
        tch::no_grad(|| {
            let zero = || Tensor::zeros([len], (Kind::Float, device));
            let defined = |g: Tensor| g.defined().then_some(g);
            let g_y_n1 = defined(leaves.logp_n.grad())
                .unwrap_or_else(zero)
                .view([len, 1]);
            let g_h = defined(leaves.entropy_n.grad());
            // ∂L/∂z = p ⊙ (−g_H · (log p + H) − g_y) + g_y · onehot(y), in the log p buffer.
            match g_h {
                Some(g_h_n) => {
                    let h_n1 = leaves.entropy_n.detach().view([len, 1]);
                    let _ = g_nv.g_add_(&h_n1);
                    let _ = g_nv.g_mul_(&(-g_h_n.view([len, 1])));
                    let _ = g_nv.g_sub_(&g_y_n1);
                }
                None => {
                    let _ = g_nv.fill_(0.0);
                    let _ = g_nv.g_sub_(&g_y_n1);
                }
            }
            let _ = g_nv.g_mul_(&p_nv);
            let _ = g_nv.scatter_add_(1, &targets.unsqueeze(-1), &g_y_n1);
            // ∂L/∂h = (∂L/∂z · W) / τ;  ∂L/∂W += (∂L/∂z)ᵀ · (h / τ). The products run in the
            // head's dtype (bf16 on CUDA, as autograd's would), the sum over chunks in fp32.
            let g_w = g_nv.to_kind(weight_vd.kind());
            let g_hs = g_w.matmul(weight_vd) * inv_temp.to_kind(h_nd.kind());
            grad_nd.narrow(0, s, len).copy_(&g_hs);
            if weight_vd.kind() == Kind::Float {
                let _ = grad_w_vd.addmm_(&g_w.tr(), &hs_nd);
            } else {
                grad_w_vd += g_w.tr().matmul(&hs_nd).to_kind(Kind::Float);
            }
        });
        parts.push(TokenScores {
            logp_n: leaves.logp_n.detach(),
            entropy_n: leaves.entropy_n.detach(),
        });
    }
    // The head's gradient joins autograd's (a tied head is the embedding, which the trunk's
    // backward adds to as well).
    if weight_vd.requires_grad() && n > 0 {
        (weight_vd * grad_w_vd.to_kind(weight_vd.kind()))
            .sum(Kind::Float)
            .f_backward()?;
    }
    Ok((TokenScores::cat(parts, device), grad_nd))
}
