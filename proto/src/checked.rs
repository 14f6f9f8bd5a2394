//! A step checked once at the trajectory edge, and the bytes the store keeps for it.
//!
//! Every writer of the store hands it a [`CheckedStep`]: the learner builds one from the
//! bytes a step chunk arrived as ([`CheckedStep::received`]), tools and tests from a typed
//! [`Step`] ([`CheckedStep::new`]). Either way the same checks run, once, before anything
//! is stored: the step's own invariants ([`Step::validate`]), its routes against the
//! header's [`RouteShape`], and, where the policy is known, its token ids against the
//! vocabulary ([`StepRules`]). The store then writes the bytes without decoding them again.

use prost::bytes::Bytes;
use prost::Message;

use crate::types::ProtoError;
use crate::{pb, RouteShape, Step};

/// What a step must satisfy beyond its own invariants, checked in sequence: the rules keep
/// the segment of the step before.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepRules {
    /// The header's route shape: every step carries rows of it. `None`: no routes.
    pub routes: Option<RouteShape>,
    /// Every token id must be below this, when the policy is known.
    pub vocab_size: Option<u32>,
    /// The segment of the last step checked (`None` before the first).
    segment: Option<u32>,
}

impl StepRules {
    /// Rules for a trajectory whose header declares `routes`, for a policy of `vocab_size`
    /// tokens when it is known.
    pub fn new(routes: Option<RouteShape>, vocab_size: Option<u32>) -> Self {
        Self {
            routes,
            vocab_size,
            segment: None,
        }
    }

    /// Checks step `seq`, the step after the last one checked, against the rules (not its own
    /// invariants: see [`Step::validate`]): segments start at 0 and rise by at most one a
    /// step; the step opening a segment has no route row for its first token.
    pub fn check(&mut self, seq: u64, step: &Step) -> Result<(), ProtoError> {
        let prev = self.segment;
        let opens = match prev {
            None if step.segment != 0 => {
                Err(format!("{}: the first step is in segment 0", step.segment))
            }
            Some(p) if step.segment != p && step.segment != p + 1 => Err(format!(
                "{} after a step of segment {p}: a step stays in its segment or opens the next",
                step.segment
            )),
            _ => Ok(prev != Some(step.segment)),
        }
        .map_err(|reason| {
            at(
                seq,
                ProtoError::Invalid {
                    field: "step.segment".into(),
                    reason,
                },
            )
        })?;
        if let Some(vocab) = self.vocab_size {
            if let Some(i) = step.token_ids.iter().position(|&id| id >= vocab) {
                return Err(at(
                    seq,
                    ProtoError::Invalid {
                        field: format!("step.token_ids[{i}]"),
                        reason: format!(
                            "{} is outside the policy's vocabulary of {vocab}",
                            step.token_ids[i]
                        ),
                    },
                ));
            }
        }
        match self.routes {
            Some(shape) => shape.check_step(seq, step.token_ids.len(), &step.routes, opens),
            None if !step.routes.is_empty() => Err(at(
                seq,
                ProtoError::Invalid {
                    field: "step.routes".into(),
                    reason: format!(
                        "{} bytes, but the header declares no route shape",
                        step.routes.len()
                    ),
                },
            )),
            None => Ok(()),
        }?;
        self.segment = Some(step.segment);
        Ok(())
    }
}

/// Names the step chunk in an error about one of its fields.
fn at(seq: u64, e: ProtoError) -> ProtoError {
    match e {
        ProtoError::Invalid { field, reason } => ProtoError::Invalid {
            field: format!("step chunk seq {seq}: {field}"),
            reason,
        },
        ProtoError::Missing(field) => ProtoError::Invalid {
            field: format!("step chunk seq {seq}: {field}"),
            reason: "is missing".into(),
        },
    }
}

/// A step that passed every check, as the protobuf bytes (`corvid.v1.Step`) to store.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedStep {
    bytes: Bytes,
    tokens: u64,
    generated: u64,
    rules: StepRules,
}

impl CheckedStep {
    /// Step `seq` as it arrived on the wire: decoded and checked once; the bytes are kept
    /// as they came when they hold only fields this version knows.
    pub fn received(seq: u64, bytes: Bytes, rules: &mut StepRules) -> Result<Self, ProtoError> {
        let wire = pb::Step::decode(bytes.as_ref()).map_err(|e| {
            at(
                seq,
                ProtoError::Invalid {
                    field: "step".into(),
                    reason: format!("is not a corvid.v1.Step: {e}"),
                },
            )
        })?;
        // Bytes with fields this version does not know (an older writer's per-token versions,
        // a newer writer's additions) are stored as this version encodes them: nothing
        // unchecked is kept for a later reader that would know the field.
        let bytes = if wire.encoded_len() == bytes.len() {
            bytes
        } else {
            Bytes::from(wire.encode_to_vec())
        };
        let step = Step::try_from(wire).map_err(|e| at(seq, e))?;
        rules.check(seq, &step)?;
        Ok(Self::of(&step, bytes, rules))
    }

    /// Step `seq` from its typed form: checked, then encoded.
    pub fn new(seq: u64, step: Step, rules: &mut StepRules) -> Result<Self, ProtoError> {
        step.validate().map_err(|e| at(seq, e))?;
        rules.check(seq, &step)?;
        let counted = Self::of(&step, Bytes::new(), rules);
        Ok(Self {
            bytes: Bytes::from(pb::Step::from(step).encode_to_vec()),
            ..counted
        })
    }

    fn of(step: &Step, bytes: Bytes, rules: &StepRules) -> Self {
        Self {
            bytes,
            tokens: step.token_ids.len() as u64,
            generated: step.generated_count() as u64,
            rules: *rules,
        }
    }

    /// The encoded step.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Its tokens.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Its generated tokens.
    pub fn generated(&self) -> u64 {
        self.generated
    }

    /// The rules it was checked against.
    pub fn rules(&self) -> &StepRules {
        &self.rules
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(vocab: u32) -> StepRules {
        StepRules::new(None, Some(vocab))
    }

    #[test]
    fn received_bytes_are_kept_as_they_came_unless_they_hold_unknown_fields() {
        let step = Step::generated(0, vec![3, 4], vec![-0.5, -0.25], 2);
        let bytes = pb::Step::from(step.clone()).encode_to_vec();
        let c = CheckedStep::received(0, Bytes::from(bytes.clone()), &mut rules(5)).unwrap();
        assert_eq!(c.bytes(), &bytes[..]);
        assert_eq!((c.tokens(), c.generated()), (2, 2));
        // An unknown field (an older writer's per-token versions, field 5) is dropped.
        let mut older = bytes.clone();
        older.extend_from_slice(&[0x2a, 0x02, 0x02, 0x02]);
        let c = CheckedStep::received(0, Bytes::from(older), &mut rules(5)).unwrap();
        assert_eq!(c.bytes(), &bytes[..]);
        let typed = CheckedStep::new(0, step, &mut rules(5)).unwrap();
        assert_eq!(typed.tokens(), 2);
    }

    #[test]
    fn each_refusal_names_the_chunk_and_field() {
        let step = Step::generated(0, vec![3, 9], vec![-0.5, -0.25], 2);
        let bytes = Bytes::from(pb::Step::from(step).encode_to_vec());
        let err = CheckedStep::received(7, bytes, &mut rules(5))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("step chunk seq 7: step.token_ids[1]") && err.contains("vocabulary of 5"),
            "{err}"
        );
        let err = CheckedStep::received(2, Bytes::from_static(&[0xff, 0xff]), &mut rules(5))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("step chunk seq 2: step") && err.contains("corvid.v1.Step"),
            "{err}"
        );
        let mut bad = Step::generated(0, vec![1, 2], vec![-0.5, 0.5], 1);
        let err = CheckedStep::new(3, bad.clone(), &mut rules(5))
            .unwrap_err()
            .to_string();
        assert!(err.contains("step chunk seq 3: step.logprobs[1]"), "{err}");
        bad.logprobs[1] = -1.0;
        bad.routes = vec![1, 2];
        let err = CheckedStep::new(3, bad, &mut rules(5))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("step chunk seq 3: step.routes") && err.contains("no route shape"),
            "{err}"
        );
    }

    /// Segments start at 0 and rise by at most one a step; the step opening a segment has no
    /// route row for its first token, like the trajectory's first step.
    #[test]
    fn segments_rise_one_at_a_time_and_each_opens_without_a_route_row() {
        let shape = RouteShape {
            moe_layers: 1,
            experts_per_token: 1,
            routed_experts: 4,
        };
        let step = |segment: u32, rows: usize| {
            let mut s = Step::generated(0, vec![1, 2, 3], vec![-0.5; 3], 1);
            s.segment = segment;
            s.routes = vec![0; rows];
            s
        };
        let mut rules = StepRules::new(Some(shape), None);
        for (seq, (segment, rows)) in [(0, 2), (0, 3), (1, 2), (1, 3), (2, 2)]
            .into_iter()
            .enumerate()
        {
            rules.check(seq as u64, &step(segment, rows)).unwrap();
        }
        let err = rules.check(5, &step(2, 2)).unwrap_err().to_string();
        assert!(
            err.contains("step chunk seq 5: step.routes") && err.contains("expected 3"),
            "{err}"
        );
        let err = rules.check(5, &step(4, 2)).unwrap_err().to_string();
        assert!(
            err.contains("step chunk seq 5: step.segment")
                && err.contains("4 after a step of segment 2"),
            "{err}"
        );
        let err = StepRules::new(None, None)
            .check(0, &step(1, 0))
            .unwrap_err()
            .to_string();
        assert!(err.contains("the first step is in segment 0"), "{err}");
    }
}
