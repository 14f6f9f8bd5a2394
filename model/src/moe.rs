//! The MoE feed-forward layer: router → routed experts (+ shared experts) → combine, plus the
//! balance terms and health of the layer.
//!
//! Shape legend: `b` batch, `t` time, `n = b·t` tokens, `d` hidden, `e` experts.

// `x = x + y` on purpose: tch's `+=` is in-place `add_`, which would clobber tensors autograd
// saved for the backward (RMSNorm keeps its input).
#![allow(clippy::assign_op_pattern)]

use tch::{nn, Kind, Tensor};

use super::balance::{
    histogram_range, needed_bias_histogram, router_z_share, switch_aux_share, LayerBalanceStats,
    QB_BINS,
};
use super::config::{BalanceMode, ModelConfig};
use super::experts::Experts;
use super::health::MoeHealth;
use super::layers::Mlp;
use super::router::Router;

/// What a training forward of one MoE layer reports besides its output.
#[derive(Debug)]
pub struct MoeAux {
    /// `α·aux + c_z·z` for this layer (scalar; zero when neither term is on).
    pub loss: Tensor,
    /// Health metrics.
    pub health: MoeHealth,
    /// Statistics for the balance-bias update.
    pub stats: LayerBalanceStats,
    /// The router's selection noise ([`Routing::noise_te`](super::router::Routing::noise_te)).
    pub noise_te: Option<Tensor>,
}

/// One MoE FFN.
#[derive(Debug)]
pub struct MoeLayer {
    /// The router (its bias is the balance state).
    pub router: Router,
    /// The routed experts.
    pub experts: Experts,
    shared: Option<Mlp>,
    balance: BalanceMode,
    aux_coef: f64,
    z_coef: f64,
    layer: i64,
}

impl MoeLayer {
    /// Router under `gate`, experts under `experts`, shared experts under `shared_experts`.
    pub fn new(p: nn::Path, cfg: &ModelConfig, layer: i64) -> Self {
        let shared = (cfg.n_shared_experts > 0).then(|| {
            Mlp::new(
                &p / "shared_experts",
                cfg.hidden_size,
                cfg.n_shared_experts * cfg.moe_intermediate_size,
                cfg.initializer_range,
            )
        });
        MoeLayer {
            router: Router::new(&p / "gate", cfg),
            experts: Experts::new(&p / "experts", cfg),
            shared,
            balance: cfg.balance,
            aux_coef: cfg.aux_loss_coef,
            z_coef: cfg.router_z_loss_coef,
            layer,
        }
    }

    /// The balance rule of this layer.
    pub fn balance_mode(&self) -> BalanceMode {
        self.balance
    }

    /// `y [B, T, d]`, and in training the aux terms, health and balance statistics.
    pub fn forward(&self, x_btd: &Tensor, train: bool) -> (Tensor, Option<MoeAux>) {
        self.forward_with_noise(x_btd, train, None)
    }

    /// [`MoeLayer::forward`] with the router's selection noise given
    /// ([`Router::forward_with_noise`](super::router::Router::forward_with_noise)).
    pub fn forward_with_noise(
        &self,
        x_btd: &Tensor,
        train: bool,
        noise_te: Option<&Tensor>,
    ) -> (Tensor, Option<MoeAux>) {
        let (b, t, d) = x_btd.size3().expect("x is [B, T, d]");
        let x_nd = x_btd.reshape([b * t, d]);
        let routing = self.router.forward_with_noise(&x_nd, train, noise_te);
        let y_btd = self.experts_out(&x_nd, &routing).view([b, t, d]);
        if !train {
            return (y_btd, None);
        }
        let n_experts = self.router.n_experts();
        let counts_dev_e = routing
            .idx_tk
            .reshape([-1])
            .bincount(None::<Tensor>, n_experts);
        let loss = self.balance_loss(&routing, &counts_dev_e, b * t);
        let counts_e = counts_dev_e
            .to_kind(Kind::Double)
            .to_device(tch::Device::Cpu);
        let counts = Vec::<f64>::try_from(&counts_e).expect("counts convert to f64");
        let health = MoeHealth::compute(self.layer, &counts, &routing.scores_te);
        let bias = Vec::<f64>::try_from(self.router.bias_e.to_kind(Kind::Double))
            .expect("bias converts to f64");
        let (lo, hi) = histogram_range(&bias);
        let hist_eb = (self.balance == BalanceMode::Quantile)
            .then(|| needed_bias_histogram(&routing.scores_te, &routing.cutoff_t, lo, hi, QB_BINS));
        let stats = LayerBalanceStats {
            counts_e,
            hist_eb,
            lo,
            hi,
            top_k: self.router.top_k(),
        };
        (
            y_btd,
            Some(MoeAux {
                loss,
                health,
                stats,
                noise_te: routing.noise_te,
            }),
        )
    }

    /// Routed experts (weighted by the routing) plus the shared experts, `[n, d]`.
    fn experts_out(&self, x_nd: &Tensor, routing: &super::router::Routing) -> Tensor {
        let y_nd = self
            .experts
            .forward(x_nd, &routing.idx_tk, &routing.weights_tk);
        match &self.shared {
            Some(shared) => y_nd + shared.forward(x_nd),
            None => y_nd,
        }
    }

    /// `α·aux + c_z·z` of `routing`'s tokens as a share of a forward of `n_total` tokens whose
    /// assignment counts were `counts_e [E]` (the whole loss when `routing` is that forward).
    fn balance_loss(
        &self,
        routing: &super::router::Routing,
        counts_e: &Tensor,
        n_total: i64,
    ) -> Tensor {
        let scores_te = &routing.scores_te;
        let mut loss = Tensor::zeros([], (scores_te.kind(), scores_te.device()));
        if self.balance == BalanceMode::AuxLoss && self.aux_coef > 0.0 {
            let k = self.router.top_k();
            loss = loss + switch_aux_share(scores_te, counts_e, n_total, k) * self.aux_coef;
        }
        if self.z_coef > 0.0 {
            loss = loss + router_z_share(&routing.logits_te, n_total) * self.z_coef;
        }
        loss
    }

    /// The layer on `x_nd [n, d]`, a slice of a training forward of `n_total` tokens whose
    /// assignment counts were `counts_e [E]`, with that forward's noise rows `noise_ne`: the
    /// output `[n, d]` and the slice's share of `α·aux + c_z·z` (the shares of a partition sum
    /// to [`MoeLayer::forward`]'s loss). A checkpointed backward reruns a block's FFN this
    /// way, a slice at a time; health and balance statistics are the first forward's.
    pub fn forward_slice(
        &self,
        x_nd: &Tensor,
        noise_ne: Option<&Tensor>,
        counts_e: &Tensor,
        n_total: i64,
    ) -> (Tensor, Tensor) {
        let routing = self.router.forward_with_noise(x_nd, true, noise_ne);
        let y_nd = self.experts_out(x_nd, &routing);
        let loss = self.balance_loss(&routing, counts_e, n_total);
        (y_nd, loss)
    }
}
