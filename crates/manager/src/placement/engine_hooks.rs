//! The bridge from planned [`Move`]s to the transfer engine's in-flight
//! hooks.
//!
//! A planned move already holds its guards (source not evictable,
//! destination not readable). [`MoveHooks`] keeps the moves while the
//! engine runs them and settles each when the engine reports the block's
//! result: `Ok` completes the move (the destination becomes readable, a
//! moved source leaves its tier), an error drops it (the destination slot
//! is freed, the source stays). Stage a move with [`MoveHooks::stage`]
//! before submitting the transfer that carries its block on its path.
//!
//! A layer-wise load is one engine transfer per layer, all naming the same
//! blocks. A move carried that way is taken when layer 0 starts and settled
//! only when its last layer (of [`MoveHooks::with_layers`]) finishes, failed
//! if any of its layers failed: a block is readable in G2 only when every
//! layer landed.
//!
//! Moves staged together with [`MoveHooks::stage_ordered`] (an
//! onboarding's, one load per source path) settle in the order given,
//! whatever order their transfers finish in: a move that finished waits for
//! the ones before it. The destination tier's policy then sees the blocks
//! arrive in one order on every run (ARC adapts its target on each block
//! that comes back from its ghost lists, so the order of arrivals changes
//! what it evicts next), and the optimizer's replay can model it.

use std::collections::{HashMap, VecDeque};

use kvtier_core::BlockHash;
use parking_lot::Mutex;

use super::Move;
use crate::TransferPath;
use crate::pool::{DefaultLock, PoolLock};
use crate::transfer::Span;
use crate::transfer::{BlockResult, InFlightHooks, TransferTicket};

/// Moves staged for, or running in, the transfer engine.
pub struct MoveHooks<L: PoolLock = DefaultLock> {
    inner: Mutex<Moves<L>>,
    /// The last layer of a block (layers - 1): a layer-wise move settles
    /// when this layer finishes.
    last_layer: u32,
}

/// A move carried by a layer-wise load, waiting for its last layer.
struct Layered<L: PoolLock> {
    mv: Move<L>,
    /// Whether some layer already failed.
    failed: bool,
}

struct Moves<L: PoolLock> {
    /// Staged, waiting for the engine to start a transfer on their path.
    staged: HashMap<(TransferPath, BlockHash), VecDeque<Move<L>>>,
    /// Running whole-block transfers, by engine transfer id and block.
    running: HashMap<(u64, BlockHash), Move<L>>,
    /// Running layer-wise loads, by path and block.
    layered: HashMap<(TransferPath, BlockHash), Layered<L>>,
    /// The layer each running layer transfer carries, by engine id.
    layer_of: HashMap<u64, (u32, usize)>,
    /// The batch of [`MoveHooks::stage_ordered`] each ordered move belongs
    /// to, by path and block.
    batch_of: HashMap<(TransferPath, BlockHash), u64>,
    /// Ordered batches not fully settled yet, by id.
    batches: HashMap<u64, Ordered<L>>,
    /// The id of the next ordered batch.
    next_batch: u64,
}

/// Moves that settle in a given order.
struct Ordered<L: PoolLock> {
    /// The moves not settled yet, in settling order.
    order: VecDeque<(TransferPath, BlockHash)>,
    /// Moves whose transfer finished, waiting for the ones before them,
    /// with whether they succeeded.
    finished: HashMap<(TransferPath, BlockHash), (Move<L>, bool)>,
}

impl<L: PoolLock> Ordered<L> {
    /// Takes the finished moves at the front of the order.
    fn take_ready(&mut self, out: &mut Vec<(Move<L>, bool)>) {
        while let Some(at) = self.order.front() {
            let Some(done) = self.finished.remove(at) else {
                break;
            };
            self.order.pop_front();
            out.push(done);
        }
    }
}

impl<L: PoolLock> Default for MoveHooks<L> {
    fn default() -> Self {
        Self::with_layers(1)
    }
}

impl<L: PoolLock> std::fmt::Debug for MoveHooks<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (staged, running) = self.counts();
        f.debug_struct("MoveHooks")
            .field("staged", &staged)
            .field("running", &running)
            .finish()
    }
}

impl<L: PoolLock> MoveHooks<L> {
    /// No moves; blocks of one layer (layer-wise transfers settle on their
    /// first layer). Use [`with_layers`](Self::with_layers) with layer-wise
    /// loads.
    pub fn new() -> Self {
        Self::default()
    }

    /// No moves; blocks of `layers` layers, so a layer-wise move settles
    /// when layer `layers - 1` finishes.
    pub fn with_layers(layers: u32) -> Self {
        Self {
            inner: Mutex::new(Moves {
                staged: HashMap::new(),
                running: HashMap::new(),
                layered: HashMap::new(),
                layer_of: HashMap::new(),
                batch_of: HashMap::new(),
                batches: HashMap::new(),
                next_batch: 0,
            }),
            last_layer: layers.saturating_sub(1),
        }
    }

    /// Keeps `mv` until the engine starts a transfer of its block on its
    /// path.
    pub fn stage(&self, mv: Move<L>) {
        self.inner
            .lock()
            .staged
            .entry((mv.path, mv.hash))
            .or_default()
            .push_back(mv);
    }

    /// Stages `moves`, which settle in the order given: a move whose
    /// transfer finished first waits until every move before it settled.
    pub fn stage_ordered(&self, moves: Vec<Move<L>>) {
        if moves.len() < 2 {
            moves.into_iter().for_each(|mv| self.stage(mv));
            return;
        }
        let mut m = self.inner.lock();
        let id = m.next_batch;
        m.next_batch += 1;
        let order: VecDeque<_> = moves.iter().map(|mv| (mv.path, mv.hash)).collect();
        for &at in &order {
            m.batch_of.insert(at, id);
        }
        m.batches.insert(
            id,
            Ordered {
                order,
                finished: HashMap::new(),
            },
        );
        for mv in moves {
            m.staged
                .entry((mv.path, mv.hash))
                .or_default()
                .push_back(mv);
        }
    }

    /// Settles `mv` (completed when `ok`, else dropped), after the moves
    /// before it when it was staged in order.
    fn settle(&self, mv: Move<L>, ok: bool) {
        let ready = {
            let mut m = self.inner.lock();
            let at = (mv.path, mv.hash);
            match m.batch_of.remove(&at) {
                None => vec![(mv, ok)],
                Some(id) => {
                    let mut ready = Vec::new();
                    if let Some(batch) = m.batches.get_mut(&id) {
                        batch.finished.insert(at, (mv, ok));
                        batch.take_ready(&mut ready);
                        if batch.order.is_empty() {
                            m.batches.remove(&id);
                        }
                    }
                    ready
                }
            }
        };
        // Outside the lock: completing a move takes the pools' locks.
        for (mv, ok) in ready {
            if ok {
                drop(mv.complete());
            } else {
                drop(mv);
            }
        }
    }

    /// Moves staged, and running (or finished, waiting for an earlier
    /// move of their ordered batch).
    pub fn counts(&self) -> (usize, usize) {
        let m = self.inner.lock();
        let waiting: usize = m.batches.values().map(|b| b.finished.len()).sum();
        (
            m.staged.values().map(VecDeque::len).sum(),
            m.running.len() + m.layered.len() + waiting,
        )
    }
}

impl<L: PoolLock> InFlightHooks for MoveHooks<L> {
    fn begin_transfer(&self, ticket: &TransferTicket<'_>) {
        let mut m = self.inner.lock();
        if let Span::Layer(layer) = ticket.span {
            m.layer_of.insert(ticket.id, (layer, ticket.keys.len()));
            if layer != 0 {
                // Later layers of a load whose move was taken at layer 0.
                return;
            }
        }
        for &key in ticket.keys {
            let at = (ticket.path, key);
            let Some(queue) = m.staged.get_mut(&at) else {
                continue;
            };
            let mv = queue.pop_front();
            if queue.is_empty() {
                m.staged.remove(&at);
            }
            match (mv, ticket.span) {
                (Some(mv), Span::Layer(_)) => {
                    m.layered.insert(at, Layered { mv, failed: false });
                }
                (Some(mv), Span::Block) => {
                    m.running.insert((ticket.id, key), mv);
                }
                (None, _) => {}
            }
        }
    }

    fn finish_transfer(&self, id: u64, path: TransferPath, key: BlockHash, result: &BlockResult) {
        // Settle outside the lock: completing a move takes the pools' locks.
        let settled = {
            let mut m = self.inner.lock();
            match m.layer_of.get(&id).copied() {
                None => m.running.remove(&(id, key)).map(|mv| (mv, result.is_ok())),
                Some((layer, keys_left)) => {
                    if keys_left <= 1 {
                        m.layer_of.remove(&id);
                    } else {
                        m.layer_of.insert(id, (layer, keys_left - 1));
                    }
                    let last = layer >= self.last_layer;
                    match m.layered.get_mut(&(path, key)) {
                        Some(l) if !last => {
                            l.failed |= result.is_err();
                            None
                        }
                        Some(_) => m
                            .layered
                            .remove(&(path, key))
                            .map(|l| (l.mv, !l.failed && result.is_ok())),
                        None => None,
                    }
                }
            }
        };
        if let Some((mv, ok)) = settled {
            self.settle(mv, ok);
        }
    }
}
