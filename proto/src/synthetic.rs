//! Deterministic synthetic trajectories for tests and benchmarks.
//!
//! The content of every step is a pure function of (id, seq), so a verifier can
//! regenerate exactly what a writer sent without either side holding the
//! trajectory whole.

use crate::{
    RouteShape, SamplingParams, Step, StepTimings, TaskRef, Termination, ToolCall, ToolResult,
    ToolStatus, TrajectoryFooter, TrajectoryHeader,
};

/// Shape of a synthetic trajectory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Number of steps.
    pub steps: u64,
    /// Tokens per step; the first third of each step is context (masked), the
    /// rest generated.
    pub tokens_per_step: u32,
}

impl Shape {
    /// Total tokens.
    pub fn tokens(&self) -> u64 {
        self.steps * u64::from(self.tokens_per_step)
    }

    fn context_len(&self) -> u32 {
        self.tokens_per_step / 3
    }
}

/// FNV-1a, enough to spread ids into seeds.
fn hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// SplitMix64 step.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The header of synthetic trajectory `id`.
pub fn header(id: &str, family: &str, level: u32, policy_version: u64) -> TrajectoryHeader {
    TrajectoryHeader {
        trajectory_id: id.to_owned(),
        task: TaskRef {
            family: family.to_owned(),
            level,
            seed: hash(id) % 1000,
            spec_hash: format!("{:016x}", hash(family)),
        },
        actor_id: "synthetic".into(),
        policy_version,
        sampling: SamplingParams::default(),
        group_id: format!("{family}-{level}"),
        started_unix_ms: 1_700_000_000_000,
        routes: None,
        context: None,
    }
}

/// Deterministic route bytes for synthetic trajectory `id`: 4,096 rows, each layer's `k` ids
/// consecutive (mod the expert count) from a drawn start, so distinct; drawn once and reused
/// cyclically, so that adding routes to a stream costs a copy per step rather than a draw
/// per id.
#[derive(Debug, Clone)]
pub struct RoutePattern {
    shape: RouteShape,
    bytes: Vec<u8>,
}

impl RoutePattern {
    /// Rows in the pattern.
    const ROWS: usize = 4096;

    /// The pattern of `id` in `shape`.
    pub fn new(id: &str, shape: RouteShape) -> Self {
        let mut state = mix(hash(id) ^ 0x51ed);
        let (k, e) = (shape.experts_per_token, shape.routed_experts);
        let layers = Self::ROWS * shape.moe_layers as usize;
        let ids: Vec<u16> = (0..layers)
            .flat_map(|_| {
                state = mix(state);
                let start = (state % u64::from(e)) as u32;
                (0..k).map(move |j| ((start + j) % e) as u16)
            })
            .collect();
        Self {
            shape,
            bytes: shape.pack(&ids),
        }
    }

    /// `step` (step `seq`) with its route bytes: a row per token, one fewer in the first
    /// step, the rows following on from the pattern position of `seq`.
    pub fn apply(&self, seq: u64, mut step: Step) -> Step {
        let row = self.shape.bytes_per_token();
        let rows = RouteShape::rows_of(step.token_ids.len(), seq == 0);
        let mut out = Vec::with_capacity(rows * row);
        let mut at = (seq as usize * 7919) % Self::ROWS;
        while out.len() < rows * row {
            let take = (Self::ROWS - at).min(rows - out.len() / row);
            out.extend_from_slice(&self.bytes[at * row..(at + take) * row]);
            at = 0;
        }
        step.routes = out;
        step
    }
}

/// `step` (step `seq` of synthetic trajectory `id`) with route bytes of `shape`
/// ([`RoutePattern`]; build the pattern once to add routes to many steps).
pub fn with_routes(id: &str, seq: u64, step: Step, shape: RouteShape) -> Step {
    RoutePattern::new(id, shape).apply(seq, step)
}

/// Step `seq` of synthetic trajectory `id`.
pub fn step(id: &str, seq: u64, shape: Shape) -> Step {
    let mut state = mix(hash(id) ^ seq.wrapping_mul(0x9e37));
    let n = shape.tokens_per_step as usize;
    let ctx = shape.context_len() as usize;
    let mut s = Step::context(seq as u32, Vec::with_capacity(n));
    s.loss_mask.clear();
    s.logprobs.clear();
    s.policy_version = 1 + seq % 3;
    for i in 0..n {
        state = mix(state);
        s.token_ids.push((state % 50_000) as u32);
        let generated = i >= ctx;
        s.loss_mask.push(generated);
        s.logprobs.push(if generated {
            -((state >> 40) as f32) / 1e6
        } else {
            0.0
        });
    }
    s.tool_call = Some(ToolCall {
        name: "shell".into(),
        arguments_json: format!("{{\"cmd\":\"cat f{seq}.txt\"}}"),
    });
    s.tool_result = Some(ToolResult {
        status: ToolStatus::ALL[(state % 12) as usize],
        exit_code: (state % 3) as i32,
        bytes_shown: state % 4096,
        bytes_total: state % 8192,
        fuel_used: state % 100_000,
        wall_us: state % 1000,
    });
    s.process_reward = ((state % 7) as f32 - 3.0) / 10.0;
    s.timings = StepTimings {
        generate_us: state % 5000,
        tool_us: state % 700,
    };
    s
}

/// All steps of synthetic trajectory `id`, generated lazily.
pub fn steps(id: &str, shape: Shape) -> impl Iterator<Item = Step> + Send + 'static {
    let id = id.to_owned();
    (0..shape.steps).map(move |seq| step(&id, seq, shape))
}

/// All steps of synthetic trajectory `id` with route bytes of `routes` ([`RoutePattern`]).
pub fn routed_steps(
    id: &str,
    shape: Shape,
    routes: RouteShape,
) -> impl Iterator<Item = Step> + Send + 'static {
    let pattern = RoutePattern::new(id, routes);
    steps(id, shape)
        .enumerate()
        .map(move |(seq, s)| pattern.apply(seq as u64, s))
}

/// The footer that matches `shape`.
pub fn footer(id: &str, shape: Shape) -> TrajectoryFooter {
    let generated = u64::from(shape.tokens_per_step - shape.context_len()) * shape.steps;
    TrajectoryFooter {
        outcome_reward: (hash(id) % 2) as f32,
        success: hash(id) % 2 == 1,
        termination: Termination::ALL[(hash(id) % 3) as usize],
        step_count: shape.steps,
        token_count: shape.tokens(),
        generated_token_count: generated,
        wall_ms: 1234,
        finished_unix_ms: 1_700_000_001_234,
        template_divergent: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_steps_are_valid_and_deterministic() {
        let shape = Shape {
            steps: 3,
            tokens_per_step: 30,
        };
        let a: Vec<Step> = steps("x", shape).collect();
        let b: Vec<Step> = steps("x", shape).collect();
        assert_eq!(a, b);
        assert_ne!(a, steps("y", shape).collect::<Vec<_>>());
        for s in &a {
            s.validate().unwrap();
        }
        let generated: usize = a.iter().map(Step::generated_count).sum();
        assert_eq!(generated as u64, footer("x", shape).generated_token_count);
    }
}
