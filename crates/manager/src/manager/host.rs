//! Blocks an engine process writes into G2 itself: the node daemon's store
//! path. [`reserve_host`](BlockManager::reserve_host) takes a G2 pool slot
//! and an arena slot per new block; the client fills the arena slot through
//! its own mapping; [`commit_host`](BlockManager::commit_host) makes the
//! blocks readable. A reservation dropped uncommitted (an abort, a client
//! that died) frees both slots and leaves nothing visible.

use kvtier_arena::MemError;
use kvtier_core::{BlockHash, BlockSums, Tier};
use kvtier_mem::{MemoryTier, PutOutcome, Reserve, SlotReservation};

use super::{BlockManager, ManagerError};
use crate::TierList;
use crate::pool::{IncomingBlock, PoolError};

/// A G2 slot reserved for one block the client fills: the pool's incoming
/// guard (the hash is in flight: neither readable nor evictable, and a
/// second reservation of it is refused) and the arena slot.
pub struct HostReservation {
    incoming: IncomingBlock,
    slot: SlotReservation,
}

impl std::fmt::Debug for HostReservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostReservation")
            .field("key", &self.key())
            .field("arena_slot", &self.slot.slot())
            .finish()
    }
}

impl HostReservation {
    /// The block.
    pub fn key(&self) -> BlockHash {
        self.incoming.hash()
    }

    /// The arena slot the client fills.
    pub fn arena_slot(&self) -> usize {
        self.slot.slot()
    }

    /// The slot's bytes, for a writer in this process that lands a block
    /// there itself (a read from a peer node): nothing becomes visible
    /// until [`commit_host`](BlockManager::commit_host) checks them.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.slot.as_mut_slice()
    }

    /// Fills the slot from `data` in this process and returns the block's
    /// sums, for callers that hold the bytes themselves rather than a
    /// client that maps the arena (the trace bench, `put_host`). `data`
    /// must be one whole block, else nothing is written.
    pub fn fill(&mut self, data: &[u8], layer_bytes: usize) -> Result<BlockSums, ManagerError> {
        let key = self.key();
        let dst = self.bytes_mut();
        if data.len() != dst.len() {
            return Err(ManagerError::Config(format!(
                "block {key}: {} bytes given, a block is {}",
                data.len(),
                dst.len()
            )));
        }
        dst.copy_from_slice(data);
        Ok(BlockSums::compute(key, layer_bytes, dst))
    }
}

/// What [`BlockManager::reserve_host`] gives for one key.
#[derive(Debug)]
pub enum HostReserve {
    /// Fill the slot, then commit (or drop to abort).
    Reserved(HostReservation),
    /// Some tier holds the block already.
    AlreadyStored,
    /// Another reservation or a transfer is bringing the block to G2.
    InFlight,
    /// G2 has no slot free even after making room.
    NoSpace,
}

/// What [`BlockManager::commit_host`] did with one reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostCommit {
    /// Readable in G2.
    Stored,
    /// The block became resident another way meanwhile; this copy was
    /// dropped.
    AlreadyStored,
    /// The sums are inconsistent or do not match the slot's bytes; nothing
    /// became visible.
    BadChecksum,
}

impl BlockManager {
    /// Reserves G2 slots for the keys no tier holds and nobody is bringing
    /// in, making room first (the G2 policy's victims cascade down). One
    /// result per key, in order.
    ///
    /// `keys` are taken as one prefix chain, in order: each key's parent is
    /// the key before it (the first has none), which is what the pools'
    /// leaf-first filter and the cascade's chain order read. An engine
    /// that reserves a request's blocks from its first one (the stored
    /// prefix answered [`HostReserve::AlreadyStored`]) gives the node the
    /// whole chain, as the optimizer's replay assumes.
    pub async fn reserve_host(&self, keys: &[BlockHash]) -> Result<Vec<HostReserve>, ManagerError> {
        let (pool, memory) = self.host_tier()?;
        // Where each key is, read once: it sizes the room to make and then
        // picks the keys to reserve. A key held here but evicted from the
        // last tier while room is made answers `AlreadyStored`, as if the
        // eviction came just after the answer; a retry reads again.
        let mut first = Some(self.registry.fastest_ready(keys));
        let new = first.iter().flatten().filter(|t| t.is_none()).count();
        let pool_slots: Vec<Result<IncomingBlock, HostReserve>> = self
            .take_with_room(
                TierList::TOP,
                new,
                || {
                    let held = first
                        .take()
                        .unwrap_or_else(|| self.registry.fastest_ready(keys));
                    pool_slots(pool, keys, &held)
                },
                |slots: &Vec<_>| slots.iter().any(|s| matches!(s, Err(HostReserve::NoSpace))),
            )
            .await;
        // A pool slot freed by an eviction freed its arena slot in the
        // same step (the pool is the arena's book), so the arena has a
        // slot for each pool slot taken.
        Ok(arena_slots(memory, pool_slots))
    }

    /// Makes filled reservations readable: each slot's bytes are checked
    /// against its sums (unless [`ManagerConfig::verify_host_commits`] is
    /// off, then only the sums' consistency), the arena publishes the
    /// block, and the pool registers it. In inclusive mode the new blocks
    /// are copied down. One result per reservation, in order.
    ///
    /// [`ManagerConfig::verify_host_commits`]: super::ManagerConfig::verify_host_commits
    pub async fn commit_host(&self, blocks: Vec<(HostReservation, BlockSums)>) -> Vec<HostCommit> {
        let n = blocks.len();
        let published = if self.config.verify_host_commits && n > 0 {
            // Hashing a batch takes milliseconds: off the async workers, so
            // other clients' requests are not held up meanwhile.
            match tokio::task::spawn_blocking(move || publish_all(blocks, true)).await {
                Ok(p) => p,
                // The reservations went with the task: nothing was stored.
                Err(_) => return vec![HostCommit::BadChecksum; n],
            }
        } else {
            publish_all(blocks, false)
        };
        let mut out = Vec::with_capacity(n);
        let mut stored = Vec::with_capacity(n);
        let mut finished = Vec::with_capacity(n);
        for (incoming, outcome) in published {
            let key = incoming.hash();
            out.push(match outcome {
                Ok(PutOutcome::Stored) => {
                    finished.push(incoming);
                    stored.push(key);
                    HostCommit::Stored
                }
                // The arena holds it already (another path won); the guard
                // dropped here frees the pool slot.
                Ok(PutOutcome::AlreadyPresent | PutOutcome::Full) => HostCommit::AlreadyStored,
                Err(MemError::ChecksumMismatch { .. } | MemError::BadSums { .. }) => {
                    HostCommit::BadChecksum
                }
                Err(e) => {
                    tracing::warn!(%key, error = %e, "commit of a host block failed");
                    HostCommit::BadChecksum
                }
            });
        }
        // Registered (and the handles dropped) under one pool lock.
        if let Ok((pool, _)) = self.host_tier() {
            pool.finish_all(finished);
        }
        self.copy_down(TierList::TOP, &stored).await;
        self.publish_events();
        out
    }

    /// Stores one block from this process's memory: reserve, fill,
    /// commit. `None` when G2 has no room or another writer is storing it.
    pub async fn put_host(
        &self,
        key: BlockHash,
        data: &[u8],
    ) -> Result<Option<HostCommit>, ManagerError> {
        let mut granted = self.reserve_host(&[key]).await?;
        match granted.pop() {
            Some(HostReserve::Reserved(mut r)) => {
                let sums = r.fill(data, self.geometry.layer_bytes() as usize)?;
                Ok(self.commit_host(vec![(r, sums)]).await.pop())
            }
            Some(HostReserve::AlreadyStored) => Ok(Some(HostCommit::AlreadyStored)),
            _ => Ok(None),
        }
    }

    /// Removes `keys` from every tier where nobody holds, pins or moves
    /// them (those copies stay); the arena, the disk and the remote store
    /// follow. Returns the copies dropped.
    pub fn remove(&self, keys: &[BlockHash]) -> usize {
        let mut dropped = 0;
        for pool in self.registry.pools() {
            dropped += pool.remove_inactive_many(keys);
        }
        self.publish_events();
        dropped
    }

    /// Drains G2 at shutdown: every block no one holds moves to the tier
    /// below (exclusive or inclusive alike), so a restart adopts it from
    /// the disk log. Waits for the copies; returns the blocks left in G2.
    pub async fn drain_host(&self) -> usize {
        let Some(pool) = self.registry.pool(TierList::TOP) else {
            return 0;
        };
        let capacity = pool.config().capacity_blocks;
        self.make_room(TierList::TOP, capacity).await;
        self.publish_events();
        pool.used()
    }

    /// G2's pool and the arena behind it.
    fn host_tier(&self) -> Result<(&crate::pool::BlockPool, &MemoryTier), ManagerError> {
        match (self.registry.pool(TierList::TOP), self.tiers().arena()) {
            (Some(p), Some(m)) => Ok((p, m)),
            _ => Err(ManagerError::Config("G2 is not configured".into())),
        }
    }
}

/// Publishes each filled slot in the arena (one book lock for the batch):
/// hashed against its sums first when `verify`, else with only the sums'
/// consistency checked.
fn publish_all(
    blocks: Vec<(HostReservation, BlockSums)>,
    verify: bool,
) -> Vec<(IncomingBlock, Result<PutOutcome, MemError>)> {
    let (incoming, slots): (Vec<IncomingBlock>, Vec<(SlotReservation, BlockSums)>) = blocks
        .into_iter()
        .map(|(HostReservation { incoming, slot }, sums)| (incoming, (slot, sums)))
        .unzip();
    incoming
        .into_iter()
        .zip(SlotReservation::commit_all(slots, verify))
        .collect()
}

/// A G2 pool slot for each of `keys` no tier holds (`held`, per key:
/// the fastest tier holding it), or why there is none; one pool lock
/// for all.
fn pool_slots(
    pool: &crate::pool::BlockPool,
    keys: &[BlockHash],
    held: &[Option<Tier>],
) -> Vec<Result<IncomingBlock, HostReserve>> {
    let parents = std::iter::once(None).chain(keys.iter().copied().map(Some));
    let fresh = keys
        .iter()
        .zip(parents)
        .zip(held)
        .filter(|(_, t)| t.is_none())
        .map(|((k, parent), _)| (*k, parent));
    let mut taken = pool.begin_incoming_many(fresh).into_iter();
    held.iter()
        .map(|t| {
            if t.is_some() {
                return Err(HostReserve::AlreadyStored);
            }
            match taken.next() {
                Some(Ok(incoming)) => Ok(incoming),
                Some(Err(PoolError::InFlight(_))) => Err(HostReserve::InFlight),
                Some(Err(PoolError::AlreadyResident(_))) => Err(HostReserve::AlreadyStored),
                _ => Err(HostReserve::NoSpace),
            }
        })
        .collect()
}

/// An arena slot for each block a pool slot was taken for (one book lock
/// for the batch); the other answers as they are.
fn arena_slots(
    memory: &MemoryTier,
    pool_slots: Vec<Result<IncomingBlock, HostReserve>>,
) -> Vec<HostReserve> {
    let keys = pool_slots
        .iter()
        .filter_map(|s| s.as_ref().ok().map(IncomingBlock::hash));
    let mut arena = memory.reserve_many(keys).into_iter();
    pool_slots
        .into_iter()
        .map(|slot| match slot {
            Err(answer) => answer,
            Ok(incoming) => match arena.next() {
                Some(Reserve::Reserved(slot)) => {
                    HostReserve::Reserved(HostReservation { incoming, slot })
                }
                // The pool did not know it but the arena does: the pool is
                // the authority, so this is a copy left by another path;
                // report it stored rather than writing it twice.
                Some(Reserve::AlreadyPresent) => HostReserve::AlreadyStored,
                Some(Reserve::Full) | None => HostReserve::NoSpace,
            },
        })
        .collect()
}
