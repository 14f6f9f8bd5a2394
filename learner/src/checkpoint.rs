//! Run checkpoints: everything a learner needs to continue exactly where it stopped.
//!
//! # Guarantees
//!
//! 1. **A checkpoint is whole or absent.** It is written into a hidden temporary folder
//!    (`ckpt/.tmp-<seq>-<pid>`), every file is fsynced, the folder is fsynced, then it is
//!    renamed to `ckpt/<seq>` and `ckpt/` is fsynced. A crash at any point leaves either
//!    the complete new checkpoint or none of it; [`CheckpointDir::open`] deletes leftover
//!    temporary folders.
//! 2. **The newest complete checkpoint wins.** [`CheckpointDir::latest`] is the highest
//!    `<seq>` folder; only the newest `keep` are kept.
//! 3. **Resume is exact.** Together with the trajectory store (whose acked trajectories are
//!    durable on their own), a checkpoint fixes every input of the next update: weights,
//!    optimizer moments and step, curriculum windows and RNG, the dispenser's RNG and open
//!    groups, the learner's RNG, the store cursor and the trajectories read past it but not
//!    yet trained on, the update step and the policy version.
//!
//! # Layout of `ckpt/<seq>/`
//!
//! | file | content |
//! |---|---|
//! | `model.safetensors`, `config.json` | the policy ([`corvid_model::checkpoint`] format) |
//! | `optimizer.safetensors` | the active optimizer's moments, the fp32 master weights of its bf16 parameters, and step (`AdamW::state_tensors`) |
//! | `curriculum.json` | [`Curriculum::save`] |
//! | `state.json` | [`RunState`]: counters, cursor, RNG, dispenser, spike detector, reference path |
//!
//! The frozen reference policy (the SFT result) lives in `ref/` beside `ckpt/`, written once,
//! and `state.json` names it.
//!
//! Weights are written in their own dtype (bf16 with fp32 routers from a CUDA learner, fp32
//! from a CPU one); loading casts each tensor to the dtype of the variable it fills, so a
//! checkpoint loads on any device. The exact fp32 values of bf16 weights are the optimizer's
//! master weights: a bf16 run resumes from them bit for bit, and a bf16 run resumed in fp32
//! takes them as its weights ([`crate::train::optim`]).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use corvid_tasks::{Curriculum, SplitMix64};
use serde::{Deserialize, Serialize};
use tch::{nn, Tensor};

use crate::collect::TakenGroup;
use crate::dispenser::DispenserState;
use crate::metrics::SpikeDetector;
use corvid_model::checkpoint::{load_weights_from_bytes, save, CONFIG_FILE, WEIGHTS_FILE};
use corvid_model::{ModelConfig, ModelError};

/// Optimizer state file inside a checkpoint.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// Curriculum state file.
pub const CURRICULUM_FILE: &str = "curriculum.json";
/// Learner state file.
pub const STATE_FILE: &str = "state.json";
/// Version of the [`RunState`] layout.
pub const STATE_FORMAT: u32 = 1;

/// Everything that can go wrong writing or reading a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file operation failed.
    #[error("checkpoint {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The model or its weights failed.
    #[error("checkpoint model: {0}")]
    Model(#[from] ModelError),
    /// libtorch failed on the optimizer state.
    #[error("checkpoint optimizer state: {0}")]
    Torch(#[from] tch::TchError),
    /// A JSON file does not decode or has the wrong format.
    #[error("checkpoint {path}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The training stage a checkpoint was taken in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Supervised fine-tuning, not finished.
    Sft,
    /// Policy optimisation (SFT finished or skipped).
    Rl,
}

/// Running totals carried across restarts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Totals {
    /// Finished trajectories read from the store.
    pub trajectories_read: u64,
    /// Episodes trained on.
    pub episodes_trained: u64,
    /// Generated tokens trained on.
    pub tokens_trained: u64,
    /// Episodes skipped as too stale.
    pub stale_skipped: u64,
    /// Episodes skipped as unscored (infra error, abandoned).
    pub unscored_skipped: u64,
    /// Second copies of episodes, stored but not trained on (collector, rule 4).
    pub copies_skipped: u64,
    /// Episodes of groups given up before they were complete.
    pub incomplete_dropped: u64,
    /// Batches consumed without an update: none of their episodes was scored.
    pub batches_skipped: u64,
}

/// Where training stands: two checkpoints at one position hold the same weights and
/// optimizer state.
type Position = (Stage, u64, u64, u64);

fn position_of(s: &RunState) -> Position {
    (s.stage, s.sft_step, s.rl_step, s.policy_version)
}

/// The learner's own state (`state.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    /// [`STATE_FORMAT`].
    pub format: u32,
    /// Sequence number of the checkpoint (its folder name).
    pub seq: u64,
    /// Stage at the time of the checkpoint.
    pub stage: Stage,
    /// SFT optimizer steps done.
    pub sft_step: u64,
    /// Trained-on SFT tokens seen (the SFT token budget counts them).
    #[serde(default)]
    pub sft_tokens: u64,
    /// The latest SFT held-out loss (`sft.heldout_loss_target` compares it).
    #[serde(default)]
    pub sft_heldout_loss: Option<f64>,
    /// RL updates done.
    pub rl_step: u64,
    /// Latest published policy version (the weights in this checkpoint are this version).
    pub policy_version: u64,
    /// Store position up to which trajectories have been read.
    pub read_cursor: u64,
    /// Trajectories read (position ≤ `read_cursor`) but not yet trained on, by id.
    pub pending: Vec<String>,
    /// Groups recently taken for training, whose late second copies are skipped (collector,
    /// rule 4; absent in checkpoints written before it existed).
    #[serde(default)]
    pub taken_groups: Vec<TakenGroup>,
    /// The learner's RNG (seeds libtorch before each update).
    pub rng: SplitMix64,
    /// The task dispenser.
    pub dispenser: DispenserState,
    /// The loss-spike rule.
    pub spikes: SpikeDetector,
    /// Totals.
    pub totals: Totals,
    /// Folder of the frozen reference policy (the SFT result), if written.
    pub reference_policy: Option<PathBuf>,
    /// Wall clock at save, ms since the Unix epoch.
    pub saved_unix_ms: u64,
}

/// What [`CheckpointDir::save`] writes.
pub struct Snapshot<'a> {
    /// The policy's variables.
    pub vs: &'a nn::VarStore,
    /// Its config.
    pub model_config: &'a ModelConfig,
    /// The active optimizer's state (`AdamW::state_tensors`).
    pub optimizer: Vec<(String, Tensor)>,
    /// The curriculum.
    pub curriculum: &'a Curriculum,
    /// The learner's state; its `seq` is set by `save`.
    pub state: RunState,
    /// The Hugging Face files the run started from, copied into the checkpoint
    /// ([`write_policy`]).
    pub hf_origin: Option<&'a Path>,
}

/// A checkpoint read back.
#[derive(Debug)]
pub struct Restored {
    /// Its folder.
    pub dir: PathBuf,
    /// The model config.
    pub model_config: ModelConfig,
    /// The safetensors bytes of the weights.
    pub weights: Vec<u8>,
    /// The optimizer's state tensors.
    pub optimizer: Vec<(String, Tensor)>,
    /// The curriculum.
    pub curriculum: Curriculum,
    /// The learner's state.
    pub state: RunState,
}

impl Restored {
    /// Copies the weights into `vs` (whose model was built from [`Restored::model_config`]).
    pub fn load_weights(&self, vs: &nn::VarStore) -> Result<(), CheckpointError> {
        load_weights_from_bytes(vs, &self.weights).map_err(|e| CheckpointError::Corrupt {
            path: self.dir.join(WEIGHTS_FILE),
            reason: e.to_string(),
        })
    }
}

/// Writes `bytes` to the new file `path` and fsyncs it (the folder is fsynced once all its
/// files are written).
fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let mut f = File::create(path).map_err(io(path))?;
    f.write_all(bytes).map_err(io(path))?;
    f.sync_all().map_err(io(path))
}

/// Fsyncs a folder, so the names in it are durable.
pub fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    corvid_durable::sync_dir(dir).map_err(io(dir))
}

/// Writes a policy folder (`model.safetensors`, `config.json`), every file fsynced
/// ([`corvid_model::checkpoint::save`]); with `hf_origin` (a run started from a Hugging Face
/// folder), also its config and tokenizer files in the policy's
/// [`ORIGIN_DIR`](corvid_model::arch::ORIGIN_DIR), so the policy exports to that architecture.
pub fn write_policy(
    dir: &Path,
    vs: &nn::VarStore,
    cfg: &ModelConfig,
    hf_origin: Option<&Path>,
) -> Result<(), CheckpointError> {
    save(vs, cfg, dir)?;
    if let Some(origin) = hf_origin {
        corvid_model::arch::copy_origin(origin, &dir.join(corvid_model::arch::ORIGIN_DIR))?;
    }
    Ok(())
}

/// The learner's state of the checkpoint in `dir` (`state.json`), or `None` for a folder
/// without one, such as a policy folder written by [`write_policy`] (`ref/`). Reads only the
/// small state file, for tools that want a checkpoint's counters without its tensors.
pub fn read_state(dir: &Path) -> Result<Option<RunState>, CheckpointError> {
    let path = dir.join(STATE_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => parse_state(&path, &bytes).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(&path)(e)),
    }
}

/// Parses `state.json` read from `path`, refusing another [`STATE_FORMAT`].
fn parse_state(path: &Path, bytes: &[u8]) -> Result<RunState, CheckpointError> {
    let corrupt = |reason: String| CheckpointError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let state: RunState = serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
    if state.format != STATE_FORMAT {
        return Err(corrupt(format!(
            "format {} but this learner reads format {STATE_FORMAT}",
            state.format
        )));
    }
    Ok(state)
}

/// The `ckpt/` folder of a run.
#[derive(Debug, Clone)]
pub struct CheckpointDir {
    root: PathBuf,
    keep: usize,
}

fn seq_of(name: &str) -> Option<u64> {
    if name.len() == 8 && name.bytes().all(|b| b.is_ascii_digit()) {
        name.parse().ok()
    } else {
        None
    }
}

impl CheckpointDir {
    /// Opens (creating) `root`, keeping the newest `keep` checkpoints, and removes temporary
    /// folders left by a crash mid-save.
    pub fn open(root: impl Into<PathBuf>, keep: usize) -> Result<Self, CheckpointError> {
        let root = root.into();
        std::fs::create_dir_all(&root).map_err(io(&root))?;
        for entry in std::fs::read_dir(&root).map_err(io(&root))? {
            let entry = entry.map_err(io(&root))?;
            if entry.file_name().to_string_lossy().starts_with(".tmp-") {
                let p = entry.path();
                tracing::warn!(path = %p.display(), "removing a checkpoint left half-written by a crash");
                std::fs::remove_dir_all(&p).map_err(io(&p))?;
            }
        }
        Ok(Self {
            root,
            keep: keep.max(1),
        })
    }

    /// The folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Complete checkpoints, oldest first, as (seq, folder).
    pub fn list(&self) -> Result<Vec<(u64, PathBuf)>, CheckpointError> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.root).map_err(io(&self.root))? {
            let entry = entry.map_err(io(&self.root))?;
            if let Some(seq) = seq_of(&entry.file_name().to_string_lossy()) {
                out.push((seq, entry.path()));
            }
        }
        out.sort();
        Ok(out)
    }

    /// The training position recorded in checkpoint `dir`, or `None` if its state cannot be
    /// read (then it is never treated as superseded).
    fn position(dir: &Path) -> Option<Position> {
        let bytes = std::fs::read(dir.join(STATE_FILE)).ok()?;
        let state: RunState = serde_json::from_slice(&bytes).ok()?;
        Some(position_of(&state))
    }

    /// The newest complete checkpoint.
    pub fn latest(&self) -> Result<Option<PathBuf>, CheckpointError> {
        Ok(self.list()?.pop().map(|(_, p)| p))
    }

    /// Writes `snap` atomically as the next checkpoint and prunes old ones. Returns its folder.
    ///
    /// A previous newest checkpoint at the same training position (stage, SFT and RL step,
    /// policy version: the same weights and optimizer state) is removed once the new one is
    /// in place, so a stop right after a periodic checkpoint does not push a distinct, older
    /// policy out of the `keep` newest. The new one has the later service state (read cursor,
    /// pending trajectories, dispenser).
    pub fn save(&self, mut snap: Snapshot<'_>) -> Result<PathBuf, CheckpointError> {
        let before = self.list()?;
        let superseded = before
            .last()
            .filter(|(_, prev)| Self::position(prev) == Some(position_of(&snap.state)))
            .map(|(_, prev)| prev.clone());
        let seq = before.last().map_or(1, |(s, _)| s + 1);
        snap.state.seq = seq;
        snap.state.format = STATE_FORMAT;
        let tmp = self
            .root
            .join(format!(".tmp-{seq:08}-{}", std::process::id()));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
        }
        write_policy(&tmp, snap.vs, snap.model_config, snap.hf_origin)?;
        let opt = tmp.join(OPTIMIZER_FILE);
        Tensor::write_safetensors(&snap.optimizer, &opt)?;
        File::open(&opt)
            .and_then(|f| f.sync_all())
            .map_err(io(&opt))?;
        write_synced(
            &tmp.join(CURRICULUM_FILE),
            snap.curriculum.save().as_bytes(),
        )?;
        let state =
            serde_json::to_vec_pretty(&snap.state).map_err(|e| CheckpointError::Corrupt {
                path: tmp.join(STATE_FILE),
                reason: e.to_string(),
            })?;
        write_synced(&tmp.join(STATE_FILE), &state)?;
        sync_dir(&tmp)?;
        let dest = self.root.join(format!("{seq:08}"));
        std::fs::rename(&tmp, &dest).map_err(io(&dest))?;
        sync_dir(&self.root)?;
        if let Some(prev) = superseded {
            // Out of the numbered set first (a crash mid-delete leaves a `.tmp-` folder, which
            // `open` sweeps); the new checkpoint is already in place, so a failure only warns.
            let name = prev.file_name().unwrap_or_default().to_string_lossy();
            let gone = self.root.join(format!(".tmp-superseded-{name}"));
            if let Err(e) =
                std::fs::rename(&prev, &gone).and_then(|()| std::fs::remove_dir_all(&gone))
            {
                tracing::warn!(path = %prev.display(), error = %e, "removing a superseded checkpoint failed");
            }
        }
        let all = self.list()?;
        if all.len() > self.keep {
            for (_, old) in &all[..all.len() - self.keep] {
                std::fs::remove_dir_all(old).map_err(io(old))?;
            }
        }
        tracing::info!(
            path = %dest.display(),
            stage = ?snap.state.stage,
            rl_step = snap.state.rl_step,
            policy_version = snap.state.policy_version,
            cursor = snap.state.read_cursor,
            "checkpoint written"
        );
        Ok(dest)
    }

    /// Reads the checkpoint in `dir`.
    pub fn load(dir: &Path) -> Result<Restored, CheckpointError> {
        let read = |name: &str| {
            let p = dir.join(name);
            std::fs::read(&p).map_err(io(&p))
        };
        let corrupt = |name: &str, reason: String| CheckpointError::Corrupt {
            path: dir.join(name),
            reason,
        };
        let model_config: ModelConfig = serde_json::from_slice(&read(CONFIG_FILE)?)
            .map_err(|e| corrupt(CONFIG_FILE, e.to_string()))?;
        model_config
            .validate()
            .map_err(|e| corrupt(CONFIG_FILE, e.to_string()))?;
        let weights = read(WEIGHTS_FILE)?;
        let optimizer = Tensor::read_safetensors(dir.join(OPTIMIZER_FILE))?;
        let curriculum_text = String::from_utf8(read(CURRICULUM_FILE)?)
            .map_err(|e| corrupt(CURRICULUM_FILE, e.to_string()))?;
        let curriculum = Curriculum::load(&curriculum_text)
            .map_err(|e| corrupt(CURRICULUM_FILE, e.to_string()))?;
        let state = parse_state(&dir.join(STATE_FILE), &read(STATE_FILE)?)?;
        Ok(Restored {
            dir: dir.to_path_buf(),
            model_config,
            weights,
            optimizer,
            curriculum,
            state,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corvid_tasks::CurriculumConfig;

    fn state() -> RunState {
        RunState {
            format: STATE_FORMAT,
            seq: 0,
            stage: Stage::Rl,
            sft_step: 5,
            sft_tokens: 100,
            sft_heldout_loss: None,
            rl_step: 3,
            policy_version: 4,
            read_cursor: 17,
            pending: vec!["a".into()],
            taken_groups: vec![TakenGroup {
                group_id: "g1".into(),
                seeds: vec![3, 4],
            }],
            rng: SplitMix64::new(9),
            dispenser: DispenserState::new(1),
            spikes: SpikeDetector::new(4.0, 10, 3),
            totals: Totals::default(),
            reference_policy: None,
            saved_unix_ms: 0,
        }
    }

    #[test]
    fn save_load_round_trips_and_keeps_the_newest() {
        tch::set_num_threads(1);
        let dir = tempfile::tempdir().unwrap();
        let cfg = ModelConfig {
            num_hidden_layers: 1,
            hidden_size: 32,
            num_attention_heads: 2,
            ..ModelConfig::tiny()
        };
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let _m = corvid_model::MoePolicy::new(&vs.root(), &cfg).unwrap();
        let cur = Curriculum::new(CurriculumConfig::default(), &[("hops", 3)], 2).unwrap();
        // A leftover of a crash mid-save is removed on open.
        std::fs::create_dir_all(dir.path().join(".tmp-00000009-1")).unwrap();
        let ck = CheckpointDir::open(dir.path(), 2).unwrap();
        assert!(!dir.path().join(".tmp-00000009-1").exists());
        for i in 0..3 {
            let mut st = state();
            st.rl_step = i;
            ck.save(Snapshot {
                vs: &vs,
                model_config: &cfg,
                optimizer: vec![("step".into(), Tensor::from_slice(&[i as i64]))],
                curriculum: &cur,
                state: st,
                hf_origin: None,
            })
            .unwrap();
        }
        let seqs: Vec<u64> = ck.list().unwrap().into_iter().map(|(s, _)| s).collect();
        assert_eq!(seqs, vec![2, 3]);
        let r = CheckpointDir::load(&ck.latest().unwrap().unwrap()).unwrap();
        assert_eq!(r.state.seq, 3);
        assert_eq!(r.state.rl_step, 2);
        assert_eq!(r.model_config, cfg);
        assert_eq!(r.curriculum, cur);
        assert_eq!(r.weights, corvid_model::weights_to_bytes(&vs).unwrap());
        assert_eq!(r.optimizer[0].1.int64_value(&[0]), 2);
        let mut expect = state();
        expect.seq = 3;
        expect.rl_step = 2;
        assert_eq!(r.state, expect);

        // A stop right after a periodic checkpoint: same step, later read cursor. It replaces
        // that checkpoint instead of pushing the older step out.
        let mut st = state();
        st.rl_step = 2;
        st.read_cursor = 99;
        ck.save(Snapshot {
            vs: &vs,
            model_config: &cfg,
            optimizer: vec![("step".into(), Tensor::from_slice(&[2i64]))],
            curriculum: &cur,
            state: st,
            hf_origin: None,
        })
        .unwrap();
        let kept: Vec<(u64, u64)> = ck
            .list()
            .unwrap()
            .into_iter()
            .map(|(s, p)| (s, CheckpointDir::load(&p).unwrap().state.rl_step))
            .collect();
        assert_eq!(kept, vec![(2, 1), (4, 2)]);
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".tmp-"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        let r = CheckpointDir::load(&ck.latest().unwrap().unwrap()).unwrap();
        assert_eq!(r.state.read_cursor, 99);
    }

    #[test]
    fn read_state_reads_a_checkpoint_and_finds_none_in_a_policy_folder() {
        let dir = tempfile::tempdir().unwrap();
        let ckpt = dir.path().join("00000001");
        std::fs::create_dir_all(&ckpt).unwrap();
        // A policy folder (`ref/`, an export) has no state.
        assert_eq!(read_state(&ckpt).unwrap(), None);
        let st = state();
        let path = ckpt.join(STATE_FILE);
        std::fs::write(&path, serde_json::to_vec(&st).unwrap()).unwrap();
        assert_eq!(read_state(&ckpt).unwrap(), Some(st.clone()));
        // A state written before the collector remembered taken groups still reads.
        let mut older = serde_json::to_value(&st).unwrap();
        older.as_object_mut().unwrap().remove("taken_groups");
        std::fs::write(&path, serde_json::to_vec(&older).unwrap()).unwrap();
        let read = read_state(&ckpt).unwrap().unwrap();
        assert!(read.taken_groups.is_empty());
        assert_eq!(read.pending, st.pending);
        // Another format and bad JSON are refused, naming the file.
        let other = RunState {
            format: STATE_FORMAT + 1,
            ..st
        };
        std::fs::write(&path, serde_json::to_vec(&other).unwrap()).unwrap();
        let e = read_state(&ckpt).unwrap_err().to_string();
        assert!(e.contains("state.json") && e.contains("format"), "{e}");
        std::fs::write(&path, b"{ not json").unwrap();
        let e = read_state(&ckpt).unwrap_err().to_string();
        assert!(e.contains("state.json"), "{e}");
    }
}
