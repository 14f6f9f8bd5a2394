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
use super::router::{Router, Routing};
use super::routes::RouteAgreement;

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

/// How a forward of one MoE layer selects its experts.
#[derive(Debug, Default, Clone, Copy)]
pub struct Select<'a> {
    /// Router noise of an earlier forward of the same tokens (activation recompute).
    pub noise_te: Option<&'a Tensor>,
    /// Routes given for these tokens `[n, k]` (`-1` rows: none), compared with the router's
    /// own choice.
    pub given_tk: Option<&'a Tensor>,
    /// Send the tokens with a given route to those experts.
    pub replay: bool,
}

/// What [`MoeLayer::forward_select`] returns.
#[derive(Debug)]
pub struct MoeForward {
    /// The layer's output `[B, T, d]`.
    pub y_btd: Tensor,
    /// The training terms (a training forward only).
    pub aux: Option<MoeAux>,
    /// The router's own choice `[n, k]` (int64), whatever the tokens were sent to.
    pub own_idx_tk: Tensor,
    /// How the own choice agreed with the given routes (when some were given).
    pub agreement: Option<RouteAgreement>,
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
        let out = self.forward_select(x_btd, train, Select::default());
        (out.y_btd, out.aux)
    }

    /// The layer on `x [B, T, d]`, selecting experts as `sel` says (replayed noise, given
    /// routes): the output, the training terms, the router's own choice and how it agreed
    /// with the given routes.
    ///
    /// Balance statistics and the balance loss count the router's *own* choice even when
    /// the tokens go to replayed experts: the bias update and the aux loss steer this
    /// router's selection, and a replayed choice is another policy's.
    pub fn forward_select(&self, x_btd: &Tensor, train: bool, sel: Select<'_>) -> MoeForward {
        let (b, t, d) = x_btd.size3().expect("x is [B, T, d]");
        let x_nd = x_btd.reshape([b * t, d]);
        let replay = sel.given_tk.filter(|_| sel.replay);
        let routing = self
            .router
            .forward_select(&x_nd, train, sel.noise_te, replay);
        let y_btd = self.experts_out(&x_nd, &routing).view([b, t, d]);
        let agreement = sel.given_tk.map(|g| {
            RouteAgreement::measure(self.layer, &routing.own_idx_tk, &g.to_device(x_nd.device()))
        });
        let aux = train.then(|| self.training_terms(&routing, b * t));
        MoeForward {
            y_btd,
            aux,
            own_idx_tk: routing.own_idx_tk,
            agreement,
        }
    }

    /// The balance loss, health and balance statistics of a training forward of `n` tokens.
    fn training_terms(&self, routing: &Routing, n: i64) -> MoeAux {
        let n_experts = self.router.n_experts();
        let counts_dev_e = routing
            .own_idx_tk
            .reshape([-1])
            .bincount(None::<Tensor>, n_experts);
        let loss = self.balance_loss(routing, &counts_dev_e, n);
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
        MoeAux {
            loss,
            health,
            stats,
            noise_te: routing.noise_te.as_ref().map(Tensor::shallow_clone),
        }
    }

    /// Routed experts (weighted by the routing) plus the shared experts, `[n, d]`.
    fn experts_out(&self, x_nd: &Tensor, routing: &Routing) -> Tensor {
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
    fn balance_loss(&self, routing: &Routing, counts_e: &Tensor, n_total: i64) -> Tensor {
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
    /// assignment counts were `counts_e [E]`, with that forward's noise rows and given routes
    /// in `sel`: the
    /// output `[n, d]` and the slice's share of `α·aux + c_z·z` (the shares of a partition sum
    /// to [`MoeLayer::forward`]'s loss). A checkpointed backward reruns a block's FFN this
    /// way, a slice at a time; health and balance statistics are the first forward's.
    pub fn forward_slice(
        &self,
        x_nd: &Tensor,
        sel: Select<'_>,
        counts_e: &Tensor,
        n_total: i64,
    ) -> (Tensor, Tensor) {
        let replay = sel.given_tk.filter(|_| sel.replay);
        let routing = self.router.forward_select(x_nd, true, sel.noise_te, replay);
        let y_nd = self.experts_out(x_nd, &routing);
        let loss = self.balance_loss(&routing, counts_e, n_total);
        (y_nd, loss)
    }
}
