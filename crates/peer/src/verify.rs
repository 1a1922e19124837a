//! What a reader checks before it accepts a block from a peer (P6, P7):
//! the peer's layer sums combine to the block sum (so they belong to this
//! key), the block sum is the one the reader trusts when it has one, and
//! every layer's bytes hash to its sum.

use kvtier_core::{BlockChecksum, BlockHash, layer_checksum};

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

/// Whether `data` is layers `range` of block `key` as `expect` describes.
pub fn verify(key: BlockHash, expect: Expect, range: LayerRange, data: &BlockData) -> bool {
    let sums = &data.sums;
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
    layers_match(key, start, end, data)
}

/// Whether `data.bytes` cut into layers of `data.layer_bytes` are exactly
/// layers `start..end`, each hashing to its sum.
fn layers_match(key: BlockHash, start: usize, end: usize, data: &BlockData) -> bool {
    if data.bytes.is_empty() {
        return start == end;
    }
    if data.layer_bytes == 0 {
        return false;
    }
    let chunks = data.bytes.chunks(data.layer_bytes as usize);
    chunks.len() == end - start
        && chunks
            .zip(start..end)
            .all(|(chunk, l)| layer_checksum(key, l as u32, chunk) == data.sums.layers[l])
}

#[cfg(test)]
mod tests {
    use kvtier_core::BlockSums;
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
            prop_assert!(verify(key, Expect::Checksum(sums.block), range, &data));
            prop_assert!(verify(key, Expect::Consistent, range, &data));
            prop_assert!(!verify(key, Expect::Checksum(sums.block ^ 1), range, &data));
            prop_assert!(!verify(BlockHash(43), Expect::Consistent, range, &data));
            let mut bad = data.clone();
            let i = flip % bad.bytes.len();
            bad.bytes[i] ^= 1;
            prop_assert!(!verify(key, Expect::Consistent, range, &bad));
            // A byte short: the last layer's bytes change or a layer is gone.
            let mut short = data;
            short.bytes.pop();
            prop_assert!(!verify(key, Expect::Consistent, range, &short));
        }
    }
}
