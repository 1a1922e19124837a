//! Write order of a round's moves: prefix chains contiguous, root first.
//!
//! A disk tier puts the blocks of one `put_batch` call on consecutive slots
//! in call order, and on a layer-major region a run of adjacent slots reads
//! one layer in one I/O op. A later prefix hit loads a chain root first,
//! so the chain should sit on adjacent slots root first: victims leave a
//! pool leaf first, and without reordering a chain lands reversed (a hit
//! on its first blocks then reads single slots, not a run).

use kvtier_core::{BlockHash, BlockHashMap};

use super::Move;
use crate::pool::PoolLock;

/// A round's moves as they are planned, each beside its block's parent;
/// [`ChainMoves::finish`] hands them over in chain order. Every planner of
/// moves into a lower tier collects through it, so none can forget the
/// order.
pub(crate) struct ChainMoves<L: PoolLock> {
    moves: Vec<Move<L>>,
    parents: Vec<Option<BlockHash>>,
}

impl<L: PoolLock> ChainMoves<L> {
    /// Room for `n` moves.
    pub(crate) fn with_capacity(n: usize) -> Self {
        ChainMoves {
            moves: Vec::with_capacity(n),
            parents: Vec::with_capacity(n),
        }
    }

    /// Adds a move; `parent` is its block's parent, if known.
    pub(crate) fn push(&mut self, m: Move<L>, parent: Option<BlockHash>) {
        self.moves.push(m);
        self.parents.push(parent);
    }

    /// The moves, chain-contiguous and root first ([`order_chains`]).
    pub(crate) fn finish(self) -> Vec<Move<L>> {
        order_chains(self.moves, &self.parents)
    }
}

/// Reorders `moves` so that the moves of one prefix chain (per transfer
/// path) are contiguous and each parent comes before its children: a
/// depth-first preorder of the forest the parent links form within the
/// batch. `parents[i]` is the parent of `moves[i]` (`None` for a root or
/// an unknown parent). Roots keep their planned order, as do siblings, so
/// the order is deterministic; which moves are in the batch never changes.
/// O(n).
fn order_chains<L: PoolLock>(moves: Vec<Move<L>>, parents: &[Option<BlockHash>]) -> Vec<Move<L>> {
    let hashes: Vec<BlockHash> = moves.iter().map(|m| m.hash).collect();
    let paths: Vec<_> = moves.iter().map(|m| m.path).collect();
    // A parent counts only when it is in this batch on the same path: other
    // paths go to other tiers (and other `put_batch` calls).
    chain_ordered(moves, &hashes, parents, |i, j| paths[i] == paths[j])
}

/// Reorders `items` (the blocks `hashes`, whose parents are `parents`)
/// root first, each chain contiguous, as [`order_chains`] does; `linked(i,
/// j)` says whether item `j` may count as item `i`'s parent. Roots and
/// siblings keep their order. O(n).
pub(crate) fn chain_ordered<T>(
    items: Vec<T>,
    hashes: &[BlockHash],
    parents: &[Option<BlockHash>],
    linked: impl Fn(usize, usize) -> bool,
) -> Vec<T> {
    let n = items.len();
    if n < 2 {
        return items;
    }
    let mut index: BlockHashMap<usize> =
        BlockHashMap::with_capacity_and_hasher(n, Default::default());
    for (i, h) in hashes.iter().enumerate() {
        index.entry(*h).or_insert(i);
    }
    let up: Vec<Option<usize>> = (0..n)
        .map(|i| {
            parents
                .get(i)
                .copied()
                .flatten()
                .and_then(|p| index.get(&p).copied())
                .filter(|&j| j != i && linked(i, j))
        })
        .collect();
    let order = kvtier_core::chain_order::preorder(&up);
    let mut slots: Vec<Option<T>> = items.into_iter().map(Some).collect();
    order.into_iter().filter_map(|i| slots[i].take()).collect()
}
