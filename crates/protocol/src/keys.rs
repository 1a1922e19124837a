//! Stored keys: how a daemon turns a client's block key into the key it
//! holds the block under, so that no client can name a block outside its
//! own namespace (docs/block-identity.md, "Stored keys";
//! docs/node-protocol.md §11.1).
//!
//! The daemon keeps a secret ([`NodeSecret`]) that no client sees. At
//! `Hello` it derives the session namespace's key from it
//! ([`NamespaceKey::derive`]) and hands that key to the client in
//! `HelloOk`: a client needs its stored keys to seed the checksums of the
//! slots it fills and reads. A stored key is a keyed BLAKE3 hash of the
//! client key under the namespace key ([`KeyMap::stored`]), so a client
//! that knows its own namespace key and sees any number of stored keys of
//! other namespaces (every client maps the arena, whose slot table shows
//! them) still cannot produce a key that maps onto one of them.

use std::fmt;

use kvtier_core::BlockHash;

use crate::message::Namespace;
use crate::wire::Wire;

/// Bytes of a [`NodeSecret`] and of a [`NamespaceKey`].
pub const KEY_BYTES: usize = 32;

/// Domain tag of [`NamespaceKey::derive`]: frozen (a change orphans every
/// stored block; a new derivation takes a new tag).
const NAMESPACE_TAG: &[u8] = b"kvtier-namespace-key-v1\0";

/// Domain tag of [`NodeSecret::table_key`]: frozen like [`NAMESPACE_TAG`].
const TABLE_TAG: &[u8] = b"kvtier-arena-table-key-v1\0";

/// The daemon's secret: 32 random bytes made at first start and kept in
/// the data directory (mode 0600). Every namespace key is derived from it;
/// nodes that must reach each other's blocks (a shared G4) share it.
#[derive(Clone, PartialEq, Eq)]
pub struct NodeSecret([u8; KEY_BYTES]);

impl NodeSecret {
    /// The secret with these bytes.
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> Self {
        Self(bytes)
    }

    /// The secret's bytes (to persist them).
    pub fn as_bytes(&self) -> &[u8; KEY_BYTES] {
        &self.0
    }

    /// The key that authenticates the daemon's own entries in the arena's
    /// slot table (docs/memory-arena.md): derived from the secret under its
    /// own domain tag, so it is never a namespace key.
    pub fn table_key(&self) -> [u8; KEY_BYTES] {
        blake3::keyed_hash(&self.0, TABLE_TAG).into()
    }
}

impl fmt::Debug for NodeSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the secret.
        f.write_str("NodeSecret(..)")
    }
}

/// One namespace's key: what maps its client keys to stored keys. The
/// daemon derives it from its secret; the client receives it in `HelloOk`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NamespaceKey([u8; KEY_BYTES]);

impl NamespaceKey {
    /// `BLAKE3-keyed(secret, "kvtier-namespace-key-v1\0" || the namespace's
    /// wire encoding)` (docs/node-protocol.md §4.1, fields `model` ..
    /// `tenant_salt`). The encoding is length-prefixed, so two namespaces
    /// never encode alike.
    pub fn derive(secret: &NodeSecret, namespace: &Namespace) -> Self {
        let mut input = NAMESPACE_TAG.to_vec();
        namespace.put(&mut input);
        Self(blake3::keyed_hash(&secret.0, &input).into())
    }

    /// The key with these bytes (as `HelloOk` carries them).
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> Self {
        Self(bytes)
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8; KEY_BYTES] {
        &self.0
    }
}

impl fmt::Debug for NamespaceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("NamespaceKey(..)")
    }
}

/// Maps one namespace's client keys to stored keys. The daemon builds it
/// from the key it derives at `Hello`, the client from the key `HelloOk`
/// carries; both get the same stored keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyMap {
    key: NamespaceKey,
}

impl KeyMap {
    /// The map of the namespace whose key is `key`.
    pub fn new(key: NamespaceKey) -> Self {
        Self { key }
    }

    /// The namespace key.
    pub fn key(&self) -> NamespaceKey {
        self.key
    }

    /// The stored key of client key `key`: the first 16 bytes of
    /// `BLAKE3-keyed(namespace key, le128(key))`, read little-endian.
    pub fn stored(&self, key: BlockHash) -> BlockHash {
        let out = blake3::keyed_hash(&self.key.0, &key.to_le_bytes());
        let mut low = [0u8; 16];
        low.copy_from_slice(&out.as_bytes()[..16]);
        BlockHash::from_le_bytes(low)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(salt: Option<&[u8]>) -> Namespace {
        Namespace {
            model: "m".into(),
            dtype: "bf16".into(),
            layout_version: 1,
            block_size_tokens: 16,
            tp_rank: 0,
            tp_size: 1,
            tenant_salt: salt.map(<[u8]>::to_vec),
        }
    }

    #[test]
    fn the_stored_key_depends_on_the_secret_the_namespace_and_the_key() {
        let a = NodeSecret::from_bytes([1; KEY_BYTES]);
        let b = NodeSecret::from_bytes([2; KEY_BYTES]);
        let k = BlockHash(42);
        let map =
            |s: &NodeSecret, salt: Option<&[u8]>| KeyMap::new(NamespaceKey::derive(s, &ns(salt)));
        let base = map(&a, Some(b"t1")).stored(k);
        assert_eq!(base, map(&a, Some(b"t1")).stored(k), "deterministic");
        assert_ne!(base, map(&b, Some(b"t1")).stored(k), "another secret");
        assert_ne!(base, map(&a, Some(b"t2")).stored(k), "another tenant");
        assert_ne!(base, map(&a, None).stored(k), "no tenant");
        assert_ne!(
            base,
            map(&a, Some(b"t1")).stored(BlockHash(43)),
            "another key"
        );
    }

    #[test]
    fn the_table_key_is_no_namespace_key() {
        let s = NodeSecret::from_bytes([7; KEY_BYTES]);
        assert_ne!(
            &s.table_key(),
            NamespaceKey::derive(&s, &ns(None)).as_bytes()
        );
        assert_ne!(&s.table_key(), s.as_bytes());
    }

    #[test]
    fn debug_never_shows_key_bytes() {
        let s = NodeSecret::from_bytes([0xab; KEY_BYTES]);
        assert!(!format!("{s:?}").contains("171"));
        let k = NamespaceKey::from_bytes([0xab; KEY_BYTES]);
        assert!(!format!("{k:?}").contains("171"));
    }
}
