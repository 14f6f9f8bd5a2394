//! The short-to-long curriculum: a frontier level per family, promoted when the policy
//! masters it, demoted when an earlier mastered level collapses, and sampling weights that
//! favour the frontier while replaying easier levels.
//!
//! Rules (all thresholds in [`CurriculumConfig`]):
//! 1. Only results at the frontier level `f` enter the frontier window (the last `window`
//!    results). When it holds at least `min_samples` results and their success rate is
//!    `>= promote_threshold`, `f` becomes `f + 1` (up to the family's top level) and both
//!    windows are cleared.
//! 2. Results at the level just below the frontier (`f − 1`, the last mastered one) enter
//!    the replay window. When it holds `min_samples` results and their success rate is
//!    `<= demote_threshold`, that level has *collapsed*: `f` becomes `f − 1`, windows
//!    cleared. A low success at a freshly promoted frontier is expected (the probe in
//!    `learning_feasibility.md` starts each new level near 0 %) and is not a demotion.
//! 3. Level sampling: the frontier gets `frontier_share` of the mass; level `l < f` gets
//!    the rest in proportion to `replay_decay^(f − 1 − l)`, so the most recently mastered
//!    levels are replayed most, and level 1 never drops to zero.
//! 4. The context-window stage follows the highest level ever admitted by any family
//!    (never the current frontier): the model's RoPE scaling stage must not shrink when a
//!    frontier is demoted.
//!
//! The whole state, including the sampler's RNG, is `serde`-serialisable: a learner that
//! saves it with its checkpoint and loads it back continues the exact same sequence.

use std::collections::{BTreeMap, VecDeque};

use crate::error::TasksError;
use crate::rng::SplitMix64;

/// One step of the context-window schedule.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ContextStage {
    /// The stage applies once some family has admitted this level.
    pub min_level: u32,
    /// Context window, in tokens, during the stage.
    pub context_tokens: u32,
}

/// Thresholds and shapes of the curriculum.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CurriculumConfig {
    /// Success rate at the frontier that promotes (the probe used 0.8).
    pub promote_threshold: f64,
    /// Success rate at the last mastered level that counts as a collapse.
    pub demote_threshold: f64,
    /// Results remembered per window.
    pub window: usize,
    /// Results needed in a window before it may promote or demote.
    pub min_samples: usize,
    /// Sampling mass on the frontier level (the probe used 0.75).
    pub frontier_share: f64,
    /// Ratio of the replay weight of level `l − 1` to level `l`, in (0, 1].
    pub replay_decay: f64,
    /// Context stages, ascending in `min_level`; the first must have `min_level = 1`.
    pub context_stages: Vec<ContextStage>,
}

impl Default for CurriculumConfig {
    fn default() -> Self {
        Self {
            promote_threshold: 0.8,
            demote_threshold: 0.3,
            window: 64,
            min_samples: 32,
            frontier_share: 0.6,
            replay_decay: 0.5,
            context_stages: vec![
                ContextStage {
                    min_level: 1,
                    context_tokens: 1024,
                },
                ContextStage {
                    min_level: 4,
                    context_tokens: 4096,
                },
                ContextStage {
                    min_level: 7,
                    context_tokens: 16384,
                },
            ],
        }
    }
}

impl CurriculumConfig {
    /// Checks every field, naming the offending one.
    pub fn validate(&self) -> Result<(), TasksError> {
        let bad = |field: &str, value: String, expected: &str| {
            Err(TasksError::InvalidConfig {
                field: format!("curriculum.{field}"),
                value,
                expected: expected.to_string(),
            })
        };
        let unit = |x: f64| (0.0..=1.0).contains(&x);
        if !unit(self.promote_threshold) {
            return bad(
                "promote_threshold",
                self.promote_threshold.to_string(),
                "a rate in [0, 1]",
            );
        }
        if !unit(self.demote_threshold) || self.demote_threshold >= self.promote_threshold {
            return bad(
                "demote_threshold",
                self.demote_threshold.to_string(),
                "a rate in [0, 1] below promote_threshold",
            );
        }
        if self.min_samples == 0 || self.min_samples > self.window {
            return bad(
                "min_samples",
                self.min_samples.to_string(),
                "1 <= min_samples <= window",
            );
        }
        if !(self.frontier_share > 0.0 && self.frontier_share <= 1.0) {
            return bad(
                "frontier_share",
                self.frontier_share.to_string(),
                "a share in (0, 1]",
            );
        }
        if !(self.replay_decay > 0.0 && self.replay_decay <= 1.0) {
            return bad(
                "replay_decay",
                self.replay_decay.to_string(),
                "a ratio in (0, 1]",
            );
        }
        let ascending = self
            .context_stages
            .windows(2)
            .all(|w| w[0].min_level < w[1].min_level);
        if self.context_stages.first().map(|s| s.min_level) != Some(1) || !ascending {
            return bad(
                "context_stages",
                format!(
                    "{:?}",
                    self.context_stages
                        .iter()
                        .map(|s| s.min_level)
                        .collect::<Vec<_>>()
                ),
                "stages with strictly ascending min_level, the first at level 1",
            );
        }
        Ok(())
    }
}

/// The curriculum state of one family.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FamilyProgress {
    /// Highest level the family defines.
    pub max_level: u32,
    /// Current frontier level.
    pub frontier: u32,
    /// Highest frontier ever admitted.
    pub highest_admitted: u32,
    /// Recent results at the frontier (true = success), oldest first.
    pub frontier_window: VecDeque<bool>,
    /// Recent results at `frontier − 1`.
    pub replay_window: VecDeque<bool>,
}

/// What [`Curriculum::record`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LevelChange {
    /// Nothing moved.
    None,
    /// The frontier went up to this level.
    Promoted(u32),
    /// The frontier went down to this level.
    Demoted(u32),
}

/// Per-family frontiers, their windows, and the level sampler's RNG.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Curriculum {
    config: CurriculumConfig,
    families: BTreeMap<String, FamilyProgress>,
    rng: SplitMix64,
}

fn rate(w: &VecDeque<bool>) -> f64 {
    w.iter().filter(|&&b| b).count() as f64 / w.len().max(1) as f64
}

fn push(w: &mut VecDeque<bool>, cap: usize, x: bool) {
    w.push_back(x);
    trim(w, cap);
}

/// Keeps the newest `cap` results.
fn trim(w: &mut VecDeque<bool>, cap: usize) {
    while w.len() > cap {
        w.pop_front();
    }
}

impl Curriculum {
    /// A curriculum over `families` (name, highest level), all starting at level 1.
    pub fn new(
        config: CurriculumConfig,
        families: &[(&str, u32)],
        seed: u64,
    ) -> Result<Self, TasksError> {
        config.validate()?;
        let mut map = BTreeMap::new();
        for &(name, max_level) in families {
            if max_level == 0 {
                return Err(TasksError::InvalidConfig {
                    field: format!("families.{name}.max_level"),
                    value: "0".into(),
                    expected: "at least 1 level".into(),
                });
            }
            map.insert(
                name.to_string(),
                FamilyProgress {
                    max_level,
                    frontier: 1,
                    highest_admitted: 1,
                    frontier_window: VecDeque::new(),
                    replay_window: VecDeque::new(),
                },
            );
        }
        Ok(Self {
            config,
            families: map,
            rng: SplitMix64::derive(seed, "curriculum"),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &CurriculumConfig {
        &self.config
    }

    /// Adopts `config` (a resumed run whose config file changed its `[curriculum]` table):
    /// frontiers, windows and the sampler's RNG stay as they are, windows keep only their
    /// newest `config.window` results. Returns whether anything changed.
    pub fn reconfigure(&mut self, config: CurriculumConfig) -> Result<bool, TasksError> {
        config.validate()?;
        if config == self.config {
            return Ok(false);
        }
        for p in self.families.values_mut() {
            trim(&mut p.frontier_window, config.window);
            trim(&mut p.replay_window, config.window);
        }
        self.config = config;
        Ok(true)
    }

    /// The progress of `family`.
    pub fn progress(&self, family: &str) -> Result<&FamilyProgress, TasksError> {
        self.families
            .get(family)
            .ok_or_else(|| self.unknown(family))
    }

    /// The frontier level of `family`.
    pub fn frontier(&self, family: &str) -> Result<u32, TasksError> {
        Ok(self.progress(family)?.frontier)
    }

    fn unknown(&self, family: &str) -> TasksError {
        TasksError::UnknownFamily {
            name: family.to_string(),
            known: self.families.keys().cloned().collect::<Vec<_>>().join(", "),
        }
    }

    /// Records one scored episode of `family` at `level` (rules 1 and 2 of the module doc).
    /// Results of infra-failed episodes must not be recorded.
    pub fn record(
        &mut self,
        family: &str,
        level: u32,
        success: bool,
    ) -> Result<LevelChange, TasksError> {
        let cfg = self.config.clone();
        let unknown = self.unknown(family);
        let p = self.families.get_mut(family).ok_or(unknown)?;
        if level == p.frontier {
            push(&mut p.frontier_window, cfg.window, success);
            if p.frontier_window.len() >= cfg.min_samples
                && rate(&p.frontier_window) >= cfg.promote_threshold
                && p.frontier < p.max_level
            {
                p.frontier += 1;
                p.highest_admitted = p.highest_admitted.max(p.frontier);
                p.frontier_window.clear();
                p.replay_window.clear();
                return Ok(LevelChange::Promoted(p.frontier));
            }
        } else if level + 1 == p.frontier {
            push(&mut p.replay_window, cfg.window, success);
            if p.replay_window.len() >= cfg.min_samples
                && rate(&p.replay_window) <= cfg.demote_threshold
            {
                p.frontier -= 1;
                p.frontier_window.clear();
                p.replay_window.clear();
                return Ok(LevelChange::Demoted(p.frontier));
            }
        }
        Ok(LevelChange::None)
    }

    /// Sampling weights `(level, weight)` over levels `1..=frontier`, summing to 1
    /// (rule 3): `w_f = s`, `w_l = (1 − s) · d^(f−1−l) / Σ_{m<f} d^(f−1−m)` for `l < f`;
    /// with `f = 1` all mass is on level 1.
    pub fn weights(&self, family: &str) -> Result<Vec<(u32, f64)>, TasksError> {
        let f = self.frontier(family)?;
        if f == 1 {
            return Ok(vec![(1, 1.0)]);
        }
        let s = self.config.frontier_share;
        let d = self.config.replay_decay;
        let raw: Vec<f64> = (1..f).map(|l| d.powi((f - 1 - l) as i32)).collect();
        let z: f64 = raw.iter().sum();
        let mut out: Vec<(u32, f64)> = (1..f)
            .zip(raw)
            .map(|(l, r)| (l, (1.0 - s) * r / z))
            .collect();
        out.push((f, s));
        Ok(out)
    }

    /// Picks a level for `family` from [`Curriculum::weights`] given a uniform `u` in
    /// `[0, 1)` drawn by the caller's own RNG.
    pub fn level_for(&self, family: &str, u: f64) -> Result<u32, TasksError> {
        let w = self.weights(family)?;
        let mut acc = 0.0;
        for &(l, p) in &w {
            acc += p;
            if u < acc {
                return Ok(l);
            }
        }
        Ok(w.last().map(|x| x.0).unwrap_or(1))
    }

    /// Picks a level for `family` with the curriculum's own (saved) RNG.
    pub fn sample_level(&mut self, family: &str) -> Result<u32, TasksError> {
        let u = self.rng.next_f64();
        self.level_for(family, u)
    }

    /// The highest level any family has ever admitted.
    pub fn highest_admitted(&self) -> u32 {
        self.families
            .values()
            .map(|p| p.highest_admitted)
            .max()
            .unwrap_or(1)
    }

    /// The context window of the current stage (rule 4).
    pub fn context_tokens(&self) -> u32 {
        let h = self.highest_admitted();
        self.config
            .context_stages
            .iter()
            .filter(|s| s.min_level <= h)
            .map(|s| s.context_tokens)
            .next_back()
            .unwrap_or(0)
    }

    /// Serialises the whole state (config, windows, RNG) as JSON.
    pub fn save(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Restores a state written by [`Curriculum::save`], validating its config.
    pub fn load(json: &str) -> Result<Self, TasksError> {
        let c: Self = serde_json::from_str(json).map_err(|e| TasksError::State(e.to_string()))?;
        c.config.validate()?;
        for (name, p) in &c.families {
            if p.frontier == 0 || p.frontier > p.max_level {
                return Err(TasksError::State(format!(
                    "family {name}: frontier {} outside 1..={}",
                    p.frontier, p.max_level
                )));
            }
        }
        Ok(c)
    }
}
