//! Fixtures for tests and benches of the manager (feature `test-support`).

use kvtier_core::BlockHash;

/// Deterministic bytes of a block, a function of its hash: what a bench or
/// test "computes" and later verifies. A 256-byte xorshift pattern seeded by
/// the hash, repeated (cheap enough for a debug build to replay a whole
/// trace; any two blocks differ in every pattern).
pub fn block_content(hash: BlockHash, len: usize) -> Vec<u8> {
    let mut x = hash.fold64() | 1;
    let mut pattern = Vec::with_capacity(256);
    while pattern.len() < 256 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        pattern.extend_from_slice(&x.to_le_bytes());
    }
    let mut out = Vec::with_capacity(len + pattern.len());
    while out.len() < len {
        out.extend_from_slice(&pattern);
    }
    out.truncate(len);
    out
}
