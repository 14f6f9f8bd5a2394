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

use crate::step_scan::{routes_field, scan, Scan};
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
    /// step; token ids lie in the vocabulary; the step opening a segment has no route row for
    /// its first token.
    pub fn check(&mut self, seq: u64, step: &Step) -> Result<(), ProtoError> {
        let opens = self.opens_segment(seq, step.segment)?;
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
        self.check_routes(seq, step.token_ids.len(), &step.routes, opens)?;
        self.segment = Some(step.segment);
        Ok(())
    }

    /// [`check`](Self::check) for a step whose token ids were checked where they lay.
    fn check_scanned(&mut self, seq: u64, scan: &Scan<'_>) -> Result<(), ProtoError> {
        let opens = self.opens_segment(seq, scan.segment)?;
        self.check_routes(seq, scan.tokens, scan.routes, opens)?;
        self.segment = Some(scan.segment);
        Ok(())
    }

    /// Whether a step of `segment` opens it, after the step before.
    fn opens_segment(&self, seq: u64, segment: u32) -> Result<bool, ProtoError> {
        let prev = self.segment;
        match prev {
            None if segment != 0 => Err(format!("{segment}: the first step is in segment 0")),
            Some(p) if segment != p && segment != p + 1 => Err(format!(
                "{segment} after a step of segment {p}: a step stays in its segment or opens the next"
            )),
            _ => Ok(prev != Some(segment)),
        }
        .map_err(|reason| {
            at(
                seq,
                ProtoError::Invalid {
                    field: "step.segment".into(),
                    reason,
                },
            )
        })
    }

    fn check_routes(
        &self,
        seq: u64,
        tokens: usize,
        routes: &[u8],
        opens: bool,
    ) -> Result<(), ProtoError> {
        match self.routes {
            Some(shape) => shape.check_step(seq, tokens, routes, opens),
            None if !routes.is_empty() => Err(at(
                seq,
                ProtoError::Invalid {
                    field: "step.routes".into(),
                    reason: format!(
                        "{} bytes, but the header declares no route shape",
                        routes.len()
                    ),
                },
            )),
            None => Ok(()),
        }
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
    /// Step `seq` as it arrived on the wire, checked once. Bytes in prost's own encoding are
    /// checked where they lie (`step_scan`) and kept as they came; any others, and any that
    /// break a rule, take [`received_decoded`](Self::received_decoded), which names the
    /// error.
    pub fn received(seq: u64, bytes: Bytes, rules: &mut StepRules) -> Result<Self, ProtoError> {
        let Some(scan) = scan(&bytes, rules.vocab_size) else {
            return Self::received_decoded(seq, bytes, rules);
        };
        rules.check_scanned(seq, &scan)?;
        let (tokens, generated) = (scan.tokens as u64, scan.generated as u64);
        Ok(Self {
            bytes,
            tokens,
            generated,
            rules: *rules,
        })
    }

    /// The reference path of [`received`](Self::received): decode, convert, check, and keep
    /// prost's encoding of the step in place of bytes in any other.
    pub fn received_decoded(
        seq: u64,
        bytes: Bytes,
        rules: &mut StepRules,
    ) -> Result<Self, ProtoError> {
        let wire = pb::Step::decode(bytes.as_ref()).map_err(|e| {
            at(
                seq,
                ProtoError::Invalid {
                    field: "step".into(),
                    reason: format!("is not a corvid.v1.Step: {e}"),
                },
            )
        })?;
        // Bytes in any other encoding than prost's (fields this version does not know, an
        // older writer's per-token versions, a newer writer's additions) are stored as this
        // version encodes them: nothing unchecked is kept for a later reader that would know
        // the field.
        let encoded = wire.encode_to_vec();
        let bytes = if encoded[..] == bytes[..] {
            bytes
        } else {
            Bytes::from(encoded)
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

    /// The encoded step cut around its `routes` field: the bytes before the field, the
    /// routes' own bytes, and the bytes after it (`before ‖ after` is the step without
    /// routes). Without routes: the whole step, then two empty slices. `None` only for bytes
    /// that are not a step in prost's encoding, which no constructor keeps.
    pub fn split_routes(&self) -> Option<(&[u8], &[u8], &[u8])> {
        match routes_field(&self.bytes)? {
            Some((field, payload)) => Some((
                &self.bytes[..field.start],
                &self.bytes[payload..field.end],
                &self.bytes[field.end..],
            )),
            None => Some((&self.bytes, &[], &[])),
        }
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

    /// Bytes that decode to a valid step but are not prost's encoding of it are stored as
    /// prost's encoding, by either path: a mask byte of 2, a tool result of prost's length
    /// holding an unknown field.
    #[test]
    fn a_valid_step_in_another_encoding_is_stored_as_prost_writes_it() {
        let lp = (-0.5f32).to_le_bytes();
        let mask_two = [
            &[0x12, 0x01, 0x05, 0x1a, 0x01, 0x02, 0x22, 0x04][..],
            &lp[..],
        ]
        .concat();
        let tool_result = [
            0x08, 0x01, 0x10, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x7a, 0x03, 1, 2, 3,
        ];
        let unknown_inside = [
            &[0x12, 0x01, 0x05, 0x1a, 0x01, 0x01, 0x22, 0x04][..],
            &lp[..],
            &[0x3a, tool_result.len() as u8][..],
            &tool_result[..],
        ]
        .concat();
        for odd in [mask_two, unknown_inside] {
            let wire = pb::Step::decode(&odd[..]).unwrap();
            let prost = wire.encode_to_vec();
            assert_ne!(prost, odd);
            for path in [CheckedStep::received, CheckedStep::received_decoded] {
                let c = path(0, Bytes::from(odd.clone()), &mut rules(9)).unwrap();
                assert_eq!(c.bytes(), &prost[..]);
                assert_eq!((c.tokens(), c.generated()), (1, 1));
            }
        }
    }

    mod fast_path {
        //! [`CheckedStep::received`]'s scan against its reference, the decoding path.
        use super::*;
        use crate::types::{StepTimings, ToolCall, ToolResult, ToolStatus};
        use proptest::prelude::*;

        const VOCAB: u32 = 300;

        fn shape() -> RouteShape {
            RouteShape {
                moe_layers: 2,
                experts_per_token: 2,
                routed_experts: 8,
            }
        }

        /// Steps a policy writes, and some that break a rule: ids at the vocabulary's edge,
        /// infinite log-probs, prompt tokens with a log-prob, a wrong route length, a route
        /// naming an expert the policy lacks.
        fn step() -> impl Strategy<Value = Step> {
            let token = (0u32..VOCAB + 2, any::<bool>(), -3.0f32..0.01, 0u8..40);
            (
                proptest::collection::vec(token, 0..24),
                (0u32..3, 0u64..3, 0u32..3),
                prop_oneof![Just(0.0f32), -1.0f32..1.0, Just(f32::NAN)],
                (any::<bool>(), any::<bool>(), any::<bool>(), 0usize..3),
            )
                .prop_map(|(tokens, (turn, version, segment), reward, extra)| {
                    let (call, result, timings, routes_off) = extra;
                    let n = tokens.len();
                    Step {
                        turn,
                        token_ids: tokens.iter().map(|t| t.0).collect(),
                        loss_mask: tokens.iter().map(|t| t.1).collect(),
                        logprobs: tokens
                            .iter()
                            .map(|t| match (t.1, t.3) {
                                (_, 0) => f32::INFINITY,
                                (false, 1) => -0.5,
                                (false, _) => 0.0,
                                (true, _) => t.2,
                            })
                            .collect(),
                        policy_version: version,
                        tool_call: call.then(|| ToolCall {
                            name: "cat".into(),
                            arguments_json: if n % 2 == 0 {
                                String::new()
                            } else {
                                "{}".into()
                            },
                        }),
                        tool_result: result.then_some(ToolResult {
                            status: ToolStatus::Ok,
                            exit_code: (n % 3) as i32 - 1,
                            bytes_shown: n as u64,
                            bytes_total: 0,
                            fuel_used: 7,
                            wall_us: 1,
                        }),
                        process_reward: reward,
                        timings: StepTimings {
                            generate_us: if timings { 5 } else { 0 },
                            tool_us: 0,
                        },
                        routes: tokens
                            .iter()
                            .skip(routes_off)
                            .flat_map(|t| [t.3 % 8, (t.3 + 1) % 8, t.3 % 9, 1])
                            .collect(),
                        segment,
                    }
                })
        }

        /// The same step written otherwise: fields prost would not write, or bytes damaged.
        fn mutate(bytes: &[u8], how: u8, at: usize) -> Vec<u8> {
            let mut b = bytes.to_vec();
            let at = if b.is_empty() { 0 } else { at % b.len() };
            match how {
                0 => b,
                // An unknown field (an older writer's per-token versions), a default written out.
                1 => [b, vec![0x2a, 0x01, 0x03]].concat(),
                2 => [vec![0x08, 0x00], b].concat(),
                // An empty packed field, a padded varint, every field twice, one out of order.
                3 => [vec![0x12, 0x00], b].concat(),
                4 => [vec![0x08, 0x81, 0x00], b].concat(),
                5 => [b.clone(), b].concat(),
                6 => [vec![0x60, 0x01], b].concat(),
                // A byte flipped, the bytes cut short.
                7 => {
                    if let Some(x) = b.get_mut(at) {
                        *x ^= 0x41;
                    }
                    b
                }
                _ => {
                    b.truncate(at);
                    b
                }
            }
        }

        type Path = fn(u64, Bytes, &mut StepRules) -> Result<CheckedStep, ProtoError>;

        /// A path's outcome: the step's bytes and counts with the rules after, or the error.
        fn outcome(
            path: Path,
            bytes: &[u8],
            mut rules: StepRules,
        ) -> Result<(CheckedStep, StepRules), String> {
            path(3, Bytes::copy_from_slice(bytes), &mut rules)
                .map(|c| (c, rules))
                .map_err(|e| e.to_string())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(3000))]

            #[test]
            fn the_scan_accepts_refuses_and_keeps_what_decoding_does(
                step in step(),
                how in 0u8..9,
                at in any::<usize>(),
                routed in any::<bool>(),
                vocab in any::<bool>(),
                before in prop_oneof![Just(None), (0u32..2).prop_map(Some)],
            ) {
                let mut rules = StepRules::new(routed.then(shape), vocab.then_some(VOCAB));
                // The segment of the step before, if any.
                rules.segment = before;
                let bytes = mutate(&pb::Step::from(step).encode_to_vec(), how, at);
                let fast = outcome(CheckedStep::received, &bytes, rules);
                let reference = outcome(CheckedStep::received_decoded, &bytes, rules);
                // What the store keeps of an accepted step: its routes apart from the rest.
                if let Ok((c, _)) = &fast {
                    let (before, routes, after) = c.split_routes().unwrap();
                    let whole = pb::Step::decode(c.bytes()).unwrap();
                    let rest = pb::Step::decode(&[before, after].concat()[..]).unwrap();
                    prop_assert_eq!(routes, &whole.routes[..]);
                    prop_assert_eq!(rest, pb::Step { routes: vec![], ..whole });
                }
                prop_assert_eq!(fast, reference);
            }

            /// A valid step as prost writes it never takes the decoding path.
            #[test]
            fn a_valid_step_as_prost_writes_it_is_checked_where_it_lies(step in step()) {
                let step = Step {
                    token_ids: step.token_ids.iter().map(|id| id % VOCAB).collect(),
                    logprobs: step
                        .loss_mask
                        .iter()
                        .zip(&step.logprobs)
                        .map(|(&m, &lp)| if m { lp.clamp(-5.0, 0.0) } else { 0.0 })
                        .collect(),
                    process_reward: if step.process_reward.is_nan() { 0.5 } else { step.process_reward },
                    routes: vec![],
                    segment: 0,
                    ..step
                };
                step.validate().unwrap();
                let bytes = pb::Step::from(step.clone()).encode_to_vec();
                let scan = scan(&bytes, Some(VOCAB));
                prop_assert!(scan.is_some(), "{:?}", step);
                let scan = scan.unwrap();
                prop_assert_eq!(
                    (scan.tokens, scan.generated, scan.segment),
                    (step.token_ids.len(), step.generated_count(), step.segment)
                );
            }
        }
    }
}
