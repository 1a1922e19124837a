//! Index checkpoints: the file `kvtier-disk.index` in each directory.
//!
//! ```text
//! checkpoint file (little-endian)
//!   0  magic            [u8; 8]  "KVTDINDX"
//!   8  version          u32
//!  12  dir              u32
//!  16  creation_id      u128     must equal the meta file's
//!  32  generation_hwm   u64      the tier's generation counter when taken
//!  40  region_count     u32
//!  44  slots_per_region u32
//!  48  entry_count      u64
//!  56  regions          region_count x { generation u64, fill u32, zero u32 }      (16 B each)
//!   .. entries          entry_count  x { key u128, region u32, slot u32, sum u64 } (32 B each)
//!   .. checksum         u64      xxh3_64 of every byte before it
//! ```
//!
//! `generation` is the region's generation when the checkpoint was taken (0
//! for a free region); `fill` is the slot count below which every completed
//! write had been entered in the index before the entries were copied, so
//! recovery scans slot headers only from `fill` on (see `recover.rs`).

use kvtier_core::BlockHash;
use xxhash_rust::xxh3::xxh3_64;

use crate::format::{FORMAT_VERSION, get_u32, get_u64, get_u128};

const MAGIC: [u8; 8] = *b"KVTDINDX";
const HEADER_BYTES: usize = 56;
const REGION_BYTES: usize = 16;
const ENTRY_BYTES: usize = 32;

/// A region's state in a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RegionMark {
    /// Generation of the region's life (0: free).
    pub generation: u64,
    /// Slots below which the checkpoint's entries are complete.
    pub fill: u32,
}

/// One checkpointed index entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CkEntry {
    /// The block.
    pub key: BlockHash,
    /// Region index.
    pub region: u32,
    /// Slot index.
    pub slot: u32,
    /// Block checksum.
    pub sum: u64,
}

/// A directory's checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// Directory index.
    pub dir: u32,
    /// The directory's creation id.
    pub creation_id: u128,
    /// The generation counter when taken.
    pub generation_hwm: u64,
    /// Slots per region.
    pub slots_per_region: u32,
    /// One mark per region.
    pub regions: Vec<RegionMark>,
    /// The entries.
    pub entries: Vec<CkEntry>,
}

impl Checkpoint {
    /// The file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(
            HEADER_BYTES + REGION_BYTES * self.regions.len() + ENTRY_BYTES * self.entries.len() + 8,
        );
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        b.extend_from_slice(&self.dir.to_le_bytes());
        b.extend_from_slice(&self.creation_id.to_le_bytes());
        b.extend_from_slice(&self.generation_hwm.to_le_bytes());
        b.extend_from_slice(&(self.regions.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.slots_per_region.to_le_bytes());
        b.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        debug_assert_eq!(b.len(), HEADER_BYTES);
        for r in &self.regions {
            b.extend_from_slice(&r.generation.to_le_bytes());
            b.extend_from_slice(&r.fill.to_le_bytes());
            b.extend_from_slice(&0u32.to_le_bytes());
        }
        for e in &self.entries {
            b.extend_from_slice(&e.key.to_le_bytes());
            b.extend_from_slice(&e.region.to_le_bytes());
            b.extend_from_slice(&e.slot.to_le_bytes());
            b.extend_from_slice(&e.sum.to_le_bytes());
        }
        let sum = xxh3_64(&b);
        b.extend_from_slice(&sum.to_le_bytes());
        b
    }

    /// Parses a file; `None` if anything is off (wrong magic or version,
    /// sizes that do not add up, checksum mismatch): a checkpoint is an
    /// optimisation, and recovery without one scans instead.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() < HEADER_BYTES + 8 || b[..8] != MAGIC || get_u32(b, 8)? != FORMAT_VERSION {
            return None;
        }
        let body = b.len() - 8;
        if get_u64(b, body)? != xxh3_64(&b[..body]) {
            return None;
        }
        let region_count = get_u32(b, 40)? as usize;
        let entry_count = usize::try_from(get_u64(b, 48)?).ok()?;
        let regions_end = HEADER_BYTES.checked_add(region_count.checked_mul(REGION_BYTES)?)?;
        let entries_end = regions_end.checked_add(entry_count.checked_mul(ENTRY_BYTES)?)?;
        if entries_end != body {
            return None;
        }
        let regions = b[HEADER_BYTES..regions_end]
            .chunks_exact(REGION_BYTES)
            .map(|c| {
                Some(RegionMark {
                    generation: get_u64(c, 0)?,
                    fill: get_u32(c, 8)?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        let entries = b[regions_end..entries_end]
            .chunks_exact(ENTRY_BYTES)
            .map(|c| {
                Some(CkEntry {
                    key: BlockHash(get_u128(c, 0)?),
                    region: get_u32(c, 16)?,
                    slot: get_u32(c, 20)?,
                    sum: get_u64(c, 24)?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Checkpoint {
            dir: get_u32(b, 12)?,
            creation_id: get_u128(b, 16)?,
            generation_hwm: get_u64(b, 32)?,
            slots_per_region: get_u32(b, 44)?,
            regions,
            entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Checkpoint {
        Checkpoint {
            dir: 2,
            creation_id: 0xabc,
            generation_hwm: 17,
            slots_per_region: 31,
            regions: vec![
                RegionMark {
                    generation: 3,
                    fill: 31,
                },
                RegionMark::default(),
            ],
            entries: (0..5)
                .map(|i| CkEntry {
                    key: BlockHash(i * 1000),
                    region: 0,
                    slot: i as u32,
                    sum: i as u64 * 7,
                })
                .collect(),
        }
    }

    #[test]
    fn round_trips() {
        let c = sample();
        assert_eq!(Checkpoint::decode(&c.encode()), Some(c));
        let empty = Checkpoint {
            entries: vec![],
            regions: vec![],
            ..sample()
        };
        assert_eq!(Checkpoint::decode(&empty.encode()), Some(empty));
    }

    proptest! {
        #[test]
        fn any_damage_is_refused(at in any::<usize>(), bit in 0u8..8, cut in any::<usize>()) {
            let b = sample().encode();
            let mut bad = b.clone();
            let i = at % b.len();
            bad[i] ^= 1 << bit;
            prop_assert_eq!(Checkpoint::decode(&bad), None);
            let c = cut % b.len();
            prop_assert_eq!(Checkpoint::decode(&b[..c]), None);
        }
    }
}
