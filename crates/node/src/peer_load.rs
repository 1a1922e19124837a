//! The node as a reader of its peers (docs/peer-protocol.md §11): a
//! session's `Load` of blocks its `Lookup` located on other nodes reserves
//! G2 slots for them, reads them straight into the slots through the
//! node's [`PeerReader`], and commits them as any client-filled block, so
//! the `Load` then finds them local. A block that does not come (peer
//! down, skipped, late, missing, corrupt, no room) ends the prefix there.

use std::time::Duration;

use kvtier_core::{BlockChecksum, BlockHash, BlockSums};
use kvtier_manager::manager::{BlockManager, HostCommit, HostReservation, HostReserve};
use kvtier_peer::{
    Expect, LayerRange, MAX_KEYS, PeerAddr, PeerPool, PoolConfig, ReadOutcome, Want, verify,
};

use crate::PeerOptions;
use crate::observer::PeerLocation;

/// How the node reads blocks from its peers: the pool of connections to
/// them and how long one `Load` waits for them. Installed by `kvtier
/// serve` ([`Node::set_peer_reader`](crate::Node::set_peer_reader)) beside
/// the cluster lookup.
#[derive(Debug)]
pub struct PeerReader {
    pool: PeerPool,
    timeout: Duration,
}

impl PeerReader {
    /// A reader over `pool` whose reads of one `Load` end after `timeout`.
    pub fn new(pool: PeerPool, timeout: Duration) -> Self {
        Self { pool, timeout }
    }

    /// The reader of a node with peer options `options`: it connects as the
    /// node's peer identity and waits `peer.load_timeout_ms`.
    pub fn from_options(options: &PeerOptions) -> Self {
        let pool = PeerPool::new(options.server.identity.clone(), PoolConfig::default());
        Self::new(pool, options.load_timeout)
    }

    /// The pool, for its per-peer counters.
    pub fn pool(&self) -> &PeerPool {
        &self.pool
    }
}

/// What one [`fetch`] brought into G2.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Fetched {
    /// The block sum, under this node's key, of each leading block now
    /// readable in G2: stored by this fetch, or meanwhile another way.
    pub(crate) sums: Vec<BlockChecksum>,
    /// Their bytes, as read from the peers.
    pub(crate) bytes: u64,
    /// Indices into the wanted blocks whose node answered that it does not
    /// hold them (its own word over the authenticated connection: not a
    /// failed read, nor a corrupt block).
    pub(crate) missing: Vec<usize>,
}

/// A block to bring: this node's stored key for it, and where the cluster
/// holds it.
pub(crate) type Located = (BlockHash, PeerLocation);

/// Brings the prefix of `wanted` that its peers answer into G2 by
/// `reader`'s deadline: reserved through the host path, read into the
/// slots (verified against each location's sum), summed under this node's
/// keys and committed (checked again when the manager verifies commits).
/// Everything past the first block that fails is dropped unseen.
pub(crate) async fn fetch(
    manager: &BlockManager,
    reader: &PeerReader,
    wanted: &[Located],
) -> Fetched {
    let deadline = tokio::time::Instant::now() + reader.timeout;
    let keys: Vec<BlockHash> = wanted.iter().map(|(k, _)| *k).collect();
    let mut slots = reserve_prefix(manager, &keys, "peers").await;
    let (peer_sums, missing) =
        read_slots(reader, &wanted[..slots.len()], &mut slots, deadline).await;
    slots.truncate(peer_sums.len());
    let layer_bytes = manager.geometry().layer_bytes();
    let read: Vec<Landed> = (slots.into_iter().zip(peer_sums).zip(wanted))
        .map(|((slot, peer_sums), (_, location))| Landed {
            slot,
            peer_sums,
            location: location.clone(),
        })
        .collect();
    let Some(batch) = sum_slots(read, layer_bytes).await else {
        return Fetched {
            missing,
            ..Fetched::default()
        };
    };
    Fetched {
        missing,
        ..commit_prefix(manager, batch).await
    }
}

/// G2 slots for the leading `keys` the manager reserves: a key already
/// held, in flight or without room ends the prefix (the reservations past
/// it drop with the iterator, their slots freed). `from` names where the
/// blocks come from, for the log.
pub(crate) async fn reserve_prefix(
    manager: &BlockManager,
    keys: &[BlockHash],
    from: &str,
) -> Vec<HostReservation> {
    match manager.reserve_host(keys).await {
        Ok(granted) => granted
            .into_iter()
            .map_while(|g| match g {
                HostReserve::Reserved(r) => Some(r),
                _ => None,
            })
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, from, "no G2 slots for blocks located in the cluster");
            Vec::new()
        }
    }
}

/// Commits the filled slots of `batch` (each with its sums under this
/// node's key): what became readable, up to the first that did not.
pub(crate) async fn commit_prefix(
    manager: &BlockManager,
    mut batch: Vec<(HostReservation, BlockSums)>,
) -> Fetched {
    let block_bytes = batch
        .first_mut()
        .map_or(0, |(r, _)| r.bytes_mut().len() as u64);
    let block_sums: Vec<BlockChecksum> = batch.iter().map(|(_, s)| s.block).collect();
    let sums: Vec<BlockChecksum> = (manager.commit_host(batch).await.into_iter())
        .zip(block_sums)
        .take_while(|(c, _)| matches!(c, HostCommit::Stored | HostCommit::AlreadyStored))
        .map(|(_, sum)| sum)
        .collect();
    Fetched {
        bytes: block_bytes * sums.len() as u64,
        sums,
        missing: Vec::new(),
    }
}

/// Reads `wanted` into `slots` (one each), peer by peer in order, until
/// one fails or `deadline`: the peer's sums of each leading slot that
/// holds verified bytes, and the indices of the blocks the last peer read
/// answered it does not hold ([`missing_of`]).
async fn read_slots(
    reader: &PeerReader,
    wanted: &[Located],
    slots: &mut [HostReservation],
    deadline: tokio::time::Instant,
) -> (Vec<BlockSums>, Vec<usize>) {
    let mut good: Vec<BlockSums> = Vec::with_capacity(wanted.len());
    let mut missing = Vec::new();
    while good.len() < wanted.len() {
        let at = good.len();
        let first = &wanted[at].1;
        let run = wanted[at..]
            .iter()
            .take(MAX_KEYS)
            .take_while(|(_, l)| l.node == first.node && l.addr == first.addr)
            .count();
        let peer = PeerAddr {
            node: first.node.clone(),
            addr: first.addr,
        };
        let wants: Vec<Want> = wanted[at..at + run]
            .iter()
            .map(|(_, l)| Want {
                key: l.stored,
                expect: Expect::Checksum(l.sum),
            })
            .collect();
        let mut targets: Vec<&mut [u8]> = slots[at..at + run]
            .iter_mut()
            .map(HostReservation::bytes_mut)
            .collect();
        let landed = match (reader.pool)
            .read_into(&peer, &wants, LayerRange::All, &mut targets, deadline)
            .await
        {
            Ok(out) => {
                missing = missing_of(&out).map(|i| at + i).collect();
                out.sums.into_iter().map_while(|s| s).collect()
            }
            Err(e) => {
                tracing::debug!(node = %peer.node, addr = %peer.addr, error = %e, "reading blocks from a peer failed");
                Vec::new()
            }
        };
        let complete = landed.len() == run;
        good.extend(landed);
        if !complete {
            break;
        }
    }
    (good, missing)
}

/// The wants of `out` its peer answered it does not hold. A miss is
/// missing or corrupt and the outcome counts, not names, them: only when
/// no block of the read was corrupt is every miss the peer's word that it
/// lacks the block (a corrupt one is the peer's health, P15, and its
/// location stays).
fn missing_of(out: &ReadOutcome) -> impl Iterator<Item = usize> + '_ {
    let clean = out.counts.corrupt == 0;
    (out.sums.iter().enumerate())
        .filter(move |(_, s)| clean && s.is_none())
        .map(|(i, _)| i)
}

/// A slot holding a block as a peer sent it: the peer's sums (under the
/// peer's stored key) and the location that named it.
struct Landed {
    slot: HostReservation,
    peer_sums: BlockSums,
    location: PeerLocation,
}

/// The leading slots with their sums under this node's key (a peer's sums
/// are keyed by the peer's own stored key), hashed off the async workers;
/// `None` when the hashing task failed (the reservations went with it).
///
/// Each slot's bytes are checked against the peer's sums again *after*
/// this node's sums are made of them: clients map the arena writable, so
/// bytes changed between the read's check and the hashing would otherwise
/// be committed under sums of the changed bytes. A slot that fails ends
/// the prefix.
async fn sum_slots(
    read: Vec<Landed>,
    layer_bytes: u64,
) -> Option<Vec<(HostReservation, BlockSums)>> {
    if read.is_empty() {
        return Some(Vec::new());
    }
    tokio::task::spawn_blocking(move || {
        read.into_iter()
            .map_while(|mut l| {
                let key = l.slot.key();
                let sums = own_sums(
                    key,
                    l.slot.bytes_mut(),
                    layer_bytes,
                    &l.peer_sums,
                    &l.location,
                )?;
                Some((l.slot, sums))
            })
            .collect()
    })
    .await
    .ok()
}

/// The sums of `bytes` as block `key` of this node, if the bytes still
/// match what the peer sent for `location` once they are made: hashed
/// first, checked against the peer's sums after, so bytes changed at any
/// time before the check fail it.
fn own_sums(
    key: BlockHash,
    bytes: &[u8],
    layer_bytes: u64,
    peer_sums: &BlockSums,
    location: &PeerLocation,
) -> Option<BlockSums> {
    let sums = BlockSums::compute(key, layer_bytes as usize, bytes);
    let expect = Expect::Checksum(location.sum);
    // A layer size the peer wire cannot name never verifies.
    let lb = u32::try_from(layer_bytes).ok()?;
    verify(
        location.stored,
        expect,
        LayerRange::All,
        peer_sums,
        lb,
        bytes,
    )
    .then_some(sums)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn location(stored: BlockHash, sum: BlockChecksum) -> PeerLocation {
        PeerLocation {
            node: "a".into(),
            addr: "127.0.0.1:1".parse().unwrap(),
            stored,
            sum,
        }
    }

    /// Every miss of a read without a corrupt block is the peer's missing
    /// answer; a read with any corrupt block names none (which miss was
    /// which is not known, and a corrupt block is the peer's health).
    #[test]
    fn only_a_read_without_corrupt_blocks_names_missing_ones() {
        let some = Some(BlockSums::compute(BlockHash(1), 8, &[0u8; 16]));
        let out = |corrupt| ReadOutcome {
            sums: vec![some.clone(), None, None],
            counts: kvtier_peer::ReadStats {
                found: 1,
                missing: 2 - corrupt,
                corrupt,
            },
        };
        assert_eq!(missing_of(&out(0)).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(missing_of(&out(1)).count(), 0);
    }

    /// The sums are this node's (its key's) of bytes the peer's sums
    /// still describe; bytes changed after the read's check are refused.
    #[test]
    fn own_sums_are_made_only_of_bytes_the_peer_sums_still_match() {
        let (peer_key, own_key, layer) = (BlockHash(7), BlockHash(9), 64u64);
        let mut bytes: Vec<u8> = (0..4 * layer as usize).map(|i| i as u8).collect();
        let peer = BlockSums::compute(peer_key, layer as usize, &bytes);
        let at = location(peer_key, peer.block);
        let own = own_sums(own_key, &bytes, layer, &peer, &at).unwrap();
        assert_eq!(own, BlockSums::compute(own_key, layer as usize, &bytes));
        assert_ne!(own, peer, "sums are keyed by the stored key");
        bytes[100] ^= 1;
        assert_eq!(own_sums(own_key, &bytes, layer, &peer, &at), None);
        bytes[100] ^= 1;
        let elsewhere = location(peer_key, peer.block ^ 1);
        assert_eq!(own_sums(own_key, &bytes, layer, &peer, &elsewhere), None);
    }
}
