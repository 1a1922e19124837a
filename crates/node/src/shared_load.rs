//! The node as a reader of the cluster's shared G4 (docs/cluster.md, "A
//! shared G4"): a session's `Load` of blocks its `Lookup` located there
//! reserves G2 slots, reads each block's object from the store, verified
//! against the block's shared key and the sums in the object's header
//! (kvtier-remote's [`ObjectBlocks`]), copies it into its slot, sums it
//! under this node's key and commits it as any client-filled block. A
//! block that does not come (missing, corrupt, late, no room) ends the
//! prefix there. The node never deletes a shared object, corrupt or not:
//! they are the metadata service's.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use kvtier_core::{BlockHash, BlockSums, layer_checksums};
use kvtier_manager::manager::{BlockManager, HostReservation};
use kvtier_remote::{ObjectBlocks, RemoteRead};

use crate::observer::SharedLocation;
use crate::peer_load::{Fetched, commit_prefix, reserve_prefix};

/// Objects read at once.
const CONCURRENCY: usize = 8;

/// How the node reads the shared G4: its store and how long one `Load`
/// waits for it. Installed by `kvtier serve`
/// ([`Node::set_shared_reader`](crate::Node::set_shared_reader)).
#[derive(Debug)]
pub struct SharedReader {
    blocks: ObjectBlocks,
    timeout: Duration,
}

impl SharedReader {
    /// A reader of `blocks` whose reads of one `Load` end after `timeout`.
    pub fn new(blocks: ObjectBlocks, timeout: Duration) -> Self {
        Self { blocks, timeout }
    }
}

/// Brings the prefix of `wanted` (this node's stored key of each block and
/// where the shared G4 holds it) that the store answers verified into G2
/// by `reader`'s deadline.
pub(crate) async fn fetch(
    manager: &BlockManager,
    reader: &SharedReader,
    wanted: &[(BlockHash, SharedLocation)],
) -> Fetched {
    let keys: Vec<BlockHash> = wanted.iter().map(|(k, _)| *k).collect();
    let slots = reserve_prefix(manager, &keys, "the shared G4").await;
    let reads = tokio::time::timeout(reader.timeout, read_all(reader, &wanted[..slots.len()]))
        .await
        .unwrap_or_default();
    let layer_bytes = manager.geometry().layer_bytes() as usize;
    let landed: Vec<(HostReservation, SharedLocation, Bytes, BlockSums)> = slots
        .into_iter()
        .zip(wanted)
        .zip(reads)
        .map_while(|((slot, (_, l)), read)| match read {
            RemoteRead::Hit { bytes, sums } => Some((slot, l.clone(), bytes, sums)),
            _ => None,
        })
        .collect();
    let filled = tokio::task::spawn_blocking(move || {
        landed
            .into_iter()
            .map_while(|(mut slot, l, bytes, sums)| {
                let own = land(slot.key(), slot.bytes_mut(), &bytes, &l, &sums, layer_bytes)?;
                Some((slot, own))
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    commit_prefix(manager, filled).await
}

/// Reads the objects of `wanted`, in order: stops at the first that is
/// not a verified hit (the rest would not be used).
async fn read_all(
    reader: &SharedReader,
    wanted: &[(BlockHash, SharedLocation)],
) -> Vec<RemoteRead> {
    // Indices, not references, flow through the stream (a closure over
    // borrowed items makes the session's future not `Send`).
    let mut reads = futures::stream::iter(0..wanted.len())
        .map(|i| read_one(reader, wanted[i].1.clone()))
        .buffered(CONCURRENCY);
    let mut out = Vec::new();
    while let Some(r) = reads.next().await {
        if !r.is_hit() {
            break;
        }
        out.push(r);
    }
    out
}

/// Reads the object at `l`, verified as block `l.shared`.
async fn read_one(reader: &SharedReader, l: SharedLocation) -> RemoteRead {
    match reader.blocks.path_of(&l.uri) {
        Some(path) => reader.blocks.get(&path, l.shared).await,
        None => {
            tracing::warn!(uri = %l.uri, "a shared G4 location outside the store");
            RemoteRead::Miss
        }
    }
}

/// Copies a verified object's `bytes` into `slot` and returns their sums
/// under this node's key `key`, if the slot's bytes still match the
/// object's sums once they are made (clients can write arena slots: a
/// slot changed before the check fails it); `None` also for bytes of
/// another length.
fn land(
    key: BlockHash,
    slot: &mut [u8],
    bytes: &[u8],
    location: &SharedLocation,
    sums: &BlockSums,
    layer_bytes: usize,
) -> Option<BlockSums> {
    if slot.len() != bytes.len() {
        return None;
    }
    slot.copy_from_slice(bytes);
    let own = BlockSums::compute(key, layer_bytes, slot);
    (layer_checksums(location.shared, layer_bytes, slot) == sums.layers).then_some(own)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sums are this node's of bytes the object's sums still
    /// describe; other bytes, or another length, are refused.
    #[test]
    fn a_landed_block_is_summed_under_this_nodes_key_and_checked_again() {
        let (shared, own, layer) = (BlockHash(5), BlockHash(6), 64usize);
        let bytes: Vec<u8> = (0..4 * layer).map(|i| i as u8).collect();
        let sums = BlockSums::compute(shared, layer, &bytes);
        let at = SharedLocation {
            uri: "s3://b/p/x".into(),
            shared,
        };
        let mut slot = vec![0u8; bytes.len()];
        let got = land(own, &mut slot, &bytes, &at, &sums, layer).unwrap();
        assert_eq!(got, BlockSums::compute(own, layer, &bytes));
        assert_eq!(slot, bytes);
        let other = BlockSums::compute(BlockHash(9), layer, &bytes);
        assert_eq!(land(own, &mut slot, &bytes, &at, &other, layer), None);
        let mut short = vec![0u8; bytes.len() - 1];
        assert_eq!(land(own, &mut short, &bytes, &at, &sums, layer), None);
    }
}
