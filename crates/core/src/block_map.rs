//! The hasher of maps keyed by [`BlockHash`] (a pool's slots, the disk
//! tier's layer-sums cache).
//!
//! Chained block hashes are already uniformly random, but external ids
//! (Mooncake trace `hash_ids`, engine counters) are often small sequential
//! integers, so a plain fold would leave the high bits, which `hashbrown`
//! uses for its control bytes, empty. One multiply by an odd constant
//! spreads them, at a fraction of SipHash's cost on a 16-byte key.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::BlockHash;

/// A map keyed by block hash with [`BlockHashHasher`].
pub type BlockHashMap<V> = HashMap<BlockHash, V, BuildHasherDefault<BlockHashHasher>>;

/// Folds a `u128` key to 64 bits and mixes it with one multiplication.
#[derive(Debug, Default, Clone, Copy)]
pub struct BlockHashHasher(u64);

const MIX: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for BlockHashHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u128(&mut self, i: u128) {
        let folded = (i as u64) ^ ((i >> 64) as u64);
        self.0 = (self.0 ^ folded).wrapping_mul(MIX);
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not reached for `BlockHash` (it hashes as one u128); kept correct
        // for any other use.
        for chunk in bytes.chunks(8) {
            let mut buf = [0u8; 8];
            buf[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0 ^ u64::from_le_bytes(buf)).wrapping_mul(MIX);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_ids_spread_into_high_bits() {
        let tops: std::collections::HashSet<u64> = (0..64u128)
            .map(|i| {
                let mut h = BlockHashHasher::default();
                std::hash::Hash::hash(&BlockHash(i), &mut h);
                h.finish() >> 57
            })
            .collect();
        assert!(
            tops.len() > 32,
            "only {} distinct top-7-bit tags",
            tops.len()
        );
    }
}
