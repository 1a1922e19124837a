//! In-flight protection: while a transfer runs, its destination copy must
//! not be readable and its source copy must not be evictable.
//!
//! The engine calls [`InFlightHooks::begin_transfer`] when a request is
//! submitted (before any byte moves) and [`InFlightHooks::finish_transfer`]
//! for every block once its result is final (before the block's waiters
//! are woken, so a waiter that sees `Ok` also sees the block readable).
//! The block pool / registry plugs its `begin_transfer` / `finish_transfer`
//! in here; [`InFlightTable`] is a self-contained implementation that
//! answers "readable?" and "evictable?" for tools and tests.
//!
//! A layer-wise load ([`IoScheduler::load`](crate::scheduler::IoScheduler::load))
//! is one engine transfer per layer, each with `span = Span::Layer(l)`, all
//! naming the same blocks: a block is wholly resident in its landing only
//! after the transfer of its last layer finishes. Hooks that guard whole
//! blocks should settle on `Span::Layer(geometry.layers - 1)` (or count
//! layers) rather than on the first finish.

use std::collections::HashMap;

use kvtier_core::BlockHash;
use parking_lot::Mutex;

use super::request::{BlockResult, Span};
use crate::tier::{Tier, TransferPath};

/// A transfer as the hooks see it when it starts.
#[derive(Debug, Clone, Copy)]
pub struct TransferTicket<'a> {
    /// The engine's id of the transfer (unique per engine).
    pub id: u64,
    /// The path.
    pub path: TransferPath,
    /// Which bytes of each block move.
    pub span: Span,
    /// The blocks, in request order.
    pub keys: &'a [BlockHash],
}

/// Callbacks around every transfer. Implementations must be cheap and must
/// not block: they run on the submitting thread and on the engine's
/// workers.
pub trait InFlightHooks: Send + Sync + 'static {
    /// Called once per transfer, before any byte moves: from here until
    /// `finish_transfer` for a block, its destination copy is not readable
    /// and its source copy not evictable.
    fn begin_transfer(&self, ticket: &TransferTicket<'_>);

    /// Called once per block of transfer `id` with its final result, before
    /// the block's waiters wake.
    fn finish_transfer(&self, id: u64, path: TransferPath, key: BlockHash, result: &BlockResult);
}

/// Hooks that do nothing (the tiers' own guards still apply: an
/// uncommitted DRAM slot is invisible, a disk block is indexed only once
/// written).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHooks;

impl InFlightHooks for NoHooks {
    fn begin_transfer(&self, _: &TransferTicket<'_>) {}
    fn finish_transfer(&self, _: u64, _: TransferPath, _: BlockHash, _: &BlockResult) {}
}

/// Counts of in-flight transfers per (tier, block), as destination and as
/// source.
#[derive(Debug, Default)]
pub struct InFlightTable {
    inner: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    /// Blocks being written into a tier: not readable there.
    inbound: HashMap<(Tier, BlockHash), u32>,
    /// Blocks being read out of a tier: not evictable there.
    outbound: HashMap<(Tier, BlockHash), u32>,
}

fn bump(map: &mut HashMap<(Tier, BlockHash), u32>, at: (Tier, BlockHash)) {
    *map.entry(at).or_insert(0) += 1;
}

fn drop_one(map: &mut HashMap<(Tier, BlockHash), u32>, at: (Tier, BlockHash)) {
    if let Some(n) = map.get_mut(&at) {
        *n -= 1;
        if *n == 0 {
            map.remove(&at);
        }
    }
}

impl InFlightTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether `key` may be read from `tier`: false while a transfer into
    /// `tier` is writing it.
    pub fn is_readable(&self, tier: Tier, key: BlockHash) -> bool {
        !self.inner.lock().inbound.contains_key(&(tier, key))
    }

    /// Whether `key` may be evicted from `tier`: false while a transfer is
    /// reading it out of `tier`.
    pub fn is_evictable(&self, tier: Tier, key: BlockHash) -> bool {
        !self.inner.lock().outbound.contains_key(&(tier, key))
    }

    /// Blocks in flight (counted once per transfer that holds them).
    pub fn in_flight_blocks(&self) -> usize {
        self.inner
            .lock()
            .inbound
            .values()
            .map(|&n| n as usize)
            .sum()
    }
}

impl InFlightHooks for InFlightTable {
    fn begin_transfer(&self, ticket: &TransferTicket<'_>) {
        let TransferPath { from, to } = ticket.path;
        let mut c = self.inner.lock();
        for &k in ticket.keys {
            bump(&mut c.inbound, (to, k));
            bump(&mut c.outbound, (from, k));
        }
    }

    fn finish_transfer(&self, _id: u64, path: TransferPath, key: BlockHash, _: &BlockResult) {
        let TransferPath { from, to } = path;
        let mut c = self.inner.lock();
        drop_one(&mut c.inbound, (to, key));
        drop_one(&mut c.outbound, (from, key));
    }
}

impl<T: InFlightHooks> InFlightHooks for std::sync::Arc<T> {
    fn begin_transfer(&self, ticket: &TransferTicket<'_>) {
        (**self).begin_transfer(ticket)
    }
    fn finish_transfer(&self, id: u64, path: TransferPath, key: BlockHash, result: &BlockResult) {
        (**self).finish_transfer(id, path, key, result)
    }
}
