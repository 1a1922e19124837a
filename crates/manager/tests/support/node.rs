//! The node's way of storing and reading blocks, for the manager's
//! integration tests: an engine reserves G2 slots for a prefix chain, fills
//! them and commits; what G2 serves is read back from its arena.

// Each test file uses the part it needs.
#![allow(dead_code)]

use kvtier_core::{BlockHash, Lookup};
use kvtier_manager::manager::{BlockManager, HostCommit, HostReserve};
use kvtier_manager::test_support::block_content;
use kvtier_mem::MemoryTier;

use super::tiers::geometry;

/// `n` keys of one chain, `seed` apart from other chains.
pub fn chain(seed: u128, n: usize) -> Vec<BlockHash> {
    (0..n as u128)
        .map(|i| BlockHash((seed << 32) | (i + 1)))
        .collect()
}

/// Each key with its bytes ([`block_content`]).
pub fn with_bytes(keys: &[BlockHash]) -> Vec<(BlockHash, Vec<u8>)> {
    let len = geometry().block_bytes() as usize;
    keys.iter().map(|k| (*k, block_content(*k, len))).collect()
}

/// Stores `keys` as one prefix chain, as an engine does on the node:
/// reserve every key (each one's parent is the key before it), fill the
/// arena slots, commit. Every block must be stored.
pub async fn store_chain(m: &BlockManager, keys: &[BlockHash]) {
    let layer_bytes = geometry().layer_bytes() as usize;
    let granted = m.reserve_host(keys).await.expect("reserve");
    let mut filled = Vec::with_capacity(keys.len());
    for ((key, bytes), grant) in with_bytes(keys).into_iter().zip(granted) {
        let HostReserve::Reserved(mut r) = grant else {
            panic!("{key} not reserved: {grant:?}");
        };
        let sums = r.fill(&bytes, layer_bytes).expect("fill");
        filled.push((r, sums));
    }
    let committed = m.commit_host(filled).await;
    assert!(
        committed.iter().all(|c| matches!(c, HostCommit::Stored)),
        "{committed:?}"
    );
}

/// Checks that G2's arena serves each of `keys` with its own bytes.
pub fn assert_in_arena(memory: &MemoryTier, keys: &[BlockHash]) {
    let len = geometry().block_bytes() as usize;
    let mut out = vec![0u8; len];
    for k in keys {
        assert_eq!(memory.get(*k, &mut out), Lookup::Hit, "{k} not in G2");
        assert!(out == block_content(*k, len), "bytes of {k} in G2 differ");
    }
}
