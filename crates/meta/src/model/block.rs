//! Block keys, cache locations and the per-block record.
//!
//! A block may have several [`CacheLocation`]s (one per storage / tier);
//! each location holds the block as one or more [`LocationSpec`]s (one per
//! TP rank or attention kind), each with its own URI and size.

use serde::{Deserialize, Serialize};

use super::StorageKind;

/// A block key: the engine's chained prefix hash of one block.
///
/// Tair KVCM carries block keys as `int64` on the wire; we hold them as
/// `u64` and convert bit-for-bit (`i64 as u64`), so every wire value maps to
/// exactly one key and back. Ordering is by the `u64` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BlockKey(pub u64);

impl BlockKey {
    /// Bit-for-bit conversion from the Tair KVCM wire type.
    pub fn from_wire(v: i64) -> Self {
        BlockKey(v as u64)
    }

    /// Bit-for-bit conversion to the Tair KVCM wire type.
    pub fn to_wire(self) -> i64 {
        self.0 as i64
    }

    /// The block keys of `token_ids` in blocks of `block_size` tokens,
    /// exactly as Tair KVCM derives them when a request carries token ids
    /// instead of keys (see docs/meta-api.md): a trailing partial block gets
    /// no key; one running 64-bit state `h`, starting at 0, absorbs every
    /// token as `h ^= t + 0x9e3779b97f4a7c15 + (h << 12) + (h >> 32)` (signed
    /// `h`, arithmetic shift, wrapping arithmetic), and each block's key is
    /// `h` after its last token, so a key covers its whole prefix. No salt:
    /// keys are scoped by instance. `block_size == 0` gives no keys.
    pub fn chain_tokens(token_ids: &[i64], block_size: usize) -> Vec<BlockKey> {
        if block_size == 0 {
            return Vec::new();
        }
        let full = token_ids.len() / block_size * block_size;
        let mut h: i64 = 0;
        let mut keys = Vec::with_capacity(full / block_size);
        for (i, &t) in token_ids[..full].iter().enumerate() {
            let add = (t as u64)
                .wrapping_add(0x9e37_79b9_7f4a_7c15)
                .wrapping_add(h.wrapping_shl(12) as u64)
                .wrapping_add((h >> 32) as u64);
            h ^= add as i64;
            if (i + 1) % block_size == 0 {
                keys.push(BlockKey::from_wire(h));
            }
        }
        keys
    }
}

/// Unique id of one location, handed out by `start_write_cache`; finish and
/// timeouts find their location by it, so a location that was removed and
/// re-created in between is never confused with the old one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LocationId(pub u64);

/// Lifecycle of a location: `Writing -> Serving -> Deleting`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LocationStatus {
    /// Being written by a client; neither served nor handed out again.
    Writing,
    /// Complete and readable.
    Serving,
    /// Being deleted; not readable.
    Deleting,
}

impl LocationStatus {
    /// Stable one-byte tag used by the block record encoding.
    pub fn tag(self) -> u8 {
        match self {
            LocationStatus::Writing => 0,
            LocationStatus::Serving => 1,
            LocationStatus::Deleting => 2,
        }
    }

    /// Inverse of [`LocationStatus::tag`].
    pub fn from_tag(tag: u8) -> Option<Self> {
        match tag {
            0 => Some(LocationStatus::Writing),
            1 => Some(LocationStatus::Serving),
            2 => Some(LocationStatus::Deleting),
            _ => None,
        }
    }
}

/// One part of a block at one location.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocationSpec {
    /// Spec name (matches the instance's `LocationSpecInfo::name`).
    pub name: String,
    /// Where the bytes are: `file://`, `s3://` or `kvtier://node/...`.
    pub uri: String,
    /// Bytes.
    pub size: u64,
}

/// One copy of a block on one storage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheLocation {
    /// Unique id.
    pub id: LocationId,
    /// Storage name.
    pub storage: String,
    /// Storage kind, kept here so quota accounting survives a storage being
    /// unregistered.
    pub kind: StorageKind,
    /// Lifecycle state.
    pub status: LocationStatus,
    /// The parts; all on the same storage.
    pub specs: Vec<LocationSpec>,
}

impl CacheLocation {
    /// Bytes of this location (sum of its specs), as charged to quotas.
    pub fn size(&self) -> u64 {
        self.specs.iter().map(|s| s.size).sum()
    }
}

/// Everything known about one block of one instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockMeta {
    /// The block key.
    pub key: BlockKey,
    /// Its copies.
    pub locations: Vec<CacheLocation>,
    /// Last read or write, milliseconds since the Unix epoch.
    pub last_access_ms: u64,
    /// Reads and writes seen.
    pub access_count: u32,
    /// Distance from the root of the block's prefix chain: its index in the
    /// `start_write_cache` request that wrote it (0 for the first block).
    /// A prefix query touches a parent whenever it touches a child, so a
    /// parent is never less recent than its child; among equal recency the
    /// reclaimer evicts the deeper block first, so leaves go before parents.
    #[serde(default)]
    pub depth: u32,
}

impl BlockMeta {
    /// The first location that may be read, if any.
    pub fn serving(&self) -> Option<&CacheLocation> {
        self.locations
            .iter()
            .find(|l| l.status == LocationStatus::Serving)
    }

    /// Whether some location is being written or served, so the block must
    /// not be handed out for writing again.
    pub fn is_live(&self) -> bool {
        self.locations
            .iter()
            .any(|l| matches!(l.status, LocationStatus::Writing | LocationStatus::Serving))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vectors computed with upstream's own expression (compiled with g++)
    /// and an independent Python model.
    #[test]
    fn token_chaining_matches_tair_kvcm() {
        let keys = BlockKey::chain_tokens(&[1, 2, 3, 4, 5], 2);
        assert_eq!(
            keys.iter().map(|k| k.to_wire()).collect::<Vec<_>>(),
            [-8366447769517741626, 455111481605203084]
        );
        let tokens: Vec<i64> = (101..=109).collect();
        let keys = BlockKey::chain_tokens(&tokens, 4);
        assert_eq!(
            keys.iter().map(|k| k.to_wire()).collect::<Vec<_>>(),
            [455133745910195988, 2203633134892431195]
        );
        assert!(BlockKey::chain_tokens(&[1, 2, 3], 4).is_empty());
        assert!(BlockKey::chain_tokens(&[1, 2, 3], 0).is_empty());
        // Equal prefixes give equal keys; a change affects its block and
        // every later one.
        let a = BlockKey::chain_tokens(&[1, 2, 3, 4, 5, 6], 2);
        let b = BlockKey::chain_tokens(&[1, 2, 9, 4, 5, 6], 2);
        assert_eq!(a[0], b[0]);
        assert!(a[1] != b[1] && a[2] != b[2]);
    }
}
