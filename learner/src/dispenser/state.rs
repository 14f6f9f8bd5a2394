//! The dispenser's serialisable state ([`DispenserState`]): its RNG, group counter, open
//! groups with one slot per episode, budget and counters, as every run checkpoint saves it.
//!
//! It lives apart from the dispenser's rules so that the group-id reservation
//! ([`super::group_ids`]) can move a restored state past its ids without depending on the
//! dispenser that uses the reservation.

use corvid_proto::TaskRef;
use corvid_tasks::SplitMix64;
use serde::{Deserialize, Serialize};

/// Where one episode of an open group stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EpisodeSlot {
    /// Not handed out yet, or taken back from an actor that went silent (rule 6).
    Free,
    /// Handed to the actor with this id; its trajectory is not stored yet.
    Held(String),
    /// Its trajectory is stored.
    Stored,
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
    /// The window its episodes run in, when the run folds (0: none, or a group saved before
    /// windows were; it then gets the configured one).
    #[serde(default)]
    pub window_tokens: u32,
    /// Base of the episodes' sampler seeds.
    pub seed: u64,
    /// Episode `i`'s state, G of them (see [`EpisodeSlot`]).
    pub slots: Vec<EpisodeSlot>,
}

impl SavedGroup {
    /// The group with `slots` for G episodes: a run resumed with another `rl.group_size`
    /// keeps the episodes below the new G and hands out any new ones.
    pub(super) fn with_group_size(mut self, g: u32) -> Self {
        self.slots.resize(g as usize, EpisodeSlot::Free);
        self
    }

    /// The first episode to hand out (rule 2), if any.
    pub(super) fn free_slot(&self) -> Option<usize> {
        self.slots.iter().position(|s| *s == EpisodeSlot::Free)
    }

    /// Episodes whose trajectories are stored.
    pub fn stored(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| **s == EpisodeSlot::Stored)
            .count()
    }
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
    /// Episodes handed out, again-handed-out ones included.
    pub episodes_issued: u64,
    /// Episodes taken back from actors that went silent (rule 6).
    #[serde(default)]
    pub episodes_reclaimed: u64,
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
