//! The trainer's reader of the store: finished trajectories in finish order, gathered into
//! their groups until a group is ready to train on.
//!
//! # Rules
//!
//! 1. **Cursor.** Trajectories are read in the store's finish order after `read_cursor`
//!    ([`TrajectoryStore::finished_since`]); the cursor advances past every one read. Those
//!    read but not yet trained on are *pending*; their ids go into every checkpoint, so a
//!    resumed learner reloads them and reads on from the same cursor: nothing stored is
//!    lost and nothing trained is read twice.
//! 2. **Ready groups.** A group is ready when G trajectories of it have arrived. A group the
//!    dispenser no longer has open (expired, or opened before a crash and unknown since)
//!    with no new member for `partial_after` is ready as it is, with fewer members.
//! 3. **Order.** Ready groups are taken oldest first (by the finish position of their first
//!    member).
//! 4. **Second copies.** An episode is its group and its sampler seed (the dispenser gives
//!    each of a group's G episodes its own). When the dispenser takes an actor for gone and
//!    hands its episodes to another (its rule 6), the first actor may still finish them: a
//!    trajectory whose sampler seed is already pending in its group, or was in its group
//!    when that was taken in one of the last [`REMEMBERED_GROUPS`], is a second copy. It
//!    stays in the store, is neither trained on nor passed to the caller's `on_new` (the
//!    curriculum counts each episode once), and is counted ([`Collector::take_copies`]).
//!    Seed 0 is an episode whose sender did not seed it, never a copy. The remembered
//!    groups go into every checkpoint with the pending ids. [`copy_of`] is the rule for one
//!    trajectory; [`group_members`] applies it to a group read whole from the store
//!    (`corvid replay show` finds the trainer's group with it).

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use corvid_proto::{Trajectory, TrajectoryHeader};
use serde::{Deserialize, Serialize};

use corvid_store::{StoreError, TrajectoryStore};

/// Most trajectories read from the store in one poll (bounds one poll's memory).
pub const MAX_READ_PER_POLL: usize = 4096;

/// Taken groups whose episodes rule 4 still recognises (a second copy arrives within
/// `rollout.actor_timeout_s` plus an episode of its group being taken; 1,024 groups are
/// 256 updates of the demo's 4 groups).
pub const REMEMBERED_GROUPS: usize = 1024;

/// A group handed out for training, as rule 4 remembers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TakenGroup {
    /// The group id.
    pub group_id: String,
    /// Its members' sampler seeds.
    pub seeds: Vec<u64>,
}

/// One finished trajectory, loaded whole for training, with its place in the finish order.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedTrajectory {
    /// Position in the store's finish order.
    pub finish_seq: u64,
    /// The trajectory.
    pub trajectory: Trajectory,
}

impl LoadedTrajectory {
    /// Loads `id` from `store` (`finish_seq` where its record has no place in the finish
    /// order); `None` if it is not a finished trajectory.
    pub fn load(
        store: &TrajectoryStore,
        id: &str,
        finish_seq: u64,
    ) -> Result<Option<Self>, StoreError> {
        Ok(store.load(id)?.map(|(seq, trajectory)| Self {
            finish_seq: seq.unwrap_or(finish_seq),
            trajectory,
        }))
    }
}

/// Rule 4 for one trajectory: the index in `earlier` (the sampler seeds its group already
/// holds) of the episode a trajectory seeded `seed` is a second copy of. Seed 0 is never a
/// copy.
pub fn copy_of(seed: u64, earlier: impl IntoIterator<Item = u64>) -> Option<usize> {
    if seed == 0 {
        return None;
    }
    earlier.into_iter().position(|s| s == seed)
}

/// Rule 4 over one group's trajectories in finish order, each seeded `seed(t)`: the
/// members the collector gathers (in that order), and each second copy with the index in
/// the members of the episode it repeats.
pub fn group_members<T>(
    in_finish_order: impl IntoIterator<Item = T>,
    seed: impl Fn(&T) -> u64,
) -> (Vec<T>, Vec<(T, usize)>) {
    let (mut members, mut copies) = (Vec::new(), Vec::new());
    for t in in_finish_order {
        match copy_of(seed(&t), members.iter().map(&seed)) {
            Some(first) => copies.push((t, first)),
            None => members.push(t),
        }
    }
    (members, copies)
}

#[derive(Debug)]
struct PendingGroup {
    members: Vec<LoadedTrajectory>,
    first_seq: u64,
    last_arrival: Instant,
}

/// Reads finished trajectories and hands out ready groups (see the module doc).
#[derive(Debug)]
pub struct Collector {
    group_size: usize,
    partial_after: Duration,
    read_cursor: u64,
    groups: BTreeMap<String, PendingGroup>,
    /// The last [`REMEMBERED_GROUPS`] taken, oldest first (rule 4).
    taken: VecDeque<TakenGroup>,
    /// Second copies skipped since the last [`Collector::take_copies`].
    copies: u64,
}

impl Collector {
    /// A collector for groups of `group_size`, reading after `read_cursor`.
    pub fn new(group_size: usize, partial_after: Duration, read_cursor: u64) -> Self {
        Self {
            group_size: group_size.max(1),
            partial_after,
            read_cursor,
            groups: BTreeMap::new(),
            taken: VecDeque::new(),
            copies: 0,
        }
    }

    /// Rule 4 on resume: the groups a checkpoint remembers as taken.
    pub fn restore_taken(&mut self, taken: Vec<TakenGroup>) {
        self.taken = taken.into();
        while self.taken.len() > REMEMBERED_GROUPS {
            self.taken.pop_front();
        }
    }

    /// The groups rule 4 remembers, oldest first (for checkpoints).
    pub fn taken_groups(&self) -> Vec<TakenGroup> {
        self.taken.iter().cloned().collect()
    }

    /// Second copies skipped since the last call (rule 4).
    pub fn take_copies(&mut self) -> u64 {
        std::mem::take(&mut self.copies)
    }

    /// Rule 4: whether `h` is a second copy of an episode pending or recently taken.
    fn is_second_copy(&self, h: &TrajectoryHeader) -> bool {
        let seed = h.sampling.seed;
        let pending = self.groups.get(&h.group_id).is_some_and(|g| {
            copy_of(
                seed,
                g.members.iter().map(|t| t.trajectory.header.sampling.seed),
            )
            .is_some()
        });
        pending
            || self.taken.iter().any(|g| {
                g.group_id == h.group_id && copy_of(seed, g.seeds.iter().copied()).is_some()
            })
    }

    /// Rule 1 on resume: reloads the `pending` trajectories of a checkpoint. Ids no longer
    /// in the store are skipped (and returned) — the store never deletes, so that only
    /// happens when a checkpoint is paired with another run's store.
    pub fn restore_pending(
        &mut self,
        store: &TrajectoryStore,
        pending: &[String],
    ) -> Result<Vec<String>, StoreError> {
        let mut missing = Vec::new();
        for id in pending {
            match LoadedTrajectory::load(store, id, 0)? {
                Some(t) => self.add(t),
                None => missing.push(id.clone()),
            }
        }
        Ok(missing)
    }

    fn add(&mut self, t: LoadedTrajectory) {
        let g = self
            .groups
            .entry(t.trajectory.header.group_id.clone())
            .or_insert_with(|| PendingGroup {
                members: Vec::new(),
                first_seq: t.finish_seq,
                last_arrival: Instant::now(),
            });
        g.first_seq = g.first_seq.min(t.finish_seq);
        g.last_arrival = Instant::now();
        g.members.push(t);
    }

    /// Reads newly finished trajectories (at most [`MAX_READ_PER_POLL`]), calling `on_new`
    /// on each but second copies (rule 4). Returns how many were read, copies included.
    pub fn poll(
        &mut self,
        store: &TrajectoryStore,
        mut on_new: impl FnMut(&LoadedTrajectory),
    ) -> Result<usize, StoreError> {
        let mut n = 0;
        let ids: Vec<(u64, String)> = store
            .finished_since(self.read_cursor)
            .take(MAX_READ_PER_POLL)
            .map(|r| r.map(|(seq, rec)| (seq, rec.header.trajectory_id)))
            .collect::<Result<_, _>>()?;
        for (seq, id) in ids {
            if let Some(t) = LoadedTrajectory::load(store, &id, seq)? {
                n += 1;
                if self.is_second_copy(&t.trajectory.header) {
                    tracing::warn!(
                        trajectory = %id,
                        group = %t.trajectory.header.group_id,
                        actor = %t.trajectory.header.actor_id,
                        sampler_seed = t.trajectory.header.sampling.seed,
                        "second copy of an episode (it was handed out again: its first actor was taken for gone and was not, or the learner was killed after handing it out and resumed from an older checkpoint); stored, not trained on"
                    );
                    self.copies += 1;
                } else {
                    on_new(&t);
                    self.add(t);
                }
            }
            self.read_cursor = seq;
        }
        Ok(n)
    }

    /// Rule 2: whether the group `id` is ready.
    fn is_ready(&self, g: &PendingGroup, id: &str, is_open: &dyn Fn(&str) -> bool) -> bool {
        g.members.len() >= self.group_size
            || (!is_open(id) && g.last_arrival.elapsed() >= self.partial_after)
    }

    /// How many groups are ready now.
    pub fn ready_groups(&self, is_open: &dyn Fn(&str) -> bool) -> usize {
        self.groups
            .iter()
            .filter(|(id, g)| self.is_ready(g, id, is_open))
            .count()
    }

    /// Takes up to `max` ready groups, oldest first (rule 3).
    pub fn take_ready(
        &mut self,
        max: usize,
        is_open: &dyn Fn(&str) -> bool,
    ) -> Vec<Vec<LoadedTrajectory>> {
        let mut ready: Vec<(u64, String)> = self
            .groups
            .iter()
            .filter(|(id, g)| self.is_ready(g, id, is_open))
            .map(|(id, g)| (g.first_seq, id.clone()))
            .collect();
        ready.sort();
        ready
            .into_iter()
            .take(max)
            .filter_map(|(_, id)| self.groups.remove(&id).map(|g| (id, g)))
            .map(|(group_id, mut g)| {
                g.members.sort_by_key(|t| t.finish_seq);
                let seeds = g
                    .members
                    .iter()
                    .map(|t| t.trajectory.header.sampling.seed)
                    .collect();
                if self.taken.len() == REMEMBERED_GROUPS {
                    self.taken.pop_front();
                }
                self.taken.push_back(TakenGroup { group_id, seeds });
                g.members
            })
            .collect()
    }

    /// The store position read up to.
    pub fn read_cursor(&self) -> u64 {
        self.read_cursor
    }

    /// Ids of the trajectories read but not yet handed out, in finish order.
    pub fn pending_ids(&self) -> Vec<String> {
        let mut all: Vec<(u64, String)> = self
            .groups
            .values()
            .flat_map(|g| g.members.iter())
            .map(|t| (t.finish_seq, t.trajectory.header.trajectory_id.clone()))
            .collect();
        all.sort();
        all.into_iter().map(|(_, id)| id).collect()
    }

    /// Groups with at least one trajectory pending.
    pub fn pending_groups(&self) -> usize {
        self.groups.len()
    }

    /// Trajectories pending.
    pub fn pending_len(&self) -> usize {
        self.groups.values().map(|g| g.members.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corvid_proto::synthetic::{self, Shape};
    use std::sync::Arc;

    const SHAPE: Shape = Shape {
        steps: 2,
        tokens_per_step: 9,
    };

    fn put(store: &Arc<TrajectoryStore>, id: &str, group: &str) {
        put_seeded(store, id, group, 0);
    }

    fn put_seeded(store: &Arc<TrajectoryStore>, id: &str, group: &str, seed: u64) {
        let mut h = synthetic::header(id, "hops", 1, 1);
        h.group_id = group.into();
        h.sampling.seed = seed;
        let corvid_store::Begin::New(mut w) = store.begin(h).unwrap() else {
            panic!("duplicate {id}")
        };
        for (seq, s) in synthetic::steps(id, SHAPE).enumerate() {
            w.append(seq as u64, s).unwrap();
        }
        w.finish_blocking(synthetic::footer(id, SHAPE)).unwrap();
    }

    #[test]
    fn groups_become_ready_at_g_and_pending_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(TrajectoryStore::open(dir.path()).unwrap());
        let open = |_: &str| true;
        let mut c = Collector::new(2, Duration::from_secs(60), 0);
        put(&store, "a1", "A");
        put(&store, "b1", "B");
        put(&store, "a2", "A");
        let mut seen = Vec::new();
        assert_eq!(
            c.poll(&store, |t| seen
                .push(t.trajectory.header.trajectory_id.clone()))
                .unwrap(),
            3
        );
        assert_eq!(seen, ["a1", "b1", "a2"]);
        assert_eq!(c.ready_groups(&open), 1);
        let got = c.take_ready(5, &open);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].len(), 2);
        assert_eq!(got[0][0].trajectory.steps.len(), 2);
        assert_eq!(c.pending_ids(), ["b1"]);

        // "Checkpoint" here, then restart: the pending one is reloaded and the cursor holds.
        let (cursor, pending) = (c.read_cursor(), c.pending_ids());
        put(&store, "b2", "B");
        let mut c2 = Collector::new(2, Duration::from_secs(60), cursor);
        assert!(c2.restore_pending(&store, &pending).unwrap().is_empty());
        assert_eq!(c2.poll(&store, |_| {}).unwrap(), 1);
        let got = c2.take_ready(5, &open);
        let ids: Vec<_> = got[0]
            .iter()
            .map(|t| t.trajectory.header.trajectory_id.as_str())
            .collect();
        assert_eq!(ids, ["b1", "b2"]);
        assert_eq!(c2.pending_len(), 0);
    }

    #[test]
    fn a_closed_idle_group_is_released_incomplete() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(TrajectoryStore::open(dir.path()).unwrap());
        let mut c = Collector::new(4, Duration::from_millis(10), 0);
        put(&store, "x1", "X");
        c.poll(&store, |_| {}).unwrap();
        assert_eq!(c.ready_groups(&|_| true), 0);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            c.ready_groups(&|_| true),
            0,
            "an open group waits for all G"
        );
        assert_eq!(c.take_ready(1, &|_| false).len(), 1);
    }

    fn ids(group: &[LoadedTrajectory]) -> Vec<&str> {
        group
            .iter()
            .map(|t| t.trajectory.header.trajectory_id.as_str())
            .collect()
    }

    #[test]
    fn a_second_copy_of_an_episode_is_neither_a_member_nor_new() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(TrajectoryStore::open(dir.path()).unwrap());
        let open = |_: &str| true;
        let mut c = Collector::new(3, Duration::from_secs(60), 0);
        // Episode 12 was handed out again; both its actors finished it before episode 13.
        put_seeded(&store, "a11", "A", 11);
        put_seeded(&store, "a12-reissued", "A", 12);
        put_seeded(&store, "a12-slow", "A", 12);
        let mut new = Vec::new();
        let read = c
            .poll(&store, |t| {
                new.push(t.trajectory.header.trajectory_id.clone())
            })
            .unwrap();
        assert_eq!(read, 3, "a copy is still read");
        assert_eq!(new, ["a11", "a12-reissued"], "a copy is not passed on");
        assert_eq!(
            c.ready_groups(&open),
            0,
            "two episodes of three are not a group"
        );
        assert_eq!(c.take_copies(), 1);
        assert_eq!(c.take_copies(), 0, "counted once");

        put_seeded(&store, "a13", "A", 13);
        c.poll(&store, |_| {}).unwrap();
        let got = c.take_ready(5, &open);
        assert_eq!(ids(&got[0]), ["a11", "a12-reissued", "a13"]);
        assert!(
            store.get("a12-slow").unwrap().is_some(),
            "the copy stays stored"
        );
    }

    #[test]
    fn a_copy_after_its_group_was_taken_is_skipped_also_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(TrajectoryStore::open(dir.path()).unwrap());
        let open = |_: &str| true;
        let mut c = Collector::new(2, Duration::from_millis(1), 0);
        put_seeded(&store, "b1", "B", 21);
        put_seeded(&store, "b2", "B", 22);
        c.poll(&store, |_| {}).unwrap();
        assert_eq!(c.take_ready(5, &open).len(), 1);
        let taken = c.taken_groups();
        assert_eq!(
            taken,
            [TakenGroup {
                group_id: "B".into(),
                seeds: vec![21, 22]
            }]
        );

        // A late copy of episode 22 and a late episode 23 of the same group.
        put_seeded(&store, "b2-slow", "B", 22);
        put_seeded(&store, "b3", "B", 23);
        let mut c2 = Collector::new(2, Duration::from_millis(1), c.read_cursor());
        c2.restore_taken(taken);
        let mut new = Vec::new();
        c2.poll(&store, |t| {
            new.push(t.trajectory.header.trajectory_id.clone())
        })
        .unwrap();
        assert_eq!(new, ["b3"], "an episode the group never had is new");
        assert_eq!(c2.take_copies(), 1);
        std::thread::sleep(Duration::from_millis(5));
        let got = c2.take_ready(5, &|_| false);
        assert_eq!(ids(&got[0]), ["b3"]);
    }

    #[test]
    fn group_members_keeps_the_first_of_each_seed_in_finish_order() {
        let seeds = [11u64, 12, 12, 0, 0, 11, 13];
        let (members, copies) = group_members(seeds, |s| *s);
        assert_eq!(
            members,
            [11, 12, 0, 0, 13],
            "unseeded episodes are all members"
        );
        assert_eq!(
            copies,
            [(12, 1), (11, 0)],
            "each copy names the member it repeats"
        );
    }

    #[test]
    fn unseeded_episodes_are_never_copies_and_memory_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(TrajectoryStore::open(dir.path()).unwrap());
        let open = |_: &str| true;
        let mut c = Collector::new(2, Duration::from_secs(60), 0);
        put(&store, "u1", "U");
        put(&store, "u2", "U");
        c.poll(&store, |_| {}).unwrap();
        assert_eq!(ids(&c.take_ready(1, &open)[0]), ["u1", "u2"]);
        assert_eq!(c.take_copies(), 0);

        let many = (0..REMEMBERED_GROUPS + 5)
            .map(|i| TakenGroup {
                group_id: format!("g{i}"),
                seeds: vec![1],
            })
            .collect();
        c.restore_taken(many);
        assert_eq!(c.taken_groups().len(), REMEMBERED_GROUPS);
        assert_eq!(
            c.taken_groups()[0].group_id,
            "g5",
            "the oldest are forgotten"
        );
        put_seeded(&store, "v1", "V", 7);
        put_seeded(&store, "v2", "V", 8);
        c.poll(&store, |_| {}).unwrap();
        c.take_ready(1, &open);
        assert_eq!(c.taken_groups().len(), REMEMBERED_GROUPS);
        assert_eq!(c.taken_groups().last().unwrap().group_id, "V");
    }
}
