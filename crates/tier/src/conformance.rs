//! Checks every [`TierStore`] implementation runs through the trait object
//! (feature `test-support`): round trips of whole blocks and layer ranges,
//! damaged blocks never read as hits, remove and keys. Each tier's crate
//! builds a real tier, calls these, and damages its own storage in between.
//! They panic on a failed check (they are test code).

use std::ops::Range;

use kvtier_core::{BlockHash, BlockSums, Lookup};
use kvtier_io::AlignedBuf;

use crate::{BlockPut, ReadDone, Target, TierStore};

/// Alignment of the read targets (suits direct I/O on every disk).
const ALIGN: usize = 4096;

/// A block to write and check: key, bytes, sums.
#[derive(Debug, Clone)]
pub struct TestBlock {
    /// The key.
    pub key: BlockHash,
    /// The bytes, a deterministic function of the key.
    pub data: Vec<u8>,
    /// The sums of `data` as block `key`.
    pub sums: BlockSums,
}

/// `n` blocks of `layers` layers of `layer_bytes` each, keys drawn from `seed`.
pub fn blocks(seed: u64, n: u64, layers: usize, layer_bytes: usize) -> Vec<TestBlock> {
    (0..n)
        .map(|i| {
            let key = BlockHash(u128::from(seed) << 64 | u128::from(i) | 1 << 63);
            let mut x = key.fold64() | 1;
            let data: Vec<u8> = (0..layers * layer_bytes)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let sums = BlockSums::compute(key, layer_bytes, &data);
            TestBlock { key, data, sums }
        })
        .collect()
}

/// Writes every block in one batch; every result must be `Ok`.
pub async fn put_all(tier: &dyn TierStore, blocks: &[TestBlock]) {
    let puts: Vec<BlockPut<'_>> = blocks
        .iter()
        .map(|b| BlockPut {
            key: b.key,
            data: &b.data,
            sums: &b.sums,
            pinned: None,
        })
        .collect();
    for (r, b) in tier.put_batch(&puts).await.into_iter().zip(blocks) {
        if let Err(e) = r {
            panic!("put {}: {e}", b.key);
        }
    }
}

/// Reads `keys` (whole, or `layers` of them) into fresh aligned targets of
/// `len` bytes; each outcome with the bytes read.
pub async fn read(
    tier: &dyn TierStore,
    keys: &[BlockHash],
    layers: Option<Range<u32>>,
    len: usize,
) -> Vec<(Lookup, Vec<u8>, Option<BlockSums>)> {
    let reqs: Vec<(BlockHash, Target)> = keys
        .iter()
        .map(|k| (*k, Box::new(AlignedBuf::zeroed(len, ALIGN)) as Target))
        .collect();
    let done = tier.read_into(reqs, layers).await;
    assert_eq!(done.len(), keys.len(), "one result per request");
    done.into_iter().map(unpack).collect()
}

fn unpack(d: ReadDone) -> (Lookup, Vec<u8>, Option<BlockSums>) {
    let buf = d
        .target
        .into_any()
        .downcast::<AlignedBuf>()
        .unwrap_or_else(|_| panic!("the target came back as another type"));
    (d.lookup, buf.to_vec(), d.sums)
}

/// Every block reads back whole as a verified hit with its bytes and sums,
/// and layers `layers` of it as exactly those bytes.
pub async fn check_round_trip(
    tier: &dyn TierStore,
    blocks: &[TestBlock],
    layer_bytes: usize,
    layers: Range<u32>,
) {
    let keys: Vec<BlockHash> = blocks.iter().map(|b| b.key).collect();
    let whole = read(tier, &keys, None, blocks[0].data.len()).await;
    for ((lookup, bytes, sums), b) in whole.iter().zip(blocks) {
        assert_eq!(*lookup, Lookup::Hit, "whole read of {}", b.key);
        assert!(*bytes == b.data, "whole bytes of {}", b.key);
        assert_eq!(sums.as_ref(), Some(&b.sums), "sums of {}", b.key);
    }
    let len = layers.len() * layer_bytes;
    let part = read(tier, &keys, Some(layers.clone()), len).await;
    let at = layers.start as usize * layer_bytes;
    for ((lookup, bytes, _), b) in part.iter().zip(blocks) {
        assert_eq!(*lookup, Lookup::Hit, "layer read of {}", b.key);
        assert!(
            bytes[..] == b.data[at..at + len],
            "layer bytes of {}",
            b.key
        );
    }
}

/// Reads `damaged` (whose stored bytes the caller changed) and `intact`:
/// no damaged block is a hit, every intact one is, with its own bytes.
pub async fn check_damaged_never_hit(
    tier: &dyn TierStore,
    damaged: &[TestBlock],
    intact: &[TestBlock],
) {
    let len = intact.iter().chain(damaged).map(|b| b.data.len()).next();
    let Some(len) = len else { return };
    let keys: Vec<BlockHash> = damaged.iter().map(|b| b.key).collect();
    for ((lookup, ..), b) in read(tier, &keys, None, len).await.iter().zip(damaged) {
        assert_ne!(
            *lookup,
            Lookup::Hit,
            "damaged block {} read as a hit",
            b.key
        );
    }
    let keys: Vec<BlockHash> = intact.iter().map(|b| b.key).collect();
    for ((lookup, bytes, _), b) in read(tier, &keys, None, len).await.iter().zip(intact) {
        assert_eq!(*lookup, Lookup::Hit, "intact block {}", b.key);
        assert!(*bytes == b.data, "intact bytes of {}", b.key);
    }
}

/// `keys` lists every block written; removing the first half reports them
/// removed, and afterwards they read as misses (and, for a tier with a
/// local index, `contains` is false for them and true for the rest).
pub async fn check_keys_and_remove(tier: &dyn TierStore, blocks: &[TestBlock]) {
    let mut listed = tier.keys().await;
    listed.sort();
    let mut written: Vec<BlockHash> = blocks.iter().map(|b| b.key).collect();
    written.sort();
    assert_eq!(listed, written, "keys lists what was written");
    let (gone, kept) = blocks.split_at(blocks.len() / 2);
    let gone_keys: Vec<BlockHash> = gone.iter().map(|b| b.key).collect();
    assert_eq!(tier.remove(&gone_keys).await, gone.len());
    let indexed = !tier.is_empty();
    for b in gone {
        assert!(!tier.contains(b.key), "{} still contained", b.key);
    }
    for b in kept {
        assert_eq!(tier.contains(b.key), indexed, "{} contained", b.key);
    }
    let len = blocks[0].data.len();
    for (lookup, ..) in read(tier, &gone_keys, None, len).await {
        assert_eq!(lookup, Lookup::Miss, "a removed block reads as a miss");
    }
}

/// A read into a target of another length than the block is never a hit;
/// the outcome is returned for the tier's own checks.
pub async fn check_wrong_length_never_hit(tier: &dyn TierStore, block: &TestBlock) -> ReadDone {
    let target = Box::new(AlignedBuf::zeroed(block.data.len() + ALIGN, ALIGN)) as Target;
    let mut done = tier.read_into(vec![(block.key, target)], None).await;
    assert_eq!(done.len(), 1, "one result per request");
    let done = done.remove(0);
    assert_ne!(
        done.lookup,
        Lookup::Hit,
        "a target of the wrong length read as a hit"
    );
    done
}

/// [`check_wrong_length_never_hit`], and the read failed with
/// [`TierError::WrongLength`](crate::TierError::WrongLength) (nothing
/// known about the block, so a caller keeps it), not as a miss.
pub async fn check_wrong_length_fails(tier: &dyn TierStore, block: &TestBlock) {
    let done = check_wrong_length_never_hit(tier, block).await;
    assert!(
        matches!(done.error, Some(crate::TierError::WrongLength { .. })),
        "a wrong length is a failed read, not a miss: {:?}",
        done.error
    );
}
