//! Checksummed copies: every block that leaves shared memory is hashed as it
//! is copied.
//!
//! [`copy_verified`] copies one layer at a time and computes the layer's
//! checksum in the same pass ([`copy_layer_checksum`]): each 64-byte stripe
//! is loaded once, stored to the destination and fed to the hash from the
//! same registers. One trip through memory, no second pass over the block.
//! What is hashed is exactly what is stored to the destination, so the bytes
//! the caller gets are the bytes that were verified, even if the source
//! changed underneath (a writer in another process, a reused slot seen
//! through a stale map).

use kvtier_core::{BlockHash, copy_layer_checksum, layer_checksum};

/// Which layer failed, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every layer matched its checksum.
    Intact,
    /// Layer `0` (the first failing one) did not match.
    Corrupt(usize),
}

impl Verdict {
    /// Whether every layer matched.
    pub fn is_intact(self) -> bool {
        self == Verdict::Intact
    }
}

/// Copies `dst.len()` bytes from `src` into `dst` layer by layer, checking
/// layer `l` against `layer_sums[l]` as block `key`. Stops at the first
/// mismatch (the rest of `dst` is then unspecified). A `layer_sums` of the
/// wrong length is a mismatch.
///
/// # Safety
/// `src` must be valid for reads of `dst.len()` bytes and must not overlap
/// `dst`. Concurrent writes to the source are tolerated in the sense that
/// the result is then (at worst) a mismatch, never a false `Intact`: the
/// destination is what gets hashed.
pub unsafe fn copy_verified(
    src: *const u8,
    dst: &mut [u8],
    key: BlockHash,
    layer_bytes: usize,
    layer_sums: &[u64],
) -> Verdict {
    let layer_bytes = layer_bytes.max(1);
    if dst.len().div_ceil(layer_bytes) != layer_sums.len() {
        return Verdict::Corrupt(0);
    }
    for (l, (chunk, want)) in dst.chunks_mut(layer_bytes).zip(layer_sums).enumerate() {
        // SAFETY: `src + l * layer_bytes` is inside the caller's source
        // region for `chunk.len()` bytes, and does not overlap `dst`.
        let got = unsafe { copy_layer_checksum(src.add(l * layer_bytes), chunk, key, l as u32) };
        if got != *want {
            return Verdict::Corrupt(l);
        }
    }
    Verdict::Intact
}

/// Checks `bytes` in place against `layer_sums` as block `key`.
pub fn verify(bytes: &[u8], key: BlockHash, layer_bytes: usize, layer_sums: &[u64]) -> Verdict {
    let layer_bytes = layer_bytes.max(1);
    if bytes.len().div_ceil(layer_bytes) != layer_sums.len() {
        return Verdict::Corrupt(0);
    }
    for (l, (chunk, want)) in bytes.chunks(layer_bytes).zip(layer_sums).enumerate() {
        if layer_checksum(key, l as u32, chunk) != *want {
            return Verdict::Corrupt(l);
        }
    }
    Verdict::Intact
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtier_core::BlockSums;

    #[test]
    fn copies_and_catches_each_layer() {
        let key = BlockHash(77);
        let src: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
        let sums = BlockSums::compute(key, 3000, &src);
        let mut dst = vec![0u8; src.len()];
        // SAFETY: src is valid for dst.len() bytes and separate from dst.
        let v = unsafe { copy_verified(src.as_ptr(), &mut dst, key, 3000, &sums.layers) };
        assert_eq!(v, Verdict::Intact);
        assert_eq!(dst, src);
        assert!(verify(&src, key, 3000, &sums.layers).is_intact());
        for (at, layer) in [(0, 0), (2999, 0), (3000, 1), (9999, 3)] {
            let mut bad = src.clone();
            bad[at] ^= 1;
            // SAFETY: as above.
            let v = unsafe { copy_verified(bad.as_ptr(), &mut dst, key, 3000, &sums.layers) };
            assert_eq!(v, Verdict::Corrupt(layer));
            assert_eq!(
                verify(&bad, key, 3000, &sums.layers),
                Verdict::Corrupt(layer)
            );
        }
        // Wrong key, wrong layer count.
        assert!(!verify(&src, BlockHash(78), 3000, &sums.layers).is_intact());
        assert!(!verify(&src, key, 3000, &sums.layers[..3]).is_intact());
    }
}
