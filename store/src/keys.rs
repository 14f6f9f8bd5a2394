//! Key encodings of the store's trees.
//!
//! Integers are big-endian so that sled's byte order is numeric order. Trajectory
//! ids never contain `0x00` (see `corvid_proto::validate_trajectory_id`), so it
//! separates an id from what follows it.

use corvid_proto::{Termination, TrajectoryFooter, TrajectoryHeader};

/// `steps`: id ‖ 0x00 ‖ seq (u64 BE).
pub fn step_key(id: &str, seq: u64) -> Vec<u8> {
    let mut k = step_prefix(id);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// `steps`: piece `piece` (1, 2, …) of step `seq`, after its first piece at
/// [`step_key`]: id ‖ 0x00 ‖ seq (u64 BE) ‖ piece (u32 BE). It sorts between the step's
/// first piece and the next step.
pub fn piece_key(id: &str, seq: u64, piece: u32) -> Vec<u8> {
    let mut k = step_key(id, seq);
    k.extend_from_slice(&piece.to_be_bytes());
    k
}

/// The prefix shared by every step of `id`.
pub fn step_prefix(id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(id.len() + 9);
    k.extend_from_slice(id.as_bytes());
    k.push(0);
    k
}

/// `by_version`: policy version (u64 BE) ‖ id.
pub fn version_key(version: u64, id: &str) -> Vec<u8> {
    let mut k = version.to_be_bytes().to_vec();
    k.extend_from_slice(id.as_bytes());
    k
}

/// `by_task`: family ‖ 0x00 ‖ level (u32 BE) ‖ id.
pub fn task_key(family: &str, level: u32, id: &str) -> Vec<u8> {
    let mut k = task_prefix(family, Some(level));
    k.extend_from_slice(id.as_bytes());
    k
}

/// Prefix of `by_task` for a family, and optionally one level of it.
pub fn task_prefix(family: &str, level: Option<u32>) -> Vec<u8> {
    let mut k = Vec::with_capacity(family.len() + 5);
    k.extend_from_slice(family.as_bytes());
    k.push(0);
    if let Some(level) = level {
        k.extend_from_slice(&level.to_be_bytes());
    }
    k
}

/// `by_status`: termination (u8) ‖ success (u8) ‖ id.
pub fn status_key(termination: Termination, success: bool, id: &str) -> Vec<u8> {
    let mut k = status_prefix(termination, Some(success));
    k.extend_from_slice(id.as_bytes());
    k
}

/// Prefix of `by_status` for a termination, and optionally a success value.
pub fn status_prefix(termination: Termination, success: Option<bool>) -> Vec<u8> {
    let t = Termination::ALL
        .iter()
        .position(|x| *x == termination)
        .unwrap_or(0) as u8;
    let mut k = vec![t];
    if let Some(s) = success {
        k.push(u8::from(s));
    }
    k
}

/// The index keys of a finished trajectory: (by_version, by_task, by_status).
pub fn index_keys(h: &TrajectoryHeader, f: &TrajectoryFooter) -> [Vec<u8>; 3] {
    let id = &h.trajectory_id;
    [
        version_key(h.policy_version, id),
        task_key(&h.task.family, h.task.level, id),
        status_key(f.termination, f.success, id),
    ]
}

/// The id at the end of an index key, after a fixed-length or NUL-terminated prefix.
pub fn id_after(key: &[u8], prefix_len: usize) -> Option<String> {
    key.get(prefix_len..)
        .and_then(|b| std::str::from_utf8(b).ok())
        .map(str::to_owned)
}

/// Length of the `by_task` prefix (family ‖ 0x00 ‖ level) of a key.
pub fn task_prefix_len(key: &[u8]) -> Option<usize> {
    key.iter().position(|b| *b == 0).map(|nul| nul + 1 + 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_keys_sort_numerically() {
        assert!(step_key("a", 2) < step_key("a", 10));
        assert!(step_key("a", 255) < step_key("a", 256));
        assert!(version_key(9, "z") < version_key(10, "a"));
        // A longer id sharing a prefix never interleaves with the shorter id's steps.
        assert!(!step_key("ab", 0).starts_with(&step_prefix("a")));
    }

    #[test]
    fn ids_are_recovered_from_index_keys() {
        let k = task_key("hops", 3, "traj-1");
        let n = task_prefix_len(&k).unwrap();
        assert_eq!(id_after(&k, n).as_deref(), Some("traj-1"));
        let k = version_key(7, "traj-2");
        assert_eq!(id_after(&k, 8).as_deref(), Some("traj-2"));
    }
}
