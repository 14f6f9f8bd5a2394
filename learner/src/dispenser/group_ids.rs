//! Rule 7 of the dispenser: a group id is handed out once, also across a crash.
//!
//! A run checkpoint saves the dispenser's group counter and RNG, but a learner killed
//! between two checkpoints has opened groups that its last checkpoint never saw, and their
//! episodes may still be running on actors, which deliver them after the restart. Resumed
//! from the checkpoint alone, the dispenser would open those groups again under the same ids
//! with the same draws (task, instance seed, sampler seeds): every such episode would be run
//! twice and stored twice.
//!
//! So group ids are reserved on disk ahead of use, [`BLOCK`] at a time, in
//! `<run>/group-ids.json` (written to a temporary file, fsynced and renamed). A dispenser
//! built on a reservation past its restored counter ([`resume_past`]) opens its next group
//! past every id that may have been handed out, and draws from a fresh RNG, so no draw
//! repeats one made before the crash. Each checkpoint trims the reservation to the counter
//! ([`super::TaskDispenser::trim_group_ids`]), so a run stopped cleanly resumes exactly
//! where it stopped.

use std::path::{Path, PathBuf};

use corvid_tasks::SplitMix64;
use serde::{Deserialize, Serialize};

use super::state::DispenserState;

/// Group ids reserved per write.
pub const BLOCK: u64 = 64;

/// The file's name inside the run folder.
pub const FILE_NAME: &str = "group-ids.json";

const FORMAT: u32 = 1;

/// The reservation file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum GroupIdsError {
    /// Reading, writing or syncing it failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file (or its folder).
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It does not hold a reservation this version writes.
    #[error(
        "{}: not a group-id reservation ({why}); it guards against handing out a group twice \
         after a crash: restore it from a backup, or start the run in another --run-dir",
        path.display()
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
}

#[derive(Debug, Serialize, Deserialize)]
struct OnDisk {
    format: u32,
    /// Every group id below `g<reserved_below>` may have been handed out.
    reserved_below: u64,
}

/// The on-disk reservation of group ids (or an in-memory one, for tests).
#[derive(Debug)]
pub struct GroupIds {
    path: Option<PathBuf>,
    reserved_below: u64,
}

impl GroupIds {
    /// A reservation kept in memory only: a crash forgets it.
    pub fn in_memory() -> Self {
        Self {
            path: None,
            reserved_below: 0,
        }
    }

    /// The reservation of the run folder `run_dir`; none yet (a fresh run, or one written
    /// before rule 7) reads as 0.
    pub fn open(run_dir: &Path) -> Result<Self, GroupIdsError> {
        let path = run_dir.join(FILE_NAME);
        let reserved_below = match std::fs::read(&path) {
            Ok(bytes) => {
                let d: OnDisk =
                    serde_json::from_slice(&bytes).map_err(|e| GroupIdsError::Corrupt {
                        path: path.clone(),
                        why: e.to_string(),
                    })?;
                if d.format != FORMAT {
                    return Err(GroupIdsError::Corrupt {
                        path,
                        why: format!("format {}, this version reads {FORMAT}", d.format),
                    });
                }
                d.reserved_below
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(source) => return Err(GroupIdsError::Io { path, source }),
        };
        Ok(Self {
            path: Some(path),
            reserved_below,
        })
    }

    /// Every id below this may have been handed out.
    pub fn reserved_below(&self) -> u64 {
        self.reserved_below
    }

    /// Makes sure id `next` is reserved before it is handed out: past the reservation, the
    /// next [`BLOCK`] ids are written down first.
    pub(crate) fn cover(&mut self, next: u64) -> Result<(), GroupIdsError> {
        if next < self.reserved_below {
            return Ok(());
        }
        self.write(next.saturating_add(BLOCK))
    }

    /// Shrinks the reservation to `next`, the dispenser's counter: every id handed out is
    /// below it. After a checkpoint that saved `next`, a resume continues exactly there.
    pub(crate) fn trim(&mut self, next: u64) -> Result<(), GroupIdsError> {
        if next >= self.reserved_below {
            return Ok(());
        }
        self.write(next)
    }

    fn write(&mut self, reserved_below: u64) -> Result<(), GroupIdsError> {
        if let Some(path) = &self.path {
            let text = serde_json::to_vec(&OnDisk {
                format: FORMAT,
                reserved_below,
            })
            .expect("two integers serialise");
            corvid_durable::replace_file(path, &text).map_err(|source| GroupIdsError::Io {
                path: path.clone(),
                source,
            })?;
        }
        self.reserved_below = reserved_below;
        Ok(())
    }
}

/// Moves a restored dispenser `state` past every group id `ids` says may have been handed
/// out, with a fresh RNG so that no draw repeats one made before the crash. Returns the
/// first id the restored state would have reused, when it had to move.
pub fn resume_past(state: &mut DispenserState, ids: &GroupIds) -> Option<u64> {
    let reserved = ids.reserved_below();
    if reserved <= state.next_group {
        return None;
    }
    let was = state.next_group;
    state.next_group = reserved;
    state.rng = SplitMix64::derive(state.rng.next_u64() ^ reserved, "dispenser/after-a-crash");
    Some(was)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_reserved_a_block_ahead_and_trimmed_to_the_counter() {
        let dir = tempfile::tempdir().unwrap();
        let mut ids = GroupIds::open(dir.path()).unwrap();
        assert_eq!(ids.reserved_below(), 0);
        ids.cover(0).unwrap();
        assert_eq!(GroupIds::open(dir.path()).unwrap().reserved_below(), BLOCK);
        // Inside the block: nothing is written.
        ids.cover(BLOCK - 1).unwrap();
        assert_eq!(GroupIds::open(dir.path()).unwrap().reserved_below(), BLOCK);
        ids.cover(BLOCK).unwrap();
        assert_eq!(
            GroupIds::open(dir.path()).unwrap().reserved_below(),
            2 * BLOCK
        );
        ids.trim(70).unwrap();
        assert_eq!(GroupIds::open(dir.path()).unwrap().reserved_below(), 70);
        // A trim never grows it.
        ids.trim(90).unwrap();
        assert_eq!(GroupIds::open(dir.path()).unwrap().reserved_below(), 70);
    }

    #[test]
    fn a_state_behind_the_reservation_moves_past_it_with_fresh_draws() {
        let dir = tempfile::tempdir().unwrap();
        let mut ids = GroupIds::open(dir.path()).unwrap();
        ids.cover(96).unwrap();
        let mut state = DispenserState::new(3);
        state.next_group = 96;
        let before = state.clone();
        assert_eq!(resume_past(&mut state, &ids), Some(96));
        assert_eq!(state.next_group, 96 + BLOCK);
        assert_ne!(state.rng, before.rng);
        // A clean stop trims to the counter the checkpoint saved: nothing moves.
        let mut exact = before.clone();
        ids.trim(96).unwrap();
        assert_eq!(resume_past(&mut exact, &ids), None);
        assert_eq!(exact, before);
    }

    #[test]
    fn a_damaged_reservation_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE_NAME), b"{\"format\": 1, \"reserved").unwrap();
        let e = GroupIds::open(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains(FILE_NAME) && e.contains("not a group-id reservation"),
            "{e}"
        );
    }
}
