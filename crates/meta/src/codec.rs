//! Compact binary encoding of [`BlockMeta`] for the durable backends, and
//! of open write sessions ([`SessionRecord`]) for a shared ledger.
//!
//! Block records dominate the metadata footprint, so they are not JSON.
//! The key lives in the backend's key, not in the value. Layout (all
//! integers LEB128 varints, strings a varint length then UTF-8 bytes):
//!
//! ```text
//! version(u8 = 2) last_access_ms access_count depth n_locations
//!   per location: id status(u8) kind(u8) storage n_specs
//!     per spec: name uri size
//! ```
//!
//! Version 1 records (written before blocks carried a depth) have no
//! `depth` field and decode with depth 0.
//!
//! Decoding checks every length against the remaining bytes and rejects
//! trailing bytes, unknown tags and versions with [`MetaError::Corrupt`].

use crate::error::{MetaError, Result};
use crate::ledger::{SessionRecord, SessionTarget};
use crate::model::{
    BlockKey, BlockMeta, CacheLocation, LocationId, LocationSpec, LocationStatus, StorageKind,
};

/// The version this build writes.
const VERSION: u8 = 2;
/// The version without `depth`, still decoded (as depth 0).
const VERSION_NO_DEPTH: u8 = 1;

/// Encodes `meta` (without its key) into a fresh buffer.
pub fn encode_block(meta: &BlockMeta) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + meta.locations.len() * 64);
    out.push(VERSION);
    put_var(&mut out, meta.last_access_ms);
    put_var(&mut out, u64::from(meta.access_count));
    put_var(&mut out, u64::from(meta.depth));
    put_var(&mut out, meta.locations.len() as u64);
    for loc in &meta.locations {
        put_var(&mut out, loc.id.0);
        out.push(loc.status.tag());
        out.push(loc.kind.tag());
        put_str(&mut out, &loc.storage);
        put_var(&mut out, loc.specs.len() as u64);
        for spec in &loc.specs {
            put_str(&mut out, &spec.name);
            put_str(&mut out, &spec.uri);
            put_var(&mut out, spec.size);
        }
    }
    out
}

/// Decodes a value written by [`encode_block`] for block `key`.
pub fn decode_block(key: BlockKey, bytes: &[u8]) -> Result<BlockMeta> {
    let mut r = Reader { buf: bytes, key };
    let version = r.byte()?;
    if version != VERSION && version != VERSION_NO_DEPTH {
        return Err(r.corrupt(format!("unknown version {version}")));
    }
    let last_access_ms = r.var()?;
    let access_count = u32::try_from(r.var()?).map_err(|_| r.corrupt("access count"))?;
    let depth = if version == VERSION_NO_DEPTH {
        0
    } else {
        u32::try_from(r.var()?).map_err(|_| r.corrupt("depth"))?
    };
    let n_loc = r.len()?;
    let mut locations = Vec::with_capacity(n_loc);
    for _ in 0..n_loc {
        let id = LocationId(r.var()?);
        let status = LocationStatus::from_tag(r.byte()?).ok_or_else(|| r.corrupt("status"))?;
        let kind = StorageKind::from_tag(r.byte()?).ok_or_else(|| r.corrupt("kind"))?;
        let storage = r.string()?;
        let n_spec = r.len()?;
        let mut specs = Vec::with_capacity(n_spec);
        for _ in 0..n_spec {
            let name = r.string()?;
            let uri = r.string()?;
            let size = r.var()?;
            specs.push(LocationSpec { name, uri, size });
        }
        locations.push(CacheLocation {
            id,
            storage,
            kind,
            status,
            specs,
        });
    }
    if !r.buf.is_empty() {
        return Err(r.corrupt("trailing bytes"));
    }
    Ok(BlockMeta {
        key,
        locations,
        last_access_ms,
        access_count,
        depth,
    })
}

/// The version of session records ([`encode_session`]).
const SESSION_VERSION: u8 = 1;

/// Encodes an open write session for a shared ledger. Layout (varints and
/// strings as above):
///
/// ```text
/// version(u8 = 1) instance group kind(u8) block_bytes n_targets
///   per target: key location
/// ```
pub fn encode_session(s: &SessionRecord) -> Vec<u8> {
    let mut out = Vec::with_capacity(24 + s.instance.len() + s.group.len() + s.targets.len() * 12);
    out.push(SESSION_VERSION);
    put_str(&mut out, &s.instance);
    put_str(&mut out, &s.group);
    out.push(s.kind.tag());
    put_var(&mut out, s.block_bytes);
    put_var(&mut out, s.targets.len() as u64);
    for t in &s.targets {
        put_var(&mut out, t.key.0);
        put_var(&mut out, t.location.0);
    }
    out
}

/// Decodes a value written by [`encode_session`] for session `id` (named
/// in a [`MetaError::Corrupt`] as its key).
pub fn decode_session(id: u64, bytes: &[u8]) -> Result<SessionRecord> {
    let mut r = Reader {
        buf: bytes,
        key: BlockKey(id),
    };
    let version = r.byte()?;
    if version != SESSION_VERSION {
        return Err(r.corrupt(format!("session record: unknown version {version}")));
    }
    let instance = r.string()?;
    let group = r.string()?;
    let tag = r.byte()?;
    let kind = StorageKind::from_tag(tag)
        .ok_or_else(|| r.corrupt(format!("session record: storage kind {tag}")))?;
    let block_bytes = r.var()?;
    let n = r.len()?;
    let mut targets = Vec::with_capacity(n);
    for _ in 0..n {
        targets.push(SessionTarget {
            key: BlockKey(r.var()?),
            location: LocationId(r.var()?),
        });
    }
    if !r.buf.is_empty() {
        return Err(r.corrupt("session record: trailing bytes"));
    }
    Ok(SessionRecord {
        instance,
        group,
        kind,
        block_bytes,
        targets,
    })
}

fn put_var(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_var(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

struct Reader<'a> {
    buf: &'a [u8],
    key: BlockKey,
}

impl Reader<'_> {
    fn corrupt(&self, reason: impl Into<String>) -> MetaError {
        MetaError::Corrupt {
            key: self.key,
            reason: reason.into(),
        }
    }

    fn byte(&mut self) -> Result<u8> {
        let (&b, rest) = self
            .buf
            .split_first()
            .ok_or_else(|| self.corrupt("truncated"))?;
        self.buf = rest;
        Ok(b)
    }

    fn var(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.corrupt("varint too long"))
    }

    /// A count of items, each at least one byte, so it cannot exceed the rest.
    fn len(&mut self) -> Result<usize> {
        let n = self.var()?;
        if n > self.buf.len() as u64 {
            return Err(self.corrupt("length past end"));
        }
        Ok(n as usize)
    }

    fn string(&mut self) -> Result<String> {
        let n = self.len()?;
        let (s, rest) = self.buf.split_at(n);
        self.buf = rest;
        String::from_utf8(s.to_vec()).map_err(|_| self.corrupt("utf-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn meta(n_loc: usize) -> BlockMeta {
        BlockMeta {
            key: BlockKey(7),
            locations: (0..n_loc)
                .map(|i| CacheLocation {
                    id: LocationId(i as u64 * 1_000_003),
                    storage: format!("s{i}"),
                    kind: StorageKind::S3,
                    status: LocationStatus::Serving,
                    specs: vec![LocationSpec {
                        name: "tp0".into(),
                        uri: "s3://b/k".into(),
                        size: 1 << 20,
                    }],
                })
                .collect(),
            last_access_ms: 1_700_000_000_000,
            access_count: 3,
            depth: 17,
        }
    }

    #[test]
    fn round_trip() {
        for n in 0..3 {
            let m = meta(n);
            assert_eq!(decode_block(m.key, &encode_block(&m)).ok(), Some(m));
        }
    }

    /// A version 1 record, laid out by hand as the previous build wrote it
    /// (no depth field), decodes with depth 0.
    #[test]
    fn version_one_decodes_with_depth_zero() {
        let mut v1 = vec![VERSION_NO_DEPTH];
        put_var(&mut v1, 1_700_000_000_000);
        put_var(&mut v1, 3);
        put_var(&mut v1, 1);
        put_var(&mut v1, 42);
        v1.push(LocationStatus::Serving.tag());
        v1.push(StorageKind::S3.tag());
        put_str(&mut v1, "s0");
        put_var(&mut v1, 1);
        put_str(&mut v1, "tp0");
        put_str(&mut v1, "s3://b/k");
        put_var(&mut v1, 1 << 20);
        let m = decode_block(BlockKey(7), &v1).ok();
        assert_eq!(m.as_ref().map(|m| m.depth), Some(0));
        assert_eq!(m.as_ref().map(|m| m.access_count), Some(3));
        assert_eq!(
            m.and_then(|m| m.locations.first().map(|l| l.id)),
            Some(LocationId(42))
        );
    }

    #[test]
    fn session_round_trip() {
        let s = SessionRecord {
            instance: "llama".into(),
            group: "g".into(),
            kind: StorageKind::S3,
            block_bytes: 2 << 20,
            targets: (0..3)
                .map(|i| SessionTarget {
                    key: BlockKey(u64::MAX - i),
                    location: LocationId(i * 7),
                })
                .collect(),
        };
        let enc = encode_session(&s);
        assert_eq!(decode_session(1, &enc).ok(), Some(s));
        assert!(decode_session(1, &enc[..enc.len() - 1]).is_err());
        let mut longer = enc;
        longer.push(0);
        assert!(decode_session(1, &longer).is_err());
    }

    proptest! {
        #[test]
        fn session_garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode_session(1, &bytes);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode_block(BlockKey(1), &bytes);
        }

        #[test]
        fn truncation_is_corrupt(cut in 0usize..40) {
            let enc = encode_block(&meta(1));
            let cut = cut.min(enc.len() - 1);
            prop_assert!(decode_block(BlockKey(1), &enc[..cut]).is_err());
        }
    }
}
