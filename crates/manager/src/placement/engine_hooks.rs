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

    /// Moves staged and running.
    pub fn counts(&self) -> (usize, usize) {
        let m = self.inner.lock();
        (
            m.staged.values().map(VecDeque::len).sum(),
            m.running.len() + m.layered.len(),
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
            if ok {
                drop(mv.complete());
            } else {
                drop(mv);
            }
        }
    }
}
