//! What a reader checks before it accepts a block from a peer (P6, P7):
//! the peer's layer sums combine to the block sum (so they belong to this
//! key), the block sum is the one the reader trusts when it has one, and
//! every layer's bytes hash to its sum.

use kvtier_core::{BlockChecksum, BlockHash, BlockSums, layer_checksum};

use crate::frame::{BlockData, LayerRange};
use crate::source::resolve_layers;

/// What the reader already knows of a block it asks a peer for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// The block's combined checksum, from a source the reader trusts (the
    /// metadata service, its own index): the peer's sums must combine to
    /// it. Catches a corrupt copy and a peer that sends another block.
    Checksum(BlockChecksum),
    /// Nothing: the peer's own sums are checked for consistency with the
    /// key and the bytes against them. Catches corruption in the peer's
    /// tiers or on the wire, not a peer that makes up a block and its sums.
    Consistent,
}

/// Whether `bytes`, with the peer's `sums` and layers of `layer_bytes`,
/// are layers `range` of block `key` as `expect` describes.
pub fn verify(
    key: BlockHash,
    expect: Expect,
    range: LayerRange,
    sums: &BlockSums,
    layer_bytes: u32,
    bytes: &[u8],
) -> bool {
    if !sums.is_consistent(key) {
        return false;
    }
    if let Expect::Checksum(want) = expect
        && sums.block != want
    {
        return false;
    }
    let Some((start, end)) = resolve_layers(range, sums.layers.len()) else {
        return false;
    };
    layers_match(key, start..end, sums, layer_bytes, bytes)
}

/// Whether `bytes` cut into layers of `layer_bytes` are exactly the
/// layers `range`, each hashing to its sum.
fn layers_match(
    key: BlockHash,
    range: std::ops::Range<usize>,
    sums: &BlockSums,
    layer_bytes: u32,
    bytes: &[u8],
) -> bool {
    if bytes.is_empty() {
        return range.is_empty();
    }
    if layer_bytes == 0 {
        return false;
    }
    let chunks = bytes.chunks(layer_bytes as usize);
    chunks.len() == range.len()
        && chunks
            .zip(range)
            .all(|(chunk, l)| layer_checksum(key, l as u32, chunk) == sums.layers[l])
}

impl BlockData {
    /// Whether this is layers `range` of block `key` as `expect` describes
    /// ([`verify`]).
    pub fn verify(&self, key: BlockHash, expect: Expect, range: LayerRange) -> bool {
        verify(
            key,
            expect,
            range,
            &self.sums,
            self.layer_bytes,
            &self.bytes,
        )
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::source::slice_layers;

    proptest! {
        /// Every range of a stored block verifies; one flipped bit in it,
        /// or the wrong trusted checksum, never does.
        #[test]
        fn sliced_blocks_verify_and_damaged_ones_do_not(
            len in 1usize..400,
            layer_bytes in 1u32..64,
            a in any::<u32>(),
            b in any::<u32>(),
            flip in any::<usize>(),
        ) {
            let key = BlockHash(42);
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let sums = BlockSums::compute(key, layer_bytes as usize, &bytes);
            let layers = sums.layers.len() as u32;
            let (start, end) = (a % layers, b % layers);
            let range = if start == end {
                LayerRange::All
            } else {
                LayerRange::Span { start: start.min(end), end: start.max(end) + 1 }
            };
            let data = slice_layers(&sums, layer_bytes, &bytes, range).unwrap();
            prop_assert!(data.verify(key, Expect::Checksum(sums.block), range));
            prop_assert!(data.verify(key, Expect::Consistent, range));
            prop_assert!(!data.verify(key, Expect::Checksum(sums.block ^ 1), range));
            prop_assert!(!data.verify(BlockHash(43), Expect::Consistent, range));
            let mut bad = data.clone();
            let i = flip % bad.bytes.len();
            bad.bytes[i] ^= 1;
            prop_assert!(!bad.verify(key, Expect::Consistent, range));
            // A byte short: the last layer's bytes change or a layer is gone.
            let mut short = data;
            short.bytes.pop();
            prop_assert!(!short.verify(key, Expect::Consistent, range));
        }
    }
}
