//! The key layout in one place (see the module doc of [`super`]).
//!
//! The prefix holds no `:`, so the first `:` ends the namespace and two
//! namespaces never share a key. Block keys are 8 bytes big-endian: byte
//! order is numeric order, so the lexicographic sorted set scans ascending.

use crate::index::RecordKind;
use crate::model::BlockKey;

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

    /// Hash of control-plane records of one kind: `<p>:c:<kind>`, field the
    /// record name.
    pub(super) fn records(&self, kind: RecordKind) -> Vec<u8> {
        self.join("c", kind.prefix().trim_end_matches('/').as_bytes())
    }
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
    }
}
