//! [`Trajectory`]: one finished episode, whole (header, steps, footer). The actor collects it,
//! the store loads it, the trainers and the evaluator read it; the wire carries it in parts.

use std::collections::BTreeMap;

use crate::types::{Step, TrajectoryFooter, TrajectoryHeader};

/// A finished trajectory, whole.
#[derive(Debug, Clone, PartialEq)]
pub struct Trajectory {
    /// The header (group, policy version, task, sampling).
    pub header: TrajectoryHeader,
    /// Every step, in order. A turn longer than an actor's step limit spans several steps
    /// with the same turn index.
    pub steps: Vec<Step>,
    /// The footer (outcome reward, success, termination).
    pub footer: TrajectoryFooter,
}

/// The steps of each context segment, in order, as ranges of `steps`: one for an episode that
/// never folded, none for no steps. Each is one sequence the policy saw.
pub fn step_segments(steps: &[Step]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=steps.len() {
        if i == steps.len() || steps[i].segment != steps[start].segment {
            out.push(start..i);
            start = i;
        }
    }
    out
}

/// One turn's totals over its steps ([`Trajectory::turns`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TurnTotals {
    /// The turn index.
    pub turn: u32,
    /// The sum of its steps' process rewards.
    pub process_reward: f64,
    /// Its generated tokens.
    pub generated_tokens: usize,
}

impl Trajectory {
    /// All token ids, in order.
    pub fn token_ids(&self) -> Vec<u32> {
        self.steps
            .iter()
            .flat_map(|s| s.token_ids.iter().copied())
            .collect()
    }

    /// Recorded expert ids, unpacked and concatenated over the steps: in an episode that
    /// never folded, row `j` (of
    /// [`RouteShape::ids_per_token`](crate::RouteShape::ids_per_token) ids) is the routing of
    /// input position `j`, for `j < len − 1` (the last token was never an input); each
    /// further segment adds its own rows, one fewer than its tokens. `None` without a route
    /// shape in the header.
    pub fn route_ids(&self) -> Option<Vec<u16>> {
        let shape = self.header.routes?;
        Some(
            self.steps
                .iter()
                .flat_map(|s| shape.unpack(&s.routes))
                .collect(),
        )
    }

    /// The steps of each context segment ([`step_segments`] of [`steps`](Self::steps)).
    pub fn segments(&self) -> Vec<std::ops::Range<usize>> {
        step_segments(&self.steps)
    }

    /// Total tokens.
    pub fn len(&self) -> usize {
        self.steps.iter().map(|s| s.token_ids.len()).sum()
    }

    /// Whether the trajectory has no token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Generated (trainable) tokens.
    pub fn generated_tokens(&self) -> usize {
        self.steps.iter().map(Step::generated_count).sum()
    }

    /// Policy versions behind `current_version` (0 if it is not behind).
    pub fn lag(&self, current_version: u64) -> u64 {
        current_version.saturating_sub(self.header.policy_version)
    }

    /// Turns in order of first appearance; a turn spread over several steps sums them.
    pub fn turns(&self) -> Vec<TurnTotals> {
        let mut order: Vec<u32> = Vec::new();
        let mut by_turn: BTreeMap<u32, TurnTotals> = BTreeMap::new();
        for s in &self.steps {
            let e = by_turn.entry(s.turn).or_insert_with(|| {
                order.push(s.turn);
                TurnTotals {
                    turn: s.turn,
                    process_reward: 0.0,
                    generated_tokens: 0,
                }
            });
            e.process_reward += f64::from(s.process_reward);
            e.generated_tokens += s.generated_count();
        }
        order.iter().map(|t| by_turn[t]).collect()
    }
}
