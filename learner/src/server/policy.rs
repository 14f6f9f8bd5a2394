//! `PolicyInfo` and `FetchPolicy`: the weights of a policy version, streamed in chunks.
//!
//! Every chunk carries the version, its byte offset, the blob's total size and the hex
//! SHA-256 of the *whole* blob, so the actor can check what it assembled. The stream is a
//! spawned task feeding a bounded channel: memory stays at a few chunks per stream, and a
//! vanished actor is noticed when a send fails.

use std::sync::Arc;

use corvid_proto::limits::POLICY_CHUNK_BYTES;
use corvid_proto::pb;
use tonic::Status;

use super::PolicyStream;
use crate::policy_store::{PolicyBlob, PolicyStore};

/// Chunks buffered per stream ahead of the network.
const CHUNKS_IN_FLIGHT: usize = 4;

fn none_yet() -> Status {
    Status::unavailable("no policy version has been published yet; ask again shortly")
}

/// The answer to `PolicyInfo`.
pub(super) fn info(policies: &PolicyStore) -> Result<pb::PolicyInfoResponse, Status> {
    let blob = policies.latest().ok_or_else(none_yet)?;
    Ok(pb::PolicyInfoResponse {
        version: blob.version,
        total_bytes: blob.bytes.len() as u64,
        sha256: blob.sha256.clone(),
    })
}

/// The blob `FetchPolicy` asks for: 0 is the latest.
fn lookup(policies: &PolicyStore, version: u64) -> Result<Arc<PolicyBlob>, Status> {
    if version == 0 {
        return policies.latest().ok_or_else(none_yet);
    }
    policies.get(version).ok_or_else(|| {
        let kept = policies.versions();
        if kept.is_empty() {
            none_yet()
        } else {
            Status::not_found(format!(
                "policy version {version} is not kept; kept versions: {kept:?}; ask for 0 to get the latest"
            ))
        }
    })
}

/// The chunks of `blob`: offsets 0, c, 2c, …; the last one has `last = true`. An empty blob
/// is one empty, last chunk.
pub fn chunks(blob: &PolicyBlob, chunk_bytes: usize) -> impl Iterator<Item = pb::PolicyChunk> + '_ {
    let total = blob.bytes.len();
    let n = total.div_ceil(chunk_bytes).max(1);
    (0..n).map(move |i| {
        let start = i * chunk_bytes;
        let end = (start + chunk_bytes).min(total);
        pb::PolicyChunk {
            version: blob.version,
            offset: start as u64,
            data: blob.bytes[start..end].to_vec(),
            total_bytes: total as u64,
            sha256: blob.sha256.clone(),
            last: i + 1 == n,
        }
    })
}

/// The answer to `FetchPolicy`: a stream of chunks of the requested version.
pub(super) fn fetch(policies: &PolicyStore, version: u64) -> Result<PolicyStream, Status> {
    let blob = lookup(policies, version)?;
    let (tx, rx) = tokio::sync::mpsc::channel(CHUNKS_IN_FLIGHT);
    tokio::spawn(async move {
        for chunk in chunks(&blob, POLICY_CHUNK_BYTES) {
            if tx.send(Ok(chunk)).await.is_err() {
                tracing::debug!(
                    version = blob.version,
                    "policy fetch abandoned by the client"
                );
                return;
            }
        }
    });
    Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_blob_in_order_and_mark_the_last() {
        let store = PolicyStore::new(2);
        let blob = store
            .publish(3, (0..=255u8).cycle().take(1000).collect())
            .unwrap();
        let got: Vec<_> = chunks(&blob, 300).collect();
        assert_eq!(got.len(), 4);
        assert_eq!(
            got.iter().map(|c| c.offset).collect::<Vec<_>>(),
            vec![0, 300, 600, 900]
        );
        assert_eq!(
            got.iter().map(|c| c.last).collect::<Vec<_>>(),
            vec![false, false, false, true]
        );
        let joined: Vec<u8> = got.iter().flat_map(|c| c.data.clone()).collect();
        assert_eq!(joined, blob.bytes);
        assert!(got
            .iter()
            .all(|c| c.sha256 == blob.sha256 && c.total_bytes == 1000));

        let empty = store.publish(4, Vec::new()).unwrap();
        let got: Vec<_> = chunks(&empty, 300).collect();
        assert_eq!(got.len(), 1);
        assert!(got[0].last && got[0].data.is_empty());
    }

    #[test]
    fn unknown_versions_are_not_found_and_an_empty_store_is_unavailable() {
        let store = PolicyStore::new(1);
        assert_eq!(
            lookup(&store, 0).unwrap_err().code(),
            tonic::Code::Unavailable
        );
        store.publish(1, vec![1]).unwrap();
        store.publish(2, vec![2]).unwrap();
        let err = lookup(&store, 1).unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound);
        assert!(err.message().contains("[2]"), "{}", err.message());
        assert_eq!(lookup(&store, 0).unwrap().version, 2);
    }
}
