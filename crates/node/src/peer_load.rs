//! The node as a reader of its peers (docs/peer-protocol.md §11): a
//! session's `Load` of blocks its `Lookup` located on other nodes reserves
//! G2 slots for them, reads them straight into the slots through the
//! node's [`PeerReader`], and commits them as any client-filled block, so
//! the `Load` then finds them local. A block that does not come (peer
//! down, skipped, late, missing, corrupt, no room) ends the prefix there.

use std::time::Duration;

use kvtier_core::{BlockChecksum, BlockHash, BlockSums};
use kvtier_manager::manager::{BlockManager, HostCommit, HostReservation, HostReserve};
use kvtier_peer::{Expect, LayerRange, MAX_KEYS, PeerAddr, PeerPool, PoolConfig, Want};

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
    let granted = match manager.reserve_host(&keys).await {
        Ok(granted) => granted,
        Err(e) => {
            tracing::warn!(error = %e, "no G2 slots for blocks located on peers");
            return Fetched::default();
        }
    };
    // A key already held, in flight or without room ends the prefix; the
    // reservations past it drop with the iterator (their slots freed).
    let mut slots: Vec<HostReservation> = granted
        .into_iter()
        .map_while(|g| match g {
            HostReserve::Reserved(r) => Some(r),
            _ => None,
        })
        .collect();
    let read = read_slots(reader, &wanted[..slots.len()], &mut slots, deadline).await;
    slots.truncate(read);
    let block_bytes = slots.first_mut().map_or(0, |r| r.bytes_mut().len() as u64);
    let layer_bytes = manager.geometry().layer_bytes() as usize;
    let Some(batch) = sum_slots(slots, layer_bytes).await else {
        return Fetched::default();
    };
    let block_sums: Vec<BlockChecksum> = batch.iter().map(|(_, s)| s.block).collect();
    let sums: Vec<BlockChecksum> = (manager.commit_host(batch).await.into_iter())
        .zip(block_sums)
        .take_while(|(c, _)| matches!(c, HostCommit::Stored | HostCommit::AlreadyStored))
        .map(|(_, sum)| sum)
        .collect();
    Fetched {
        bytes: block_bytes * sums.len() as u64,
        sums,
    }
}

/// Reads `wanted` into `slots` (one each), peer by peer in order, until
/// one fails or `deadline`; how many leading slots hold verified bytes.
async fn read_slots(
    reader: &PeerReader,
    wanted: &[Located],
    slots: &mut [HostReservation],
    deadline: tokio::time::Instant,
) -> usize {
    let mut good = 0;
    while good < wanted.len() {
        let first = &wanted[good].1;
        let run = wanted[good..]
            .iter()
            .take(MAX_KEYS)
            .take_while(|(_, l)| l.node == first.node && l.addr == first.addr)
            .count();
        let peer = PeerAddr {
            node: first.node.clone(),
            addr: first.addr,
        };
        let wants: Vec<Want> = wanted[good..good + run]
            .iter()
            .map(|(_, l)| Want {
                key: l.stored,
                expect: Expect::Checksum(l.sum),
            })
            .collect();
        let mut targets: Vec<&mut [u8]> = slots[good..good + run]
            .iter_mut()
            .map(HostReservation::bytes_mut)
            .collect();
        let landed = match (reader.pool)
            .read_into(&peer, &wants, LayerRange::All, &mut targets, deadline)
            .await
        {
            Ok(out) => out.sums.iter().take_while(|s| s.is_some()).count(),
            Err(e) => {
                tracing::debug!(node = %peer.node, addr = %peer.addr, error = %e, "reading blocks from a peer failed");
                0
            }
        };
        good += landed;
        if landed < run {
            break;
        }
    }
    good
}

/// Each slot with its sums under this node's key (a peer's sums are keyed
/// by the peer's own stored key), hashed off the async workers; `None`
/// when the hashing task failed (the reservations went with it).
async fn sum_slots(
    slots: Vec<HostReservation>,
    layer_bytes: usize,
) -> Option<Vec<(HostReservation, BlockSums)>> {
    if slots.is_empty() {
        return Some(Vec::new());
    }
    tokio::task::spawn_blocking(move || {
        slots
            .into_iter()
            .map(|mut r| {
                let sums = BlockSums::compute(r.key(), layer_bytes, r.bytes_mut());
                (r, sums)
            })
            .collect()
    })
    .await
    .ok()
}
