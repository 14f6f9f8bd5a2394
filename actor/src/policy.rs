//! The policy weights the engine decodes with: a model, its variables and their version.

use corvid_model::checkpoint::{load_weights_from_bytes, policy_to_bytes, rope_in_bytes};
use corvid_model::precision::weight_kind_for;
use corvid_model::{ModelConfig, MoePolicy, RopeScaling};
use sha2::{Digest, Sha256};
use tch::{nn, Device, Kind};

use crate::error::ActorError;

/// A model on one device, with the version of the weights loaded in it.
///
/// tch tensors stay on the thread that uses them: build a `LoadedPolicy` on the engine's
/// thread and hand the engine a `&mut` to it.
#[derive(Debug)]
pub struct LoadedPolicy {
    vs: nn::VarStore,
    model: MoePolicy,
    version: u64,
    /// The model config's own RoPE scaling, for blobs that name none.
    base_rope: RopeScaling,
}

impl LoadedPolicy {
    /// A model with freshly initialised (random) weights, version 0, stored in
    /// [`weight_kind_for`]`(device)`: bf16 on CUDA, fp32 elsewhere, routers always fp32.
    /// Weights loaded later are cast to each variable's dtype, so a CPU actor takes the
    /// bf16 weights a CUDA learner serves.
    pub fn random(cfg: &ModelConfig, device: Device) -> Result<Self, ActorError> {
        Self::random_in(cfg, device, weight_kind_for(device))
    }

    /// [`LoadedPolicy::random`] with the weights stored in `kind` (routers fp32): bf16 on
    /// the CPU is an actor whose numerics differ from an fp32 learner's
    /// (`corvid actor --dtype bf16`).
    pub fn random_in(cfg: &ModelConfig, device: Device, kind: Kind) -> Result<Self, ActorError> {
        let vs = nn::VarStore::new(device);
        let model = MoePolicy::new_in_kind(&vs, cfg, kind)?;
        Ok(Self {
            vs,
            model,
            version: 0,
            base_rope: cfg.rope_scaling,
        })
    }

    /// A model whose weights are the safetensors `bytes` of `version`.
    pub fn from_bytes(
        cfg: &ModelConfig,
        device: Device,
        bytes: &[u8],
        version: u64,
    ) -> Result<Self, ActorError> {
        let mut p = Self::random(cfg, device)?;
        p.load(bytes, version)?;
        Ok(p)
    }

    /// Replaces the weights with the safetensors `bytes` of `version`, under the RoPE scaling
    /// the blob names (a context stage's, [`rope_in_bytes`]) or else the model config's own:
    /// the learner trains each version under the scaling it publishes it with.
    pub fn load(&mut self, bytes: &[u8], version: u64) -> Result<(), ActorError> {
        let rope = rope_in_bytes(bytes)?.unwrap_or(self.base_rope);
        let before = self.model.config().rope_scaling;
        let max_pos = self.model.config().max_position_embeddings;
        if before != rope {
            self.model.extend_context(max_pos, rope)?;
        }
        // Weights and scaling change together or not at all (a refused file changes nothing).
        if let Err(e) = load_weights_from_bytes(&self.vs, bytes) {
            if before != rope {
                self.model.extend_context(max_pos, before)?;
            }
            return Err(e.into());
        }
        if before != rope {
            tracing::info!(
                version,
                ?rope,
                "the policy runs under its context stage's RoPE scaling"
            );
        }
        self.version = version;
        Ok(())
    }

    /// The weights as safetensors bytes (what `FetchPolicy` serves), naming the RoPE scaling
    /// they run under when there is one.
    pub fn to_bytes(&self) -> Result<Vec<u8>, ActorError> {
        Ok(policy_to_bytes(
            &self.vs,
            &self.model.config().rope_scaling,
        )?)
    }

    /// The model.
    pub fn model(&self) -> &MoePolicy {
        &self.model
    }

    /// The variables.
    pub fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }

    /// The version of the loaded weights.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Sets the version label (e.g. of a random policy used as version 1).
    pub fn set_version(&mut self, version: u64) {
        self.version = version;
    }
}

/// Weights fetched from the learner, checked, waiting for the engine to swap them in.
#[derive(Debug, Clone)]
pub struct PolicyUpdate {
    /// Policy version.
    pub version: u64,
    /// Safetensors bytes.
    pub bytes: std::sync::Arc<Vec<u8>>,
}

impl PolicyUpdate {
    /// Checks `bytes` against the announced size and hex SHA-256 before accepting them.
    pub fn verified(
        version: u64,
        bytes: Vec<u8>,
        total_bytes: u64,
        sha256_hex: &str,
    ) -> Result<Self, ActorError> {
        if bytes.len() as u64 != total_bytes {
            return Err(ActorError::Weights {
                version,
                why: format!(
                    "received {} bytes but {total_bytes} were announced",
                    bytes.len()
                ),
            });
        }
        let got = hex::encode(Sha256::digest(&bytes));
        if !got.eq_ignore_ascii_case(sha256_hex) {
            return Err(ActorError::Weights {
                version,
                why: format!("sha256 {got} does not match the announced {sha256_hex}"),
            });
        }
        Ok(Self {
            version,
            bytes: std::sync::Arc::new(bytes),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corvid_model::checkpoint::weights_to_bytes;

    #[test]
    fn checksum_and_size_are_verified() {
        let bytes = b"weights".to_vec();
        let sha = hex::encode(Sha256::digest(&bytes));
        assert!(PolicyUpdate::verified(3, bytes.clone(), 7, &sha).is_ok());
        let err = PolicyUpdate::verified(3, bytes.clone(), 8, &sha).unwrap_err();
        assert!(err.to_string().contains("8 were announced"), "{err}");
        let mut bad = bytes;
        bad[0] ^= 1;
        let err = PolicyUpdate::verified(3, bad, 7, &sha).unwrap_err();
        assert!(err.to_string().contains("does not match"), "{err}");
    }

    #[test]
    fn a_cpu_policy_loads_the_bf16_weights_of_a_cuda_learner() {
        let cfg = ModelConfig {
            num_hidden_layers: 2,
            hidden_size: 64,
            num_attention_heads: 2,
            ..ModelConfig::tiny()
        };
        // What a CUDA learner serves: bf16 weights, fp32 routers (forced here on the CPU).
        let vs = nn::VarStore::new(Device::Cpu);
        let _m = MoePolicy::new_in_kind(&vs, &cfg, tch::Kind::BFloat16).unwrap();
        let bytes = weights_to_bytes(&vs).unwrap();
        let p = LoadedPolicy::from_bytes(&cfg, Device::Cpu, &bytes, 4).unwrap();
        assert_eq!(p.version(), 4);
        let served = vs.variables();
        let mut bf16 = 0;
        for (name, t) in p.var_store().variables() {
            assert_eq!(
                t.kind(),
                tch::Kind::Float,
                "{name}: a CPU actor runs in fp32"
            );
            let src = &served[&name];
            bf16 += usize::from(src.kind() == tch::Kind::BFloat16);
            assert!(t.equal(&src.to_kind(tch::Kind::Float)), "{name}");
        }
        assert!(bf16 > 0);
        // And it serves them back in fp32, loadable as they are.
        let again = LoadedPolicy::from_bytes(&cfg, Device::Cpu, &p.to_bytes().unwrap(), 4).unwrap();
        assert_eq!(again.to_bytes().unwrap(), p.to_bytes().unwrap());
    }

    /// A blob published under a context stage's RoPE scaling decodes under it (the learner's
    /// logits, which differ from the unscaled model's past the first stage's window), and a
    /// later blob without one puts the config's own back.
    #[test]
    fn a_policy_blob_carries_its_context_stage_s_rope_scaling() {
        let cfg = ModelConfig {
            num_hidden_layers: 2,
            hidden_size: 64,
            num_attention_heads: 2,
            max_position_embeddings: 512,
            ..ModelConfig::tiny()
        };
        let yarn = RopeScaling::Yarn {
            factor: 4.0,
            original_max_position_embeddings: 128,
            beta_fast: 32.0,
            beta_slow: 1.0,
        };
        tch::manual_seed(3);
        let vs = nn::VarStore::new(Device::Cpu);
        let mut learner = MoePolicy::new(&vs.root(), &cfg).unwrap();
        learner.extend_context(512, yarn).unwrap();
        let bytes = policy_to_bytes(&vs, &yarn).unwrap();
        assert_eq!(rope_in_bytes(&bytes).unwrap(), Some(yarn));
        let ids = tch::Tensor::arange(400, (Kind::Int64, Device::Cpu))
            .remainder(cfg.vocab_size)
            .view([1, 400]);
        let logits = |m: &MoePolicy| tch::no_grad(|| m.forward(&ids, false).unwrap().logits_btv);
        let gap =
            |a: &MoePolicy, b: &MoePolicy| (logits(a) - logits(b)).abs().max().double_value(&[]);
        let mut actor = LoadedPolicy::from_bytes(&cfg, Device::Cpu, &bytes, 2).unwrap();
        assert_eq!(actor.model().config().rope_scaling, yarn);
        let same = gap(actor.model(), &learner);
        let plain = LoadedPolicy::from_bytes(&cfg, Device::Cpu, &weights_to_bytes(&vs).unwrap(), 2)
            .unwrap();
        let unscaled = gap(plain.model(), &learner);
        assert!(
            same <= 1e-6 && unscaled > 1e3 * same.max(1e-9),
            "{same:e} {unscaled:e}"
        );
        // The actor serves what it runs; a blob naming no scaling is the config's own.
        assert_eq!(
            rope_in_bytes(&actor.to_bytes().unwrap()).unwrap(),
            Some(yarn)
        );
        actor.load(&weights_to_bytes(&vs).unwrap(), 3).unwrap();
        assert_eq!(actor.model().config().rope_scaling, RopeScaling::None);
        assert!(logits(actor.model()).allclose(&logits(plain.model()), 1e-6, 1e-6, false));
    }
}
