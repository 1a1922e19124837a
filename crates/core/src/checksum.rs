//! Block checksums: one 64-bit value per block that also authenticates a
//! checksum per layer.
//!
//! ```text
//! layer_sum[l] = xxh3_64(bytes of layer l, seed = fold64(key) + l + 1)
//! block_sum    = xxh3_64(le64(layer_sum[0]) || ... || le64(layer_sum[L-1]), seed = fold64(key))
//! ```
//!
//! Why two levels: the disk index must stay under 64 bytes per block, so it
//! holds only `block_sum`; per-layer reads of a block are verified against
//! `layer_sum[l]`, read from the block's on-disk header, and that header is
//! itself authenticated by recombining its layer sums and comparing with the
//! `block_sum` from the index. A whole-block read recomputes every layer sum.
//! The checksum is computed once, when a block first enters kvtier, and
//! carried with the block through every tier, so a copy corrupted in one tier
//! is caught in the next rather than blessed with a fresh checksum.
//!
//! Seeding with the key binds bytes to their block: a misdirected read of
//! another block's bytes fails; the layer index in the seed catches swapped
//! layers.
//!
//! Layer sums are computed by the `xxh3` module's kernels, chosen at run time (AVX2
//! where the CPU has it), so a portable build verifies blocks at the speed
//! of the machine it runs on; [`copy_layer_checksum`] hashes while copying.

mod xxh3;

use crate::BlockHash;

/// A block checksum (the combined value).
pub type BlockChecksum = u64;

/// The checksum of layer `layer` of block `key`.
pub fn layer_checksum(key: BlockHash, layer: u32, bytes: &[u8]) -> u64 {
    xxh3::hash(bytes, layer_seed(key, layer))
}

/// Copies `dst.len()` bytes from `src` into `dst` and returns their
/// checksum as layer `layer` of block `key` (`layer_checksum` of `dst`), in
/// one pass over the memory.
///
/// # Safety
/// `src` must be valid for reads of `dst.len()` bytes and must not overlap
/// `dst`. If another thread or process writes the source meanwhile, the
/// result is still the checksum of what ended up in `dst`.
pub unsafe fn copy_layer_checksum(
    src: *const u8,
    dst: &mut [u8],
    key: BlockHash,
    layer: u32,
) -> u64 {
    // SAFETY: the caller's contract.
    unsafe { xxh3::copy_and_hash(src, dst, layer_seed(key, layer)) }
}

fn layer_seed(key: BlockHash, layer: u32) -> u64 {
    key.fold64().wrapping_add(layer as u64 + 1)
}

/// Combines per-layer checksums into the block checksum.
pub fn combine_layer_checksums(key: BlockHash, layer_sums: &[u64]) -> BlockChecksum {
    let mut h = xxhash_rust::xxh3::Xxh3::with_seed(key.fold64());
    for s in layer_sums {
        h.update(&s.to_le_bytes());
    }
    h.digest()
}

/// Per-layer checksums of a block whose layers are `layer_bytes` long
/// (the last layer may be shorter if `bytes` is not a multiple).
pub fn layer_checksums(key: BlockHash, layer_bytes: usize, bytes: &[u8]) -> Vec<u64> {
    let layer_bytes = layer_bytes.max(1);
    bytes
        .chunks(layer_bytes)
        .enumerate()
        .map(|(l, chunk)| layer_checksum(key, l as u32, chunk))
        .collect()
}

/// The block checksum of `bytes` as block `key` with layers of
/// `layer_bytes` bytes.
///
/// ```
/// use kvtier_core::{block_checksum, BlockHash};
/// let a = block_checksum(BlockHash(1), 2, b"kvkv");
/// assert_ne!(a, block_checksum(BlockHash(2), 2, b"kvkv"));
/// assert_ne!(a, block_checksum(BlockHash(1), 2, b"kvkV"));
/// ```
pub fn block_checksum(key: BlockHash, layer_bytes: usize, bytes: &[u8]) -> BlockChecksum {
    combine_layer_checksums(key, &layer_checksums(key, layer_bytes, bytes))
}

/// A block's checksums: the combined value and one per layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockSums {
    /// The combined checksum.
    pub block: BlockChecksum,
    /// One checksum per layer.
    pub layers: Vec<u64>,
}

impl BlockSums {
    /// Computes the checksums of `bytes` as block `key`.
    pub fn compute(key: BlockHash, layer_bytes: usize, bytes: &[u8]) -> Self {
        let layers = layer_checksums(key, layer_bytes, bytes);
        Self {
            block: combine_layer_checksums(key, &layers),
            layers,
        }
    }

    /// Whether the per-layer sums combine to the block sum (used to trust
    /// layer sums read back from a header).
    pub fn is_consistent(&self, key: BlockHash) -> bool {
        combine_layer_checksums(key, &self.layers) == self.block
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The format: a layer sum is plain XXH3-64 seeded with `fold64(key) +
    /// layer + 1`, whichever kernel computes it, copying or not.
    #[test]
    fn layer_sums_are_seeded_xxh3_by_every_kernel() {
        let bytes: Vec<u8> = (0..70_000u32)
            .map(|i| ((i * 13) ^ (i >> 9)) as u8)
            .collect();
        for key in [BlockHash(0), BlockHash(5), BlockHash(u128::MAX)] {
            for layer in [0u32, 1, 31] {
                for len in [0, 100, 700, 65_536, 70_000] {
                    let b = &bytes[..len];
                    let seed = key.fold64().wrapping_add(layer as u64 + 1);
                    let want = xxhash_rust::xxh3::xxh3_64_with_seed(b, seed);
                    assert_eq!(layer_checksum(key, layer, b), want);
                    let mut dst = vec![0u8; len];
                    // SAFETY: `b` is valid for dst.len() bytes and separate.
                    let fused = unsafe { copy_layer_checksum(b.as_ptr(), &mut dst, key, layer) };
                    assert_eq!(fused, want);
                    assert_eq!(dst, b);
                }
            }
        }
    }

    proptest! {
        #[test]
        fn any_flipped_bit_changes_the_checksum(
            len in 1usize..5000,
            layer_bytes in 1usize..1000,
            flip in any::<usize>(),
            bit in 0u8..8,
        ) {
            let data: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
            let key = BlockHash(99);
            let before = BlockSums::compute(key, layer_bytes, &data);
            prop_assert!(before.is_consistent(key));
            let mut bad = data.clone();
            let i = flip % len;
            bad[i] ^= 1 << bit;
            let after = BlockSums::compute(key, layer_bytes, &bad);
            prop_assert_ne!(before.block, after.block);
            // Exactly the layer holding the flipped byte changes.
            for (l, (a, b)) in before.layers.iter().zip(&after.layers).enumerate() {
                prop_assert_eq!(a == b, l != i / layer_bytes);
            }
        }
    }

    #[test]
    fn swapped_layers_are_caught() {
        let key = BlockHash(5);
        let a = [1u8; 8];
        let b = [2u8; 8];
        let ab = [a, b].concat();
        let ba = [b, a].concat();
        assert_ne!(block_checksum(key, 8, &ab), block_checksum(key, 8, &ba));
    }
}
