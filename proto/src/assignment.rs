//! [`Assignment`]: one episode the learner hands an actor (`NextTasks`), with its conversions
//! to and from the wire.

use crate::pb;
use crate::types::{ProtoError, SamplingParams, TaskRef};

/// One episode to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    /// The task instance.
    pub task: TaskRef,
    /// The group it belongs to.
    pub group_id: String,
    /// G, the episodes of its group.
    pub group_size: u32,
    /// Most turns.
    pub max_turns: u32,
    /// Context budget, tokens.
    pub context_budget: u32,
    /// Sampling, with this episode's own seed.
    pub sampling: SamplingParams,
}

impl From<Assignment> for pb::TaskAssignment {
    fn from(a: Assignment) -> Self {
        Self {
            task: Some(a.task.into()),
            group_id: a.group_id,
            group_size: a.group_size,
            max_turns: a.max_turns,
            context_budget: a.context_budget,
            sampling: Some(a.sampling.into()),
        }
    }
}

impl TryFrom<pb::TaskAssignment> for Assignment {
    type Error = ProtoError;

    fn try_from(a: pb::TaskAssignment) -> Result<Self, ProtoError> {
        let task = a.task.ok_or(ProtoError::Missing("assignment.task"))?;
        let sampling = a
            .sampling
            .ok_or(ProtoError::Missing("assignment.sampling"))?;
        Ok(Self {
            task: TaskRef::try_from(task)?,
            group_id: a.group_id,
            group_size: a.group_size,
            max_turns: a.max_turns,
            context_budget: a.context_budget,
            sampling: SamplingParams::try_from(sampling)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_assignment_round_trips_through_the_wire_and_a_missing_part_is_named() {
        let a = Assignment {
            task: TaskRef {
                family: "hops".into(),
                level: 2,
                seed: 7,
                spec_hash: "ab".into(),
            },
            group_id: "g1".into(),
            group_size: 8,
            max_turns: 6,
            context_budget: 1024,
            sampling: SamplingParams::default(),
        };
        let wire = pb::TaskAssignment::from(a.clone());
        assert_eq!(Assignment::try_from(wire.clone()).unwrap(), a);
        let err = Assignment::try_from(pb::TaskAssignment {
            sampling: None,
            ..wire
        })
        .unwrap_err();
        assert!(err.to_string().contains("assignment.sampling"), "{err}");
    }
}
