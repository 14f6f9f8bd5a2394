//! `NextTasks`: the task dispenser that turns the curriculum into groups of assignments.
//!
//! # Rules
//!
//! 1. **Groups.** A group is one task instance handed out G times (`rl.group_size`)
//!    under one `group_id`, across calls and across actors; GRPO-style baselines are taken
//!    within it. Each of the G episodes gets its own sampler seed.
//! 2. **Order.** A call first finishes handing out the oldest open group, then opens new
//!    groups: family uniformly at random, level from the curriculum's sampler
//!    ([`Curriculum::sample_level`]), instance seed from the dispenser's RNG.
//! 3. **Back-pressure.** At most `rollout.max_open_groups` groups are open (handed out, not
//!    yet completed). When every open group is fully handed out and no new one may open,
//!    the answer is empty: the actor waits and asks again. Nothing is queued unboundedly.
//! 4. **Completion.** A group completes when G of its trajectories are stored (the submit
//!    path calls [`TaskDispenser::complete`]). A group whose last hand-out is older than
//!    `rollout.group_timeout_s` and is still incomplete *expires*: its slot is freed and it
//!    is counted, so a crashed actor cannot starve the run.
//!    Before the first policy version is published (while SFT runs) the service answers
//!    `NextTasks` with nothing at all, so no group opens that no actor could start.
//! 5. **Budget (synchronous mode).** With a budget set, only that many new groups may
//!    open until [`TaskDispenser::allow_groups`] grants more; the learner grants one batch
//!    per policy version. Without a budget (asynchronous mode) only rule 3 bounds it.
//!
//! The whole state — RNG, group counter, open groups, budget, counters — is serialisable
//! ([`DispenserState`]) and goes into every run checkpoint.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corvid_proto::{SamplingParams, TaskRef};
use corvid_tasks::{Curriculum, SplitMix64, TaskFamily, TaskInstance, TasksError};
use serde::{Deserialize, Serialize};

use crate::config::{LearnerConfig, SamplingSection};

/// Most assignments one `NextTasks` call returns.
pub const MAX_TASKS_PER_CALL: u32 = 256;

/// One episode to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    /// The task instance.
    pub task: TaskRef,
    /// The group it belongs to.
    pub group_id: String,
    /// G.
    pub group_size: u32,
    /// Most turns.
    pub max_turns: u32,
    /// Context budget, tokens.
    pub context_budget: u32,
    /// Sampling, with this episode's own seed.
    pub sampling: SamplingParams,
}

impl From<Assignment> for corvid_proto::pb::TaskAssignment {
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

/// The dispenser's settings, taken from the learner config.
#[derive(Debug, Clone)]
pub struct DispenserConfig {
    /// Episodes per group, G.
    pub group_size: u32,
    /// Most open groups (rule 3).
    pub max_open_groups: usize,
    /// Expiry of an incomplete group (rule 4).
    pub group_timeout: Duration,
    /// Sampling handed to actors (the seed is set per episode).
    pub sampling: SamplingSection,
    /// Upper bound on any context budget handed out (the model's position limit).
    pub max_context: u32,
}

impl DispenserConfig {
    /// The dispenser settings of `cfg`, with `max_context` from the model.
    pub fn from_learner(cfg: &LearnerConfig, max_context: u32) -> Self {
        Self {
            group_size: u32::try_from(cfg.rl.group_size).unwrap_or(u32::MAX),
            max_open_groups: cfg.rollout.max_open_groups,
            group_timeout: Duration::from_secs(cfg.rollout.group_timeout_s),
            sampling: cfg.rollout.sampling,
            max_context,
        }
    }
}

/// One open group, as saved in a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedGroup {
    /// Group id.
    pub group_id: String,
    /// Its task instance.
    pub task: TaskRef,
    /// Most turns of the instance.
    pub max_turns: u32,
    /// Context budget handed out.
    pub context_budget: u32,
    /// Base of the episodes' sampler seeds.
    pub seed: u64,
    /// Episodes handed out.
    pub issued: u32,
    /// Trajectories stored.
    pub completed: u32,
}

/// Running totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DispenserCounters {
    /// Groups opened.
    pub groups_opened: u64,
    /// Groups that received all G trajectories.
    pub groups_completed: u64,
    /// Groups given up after the timeout (rule 4).
    pub groups_expired: u64,
    /// Episodes handed out.
    pub episodes_issued: u64,
    /// Calls answered with nothing because of back-pressure.
    pub empty_answers: u64,
    /// Instances a task pack refused for the values one seed drew (two paths rendered to
    /// one, past what validation tries); another seed was drawn instead.
    #[serde(default)]
    pub instances_refused: u64,
}

/// The serialisable state of the dispenser.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DispenserState {
    /// RNG of family choice, instance seeds and sampler seeds.
    pub rng: SplitMix64,
    /// Number of the next group.
    pub next_group: u64,
    /// Open groups, oldest first.
    pub open: Vec<SavedGroup>,
    /// New groups still allowed (synchronous mode); `None` = unbounded.
    pub budget: Option<u64>,
    /// Totals.
    pub counters: DispenserCounters,
}

impl DispenserState {
    /// A fresh state seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            rng: SplitMix64::derive(seed, "dispenser"),
            next_group: 0,
            open: Vec::new(),
            budget: None,
            counters: DispenserCounters::default(),
        }
    }
}

#[derive(Debug)]
struct OpenGroup {
    saved: SavedGroup,
    last_issued: Instant,
}

#[derive(Debug)]
struct Inner {
    rng: SplitMix64,
    next_group: u64,
    open: VecDeque<OpenGroup>,
    budget: Option<u64>,
    counters: DispenserCounters,
}

/// Seeds a pack may refuse in a row before opening a group fails: a pack whose instances
/// are refused this often is broken for the level, not unlucky.
pub const MAX_REFUSED_DRAWS: u32 = 16;

/// A failure to open a group.
#[derive(Debug, thiserror::Error)]
pub enum DispenseError {
    /// The curriculum or a family refused.
    #[error("cannot draw a task: {0}")]
    Tasks(#[from] TasksError),
}

/// Hands out groups of task assignments (see the module doc for the rules).
pub struct TaskDispenser {
    cfg: DispenserConfig,
    families: Vec<Box<dyn TaskFamily>>,
    curriculum: Arc<Mutex<Curriculum>>,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for TaskDispenser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskDispenser")
            .field("cfg", &self.cfg)
            .field(
                "families",
                &self.families.iter().map(|f| f.name()).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// SplitMix64 finaliser: spreads (group seed, episode index) into a sampler seed.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl TaskDispenser {
    /// A dispenser over `families` (each must be known to `curriculum`), restoring `state`.
    pub fn new(
        cfg: DispenserConfig,
        families: Vec<Box<dyn TaskFamily>>,
        curriculum: Arc<Mutex<Curriculum>>,
        state: DispenserState,
    ) -> Result<Self, DispenseError> {
        {
            let c = curriculum.lock().unwrap_or_else(|p| p.into_inner());
            for f in &families {
                c.progress(f.name())?;
            }
        }
        let now = Instant::now();
        Ok(Self {
            cfg,
            families,
            curriculum,
            inner: Mutex::new(Inner {
                rng: state.rng,
                next_group: state.next_group,
                open: state
                    .open
                    .into_iter()
                    .map(|saved| OpenGroup {
                        saved,
                        last_issued: now,
                    })
                    .collect(),
                budget: state.budget,
                counters: state.counters,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The curriculum this dispenser draws from.
    pub fn curriculum(&self) -> &Arc<Mutex<Curriculum>> {
        &self.curriculum
    }

    /// The settings.
    pub fn config(&self) -> &DispenserConfig {
        &self.cfg
    }

    /// Up to `max` assignments (rules 1–5); empty under back-pressure.
    pub fn next(&self, max: u32) -> Result<Vec<Assignment>, DispenseError> {
        let max = max.min(MAX_TASKS_PER_CALL) as usize;
        let g = self.cfg.group_size;
        let mut inner = self.lock();
        self.expire(&mut inner);
        let mut out = Vec::with_capacity(max);
        while out.len() < max {
            let idx = match inner.open.iter().position(|o| o.saved.issued < g) {
                Some(i) => i,
                None => {
                    let may_open = inner.open.len() < self.cfg.max_open_groups
                        && inner.budget.is_none_or(|b| b > 0);
                    if !may_open {
                        break;
                    }
                    let group = self.open_group(&mut inner)?;
                    inner.open.push_back(group);
                    inner.open.len() - 1
                }
            };
            let now = Instant::now();
            let open = &mut inner.open[idx];
            let s = &mut open.saved;
            let episode = s.issued;
            s.issued += 1;
            open.last_issued = now;
            out.push(Assignment {
                task: s.task.clone(),
                group_id: s.group_id.clone(),
                group_size: g,
                max_turns: s.max_turns,
                context_budget: s.context_budget,
                sampling: SamplingParams {
                    temperature: self.cfg.sampling.temperature,
                    top_p: self.cfg.sampling.top_p,
                    max_new_tokens: self.cfg.sampling.max_new_tokens,
                    seed: mix(s.seed ^ u64::from(episode)),
                },
            });
        }
        inner.counters.episodes_issued += out.len() as u64;
        if out.is_empty() && max > 0 {
            inner.counters.empty_answers += 1;
        }
        Ok(out)
    }

    /// Draws a family, a level and a seed and opens a group for that instance.
    fn open_group(&self, inner: &mut Inner) -> Result<OpenGroup, DispenseError> {
        let family = &self.families[inner.rng.below(self.families.len() as u64) as usize];
        let level = {
            let mut c = self.curriculum.lock().unwrap_or_else(|p| p.into_inner());
            c.sample_level(family.name())?
        };
        let instance = Self::draw_instance(family.as_ref(), level, inner)?;
        let group_id = format!("g{:08}", inner.next_group);
        inner.next_group += 1;
        inner.counters.groups_opened += 1;
        if let Some(b) = inner.budget.as_mut() {
            *b -= 1;
        }
        tracing::debug!(group = %group_id, task = %instance.id, "group opened");
        Ok(OpenGroup {
            saved: SavedGroup {
                group_id,
                task: instance.task_ref(),
                max_turns: instance.max_turns,
                context_budget: instance.context_budget.min(self.cfg.max_context),
                seed: inner.rng.next_u64(),
                issued: 0,
                completed: 0,
            },
            last_issued: Instant::now(),
        })
    }

    /// The instance of a fresh seed at `level`. A task pack can refuse the values one seed
    /// draws ([`TasksError::PackInstance`]: validation renders up to 4,096 combinations, not
    /// every one); that seed is skipped, counted and logged, and another drawn, up to
    /// [`MAX_REFUSED_DRAWS`] in a row. Any other error is returned at once.
    fn draw_instance(
        family: &dyn TaskFamily,
        level: u32,
        inner: &mut Inner,
    ) -> Result<TaskInstance, DispenseError> {
        let mut refused = 0;
        loop {
            let seed = inner.rng.next_u64();
            match family.instance(level, seed) {
                Err(e @ TasksError::PackInstance { .. }) => {
                    inner.counters.instances_refused += 1;
                    refused += 1;
                    tracing::warn!(error = %e, "task pack refused an instance; drawing another seed");
                    if refused == MAX_REFUSED_DRAWS {
                        return Err(e.into());
                    }
                }
                other => return Ok(other?),
            }
        }
    }

    /// Rule 4: drop incomplete groups idle for longer than the timeout.
    fn expire(&self, inner: &mut Inner) {
        let timeout = self.cfg.group_timeout;
        let before = inner.open.len();
        inner.open.retain(|o| {
            let keep = o.last_issued.elapsed() < timeout;
            if !keep {
                tracing::warn!(
                    group = %o.saved.group_id,
                    issued = o.saved.issued,
                    completed = o.saved.completed,
                    "group expired before all its trajectories arrived"
                );
            }
            keep
        });
        inner.counters.groups_expired += (before - inner.open.len()) as u64;
    }

    /// Records one stored trajectory of `group_id`; the group closes at G. Unknown ids
    /// (an expired group, or one from before a restart without checkpoint) are ignored.
    pub fn complete(&self, group_id: &str) {
        let g = self.cfg.group_size;
        let mut inner = self.lock();
        if let Some(i) = inner.open.iter().position(|o| o.saved.group_id == group_id) {
            let o = &mut inner.open[i];
            o.saved.completed += 1;
            if o.saved.completed >= g {
                inner.open.remove(i);
                inner.counters.groups_completed += 1;
            }
        } else {
            tracing::debug!(group = %group_id, "trajectory for a group that is not open");
        }
    }

    /// Rule 5: sets the budget of new groups (`None` = unbounded, asynchronous mode).
    pub fn set_budget(&self, budget: Option<u64>) {
        self.lock().budget = budget;
    }

    /// Rule 5: allows `n` more new groups.
    pub fn allow_groups(&self, n: u64) {
        let mut inner = self.lock();
        inner.budget = Some(inner.budget.unwrap_or(0) + n);
    }

    /// Whether `group_id` is open (handed out, not completed, not expired).
    pub fn is_open(&self, group_id: &str) -> bool {
        self.lock()
            .open
            .iter()
            .any(|o| o.saved.group_id == group_id)
    }

    /// Open groups right now.
    pub fn open_groups(&self) -> usize {
        self.lock().open.len()
    }

    /// Totals so far.
    pub fn counters(&self) -> DispenserCounters {
        self.lock().counters
    }

    /// The serialisable state (for checkpoints).
    pub fn state(&self) -> DispenserState {
        let inner = self.lock();
        DispenserState {
            rng: inner.rng.clone(),
            next_group: inner.next_group,
            open: inner.open.iter().map(|o| o.saved.clone()).collect(),
            budget: inner.budget,
            counters: inner.counters,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corvid_tasks::CurriculumConfig;

    fn dispenser(g: u32, max_open: usize, timeout: Duration) -> TaskDispenser {
        dispenser_of(
            g,
            max_open,
            timeout,
            corvid_tasks::builtin_family("hops").unwrap(),
        )
    }

    fn dispenser_of(
        g: u32,
        max_open: usize,
        timeout: Duration,
        family: Box<dyn TaskFamily>,
    ) -> TaskDispenser {
        let c = Curriculum::new(CurriculumConfig::default(), &[("hops", 3)], 1).unwrap();
        TaskDispenser::new(
            DispenserConfig {
                group_size: g,
                max_open_groups: max_open,
                group_timeout: timeout,
                sampling: SamplingSection::default(),
                max_context: 4096,
            },
            vec![family],
            Arc::new(Mutex::new(c)),
            DispenserState::new(7),
        )
        .unwrap()
    }

    #[test]
    fn a_group_is_handed_out_g_times_across_calls_with_distinct_seeds() {
        let d = dispenser(4, 8, Duration::from_secs(60));
        let mut all = d.next(3).unwrap();
        all.extend(d.next(3).unwrap());
        assert_eq!(all.len(), 6);
        let first: Vec<_> = all
            .iter()
            .filter(|a| a.group_id == all[0].group_id)
            .collect();
        assert_eq!(first.len(), 4);
        assert!(first
            .iter()
            .all(|a| a.task == first[0].task && a.group_size == 4));
        let mut seeds: Vec<u64> = first.iter().map(|a| a.sampling.seed).collect();
        seeds.dedup();
        assert_eq!(seeds.len(), 4);
        assert_ne!(all[4].group_id, all[0].group_id);
    }

    /// `hops`, as a task pack that refuses the values of the seeds `refuse` picks would.
    struct Refusing(fn(u64) -> bool);

    impl TaskFamily for Refusing {
        fn name(&self) -> &str {
            "hops"
        }
        fn description(&self) -> &str {
            "hops, refusing some seeds"
        }
        fn levels(&self) -> u32 {
            corvid_tasks::Hops.levels()
        }
        fn instance(&self, level: u32, seed: u64) -> Result<TaskInstance, TasksError> {
            if (self.0)(seed) {
                return Err(TasksError::PackInstance {
                    file: "packs/p.toml".into(),
                    instance: format!("hops/L{level}/s{seed}"),
                    vars: "a = \"s\", b = \"s\"".into(),
                    message: "[files] paths \"x{a}\" and \"x{b}\" both render to \"xs\"".into(),
                });
            }
            corvid_tasks::Hops.instance(level, seed)
        }
    }

    #[test]
    fn a_seed_a_pack_refuses_is_counted_and_another_drawn() {
        let d = dispenser_of(
            1,
            64,
            Duration::from_secs(60),
            Box::new(Refusing(|s| s % 3 != 0)),
        );
        let got = d.next(40).unwrap();
        assert_eq!(
            got.len(),
            40,
            "every group opened on a seed the pack accepts"
        );
        assert!(got.iter().all(|a| a.task.seed % 3 == 0));
        // Two in three seeds are refused: about 80 refusals for 40 groups.
        let refused = d.counters().instances_refused;
        assert!((40..=160).contains(&refused), "{refused}");
        assert_eq!(d.counters().groups_opened, 40);
    }

    #[test]
    fn a_pack_that_refuses_every_seed_fails_after_a_bounded_number_of_draws() {
        let d = dispenser_of(1, 64, Duration::from_secs(60), Box::new(Refusing(|_| true)));
        let e = d.next(1).unwrap_err().to_string();
        assert!(
            e.starts_with("cannot draw a task: task pack packs/p.toml: instance hops/L1/s"),
            "{e}"
        );
        assert_eq!(d.counters().instances_refused, u64::from(MAX_REFUSED_DRAWS));
        assert_eq!(d.counters().groups_opened, 0);
    }

    #[test]
    fn open_groups_are_bounded_and_completion_frees_a_slot() {
        let d = dispenser(2, 2, Duration::from_secs(60));
        let got = d.next(10).unwrap();
        assert_eq!(got.len(), 4, "two groups of two, then back-pressure");
        assert!(d.next(1).unwrap().is_empty());
        assert_eq!(d.counters().empty_answers, 1);
        d.complete(&got[0].group_id);
        assert!(
            d.next(1).unwrap().is_empty(),
            "one of two is not a completed group"
        );
        d.complete(&got[0].group_id);
        assert_eq!(d.next(10).unwrap().len(), 2);
        assert_eq!(d.counters().groups_completed, 1);
    }

    #[test]
    fn an_idle_incomplete_group_expires() {
        let d = dispenser(2, 1, Duration::from_millis(20));
        assert_eq!(d.next(5).unwrap().len(), 2);
        assert!(d.next(1).unwrap().is_empty());
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(d.next(1).unwrap().len(), 1);
        assert_eq!(d.counters().groups_expired, 1);
    }

    #[test]
    fn the_budget_bounds_new_groups() {
        let d = dispenser(2, 8, Duration::from_secs(60));
        d.set_budget(Some(1));
        assert_eq!(d.next(10).unwrap().len(), 2);
        d.allow_groups(2);
        assert_eq!(d.next(10).unwrap().len(), 4);
        assert!(d.next(10).unwrap().is_empty());
    }

    #[test]
    fn a_restored_state_continues_the_same_sequence() {
        let a = dispenser(3, 8, Duration::from_secs(60));
        a.next(4).unwrap();
        let saved = a.state();
        let b = dispenser(3, 8, Duration::from_secs(60));
        // Same curriculum RNG position: rebuild b's curriculum from a's.
        let curr = a.curriculum().lock().unwrap().clone();
        *b.curriculum().lock().unwrap() = curr;
        let b = TaskDispenser::new(
            b.config().clone(),
            vec![corvid_tasks::builtin_family("hops").unwrap()],
            Arc::clone(b.curriculum()),
            saved,
        )
        .unwrap();
        assert_eq!(a.next(7).unwrap(), b.next(7).unwrap());
    }
}
