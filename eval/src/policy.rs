//! The policy an evaluation runs: a checkpoint folder or a fresh random initialisation,
//! loaded on the CPU, with a fingerprint of its weights.
//!
//! The fingerprint goes into every stored episode's `actor_id` (`eval@<16 hex digits>`), so
//! a later evaluation under the same label can tell whether the stored episodes were written
//! by these weights: policy version 0 is both a random initialisation and an SFT reference,
//! and the version alone cannot tell them apart.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use corvid_actor::LoadedPolicy;
use corvid_model::{checkpoint, ModelConfig};

/// Which weights to evaluate.
#[derive(Debug, Clone, PartialEq)]
pub enum PolicySource {
    /// A checkpoint folder holding `model.safetensors` and `config.json`: a run checkpoint
    /// (`runs/<name>/ckpt/<n>`), the SFT reference (`runs/<name>/ref`), `corvid model`
    /// output, or a Hugging Face checkpoint of a family Corvid loads.
    Checkpoint {
        /// The folder.
        dir: PathBuf,
        /// The policy version its weights are, recorded in every episode's header: a run
        /// checkpoint's `state.json` names it; a policy folder has none and is version 0.
        policy_version: u64,
    },
    /// A freshly initialised policy (the "random" baseline).
    RandomInit {
        /// Model preset name (see [`ModelConfig::preset`]).
        preset: String,
        /// A model config JSON file, used instead of the preset when given.
        config: Option<PathBuf>,
    },
}

/// A loaded policy and what identifies it.
pub(crate) struct EvalPolicy {
    pub loaded: LoadedPolicy,
    /// The checkpoint folder, or `random-init`.
    pub source: String,
    /// [`weights_fingerprint`] of its model config and weights.
    pub fingerprint: u64,
}

impl EvalPolicy {
    /// Loads `source` on the CPU, checking that a checkpoint folder holds both its files.
    pub fn load(source: &PolicySource) -> Result<Self> {
        let device = tch::Device::Cpu;
        match source {
            PolicySource::RandomInit { preset, config } => {
                let cfg = match config {
                    Some(p) => {
                        let text = std::fs::read_to_string(p)
                            .with_context(|| format!("reading {}", p.display()))?;
                        serde_json::from_str::<ModelConfig>(&text)
                            .with_context(|| format!("{} is not a model config", p.display()))?
                    }
                    None => ModelConfig::preset(preset)?,
                };
                cfg.validate()?;
                let loaded = LoadedPolicy::random(&cfg, device)?;
                let bytes = loaded
                    .to_bytes()
                    .context("reading back the random initialisation")?;
                Ok(Self {
                    fingerprint: weights_fingerprint(&cfg, &bytes),
                    loaded,
                    source: "random-init".into(),
                })
            }
            PolicySource::Checkpoint {
                dir,
                policy_version,
            } => {
                let weights = [checkpoint::WEIGHTS_FILE, checkpoint::WEIGHTS_INDEX_FILE];
                let missing: Vec<&str> = [checkpoint::CONFIG_FILE, checkpoint::WEIGHTS_FILE]
                    .into_iter()
                    .filter(|f| match *f {
                        checkpoint::WEIGHTS_FILE => weights.iter().all(|w| !dir.join(w).is_file()),
                        f => !dir.join(f).is_file(),
                    })
                    .collect();
                if !missing.is_empty() {
                    bail!(
                        "--checkpoint {} is not a checkpoint folder: it has no {} (a checkpoint \
                         holds {} and {}: a run's ref/ or ckpt/<n>, or `corvid model` output)",
                        dir.display(),
                        missing.join(" and no "),
                        checkpoint::CONFIG_FILE,
                        checkpoint::WEIGHTS_FILE
                    );
                }
                // Any model folder: a Corvid policy folder, or a Hugging Face checkpoint (its
                // `config.json` names a `model_type`), read through the architecture adapters.
                let opened = corvid_model::arch::open(dir, device)
                    .with_context(|| format!("opening checkpoint {}", dir.display()))?;
                let cfg = opened.model.config().clone();
                let bytes = checkpoint::weights_to_bytes(&opened.vs)
                    .with_context(|| format!("reading the weights of {}", dir.display()))?;
                let loaded = LoadedPolicy::from_bytes(&cfg, device, &bytes, *policy_version)
                    .with_context(|| format!("loading the weights of {}", dir.display()))?;
                Ok(Self {
                    fingerprint: weights_fingerprint(&cfg, &bytes),
                    loaded,
                    source: dir.display().to_string(),
                })
            }
        }
    }

    /// The `actor_id` recorded in the header of every episode these weights write:
    /// `eval@<16 hex digits of the fingerprint>`.
    pub fn actor_id(&self) -> String {
        format!("eval@{:016x}", self.fingerprint)
    }
}

/// A 64-bit FNV-1a hash of `cfg` (as JSON) and `weights`: it identifies a policy's weights,
/// stably across builds (unlike `std`'s hasher), so episodes stored by one evaluation can be
/// recognised by the next.
fn weights_fingerprint(cfg: &ModelConfig, weights: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let config = serde_json::to_vec(cfg).unwrap_or_default();
    let len = (config.len() as u64).to_le_bytes();
    let mut h = OFFSET;
    for &b in len.iter().chain(&config).chain(weights) {
        h ^= u64::from(b);
        h = h.wrapping_mul(PRIME);
    }
    h
}
