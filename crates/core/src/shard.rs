//! Head shards: blocks stored per range of KV heads, so that a block saved
//! by an engine at one tensor-parallel size loads at another.
//!
//! A tensor-parallel rank holds only some of a model's KV heads; which ones
//! depends on the TP size. Blocks stored per rank therefore cannot be
//! shared across TP sizes. Instead a block of a model with `kv_heads` KV
//! heads is stored as [`HeadShards::count`] objects, *shards*: shard `s`
//! holds heads `[s * shard_heads, (s + 1) * shard_heads)` of every layer.
//! A rank stores and loads the shards its heads cover
//! ([`HeadShards::for_rank`]), and every rank of every TP size names a
//! shard by the same key ([`HeadShards::key`]):
//!
//! ```text
//! shard_key(block, s) = xxh3_128( "kvtier-head-shard-v1" || le128(block)
//!                                 || le32(s) || le32(shard_heads) || le32(kv_heads) )
//! ```
//!
//! The node daemon's geometry is one shard's shape
//! ([`HeadShards::shard_geometry`]), which no engine's TP size changes, and
//! shard clients use a rank-less namespace ([`SHARED_TP_RANK`],
//! [`SHARED_TP_SIZE`]). Ranks that replicate heads (more ranks than KV
//! heads) and multi-head latent attention (one latent, every rank holds it:
//! [`HeadShards::mla`]) compute equal keys, so the daemon stores each shard
//! once.
//!
//! A list of shard keys for many blocks is *interleaved*, block-major
//! ([`HeadShards::keys`]): a daemon's stored prefix of it covers whole
//! blocks up to [`blocks_in_prefix`]. docs/block-identity.md, "Head shards",
//! states the invariants.
//!
//! ```
//! use kvtier_core::{BlockHash, HeadShards};
//!
//! // 8 KV heads, shared by engines at TP 1, 2 and 4.
//! let shards = HeadShards::for_tp_sizes(8, &[1, 2, 4]).unwrap();
//! assert_eq!((shards.shard_heads(), shards.count()), (2, 4));
//! // Rank 1 of 2 holds heads 4..8: shards 2 and 3.
//! assert_eq!(shards.for_rank(1, 2).unwrap(), 2..4);
//! let blocks = [BlockHash(10), BlockHash(11)];
//! let keys = shards.rank_keys(&blocks, 1, 2).unwrap();
//! assert_eq!(keys, vec![
//!     shards.key(blocks[0], 2), shards.key(blocks[0], 3),
//!     shards.key(blocks[1], 2), shards.key(blocks[1], 3),
//! ]);
//! // Its engine blocks 7 and 3, as two shards each.
//! assert_eq!(shards.rank_block_ids(&[7, 3], 1, 2).unwrap(), vec![14, 15, 6, 7]);
//! ```

use std::ops::Range;

use xxhash_rust::xxh3::xxh3_128;

use crate::{Attention, BlockHash, CoreError, Geometry, Result};

/// Domain tag of shard keys; a new derivation gets a new tag.
const SHARD_KEY_TAG: &[u8] = b"kvtier-head-shard-v1";

/// The TP rank a client storing shards names in its namespace: shards are
/// no one rank's, so every rank of every TP size uses the same namespace.
pub const SHARED_TP_RANK: u32 = 0;

/// The TP size a client storing shards names in its namespace (see
/// [`SHARED_TP_RANK`]).
pub const SHARED_TP_SIZE: u32 = 1;

/// How a model's KV heads are cut into shards: `kv_heads` heads,
/// `shard_heads` per shard. See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HeadShards {
    kv_heads: u32,
    shard_heads: u32,
}

impl HeadShards {
    /// Shards of `shard_heads` heads of a model with `kv_heads` KV heads.
    /// Both must be positive and `shard_heads` must divide `kv_heads`.
    pub fn new(kv_heads: u32, shard_heads: u32) -> Result<Self> {
        if kv_heads == 0 || shard_heads == 0 {
            return bad("kv_heads and shard_heads must be positive".into());
        }
        if !kv_heads.is_multiple_of(shard_heads) {
            return bad(format!(
                "{kv_heads} KV heads do not split into shards of {shard_heads}"
            ));
        }
        Ok(Self {
            kv_heads,
            shard_heads,
        })
    }

    /// Multi-head latent attention: one latent per token that every rank
    /// holds whole, so one shard of one "head", which every rank maps to.
    pub const fn mla() -> Self {
        Self {
            kv_heads: 1,
            shard_heads: 1,
        }
    }

    /// The largest shards every rank of each TP size in `tp_sizes` can
    /// store whole: `shard_heads` is the greatest common divisor of the
    /// heads per rank (`max(1, kv_heads / t)`) of those sizes. An empty
    /// list means TP 1 only (one shard of every head). A TP size that
    /// cannot split `kv_heads` is an error.
    pub fn for_tp_sizes(kv_heads: u32, tp_sizes: &[u32]) -> Result<Self> {
        if kv_heads == 0 {
            return bad("kv_heads must be positive".into());
        }
        let mut shard_heads = kv_heads;
        for &t in tp_sizes {
            check_split(kv_heads, t)?;
            shard_heads = gcd(shard_heads, heads_per_rank(kv_heads, t));
        }
        Self::new(kv_heads, shard_heads)
    }

    /// The shards of a model geometry's KV heads: `shard_heads` per shard
    /// for multi-head attention, [`mla`](Self::mla) for latent attention
    /// (where `shard_heads` must be 1: the latent does not split).
    pub fn from_geometry(model: &Geometry, shard_heads: u32) -> Result<Self> {
        match model.attention {
            Attention::Mha { kv_heads, .. } => Self::new(kv_heads, shard_heads),
            Attention::Mla { .. } if shard_heads == 1 => Ok(Self::mla()),
            Attention::Mla { .. } => bad(format!(
                "a latent (MLA) does not split into shards of {shard_heads} heads"
            )),
        }
    }

    /// KV heads of the whole model.
    pub const fn kv_heads(&self) -> u32 {
        self.kv_heads
    }

    /// KV heads per shard.
    pub const fn shard_heads(&self) -> u32 {
        self.shard_heads
    }

    /// Shards per block (`kv_heads / shard_heads`).
    pub const fn count(&self) -> u32 {
        self.kv_heads / self.shard_heads
    }

    /// The heads of `shard`; `None` past the last shard.
    pub fn heads(&self, shard: u32) -> Option<Range<u32>> {
        (shard < self.count()).then(|| shard * self.shard_heads..(shard + 1) * self.shard_heads)
    }

    /// The shard holding `head`; `None` past the last head.
    pub fn shard_of(&self, head: u32) -> Option<u32> {
        (head < self.kv_heads).then(|| head / self.shard_heads)
    }

    /// The KV heads rank `tp_rank` of `tp_size` holds, as vLLM and SGLang
    /// split them: `kv_heads / tp_size` consecutive heads each, or, with
    /// more ranks than heads, head `tp_rank / (tp_size / kv_heads)` (each
    /// head replicated on `tp_size / kv_heads` consecutive ranks).
    pub fn rank_heads(&self, tp_rank: u32, tp_size: u32) -> Result<Range<u32>> {
        check_split(self.kv_heads, tp_size)?;
        if tp_rank >= tp_size {
            return bad(format!("tp_rank {tp_rank} must be below tp_size {tp_size}"));
        }
        if tp_size <= self.kv_heads {
            let per = self.kv_heads / tp_size;
            return Ok(tp_rank * per..(tp_rank + 1) * per);
        }
        let head = tp_rank / (tp_size / self.kv_heads);
        Ok(head..head + 1)
    }

    /// The shards rank `tp_rank` of `tp_size` stores and loads: those its
    /// heads ([`rank_heads`](Self::rank_heads)) cover. An error when its
    /// heads are not whole shards (`shard_heads` must divide the heads per
    /// rank of every TP size that shares blocks).
    pub fn for_rank(&self, tp_rank: u32, tp_size: u32) -> Result<Range<u32>> {
        let heads = self.rank_heads(tp_rank, tp_size)?;
        let whole = |h: u32| h.is_multiple_of(self.shard_heads);
        if !whole(heads.start) || !whole(heads.end) {
            return bad(format!(
                "rank {tp_rank} of {tp_size} holds heads {heads:?}, not whole shards of {} heads",
                self.shard_heads
            ));
        }
        Ok(heads.start / self.shard_heads..heads.end / self.shard_heads)
    }

    /// The client key of shard `shard` of the block the engine keys
    /// `block` (see the module docs). Equal for every rank and TP size;
    /// different for another shard, block, `shard_heads` or `kv_heads`.
    pub fn key(&self, block: BlockHash, shard: u32) -> BlockHash {
        let mut buf = [0u8; SHARD_KEY_TAG.len() + 16 + 3 * 4];
        let (tag, rest) = buf.split_at_mut(SHARD_KEY_TAG.len());
        tag.copy_from_slice(SHARD_KEY_TAG);
        rest[..16].copy_from_slice(&block.to_le_bytes());
        for (i, n) in [shard, self.shard_heads, self.kv_heads].iter().enumerate() {
            rest[16 + 4 * i..20 + 4 * i].copy_from_slice(&n.to_le_bytes());
        }
        BlockHash(xxh3_128(&buf))
    }

    /// The keys of `shards` of each block, block-major: `[key(b, s) for b
    /// in blocks for s in shards]`. A stored prefix of the list covers
    /// [`blocks_in_prefix`] whole blocks.
    pub fn keys(&self, blocks: &[BlockHash], shards: Range<u32>) -> Vec<BlockHash> {
        blocks
            .iter()
            .flat_map(|&b| shards.clone().map(move |s| self.key(b, s)))
            .collect()
    }

    /// The keys of every shard of each block, block-major: what a
    /// scheduler looks up to learn how many whole blocks the node holds.
    pub fn all_keys(&self, blocks: &[BlockHash]) -> Vec<BlockHash> {
        self.keys(blocks, 0..self.count())
    }

    /// The keys rank `tp_rank` of `tp_size` stores and loads for `blocks`:
    /// [`keys`](Self::keys) of its [`for_rank`](Self::for_rank) shards.
    pub fn rank_keys(
        &self,
        blocks: &[BlockHash],
        tp_rank: u32,
        tp_size: u32,
    ) -> Result<Vec<BlockHash>> {
        Ok(self.keys(blocks, self.for_rank(tp_rank, tp_size)?))
    }

    /// Where each key of [`rank_keys`](Self::rank_keys) lies in the
    /// rank's memory, as a "virtual block id" of one shard: engine block
    /// `b`'s `j`-th shard is `b * shards_per_rank + j`. In a layout whose
    /// per-layer tensor holds a block's heads one after the other, that id
    /// times the bytes of one shard's layer is the shard's offset (see
    /// [`virtual_block_ids`]).
    pub fn rank_block_ids(
        &self,
        block_ids: &[usize],
        tp_rank: u32,
        tp_size: u32,
    ) -> Result<Vec<usize>> {
        let per = self.for_rank(tp_rank, tp_size)?.len();
        virtual_block_ids(block_ids, per)
    }

    /// The node daemon's geometry for these shards of `model`: one shard's
    /// shape (its heads, every layer) at TP 1, whatever `model`'s TP size.
    /// `model` must have these shards' `kv_heads` (1 for a latent).
    pub fn shard_geometry(&self, model: &Geometry) -> Result<Geometry> {
        let attention = match model.attention {
            Attention::Mha { kv_heads, head_dim } if kv_heads == self.kv_heads => Attention::Mha {
                kv_heads: self.shard_heads,
                head_dim,
            },
            Attention::Mla { latent_dim } if self.kv_heads == 1 => Attention::Mla { latent_dim },
            other => {
                return bad(format!(
                    "shards of {} KV heads do not fit attention {other:?}",
                    self.kv_heads
                ));
            }
        };
        let g = Geometry {
            attention,
            tp_size: 1,
            tp_rank: 0,
            ..*model
        };
        g.validate()?;
        Ok(g)
    }
}

/// Engine block ids as ids of their shards: block `b` becomes `b * per +
/// j` for `j` in `0..per`, block-major (the order of
/// [`HeadShards::keys`]). An id that overflows is an error.
pub fn virtual_block_ids(block_ids: &[usize], per: usize) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(block_ids.len().saturating_mul(per));
    for &b in block_ids {
        let base = b
            .checked_mul(per)
            .ok_or_else(|| CoreError::InvalidGeometry(format!("block id {b} overflows")))?;
        out.extend((0..per).map(|j| base + j));
    }
    Ok(out)
}

/// Whole blocks in a stored prefix of `prefix_len` keys of a block-major
/// list with `shards_per_block` shards per block: a block counts only when
/// all its shards are in the prefix. Zero shards per block gives zero.
pub const fn blocks_in_prefix(prefix_len: usize, shards_per_block: usize) -> usize {
    match shards_per_block {
        0 => 0,
        n => prefix_len / n,
    }
}

/// Refuses a TP size vLLM and SGLang would refuse: heads split evenly
/// over ranks, or ranks evenly over heads.
fn check_split(kv_heads: u32, tp_size: u32) -> Result<()> {
    let even = if tp_size <= kv_heads {
        kv_heads.is_multiple_of(tp_size)
    } else {
        tp_size.is_multiple_of(kv_heads)
    };
    if tp_size == 0 || kv_heads == 0 || !even {
        return bad(format!(
            "{kv_heads} KV heads do not split over TP {tp_size}"
        ));
    }
    Ok(())
}

/// Heads each rank holds at `tp_size` (`Geometry::kv_heads_per_rank`).
fn heads_per_rank(kv_heads: u32, tp_size: u32) -> u32 {
    (kv_heads / tp_size).max(1)
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn bad<T>(message: String) -> Result<T> {
    Err(CoreError::InvalidGeometry(message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Dtype, ModelPreset};
    use proptest::prelude::*;
    use std::collections::HashSet;

    /// A head count and a divisor of it.
    fn heads_and_divisor() -> impl Strategy<Value = (u32, u32)> {
        (1u32..=64).prop_flat_map(|kv| {
            let divisors: Vec<u32> = (1..=kv).filter(|d| kv.is_multiple_of(*d)).collect();
            (Just(kv), proptest::sample::select(divisors))
        })
    }

    /// A head count and a TP size vLLM accepts for it (a divisor or a
    /// multiple of it).
    fn heads_and_tp() -> impl Strategy<Value = (u32, u32)> {
        (1u32..=32).prop_flat_map(|kv| {
            let mut sizes: Vec<u32> = (1..=kv).filter(|t| kv.is_multiple_of(*t)).collect();
            sizes.extend((2..=4).map(|m| kv * m));
            (Just(kv), proptest::sample::select(sizes))
        })
    }

    fn mha(kv_heads: u32, tp_rank: u32, tp_size: u32) -> Geometry {
        Geometry {
            layers: 2,
            attention: Attention::Mha {
                kv_heads,
                head_dim: 4,
            },
            dtype: Dtype::F16,
            tokens_per_block: 16,
            tp_size,
            tp_rank,
        }
    }

    proptest! {
        #[test]
        fn every_head_is_in_exactly_one_shard((kv, sh) in heads_and_divisor()) {
            let shards = HeadShards::new(kv, sh).unwrap();
            for head in 0..kv {
                let holding: Vec<u32> = (0..shards.count())
                    .filter(|&s| shards.heads(s).unwrap().contains(&head))
                    .collect();
                prop_assert_eq!(&holding, &vec![shards.shard_of(head).unwrap()]);
            }
            prop_assert_eq!(shards.heads(shards.count()), None);
            prop_assert_eq!(shards.shard_of(kv), None);
        }

        #[test]
        fn ranks_of_one_tp_size_cover_every_shard_once((kv, t) in heads_and_tp()) {
            let shards = HeadShards::for_tp_sizes(kv, &[t]).unwrap();
            let held: Vec<Range<u32>> =
                (0..t).map(|r| shards.for_rank(r, t).unwrap()).collect();
            for (r, range) in held.iter().enumerate() {
                // Heads per rank as the geometry has them.
                let heads = shards.rank_heads(r as u32, t).unwrap();
                prop_assert_eq!(heads.len() as u32, mha(kv, r as u32, t).kv_heads_per_rank());
                prop_assert!(!range.is_empty());
            }
            if t <= kv {
                // In rank order the ranges tile 0..count: each shard once.
                let tiled: Vec<u32> = held.iter().flat_map(|r| r.clone()).collect();
                prop_assert_eq!(tiled, (0..shards.count()).collect::<Vec<_>>());
            } else {
                // Replicated: one head per rank, each on t / kv ranks in a row.
                for (r, range) in held.iter().enumerate() {
                    let s = r as u32 / (t / kv);
                    prop_assert_eq!(range.clone(), s..s + 1);
                }
            }
        }

        #[test]
        fn shards_for_tp_sizes_are_the_largest_every_size_can_store(
            (kv, _) in heads_and_tp(),
            picks in proptest::collection::vec(0usize..64, 0..4),
        ) {
            let valid: Vec<u32> = (1..=4 * kv)
                .filter(|&t| check_split(kv, t).is_ok())
                .collect();
            let sizes: Vec<u32> = picks.iter().map(|i| valid[i % valid.len()]).collect();
            let shards = HeadShards::for_tp_sizes(kv, &sizes).unwrap();
            let fits = |sh: u32| {
                let s = HeadShards::new(kv, sh).unwrap();
                sizes.iter().all(|&t| (0..t).all(|r| s.for_rank(r, t).is_ok()))
            };
            prop_assert!(fits(shards.shard_heads()));
            for larger in shards.shard_heads() + 1..=kv {
                if kv.is_multiple_of(larger) {
                    prop_assert!(!fits(larger), "{larger} heads per shard would do");
                }
            }
        }

        #[test]
        fn keys_differ_across_shards_shard_sizes_and_blocks(
            blocks in proptest::collection::hash_set(any::<u128>(), 1..6),
            (kv, sh) in heads_and_divisor(),
        ) {
            let shards = HeadShards::new(kv, sh).unwrap();
            let blocks: Vec<BlockHash> = blocks.into_iter().map(BlockHash).collect();
            let keys = shards.all_keys(&blocks);
            prop_assert_eq!(keys.len(), blocks.len() * shards.count() as usize);
            let mut seen: HashSet<BlockHash> = keys.iter().copied().collect();
            prop_assert_eq!(seen.len(), keys.len());
            // Another cut of the same heads, or of another head count,
            // never names the same object.
            for other in [HeadShards::new(kv, 1), HeadShards::new(kv * 2, sh)] {
                let other = other.unwrap();
                if other != shards {
                    for k in other.all_keys(&blocks) {
                        prop_assert!(seen.insert(k), "{other:?} aliases {shards:?}");
                    }
                }
            }
            // No shard key is a block key.
            for b in &blocks {
                prop_assert!(!seen.contains(b));
            }
        }

        #[test]
        fn rank_lists_interleave_keys_and_virtual_ids(
            (kv, t) in heads_and_tp(),
            ids in proptest::collection::vec(0usize..1000, 0..6),
        ) {
            let shards = HeadShards::for_tp_sizes(kv, &[t]).unwrap();
            let blocks: Vec<BlockHash> = ids.iter().map(|&i| BlockHash(i as u128 + 7)).collect();
            for r in 0..t {
                let range = shards.for_rank(r, t).unwrap();
                let per = range.len();
                let keys = shards.rank_keys(&blocks, r, t).unwrap();
                let vids = shards.rank_block_ids(&ids, r, t).unwrap();
                prop_assert_eq!(keys.len(), ids.len() * per);
                prop_assert_eq!(vids.len(), ids.len() * per);
                for (i, (&b, &id)) in blocks.iter().zip(&ids).enumerate() {
                    for (j, s) in range.clone().enumerate() {
                        prop_assert_eq!(keys[i * per + j], shards.key(b, s));
                        prop_assert_eq!(vids[i * per + j], id * per + j);
                    }
                }
                // A prefix counts whole blocks only.
                for len in 0..=keys.len() {
                    prop_assert!(blocks_in_prefix(len, per) * per <= len);
                    prop_assert!(len < (blocks_in_prefix(len, per) + 1) * per);
                }
            }
            // Rank 0 of 1 holds every shard.
            prop_assert_eq!(shards.rank_keys(&blocks, 0, 1).unwrap(), shards.all_keys(&blocks));
        }
    }

    #[test]
    fn key_matches_its_definition() {
        let shards = HeadShards::new(8, 2).unwrap();
        let block = BlockHash(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
        let mut bytes = b"kvtier-head-shard-v1".to_vec();
        bytes.extend_from_slice(&block.0.to_le_bytes());
        for n in [3u32, 2, 8] {
            bytes.extend_from_slice(&n.to_le_bytes());
        }
        assert_eq!(shards.key(block, 3), BlockHash(xxh3_128(&bytes)));
    }

    #[test]
    fn every_rank_of_a_latent_holds_the_one_shard() {
        let geometry = ModelPreset::DeepSeekV3.geometry(64);
        let shards = HeadShards::from_geometry(&geometry, 1).unwrap();
        assert_eq!(shards, HeadShards::mla());
        for t in [1, 2, 8, 16] {
            for r in 0..t {
                assert_eq!(shards.for_rank(r, t).unwrap(), 0..1);
            }
        }
        let block = BlockHash(5);
        assert_eq!(
            shards.rank_keys(&[block], 0, 8).unwrap(),
            shards.rank_keys(&[block], 7, 8).unwrap()
        );
        // The daemon holds the latent block as it is.
        assert_eq!(shards.shard_geometry(&geometry).unwrap(), geometry);
        assert!(HeadShards::from_geometry(&geometry, 2).is_err());
    }

    #[test]
    fn the_shard_geometry_is_one_shard_of_the_model_at_tp_1() {
        let model = ModelPreset::Llama3_8B.geometry(16);
        let shards = HeadShards::from_geometry(&model, 2).unwrap();
        let g = shards.shard_geometry(&model).unwrap();
        assert_eq!((g.tp_rank, g.tp_size, g.layers), (0, 1, model.layers));
        assert_eq!(g.layer_bytes() * shards.count() as u64, model.layer_bytes());
        // The same at any TP size of the model.
        let mut at_tp4 = model;
        (at_tp4.tp_size, at_tp4.tp_rank) = (4, 3);
        assert_eq!(shards.shard_geometry(&at_tp4).unwrap(), g);
        // Shards of another head count do not fit.
        let other = HeadShards::new(4, 2).unwrap();
        assert!(other.shard_geometry(&model).is_err());
        assert!(HeadShards::mla().shard_geometry(&model).is_err());
    }

    #[test]
    fn bad_shapes_are_refused() {
        assert!(HeadShards::new(0, 1).is_err());
        assert!(HeadShards::new(8, 0).is_err());
        assert!(HeadShards::new(8, 3).is_err());
        assert!(HeadShards::for_tp_sizes(8, &[3]).is_err());
        assert!(HeadShards::for_tp_sizes(8, &[12]).is_err());
        assert!(HeadShards::for_tp_sizes(8, &[0]).is_err());
        let shards = HeadShards::new(8, 4).unwrap();
        // Rank 1 of 4 holds heads 2..4: half a shard.
        assert!(shards.for_rank(1, 4).is_err());
        assert!(shards.for_rank(2, 2).is_err());
        assert_eq!(shards.for_rank(1, 2).unwrap(), 1..2);
        assert!(virtual_block_ids(&[usize::MAX], 2).is_err());
        assert_eq!(blocks_in_prefix(7, 0), 0);
    }
}
