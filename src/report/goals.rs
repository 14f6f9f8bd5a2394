//! The demo's three goals and whether a run met them: RL beats SFT-only at the frontier, the
//! curriculum reaches a long enough level, the run finishes in time.
//!
//! A goal that cannot be measured is `met: false`, `measured: null`, with a note saying which
//! input is missing. The targets are [`GOAL_RL_MINUS_SFT_POINTS`], [`GOAL_FRONTIER_TOKENS_RATIO`]
//! and [`GOAL_MAX_MINUTES`] unless `run.json`'s `goals` gives others.

use serde::Serialize;

use super::headline::Headline;
use super::inputs::GoalTargets;
use super::RunFacts;

// The demo's goals, as BENCHMARKS.md ("End to end") measures every `make demo` against them.
// `corvid run` does not write them into `run.json`, so they are kept here; a `run.json` whose
// `goals` sets one replaces it.

/// RL minus SFT-only held-out success at the frontier, in points.
pub const GOAL_RL_MINUS_SFT_POINTS: f64 = 15.0;
/// Oracle tokens of an episode at the frontier level over level 1.
pub const GOAL_FRONTIER_TOKENS_RATIO: f64 = 4.0;
/// Wall-clock minutes of the whole run.
pub const GOAL_MAX_MINUTES: f64 = 20.0;

/// One goal of the demo and whether the run met it.
#[derive(Debug, Clone, Serialize)]
pub struct Goal {
    /// What the goal asks, in words.
    pub name: String,
    /// The target value (`measured >= target`, or `<=` for durations; see `comparison`).
    pub target: f64,
    /// `">="` or `"<="`.
    pub comparison: &'static str,
    /// Unit of `target` and `measured`.
    pub unit: &'static str,
    /// The measured value; `None` when an input is missing.
    pub measured: Option<f64>,
    /// Whether the goal is met (false when not measured).
    pub met: bool,
    /// One sentence: met, missed by how much, or which input is missing.
    pub note: String,
}

/// Which side of its target a measured value must be on.
#[derive(Clone, Copy)]
enum Comparison {
    AtLeast,
    AtMost,
}

/// A goal before it is measured.
struct Target {
    name: String,
    target: f64,
    comparison: Comparison,
    unit: &'static str,
}

impl Target {
    /// The goal measured at `value`; `detail` says what was measured.
    fn measured(self, value: f64, detail: String) -> Goal {
        let met = match self.comparison {
            Comparison::AtLeast => value >= self.target,
            Comparison::AtMost => value <= self.target,
        };
        let verdict = if met { "met" } else { "MISSED" };
        self.goal(Some(value), met, format!("{verdict}: {detail}"))
    }

    /// The goal unmeasured; `why` names the missing input.
    fn not_measured(self, why: &str) -> Goal {
        self.goal(None, false, format!("not measured: {why}"))
    }

    fn goal(self, measured: Option<f64>, met: bool, note: String) -> Goal {
        Goal {
            name: self.name,
            target: self.target,
            comparison: match self.comparison {
                Comparison::AtLeast => ">=",
                Comparison::AtMost => "<=",
            },
            unit: self.unit,
            measured,
            met,
            note,
        }
    }
}

/// The three goals, in report order.
pub(super) fn goals(h: &Headline, facts: &RunFacts, targets: &GoalTargets) -> Vec<Goal> {
    let at = match (&h.main_family, h.frontier_level) {
        (Some(f), Some(l)) => format!("{f} level {l}"),
        _ => "the frontier".into(),
    };
    vec![
        rl_beats_sft(h, &at, targets),
        frontier_tokens(h, &at, targets),
        run_time(facts, targets),
    ]
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

fn rl_beats_sft(h: &Headline, at: &str, targets: &GoalTargets) -> Goal {
    let target = targets
        .rl_minus_sft_points
        .unwrap_or(GOAL_RL_MINUS_SFT_POINTS);
    let goal = Target {
        name: format!("RL beats SFT-only at the frontier by >= {target} points"),
        target,
        comparison: Comparison::AtLeast,
        unit: "points",
    };
    match (h.success.rl, h.success.sft) {
        (Some(rl), Some(sft)) => {
            let d = 100.0 * (rl - sft);
            goal.measured(
                d,
                format!(
                    "at {at}, SFT + RL {} vs SFT only {} ({d:+.1} points)",
                    pct(rl),
                    pct(sft)
                ),
            )
        }
        (rl, sft) => {
            let absent: Vec<&str> = [("success.rl", rl), ("success.sft", sft)]
                .iter()
                .filter(|(_, v)| v.is_none())
                .map(|(k, _)| *k)
                .collect();
            goal.not_measured(&format!("{} missing (see `missing`)", absent.join(" and ")))
        }
    }
}

fn frontier_tokens(h: &Headline, at: &str, targets: &GoalTargets) -> Goal {
    let target = targets
        .frontier_tokens_ratio
        .unwrap_or(GOAL_FRONTIER_TOKENS_RATIO);
    let goal = Target {
        name: format!("curriculum reaches a level with >= {target}x the tokens of level 1"),
        target,
        comparison: Comparison::AtLeast,
        unit: "x",
    };
    match h.frontier_tokens_ratio_vs_level1 {
        Some(r) => goal.measured(
            r,
            format!("frontier {at} has {r:.2}x the oracle tokens of level 1"),
        ),
        None => goal.not_measured("the frontier level or run.json's level_tokens is missing"),
    }
}

fn run_time(facts: &RunFacts, targets: &GoalTargets) -> Goal {
    let target = targets.max_minutes.unwrap_or(GOAL_MAX_MINUTES);
    let goal = Target {
        name: format!("run finished within {target} minutes"),
        target,
        comparison: Comparison::AtMost,
        unit: "minutes",
    };
    match facts.duration_minutes {
        Some(m) => goal.measured(m, format!("the run took {m:.1} minutes")),
        None if facts.started_unix_ms.is_none() => goal.not_measured("run.json has no start time"),
        None => goal.not_measured(
            "run.json has no finish time (the run was interrupted or is still running)",
        ),
    }
}
