//! Routing replay: the expert ids a forward chose, recorded, and ids given to a later forward
//! to compare with or to route by.
//!
//! Shape legend: `b` batch, `t` time, `n = b·t` tokens, `l` MoE layers (in layer order,
//! dense layers skipped), `k` experts per token.
//!
//! A route table is int64 `[B, T, L, k]`; a token whose row is `-1` has no given route and
//! routes by the model's own selection. Replaying replaces only the *selection*: the combine
//! weights are gathered from the model's own dense router scores at the given ids
//! ([`Router::forward_select`](crate::router::Router::forward_select)), so the router keeps
//! its gradient (R3, `../shared/research/rl_interop_2026.md` §4: gathering from post-top-k
//! zeros would cut it).

use tch::{Kind, Tensor};

/// What a trunk or cached forward does with routes.
#[derive(Debug, Default, Clone, Copy)]
pub struct RouteOpts<'a> {
    /// Routes to compare with (and, with `replay`, route by), integer `[B, T, L, k]` on any
    /// device, `-1` rows where none was given.
    pub given_btlk: Option<&'a Tensor>,
    /// Route the given tokens by `given_btlk` instead of the model's own selection.
    pub replay: bool,
    /// Return the model's own selection of every token ([`RouteOpts::given_btlk`]'s layout).
    pub record: bool,
}

impl<'a> RouteOpts<'a> {
    /// Compare the model's routing with `given` (agreement only).
    pub fn compare(given_btlk: &'a Tensor) -> Self {
        Self {
            given_btlk: Some(given_btlk),
            ..Self::default()
        }
    }

    /// Route by `given` where it has a route.
    pub fn replay(given_btlk: &'a Tensor) -> Self {
        Self {
            given_btlk: Some(given_btlk),
            replay: true,
            record: false,
        }
    }

    /// Record the model's own selection.
    pub fn record() -> Self {
        Self {
            record: true,
            ..Self::default()
        }
    }

    /// MoE layer `j`'s given routes `[n, k]`.
    pub(crate) fn layer(&self, j: usize) -> Option<Tensor> {
        self.given_btlk.map(|g| {
            let (b, t, _, k) = g.size4().expect("routes are [B, T, L, k]");
            g.select(2, j as i64)
                .reshape([b * t, k])
                .to_kind(Kind::Int64)
        })
    }
}

/// How one MoE layer's own selection compared with the given routes, over the tokens that
/// had one.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RouteAgreement {
    /// The layer's index in the model.
    pub layer: i64,
    /// Tokens with a given route.
    pub tokens: i64,
    /// Of those, tokens whose own top-k set equals the given one.
    pub equal: i64,
    /// `Σ |own ∩ given| / k` over those tokens.
    pub overlap: f64,
}

impl RouteAgreement {
    /// Compares `own [n, k]` with `given [n, k]` (`-1` rows skipped) for layer `layer`.
    pub fn measure(layer: i64, own_nk: &Tensor, given_nk: &Tensor) -> Self {
        let k = own_nk.size()[1];
        let valid_n = given_nk.select(1, 0).ge(0);
        // |own ∩ given| per token: each given id found among the own ids.
        let hits_n = given_nk
            .unsqueeze(2)
            .eq_tensor(&own_nk.unsqueeze(1))
            .any_dim(2, false)
            .sum_dim_intlist(1, false, Kind::Int64);
        let equal_n = hits_n.eq(k).logical_and(&valid_n);
        let overlap = (hits_n * &valid_n).sum(Kind::Double);
        let v = Vec::<f64>::try_from(Tensor::stack(
            &[
                valid_n.sum(Kind::Double),
                equal_n.sum(Kind::Double),
                overlap / k as f64,
            ],
            0,
        ))
        .expect("three counts convert to f64");
        Self {
            layer,
            tokens: v[0] as i64,
            equal: v[1] as i64,
            overlap: v[2],
        }
    }

    /// Adds another forward's counts of the same layer.
    pub fn merge(&mut self, other: &RouteAgreement) {
        self.tokens += other.tokens;
        self.equal += other.equal;
        self.overlap += other.overlap;
    }

    /// Fraction of tokens whose top-k sets are equal (1 with no tokens).
    pub fn agreement(&self) -> f64 {
        if self.tokens == 0 {
            1.0
        } else {
            self.equal as f64 / self.tokens as f64
        }
    }

    /// Mean `|own ∩ given| / k` (1 with no tokens).
    pub fn overlap_mean(&self) -> f64 {
        if self.tokens == 0 {
            1.0
        } else {
            self.overlap / self.tokens as f64
        }
    }
}

/// Merges per-layer agreement lists of several forwards (same layers, same order).
pub fn merge_agreement(acc: &mut Vec<RouteAgreement>, more: &[RouteAgreement]) {
    if acc.is_empty() {
        acc.extend_from_slice(more);
        return;
    }
    for (a, b) in acc.iter_mut().zip(more) {
        a.merge(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreement_counts_sets_not_order() {
        let own = Tensor::from_slice(&[0i64, 1, 2, 3, 4, 5, 6, 7]).view([4, 2]);
        // Same set reordered; one of two; none; no route.
        let given = Tensor::from_slice(&[1i64, 0, 3, 9, 8, 9, -1, -1]).view([4, 2]);
        let a = RouteAgreement::measure(3, &own, &given);
        assert_eq!((a.layer, a.tokens, a.equal), (3, 3, 1));
        assert!((a.overlap - 1.5).abs() < 1e-12);
        assert!((a.agreement() - 1.0 / 3.0).abs() < 1e-12);
        assert!((a.overlap_mean() - 0.5).abs() < 1e-12);
    }
}
