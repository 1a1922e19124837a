//! The bytes of one block object and its name (`docs/remote-format.md`).
//!
//! ```text
//! offset      size  field
//! 0           8     magic            b"KVTIERG4"
//! 8           2     version          1
//! 10          2     flags            0 (reserved; must be 0)
//! 12          4     header_len       72 + 8 x layers
//! 16          16    key              block hash, little-endian u128
//! 32          8     block_bytes      bytes of block data after the header
//! 40          4     layers           layer count L
//! 44          4     reserved         0
//! 48          8     layer_bytes      bytes per layer (block_bytes = L x layer_bytes)
//! 56          8     block_sum        kvtier_core block checksum
//! 64          8 x L layer_sums       kvtier_core layer checksums, layer 0 first
//! 64 + 8L     8     header_sum       xxh3_64(bytes 0 .. 64 + 8L, seed HEADER_SEED)
//! 72 + 8L     ...   data             block_bytes bytes, layer 0 first
//! ```
//!
//! All integers are little-endian. The header length follows from the layer
//! count alone, so a reader that knows the geometry can fetch the header and
//! any layers with one ranged request each, without a first round trip.
//!
//! Objects are named `<prefix>/blocks/<hh>/<32 hex digits of the key>`, where
//! `hh` is the first two hex digits of the key (a fan-out of 256 directories
//! keeps local directories small and spreads S3 request-rate partitions).

use kvtier_core::{BlockHash, BlockSums, Geometry};
use object_store::path::Path;

/// The first 8 bytes of every block object.
pub const MAGIC: [u8; 8] = *b"KVTIERG4";
/// The format version this crate writes and reads.
pub const VERSION: u16 = 1;
/// Bytes of the header before the per-layer sums.
pub const FIXED_LEN: usize = 64;
/// Seed of the header checksum (ASCII "kvtierH4").
pub const HEADER_SEED: u64 = u64::from_le_bytes(*b"kvtierH4");
/// The directory under the prefix that holds block objects.
pub const BLOCKS_DIR: &str = "blocks";

/// A decoded, self-consistent object header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The block the object holds.
    pub key: BlockHash,
    /// Bytes of block data after the header.
    pub block_bytes: u64,
    /// Bytes per layer.
    pub layer_bytes: u64,
    /// The block's checksums (`sums.layers.len()` is the layer count).
    pub sums: BlockSums,
}

/// Why a header was refused. Every reason makes the object corrupt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Fewer bytes than the header needs.
    #[error("header truncated")]
    Truncated,
    /// The magic bytes differ.
    #[error("bad magic")]
    BadMagic,
    /// A version or flags this crate does not read.
    #[error("unsupported version or flags")]
    Unsupported,
    /// `header_len` does not match the layer count.
    #[error("header length does not match the layer count")]
    BadLength,
    /// The header checksum does not match.
    #[error("header checksum mismatch")]
    BadChecksum,
    /// Fields contradict each other (`block_bytes != layers x layer_bytes`,
    /// reserved bits set).
    #[error("inconsistent header fields")]
    Inconsistent,
    /// The header names another block than the one asked for.
    #[error("header names another block")]
    WrongKey,
    /// The header's shape differs from the tier's geometry.
    #[error("header shape differs from the geometry")]
    WrongShape,
    /// The layer sums do not combine to the block sum.
    #[error("layer checksums do not combine to the block checksum")]
    InconsistentSums,
}

/// Header length of a block with `layers` layers.
pub const fn header_len(layers: u32) -> usize {
    FIXED_LEN + 8 * layers as usize + 8
}

impl Header {
    /// The header of block `key` with `sums`, shaped by `geometry`.
    pub fn new(key: BlockHash, geometry: &Geometry, sums: BlockSums) -> Self {
        Header {
            key,
            block_bytes: geometry.block_bytes(),
            layer_bytes: geometry.layer_bytes(),
            sums,
        }
    }

    /// Bytes of the encoded header.
    pub fn len(&self) -> usize {
        FIXED_LEN + 8 * self.sums.layers.len() + 8
    }

    /// Never true: a header has at least its fixed fields.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The encoded header.
    pub fn encode(&self) -> Vec<u8> {
        let len = self.len();
        let mut b = Vec::with_capacity(len);
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        b.extend_from_slice(&(len as u32).to_le_bytes());
        b.extend_from_slice(&self.key.to_le_bytes());
        b.extend_from_slice(&self.block_bytes.to_le_bytes());
        b.extend_from_slice(&(self.sums.layers.len() as u32).to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&self.layer_bytes.to_le_bytes());
        b.extend_from_slice(&self.sums.block.to_le_bytes());
        for s in &self.sums.layers {
            b.extend_from_slice(&s.to_le_bytes());
        }
        let sum = xxhash_rust::xxh3::xxh3_64_with_seed(&b, HEADER_SEED);
        b.extend_from_slice(&sum.to_le_bytes());
        b
    }

    /// Decodes the header at the start of `bytes` (which may run on into the
    /// data) and checks it against itself: magic, version, flags, length,
    /// header checksum, field consistency. It does not check the key, the
    /// geometry or the sums; see [`Header::check`].
    pub fn decode(bytes: &[u8]) -> Result<Header, HeaderError> {
        if bytes.len() < FIXED_LEN + 8 {
            return Err(HeaderError::Truncated);
        }
        if bytes[0..8] != MAGIC {
            return Err(HeaderError::BadMagic);
        }
        if u16_at(bytes, 8) != VERSION || u16_at(bytes, 10) != 0 {
            return Err(HeaderError::Unsupported);
        }
        let len = u32_at(bytes, 12) as usize;
        let layers = u32_at(bytes, 40);
        if len != header_len(layers) {
            return Err(HeaderError::BadLength);
        }
        if bytes.len() < len {
            return Err(HeaderError::Truncated);
        }
        let body = &bytes[..len - 8];
        if xxhash_rust::xxh3::xxh3_64_with_seed(body, HEADER_SEED) != u64_at(bytes, len - 8) {
            return Err(HeaderError::BadChecksum);
        }
        let block_bytes = u64_at(bytes, 32);
        let layer_bytes = u64_at(bytes, 48);
        if u32_at(bytes, 44) != 0 || layer_bytes.checked_mul(layers as u64) != Some(block_bytes) {
            return Err(HeaderError::Inconsistent);
        }
        let mut key = [0u8; 16];
        key.copy_from_slice(&bytes[16..32]);
        let layer_sums = (0..layers as usize)
            .map(|l| u64_at(bytes, FIXED_LEN + 8 * l))
            .collect();
        Ok(Header {
            key: BlockHash::from_le_bytes(key),
            block_bytes,
            layer_bytes,
            sums: BlockSums {
                block: u64_at(bytes, 56),
                layers: layer_sums,
            },
        })
    }

    /// Checks a decoded header against what the reader expects: the key it
    /// asked for, the tier's geometry, and layer sums that combine to the
    /// block sum.
    pub fn check(&self, key: BlockHash, geometry: &Geometry) -> Result<(), HeaderError> {
        if self.key != key {
            return Err(HeaderError::WrongKey);
        }
        if self.block_bytes != geometry.block_bytes()
            || self.layer_bytes != geometry.layer_bytes()
            || self.sums.layers.len() != geometry.layers as usize
        {
            return Err(HeaderError::WrongShape);
        }
        if !self.sums.is_consistent(key) {
            return Err(HeaderError::InconsistentSums);
        }
        Ok(())
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[at..at + 2]);
    u16::from_le_bytes(a)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// The object path of block `key` under `prefix` (`""` for none):
/// `<prefix>/blocks/<hh>/<32 hex>`.
pub fn object_path(prefix: &str, key: BlockHash) -> Path {
    Path::from(format!("{}{}", dir_prefix(prefix), relative_name(key)))
}

/// The name of block `key` relative to the prefix: `blocks/<hh>/<32 hex>`.
pub fn relative_name(key: BlockHash) -> String {
    let hex = format!("{:032x}", key.0);
    format!("{BLOCKS_DIR}/{}/{hex}", &hex[..2])
}

/// The directory listed to find every block: `<prefix>/blocks`.
pub fn blocks_dir(prefix: &str) -> Path {
    Path::from(format!("{}{BLOCKS_DIR}", dir_prefix(prefix)))
}

fn dir_prefix(prefix: &str) -> String {
    let p = prefix.trim_matches('/');
    if p.is_empty() {
        String::new()
    } else {
        format!("{p}/")
    }
}

/// The block key named by an object path, or `None` for anything that is not
/// a block object of this prefix (foreign objects, temporary files).
pub fn parse_object_path(prefix: &str, path: &Path) -> Option<BlockHash> {
    let full = path.as_ref();
    let rest = full.strip_prefix(dir_prefix(prefix).as_str())?;
    let rest = rest.strip_prefix(BLOCKS_DIR)?.strip_prefix('/')?;
    let (fan, name) = rest.split_once('/')?;
    let is_hex = |s: &str| s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
    if name.len() != 32 || !is_hex(name) || fan.len() != 2 || !name.starts_with(fan) {
        return None;
    }
    u128::from_str_radix(name, 16).ok().map(BlockHash)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        let g = Geometry::raw(3, 96).unwrap();
        let key = BlockHash(0xabcdef);
        let data = vec![7u8; 96];
        Header::new(key, &g, BlockSums::compute(key, 32, &data))
    }

    #[test]
    fn header_round_trips_and_checks() {
        let h = header();
        let b = h.encode();
        assert_eq!(b.len(), header_len(3));
        let back = Header::decode(&b).unwrap();
        assert_eq!(back, h);
        let g = Geometry::raw(3, 96).unwrap();
        back.check(h.key, &g).unwrap();
        assert_eq!(back.check(BlockHash(1), &g), Err(HeaderError::WrongKey));
        let g2 = Geometry::raw(2, 96).unwrap();
        assert_eq!(back.check(h.key, &g2), Err(HeaderError::WrongShape));
        assert_eq!(
            Header::decode(&b[..b.len() - 1]),
            Err(HeaderError::Truncated)
        );
    }

    #[test]
    fn names_parse_back_and_foreign_names_do_not() {
        let key = BlockHash(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
        let p = object_path("cache/v1", key);
        assert_eq!(
            p.as_ref(),
            "cache/v1/blocks/01/0123456789abcdef0011223344556677"
        );
        assert_eq!(parse_object_path("cache/v1", &p), Some(key));
        assert_eq!(parse_object_path("", &object_path("", key)), Some(key));
        for foreign in [
            "cache/v1/blocks/02/0123456789abcdef0011223344556677",
            "cache/v1/blocks/01/0123456789abcdef0011223344556677#1",
            "cache/v1/blocks/01/0123456789ABCDEF0011223344556677",
            "cache/v1/other/01/0123456789abcdef0011223344556677",
            "cache/v2/blocks/01/0123456789abcdef0011223344556677",
            "cache/v1/blocks/readme.txt",
        ] {
            assert_eq!(parse_object_path("cache/v1", &Path::from(foreign)), None);
        }
    }
}
