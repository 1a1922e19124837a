//! The arena header: the first [`HEADER_BYTES`] of the file.
//!
//! ```text
//! off  size  field
//!   0     8  magic "KVTIERG2"
//!   8     4  format version (FORMAT_VERSION)
//!  12     4  header bytes reserved (HEADER_BYTES)
//!  16     8  page bytes (slot alignment: 4096 or 2 MiB)
//!  24     8  slot bytes
//!  32     8  slot count
//!  40     8  block bytes
//!  48     8  layer bytes
//!  56     4  layers
//!  60     4  slot table entry bytes
//!  64     8  slot table offset
//!  72     8  slot data offset
//!  80     8  file bytes
//!  88     4  owner pid (informational: the creator's, kept by an adopting owner)
//!  92     4  reserved, zero
//!  96     8  checksum: xxh3_64(bytes 0..96, seed 0)
//! 104  3992  zero
//! ```
//!
//! Every integer is little-endian. The header is written once, before the
//! arena is used, and never changes afterwards.

use std::path::Path;

use crate::error::{MemError, Result};
use crate::layout::{ArenaLayout, HEADER_BYTES};
use crate::table;

/// The first 8 bytes of every arena.
pub const MAGIC: [u8; 8] = *b"KVTIERG2";
/// Version of the layout described here and of the slot table's
/// (table.rs); bumped on any change. 2: table entries carry a MAC.
pub const FORMAT_VERSION: u32 = 2;
/// Bytes covered by the header checksum (the checksum follows them).
pub const CHECKED_BYTES: usize = 96;
/// Bytes of the encoded header fields including the checksum.
pub const ENCODED_BYTES: usize = CHECKED_BYTES + 8;

/// Encodes the header of `layout` for an arena owned by process `pid`.
pub fn encode(layout: &ArenaLayout, pid: u32) -> [u8; ENCODED_BYTES] {
    let mut b = [0u8; ENCODED_BYTES];
    b[0..8].copy_from_slice(&MAGIC);
    b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&(HEADER_BYTES as u32).to_le_bytes());
    let put64 = |b: &mut [u8; ENCODED_BYTES], at: usize, v: usize| {
        b[at..at + 8].copy_from_slice(&(v as u64).to_le_bytes());
    };
    put64(&mut b, 16, layout.page_bytes);
    put64(&mut b, 24, layout.slot_bytes);
    put64(&mut b, 32, layout.slot_count);
    put64(&mut b, 40, layout.block_bytes);
    put64(&mut b, 48, layout.layer_bytes);
    b[56..60].copy_from_slice(&(layout.layers as u32).to_le_bytes());
    b[60..64].copy_from_slice(&(layout.entry_bytes as u32).to_le_bytes());
    put64(&mut b, 64, layout.table_offset);
    put64(&mut b, 72, layout.data_offset);
    put64(&mut b, 80, layout.file_bytes);
    b[88..92].copy_from_slice(&pid.to_le_bytes());
    let sum = xxhash_rust::xxh3::xxh3_64(&b[..CHECKED_BYTES]);
    b[CHECKED_BYTES..ENCODED_BYTES].copy_from_slice(&sum.to_le_bytes());
    b
}

/// What a reader learns from a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded {
    /// The arena's layout.
    pub layout: ArenaLayout,
    /// The process that created it.
    pub owner_pid: u32,
}

/// Decodes and validates the header at the start of `bytes`, the first bytes
/// of a file of `file_len` bytes at `path`: magic, version, checksum, and
/// that every table and slot lies inside the file.
pub fn decode(bytes: &[u8], file_len: u64, path: &Path) -> Result<Decoded> {
    let bad = |reason: String| MemError::BadHeader {
        path: path.to_owned(),
        reason,
    };
    if bytes.len() < ENCODED_BYTES {
        return Err(bad(format!(
            "file is {file_len} bytes, shorter than a header"
        )));
    }
    if bytes[0..8] != MAGIC {
        return Err(bad(
            "no kvtier arena magic (not initialised yet, or not an arena)".into(),
        ));
    }
    let u32_at = |at: usize| {
        let mut w = [0u8; 4];
        w.copy_from_slice(&bytes[at..at + 4]);
        u32::from_le_bytes(w)
    };
    let u64_at = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(w)
    };
    let version = u32_at(8);
    if version != FORMAT_VERSION {
        return Err(bad(format!(
            "format version {version}; this build reads version {FORMAT_VERSION}"
        )));
    }
    if u64_at(CHECKED_BYTES) != xxhash_rust::xxh3::xxh3_64(&bytes[..CHECKED_BYTES]) {
        return Err(bad("header checksum mismatch".into()));
    }
    let size = |v: u64| usize::try_from(v).map_err(|_| bad(format!("size {v} overflows")));
    let page_bytes = size(u64_at(16))?;
    let block_bytes = size(u64_at(40))?;
    let layer_bytes = size(u64_at(48))?;
    if !page_bytes.is_power_of_two() || page_bytes < crate::layout::PAGE_BYTES {
        return Err(bad(format!("page bytes {page_bytes} is not a page size")));
    }
    let capacity = u64_at(24).saturating_mul(u64_at(32));
    // Recompute the layout from the inputs and insist the header agrees: one
    // source of truth for the arithmetic, and a header whose fields
    // contradict each other is refused.
    let layout = ArenaLayout::compute(block_bytes, layer_bytes, capacity, page_bytes)
        .map_err(|e| bad(e.to_string()))?;
    let stored = [
        (u32_at(12) as u64, HEADER_BYTES as u64, "header bytes"),
        (u64_at(24), layout.slot_bytes as u64, "slot bytes"),
        (u64_at(32), layout.slot_count as u64, "slot count"),
        (u32_at(56) as u64, layout.layers as u64, "layers"),
        (
            u32_at(60) as u64,
            table::entry_bytes(layout.layers) as u64,
            "entry bytes",
        ),
        (u64_at(64), layout.table_offset as u64, "table offset"),
        (u64_at(72), layout.data_offset as u64, "data offset"),
        (u64_at(80), layout.file_bytes as u64, "file bytes"),
    ];
    for (got, want, what) in stored {
        if got != want {
            return Err(bad(format!("{what} is {got}, expected {want}")));
        }
    }
    if file_len < layout.file_bytes as u64 {
        return Err(bad(format!(
            "file is {file_len} bytes, the header describes {}",
            layout.file_bytes
        )));
    }
    Ok(Decoded {
        layout,
        owner_pid: u32_at(88),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::PAGE_BYTES;

    #[test]
    fn round_trips_and_catches_damage() {
        let layout = ArenaLayout::compute(40_000, 10_000, 1 << 20, PAGE_BYTES).unwrap();
        let enc = encode(&layout, 42);
        let p = Path::new("/dev/shm/x");
        let d = decode(&enc, layout.file_bytes as u64, p).unwrap();
        assert_eq!(d.layout, layout);
        assert_eq!(d.owner_pid, 42);
        for i in 0..ENCODED_BYTES {
            let mut bad = enc;
            bad[i] ^= 0x10;
            assert!(
                decode(&bad, layout.file_bytes as u64, p).is_err(),
                "byte {i}"
            );
        }
        assert!(decode(&enc, layout.file_bytes as u64 - 1, p).is_err());
        assert!(decode(&enc[..50], 50, p).is_err());
    }
}
