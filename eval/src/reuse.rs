//! The store side of an evaluation: opening it, and deciding which stored episodes a level
//! reuses.
//!
//! Episodes are stored under ids `<label>.<family>.L<level>.s<seed>.k<i>`. Those the store
//! already holds under a label and level must be exactly the ones this evaluation would record
//! (same weights, policy version, sampling and task instances): they are then reused rather
//! than run again, so the figures are always computed from the stored episodes (a re-run, or
//! the rest of an interrupted one). Any other episode under the label and level is refused
//! before anything runs at that level: replay, rescore and export would otherwise serve
//! episodes the figures were not computed from.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use corvid_actor::EpisodeSpec;
use corvid_proto::{ContextFold, SamplingParams, Trajectory, TrajectoryHeader};
use corvid_store::{Filter, TrajectoryRecord, TrajectoryStore};

/// Opens (creating it and its parent folder if need be) the store evaluation episodes go to.
/// A plain file, or a folder that holds other files but no store, is refused rather than
/// turned into one.
pub fn open_store(path: &Path) -> Result<Arc<TrajectoryStore>> {
    let store = corvid_store::open_or_create(path)
        .with_context(|| format!("the eval store {}", path.display()))?;
    Ok(Arc::new(store))
}

/// Which episode of a level goes where: the trajectory ids `<label>.<family>.L<level>.…`.
pub(crate) struct LevelIds<'a> {
    pub label: &'a str,
    pub family: &'a str,
    pub level: u32,
}

impl LevelIds<'_> {
    /// The group of an instance's samples: `<label>.<family>.L<level>.s<seed>`.
    pub fn group(&self, seed: u64) -> String {
        format!("{}.{}.L{}.s{seed}", self.label, self.family, self.level)
    }

    /// Sample `j` of the instance `seed`: `<group>.k<j>`.
    pub fn sample(&self, seed: u64, j: u32) -> String {
        format!("{}.k{j}", self.group(seed))
    }
}

/// The stored episodes of this level that `planned` (the level's episodes, as `version`
/// would record them) can reuse: all the store holds under the level's ids, once each is
/// checked to be one of `planned`, recorded the same way. Refuses the level otherwise.
pub(crate) fn reusable(
    store: &TrajectoryStore,
    ids: &LevelIds<'_>,
    planned: &[EpisodeSpec],
    version: u64,
) -> Result<Vec<TrajectoryRecord>> {
    let stored = stored_under(store, ids)?;
    let planned: HashMap<&str, &EpisodeSpec> = planned
        .iter()
        .map(|s| (s.trajectory_id.as_str(), s))
        .collect();
    let mut conflicts = Vec::new();
    for r in &stored {
        let id = r.header.trajectory_id.as_str();
        let why = match planned.get(id) {
            None => Some(
                "not one of this evaluation's instances and samples (another --seed, \
                 --episodes or --k)"
                    .to_string(),
            ),
            Some(spec) => mismatch(&spec.header(version), &r.header),
        };
        if let Some(why) = why {
            conflicts.push((id.to_string(), why));
        }
    }
    if let Some((id, why)) = conflicts.first() {
        let (label, level) = (ids.label, ids.level);
        bail!(
            "the store {} already holds {} episode(s) of {} level {level} under --label {label:?}, \
             {} of them not from this evaluation (for example {id}: {why}); evaluating into it \
             would leave replay, rescore and export serving episodes these figures were not \
             computed from. Choose another --label, or another --store",
            store.path().display(),
            stored.len(),
            ids.family,
            conflicts.len()
        );
    }
    Ok(stored)
}

/// The finished episodes `store` holds under the level's ids
/// `<label>.<family>.L<level>.s<seed>.k<i>`, whatever the seed and sample.
fn stored_under(store: &TrajectoryStore, ids: &LevelIds<'_>) -> Result<Vec<TrajectoryRecord>> {
    let prefix = format!("{}.{}.L{}.", ids.label, ids.family, ids.level);
    let filter = Filter {
        family: Some(ids.family.to_string()),
        level: Some(ids.level),
        ..Filter::default()
    };
    let mut out = Vec::new();
    for r in store.list(&filter) {
        let r = r.with_context(|| format!("reading the eval store {}", store.path().display()))?;
        if r.header
            .trajectory_id
            .strip_prefix(&prefix)
            .is_some_and(is_sample_suffix)
        {
            out.push(r);
        }
    }
    Ok(out)
}

/// Whether `rest` is `s<seed>.k<i>`, the end of an evaluation episode's id.
fn is_sample_suffix(rest: &str) -> bool {
    let Some((seed, k)) = rest.split_once(".k") else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    seed.strip_prefix('s').is_some_and(digits) && digits(k)
}

/// Why the stored episode `got` is not the one this evaluation would record as `want` (same
/// id): other weights, another policy version, another window or fold, other sampling or another
/// task instance.
fn mismatch(want: &TrajectoryHeader, got: &TrajectoryHeader) -> Option<String> {
    if got.actor_id != want.actor_id {
        return Some(match got.actor_id.strip_prefix("eval@") {
            Some(theirs) => format!(
                "written by other weights (fingerprint {theirs}, this evaluation's is {})",
                want.actor_id.trim_start_matches("eval@")
            ),
            None => format!(
                "written by actor {:?}, which records no weights fingerprint to compare",
                got.actor_id
            ),
        });
    }
    if got.policy_version != want.policy_version {
        return Some(format!(
            "policy version {}, this evaluation's is {}",
            got.policy_version, want.policy_version
        ));
    }
    if got.context != want.context {
        let c = |c: &Option<ContextFold>| match c {
            Some(c) => format!(
                "a window of {} tokens, fold {}, memory {} tokens, notes {:?}",
                c.window_tokens,
                c.fold.as_str(),
                c.memory_tokens,
                c.notes_path
            ),
            None => "no window".to_string(),
        };
        return Some(format!(
            "run with {}, this evaluation with {}",
            c(&got.context),
            c(&want.context)
        ));
    }
    if got.sampling != want.sampling {
        let s = |p: &SamplingParams| {
            format!(
                "temperature {} top-p {} max-new-tokens {} seed {}",
                p.temperature, p.top_p, p.max_new_tokens, p.seed
            )
        };
        return Some(format!(
            "sampled with {}, this evaluation with {}",
            s(&got.sampling),
            s(&want.sampling)
        ));
    }
    if got.task != want.task || got.group_id != want.group_id {
        return Some("its task instance differs (the family's generator or pack changed)".into());
    }
    None
}

/// A stored finished episode read back whole.
pub(crate) fn stored_trajectory(
    store: &TrajectoryStore,
    rec: TrajectoryRecord,
) -> Result<Trajectory> {
    let id = rec.header.trajectory_id;
    let (_, t) = store
        .load(&id)
        .with_context(|| format!("reading stored episode {id}"))?
        .with_context(|| format!("stored episode {id} is not finished"))?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_ids_under_a_label_are_recognised_exactly() {
        assert!(is_sample_suffix("s4611686018427387904.k0"));
        assert!(is_sample_suffix("s1.k12"));
        for bad in ["s.k0", "s1.k", "1.k0", "s1.kx", "s1", "hops.L1.s1.k0"] {
            assert!(!is_sample_suffix(bad), "{bad}");
        }
    }

    #[test]
    fn ids_name_the_label_family_level_instance_and_sample() {
        let ids = LevelIds {
            label: "t",
            family: "hops",
            level: 2,
        };
        assert_eq!(ids.group(7), "t.hops.L2.s7");
        assert_eq!(ids.sample(7, 1), "t.hops.L2.s7.k1");
        assert!(ids
            .sample(7, 1)
            .strip_prefix("t.hops.L2.")
            .is_some_and(is_sample_suffix));
    }
}
