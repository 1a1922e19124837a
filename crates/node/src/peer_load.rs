//! The node as a reader of its peers (docs/peer-protocol.md §11): a
//! session's `Load` of blocks its `Lookup` located on other nodes reserves
//! G2 slots for them, reads them straight into the slots through the
//! node's [`PeerReader`], and commits them as any client-filled block, so
//! the `Load` then finds them local. A block that does not come (peer
//! down, skipped, late, missing, corrupt, no room) ends the prefix there.
//!
//! When the located blocks follow a prefix the node holds in G2, the
//! `Load` streams them instead ([`PeerStream`]): its answer names their
//! reserved slots at once and they are read in a few groups of layers,
//! each group announced as it lands, the blocks committed after the last.

use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use kvtier_core::{
    BlockChecksum, BlockHash, BlockSums, combine_layer_checksums, layer_checksum, layer_checksums,
};
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
    /// Requests a streamed `Load` splits a block's layers into; 0: whole
    /// blocks before the answer.
    layer_groups: AtomicU32,
}

/// Layer groups a streamed `Load` reads a run of blocks in by default: the
/// first group's layers are announced after a quarter of the bytes, and
/// each request still carries a quarter of the run (docs/benchmarks.md,
/// `kvtier bench peer --load`, gives the figures this was chosen by).
pub const LAYER_GROUPS: u32 = 4;

impl PeerReader {
    /// A reader over `pool` whose reads of one `Load` end after `timeout`.
    pub fn new(pool: PeerPool, timeout: Duration) -> Self {
        Self {
            pool,
            timeout,
            layer_groups: AtomicU32::new(LAYER_GROUPS),
        }
    }

    /// Streams located blocks in `groups` requests of layers each (capped
    /// at one per layer), or, with 0, reads them whole before the `Load`
    /// answers (the bench's baseline).
    pub fn set_layer_groups(&self, groups: u32) {
        self.layer_groups.store(groups, Ordering::Relaxed);
    }

    /// The groups of layers a streamed `Load` reads in; 0 when loads read
    /// whole blocks.
    pub fn layer_groups(&self) -> u32 {
        self.layer_groups.load(Ordering::Relaxed)
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
    let (deadline, mut slots) = reserve_located(manager, reader, wanted).await;
    let window = Window::all(manager.geometry().block_bytes() as usize);
    let (peer_sums, missing) = read_slots(
        reader,
        &wanted[..slots.len()],
        &mut slots,
        &window,
        deadline,
    )
    .await;
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

/// A run of located blocks a `Load` streams (docs/peer-protocol.md §11):
/// their G2 slots reserved up front, their layers read a group at a
/// time, each group verified against the peer's sums and summed under
/// this node's keys, and the blocks committed after the last group. The
/// blocks still good are a prefix that only shrinks; a block past it is
/// never read again, and its reservation is kept (unreadable, unreused)
/// until the stream is dropped, after the `Load`'s last answer.
pub(crate) struct PeerStream {
    wanted: Vec<Located>,
    slots: Vec<HostReservation>,
    /// The peer's sums of each good block, as its first group came.
    peer: Vec<BlockSums>,
    /// This node's checksum of each landed layer of each good block.
    own: Vec<Vec<u64>>,
    /// How many leading blocks are still good.
    good: usize,
    /// Layers landed (of the good blocks).
    landed: u32,
    /// Layers a request reads.
    group: u32,
    layers: u32,
    layer_bytes: usize,
    block_bytes: usize,
    /// Wants the peer answered it does not hold, by index.
    missing: Vec<usize>,
    deadline: tokio::time::Instant,
}

impl PeerStream {
    /// Reserves G2 slots for the leading blocks of `wanted` the manager
    /// grants (see [`reserve_prefix`]); reading ends by `reader`'s
    /// deadline from now.
    pub(crate) async fn start(
        manager: &BlockManager,
        reader: &PeerReader,
        wanted: &[Located],
    ) -> Self {
        let (deadline, slots) = reserve_located(manager, reader, wanted).await;
        let g = manager.geometry();
        let layers = g.layers;
        let groups = reader.layer_groups().clamp(1, layers.max(1));
        Self {
            wanted: wanted[..slots.len()].to_vec(),
            good: slots.len(),
            own: vec![Vec::with_capacity(layers as usize); slots.len()],
            slots,
            peer: Vec::new(),
            landed: 0,
            group: layers.div_ceil(groups).max(1),
            layers,
            layer_bytes: g.layer_bytes() as usize,
            block_bytes: g.block_bytes() as usize,
            missing: Vec::new(),
            deadline,
        }
    }

    /// The arena slot of each block reserved, in order.
    pub(crate) fn arena_slots(&self) -> impl Iterator<Item = usize> + '_ {
        self.slots.iter().map(HostReservation::arena_slot)
    }

    /// Whether nothing is left to read: every layer landed, or no block
    /// is good.
    pub(crate) fn done(&self) -> bool {
        self.good == 0 || self.landed >= self.layers
    }

    /// Reads the next group of layers of the good blocks; the layers it
    /// landed (empty once [`done`](Self::done)). A block that fails here
    /// (not read, late, missing, corrupt, changed under the hashing) and
    /// every one after it stop being good.
    pub(crate) async fn next(&mut self, reader: &PeerReader) -> Range<u32> {
        if self.done() {
            return self.landed..self.landed;
        }
        let layers = self.landed..(self.landed + self.group).min(self.layers);
        let window = Window::span(layers.clone(), self.layer_bytes, self.block_bytes);
        let good = self.good;
        let (sums, missing) = read_slots(
            reader,
            &self.wanted[..good],
            &mut self.slots[..good],
            &window,
            self.deadline,
        )
        .await;
        if !missing.is_empty() {
            self.missing = missing;
        }
        self.keep_same_sums(sums);
        self.sum_group(window.bytes, layers.clone()).await;
        self.landed = layers.end;
        layers
    }

    /// Keeps the good prefix whose peer sums are those of the first group
    /// (a block's sums never change between its groups).
    fn keep_same_sums(&mut self, sums: Vec<BlockSums>) {
        let same = if self.landed == 0 {
            let n = sums.len();
            self.peer = sums;
            n
        } else {
            (sums.iter().zip(&self.peer))
                .take_while(|(now, first)| now == first)
                .count()
        };
        self.good = self.good.min(same);
    }

    /// Makes this node's sums of layers `layers` (bytes `bytes` of each
    /// slot) of the good blocks, checking the bytes against the peer's
    /// sums after (as [`own_sums`]), off the async workers; the good
    /// prefix ends at the first that fails. Should the hashing task fail,
    /// its reservations went with it and nothing is good.
    async fn sum_group(&mut self, bytes: Range<usize>, layers: Range<u32>) {
        let mut slots = std::mem::take(&mut self.slots);
        let good = self.good;
        let locations: Vec<PeerLocation> =
            self.wanted[..good].iter().map(|(_, l)| l.clone()).collect();
        let peer = self.peer[..good].to_vec();
        let lb = self.layer_bytes as u64;
        let done = tokio::task::spawn_blocking(move || {
            let own: Vec<Vec<u64>> = (slots.iter_mut().zip(&peer).zip(&locations))
                .map_while(|((slot, peer), at)| {
                    let key = slot.key();
                    let got = &slot.bytes_mut()[bytes.clone()];
                    own_layers(key, got, layers.clone(), lb, peer, at)
                })
                .collect();
            (slots, own)
        })
        .await;
        let Ok((slots, own)) = done else {
            self.good = 0;
            return;
        };
        self.slots = slots;
        self.good = own.len();
        for (all, group) in self.own.iter_mut().zip(own) {
            all.extend(group);
        }
    }

    /// This node's checksum of layer `layer` of each good block, once the
    /// layer landed.
    pub(crate) fn layer_sums(&self, layer: u32) -> impl Iterator<Item = u64> + '_ {
        self.own[..self.good]
            .iter()
            .map_while(move |own| own.get(layer as usize).copied())
    }

    /// Checks every good block's whole slot against this node's sums once
    /// more (clients map the arena writable) and commits those that hold,
    /// up to the first that does not: what became readable, and the
    /// reservations of the blocks that failed before the commit, kept for
    /// the caller to drop once its answer no longer names them (one the
    /// commit refuses is freed by it).
    pub(crate) async fn finish(
        mut self,
        manager: &BlockManager,
    ) -> (Fetched, Vec<HostReservation>) {
        if self.landed < self.layers {
            self.good = 0;
        }
        let mut failed = self.slots.split_off(self.good);
        let (slots, own) = (self.slots, self.own);
        let lb = self.layer_bytes;
        let checked = tokio::task::spawn_blocking(move || {
            let (mut checked, mut failed) = (Vec::with_capacity(slots.len()), Vec::new());
            for (mut slot, layers) in slots.into_iter().zip(own) {
                let key = slot.key();
                if failed.is_empty() && layer_checksums(key, lb, slot.bytes_mut()) == layers {
                    let block = combine_layer_checksums(key, &layers);
                    checked.push((slot, BlockSums { block, layers }));
                } else {
                    failed.push(slot);
                }
            }
            (checked, failed)
        })
        .await;
        let (checked, late) = checked.unwrap_or_default();
        failed.extend(late);
        let fetched = commit_prefix(manager, checked).await;
        let missing = self.missing;
        (Fetched { missing, ..fetched }, failed)
    }
}

/// The deadline of a read of `wanted` from peers starting now, and the G2
/// slots reserved for its leading blocks ([`reserve_prefix`]).
async fn reserve_located(
    manager: &BlockManager,
    reader: &PeerReader,
    wanted: &[Located],
) -> (tokio::time::Instant, Vec<HostReservation>) {
    let deadline = tokio::time::Instant::now() + reader.timeout;
    let keys: Vec<BlockHash> = wanted.iter().map(|(k, _)| *k).collect();
    (deadline, reserve_prefix(manager, &keys, "peers").await)
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

/// Layers of a block read in one request: as the peer wire names them,
/// and the bytes of the slot they land in.
#[derive(Debug, Clone)]
struct Window {
    range: LayerRange,
    bytes: Range<usize>,
}

impl Window {
    /// The whole block of `block_bytes`.
    fn all(block_bytes: usize) -> Self {
        Self {
            range: LayerRange::All,
            bytes: 0..block_bytes,
        }
    }

    /// Layers `layers` of blocks of `block_bytes` in layers of
    /// `layer_bytes` (the last possibly shorter).
    fn span(layers: Range<u32>, layer_bytes: usize, block_bytes: usize) -> Self {
        let at = |l: u32| (l as usize).saturating_mul(layer_bytes).min(block_bytes);
        Self {
            bytes: at(layers.start)..at(layers.end),
            range: LayerRange::Span {
                start: layers.start,
                end: layers.end,
            },
        }
    }
}

/// Reads layers `window` of `wanted` into `slots` (one each), peer by
/// peer in order, until one fails or `deadline`: the peer's sums of each
/// leading slot that holds verified bytes there, and the indices of the
/// blocks the last peer read answered it does not hold ([`missing_of`]).
async fn read_slots(
    reader: &PeerReader,
    wanted: &[Located],
    slots: &mut [HostReservation],
    window: &Window,
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
            .map(|s| &mut s.bytes_mut()[window.bytes.clone()])
            .collect();
        let landed = match (reader.pool)
            .read_into(&peer, &wants, window.range, &mut targets, deadline)
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
    let layers = own_layers(key, bytes, 0..u32::MAX, layer_bytes, peer_sums, location)?;
    Some(BlockSums {
        block: combine_layer_checksums(key, &layers),
        layers,
    })
}

/// This node's checksums (as block `key`) of `bytes`, layers `layers` of a
/// block (`0..u32::MAX`: all of it), if the bytes still match the peer's
/// sums of them for `location` once they are made ([`own_sums`]).
fn own_layers(
    key: BlockHash,
    bytes: &[u8],
    layers: Range<u32>,
    layer_bytes: u64,
    peer_sums: &BlockSums,
    location: &PeerLocation,
) -> Option<Vec<u64>> {
    // A layer size the peer wire cannot name never verifies.
    let lb = u32::try_from(layer_bytes).ok().filter(|&lb| lb > 0)?;
    let own: Vec<u64> = (bytes.chunks(lb as usize).zip(layers.start..))
        .map(|(chunk, l)| layer_checksum(key, l, chunk))
        .collect();
    let range = match layers.end {
        u32::MAX => LayerRange::All,
        end => LayerRange::Span {
            start: layers.start,
            end,
        },
    };
    let expect = Expect::Checksum(location.sum);
    verify(location.stored, expect, range, peer_sums, lb, bytes).then_some(own)
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

    proptest::proptest! {
        /// Of any span of any block, the sums are this node's of exactly
        /// those layers when the bytes are the peer's; a byte changed
        /// anywhere in the span, or the span named as other layers, never
        /// checks.
        #[test]
        fn own_layers_of_a_span_hold_only_for_the_peers_bytes(
            layers in 1usize..8,
            (start, len) in (0usize..8, 1usize..8),
            flip in proptest::option::of(0usize..4096),
            shift in 0u32..2,
        ) {
            let (start, end) = (start % layers, (start % layers + len).min(layers));
            let (peer_key, own_key, lb) = (BlockHash(3), BlockHash(4), 64usize);
            let bytes: Vec<u8> = (0..layers * lb).map(|i| (i * 31 + 7) as u8).collect();
            let peer = BlockSums::compute(peer_key, lb, &bytes);
            let at = location(peer_key, peer.block);
            let mut span = bytes[start * lb..end * lb].to_vec();
            if let Some(f) = flip {
                let n = span.len();
                span[f % n] ^= 0x40;
            }
            let named = (start as u32 + shift)..(end as u32 + shift);
            let got = own_layers(own_key, &span, named, lb as u64, &peer, &at);
            if flip.is_none() && shift == 0 {
                let own = BlockSums::compute(own_key, lb, &bytes);
                proptest::prop_assert_eq!(got, Some(own.layers[start..end].to_vec()));
            } else {
                proptest::prop_assert_eq!(got, None);
            }
        }
    }
}
