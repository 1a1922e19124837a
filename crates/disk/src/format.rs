//! On-disk format: sizes, offsets and the codecs of the region and slot
//! headers. `docs/disk-format.md` is the prose version of this file.
//!
//! ```text
//! data file  = region 0 | region 1 | ... | region R-1          (region_size each)
//! region     = region header (4096 B) | slot 0 | slot 1 | ... | slot S-1 | unused tail
//! slot       = slot header (round_up(72 + 8 * layers, 4096) B) | block data (round_up(block_bytes, 4096) B)
//!
//! layer-major life (v2 only; P = layer_bytes, L = layers, H as above):
//! region     = region header (4096 B) | row 0 | row 1 | ... | row L-1 | unused tail
//! row 0      = S x (slot header (H) | layer-0 piece (P))
//! row l      = S x layer-l piece (P)                          1 <= l < L
//!   header(s)   = 4096 + s * (H + P)
//!   piece(0, s) = header(s) + H
//!   piece(l, s) = 4096 + S * (H + P) + ((l - 1) * S + s) * P  l >= 1
//!
//! region header (little-endian; the rest of the 4096 B is zero)
//!   0  magic          [u8; 8]  "KVTDREGN"
//!   8  version        u32      1 or 2
//!  12  dir            u32
//!  16  region         u32      index of the region in the file
//!  20  slots          u32      slots per region
//!  24  generation     u64      the region's current life
//!  32  creation_id    u128     the directory's creation id (meta file)
//!  48  slot_size      u64
//!  56  checksum       u64      v1: xxh3_64 of bytes 0..56
//!  v2 only:
//!  56  layout         u32      0 block-major, 1 layer-major
//!  60  zero           u32
//!  64  checksum       u64      xxh3_64 of bytes 0..64
//!
//! slot header (little-endian; zero padded to its size)
//!   0  magic          [u8; 8]  "KVTDSLOT" (v1) or "KVTDSLT2" (v2)
//!   8  key            u128
//!  24  block_sum      u64      the block checksum carried with the block
//!  32  generation     u64      equals the region header's for a live slot
//!  40  region         u32
//!  44  slot           u32
//!  48  data_len       u64      block bytes
//!  56  layers         u32
//!  60  dir            u32
//!  64  layer_sums     [u64; layers]
//!  64 + 8 * layers    checksum u64      xxh3_64 of every byte before it; v2:
//!                                       seeded with xxh3(creation_id, layout)
//! ```
//!
//! Offsets are built from field sizes below (`Field` constants), so the
//! comment and the code cannot drift apart without a test noticing.

use kvtier_core::{BlockHash, Geometry};
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::{DiskError, Result};

/// Version of the checkpoint, and of every structure of a directory that
/// never held a v2 life. See the version log in `docs/disk-format.md`.
pub const FORMAT_VERSION: u32 = 1;
/// Highest version of the meta file and of region and slot headers this
/// build reads and writes (v2: lives may be layer-major, slot headers are
/// seeded).
pub const FORMAT_VERSION_2: u32 = 2;

/// The unit of alignment of every structure in the data file. Direct I/O
/// needs at most this on every file system we know (ext4/xfs report 512).
pub const SECTOR: u64 = 4096;

/// Bytes of the region header at the start of each region.
pub const REGION_HEADER_BYTES: u64 = SECTOR;

/// Magic of the region header.
pub const REGION_MAGIC: [u8; 8] = *b"KVTDREGN";
/// Magic of the slot header (v1).
pub const SLOT_MAGIC: [u8; 8] = *b"KVTDSLOT";
/// Magic of the slot header (v2).
pub const SLOT_MAGIC_2: [u8; 8] = *b"KVTDSLT2";

/// How a region life places its slots' bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RegionLayout {
    /// Each slot is its header followed by the whole block.
    #[default]
    Block,
    /// Each layer of every slot of the region lies in that layer's row
    /// (`docs/design/layer-stripe.md` 3.2); only in v2 lives.
    Layer,
}

impl RegionLayout {
    /// The on-disk code (region header field, slot header seed).
    pub const fn code(self) -> u32 {
        match self {
            RegionLayout::Block => 0,
            RegionLayout::Layer => 1,
        }
    }

    /// The layout of an on-disk code.
    pub const fn from_code(code: u32) -> Option<Self> {
        match code {
            0 => Some(RegionLayout::Block),
            1 => Some(RegionLayout::Layer),
            _ => None,
        }
    }
}

/// The format of one region life: its header version and layout (I13).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LifeFormat {
    /// Header version: 1 (block-major, unseeded) or 2.
    pub version: u32,
    /// Where the life's slot bytes lie.
    pub layout: RegionLayout,
}

impl LifeFormat {
    /// A v1 life: block-major with v1 headers (directories that never held
    /// a v2 life).
    pub const V1: LifeFormat = LifeFormat {
        version: FORMAT_VERSION,
        layout: RegionLayout::Block,
    };

    /// Packs into a byte (for an atomic in memory).
    pub const fn pack(self) -> u8 {
        ((self.version as u8) << 1) | self.layout.code() as u8
    }

    /// Unpacks [`LifeFormat::pack`]; a bad byte reads as v1.
    pub const fn unpack(b: u8) -> Self {
        let layout = match RegionLayout::from_code((b & 1) as u32) {
            Some(l) => l,
            None => RegionLayout::Block,
        };
        LifeFormat {
            version: (b >> 1) as u32,
            layout,
        }
    }
}

/// How a slot header is sealed: v1 (checksum unseeded) or v2 (checksum
/// seeded by the directory's creation id and the life's layout, so bytes a
/// client wrote in one life cannot pass for a header of another, I15).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotSeal {
    /// Magic `KVTDSLOT`, xxh3 with seed 0.
    V1,
    /// Magic `KVTDSLT2`, xxh3 seeded with the xxh3 of the creation id and the layout.
    V2 {
        /// The directory's creation id (never leaves `crates/disk`).
        creation_id: u128,
        /// The life's layout.
        layout: RegionLayout,
    },
}

impl SlotSeal {
    /// The seal of slot headers in a life of `format` in a directory
    /// created as `creation_id`.
    pub fn of(format: LifeFormat, creation_id: u128) -> Self {
        if format.version >= FORMAT_VERSION_2 {
            SlotSeal::V2 {
                creation_id,
                layout: format.layout,
            }
        } else {
            SlotSeal::V1
        }
    }

    fn magic(self) -> [u8; 8] {
        match self {
            SlotSeal::V1 => SLOT_MAGIC,
            SlotSeal::V2 { .. } => SLOT_MAGIC_2,
        }
    }

    fn checksum(self, bytes: &[u8]) -> u64 {
        match self {
            SlotSeal::V1 => xxh3_64(bytes),
            SlotSeal::V2 {
                creation_id,
                layout,
            } => {
                // Both hashed together: a fold of the id xored with the
                // layout would let ids differing in the lowest bit swap
                // layouts with the same seed.
                let mut key = [0u8; 20];
                key[..16].copy_from_slice(&creation_id.to_le_bytes());
                key[16..].copy_from_slice(&layout.code().to_le_bytes());
                xxh3_64_with_seed(bytes, xxh3_64(&key))
            }
        }
    }
}

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
    // Version 2: the layout takes the v1 checksum's place.
    pub const LAYOUT: usize = SLOT_SIZE + 8;
    pub const ZERO: usize = LAYOUT + 4;
    pub const CHECKSUM_2: usize = ZERO + 4;
    pub const END_2: usize = CHECKSUM_2 + 8;
}

const _: () = assert!(rh::END <= rh::END_2 && rh::END_2 as u64 <= REGION_HEADER_BYTES);

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

    /// Whether this geometry can be stored layer-major: every layer piece
    /// must be a whole number of sectors, so pieces stay aligned and the
    /// rows fill exactly the block-major slots' space (design 3.1).
    pub fn layer_eligible(&self) -> bool {
        self.layer_bytes > 0
            && self.layer_bytes.is_multiple_of(SECTOR)
            && self.layer_bytes * self.layers as u64 == self.block_bytes
            && self.slot_bytes == self.slot_header_bytes + self.block_bytes
    }

    /// Offset from the region start of the slot header of `slot` in a life
    /// of layout `kind`: `header(s)` of I14.
    pub fn header_in_region(&self, kind: RegionLayout, slot: u32) -> u64 {
        match kind {
            RegionLayout::Block => self.slot_in_region(slot),
            RegionLayout::Layer => {
                REGION_HEADER_BYTES + slot as u64 * (self.slot_header_bytes + self.layer_bytes)
            }
        }
    }

    /// Offset from the region start of layer `layer` of `slot` in a life of
    /// layout `kind`: `piece(l, s)` of I14 (block-major: inside the slot's
    /// data, `layer_bytes` long like a piece).
    pub fn piece_in_region(&self, kind: RegionLayout, layer: u32, slot: u32) -> u64 {
        let p = self.layer_bytes;
        match kind {
            RegionLayout::Block => {
                self.slot_in_region(slot) + self.slot_header_bytes + layer as u64 * p
            }
            RegionLayout::Layer if layer == 0 => {
                self.header_in_region(kind, slot) + self.slot_header_bytes
            }
            RegionLayout::Layer => {
                let s = self.slots_per_region as u64;
                let row0 = s * (self.slot_header_bytes + p);
                REGION_HEADER_BYTES + row0 + ((layer as u64 - 1) * s + slot as u64) * p
            }
        }
    }

    /// File offset of the header of `slot` in `region`, laid out as `kind`.
    pub fn header_offset(&self, kind: RegionLayout, region: u32, slot: u32) -> u64 {
        self.region_offset(region) + self.header_in_region(kind, slot)
    }

    /// File offset of layer `layer` of `slot` in `region`, laid out as
    /// `kind`.
    pub fn piece_offset(&self, kind: RegionLayout, region: u32, layer: u32, slot: u32) -> u64 {
        self.region_offset(region) + self.piece_in_region(kind, layer, slot)
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
    /// The life's header version and layout (v1: always block-major).
    pub format: LifeFormat,
}

impl RegionHeader {
    /// Encodes into the first bytes of `out` (at least 72 bytes; the caller
    /// zeroes the rest of the sector). A v1 header has no layout field: only
    /// block-major v1 lives exist.
    pub fn encode(&self, out: &mut [u8]) {
        let v2 = self.format.version >= FORMAT_VERSION_2;
        let version = if v2 { FORMAT_VERSION_2 } else { FORMAT_VERSION };
        put(out, rh::MAGIC, &REGION_MAGIC);
        put(out, rh::VERSION, &version.to_le_bytes());
        put(out, rh::DIR, &self.dir.to_le_bytes());
        put(out, rh::REGION, &self.region.to_le_bytes());
        put(out, rh::SLOTS, &self.slots.to_le_bytes());
        put(out, rh::GENERATION, &self.generation.to_le_bytes());
        put(out, rh::CREATION, &self.creation_id.to_le_bytes());
        put(out, rh::SLOT_SIZE, &self.slot_size.to_le_bytes());
        let at = if v2 {
            put(out, rh::LAYOUT, &self.format.layout.code().to_le_bytes());
            put(out, rh::ZERO, &0u32.to_le_bytes());
            rh::CHECKSUM_2
        } else {
            rh::CHECKSUM
        };
        let sum = xxh3_64(&out[..at]);
        put(out, at, &sum.to_le_bytes());
    }

    /// Decodes a v1 or v2 header; `None` if the magic, version, layout or
    /// checksum is wrong (a never-written, torn or foreign region).
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.get(..8)? != REGION_MAGIC {
            return None;
        }
        let format = match get_u32(b, rh::VERSION)? {
            FORMAT_VERSION => LifeFormat::V1,
            FORMAT_VERSION_2 => LifeFormat {
                version: FORMAT_VERSION_2,
                layout: RegionLayout::from_code(get_u32(b, rh::LAYOUT)?)?,
            },
            _ => return None,
        };
        let at = if format.version == FORMAT_VERSION {
            rh::CHECKSUM
        } else if get_u32(b, rh::ZERO)? == 0 {
            rh::CHECKSUM_2
        } else {
            return None;
        };
        if get_u64(b, at)? != xxh3_64(b.get(..at)?) {
            return None;
        }
        Some(RegionHeader {
            dir: get_u32(b, rh::DIR)?,
            region: get_u32(b, rh::REGION)?,
            slots: get_u32(b, rh::SLOTS)?,
            generation: get_u64(b, rh::GENERATION)?,
            creation_id: get_u128(b, rh::CREATION)?,
            slot_size: get_u64(b, rh::SLOT_SIZE)?,
            format,
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
    /// the caller zeroes the padding), sealed with `seal`.
    #[allow(clippy::too_many_arguments)]
    pub fn encode_into(
        out: &mut [u8],
        seal: SlotSeal,
        key: BlockHash,
        block_sum: u64,
        generation: u64,
        (dir, region, slot): (u32, u32, u32),
        data_len: u64,
        layer_sums: &[u64],
    ) {
        put(out, sh::MAGIC, &seal.magic());
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
        let sum = seal.checksum(&out[..at]);
        put(out, at, &sum.to_le_bytes());
    }

    /// Decodes a header with exactly `layers` layer sums sealed with `seal`
    /// (a header of another version, directory or layout does not verify);
    /// `None` if anything does not verify.
    pub fn decode(b: &[u8], layers: u32, seal: SlotSeal) -> Option<Self> {
        if b.get(..8)? != seal.magic() || get_u32(b, sh::LAYERS)? != layers {
            return None;
        }
        let end = sh::LAYER_SUMS + 8 * layers as usize;
        if get_u64(b, end)? != seal.checksum(b.get(..end)?) {
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
        assert_eq!(
            (rh::LAYOUT, rh::ZERO, rh::CHECKSUM_2, rh::END_2),
            (56, 60, 64, 72)
        );
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
            format: LifeFormat::V1,
        };
        let v2 = |layout| RegionHeader {
            format: LifeFormat {
                version: FORMAT_VERSION_2,
                layout,
            },
            ..h
        };
        for (h, len) in [
            (h, 64),
            (v2(RegionLayout::Block), 72),
            (v2(RegionLayout::Layer), 72),
        ] {
            let mut b = vec![0u8; 4096];
            h.encode(&mut b);
            assert_eq!(RegionHeader::decode(&b), Some(h));
            for i in 0..len {
                let mut bad = b.clone();
                bad[i] ^= 0x10;
                assert_eq!(RegionHeader::decode(&bad), None, "{h:?} byte {i}");
            }
            assert_eq!(RegionHeader::decode(&b[..30]), None);
        }
        // The v1 header encodes exactly as before: no layout field.
        let mut b = vec![0u8; 4096];
        h.encode(&mut b);
        assert_eq!(get_u32(&b, rh::VERSION), Some(1));
        assert!(b[64..].iter().all(|&x| x == 0));
        assert_eq!(RegionHeader::decode(&[0u8; 4096]), None);
    }

    fn seals() -> [SlotSeal; 3] {
        [
            SlotSeal::V1,
            SlotSeal::V2 {
                creation_id: 0x1234_5678_9abc_def0_0fed_cba9_8765_4321,
                layout: RegionLayout::Block,
            },
            SlotSeal::V2 {
                creation_id: 0x1234_5678_9abc_def0_0fed_cba9_8765_4321,
                layout: RegionLayout::Layer,
            },
        ]
    }

    #[test]
    fn slot_header_round_trips_and_detects_damage() {
        let sums = [1u64, 2, 3];
        for seal in seals() {
            let mut b = vec![0u8; 4096];
            SlotHeader::encode_into(&mut b, seal, BlockHash(42), 77, 5, (1, 2, 3), 12288, &sums);
            let h = SlotHeader::decode(&b, 3, seal).unwrap();
            assert_eq!(h.key, BlockHash(42));
            assert_eq!(
                (h.block_sum, h.generation, h.dir, h.region, h.slot),
                (77, 5, 1, 2, 3)
            );
            assert_eq!(h.data_len, 12288);
            assert_eq!(h.layer_sums, sums);
            assert!(SlotHeader::decode(&b, 2, seal).is_none());
            for i in 0..(72 + 24) {
                let mut bad = b.clone();
                bad[i] ^= 1;
                assert!(
                    SlotHeader::decode(&bad, 3, seal).is_none(),
                    "{seal:?} byte {i}"
                );
            }
        }
    }

    #[test]
    fn slot_header_verifies_only_under_its_own_seal() {
        let all = seals();
        let other_dir = SlotSeal::V2 {
            creation_id: 0x1234_5678_9abc_def0_8fed_cba9_8765_4321,
            layout: RegionLayout::Layer,
        };
        for (i, seal) in all.iter().enumerate() {
            let mut b = vec![0u8; 4096];
            SlotHeader::encode_into(&mut b, *seal, BlockHash(9), 1, 2, (0, 1, 2), 4096, &[7]);
            for (j, other) in all.iter().chain([&other_dir]).enumerate() {
                let ok = SlotHeader::decode(&b, 1, *other).is_some();
                assert_eq!(ok, i == j, "written {seal:?}, read {other:?}");
            }
        }
    }

    #[test]
    fn layer_major_offsets_of_llama_in_64mib_regions() {
        let g = ModelPreset::Llama3_8B.geometry(16);
        let l = Layout::new(&g, 64 << 20, 1 << 30).unwrap();
        assert!(l.layer_eligible());
        let k = RegionLayout::Layer;
        assert_eq!(l.header_in_region(k, 0), 4096);
        assert_eq!(l.piece_in_region(k, 0, 0), 8192);
        assert_eq!(l.header_in_region(k, 1), 4096 + (68 << 10));
        // Row 0 is 31 x 68 KiB from 4096; row 1 starts right after it.
        assert_eq!(l.piece_in_region(k, 1, 0), 4096 + 2_158_592);
        assert_eq!(l.piece_in_region(k, 1, 0), 2_162_688);
        let end = l.piece_in_region(k, 31, 30) + (64 << 10);
        assert_eq!(end, 65_142_784);
        assert_eq!(end, l.slot_in_region(31));
        // Block-major pieces are the layers inside the slot's data.
        let b = RegionLayout::Block;
        assert_eq!(
            l.piece_offset(b, 1, 2, 3),
            l.data_offset(1, 3) + 2 * (64 << 10)
        );
        assert_eq!(l.header_offset(b, 1, 3), l.slot_offset(1, 3));
        // 18 KiB layers (MLA-like) are not eligible.
        let g = Geometry::raw(4, (4 * 18) << 10).unwrap();
        assert!(!Layout::new(&g, 64 << 20, 1 << 30).unwrap().layer_eligible());
    }

    #[test]
    fn layouts_parse_from_config_names() {
        use serde::de::IntoDeserializer;
        use serde::de::value::{Error, StrDeserializer};
        let parse = |name: &str| {
            let d: StrDeserializer<'_, Error> = name.into_deserializer();
            RegionLayout::deserialize(d)
        };
        assert_eq!(parse("block").unwrap(), RegionLayout::Block);
        assert_eq!(parse("layer").unwrap(), RegionLayout::Layer);
        assert!(parse("stripe").is_err());
        assert_eq!(RegionLayout::default(), RegionLayout::Block);
        for k in [RegionLayout::Block, RegionLayout::Layer] {
            assert_eq!(RegionLayout::from_code(k.code()), Some(k));
            for v in [FORMAT_VERSION, FORMAT_VERSION_2] {
                let f = LifeFormat {
                    version: v,
                    layout: k,
                };
                assert_eq!(LifeFormat::unpack(f.pack()), f);
            }
        }
        assert_eq!(RegionLayout::from_code(2), None);
    }

    proptest::proptest! {
        /// I14: in a layer-major life the headers and pieces of all slots
        /// are 4096-aligned, disjoint, and exactly cover the block-major
        /// slots' span.
        #[test]
        fn layer_major_ranges_tile_the_region(
            layers in 1u32..40,
            sectors in 1u64..20,
            extra in 0u64..(64 << 20),
        ) {
            let g = Geometry::raw(layers, layers as u64 * sectors * SECTOR).unwrap();
            let min = REGION_HEADER_BYTES
                + round_up(SLOT_HEADER_FIXED + 8 * layers as u64, SECTOR)
                + layers as u64 * sectors * SECTOR;
            let region = round_up(min + extra, SECTOR);
            let l = Layout::new(&g, region, region).unwrap();
            proptest::prop_assert!(l.layer_eligible());
            let k = RegionLayout::Layer;
            let (h, p) = (l.slot_header_bytes, l.layer_bytes);
            let mut ranges = Vec::new();
            for s in 0..l.slots_per_region {
                ranges.push((l.header_in_region(k, s), h));
                for layer in 0..layers {
                    ranges.push((l.piece_in_region(k, layer, s), p));
                }
            }
            ranges.sort_unstable();
            let mut at = REGION_HEADER_BYTES;
            for (off, len) in ranges {
                proptest::prop_assert!(off.is_multiple_of(SECTOR));
                proptest::prop_assert_eq!(off, at, "gap or overlap");
                at = off + len;
            }
            proptest::prop_assert_eq!(at, l.slot_in_region(l.slots_per_region));
            proptest::prop_assert!(at <= l.region_bytes);
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
