//! Recorded routing: the expert ids an MoE policy chose for each token, packed into a step's
//! `routes` bytes as the trajectory header's [`RouteShape`] lays them out.
//!
//! A step's route rows align with its tokens: row `j` holds, for every MoE layer in order,
//! the `k` experts chosen for the token *before* token `j` — the input whose forward predicted
//! token `j`. Those are exactly the inputs the actor runs while it produces the step (the
//! previous step's last token, then this step's tokens but its last), so a step carries all of
//! its rows when it is sent. The trajectory's first token has no predecessor: its first step
//! has one row fewer than tokens.

use serde::{Deserialize, Serialize};

use crate::pb;
use crate::types::ProtoError;

/// How a trajectory's route bytes are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RouteShape {
    /// The policy's MoE layers, in layer order.
    pub moe_layers: u32,
    /// Experts per token (`k`).
    pub experts_per_token: u32,
    /// Routed experts; every id is below this.
    pub routed_experts: u32,
}

impl RouteShape {
    /// The shape of a policy with `moe_layers` MoE layers routing each token to `k` of
    /// `experts` experts (a model config's `n_moe_layers()`, `num_experts_per_tok`,
    /// `n_routed_experts`); `None` for a dense policy, which records no routes.
    pub fn of_moe(moe_layers: i64, k: i64, experts: i64) -> Option<Self> {
        let u = |x: i64| u32::try_from(x).unwrap_or(u32::MAX);
        (moe_layers > 0).then(|| Self {
            moe_layers: u(moe_layers),
            experts_per_token: u(k),
            routed_experts: u(experts),
        })
    }

    /// Bytes per id: 1 when every id fits a `u8`, else 2 (little-endian `u16`).
    pub fn id_bytes(&self) -> usize {
        if self.routed_experts <= 256 {
            1
        } else {
            2
        }
    }

    /// Ids per token: MoE layers × `k`.
    pub fn ids_per_token(&self) -> usize {
        self.moe_layers as usize * self.experts_per_token as usize
    }

    /// Bytes per token.
    pub fn bytes_per_token(&self) -> usize {
        self.ids_per_token() * self.id_bytes()
    }

    /// Checks the shape itself: at least one layer and one expert per token, `k` below the
    /// expert count (a router ranks `k + 1`), ids that fit a `u16`.
    pub fn validate(&self) -> Result<(), ProtoError> {
        let bad = |why: String| ProtoError::Invalid {
            field: "header.routes".into(),
            reason: why,
        };
        if self.moe_layers == 0 || self.experts_per_token == 0 {
            return Err(bad(format!(
                "{} MoE layers × {} experts per token records nothing; leave the shape out",
                self.moe_layers, self.experts_per_token
            )));
        }
        if self.experts_per_token >= self.routed_experts || self.routed_experts > 65_536 {
            return Err(bad(format!(
                "{} experts per token of {} routed experts (at most 65,536)",
                self.experts_per_token, self.routed_experts
            )));
        }
        Ok(())
    }

    /// Packs ids (token-major: token, layer, k) into route bytes.
    pub fn pack(&self, ids: &[u16]) -> Vec<u8> {
        match self.id_bytes() {
            1 => ids.iter().map(|&i| i as u8).collect(),
            _ => ids.iter().flat_map(|i| i.to_le_bytes()).collect(),
        }
    }

    /// Unpacks route bytes into ids (token-major: token, layer, k).
    pub fn unpack(&self, bytes: &[u8]) -> Vec<u16> {
        match self.id_bytes() {
            1 => bytes.iter().map(|&b| u16::from(b)).collect(),
            _ => bytes
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect(),
        }
    }

    /// Route rows a step of `tokens` tokens carries: one per token, one fewer for a step
    /// that opens a segment (the trajectory's first step among them).
    pub fn rows_of(tokens: usize, opens_segment: bool) -> usize {
        tokens.saturating_sub(usize::from(opens_segment))
    }

    /// Checks step `seq`'s route bytes against this shape: one row per token (one fewer in
    /// a step that opens a segment), every id below `routed_experts`, a layer's `k` ids
    /// distinct.
    pub fn check_step(
        &self,
        seq: u64,
        tokens: usize,
        routes: &[u8],
        opens_segment: bool,
    ) -> Result<(), ProtoError> {
        let field = || format!("step chunk seq {seq}: step.routes");
        let rows = Self::rows_of(tokens, opens_segment);
        let want = rows * self.bytes_per_token();
        if routes.len() != want {
            return Err(ProtoError::Invalid {
                field: field(),
                reason: format!(
                    "{} bytes, expected {want}: {rows} rows of {} MoE layers × {} experts × {} byte(s) for {tokens} tokens{}",
                    routes.len(),
                    self.moe_layers,
                    self.experts_per_token,
                    self.id_bytes(),
                    if opens_segment { " (a segment's first token has no row)" } else { "" },
                ),
            });
        }
        let bad = match self.id_bytes() {
            1 => self.first_bad(routes.iter().map(|&b| u16::from(b))),
            _ => self.first_bad(
                routes
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]])),
            ),
        };
        let (per, k) = (self.ids_per_token(), self.experts_per_token as usize);
        match bad {
            None => Ok(()),
            Some(Bad::Range { at, id }) => Err(ProtoError::Invalid {
                field: field(),
                reason: format!(
                    "row {} layer {} slot {} names expert {id}, but the policy has {}",
                    at / per,
                    (at % per) / k,
                    at % k,
                    self.routed_experts
                ),
            }),
            Some(Bad::Twice { at, id }) => Err(ProtoError::Invalid {
                field: field(),
                reason: format!(
                    "row {} layer {} names expert {id} twice",
                    at / per,
                    (at % per) / k
                ),
            }),
        }
    }

    /// The first id at or past `routed_experts`, or named twice within its layer, in one
    /// pass: a stamp per expert holds the last layer group that named it.
    fn first_bad(&self, ids: impl Iterator<Item = u16>) -> Option<Bad> {
        let k = self.experts_per_token as usize;
        let mut seen = vec![0u32; self.routed_experts as usize];
        let (mut group, mut slot) = (1u32, 0usize);
        for (at, id) in ids.enumerate() {
            let Some(stamp) = seen.get_mut(usize::from(id)) else {
                return Some(Bad::Range { at, id });
            };
            if *stamp == group {
                return Some(Bad::Twice { at, id });
            }
            *stamp = group;
            slot += 1;
            if slot == k {
                // A step of at most 4 MiB holds far fewer than 2^32 layer groups.
                (group, slot) = (group + 1, 0);
            }
        }
        None
    }
}

/// What [`RouteShape::first_bad`] found, at the index of the id among a step's ids.
enum Bad {
    /// An id at or past the expert count.
    Range { at: usize, id: u16 },
    /// An id already named in its layer.
    Twice { at: usize, id: u16 },
}

impl TryFrom<pb::RouteShape> for RouteShape {
    type Error = ProtoError;
    fn try_from(r: pb::RouteShape) -> Result<Self, ProtoError> {
        let s = Self {
            moe_layers: r.moe_layers,
            experts_per_token: r.experts_per_token,
            routed_experts: r.routed_experts,
        };
        s.validate()?;
        Ok(s)
    }
}

impl From<RouteShape> for pb::RouteShape {
    fn from(r: RouteShape) -> Self {
        Self {
            moe_layers: r.moe_layers,
            experts_per_token: r.experts_per_token,
            routed_experts: r.routed_experts,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(experts: u32) -> RouteShape {
        RouteShape {
            moe_layers: 2,
            experts_per_token: 2,
            routed_experts: experts,
        }
    }

    #[test]
    fn ids_pack_in_one_byte_up_to_256_experts_and_two_above() {
        assert_eq!(RouteShape::of_moe(0, 2, 8), None);
        assert_eq!(RouteShape::of_moe(2, 2, 8), Some(shape(8)));
        let ids = [0u16, 5, 255, 3];
        assert_eq!(shape(256).pack(&ids), vec![0, 5, 255, 3]);
        assert_eq!(shape(256).unpack(&shape(256).pack(&ids)), ids);
        let wide = [0u16, 300, 256, 7];
        let b = shape(384).pack(&wide);
        assert_eq!(b.len(), 8);
        assert_eq!(&b[2..4], &300u16.to_le_bytes());
        assert_eq!(shape(384).unpack(&b), wide);
    }

    #[test]
    fn a_step_needs_a_row_per_token_and_ids_below_the_expert_count() {
        let s = shape(8);
        let rows = |n: usize| [1u8, 2].repeat(2 * n);
        // 3 tokens: 3 rows later, 2 in the first step; 4 ids per row.
        s.check_step(1, 3, &rows(3), false).unwrap();
        s.check_step(0, 3, &rows(2), true).unwrap();
        let err = s.check_step(0, 3, &rows(3), true).unwrap_err().to_string();
        assert!(
            err.contains("12 bytes, expected 8") && err.contains("seq 0"),
            "{err}"
        );
        let mut bytes = rows(3);
        bytes[6] = 8;
        let err = s.check_step(4, 3, &bytes, false).unwrap_err().to_string();
        assert!(err.contains("row 1 layer 1 slot 0 names expert 8"), "{err}");
        let mut bytes = rows(3);
        bytes[7] = 1;
        let err = s.check_step(4, 3, &bytes, false).unwrap_err().to_string();
        assert!(err.contains("row 1 layer 1 names expert 1 twice"), "{err}");
        // Two-byte ids: the same checks.
        let wide = shape(384);
        let ok = wide.pack(&[300, 383, 0, 256]);
        wide.check_step(1, 1, &ok, false).unwrap();
        let err = wide
            .check_step(1, 1, &wide.pack(&[300, 383, 256, 256]), false)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("row 0 layer 1 names expert 256 twice"),
            "{err}"
        );
        let err = wide
            .check_step(1, 1, &wide.pack(&[300, 384, 0, 1]), false)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("row 0 layer 0 slot 1 names expert 384"),
            "{err}"
        );
        assert!(RouteShape { moe_layers: 0, ..s }.validate().is_err());
        assert!(RouteShape {
            experts_per_token: 8,
            ..s
        }
        .validate()
        .is_err());
    }
}
