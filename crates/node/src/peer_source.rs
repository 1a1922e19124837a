//! The node's tiers as the peer server's [`BlockSource`]
//! (docs/peer-protocol.md §8): each key is a stored key (the manager's
//! `BlockHash`, what the node publishes in its `kvtier://<node>/...`
//! locations), read from the fastest tier that holds it, G2, G3 or a
//! lower one alike, through the tier's `TierStore::read_into`: every byte
//! verified against the sums the tier stored, which are the sums sent
//! (never recomputed from the bytes, P6). A block the tier does not read
//! back verified is a miss.
//!
//! A block is held in its tier's pool for the whole read
//! ([`HeldBlocks`]): a handle, as an engine's load holds one, so the
//! block is neither evicted nor removed (a `Remove` leaves held copies)
//! until its bytes are out. Holding counts as a use of the block for the
//! tier's eviction policy: a block peers read is a block in use.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kvtier_core::{BlockHash, Lookup, MAX_TIERS, Tier};
use kvtier_io::DmaTarget;
use kvtier_manager::pool::ImmutableBlock;
use kvtier_peer::{BlockData, BlockSource, LayerRange, resolve_layers};
use kvtier_tier::{BoxFuture, ReadDone, Target};

use crate::{Node, NodeHost};

/// The node's tiers as a [`BlockSource`]: what `kvtier serve`'s peer
/// server answers from. Before the node is open (no shape yet), and once
/// it is closed, it is not ready: a read is answered `NotReady`, never
/// with misses, which readers would take as the node's word that it lacks
/// the blocks (docs/meta-api.md §10.4).
pub struct NodeSource {
    host: Arc<NodeHost>,
    served: Arc<ServedCounters>,
}

impl std::fmt::Debug for NodeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeSource")
            .field("open", &self.host.node().is_some())
            .finish()
    }
}

impl NodeSource {
    /// A source over `host`'s node, counting into `served`.
    pub(crate) fn new(host: Arc<NodeHost>, served: Arc<ServedCounters>) -> Self {
        Self { host, served }
    }

    /// A source over an open `node`, as `kvtier serve` builds it, for a
    /// peer server outside the daemon (the peer bench); its counters are
    /// its own.
    pub fn of(node: Arc<Node>) -> Self {
        Self::new(NodeHost::of(node), Arc::default())
    }
}

impl BlockSource for NodeSource {
    fn read<'a>(
        &'a self,
        keys: &'a [BlockHash],
        layers: LayerRange,
    ) -> BoxFuture<'a, Vec<Option<BlockData>>> {
        Box::pin(async move {
            let node = match self.host.node() {
                Some(node) if !node.is_closed() => node.clone(),
                _ => return vec![None; keys.len()],
            };
            let reads = HeldBlocks::take(&node, keys).read(layers).await;
            reads.into_iter().map(|r| self.served.count(r)).collect()
        })
    }

    fn ready(&self) -> bool {
        self.host.node().is_some_and(|n| !n.is_closed())
    }
}

/// What became of one key of a [`HeldBlocks::read`].
#[derive(Debug)]
pub enum HeldRead {
    /// No tier of the node holds the block.
    NotHeld,
    /// The tier holding the block did not read it back verified (or it
    /// has no such layers): a miss.
    Failed(Tier),
    /// The block's layers, verified, with the sums the tier stored.
    Served(Tier, BlockData),
}

/// Blocks held for a peer's read: per key, a handle in the pool of the
/// fastest tier that holds it. While it lives the block stays in that
/// tier: not evicted, not moved down, and a `Remove` leaves it.
pub struct HeldBlocks {
    node: Arc<Node>,
    keys: Vec<BlockHash>,
    held: Vec<Option<ImmutableBlock>>,
}

impl std::fmt::Debug for HeldBlocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldBlocks")
            .field("keys", &self.keys.len())
            .field("held", &self.held.iter().flatten().count())
            .finish()
    }
}

impl HeldBlocks {
    /// Holds each of `keys` (stored keys) in the fastest tier that holds
    /// it readable, one pool lock per tier for the whole batch.
    pub fn take(node: &Arc<Node>, keys: &[BlockHash]) -> Self {
        let mut held: Vec<Option<ImmutableBlock>> = keys.iter().map(|_| None).collect();
        let registry = node.manager().registry();
        for pool in registry.pools() {
            let wanted: Vec<BlockHash> = keys
                .iter()
                .zip(&held)
                .filter(|(_, h)| h.is_none())
                .map(|(k, _)| *k)
                .collect();
            if wanted.is_empty() {
                break;
            }
            // In key order, the absent skipped: matched by walking both.
            let mut got = pool.acquire_present(&wanted).into_iter().peekable();
            for (key, slot) in keys.iter().zip(held.iter_mut()) {
                if slot.is_none() && got.peek().is_some_and(|b| b.hash() == *key) {
                    *slot = got.next();
                }
            }
        }
        Self {
            node: node.clone(),
            keys: keys.to_vec(),
            held,
        }
    }

    /// The tier each key is held in (`None`: not held).
    pub fn tiers(&self) -> Vec<Option<Tier>> {
        self.held
            .iter()
            .map(|h| h.as_ref().map(|b| b.pool().tier()))
            .collect()
    }

    /// Reads the layers `layers` of every held block from its tier, one
    /// `read_into` per tier; the blocks are let go once every read is done.
    pub async fn read(self, layers: LayerRange) -> Vec<HeldRead> {
        let tiers = self.tiers();
        let mut out: Vec<HeldRead> = tiers
            .iter()
            .map(|t| t.map_or(HeldRead::NotHeld, HeldRead::Failed))
            .collect();
        let Some(shape) = ReadShape::of(&self.node, layers) else {
            return out;
        };
        for (tier, store) in self.node.manager().tiers().iter() {
            let at: Vec<usize> = (0..tiers.len())
                .filter(|&i| tiers[i] == Some(tier))
                .collect();
            if at.is_empty() {
                continue;
            }
            let reqs: Vec<(BlockHash, Target)> = at
                .iter()
                .map(|&i| (self.keys[i], Landing::target(shape.bytes)))
                .collect();
            let done = store.read_into(reqs, shape.range.clone()).await;
            for (i, d) in at.into_iter().zip(done) {
                if let Some(block) = landed(d, shape.layer_bytes) {
                    out[i] = HeldRead::Served(tier, block);
                }
            }
        }
        out
    }
}

/// What one read of layers asks of a tier.
struct ReadShape {
    /// `None` for every layer (a whole-block read), else the span.
    range: Option<Range<u32>>,
    /// Bytes read per block.
    bytes: usize,
    /// Bytes of one layer, as the wire carries it.
    layer_bytes: u32,
}

impl ReadShape {
    /// The read of `layers` of the node's blocks; `None` when the blocks
    /// have no such layers.
    fn of(node: &Node, layers: LayerRange) -> Option<Self> {
        let g = node.geometry();
        let (start, end) = resolve_layers(layers, g.layers as usize)?;
        let layer_bytes = u32::try_from(g.layer_bytes()).ok()?;
        let range = match layers {
            LayerRange::All => None,
            LayerRange::Span { start, end } => Some(start..end),
        };
        Some(Self {
            range,
            bytes: (end - start) * layer_bytes as usize,
            layer_bytes,
        })
    }
}

/// A tier's verified hit as the wire's block: the bytes read, the sums the
/// tier stored.
fn landed(done: ReadDone, layer_bytes: u32) -> Option<BlockData> {
    if done.lookup != Lookup::Hit {
        return None;
    }
    let sums = done.sums?;
    let bytes = done.target.into_any().downcast::<Landing>().ok()?.0;
    Some(BlockData {
        sums,
        layer_bytes,
        bytes,
    })
}

/// A heap buffer a tier reads a block into (the disk log through its
/// aligned bounce buffer when the buffer does not suit direct I/O).
struct Landing(Vec<u8>);

impl Landing {
    fn target(len: usize) -> Target {
        Box::new(Landing(vec![0; len]))
    }
}

// SAFETY: the Vec's heap buffer stays at one address for its length while
// the value lives (it is never resized), and moving the value does not
// move the buffer; the value is owned by the read while it runs.
unsafe impl DmaTarget for Landing {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// Blocks and bytes served to peers from each tier, and reads a tier
/// failed.
#[derive(Debug, Default)]
pub(crate) struct ServedCounters {
    blocks: [AtomicU64; MAX_TIERS],
    bytes: [AtomicU64; MAX_TIERS],
    failed: [AtomicU64; MAX_TIERS],
}

/// What one tier served to peers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ServedByTier {
    /// The tier.
    pub(crate) tier: Tier,
    /// Blocks read back verified and sent.
    pub(crate) blocks: u64,
    /// Their bytes.
    pub(crate) bytes: u64,
    /// Blocks held but not read back verified.
    pub(crate) failed: u64,
}

impl ServedCounters {
    /// Counts `read` and returns what goes on the wire.
    fn count(&self, read: HeldRead) -> Option<BlockData> {
        let add = |c: &AtomicU64, n: usize| c.fetch_add(n as u64, Ordering::Relaxed);
        match read {
            HeldRead::NotHeld => None,
            HeldRead::Failed(t) => {
                add(&self.failed[t.index()], 1);
                None
            }
            HeldRead::Served(t, block) => {
                add(&self.blocks[t.index()], 1);
                add(&self.bytes[t.index()], block.bytes.len());
                Some(block)
            }
        }
    }

    /// The counters of each tier of `tiers`.
    pub(crate) fn snapshot(&self, tiers: impl Iterator<Item = Tier>) -> Vec<ServedByTier> {
        let get = |c: &[AtomicU64; MAX_TIERS], t: Tier| c[t.index()].load(Ordering::Relaxed);
        tiers
            .map(|tier| ServedByTier {
                tier,
                blocks: get(&self.blocks, tier),
                bytes: get(&self.bytes, tier),
                failed: get(&self.failed, tier),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtier_peer::BlockSource;

    /// An open node's source is ready; once the node closes it is not, so
    /// its peer server answers `NotReady` rather than misses.
    #[tokio::test]
    async fn a_closed_nodes_source_is_not_ready() {
        let dir = tempfile::tempdir().unwrap();
        let config = crate::test_support::small_config(dir.path(), 4);
        let node = Node::open(&config, vec![]).await.unwrap();
        let source = NodeSource::of(node.clone());
        assert!(source.ready());
        node.close().await.unwrap();
        assert!(!source.ready());
    }
}
