//! Versioned policy weights, as the bytes actors fetch.
//!
//! The trainer thread owns the model (tch tensors stay on that thread); after every update
//! it serialises the weights to safetensors bytes and [`PolicyStore::publish`]es them
//! under the new version. The gRPC handlers only ever see these immutable blobs, shared by
//! [`Arc`], so a `FetchPolicy` stream in progress keeps its version alive even after newer
//! versions push it out of the store.
//!
//! The store keeps the newest `keep` versions: an actor that read `PolicyInfo` just before
//! a publish can still fetch the version it was told about.
//!
//! The bytes hold each weight in the learner's dtype (bf16 with fp32 routers on CUDA);
//! [`corvid_model::checkpoint::load_weights_from_bytes`] casts them to the actor's, so an
//! fp32 CPU actor takes a CUDA learner's weights as they are.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use sha2::{Digest, Sha256};
use tokio::sync::watch;

/// The weights of one policy version.
#[derive(Debug)]
pub struct PolicyBlob {
    /// Policy version (1, 2, … ; 0 is never published).
    pub version: u64,
    /// The safetensors bytes.
    pub bytes: Vec<u8>,
    /// Hex SHA-256 of `bytes`.
    pub sha256: String,
}

/// Why a publish was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// Versions must increase.
    #[error("policy version {version} is not above the latest published version {latest}")]
    NotIncreasing {
        /// The version offered.
        version: u64,
        /// The latest version already published.
        latest: u64,
    },
    /// Version 0 means "latest" on the wire and cannot name a blob.
    #[error("policy version 0 is reserved (it means \"the latest\" in FetchPolicy)")]
    Zero,
}

/// The newest policy versions, shared between the trainer and the gRPC handlers.
#[derive(Debug)]
pub struct PolicyStore {
    keep: usize,
    blobs: RwLock<BTreeMap<u64, Arc<PolicyBlob>>>,
    latest_tx: watch::Sender<u64>,
}

impl PolicyStore {
    /// An empty store keeping the newest `keep` versions (at least 1).
    pub fn new(keep: usize) -> Self {
        Self {
            keep: keep.max(1),
            blobs: RwLock::new(BTreeMap::new()),
            latest_tx: watch::channel(0).0,
        }
    }

    /// Stores `bytes` as `version`, hashes them, and drops versions beyond the newest
    /// `keep`. Returns the stored blob.
    pub fn publish(&self, version: u64, bytes: Vec<u8>) -> Result<Arc<PolicyBlob>, PublishError> {
        if version == 0 {
            return Err(PublishError::Zero);
        }
        let sha256 = hex::encode(Sha256::digest(&bytes));
        let blob = Arc::new(PolicyBlob {
            version,
            bytes,
            sha256,
        });
        {
            let mut blobs = self.blobs.write().unwrap_or_else(|p| p.into_inner());
            if let Some((&latest, _)) = blobs.last_key_value() {
                if version <= latest {
                    return Err(PublishError::NotIncreasing { version, latest });
                }
            }
            blobs.insert(version, Arc::clone(&blob));
            while blobs.len() > self.keep {
                blobs.pop_first();
            }
        }
        self.latest_tx.send_replace(version);
        tracing::debug!(version, bytes = blob.bytes.len(), sha256 = %blob.sha256, "policy published");
        Ok(blob)
    }

    /// The newest version, if any was published.
    pub fn latest(&self) -> Option<Arc<PolicyBlob>> {
        let blobs = self.blobs.read().unwrap_or_else(|p| p.into_inner());
        blobs.last_key_value().map(|(_, b)| Arc::clone(b))
    }

    /// The newest version number (0 when none was published).
    pub fn latest_version(&self) -> u64 {
        *self.latest_tx.borrow()
    }

    /// Version `version`, if it is still kept.
    pub fn get(&self, version: u64) -> Option<Arc<PolicyBlob>> {
        let blobs = self.blobs.read().unwrap_or_else(|p| p.into_inner());
        blobs.get(&version).cloned()
    }

    /// The versions kept, oldest first.
    pub fn versions(&self) -> Vec<u64> {
        let blobs = self.blobs.read().unwrap_or_else(|p| p.into_inner());
        blobs.keys().copied().collect()
    }

    /// A receiver that sees every new latest version.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.latest_tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_versions_and_hashes_each() {
        let s = PolicyStore::new(2);
        assert!(s.latest().is_none());
        assert_eq!(s.latest_version(), 0);
        for v in 1..=3 {
            s.publish(v, vec![v as u8; 10]).unwrap();
        }
        assert_eq!(s.versions(), vec![2, 3]);
        assert!(s.get(1).is_none());
        let latest = s.latest().unwrap();
        assert_eq!((latest.version, s.latest_version()), (3, 3));
        assert_eq!(latest.sha256, hex::encode(Sha256::digest([3u8; 10])));
        assert_eq!(
            s.publish(3, vec![]).unwrap_err(),
            PublishError::NotIncreasing {
                version: 3,
                latest: 3
            }
        );
        assert_eq!(s.publish(0, vec![]).unwrap_err(), PublishError::Zero);
    }

    #[test]
    fn a_fetch_in_progress_keeps_its_version_alive() {
        let s = PolicyStore::new(1);
        s.publish(1, b"one".to_vec()).unwrap();
        let held = s.get(1).unwrap();
        s.publish(2, b"two".to_vec()).unwrap();
        assert!(s.get(1).is_none());
        assert_eq!(held.bytes, b"one");
    }
}
