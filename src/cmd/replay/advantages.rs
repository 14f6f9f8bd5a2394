//! The advantages `corvid replay show` prints: the ones the trainer gives each turn of a
//! trajectory within its group, computed by the trainer's own code under the run's `[rl]`
//! settings, or a line saying why none is shown.
//!
//! The run's settings are its `config.toml` (else `learner.toml`) in the folder holding the
//! store, or the file `--config` names. The group is found as the trainer's collector finds
//! it ([`corvid_learner::collect::group_members`]) and filtered as the trainer filters it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use corvid_learner::collect::group_members;
use corvid_learner::config::LearnerConfig;
use corvid_learner::train::batch::{check_trainable, turn_advantages};
use corvid_learner::train::{AdvantageMode, RlConfig};
use corvid_proto::Trajectory;
use corvid_store::{Filter, TrajectoryRecord, TrajectoryStore};

use super::stored_steps;

/// The trainer's `[rl]` settings of a run, and the file they were read from.
#[derive(Debug, Clone)]
pub(super) struct RunRl {
    pub(super) path: PathBuf,
    pub(super) rl: RlConfig,
}

/// The run config files looked for next to a store, in order: the learner's own resolved
/// copy (`config.toml`, rewritten at every start, so it is what the trainer last ran with),
/// then the learner part that `corvid run` writes (`learner.toml`).
const RUN_CONFIGS: [&str; 2] = ["config.toml", "learner.toml"];

/// The `[rl]` settings `replay show` computes advantages with: `explicit` (`--config`), else
/// the run config in the folder holding the store (a run's `store/` sits in its run folder),
/// else `None` (a bare eval store: there is no trainer whose numbers could be shown). A file
/// that is there but unreadable is an error, not a silent fallback to defaults.
pub(super) fn run_rl_config(store: &Path, explicit: Option<&Path>) -> Result<Option<RunRl>> {
    if let Some(path) = explicit {
        return load_rl(path).map(Some);
    }
    let dir = match store.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    for name in RUN_CONFIGS {
        let path = dir.join(name);
        if path.is_file() {
            // Found, not named: a file that is not a run config only costs the advantages.
            return Ok(load_rl(&path)
                .map_err(|e| {
                    eprintln!(
                        "note: {} next to the store is not a run config ({e:#}); no advantages are shown (pass --config FILE)",
                        path.display()
                    )
                })
                .ok());
        }
    }
    Ok(None)
}

/// Reads `path` as a learner config (the file `corvid learner` and `corvid run` read) and
/// checks its `[rl]` table. The rest of the config is not validated: it may name task packs
/// or devices relative to where the run was started, which replay neither needs nor has.
pub(super) fn load_rl(path: &Path) -> Result<RunRl> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let cfg: LearnerConfig = toml::from_str(&text)
        .with_context(|| format!("{} is not a learner config", path.display()))?;
    cfg.rl
        .validate()
        .with_context(|| format!("{}: the [rl] table", path.display()))?;
    Ok(RunRl {
        path: path.to_path_buf(),
        rl: cfg.rl,
    })
}

/// What `replay show` prints about a trajectory's advantages.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Advantages {
    /// The advantage of each turn, by turn index (every step of a turn split into several
    /// steps shows its turn's); `None` when none is shown.
    pub(super) by_turn: Option<BTreeMap<u32, f64>>,
    /// One line: how they were computed, or why none is shown.
    pub(super) note: String,
}

impl Advantages {
    fn none(note: impl Into<String>) -> Self {
        Self {
            by_turn: None,
            note: note.into(),
        }
    }
}

/// The advantage the trainer gives each of `rec`'s turns within its group (the stored,
/// finished trajectories sharing its `group_id`), by the trainer's own code
/// (`corvid_learner::train::batch::turn_advantages`): its turns built from steps the way
/// the trainer builds them (a turn split over several steps is one turn), under `rl`'s
/// estimator, gamma, process_weight, normalisation and eps. Without `rl` nothing is shown:
/// any fixed recipe would print numbers the trainer never used.
pub(super) fn group_advantages(
    store: &TrajectoryStore,
    rec: &TrajectoryRecord,
    rl: Option<&RunRl>,
) -> Result<Advantages> {
    let Some(run) = rl else {
        return Ok(Advantages::none(format!(
            "not shown, no run config found next to the store; pass --config FILE (the \
             trainer's [rl] settings decide them; looked for {} in the store's folder)",
            RUN_CONFIGS.join(" and ")
        )));
    };
    let (members, me) = match trained_group(store, rec)? {
        TrainedGroup::In { members, me } => (members, me),
        TrainedGroup::LeftOut(why) => return Ok(Advantages::none(why)),
    };
    let group = &rec.header.group_id;
    let refs: Vec<&Trajectory> = members.iter().collect();
    let mut adv = turn_advantages(&refs, &run.rl)
        .with_context(|| format!("the advantages of group {group}"))?;
    let scored = adv.iter().filter(|a| a.is_some()).count();
    let Some(per_turn) = adv.swap_remove(me) else {
        return Ok(Advantages::none(format!(
            "none, it ended without a verdict ({}): the trainer leaves it out of baselines and \
             the loss",
            members[me].footer.termination
        )));
    };
    // `turn_advantages` lists turns in order of first appearance (`Trajectory::turns`).
    let turns = members[me].turns().into_iter().map(|t| t.turn);
    let by_turn: BTreeMap<u32, f64> = turns.zip(per_turn).collect();
    let mut note = format!(
        "the trainer's, advantage = {} from {}, within the {scored} scored member(s) of \
         group {group} stored here",
        estimator(&run.rl)?,
        run.path.display()
    );
    if store.consumed_at(&rec.header.trajectory_id)?.is_none() {
        note.push_str("; never consumed by a trainer, so what it would have been given");
    }
    Ok(Advantages {
        by_turn: Some(by_turn),
        note,
    })
}

/// A trajectory's group as the trainer trains on it.
enum TrainedGroup {
    /// The trajectory is `members[me]`.
    In { members: Vec<Trajectory>, me: usize },
    /// Why the trainer does not train on the trajectory.
    LeftOut(String),
}

/// `rec`'s group as the trainer trains on it: the finished members stored here, in finish
/// order, less second copies of an episode (the collector's rule 4) and what the trainer
/// cannot train on (`Trainer::trainable`). Which members a past update left out as stale
/// depends on the policy version at that update, which the store does not record, so they
/// are counted in. The trainer's vocabulary check is not repeated (replay loads no model).
fn trained_group(store: &TrajectoryStore, rec: &TrajectoryRecord) -> Result<TrainedGroup> {
    let id = &rec.header.trajectory_id;
    let filter = Filter {
        family: Some(rec.header.task.family.clone()),
        level: Some(rec.header.task.level),
        ..Filter::default()
    };
    let mut found: Vec<TrajectoryRecord> = Vec::new();
    for r in store.list(&filter) {
        let r = r?;
        if r.header.group_id == rec.header.group_id && r.footer.is_some() {
            found.push(r);
        }
    }
    found.sort_by_key(|r| r.finish_seq);
    let (found, copies) = group_members(found, |r| r.header.sampling.seed);
    if let Some((_, first)) = copies.iter().find(|(c, _)| &c.header.trajectory_id == id) {
        return Ok(TrainedGroup::LeftOut(format!(
            "none, a second copy of episode {} (same group and sampler seed): the trainer does \
             not train on it",
            found[*first].header.trajectory_id
        )));
    }
    let mut members: Vec<Trajectory> = Vec::new();
    for r in found {
        let Some(footer) = r.footer else {
            continue;
        };
        let steps = stored_steps(store, &r.header.trajectory_id)?;
        let t = Trajectory {
            header: r.header,
            footer,
            steps,
        };
        match check_trainable(&t) {
            Ok(()) => members.push(t),
            Err(e) if &t.header.trajectory_id == id => {
                return Ok(TrainedGroup::LeftOut(format!(
                    "none, the trainer leaves this trajectory out: {e}"
                )))
            }
            Err(_) => {}
        }
    }
    match members.iter().position(|t| &t.header.trajectory_id == id) {
        Some(me) => Ok(TrainedGroup::In { members, me }),
        None => Ok(TrainedGroup::LeftOut(
            "none, the trajectory is not among its group's finished members".into(),
        )),
    }
}

/// How the estimator `c` names computes advantages, with the settings it reads.
fn estimator(c: &RlConfig) -> Result<String> {
    Ok(match c.advantage {
        AdvantageMode::Step => format!(
            "step (gamma {}, process_weight {}, process_clip {}, normalize_step_advantages {}, \
             adv_eps {})",
            c.gamma, c.process_weight, c.process_clip, c.normalize_step_advantages, c.adv_eps
        ),
        AdvantageMode::Grpo | AdvantageMode::DrGrpo | AdvantageMode::Rloo => format!(
            "{} (process_weight {}, process_clip {}, adv_eps {}; one per trajectory, repeated \
             on each turn)",
            serde_json::to_value(c.advantage)?
                .as_str()
                .unwrap_or_default(),
            c.process_weight,
            c.process_clip,
            c.adv_eps
        ),
    })
}
