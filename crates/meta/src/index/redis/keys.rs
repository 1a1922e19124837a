//! The key layout in one place (see the module doc of [`super`]).
//!
//! The prefix holds no `:`, so the first `:` ends the namespace and two
//! namespaces never share a key. Block keys are 8 bytes big-endian: byte
//! order is numeric order, so the lexicographic sorted set scans ascending.

use crate::index::RecordKind;
use crate::ledger::SessionId;
use crate::model::{BlockKey, StorageKind};

/// Builds the keys of one namespace.
#[derive(Debug, Clone)]
pub(super) struct Keys {
    prefix: String,
}

impl Keys {
    pub(super) fn new(prefix: &str) -> Self {
        Keys {
            prefix: prefix.to_owned(),
        }
    }

    fn join(&self, kind: &str, rest: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.prefix.len() + kind.len() + rest.len() + 2);
        k.extend_from_slice(self.prefix.as_bytes());
        k.push(b':');
        k.extend_from_slice(kind.as_bytes());
        k.push(b':');
        k.extend_from_slice(rest);
        k
    }

    /// String key holding the encoded record of (instance, key):
    /// `<p>:r:<instance>:<8-byte key>`. The key part has a fixed length, so
    /// distinct (instance, key) pairs never collide.
    pub(super) fn record(&self, instance: &str, key: BlockKey) -> Vec<u8> {
        let mut rest = Vec::with_capacity(instance.len() + 9);
        rest.extend_from_slice(instance.as_bytes());
        rest.push(b':');
        rest.extend_from_slice(&member(key));
        self.join("r", &rest)
    }

    /// Sorted set (all scores 0, ordered by member bytes) of the instance's
    /// block keys: `<p>:z:<instance>`.
    pub(super) fn order(&self, instance: &str) -> Vec<u8> {
        self.join("z", instance.as_bytes())
    }

    /// Hash of access statistics not yet folded into records:
    /// `<p>:a:<instance>`, field the 8-byte key.
    pub(super) fn stats(&self, instance: &str) -> Vec<u8> {
        self.join("a", instance.as_bytes())
    }

    /// Server-side lock of one shard: `<p>:lock:<shard>`.
    pub(super) fn lock(&self, shard: usize) -> Vec<u8> {
        self.join("lock", shard.to_string().as_bytes())
    }

    /// Hash of one open write session: `<p>:s:<id, 16 hex digits>`, fields
    /// `r` (the record), `d` (its deadline, ms) and `c` (until when a
    /// caller claims it, ms; absent when unclaimed).
    pub(super) fn session(&self, id: SessionId) -> Vec<u8> {
        self.join("s", id.to_string().as_bytes())
    }

    /// What [`Keys::session`] puts before the id, for scripts that build
    /// session keys from the ids they read.
    pub(super) fn session_prefix(&self) -> Vec<u8> {
        self.join("s", b"")
    }

    /// Sorted set of open sessions (members their 16-hex-digit ids) by
    /// when the reaper may take them (ms): the deadline, or the end of the
    /// claim while claimed. `<p>:sessions:due`.
    pub(super) fn sessions_due(&self) -> Vec<u8> {
        self.join("sessions", b"due")
    }

    /// Set of the open sessions that hold targets: `<p>:sessions:held`.
    pub(super) fn sessions_held(&self) -> Vec<u8> {
        self.join("sessions", b"held")
    }

    /// Hash of one group's usage: `<p>:q:<group>`, fields `total` and
    /// `k<tag>` per storage kind (see [`kind_field`]), bytes.
    pub(super) fn usage(&self, group: &str) -> Vec<u8> {
        self.join("q", group.as_bytes())
    }

    /// Set once the charges of stored blocks are in the usage hashes:
    /// `<p>:ledger:built`.
    pub(super) fn ledger_built(&self) -> Vec<u8> {
        self.join("ledger", b"built")
    }

    /// Hash of control-plane records of one kind: `<p>:c:<kind>`, field the
    /// record name.
    pub(super) fn records(&self, kind: RecordKind) -> Vec<u8> {
        self.join("c", kind.prefix().trim_end_matches('/').as_bytes())
    }
}

/// The field of a usage hash counting `kind`'s bytes: `k<tag>`.
pub(super) fn kind_field(kind: StorageKind) -> String {
    format!("k{}", kind.tag())
}

/// The sorted-set member (and stats field) of a block key.
pub(super) fn member(key: BlockKey) -> [u8; 8] {
    key.0.to_be_bytes()
}

/// The block key of a sorted-set member, if it has the right length.
pub(super) fn key_of_member(bytes: &[u8]) -> Option<BlockKey> {
    let arr: [u8; 8] = bytes.try_into().ok()?;
    Some(BlockKey(u64::from_be_bytes(arr)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_order_is_numeric_order() {
        let mut keys = [0u64, 1, 255, 256, u64::MAX, 1 << 63, 42];
        let mut members: Vec<[u8; 8]> = keys.iter().map(|&k| member(BlockKey(k))).collect();
        keys.sort_unstable();
        members.sort_unstable();
        let back: Vec<u64> = members
            .iter()
            .filter_map(|m| key_of_member(m))
            .map(|k| k.0)
            .collect();
        assert_eq!(back, keys);
    }

    #[test]
    fn namespaces_and_instances_do_not_collide() {
        let a = Keys::new("a");
        let b = Keys::new("b");
        assert_ne!(a.order("x"), b.order("x"));
        assert_ne!(a.record("x", BlockKey(1)), a.record("x:", BlockKey(1)));
        assert_ne!(a.order("x"), a.stats("x"));
        assert_ne!(a.records(RecordKind::Group), a.records(RecordKind::Storage));
        assert_ne!(a.usage("x"), a.stats("x"));
        let mut built = a.session_prefix();
        built.extend_from_slice(SessionId(7).to_string().as_bytes());
        assert_eq!(built, a.session(SessionId(7)));
    }
}
