//! Where a server's blocks come from: the [`BlockSource`] seam. The node
//! implements it over its G2 arena and G3 log; [`MemorySource`] holds
//! blocks in a map (a complete source, used by tests and examples).

use std::collections::HashMap;
use std::sync::Mutex;

use kvtier_core::{BlockHash, BlockSums};
use kvtier_tier::BoxFuture;

use crate::frame::{BlockData, LayerRange};

/// The blocks a [`crate::PeerServer`] serves.
pub trait BlockSource: Send + Sync + 'static {
    /// Reads `keys`, each for the layers `layers`: one entry per key, in
    /// order (a shorter answer is padded with misses). A block the source
    /// does not hold, or that has no such layers, is `None`. Each found
    /// block carries the sums it was stored with, never sums recomputed
    /// from the bytes read (so a copy corrupted here is caught by the
    /// reader, P6). The server asks for a few keys at a time, which bounds
    /// the memory one connection holds.
    fn read<'a>(
        &'a self,
        keys: &'a [BlockHash],
        layers: LayerRange,
    ) -> BoxFuture<'a, Vec<Option<BlockData>>>;

    /// Whether the source can tell which blocks it holds now. A `Read` of
    /// a source that cannot is answered
    /// [`ErrorCode::NotReady`](crate::frame::ErrorCode::NotReady), never
    /// with per-key misses: a reader takes
    /// a miss as the server's word that it lacks the block (and drops the
    /// block's location from the cluster), a failed read as its health.
    fn ready(&self) -> bool {
        true
    }
}

/// The layers `range` of a block with `layer_count` layers, as indices
/// `start..end`; `None` when the range is empty or past the block's end.
pub fn resolve_layers(range: LayerRange, layer_count: usize) -> Option<(usize, usize)> {
    match range {
        LayerRange::All => Some((0, layer_count)),
        LayerRange::Span { start, end } => {
            let (start, end) = (start as usize, end as usize);
            (start < end && end <= layer_count).then_some((start, end))
        }
    }
}

/// The layers `range` of a whole block `bytes` (layers of `layer_bytes`,
/// the last possibly shorter) with its stored `sums`, as a source answers
/// them; `None` if the block has no such layers.
pub fn slice_layers(
    sums: &BlockSums,
    layer_bytes: u32,
    bytes: &[u8],
    range: LayerRange,
) -> Option<BlockData> {
    let (start, end) = resolve_layers(range, sums.layers.len())?;
    let lb = layer_bytes as usize;
    let from = start.saturating_mul(lb).min(bytes.len());
    let to = end.saturating_mul(lb).min(bytes.len());
    Some(BlockData {
        sums: sums.clone(),
        layer_bytes,
        bytes: bytes[from..to].to_vec(),
    })
}

/// A whole block as [`MemorySource`] keeps it.
#[derive(Debug, Clone)]
struct Stored {
    sums: BlockSums,
    layer_bytes: u32,
    bytes: Vec<u8>,
}

/// Blocks held in memory: a [`BlockSource`] over a map.
#[derive(Debug, Default)]
pub struct MemorySource {
    // A std mutex: held only to clone one block out, never across an await.
    blocks: Mutex<HashMap<BlockHash, Stored>>,
}

impl MemorySource {
    /// An empty source.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores `bytes` as block `key` with layers of `layer_bytes`, with
    /// the sums computed from them.
    pub fn insert(&self, key: BlockHash, layer_bytes: u32, bytes: Vec<u8>) {
        let sums = BlockSums::compute(key, layer_bytes as usize, &bytes);
        self.insert_with_sums(key, layer_bytes, bytes, sums);
    }

    /// Stores `bytes` as block `key` with the sums given (which a faulty
    /// store may hold for other bytes: how tests model a corrupt copy).
    pub fn insert_with_sums(
        &self,
        key: BlockHash,
        layer_bytes: u32,
        bytes: Vec<u8>,
        sums: BlockSums,
    ) {
        let block = Stored {
            sums,
            layer_bytes,
            bytes,
        };
        self.lock().insert(key, block);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<BlockHash, Stored>> {
        // A panic elsewhere cannot leave the map half-changed: every
        // change is one insert.
        self.blocks.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn read_one(&self, key: &BlockHash, layers: LayerRange) -> Option<BlockData> {
        let map = self.lock();
        let b = map.get(key)?;
        slice_layers(&b.sums, b.layer_bytes, &b.bytes, layers)
    }
}

impl BlockSource for MemorySource {
    fn read<'a>(
        &'a self,
        keys: &'a [BlockHash],
        layers: LayerRange,
    ) -> BoxFuture<'a, Vec<Option<BlockData>>> {
        Box::pin(async move { keys.iter().map(|k| self.read_one(k, layers)).collect() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_resolve_within_the_block_only() {
        assert_eq!(resolve_layers(LayerRange::All, 4), Some((0, 4)));
        let span = |start, end| LayerRange::Span { start, end };
        assert_eq!(resolve_layers(span(1, 3), 4), Some((1, 3)));
        assert_eq!(resolve_layers(span(3, 4), 4), Some((3, 4)));
        assert_eq!(resolve_layers(span(2, 2), 4), None);
        assert_eq!(resolve_layers(span(3, 5), 4), None);
        assert_eq!(resolve_layers(span(u32::MAX, u32::MAX), 4), None);
    }

    #[test]
    fn a_slice_holds_exactly_its_layers() {
        let bytes: Vec<u8> = (0..10).collect();
        let sums = BlockSums::compute(BlockHash(1), 4, &bytes);
        let got = slice_layers(&sums, 4, &bytes, LayerRange::Span { start: 1, end: 3 }).unwrap();
        assert_eq!(got.bytes, (4..10).collect::<Vec<u8>>());
        assert_eq!(got.sums, sums);
    }
}
