//! The event model: what the manager says about blocks, and the batches it
//! says it in.

use kvtier_core::{BlockHash, TierKind};
use serde::{Deserialize, Serialize};

use crate::Tier;

/// Where a stored block's bytes live, in the terms of the tier that holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum BlockLocation {
    /// A slot of an engine's device pool (G1). Part of the event format
    /// for producers that publish an engine's own cache; the node's
    /// manager, whose top tier is G2, publishes none.
    DeviceSlot {
        /// Slot index in the engine's block pool.
        slot: u64,
    },
    /// A slot of the shared-memory arena (G2).
    ArenaSlot {
        /// Slot index in the arena.
        slot: u64,
    },
    /// A region of a disk tier's log (G3).
    DiskRegion {
        /// Segment (log file) number.
        segment: u32,
        /// Byte offset inside the segment.
        offset: u64,
        /// Length of the region in bytes.
        len: u64,
    },
    /// An object or file on a remote tier (G4), e.g. `s3://bucket/key`.
    Uri {
        /// The object's address.
        uri: String,
    },
}

/// Blocks that became readable on a tier.
///
/// The blocks form one chain: `block_hashes[0]`'s parent is `parent_hash`,
/// and each later block's parent is the block before it (the vLLM and
/// Dynamo convention, which lets a router extend its prefix tree in one step).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockStored {
    /// Hashes of the stored blocks, parent first.
    #[serde(with = "hex_hashes")]
    pub block_hashes: Vec<BlockHash>,
    /// The parent of the first block; `None` when it starts a sequence.
    #[serde(with = "hex_hash_opt")]
    pub parent_hash: Option<BlockHash>,
    /// The tier that now holds the blocks.
    pub tier: Tier,
    /// What kind of storage that tier is (a tier is a position in the
    /// node's list; this says what it is: vLLM's `medium`).
    pub kind: TierKind,
    /// Bytes the blocks occupy on that tier, all blocks together.
    pub bytes: u64,
    /// Where the first block lives (tiers place a run contiguously or say
    /// nothing: routers only need the tier; storage advisors use this).
    pub location: Option<BlockLocation>,
    /// Token ids of all blocks, concatenated, when the producer knows them.
    /// Token-aware routers (Dynamo's) need them; hash-only consumers do not.
    pub token_ids: Option<Vec<u32>>,
    /// Tokens per block.
    pub block_size: u32,
}

/// Blocks that stopped being readable on a tier (evicted, moved, freed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockRemoved {
    /// Hashes of the removed blocks.
    #[serde(with = "hex_hashes")]
    pub block_hashes: Vec<BlockHash>,
    /// The tier they left.
    pub tier: Tier,
    /// What kind of storage that tier is.
    pub kind: TierKind,
}

/// One thing that happened to blocks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum KvEvent {
    /// Blocks became readable on a tier.
    Stored(BlockStored),
    /// Blocks left a tier.
    Removed(BlockRemoved),
    /// Every block of a tier is gone (reset, restart, wipe).
    AllCleared {
        /// The tier that was cleared.
        tier: Tier,
    },
}

impl KvEvent {
    /// The tier the event is about.
    pub fn tier(&self) -> Tier {
        match self {
            KvEvent::Stored(s) => s.tier,
            KvEvent::Removed(r) => r.tier,
            KvEvent::AllCleared { tier } => *tier,
        }
    }
}

/// Events published together, in the order they happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventBatch {
    /// Position of the batch in its publisher's stream, from 0 with no gaps
    /// at the source; a consumer that sees a gap lost batches on the way.
    pub seq: u64,
    /// When the batch was cut, seconds since the Unix epoch (as vLLM's
    /// `time.time()`).
    pub ts: f64,
    /// The events, oldest first.
    pub events: Vec<KvEvent>,
}

/// Parses the 32-digit hex form of a hash.
fn parse_hash<E: serde::de::Error>(text: &str) -> Result<BlockHash, E> {
    if text.len() != 32 {
        return Err(E::invalid_length(text.len(), &"32 hex digits"));
    }
    u128::from_str_radix(text, 16)
        .map(BlockHash)
        .map_err(|_| E::invalid_value(serde::de::Unexpected::Str(text), &"32 hex digits"))
}

/// Hashes in serialized events are 32-digit lower-case hex strings (the
/// `Display` form of [`BlockHash`]): JSON numbers cannot carry 128 bits
/// through most parsers.
mod hex_hashes {
    use kvtier_core::BlockHash;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(hashes: &[BlockHash], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(hashes.iter().map(|h| h.to_string()))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<BlockHash>, D::Error> {
        Vec::<String>::deserialize(d)?
            .iter()
            .map(|text| super::parse_hash(text))
            .collect()
    }
}

/// [`hex_hashes`] for one optional hash.
mod hex_hash_opt {
    use kvtier_core::BlockHash;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(
        hash: &Option<BlockHash>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match hash {
            Some(h) => s.serialize_some(&h.to_string()),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<BlockHash>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| super::parse_hash(&text))
            .transpose()
    }
}
