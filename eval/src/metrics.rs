//! The figures of an evaluation: what one episode contributes ([`episode_eval`]), one level's
//! figures from its trajectories ([`level_result`]), and the serialised result
//! ([`EvalResult`], the JSON `corvid report` reads).
//!
//! Rates are `None` (JSON `null`) when their denominator is 0: a level whose oracle needs one
//! call has no multi-step completion, a policy that never fails a call has no recovery rate.

use std::collections::{BTreeMap, HashMap};

use anyhow::Result;
use corvid_episode::EpisodeFormat;
use corvid_proto::Trajectory;
use corvid_rewards::{mean_pass_at_k, mean_pass_hat_k, EpisodeEval, EvalMetrics};
use corvid_tasks::{paths_read, FactLayout};
use serde::Serialize;

/// One level's figures (rates are `null` when their denominator is 0).
#[derive(Debug, Clone, Serialize)]
pub struct LevelResult {
    /// Level.
    pub level: u32,
    /// Episodes run (instances × k).
    pub episodes: usize,
    /// Solved / scored.
    pub success_rate: Option<f64>,
    /// Parsed calls / call attempts.
    pub tool_call_parse_rate: Option<f64>,
    /// Successful calls / parsed calls.
    pub tool_call_success_rate: Option<f64>,
    /// Solved / scored, over episodes whose oracle needs ≥ 2 calls.
    pub multi_step_completion: Option<f64>,
    /// Solved after a failed call / episodes with a failed call.
    pub failure_recovery_rate: Option<f64>,
    /// Mean pass@k over instances.
    pub pass_at_k: Option<f64>,
    /// Mean pass^k over instances.
    pub pass_hat_k: Option<f64>,
    /// Mean turns per episode.
    pub mean_turns: f64,
    /// Mean tokens per episode.
    pub mean_tokens: f64,
    /// Episodes excluded (infra_error, abandoned).
    pub excluded: usize,
    /// Episodes by termination.
    pub terminations: BTreeMap<String, usize>,
    /// Scored episodes and successes by total episode tokens (over all segments of a folded
    /// one), in power-of-two buckets.
    pub by_tokens: Vec<TokenBucket>,
    /// Scored episodes and successes by where in the episode a needed fact was first read
    /// ([`Position`]).
    pub by_position: BTreeMap<Position, Tally>,
    /// Scored episodes and successes by the instance's distractor density, where the family
    /// measures it ([`DensityBucket`]).
    pub by_density: Vec<DensityBucket>,
}

/// Scored episodes and how many succeeded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Tally {
    /// Scored episodes.
    pub scored: usize,
    /// Of those, successes.
    pub successes: usize,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.scored += other.scored;
        self.successes += other.successes;
    }
}

/// Where an episode first read one of its instance's fact files
/// ([`corvid_tasks::FactLayout`]), by the tokens before that call over the episode's total
/// (all segments of a folded one): the first third, the second or the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Position {
    /// In the first third.
    Beginning,
    /// In the second third.
    Middle,
    /// In the last third.
    End,
    /// Never (no successful read of a fact file).
    NeverRead,
}

impl Position {
    /// The position of a read after `before` of an episode's `total` tokens.
    pub fn of(before: u64, total: u64) -> Self {
        let at = before as f64 / total.max(1) as f64;
        if at < 1.0 / 3.0 {
            Self::Beginning
        } else if at < 2.0 / 3.0 {
            Self::Middle
        } else {
            Self::End
        }
    }
}

/// Scored episodes whose instance's distractor density lies below `up_to` (and at or above
/// the bucket before's): `0` holds the instances without distractors, then `1`, `2`, `4`, …
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DensityBucket {
    /// Exclusive upper bound (0: exactly none).
    pub up_to: f64,
    /// Scored episodes and successes.
    #[serde(flatten)]
    pub tally: Tally,
}

/// Adds `tally` to the bucket of `density` in `buckets`, kept in order of `up_to`.
fn add_to_density(buckets: &mut Vec<DensityBucket>, density: f64, tally: Tally) {
    let up_to = if density <= 0.0 {
        0.0
    } else {
        // The smallest power of two above the density, at least 1.
        let mut b = 1.0;
        while b <= density {
            b *= 2.0;
        }
        b
    };
    match buckets.iter().position(|b| b.up_to >= up_to) {
        Some(i) if buckets[i].up_to == up_to => buckets[i].tally.add(tally),
        Some(i) => buckets.insert(i, DensityBucket { up_to, tally }),
        None => buckets.push(DensityBucket { up_to, tally }),
    }
}

/// What the figures need from one evaluated instance besides its episodes.
#[derive(Debug, Clone)]
pub struct InstanceFacts {
    /// The calls its oracle needs.
    pub oracle_calls: u32,
    /// Where its needed facts lie.
    pub layout: FactLayout,
}

/// Where `t` first read one of `fact_files` (a successful call that reads it).
pub fn first_fact_read(t: &Trajectory, fact_files: &[String]) -> Position {
    let total = t.len() as u64;
    let mut before = 0u64;
    for s in &t.steps {
        if let (Some(call), Some(r)) = (&s.tool_call, &s.tool_result) {
            if r.status.is_success() && paths_read(call).iter().any(|p| fact_files.contains(p)) {
                return Position::of(before, total);
            }
        }
        before += s.token_ids.len() as u64;
    }
    Position::NeverRead
}

/// Scored episodes whose total tokens lie below `up_to` (and at or above the bucket before's),
/// and how many succeeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TokenBucket {
    /// Exclusive upper bound, a power of two from [`FIRST_BUCKET`].
    pub up_to: u64,
    /// Scored episodes.
    pub scored: usize,
    /// Of those, successes.
    pub successes: usize,
}

/// The first token bucket's upper bound.
pub const FIRST_BUCKET: u64 = 256;

/// Fewest scored episodes a bucket needs to count towards the effective length.
pub const MIN_BUCKET_EPISODES: usize = 10;

/// Adds an episode of `tokens` tokens to `buckets`, kept in order of `up_to`.
fn add_to_bucket(buckets: &mut Vec<TokenBucket>, tokens: u64, scored: usize, successes: usize) {
    let up_to = (tokens + 1).next_power_of_two().max(FIRST_BUCKET);
    match buckets.binary_search_by_key(&up_to, |b| b.up_to) {
        Ok(i) => {
            buckets[i].scored += scored;
            buckets[i].successes += successes;
        }
        Err(i) => buckets.insert(
            i,
            TokenBucket {
                up_to,
                scored,
                successes,
            },
        ),
    }
}

/// One family's levels, and its success by episode length over all of them.
#[derive(Debug, Clone, Serialize)]
pub struct FamilyResult {
    /// Family name.
    pub family: String,
    /// Per level, in order.
    pub levels: Vec<LevelResult>,
    /// The levels' token buckets summed.
    pub by_tokens: Vec<TokenBucket>,
    /// The effective length: the upper bound of the longest bucket (of at least
    /// [`MIN_BUCKET_EPISODES`] scored episodes) whose success rate is at least 80% of the
    /// shortest such bucket's; `None` when no bucket has enough episodes or the shortest
    /// never succeeds.
    pub effective_length: Option<u64>,
    /// The levels' fact positions summed.
    pub by_position: BTreeMap<Position, Tally>,
    /// The levels' density buckets summed.
    pub by_density: Vec<DensityBucket>,
}

impl FamilyResult {
    /// The family's result over `levels`, its buckets and effective length computed.
    pub fn new(family: impl Into<String>, levels: Vec<LevelResult>) -> Self {
        let mut by_tokens = Vec::new();
        for b in levels.iter().flat_map(|l| &l.by_tokens) {
            add_to_bucket(&mut by_tokens, b.up_to - 1, b.scored, b.successes);
        }
        let counted: Vec<&TokenBucket> = by_tokens
            .iter()
            .filter(|b| b.scored >= MIN_BUCKET_EPISODES)
            .collect();
        let rate = |b: &TokenBucket| b.successes as f64 / b.scored as f64;
        let effective_length = counted.first().filter(|b| rate(b) > 0.0).and_then(|first| {
            counted
                .iter()
                .filter(|b| rate(b) >= 0.8 * rate(first))
                .map(|b| b.up_to)
                .max()
        });
        let mut by_position: BTreeMap<Position, Tally> = BTreeMap::new();
        let mut by_density = Vec::new();
        for l in &levels {
            for (p, t) in &l.by_position {
                by_position.entry(*p).or_default().add(*t);
            }
            for b in &l.by_density {
                add_to_density(&mut by_density, b.up_to / 2.0, b.tally);
            }
        }
        Self {
            family: family.into(),
            levels,
            by_tokens,
            effective_length,
            by_position,
            by_density,
        }
    }
}

/// The whole evaluation.
#[derive(Debug, Clone, Serialize)]
pub struct EvalResult {
    /// Stage label.
    pub stage: String,
    /// The checkpoint folder, or `random-init`.
    pub checkpoint: String,
    /// Policy version recorded in the episodes' headers.
    pub policy_version: u64,
    /// Instances per level.
    pub episodes_per_level: usize,
    /// Samples per instance.
    pub k: u32,
    /// Sampling temperature.
    pub temperature: f32,
    /// First held-out seed.
    pub seed: u64,
    /// Where the episodes are stored.
    pub store: String,
    /// The label they are stored under (`<label>.<family>.L<level>.s<seed>.k<i>`): a rerun
    /// with `--label` reuses them, or finishes an interrupted evaluation.
    pub label: String,
    /// Per family.
    pub families: Vec<FamilyResult>,
    /// Wall time, seconds.
    pub wall_s: f64,
    /// Generated tokens per second over the run (episodes reused from the store were not
    /// generated again and count for neither).
    pub generated_tokens_per_s: f64,
}

/// What the evaluator metrics need from one episode.
pub fn episode_eval(format: &EpisodeFormat, t: &Trajectory, oracle_calls: u32) -> EpisodeEval {
    // A turn may span several steps; the last piece carries its call and result.
    let mut attempts: BTreeMap<u32, bool> = BTreeMap::new();
    let mut statuses = Vec::new();
    for s in &t.steps {
        let opened = format.attempts_call(&s.token_ids, &s.loss_mask);
        *attempts.entry(s.turn).or_default() |= opened;
        if let (Some(_), Some(r)) = (&s.tool_call, &s.tool_result) {
            statuses.push(r.status);
        }
    }
    EpisodeEval {
        call_attempts: attempts.values().filter(|a| **a).count() as u32,
        call_statuses: statuses,
        success: t.footer.success,
        termination: t.footer.termination,
        oracle_calls,
    }
}

/// Figures for one level from its trajectories (`k` samples per instance); `instances` maps
/// an instance's seed to what the figures need from it.
pub fn level_result(
    format: &EpisodeFormat,
    level: u32,
    trajectories: &[Trajectory],
    instances: &HashMap<u64, InstanceFacts>,
    k: u32,
) -> Result<LevelResult> {
    let evals: Vec<EpisodeEval> = trajectories
        .iter()
        .map(|t| {
            episode_eval(
                format,
                t,
                instances
                    .get(&t.header.task.seed)
                    .map_or(0, |i| i.oracle_calls),
            )
        })
        .collect();
    let m = EvalMetrics::from_episodes(&evals);
    let mut per_task: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut terminations: BTreeMap<String, usize> = BTreeMap::new();
    let mut by_tokens = Vec::new();
    let mut by_position: BTreeMap<Position, Tally> = BTreeMap::new();
    let mut by_density = Vec::new();
    for t in trajectories {
        *terminations
            .entry(t.footer.termination.as_str().to_string())
            .or_default() += 1;
        if t.footer.termination.is_scored() {
            let success = usize::from(t.footer.success);
            add_to_bucket(&mut by_tokens, t.len() as u64, 1, success);
            let one = Tally {
                scored: 1,
                successes: success,
            };
            if let Some(i) = instances.get(&t.header.task.seed) {
                // A family that names no fact files (`search`) has no positions to report.
                if !i.layout.fact_files.is_empty() {
                    let at = first_fact_read(t, &i.layout.fact_files);
                    by_position.entry(at).or_default().add(one);
                }
                if let Some(d) = i.layout.distractor_density {
                    add_to_density(&mut by_density, d, one);
                }
            }
            let e = per_task.entry(t.header.task.seed).or_default();
            e.0 += 1;
            e.1 += t.footer.success as u64;
        }
    }
    let tasks: Vec<(u64, u64)> = per_task
        .into_values()
        .filter(|(n, _)| *n >= k as u64)
        .collect();
    let n = trajectories.len().max(1) as f64;
    let turns: usize = trajectories
        .iter()
        .map(|t| {
            let mut seen: Vec<u32> = t.steps.iter().map(|s| s.turn).collect();
            seen.dedup();
            seen.len()
        })
        .sum();
    Ok(LevelResult {
        level,
        episodes: trajectories.len(),
        success_rate: m.success_rate,
        tool_call_parse_rate: m.tool_call_parse_rate,
        tool_call_success_rate: m.tool_call_success_rate,
        multi_step_completion: m.multi_step_completion,
        failure_recovery_rate: m.failure_recovery_rate,
        pass_at_k: mean_pass_at_k(&tasks, k as u64)?,
        pass_hat_k: mean_pass_hat_k(&tasks, k as u64)?,
        mean_turns: turns as f64 / n,
        mean_tokens: trajectories
            .iter()
            .map(|t| t.footer.token_count as f64)
            .sum::<f64>()
            / n,
        excluded: m.excluded,
        terminations,
        by_tokens,
        by_position,
        by_density,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(buckets: &[(u64, usize, usize)]) -> LevelResult {
        let mut by_tokens = Vec::new();
        for &(tokens, scored, successes) in buckets {
            add_to_bucket(&mut by_tokens, tokens, scored, successes);
        }
        LevelResult {
            level: 1,
            episodes: 0,
            success_rate: None,
            tool_call_parse_rate: None,
            tool_call_success_rate: None,
            multi_step_completion: None,
            failure_recovery_rate: None,
            pass_at_k: None,
            pass_hat_k: None,
            mean_turns: 0.0,
            mean_tokens: 0.0,
            excluded: 0,
            terminations: BTreeMap::new(),
            by_tokens,
            by_position: BTreeMap::new(),
            by_density: Vec::new(),
        }
    }

    /// Densities fall in buckets 0 (none), 1 (below one), 2, 4, …; a family's sum re-buckets
    /// each level's bucket into itself.
    #[test]
    fn density_buckets_round_trip_through_the_family_sum() {
        let one = Tally {
            scored: 1,
            successes: 1,
        };
        let mut buckets = Vec::new();
        for d in [0.0, 0.5, 1.0, 1.5, 3.0, 4.0, 63.0] {
            add_to_density(&mut buckets, d, one);
        }
        let bounds: Vec<(f64, usize)> = buckets.iter().map(|b| (b.up_to, b.tally.scored)).collect();
        assert_eq!(
            bounds,
            [(0.0, 1), (1.0, 1), (2.0, 2), (4.0, 1), (8.0, 1), (64.0, 1)]
        );
        let mut lvl = level(&[]);
        lvl.by_density = buckets.clone();
        lvl.by_position = BTreeMap::from([(Position::Middle, one)]);
        let f = FamilyResult::new("recall", vec![lvl.clone(), lvl]);
        let summed: Vec<(f64, usize)> = f
            .by_density
            .iter()
            .map(|b| (b.up_to, b.tally.scored))
            .collect();
        assert_eq!(
            summed,
            [(0.0, 2), (1.0, 2), (2.0, 4), (4.0, 2), (8.0, 2), (64.0, 2)]
        );
        assert_eq!(f.by_position[&Position::Middle].scored, 2);
    }

    /// A fact read after a third of the episode's tokens is in the middle; a failed read or
    /// a read of another file does not count.
    #[test]
    fn the_first_successful_read_of_a_fact_file_places_the_episode() {
        use corvid_proto::{synthetic, Step, ToolCall, ToolResult, ToolStatus, Trajectory};
        let read = |path: &str, status: ToolStatus, tokens: usize| {
            let mut s = Step::context(0, vec![1; tokens]);
            s.tool_call = Some(ToolCall {
                name: "read_file".into(),
                arguments_json: format!("{{\"path\":\"{path}\"}}"),
            });
            s.tool_result = Some(ToolResult {
                status,
                exit_code: 0,
                bytes_shown: 0,
                bytes_total: 0,
                fuel_used: 0,
                wall_us: 0,
            });
            s
        };
        let t = Trajectory {
            header: synthetic::header("t", "recall", 1, 0),
            steps: vec![
                read("a.txt", ToolStatus::Ok, 30),
                read("fact.txt", ToolStatus::NotFound, 10),
                read("fact.txt", ToolStatus::Ok, 30),
                read("b.txt", ToolStatus::Ok, 30),
            ],
            footer: synthetic::footer(
                "t",
                synthetic::Shape {
                    steps: 4,
                    tokens_per_step: 25,
                },
            ),
        };
        let facts = ["fact.txt".to_string()];
        // 40 of 100 tokens come before the read that succeeded.
        assert_eq!(first_fact_read(&t, &facts), Position::Middle);
        assert_eq!(first_fact_read(&t, &["a.txt".into()]), Position::Beginning);
        assert_eq!(first_fact_read(&t, &["b.txt".into()]), Position::End);
        assert_eq!(first_fact_read(&t, &["c.txt".into()]), Position::NeverRead);
        assert_eq!(Position::of(0, 0), Position::Beginning);
    }

    /// Episodes fall in power-of-two buckets summed over levels; the effective length is the
    /// longest bucket within 80% of the shortest's success, among buckets with enough episodes.
    #[test]
    fn the_effective_length_is_the_longest_bucket_near_the_shortest_ones_success() {
        let f = FamilyResult::new(
            "hops",
            vec![
                // 100 and 300 tokens: buckets 256 and 512.
                level(&[(100, 20, 18), (300, 10, 8)]),
                // 300 more, 1,000 (bucket 1,024) and 5,000 (8,192, too few episodes).
                level(&[(300, 10, 7), (1000, 20, 10), (5000, 3, 3)]),
            ],
        );
        let buckets: Vec<(u64, usize, usize)> = f
            .by_tokens
            .iter()
            .map(|b| (b.up_to, b.scored, b.successes))
            .collect();
        assert_eq!(
            buckets,
            [(256, 20, 18), (512, 20, 15), (1024, 20, 10), (8192, 3, 3)]
        );
        // 90% at 256; 75% at 512 is within 80% of it (72%); 50% at 1,024 is not; 8,192 has
        // too few episodes.
        assert_eq!(f.effective_length, Some(512));
        assert_eq!(
            FamilyResult::new("hops", vec![level(&[(100, 20, 0)])]).effective_length,
            None
        );
        assert_eq!(FamilyResult::new("hops", Vec::new()).effective_length, None);
    }
}
