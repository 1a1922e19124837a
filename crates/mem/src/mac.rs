//! The MAC of a slot table entry: what lets an owner that adopts the arena
//! of a crashed one keep only the entries an owner published.
//!
//! Clients map the arena file writable (they fill slots in place), so a
//! hostile one can rewrite any table entry, sums and all, and fill the slot
//! with bytes that match. What it cannot do is compute the entry's MAC: a
//! keyed BLAKE3 under the node's table key, which no client ever sees.
//!
//! ```text
//! MAC = first 16 bytes of BLAKE3-keyed(table key,
//!         "kvtier-arena-entry-v2\0"
//!         || le32(format version)
//!         || le64(page bytes) || le64(slot bytes) || le64(slot count)
//!         || le64(block bytes) || le64(layer bytes)
//!         || le64(slot index)
//!         || le128(key) || le64(block sum) || le64(length)
//!         || le64(layer count) || le64(layer sum 0) || ... )
//! word 6 = le64(MAC bytes 0..8), word 7 = le64(MAC bytes 8..16)
//! ```
//!
//! The slot index is in it so an entry copied to another slot fails; the
//! geometry and format version, so an entry of another arena layout never
//! passes for one of this.

use std::fmt;

use kvtier_core::{BlockHash, BlockSums};

use kvtier_arena::header::FORMAT_VERSION;
use kvtier_arena::layout::ArenaLayout;

/// Domain tag of the entry MAC: frozen with the format version (a new
/// layout takes a new tag).
const TAG: &[u8] = b"kvtier-arena-entry-v2\0";

/// The 32-byte key that authenticates an owner's slot table entries
/// (a daemon derives it from its secret, `NodeSecret::table_key`). An arena
/// made under one key and found after a crash is adopted by an owner with
/// the same key; entries under any other key are dropped.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TableKey([u8; 32]);

impl TableKey {
    /// The key with these bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }
}

impl fmt::Debug for TableKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Whoever reads the key can forge entries: never print it.
        f.write_str("TableKey(..)")
    }
}

/// Computes entry MACs for one arena: the key and the arena's geometry.
#[derive(Clone)]
pub(crate) struct EntryMac {
    /// The keyed hasher fed with the tag, format version and geometry
    /// (the start of every message): cloned per entry, so the prefix is
    /// hashed once per arena rather than once per commit.
    base: blake3::Hasher,
}

/// Layer sums hashed per `update` call: a stack buffer of this many
/// words, so a MAC costs a few calls whatever the layer count.
const LAYER_CHUNK: usize = 32;

impl EntryMac {
    /// The MACs of entries of an arena of `layout` under `key`.
    pub(crate) fn new(key: &TableKey, layout: &ArenaLayout) -> Self {
        let mut prefix = TAG.to_vec();
        prefix.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        for v in [
            layout.page_bytes,
            layout.slot_bytes,
            layout.slot_count,
            layout.block_bytes,
            layout.layer_bytes,
        ] {
            prefix.extend_from_slice(&(v as u64).to_le_bytes());
        }
        let mut base = blake3::Hasher::new_keyed(&key.0);
        base.update(&prefix);
        Self { base }
    }

    /// The MAC words of an entry of `slot` asserting block `key` of `len`
    /// bytes with `sums`.
    pub(crate) fn compute(
        &self,
        slot: usize,
        key: BlockHash,
        len: u64,
        sums: &BlockSums,
    ) -> [u64; 2] {
        let mut h = self.base.clone();
        let mut fixed = [0u8; 48];
        fixed[..8].copy_from_slice(&(slot as u64).to_le_bytes());
        fixed[8..24].copy_from_slice(&key.0.to_le_bytes());
        fixed[24..32].copy_from_slice(&sums.block.to_le_bytes());
        fixed[32..40].copy_from_slice(&len.to_le_bytes());
        fixed[40..].copy_from_slice(&(sums.layers.len() as u64).to_le_bytes());
        h.update(&fixed);
        let mut chunk = [0u8; 8 * LAYER_CHUNK];
        for layers in sums.layers.chunks(LAYER_CHUNK) {
            for (dst, s) in chunk.chunks_exact_mut(8).zip(layers) {
                dst.copy_from_slice(&s.to_le_bytes());
            }
            h.update(&chunk[..8 * layers.len()]);
        }
        let out = h.finalize();
        let b = out.as_bytes();
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(w)
        };
        [word(0), word(8)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtier_arena::layout::PAGE_BYTES;

    #[test]
    fn the_mac_covers_every_field_and_the_arena() {
        let layout = ArenaLayout::compute(8192, 4096, 1 << 20, PAGE_BYTES).unwrap();
        let key = TableKey::from_bytes([7; 32]);
        let mac = EntryMac::new(&key, &layout);
        let sums = BlockSums {
            block: 5,
            layers: vec![1, 2],
        };
        let base = mac.compute(3, BlockHash(9), 8192, &sums);
        let other_sums = |f: &dyn Fn(&mut BlockSums)| {
            let mut s = sums.clone();
            f(&mut s);
            mac.compute(3, BlockHash(9), 8192, &s)
        };
        let changed = [
            mac.compute(4, BlockHash(9), 8192, &sums),
            mac.compute(3, BlockHash(9 | 1 << 100), 8192, &sums),
            mac.compute(3, BlockHash(9), 8191, &sums),
            other_sums(&|s| s.block ^= 1),
            other_sums(&|s| s.layers[1] ^= 1),
            other_sums(&|s| s.layers.push(0)),
            EntryMac::new(&TableKey::from_bytes([8; 32]), &layout).compute(
                3,
                BlockHash(9),
                8192,
                &sums,
            ),
            EntryMac::new(
                &key,
                &ArenaLayout::compute(8192, 4096, 2 << 20, PAGE_BYTES).unwrap(),
            )
            .compute(3, BlockHash(9), 8192, &sums),
        ];
        for (i, c) in changed.iter().enumerate() {
            assert_ne!(*c, base, "change {i} kept the MAC");
        }
        assert_eq!(mac.compute(3, BlockHash(9), 8192, &sums), base);
        assert_eq!(format!("{key:?}"), "TableKey(..)");
    }

    /// The message as the module doc spells it, built in one buffer and
    /// hashed in one call: what any other implementation would compute.
    fn documented(
        key: &TableKey,
        layout: &ArenaLayout,
        slot: u64,
        block: BlockHash,
        len: u64,
        sums: &BlockSums,
    ) -> [u64; 2] {
        let mut m = TAG.to_vec();
        m.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        for v in [
            layout.page_bytes,
            layout.slot_bytes,
            layout.slot_count,
            layout.block_bytes,
            layout.layer_bytes,
        ] {
            m.extend_from_slice(&(v as u64).to_le_bytes());
        }
        m.extend_from_slice(&slot.to_le_bytes());
        m.extend_from_slice(&block.0.to_le_bytes());
        m.extend_from_slice(&sums.block.to_le_bytes());
        m.extend_from_slice(&len.to_le_bytes());
        m.extend_from_slice(&(sums.layers.len() as u64).to_le_bytes());
        for s in &sums.layers {
            m.extend_from_slice(&s.to_le_bytes());
        }
        let out = blake3::keyed_hash(&key.0, &m);
        let b = out.as_bytes();
        let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        [word(0), word(8)]
    }

    proptest::proptest! {
        /// However many layers (across the chunking), the MAC is the
        /// documented message's keyed BLAKE3.
        #[test]
        fn the_mac_is_the_documented_message(
            slot in 0u64..1 << 40,
            block in proptest::prelude::any::<u128>(),
            sum in proptest::prelude::any::<u64>(),
            layers in proptest::collection::vec(proptest::prelude::any::<u64>(), 0..100),
        ) {
            let layout = ArenaLayout::compute(8192, 4096, 1 << 20, PAGE_BYTES).unwrap();
            let key = TableKey::from_bytes([3; 32]);
            let sums = BlockSums { block: sum, layers };
            let got = EntryMac::new(&key, &layout).compute(slot as usize, BlockHash(block), 8192, &sums);
            proptest::prop_assert_eq!(got, documented(&key, &layout, slot, BlockHash(block), 8192, &sums));
        }
    }
}
