//! The training trunk: embedding → blocks → final norm, with its backward, and activation
//! checkpointing per block.
//!
//! Without checkpointing the trunk keeps autograd's graph and [`MoePolicy::backward`] is one
//! backward of `Σ hidden ⊙ grad + c·aux`. With [`Checkpoint::Blocks`] the forward runs
//! without a graph and keeps, per block, only what the backward needs to rerun it:
//!
//! ```text
//! block i reads   x_i                        its input               [B, T, d]
//!                 a_0 … a_{i−1}              earlier attention outputs (cross-layer residual)
//!                 latent of its CLA owner    (a CLA-shared block)
//!                 the router noise it drew   (so the rerun routes the same tokens)
//!                 its given routes           (replay, compare)
//! block i writes  x_{i+1}, a_i, its own latent (an owner)
//! ```
//!
//! The backward walks the blocks from the last: it reruns block i from those values (leaf
//! tensors), backpropagates the gradients that later blocks sent to `x_{i+1}`, `a_i` and its
//! latent plus the block's balance loss, and collects the gradients of its inputs for the
//! blocks before it. One block's activations exist at a time, and of its FFN half (per token
//! but for the balance loss) one slice of tokens at a time: the FFN's activations are the
//! block's largest (`k` routed experts' and the shared experts' intermediates per token). The
//! balance and health statistics come from the first forward only, so they are counted once;
//! the balance loss's slices use its assignment counts.
//! Tests: `model/tests/logits_boundary.rs` (checkpointed equals not checkpointed).

use tch::Tensor;

use super::{Attend, BalanceStats, BlockCtx, MoePolicy, RouteState};
use crate::attention::Latent;
use crate::causal::DocSpans;
use crate::cross_layer::CrossLayerState;
use crate::health::MoeHealth;
use crate::moe::Select;
use crate::precision::work_kind;
use crate::routes::{RouteAgreement, RouteOpts};
use crate::ModelError;

/// Whether a training forward keeps each block's activations for the backward or recomputes
/// them there (`[train] checkpoint`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Checkpoint {
    /// Keep everything autograd saves: the fastest backward, memory ∝ layers × activations.
    #[default]
    None,
    /// Keep each block's inputs; rerun one block at a time in the backward (one more forward
    /// of the blocks, activation memory of one block).
    Blocks,
}

impl Checkpoint {
    /// Parses `"none"` or `"blocks"`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "none" => Some(Checkpoint::None),
            "blocks" => Some(Checkpoint::Blocks),
            _ => None,
        }
    }
}

/// What a training forward of the trunk returns; hand it to [`MoePolicy::backward`] with the
/// gradient of the loss with respect to `hidden_btd`.
#[derive(Debug)]
pub struct Trunk {
    /// Final hidden states after the final norm `[B, T, d]` (the head's input).
    pub hidden_btd: Tensor,
    /// Sum over MoE layers of the weighted balance losses (a value only when checkpointed:
    /// the backward adds its gradient block by block).
    pub aux_loss: Tensor,
    /// Health per MoE layer (empty when `train` is false).
    pub health: Vec<MoeHealth>,
    /// Balance statistics per MoE layer (empty when `train` is false).
    pub balance: BalanceStats,
    /// Per MoE layer, how its own choice agreed with the given routes (empty when none
    /// were given).
    pub agreement: Vec<RouteAgreement>,
    /// Every token's own expert ids `[B, T, L, k]` (when recording).
    pub routes_btlk: Option<Tensor>,
    tape: Option<Tape>,
}

/// What a checkpointed forward keeps for the backward.
#[derive(Debug)]
struct Tape {
    tokens_bt: Tensor,
    pos_bt: Tensor,
    docs: Option<DocSpans>,
    train: bool,
    /// Route the given tokens by their given routes.
    replay: bool,
    /// Per block: its input, its attention output, its own latent, its router noise.
    blocks: Vec<Saved>,
    /// The last block's output as a leaf: `hidden_btd` is its norm, with a graph.
    x_last: Tensor,
}

#[derive(Debug)]
struct Saved {
    x_btd: Tensor,
    /// Kept only when later blocks read it (`cross_layer_residual`).
    a_btd: Option<Tensor>,
    latent: Option<Latent>,
    noise_te: Option<Tensor>,
    /// The MoE layer's given routes `[n, k]`.
    given_tk: Option<Tensor>,
    /// The MoE layer's assignment counts `[E]` (its balance loss needs the whole layer's).
    counts_e: Option<Tensor>,
}

fn detached(l: &Latent) -> Latent {
    Latent {
        c_kv_btc: l.c_kv_btc.detach(),
        k_pe_btr: l.k_pe_btr.detach(),
    }
}

fn leaf(x: &Tensor) -> Tensor {
    x.detach().set_requires_grad(true)
}

/// `Σ x ⊙ g`: its backward sends `g` into `x`'s graph.
fn pairing(x: &Tensor, g: &Tensor) -> Tensor {
    let kind = work_kind(x.kind());
    (x.to_kind(kind) * g.to_kind(kind)).sum(kind)
}

/// `acc += g` where `acc` may be empty.
fn accumulate(acc: &mut Option<Tensor>, g: Tensor) {
    if !g.defined() {
        return;
    }
    *acc = Some(match acc.take() {
        Some(a) => a + g,
        None => g,
    });
}

impl MoePolicy {
    /// The shared body of [`MoePolicy::trunk`] and [`MoePolicy::trunk_packed`].
    pub(super) fn run_trunk(
        &self,
        tokens_bt: &Tensor,
        pos_bt: Tensor,
        docs: Option<DocSpans>,
        train: bool,
        checkpoint: Checkpoint,
        routes: RouteOpts<'_>,
    ) -> Result<Trunk, ModelError> {
        let checkpointed = checkpoint == Checkpoint::Blocks;
        let (b, t) = tokens_bt.size2()?;
        let mut ctx = BlockCtx {
            pos_bt: pos_bt.shallow_clone(),
            rope: &self.rope,
            cross: CrossLayerState::new(),
            train,
            attend: Attend::Full {
                docs: docs.as_ref(),
                latent: None,
            },
            routes: RouteState::new(routes),
        };
        let x0 = if checkpointed {
            tch::no_grad(|| self.embed(tokens_bt, b, t))
        } else {
            self.embed(tokens_bt, b, t)
        };
        // The balance loss sums in fp32 (f64 for an f64 model), whatever the activations.
        let aux_kind = work_kind(x0.kind());
        let mut aux_loss = Tensor::zeros([], (aux_kind, self.device));
        let (mut health, mut balance) = (Vec::new(), BalanceStats::default());
        let mut saved = Vec::new();
        let mut x = x0;
        for (i, blk) in self.blocks.iter().enumerate() {
            let step = |x: &Tensor, ctx: &mut BlockCtx<'_>| blk.forward(x, ctx, None);
            let (y, aux) = if checkpointed {
                tch::no_grad(|| step(&x, &mut ctx))?
            } else {
                step(&x, &mut ctx)?
            };
            if checkpointed {
                let Attend::Full { latent, .. } = &ctx.attend else {
                    unreachable!("the trunk attends over its own tokens")
                };
                saved.push(Saved {
                    x_btd: x.shallow_clone(),
                    a_btd: self
                        .cfg
                        .cross_layer_residual
                        .then(|| ctx.cross.last().expect("every block pushes its output")),
                    latent: latent.as_ref().filter(|_| blk.owns_latent()).map(detached),
                    noise_te: aux
                        .as_ref()
                        .and_then(|a| a.noise_te.as_ref().map(Tensor::shallow_clone)),
                    given_tk: blk.is_moe().then(|| ctx.routes.last_given.take()).flatten(),
                    counts_e: aux.as_ref().map(|a| a.stats.counts_e.shallow_clone()),
                });
            }
            x = y;
            if let Some(aux) = aux {
                aux_loss = aux_loss + aux.loss.to_kind(aux_kind);
                health.push(aux.health);
                balance.layers.push((i as i64, aux.stats));
            }
        }
        let k = self.cfg.num_experts_per_tok;
        let routes_btlk = ctx.routes.recorded((b, t), k, self.device);
        let agreement = std::mem::take(&mut ctx.routes.agreement);
        drop(ctx);
        let (hidden_btd, tape) = if checkpointed {
            let x_last = leaf(&x);
            let tape = Tape {
                tokens_bt: tokens_bt.shallow_clone(),
                pos_bt,
                docs,
                train,
                replay: routes.replay,
                blocks: saved,
                x_last: x_last.shallow_clone(),
            };
            (self.norm.forward(&x_last), Some(tape))
        } else {
            (self.norm.forward(&x), None)
        };
        Ok(Trunk {
            hidden_btd,
            aux_loss,
            health,
            balance,
            agreement,
            routes_btlk,
            tape,
        })
    }

    /// Backpropagates `grad_hidden [B, T, d]` (the loss's gradient with respect to
    /// `trunk.hidden_btd`) plus `aux_weight ×` the balance loss through the trunk, adding
    /// into every parameter's gradient; reruns each block first when the trunk was
    /// checkpointed.
    pub fn backward(
        &self,
        trunk: Trunk,
        grad_hidden_btd: &Tensor,
        aux_weight: f64,
    ) -> Result<(), ModelError> {
        let Some(tape) = trunk.tape else {
            let mut loss = pairing(&trunk.hidden_btd, grad_hidden_btd);
            if trunk.aux_loss.requires_grad() && aux_weight != 0.0 {
                let kind = loss.kind();
                loss = loss + trunk.aux_loss.to_kind(kind) * aux_weight;
            }
            if loss.requires_grad() {
                loss.f_backward()?;
            }
            return Ok(());
        };
        pairing(&trunk.hidden_btd, grad_hidden_btd).f_backward()?;
        let n = self.blocks.len();
        let mut grad_x = tape.x_last.grad();
        // Gradients later blocks sent to each block's attention output and own latent
        // (`c_kv`, `k_pe`).
        let mut grad_a: Vec<Option<Tensor>> = (0..n).map(|_| None).collect();
        let mut grad_c: Vec<Option<Tensor>> = (0..n).map(|_| None).collect();
        let mut grad_k: Vec<Option<Tensor>> = (0..n).map(|_| None).collect();
        for i in (0..n).rev() {
            let blk = &self.blocks[i];
            let s = &tape.blocks[i];
            let x_in = leaf(&s.x_btd);
            // Earlier attention outputs, as leaves, for the cross-layer residual.
            let a_leaves: Vec<Tensor> = tape.blocks[..i]
                .iter()
                .filter_map(|p| p.a_btd.as_ref().map(leaf))
                .collect();
            let mut cross = CrossLayerState::new();
            for a in &a_leaves {
                cross.push(a);
            }
            // A CLA-shared block reads its owner's latent, as a leaf.
            let owner = (0..=i).rev().find(|&j| tape.blocks[j].latent.is_some());
            let latent_in = match owner {
                Some(j) if j < i => tape.blocks[j].latent.as_ref().map(|l| Latent {
                    c_kv_btc: leaf(&l.c_kv_btc),
                    k_pe_btr: leaf(&l.k_pe_btr),
                }),
                _ => None,
            };
            let latent_leaves = latent_in
                .as_ref()
                .map(|l| (l.c_kv_btc.shallow_clone(), l.k_pe_btr.shallow_clone()));
            let mut ctx = BlockCtx {
                pos_bt: tape.pos_bt.shallow_clone(),
                rope: &self.rope,
                cross,
                train: tape.train,
                attend: Attend::Full {
                    docs: tape.docs.as_ref(),
                    latent: latent_in,
                },
                routes: RouteState::new(RouteOpts::default()),
            };
            let x_mid = blk.attend(&x_in, &mut ctx)?;
            let grad_mid = self.ffn_backward(blk, &x_mid, &grad_x, s, &tape, aux_weight)?;
            let mut loss = pairing(&x_mid, &grad_mid);
            if let Some(g) = &grad_a[i] {
                let a = ctx.cross.last().expect("the block pushed its output");
                loss = loss + pairing(&a, g);
            }
            if let Attend::Full {
                latent: Some(l), ..
            } = &ctx.attend
            {
                if let Some(g) = &grad_c[i] {
                    loss = loss + pairing(&l.c_kv_btc, g);
                }
                if let Some(g) = &grad_k[i] {
                    loss = loss + pairing(&l.k_pe_btr, g);
                }
            }
            drop(ctx);
            loss.f_backward()?;
            grad_x = x_in.grad();
            for (j, a) in a_leaves.iter().enumerate() {
                accumulate(&mut grad_a[j], a.grad());
            }
            if let (Some(j), Some((c, k))) = (owner, latent_leaves) {
                accumulate(&mut grad_c[j], c.grad());
                accumulate(&mut grad_k[j], k.grad());
            }
        }
        // The embedding.
        let (b, t) = tape.tokens_bt.size2()?;
        let x0 = self.embed(&tape.tokens_bt, b, t);
        if grad_x.defined() && x0.requires_grad() {
            pairing(&x0, &grad_x).f_backward()?;
        }
        Ok(())
    }

    /// Reruns `blk`'s FFN half from `x_mid [B, T, d]` (its attention half's output) in
    /// slices of [`MoePolicy::set_recompute_slice_tokens`] tokens, each backpropagating its
    /// rows of `grad_y` (the gradient of the block's output) plus `aux_weight ×` its share of
    /// the balance loss; returns the gradient of `x_mid`. The FFN is per token but for that
    /// loss, whose shares use the first forward's assignment counts, so one slice's
    /// activations exist at a time.
    fn ffn_backward(
        &self,
        blk: &super::Block,
        x_mid_btd: &Tensor,
        grad_y_btd: &Tensor,
        s: &Saved,
        tape: &Tape,
        aux_weight: f64,
    ) -> Result<Tensor, ModelError> {
        let (b, t, d) = x_mid_btd.size3()?;
        let n = b * t;
        let x_nd = x_mid_btd.detach().reshape([n, d]);
        let grad_y_nd = grad_y_btd.reshape([n, d]);
        let grad_nd = Tensor::empty([n, d], (x_nd.kind(), x_nd.device()));
        // On the activations' device once, not once per slice.
        let counts_e = s
            .counts_e
            .as_ref()
            .filter(|_| tape.train)
            .map(|c| c.to_device(x_nd.device()));
        for (start, len) in crate::head::chunks(n, self.recompute_slice_tokens) {
            let x = leaf(&x_nd.narrow(0, start, len));
            let noise = s.noise_te.as_ref().map(|z| z.narrow(0, start, len));
            let given = s.given_tk.as_ref().map(|g| g.narrow(0, start, len));
            let sel = Select {
                noise_te: noise.as_ref(),
                given_tk: given.as_ref(),
                replay: tape.replay,
            };
            let (y, share) = blk.ffn_slice(&x, sel, counts_e.as_ref(), n);
            let mut loss = pairing(&y, &grad_y_nd.narrow(0, start, len));
            if let Some(share) = share.filter(|l| aux_weight != 0.0 && l.requires_grad()) {
                let kind = loss.kind();
                loss = loss + share.to_kind(kind) * aux_weight;
            }
            loss.f_backward()?;
            grad_nd.narrow(0, start, len).copy_(&x.grad());
        }
        Ok(grad_nd.view([b, t, d]))
    }
}
