//! Block identity: [`BlockHash`], [`Salt`] and the hash chain.
//!
//! # The chain
//!
//! A sequence of token ids is cut into blocks of `tokens_per_block` tokens.
//! Block `i` is identified by
//!
//! ```text
//! h[-1] = 0
//! h[i]  = xxh3_128( le128(h[i-1]) || le128(salt) || le32(t) for each token t of block i )
//! ```
//!
//! so equal hashes mean equal *prefixes* (all earlier blocks and this one),
//! not merely equal tokens in this block. `salt` is the 128-bit digest of a
//! [`Salt`]: everything that makes the KV of equal tokens differ (model,
//! dtype, tensor-parallel rank and size, layout version, tokens per block,
//! and free-form extra bytes such as a LoRA name). Only full blocks are
//! hashed; a trailing partial block has no identity yet.
//!
//! # External ids
//!
//! Engines that hash blocks themselves (vLLM, SGLang, LMCache, Mooncake trace
//! `hash_ids`) hand kvtier opaque ids. [`BlockHash::external`] takes such an id
//! as it is: tiers key blocks by `BlockHash` and never look inside it. A
//! store serves one engine instance, which uses one scheme; if two schemes
//! must share a store, [`BlockHash::external_in`] mixes a namespace in so they
//! cannot collide.

use serde::{Deserialize, Serialize};
use std::fmt;
use xxhash_rust::xxh3::{Xxh3, xxh3_128};

use crate::Geometry;

/// The 128-bit identity of a KV block: a chained hash or an external id.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BlockHash(pub u128);

impl BlockHash {
    /// An engine's or a trace's own 128-bit block id, used as it is.
    pub const fn external(id: u128) -> Self {
        Self(id)
    }

    /// An engine's or a trace's own 64-bit block id, used as it is.
    pub const fn external_u64(id: u64) -> Self {
        Self(id as u128)
    }

    /// An external id placed in `namespace`, so ids of two schemes that share
    /// one store cannot collide: `xxh3_128(le128(namespace) || le128(id))`.
    pub fn external_in(namespace: u128, id: u128) -> Self {
        let mut buf = [0u8; 32];
        buf[..16].copy_from_slice(&namespace.to_le_bytes());
        buf[16..].copy_from_slice(&id.to_le_bytes());
        Self(xxh3_128(&buf))
    }

    /// The hash of one full block given its parent (`None` for the first
    /// block of a sequence), the salt digest and the block's tokens.
    pub fn chained(parent: Option<BlockHash>, salt: u128, tokens: &[u32]) -> Self {
        let mut h = Xxh3::new();
        h.update(&parent.map_or(0, |p| p.0).to_le_bytes());
        h.update(&salt.to_le_bytes());
        for t in tokens {
            h.update(&t.to_le_bytes());
        }
        Self(h.digest128())
    }

    /// The 64-bit fold of the hash (low half xor high half), used to seed
    /// checksums and to pick shards.
    pub const fn fold64(self) -> u64 {
        (self.0 as u64) ^ ((self.0 >> 64) as u64)
    }

    /// The hash as 16 little-endian bytes (the on-disk form).
    pub const fn to_le_bytes(self) -> [u8; 16] {
        self.0.to_le_bytes()
    }

    /// The hash from 16 little-endian bytes.
    pub const fn from_le_bytes(bytes: [u8; 16]) -> Self {
        Self(u128::from_le_bytes(bytes))
    }
}

impl fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockHash({:032x})", self.0)
    }
}

impl fmt::Display for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// What makes the KV of equal tokens differ. Its [`digest`](Salt::digest) is
/// folded into every chained hash.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Salt {
    /// Model name or path, e.g. `meta-llama/Meta-Llama-3-8B`.
    pub model: String,
    /// KV dtype name, e.g. `bf16`.
    pub dtype: String,
    /// Tensor-parallel rank whose KV shard the blocks hold.
    pub tp_rank: u32,
    /// Tensor-parallel size.
    pub tp_size: u32,
    /// Tokens per block.
    pub tokens_per_block: u32,
    /// Version of the cache layout; bump it when the bytes of a block change
    /// meaning for equal tokens.
    pub layout_version: u32,
    /// Anything else (LoRA adapter, multimodal hashes, a tenant secret).
    pub extra: Vec<u8>,
}

impl Salt {
    /// A salt for `model` with the dtype, TP and block size of `geometry`,
    /// layout version 1 and no extra bytes.
    pub fn for_geometry(model: &str, geometry: &Geometry) -> Self {
        Self {
            model: model.to_owned(),
            dtype: geometry.dtype.name().to_owned(),
            tp_rank: geometry.tp_rank,
            tp_size: geometry.tp_size,
            tokens_per_block: geometry.tokens_per_block,
            layout_version: 1,
            extra: Vec::new(),
        }
    }

    /// The 128-bit digest of the salt: xxh3-128 over a length-prefixed,
    /// versioned encoding of every field, so no two different salts share an
    /// encoding.
    pub fn digest(&self) -> u128 {
        let mut h = Xxh3::new();
        h.update(b"kvtier-salt-v1");
        for field in [self.model.as_bytes(), self.dtype.as_bytes(), &self.extra] {
            h.update(&(field.len() as u64).to_le_bytes());
            h.update(field);
        }
        for n in [
            self.tp_rank,
            self.tp_size,
            self.tokens_per_block,
            self.layout_version,
        ] {
            h.update(&n.to_le_bytes());
        }
        h.digest128()
    }
}

/// Incremental hashing of one sequence: feed tokens as they arrive, get the
/// hash of each block as it fills.
#[derive(Debug, Clone)]
pub struct HashChain {
    salt: u128,
    tokens_per_block: usize,
    parent: Option<BlockHash>,
    pending: Vec<u32>,
}

impl HashChain {
    /// A chain for blocks of `tokens_per_block` tokens under `salt`.
    ///
    /// # Panics
    /// If `tokens_per_block` is zero.
    pub fn new(salt: &Salt, tokens_per_block: u32) -> Self {
        Self::with_digest(salt.digest(), tokens_per_block)
    }

    /// Like [`new`](Self::new) with a precomputed salt digest.
    ///
    /// # Panics
    /// If `tokens_per_block` is zero.
    pub fn with_digest(salt: u128, tokens_per_block: u32) -> Self {
        assert!(tokens_per_block > 0, "tokens_per_block must be positive");
        Self {
            salt,
            tokens_per_block: tokens_per_block as usize,
            parent: None,
            pending: Vec::with_capacity(tokens_per_block as usize),
        }
    }

    /// Appends tokens; returns the hashes of the blocks they completed.
    pub fn extend(&mut self, mut tokens: &[u32]) -> Vec<BlockHash> {
        let mut out = Vec::new();
        // Finish a partly filled block first, then hash full blocks straight
        // from the input without copying.
        if !self.pending.is_empty() {
            let need = self.tokens_per_block - self.pending.len();
            let take = need.min(tokens.len());
            self.pending.extend_from_slice(&tokens[..take]);
            tokens = &tokens[take..];
            if self.pending.len() == self.tokens_per_block {
                let h = BlockHash::chained(self.parent, self.salt, &self.pending);
                self.pending.clear();
                self.parent = Some(h);
                out.push(h);
            }
        }
        let mut blocks = tokens.chunks_exact(self.tokens_per_block);
        for block in &mut blocks {
            let h = BlockHash::chained(self.parent, self.salt, block);
            self.parent = Some(h);
            out.push(h);
        }
        self.pending.extend_from_slice(blocks.remainder());
        out
    }

    /// The hash of the last completed block, if any.
    pub fn last(&self) -> Option<BlockHash> {
        self.parent
    }

    /// Tokens waiting for their block to fill.
    pub fn pending_tokens(&self) -> usize {
        self.pending.len()
    }

    /// Hashes every full block of `tokens` in one go.
    pub fn hash_all(salt: &Salt, tokens_per_block: u32, tokens: &[u32]) -> Vec<BlockHash> {
        Self::new(salt, tokens_per_block).extend(tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn salt() -> Salt {
        Salt {
            model: "m".into(),
            dtype: "bf16".into(),
            tp_rank: 0,
            tp_size: 1,
            tokens_per_block: 4,
            layout_version: 1,
            extra: vec![],
        }
    }

    /// The straightforward definition the chain must agree with.
    fn reference(salt: u128, tpb: usize, tokens: &[u32]) -> Vec<BlockHash> {
        let mut parent = None;
        tokens
            .chunks(tpb)
            .filter(|c| c.len() == tpb)
            .map(|c| {
                let mut bytes = Vec::new();
                bytes.extend_from_slice(&parent.map_or(0u128, |p: BlockHash| p.0).to_le_bytes());
                bytes.extend_from_slice(&salt.to_le_bytes());
                for t in c {
                    bytes.extend_from_slice(&t.to_le_bytes());
                }
                let h = BlockHash(xxh3_128(&bytes));
                parent = Some(h);
                h
            })
            .collect()
    }

    proptest! {
        #[test]
        fn chain_matches_reference_for_any_split(
            tokens in proptest::collection::vec(any::<u32>(), 0..200),
            tpb in 1u32..20,
            cuts in proptest::collection::vec(0usize..200, 0..6),
        ) {
            let s = salt();
            let expected = reference(s.digest(), tpb as usize, &tokens);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(tokens.len())).collect();
            cuts.sort_unstable();
            let mut chain = HashChain::new(&s, tpb);
            let mut got = Vec::new();
            let mut start = 0;
            for c in cuts.into_iter().chain([tokens.len()]) {
                got.extend(chain.extend(&tokens[start..c]));
                start = c;
            }
            prop_assert_eq!(&got, &expected);
            prop_assert_eq!(chain.pending_tokens(), tokens.len() % tpb as usize);
            prop_assert_eq!(chain.last(), expected.last().copied());
        }

        #[test]
        fn equal_hash_means_equal_prefix(
            a in proptest::collection::vec(0u32..4, 8..40),
            b in proptest::collection::vec(0u32..4, 8..40),
        ) {
            let s = salt();
            let ha = HashChain::hash_all(&s, 4, &a);
            let hb = HashChain::hash_all(&s, 4, &b);
            for (i, (x, y)) in ha.iter().zip(&hb).enumerate() {
                let same_prefix = a[..(i + 1) * 4] == b[..(i + 1) * 4];
                prop_assert_eq!(x == y, same_prefix);
            }
        }

        #[test]
        fn salt_fields_all_matter(extra in proptest::collection::vec(any::<u8>(), 1..8)) {
            let base = salt();
            let tokens = [1u32, 2, 3, 4];
            let h0 = HashChain::hash_all(&base, 4, &tokens);
            let variants = [
                Salt { model: "other".into(), ..base.clone() },
                Salt { dtype: "fp8".into(), ..base.clone() },
                Salt { tp_rank: 1, ..base.clone() },
                Salt { tp_size: 2, ..base.clone() },
                Salt { layout_version: 2, ..base.clone() },
                Salt { extra: extra.clone(), ..base.clone() },
            ];
            for v in variants {
                prop_assert_ne!(&HashChain::hash_all(&v, 4, &tokens), &h0);
            }
        }
    }

    #[test]
    fn salt_encoding_is_unambiguous() {
        // Moving a byte from one string field to the next must change the digest.
        let a = Salt {
            model: "ab".into(),
            dtype: "c".into(),
            ..salt()
        };
        let b = Salt {
            model: "a".into(),
            dtype: "bc".into(),
            ..salt()
        };
        assert_ne!(a.digest(), b.digest());
    }

    #[test]
    fn external_ids_are_used_as_is_and_namespaces_separate() {
        assert_eq!(BlockHash::external_u64(46).0, 46);
        assert_ne!(BlockHash::external_in(1, 46), BlockHash::external_in(2, 46));
    }
}
