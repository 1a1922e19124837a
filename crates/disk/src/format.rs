//! On-disk format: sizes, offsets and the codecs of the region and slot
//! headers. `docs/disk-format.md` is the prose version of this file.
//!
//! ```text
//! data file  = region 0 | region 1 | ... | region R-1          (region_size each)
//! region     = region header (4096 B) | slot 0 | slot 1 | ... | slot S-1 | unused tail
//! slot       = slot header (round_up(72 + 8 * layers, 4096) B) | block data (round_up(block_bytes, 4096) B)
//!
//! region header (little-endian; the rest of the 4096 B is zero)
//!   0  magic          [u8; 8]  "KVTDREGN"
//!   8  version        u32
//!  12  dir            u32
//!  16  region         u32      index of the region in the file
//!  20  slots          u32      slots per region
//!  24  generation     u64      the region's current life
//!  32  creation_id    u128     the directory's creation id (meta file)
//!  48  slot_size      u64
//!  56  checksum       u64      xxh3_64 of bytes 0..56
//!
//! slot header (little-endian; zero padded to its size)
//!   0  magic          [u8; 8]  "KVTDSLOT"
//!   8  key            u128
//!  24  block_sum      u64      the block checksum carried with the block
//!  32  generation     u64      equals the region header's for a live slot
//!  40  region         u32
//!  44  slot           u32
//!  48  data_len       u64      block bytes
//!  56  layers         u32
//!  60  dir            u32
//!  64  layer_sums     [u64; layers]
//!  64 + 8 * layers    checksum u64      xxh3_64 of every byte before it
//! ```
//!
//! Offsets are built from field sizes below (`Field` constants), so the
//! comment and the code cannot drift apart without a test noticing.

use kvtier_core::{BlockHash, Geometry};
use xxhash_rust::xxh3::xxh3_64;

use crate::{DiskError, Result};

/// Version of every structure in this file, the meta file and the checkpoint.
/// See the version log in `docs/disk-format.md`.
pub const FORMAT_VERSION: u32 = 1;

/// The unit of alignment of every structure in the data file. Direct I/O
/// needs at most this on every file system we know (ext4/xfs report 512).
pub const SECTOR: u64 = 4096;

/// Bytes of the region header at the start of each region.
pub const REGION_HEADER_BYTES: u64 = SECTOR;

/// Magic of the region header.
pub const REGION_MAGIC: [u8; 8] = *b"KVTDREGN";
/// Magic of the slot header.
pub const SLOT_MAGIC: [u8; 8] = *b"KVTDSLOT";

/// Largest slot count per region: a slot index must fit in the index's
/// 23-bit field (see `index.rs`).
pub const MAX_SLOTS_PER_REGION: u64 = (1 << 23) - 1;
/// Largest number of directories (the index's 8-bit dir field).
pub const MAX_DIRS: usize = 255;

/// Rounds `n` up to a multiple of `to` (a power of two).
pub const fn round_up(n: u64, to: u64) -> u64 {
    (n + to - 1) & !(to - 1)
}

// Field sizes of the region header, in order.
mod rh {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = MAGIC + 8;
    pub const DIR: usize = VERSION + 4;
    pub const REGION: usize = DIR + 4;
    pub const SLOTS: usize = REGION + 4;
    pub const GENERATION: usize = SLOTS + 4;
    pub const CREATION: usize = GENERATION + 8;
    pub const SLOT_SIZE: usize = CREATION + 16;
    pub const CHECKSUM: usize = SLOT_SIZE + 8;
    pub const END: usize = CHECKSUM + 8;
}

const _: () = assert!(rh::END as u64 <= REGION_HEADER_BYTES);

// Field offsets of the slot header, in order.
mod sh {
    pub const MAGIC: usize = 0;
    pub const KEY: usize = MAGIC + 8;
    pub const BLOCK_SUM: usize = KEY + 16;
    pub const GENERATION: usize = BLOCK_SUM + 8;
    pub const REGION: usize = GENERATION + 8;
    pub const SLOT: usize = REGION + 4;
    pub const DATA_LEN: usize = SLOT + 4;
    pub const LAYERS: usize = DATA_LEN + 8;
    pub const DIR: usize = LAYERS + 4;
    pub const LAYER_SUMS: usize = DIR + 4;
}

/// Bytes of a slot header's fixed part plus its trailing checksum.
pub const SLOT_HEADER_FIXED: u64 = sh::LAYER_SUMS as u64 + 8;

/// Little-endian field access on a byte slice; reads past the end give `None`.
pub(crate) fn get_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
pub(crate) fn get_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}
pub(crate) fn get_u128(b: &[u8], at: usize) -> Option<u128> {
    Some(u128::from_le_bytes(b.get(at..at + 16)?.try_into().ok()?))
}
pub(crate) fn put(b: &mut [u8], at: usize, bytes: &[u8]) {
    b[at..at + bytes.len()].copy_from_slice(bytes);
}

/// Sizes and offsets of one tier's data files, derived from the geometry and
/// the configured region and file sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Bytes of a block.
    pub block_bytes: u64,
    /// Bytes of one layer of a block.
    pub layer_bytes: u64,
    /// Layers per block.
    pub layers: u32,
    /// Bytes of a slot header (a multiple of [`SECTOR`]).
    pub slot_header_bytes: u64,
    /// Bytes of a whole slot (header + data rounded up to [`SECTOR`]).
    pub slot_bytes: u64,
    /// Bytes of a region.
    pub region_bytes: u64,
    /// Slots per region.
    pub slots_per_region: u32,
    /// Regions per directory.
    pub regions_per_dir: u32,
}

impl Layout {
    /// The layout for `geometry` in regions of `region_bytes` and files of
    /// `capacity` bytes.
    pub fn new(geometry: &Geometry, region_bytes: u64, capacity: u64) -> Result<Self> {
        let bad = |m: String| Err(DiskError::InvalidConfig(m));
        geometry
            .validate()
            .map_err(|e| DiskError::InvalidConfig(e.to_string()))?;
        if region_bytes == 0 || !region_bytes.is_multiple_of(SECTOR) {
            return bad(format!(
                "region_size {region_bytes} must be a positive multiple of {SECTOR}"
            ));
        }
        let block_bytes = geometry.block_bytes();
        let layers = geometry.layers;
        let slot_header_bytes = round_up(SLOT_HEADER_FIXED + 8 * layers as u64, SECTOR);
        let slot_bytes = slot_header_bytes + round_up(block_bytes, SECTOR);
        if slot_bytes > u32::MAX as u64 {
            return bad(format!(
                "a slot of {slot_bytes} bytes is larger than one I/O can move (4 GiB)"
            ));
        }
        let slots = (region_bytes - REGION_HEADER_BYTES) / slot_bytes;
        if slots == 0 {
            return bad(format!(
                "region_size {region_bytes} cannot hold one block slot of {slot_bytes} bytes (plus a {REGION_HEADER_BYTES} byte header)"
            ));
        }
        if slots > MAX_SLOTS_PER_REGION {
            return bad(format!(
                "region_size {region_bytes} holds {slots} slots, more than {MAX_SLOTS_PER_REGION}"
            ));
        }
        let regions = capacity / region_bytes;
        if regions == 0 {
            return bad(format!(
                "capacity_per_dir {capacity} is smaller than one region of {region_bytes} bytes"
            ));
        }
        let regions = u32::try_from(regions).map_err(|_| {
            DiskError::InvalidConfig(format!("{regions} regions per dir is too many"))
        })?;
        Ok(Layout {
            block_bytes,
            layer_bytes: geometry.layer_bytes(),
            layers,
            slot_header_bytes,
            slot_bytes,
            region_bytes,
            slots_per_region: slots as u32,
            regions_per_dir: regions,
        })
    }

    /// Bytes the data file spans (whole regions only).
    pub fn file_bytes(&self) -> u64 {
        self.regions_per_dir as u64 * self.region_bytes
    }

    /// File offset of `region`.
    pub fn region_offset(&self, region: u32) -> u64 {
        region as u64 * self.region_bytes
    }

    /// Offset of slot `slot` from the start of its region.
    pub fn slot_in_region(&self, slot: u32) -> u64 {
        REGION_HEADER_BYTES + slot as u64 * self.slot_bytes
    }

    /// File offset of the header of `slot` in `region`.
    pub fn slot_offset(&self, region: u32, slot: u32) -> u64 {
        self.region_offset(region) + self.slot_in_region(slot)
    }

    /// File offset of the block data of `slot` in `region`.
    pub fn data_offset(&self, region: u32, slot: u32) -> u64 {
        self.slot_offset(region, slot) + self.slot_header_bytes
    }

    /// Slots per directory.
    pub fn slots_per_dir(&self) -> u64 {
        self.regions_per_dir as u64 * self.slots_per_region as u64
    }
}

/// A decoded region header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionHeader {
    /// Directory index.
    pub dir: u32,
    /// Region index in the file.
    pub region: u32,
    /// Slots per region.
    pub slots: u32,
    /// The region's generation.
    pub generation: u64,
    /// The directory's creation id.
    pub creation_id: u128,
    /// Bytes per slot.
    pub slot_size: u64,
}

impl RegionHeader {
    /// Encodes into the first bytes of `out` (at least 64 bytes; the caller
    /// zeroes the rest of the sector).
    pub fn encode(&self, out: &mut [u8]) {
        put(out, rh::MAGIC, &REGION_MAGIC);
        put(out, rh::VERSION, &FORMAT_VERSION.to_le_bytes());
        put(out, rh::DIR, &self.dir.to_le_bytes());
        put(out, rh::REGION, &self.region.to_le_bytes());
        put(out, rh::SLOTS, &self.slots.to_le_bytes());
        put(out, rh::GENERATION, &self.generation.to_le_bytes());
        put(out, rh::CREATION, &self.creation_id.to_le_bytes());
        put(out, rh::SLOT_SIZE, &self.slot_size.to_le_bytes());
        let sum = xxh3_64(&out[..rh::CHECKSUM]);
        put(out, rh::CHECKSUM, &sum.to_le_bytes());
    }

    /// Decodes a header; `None` if the magic, version or checksum is wrong
    /// (a never-written, torn or foreign region).
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.get(..8)? != REGION_MAGIC || get_u32(b, rh::VERSION)? != FORMAT_VERSION {
            return None;
        }
        if get_u64(b, rh::CHECKSUM)? != xxh3_64(b.get(..rh::CHECKSUM)?) {
            return None;
        }
        Some(RegionHeader {
            dir: get_u32(b, rh::DIR)?,
            region: get_u32(b, rh::REGION)?,
            slots: get_u32(b, rh::SLOTS)?,
            generation: get_u64(b, rh::GENERATION)?,
            creation_id: get_u128(b, rh::CREATION)?,
            slot_size: get_u64(b, rh::SLOT_SIZE)?,
        })
    }
}

/// A decoded slot header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotHeader {
    /// The block's key.
    pub key: BlockHash,
    /// The block checksum.
    pub block_sum: u64,
    /// Generation of the region life the slot was written in.
    pub generation: u64,
    /// Region index.
    pub region: u32,
    /// Slot index.
    pub slot: u32,
    /// Bytes of block data.
    pub data_len: u64,
    /// Directory index.
    pub dir: u32,
    /// One checksum per layer.
    pub layer_sums: Vec<u64>,
}

impl SlotHeader {
    /// Encodes into `out` (at least `SLOT_HEADER_FIXED + 8 * layers` bytes;
    /// the caller zeroes the padding).
    pub fn encode_into(
        out: &mut [u8],
        key: BlockHash,
        block_sum: u64,
        generation: u64,
        (dir, region, slot): (u32, u32, u32),
        data_len: u64,
        layer_sums: &[u64],
    ) {
        put(out, sh::MAGIC, &SLOT_MAGIC);
        put(out, sh::KEY, &key.to_le_bytes());
        put(out, sh::BLOCK_SUM, &block_sum.to_le_bytes());
        put(out, sh::GENERATION, &generation.to_le_bytes());
        put(out, sh::REGION, &region.to_le_bytes());
        put(out, sh::SLOT, &slot.to_le_bytes());
        put(out, sh::DATA_LEN, &data_len.to_le_bytes());
        put(out, sh::LAYERS, &(layer_sums.len() as u32).to_le_bytes());
        put(out, sh::DIR, &dir.to_le_bytes());
        let mut at = sh::LAYER_SUMS;
        for s in layer_sums {
            put(out, at, &s.to_le_bytes());
            at += 8;
        }
        let sum = xxh3_64(&out[..at]);
        put(out, at, &sum.to_le_bytes());
    }

    /// Decodes a header with exactly `layers` layer sums; `None` if anything
    /// does not verify.
    pub fn decode(b: &[u8], layers: u32) -> Option<Self> {
        if b.get(..8)? != SLOT_MAGIC || get_u32(b, sh::LAYERS)? != layers {
            return None;
        }
        let end = sh::LAYER_SUMS + 8 * layers as usize;
        if get_u64(b, end)? != xxh3_64(b.get(..end)?) {
            return None;
        }
        let layer_sums = (0..layers as usize)
            .map(|l| get_u64(b, sh::LAYER_SUMS + 8 * l))
            .collect::<Option<Vec<_>>>()?;
        Some(SlotHeader {
            key: BlockHash::from_le_bytes(b.get(sh::KEY..sh::KEY + 16)?.try_into().ok()?),
            block_sum: get_u64(b, sh::BLOCK_SUM)?,
            generation: get_u64(b, sh::GENERATION)?,
            region: get_u32(b, sh::REGION)?,
            slot: get_u32(b, sh::SLOT)?,
            data_len: get_u64(b, sh::DATA_LEN)?,
            dir: get_u32(b, sh::DIR)?,
            layer_sums,
        })
    }
}

/// A 64-bit fingerprint of every geometry field, stored in the meta file so a
/// directory written for another model shape is refused.
pub fn geometry_fingerprint(g: &Geometry) -> u64 {
    let (kind, a, b) = match g.attention {
        kvtier_core::Attention::Mha { kv_heads, head_dim } => (1u32, kv_heads, head_dim),
        kvtier_core::Attention::Mla { latent_dim } => (2u32, latent_dim, 0),
    };
    let mut bytes = Vec::with_capacity(64);
    bytes.extend_from_slice(b"kvtier-geometry-v1");
    for v in [
        g.layers,
        kind,
        a,
        b,
        g.dtype.bytes(),
        g.tokens_per_block,
        g.tp_size,
        g.tp_rank,
    ] {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    bytes.extend_from_slice(g.dtype.name().as_bytes());
    xxh3_64(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtier_core::ModelPreset;

    #[test]
    fn offsets_are_built_from_field_sizes() {
        assert_eq!(rh::END, 64);
        assert_eq!(sh::LAYER_SUMS, 64);
        assert_eq!(SLOT_HEADER_FIXED, 72);
    }

    #[test]
    fn layout_of_llama_in_64mib_regions() {
        let g = ModelPreset::Llama3_8B.geometry(16);
        let l = Layout::new(&g, 64 << 20, 1 << 30).unwrap();
        assert_eq!(l.slot_header_bytes, 4096);
        assert_eq!(l.slot_bytes, (2 << 20) + 4096);
        assert_eq!(l.slots_per_region, 31);
        assert_eq!(l.regions_per_dir, 16);
        assert_eq!(l.data_offset(1, 0), (64 << 20) + 8192);
        // Many layers need a bigger header.
        let g = Geometry::raw(1000, 1000 * 4096).unwrap();
        let l = Layout::new(&g, 64 << 20, 1 << 30).unwrap();
        assert_eq!(l.slot_header_bytes, 8192);
    }

    #[test]
    fn layout_refuses_regions_too_small() {
        let g = ModelPreset::Llama3_8B.geometry(16);
        let e = Layout::new(&g, 1 << 20, 1 << 30).unwrap_err().to_string();
        assert!(e.contains("cannot hold one block"), "{e}");
        assert!(Layout::new(&g, (64 << 20) + 1, 1 << 30).is_err());
        assert!(Layout::new(&g, 64 << 20, 1 << 20).is_err());
    }

    #[test]
    fn region_header_round_trips_and_detects_damage() {
        let h = RegionHeader {
            dir: 3,
            region: 7,
            slots: 31,
            generation: 99,
            creation_id: 0xdead_beef,
            slot_size: 8192,
        };
        let mut b = vec![0u8; 4096];
        h.encode(&mut b);
        assert_eq!(RegionHeader::decode(&b), Some(h));
        for i in 0..64 {
            let mut bad = b.clone();
            bad[i] ^= 0x10;
            assert_eq!(RegionHeader::decode(&bad), None, "byte {i}");
        }
        assert_eq!(RegionHeader::decode(&[0u8; 4096]), None);
        assert_eq!(RegionHeader::decode(&b[..30]), None);
    }

    #[test]
    fn slot_header_round_trips_and_detects_damage() {
        let sums = [1u64, 2, 3];
        let mut b = vec![0u8; 4096];
        SlotHeader::encode_into(&mut b, BlockHash(42), 77, 5, (1, 2, 3), 12288, &sums);
        let h = SlotHeader::decode(&b, 3).unwrap();
        assert_eq!(h.key, BlockHash(42));
        assert_eq!(
            (h.block_sum, h.generation, h.dir, h.region, h.slot),
            (77, 5, 1, 2, 3)
        );
        assert_eq!(h.data_len, 12288);
        assert_eq!(h.layer_sums, sums);
        assert!(SlotHeader::decode(&b, 2).is_none());
        for i in 0..(72 + 24) {
            let mut bad = b.clone();
            bad[i] ^= 1;
            assert!(SlotHeader::decode(&bad, 3).is_none(), "byte {i}");
        }
    }

    #[test]
    fn fingerprint_sees_every_field() {
        let g = ModelPreset::Tiny.geometry(16);
        let f = geometry_fingerprint(&g);
        let mut h = g;
        h.tp_size = 2;
        h.tp_rank = 1;
        assert_ne!(geometry_fingerprint(&h), f);
        let mut h = g;
        h.dtype = kvtier_core::Dtype::F16;
        assert_ne!(geometry_fingerprint(&h), f);
        assert_eq!(geometry_fingerprint(&g), f);
    }
}
