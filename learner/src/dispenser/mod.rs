//! The task dispenser: turns the curriculum into the groups of assignments that `NextTasks`
//! ([`crate::server`]) hands out to actors.
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
//!    yet completed), and open groups plus completed groups *waiting* for the trainer are at
//!    most `max(max_open_groups, rl.groups_per_update)`: when the trainer falls behind,
//!    actors stop starting episodes that would be stale by the time they were trained on.
//!    Each completion adds one waiting group; the trainer sets the exact count each time it
//!    reads the store or takes groups ([`TaskDispenser::set_waiting`]), so groups completed
//!    during a long update count at once. When every open group is fully handed out and no
//!    new one may open, the answer is empty: the actor waits and asks again. Nothing is
//!    queued unboundedly.
//! 4. **Completion.** Episode `i` of a group always runs with the sampler seed derived from
//!    the group's seed and `i`, whoever runs it. A group completes when each of its G
//!    episodes has a stored trajectory (the submit path calls [`TaskDispenser::complete`]
//!    with the trajectory's sampler seed); a second trajectory of the same episode (rule 6)
//!    is stored but not counted again (nor trained on: the collector's rule 4). A group
//!    whose last hand-out is older than `rollout.group_timeout_s` and is still incomplete
//!    *expires*: its slot is freed and it is counted. This is the backstop for episodes
//!    whose holder keeps calling but never delivers them.
//!    Before the first policy version is published (while SFT runs) the service answers
//!    `NextTasks` with nothing at all, so no group opens that no actor could start.
//! 5. **Budget (synchronous mode).** With a budget set, only that many new groups may
//!    open until [`TaskDispenser::allow_groups`] grants more; the learner grants one batch
//!    per policy version. Without a budget (asynchronous mode) only rule 3 bounds it.
//! 6. **Silent actors.** Every call that carries an actor id (`NextTasks`, `PolicyInfo`,
//!    a submitted trajectory's header) is a sign of life ([`TaskDispenser::heard_from`]).
//!    The episodes an actor holds are taken back once it has been silent for
//!    `rollout.actor_timeout_s` and go to the next actor that asks, first among the
//!    episodes of their group: a crashed or killed actor costs its episodes' rollout time,
//!    not the groups they belong to. Actors poll `PolicyInfo` every
//!    `rollout.policy_poll_interval_ms`, so a busy actor is never silent for long.
//!
//! 7. **Ids once.** A group id is never handed out twice, also when the learner is killed
//!    between two checkpoints and resumed: ids are reserved on disk ahead of use, and a
//!    resumed dispenser starts past the reservation with fresh draws
//!    ([`group_ids`]).
//!
//! The whole state — RNG, group counter, open groups, budget, counters — is serialisable
//! ([`DispenserState`], in `state.rs`) and goes into every run checkpoint.

pub mod group_ids;
mod state;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use corvid_proto::Assignment;
use corvid_proto::{ContextFold, Fold, SamplingParams};
use corvid_tasks::{Curriculum, SplitMix64, TaskFamily, TaskInstance, TasksError};

use crate::config::{LearnerConfig, SamplingSection};
use group_ids::{GroupIds, GroupIdsError};

pub use state::{DispenserCounters, DispenserState, EpisodeSlot, SavedGroup};

/// Most assignments one `NextTasks` call returns.
pub const MAX_TASKS_PER_CALL: u32 = 256;

/// The dispenser's settings, taken from the learner config.
#[derive(Debug, Clone)]
pub struct DispenserConfig {
    /// Episodes per group, G.
    pub group_size: u32,
    /// Most open groups (rule 3).
    pub max_open_groups: usize,
    /// Groups per trainer update: open plus waiting groups may always reach it (rule 3).
    pub groups_per_update: usize,
    /// Expiry of an incomplete group (rule 4).
    pub group_timeout: Duration,
    /// Silence after which an actor's episodes are handed out again (rule 6).
    pub actor_timeout: Duration,
    /// Sampling handed to actors (the seed is set per episode).
    pub sampling: SamplingSection,
    /// Upper bound on any window handed out (the model's position limit).
    pub max_context: u32,
    /// The window and fold each assignment carries (`[rollout.context]`).
    pub context: Option<ContextFold>,
    /// Each group's window is the curriculum's context stage, at most `context`'s
    /// (`[rollout.context] follow_curriculum`).
    pub window_follows_curriculum: bool,
}

impl DispenserConfig {
    /// The dispenser settings of `cfg`, with `max_context` from the model.
    pub fn from_learner(cfg: &LearnerConfig, max_context: u32) -> Self {
        Self {
            group_size: u32::try_from(cfg.rl.group_size).unwrap_or(u32::MAX),
            max_open_groups: cfg.rollout.max_open_groups,
            groups_per_update: cfg.rl.groups_per_update,
            group_timeout: Duration::from_secs(cfg.rollout.group_timeout_s),
            actor_timeout: Duration::from_secs(cfg.rollout.actor_timeout_s),
            sampling: cfg.rollout.sampling,
            max_context,
            context: cfg.rollout.context.assignment(),
            window_follows_curriculum: cfg.rollout.context.follow_curriculum,
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
    /// When each actor that holds or held episodes was last heard from (rule 6).
    heard: HashMap<String, Instant>,
    /// Completed groups waiting for the trainer (rule 3).
    waiting: usize,
    /// Group ids reserved ahead of use (rule 7).
    ids: GroupIds,
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
    /// The group-id reservation could not be written (rule 7).
    #[error("cannot reserve group ids: {0}")]
    GroupIds(#[from] GroupIdsError),
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

/// The sampler seed of episode `i` of a group seeded `group_seed`.
fn episode_seed(group_seed: u64, i: usize) -> u64 {
    mix(group_seed ^ i as u64)
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
        let open: VecDeque<OpenGroup> = state
            .open
            .into_iter()
            .map(|saved| OpenGroup {
                saved: saved.with_group_size(cfg.group_size),
                last_issued: now,
            })
            .collect();
        // The holders of restored episodes get the full timeout to call again.
        let heard = open
            .iter()
            .flat_map(|o| &o.saved.slots)
            .filter_map(|s| match s {
                EpisodeSlot::Held(a) => Some((a.clone(), now)),
                _ => None,
            })
            .collect();
        Ok(Self {
            cfg,
            families,
            curriculum,
            inner: Mutex::new(Inner {
                rng: state.rng,
                next_group: state.next_group,
                open,
                budget: state.budget,
                counters: state.counters,
                heard,
                waiting: 0,
                ids: GroupIds::in_memory(),
            }),
        })
    }

    /// Keeps the group-id reservation (rule 7) in `ids` (the run folder's) instead of in
    /// memory. The restored state must already be past it ([`group_ids::resume_past`]).
    pub fn with_group_ids(self, ids: GroupIds) -> Self {
        self.lock().ids = ids;
        self
    }

    /// Trims the group-id reservation to the group counter (rule 7), after a checkpoint has
    /// saved it: a run stopped cleanly then resumes exactly at its counter. A failure only
    /// leaves the reservation longer, so it is logged, not returned.
    pub fn trim_group_ids(&self) {
        let mut inner = self.lock();
        let next = inner.next_group;
        if let Err(e) = inner.ids.trim(next) {
            tracing::warn!(error = %e, "group-id reservation not trimmed; a resume will skip some ids");
        }
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

    /// Up to `max` assignments for the actor `actor` (rules 1–6); empty under back-pressure.
    pub fn next(&self, actor: &str, max: u32) -> Result<Vec<Assignment>, DispenseError> {
        let max = max.min(MAX_TASKS_PER_CALL) as usize;
        let g = self.cfg.group_size;
        let mut inner = self.lock();
        inner.heard.insert(actor.to_owned(), Instant::now());
        self.reclaim(&mut inner);
        self.expire(&mut inner);
        // Rule 3: open plus waiting groups may always make up one update.
        let out_or_waiting = self.cfg.max_open_groups.max(self.cfg.groups_per_update);
        let mut out = Vec::with_capacity(max);
        while out.len() < max {
            let found = inner
                .open
                .iter()
                .enumerate()
                .find_map(|(i, o)| Some((i, o.saved.free_slot()?)));
            let (idx, episode) = match found {
                Some(found) => found,
                None => {
                    let may_open = inner.open.len() < self.cfg.max_open_groups
                        && inner.open.len() + inner.waiting < out_or_waiting
                        && inner.budget.is_none_or(|b| b > 0);
                    if !may_open {
                        break;
                    }
                    let group = self.open_group(&mut inner)?;
                    inner.open.push_back(group);
                    (inner.open.len() - 1, 0)
                }
            };
            let open = &mut inner.open[idx];
            let s = &mut open.saved;
            s.slots[episode] = EpisodeSlot::Held(actor.to_owned());
            open.last_issued = Instant::now();
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
                    seed: episode_seed(s.seed, episode),
                },
                context: self.cfg.context.clone().map(|c| ContextFold {
                    window_tokens: match s.window_tokens {
                        0 => c.window_tokens.min(self.cfg.max_context),
                        w => w,
                    },
                    ..c
                }),
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
        let (level, stage_tokens) = {
            let mut c = self.curriculum.lock().unwrap_or_else(|p| p.into_inner());
            (c.sample_level(family.name())?, c.context_tokens())
        };
        let instance = Self::draw_instance(family.as_ref(), level, inner)?;
        let next = inner.next_group;
        inner.ids.cover(next)?;
        let group_id = format!("g{next:08}");
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
                // A folding episode's budget spans its segments: only its window is capped.
                context_budget: match &self.cfg.context {
                    Some(c) if c.fold != Fold::None => instance.context_budget,
                    _ => instance.context_budget.min(self.cfg.max_context),
                },
                // The group's window, fixed when it opens so that every member runs in it: the
                // configured one, or the curriculum's context stage when the run follows it.
                window_tokens: match &self.cfg.context {
                    Some(c) => {
                        let w = if self.cfg.window_follows_curriculum && stage_tokens > 0 {
                            c.window_tokens.min(stage_tokens)
                        } else {
                            c.window_tokens
                        };
                        w.min(self.cfg.max_context)
                    }
                    None => 0,
                },
                seed: inner.rng.next_u64(),
                slots: vec![EpisodeSlot::Free; self.cfg.group_size as usize],
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

    /// Rule 6: notes a sign of life from `actor`.
    pub fn heard_from(&self, actor: &str) {
        if !actor.is_empty() {
            self.lock().heard.insert(actor.to_owned(), Instant::now());
        }
    }

    /// Rule 6: frees the episodes of actors silent for longer than the actor timeout.
    fn reclaim(&self, inner: &mut Inner) {
        let timeout = self.cfg.actor_timeout;
        let silent: Vec<(String, Duration)> = inner
            .heard
            .iter()
            .map(|(a, t)| (a.clone(), t.elapsed()))
            .filter(|(_, silent)| *silent >= timeout)
            .collect();
        for (actor, silent) in silent {
            inner.heard.remove(&actor);
            let mut taken = 0u64;
            for slot in inner.open.iter_mut().flat_map(|o| o.saved.slots.iter_mut()) {
                if matches!(slot, EpisodeSlot::Held(a) if *a == actor) {
                    *slot = EpisodeSlot::Free;
                    taken += 1;
                }
            }
            if taken > 0 {
                inner.counters.episodes_reclaimed += taken;
                tracing::warn!(
                    actor = actor.as_str(),
                    episodes = taken,
                    silent_s = silent.as_secs(),
                    "actor went silent; its episodes are handed out again"
                );
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
                    stored = o.saved.stored(),
                    "group expired before all its trajectories arrived"
                );
            }
            keep
        });
        inner.counters.groups_expired += (before - inner.open.len()) as u64;
    }

    /// Records a stored trajectory of `group_id` that `actor` ran with `sampler_seed`
    /// (rule 4); the group closes when every episode has one. The episode is the one of that
    /// seed; an actor that does not echo its assigned seed completes one of the episodes it
    /// holds. A second trajectory of an episode (its first holder was taken for gone and
    /// was not) and unknown group ids (an expired group, or one from before a restart
    /// without checkpoint) change nothing.
    pub fn complete(&self, group_id: &str, actor: &str, sampler_seed: u64) {
        let mut inner = self.lock();
        let Some(gi) = inner.open.iter().position(|o| o.saved.group_id == group_id) else {
            tracing::debug!(group = %group_id, "trajectory for a group that is not open");
            return;
        };
        let s = &mut inner.open[gi].saved;
        let by_seed = (0..s.slots.len()).find(|&i| episode_seed(s.seed, i) == sampler_seed);
        let held_by = |who: &str| {
            s.slots
                .iter()
                .position(|x| matches!(x, EpisodeSlot::Held(a) if a == who))
        };
        let slot = match by_seed {
            Some(i) => (s.slots[i] != EpisodeSlot::Stored).then_some(i),
            None => held_by(actor),
        };
        let Some(i) = slot else {
            tracing::debug!(
                group = %group_id,
                sampler_seed,
                "trajectory of an episode already stored, or of none of the group's; not counted"
            );
            return;
        };
        s.slots[i] = EpisodeSlot::Stored;
        if s.stored() == s.slots.len() {
            inner.open.remove(gi);
            inner.counters.groups_completed += 1;
            inner.waiting += 1;
        }
    }

    /// Rule 3: the trainer's count of completed groups it has not trained on yet.
    pub fn set_waiting(&self, groups: usize) {
        self.lock().waiting = groups;
    }

    /// Rule 3: completed groups waiting for the trainer, as last set.
    pub fn waiting(&self) -> usize {
        self.lock().waiting
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

    fn config(g: u32, max_open: usize, group_timeout: Duration) -> DispenserConfig {
        DispenserConfig {
            group_size: g,
            max_open_groups: max_open,
            groups_per_update: 1,
            group_timeout,
            actor_timeout: Duration::from_secs(60),
            sampling: SamplingSection::default(),
            max_context: 4096,
            context: None,
            window_follows_curriculum: false,
        }
    }

    fn dispenser(g: u32, max_open: usize, timeout: Duration) -> TaskDispenser {
        dispenser_with(config(g, max_open, timeout), DispenserState::new(7))
    }

    fn dispenser_with(cfg: DispenserConfig, state: DispenserState) -> TaskDispenser {
        dispenser_of(cfg, corvid_tasks::builtin_family("hops").unwrap(), state)
    }

    fn dispenser_of(
        cfg: DispenserConfig,
        family: Box<dyn TaskFamily>,
        state: DispenserState,
    ) -> TaskDispenser {
        let c = Curriculum::new(CurriculumConfig::default(), &[("hops", 3)], 1).unwrap();
        TaskDispenser::new(cfg, vec![family], Arc::new(Mutex::new(c)), state).unwrap()
    }

    /// Actors count as gone after this much silence in the tests of rule 6: long enough
    /// that a loaded machine does not stall a test's two calls in a row past it.
    const SILENCE: Duration = Duration::from_millis(500);

    fn quick_config(g: u32, max_open: usize) -> DispenserConfig {
        let mut cfg = config(g, max_open, Duration::from_secs(60));
        cfg.actor_timeout = SILENCE;
        cfg
    }

    fn quick_to_reclaim(g: u32, max_open: usize) -> TaskDispenser {
        dispenser_with(quick_config(g, max_open), DispenserState::new(7))
    }

    /// With a fold, each group's window is the configured one (at most the model's
    /// positions) or, following the curriculum, its context stage when the group opened; the
    /// budget is the instance's whole, uncapped.
    #[test]
    fn a_folding_run_hands_out_the_window_of_its_stage() {
        let fold = ContextFold {
            window_tokens: 8192,
            fold: Fold::DropToolOutput,
            memory_tokens: 256,
            notes_path: "notes.md".into(),
        };
        for (follow, want) in [(false, 4096), (true, 1024)] {
            let mut cfg = config(2, 4, Duration::from_secs(60));
            cfg.context = Some(fold.clone());
            cfg.window_follows_curriculum = follow;
            let d = dispenser_with(cfg, DispenserState::new(7));
            for a in d.next("a", 4).unwrap() {
                let c = a.context.expect("a window");
                assert_eq!(c.window_tokens, want, "follow {follow}");
                let task = corvid_tasks::builtin_family("hops")
                    .unwrap()
                    .instance(a.task.level, a.task.seed)
                    .unwrap();
                assert_eq!(a.context_budget, task.context_budget);
            }
        }
    }

    #[test]
    fn a_group_is_handed_out_g_times_across_calls_with_distinct_seeds() {
        let d = dispenser(4, 8, Duration::from_secs(60));
        let mut all = d.next("a", 3).unwrap();
        all.extend(d.next("a", 3).unwrap());
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
            config(1, 64, Duration::from_secs(60)),
            Box::new(Refusing(|s| s % 3 != 0)),
            DispenserState::new(7),
        );
        let got = d.next("a", 40).unwrap();
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
        let d = dispenser_of(
            config(1, 64, Duration::from_secs(60)),
            Box::new(Refusing(|_| true)),
            DispenserState::new(7),
        );
        let e = d.next("a", 1).unwrap_err().to_string();
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
        let got = d.next("a", 10).unwrap();
        assert_eq!(got.len(), 4, "two groups of two, then back-pressure");
        assert!(d.next("a", 1).unwrap().is_empty());
        assert_eq!(d.counters().empty_answers, 1);
        d.complete(&got[0].group_id, "a", got[0].sampling.seed);
        assert!(
            d.next("a", 1).unwrap().is_empty(),
            "one of two is not a completed group"
        );
        d.complete(&got[1].group_id, "a", got[1].sampling.seed);
        assert!(
            d.next("a", 1).unwrap().is_empty(),
            "completed, it waits for the trainer (rule 3)"
        );
        d.set_waiting(0);
        assert_eq!(d.next("a", 10).unwrap().len(), 2, "taken: its slot is free");
        assert_eq!(d.counters().groups_completed, 1);
    }

    #[test]
    fn completed_groups_waiting_for_the_trainer_hold_new_groups_back() {
        let mut cfg = config(2, 3, Duration::from_secs(60));
        cfg.groups_per_update = 2;
        let d = dispenser_with(cfg, DispenserState::new(7));
        let got = d.next("a", 2).unwrap();
        for a in &got {
            d.complete(&a.group_id, "a", a.sampling.seed);
        }
        // The completed group waits for the trainer; with it, two more may open, not three.
        assert_eq!(
            d.waiting(),
            1,
            "counted on completion, before the trainer reads it"
        );
        assert_eq!(d.next("a", 2).unwrap().len(), 2);
        assert_eq!(d.next("a", 2).unwrap().len(), 2);
        assert!(d.next("a", 2).unwrap().is_empty(), "2 open + 1 waiting = 3");
        // The trainer takes it: the slot is free again.
        d.set_waiting(0);
        assert_eq!(d.next("a", 2).unwrap().len(), 2);
        assert_eq!(d.open_groups(), 3);

        // With max_open_groups below groups_per_update, open plus waiting may still make
        // up one update (or the trainer would wait for groups no one may open).
        let mut cfg = config(1, 1, Duration::from_secs(60));
        cfg.groups_per_update = 3;
        let d = dispenser_with(cfg, DispenserState::new(7));
        d.set_waiting(2);
        let one = d.next("a", 5).unwrap();
        assert_eq!(one.len(), 1);
        d.complete(&one[0].group_id, "a", one[0].sampling.seed);
        assert_eq!(d.waiting(), 3);
        assert!(
            d.next("a", 5).unwrap().is_empty(),
            "a full update is waiting"
        );
    }

    #[test]
    fn an_idle_incomplete_group_expires() {
        let d = dispenser(2, 1, Duration::from_millis(20));
        assert_eq!(d.next("a", 5).unwrap().len(), 2);
        assert!(d.next("a", 1).unwrap().is_empty());
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(d.next("a", 1).unwrap().len(), 1);
        assert_eq!(d.counters().groups_expired, 1);
    }

    #[test]
    fn the_budget_bounds_new_groups() {
        let d = dispenser(2, 8, Duration::from_secs(60));
        d.set_budget(Some(1));
        assert_eq!(d.next("a", 10).unwrap().len(), 2);
        d.allow_groups(2);
        assert_eq!(d.next("a", 10).unwrap().len(), 4);
        assert!(d.next("a", 10).unwrap().is_empty());
    }

    #[test]
    fn a_restored_state_continues_the_same_sequence() {
        let a = dispenser(3, 8, Duration::from_secs(60));
        a.next("a", 4).unwrap();
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
        assert_eq!(a.next("a", 7).unwrap(), b.next("a", 7).unwrap());
    }

    #[test]
    fn a_silent_actors_episodes_go_to_the_next_actor_that_asks_with_the_same_seeds() {
        let d = quick_to_reclaim(3, 1);
        let held = d.next("dead", 2).unwrap();
        let alive = d.next("alive", 5).unwrap();
        assert_eq!(alive.len(), 1, "the third episode, then back-pressure");
        std::thread::sleep(SILENCE + Duration::from_millis(100));
        let again = d.next("alive", 5).unwrap();
        assert_eq!(
            again, held,
            "the same episodes: group, task and sampler seed"
        );
        assert_eq!(d.counters().episodes_reclaimed, 2);
        assert_eq!(d.counters().episodes_issued, 5);
        for a in alive.iter().chain(&again) {
            d.complete(&a.group_id, "alive", a.sampling.seed);
        }
        assert_eq!(d.counters().groups_completed, 1);
        assert_eq!(d.open_groups(), 0);
    }

    #[test]
    fn an_actor_that_keeps_calling_keeps_its_episodes() {
        let d = quick_to_reclaim(2, 1);
        let held = d.next("slow", 2).unwrap();
        for _ in 0..8 {
            std::thread::sleep(SILENCE / 5);
            d.heard_from("slow"); // what its PolicyInfo polls do
        }
        assert!(d.next("other", 2).unwrap().is_empty());
        assert_eq!(d.counters().episodes_reclaimed, 0);
        assert!(d.is_open(&held[0].group_id));
    }

    #[test]
    fn a_second_trajectory_of_an_episode_is_not_counted_twice() {
        let d = quick_to_reclaim(2, 1);
        let first = d.next("dead", 2).unwrap();
        std::thread::sleep(SILENCE + Duration::from_millis(100));
        let second = d.next("alive", 2).unwrap();
        assert_eq!(second, first);
        // The actor taken for dead was slow, not gone: both copies of episode 0 arrive.
        d.complete(&first[0].group_id, "dead", first[0].sampling.seed);
        d.complete(&second[0].group_id, "alive", second[0].sampling.seed);
        assert!(d.is_open(&first[0].group_id), "episode 1 is still out");
        d.complete(&second[1].group_id, "alive", second[1].sampling.seed);
        assert!(!d.is_open(&first[0].group_id));
        assert_eq!(d.counters().groups_completed, 1);
        // A trajectory of a closed group changes nothing.
        d.complete(&first[1].group_id, "dead", first[1].sampling.seed);
        assert_eq!(d.counters().groups_completed, 1);
    }

    #[test]
    fn restored_holders_get_the_full_timeout_and_then_lose_their_episodes() {
        let a = quick_to_reclaim(2, 1);
        let held = a.next("before-restart", 2).unwrap();
        let state = a.state();
        assert_eq!(
            state.open[0].slots,
            vec![EpisodeSlot::Held("before-restart".into()); 2]
        );
        let b = dispenser_with(quick_config(2, 1), state);
        assert!(
            b.next("other", 2).unwrap().is_empty(),
            "held, not yet silent"
        );
        std::thread::sleep(SILENCE + Duration::from_millis(100));
        assert_eq!(b.next("other", 2).unwrap(), held);
    }

    #[test]
    fn an_actor_that_does_not_echo_its_seed_completes_an_episode_it_holds() {
        let d = dispenser(2, 1, Duration::from_secs(60));
        let got = d.next("x", 1).unwrap();
        let other = d.next("y", 1).unwrap();
        d.complete(&got[0].group_id, "x", 12345);
        d.complete(&got[0].group_id, "x", 12345);
        assert!(d.is_open(&got[0].group_id), "x held one episode, not two");
        d.complete(&other[0].group_id, "y", other[0].sampling.seed);
        assert!(!d.is_open(&got[0].group_id));
    }
}
