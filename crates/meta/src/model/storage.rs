//! Storages: the backends that hold block bytes. The metadata service never
//! touches the bytes; it only hands out URIs under a storage's base URI.

use serde::{Deserialize, Serialize};

/// What kind of backend a [`Storage`] is. Quotas can be set per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StorageKind {
    /// A kvtier node's block store (G2/G3 of a peer), `kvtier://node/...`.
    KvtierNode,
    /// A shared file pool (NFS, 3FS), `file://...`: blocks are extents
    /// of the pool's files.
    FilePool,
    /// An S3-compatible object store, `s3://bucket/prefix`.
    S3,
    /// A Mooncake store (Tair KVCM's `mooncake` spec). kvtier has no
    /// backend for it: the storage is kept and listed, never written.
    Mooncake,
    /// A Tair memory pool (Tair KVCM's `tair_mem_pool` spec). kvtier has no
    /// backend for it: the storage is kept and listed, never written.
    TairMemPool,
    /// A shared directory (NFS, 3FS mounted at one path on every node),
    /// `file:///dir`, holding one file per block part at the path the
    /// write session names, as [`StorageKind::S3`] holds one object: the
    /// cluster's shared G4 on a file system.
    FileObjects,
}

impl StorageKind {
    /// Stable one-byte tag used by the block record encoding.
    pub fn tag(self) -> u8 {
        match self {
            StorageKind::KvtierNode => 0,
            StorageKind::FilePool => 1,
            StorageKind::S3 => 2,
            StorageKind::Mooncake => 3,
            StorageKind::TairMemPool => 4,
            StorageKind::FileObjects => 5,
        }
    }

    /// Inverse of [`StorageKind::tag`].
    pub fn from_tag(tag: u8) -> Option<Self> {
        match tag {
            0 => Some(StorageKind::KvtierNode),
            1 => Some(StorageKind::FilePool),
            2 => Some(StorageKind::S3),
            3 => Some(StorageKind::Mooncake),
            4 => Some(StorageKind::TairMemPool),
            5 => Some(StorageKind::FileObjects),
            _ => None,
        }
    }

    /// Whether kvtier can open a backend of this kind: storages of the
    /// other kinds are accepted as Tair KVCM accepts them, but never take
    /// writes.
    pub fn has_backend(self) -> bool {
        !matches!(self, StorageKind::Mooncake | StorageKind::TairMemPool)
    }

    /// The kind's name, as configurations and messages spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            StorageKind::KvtierNode => "kvtier_node",
            StorageKind::FilePool => "file_pool",
            StorageKind::S3 => "s3",
            StorageKind::Mooncake => "mooncake",
            StorageKind::TairMemPool => "tair_mem_pool",
            StorageKind::FileObjects => "file_objects",
        }
    }
}

/// Last known health of a storage, set by probes or admins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum StorageHealth {
    /// Probes succeed; writes may be placed here.
    #[default]
    Healthy,
    /// Probes fail; no new writes are placed here, and its locations are
    /// not handed out (each is a miss).
    Unhealthy,
    /// Its file system has no room for new data (the probe could not write
    /// for lack of space) but what it holds is intact: no new writes are
    /// placed here, and its locations are still served. A capacity state,
    /// not a failure.
    Full,
}

impl StorageHealth {
    /// The state's name, as the HTTP health report and logs spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            StorageHealth::Healthy => "healthy",
            StorageHealth::Unhealthy => "unhealthy",
            StorageHealth::Full => "full",
        }
    }

    /// Whether locations on a storage in this state are handed out to
    /// readers: all but an unhealthy one's.
    pub fn serves_reads(self) -> bool {
        self != StorageHealth::Unhealthy
    }
}

/// Why a storage that is `enabled` (or not) and in `health` takes no new
/// writes, in one word (`disabled`, `unhealthy`, `full`); `None` when it
/// takes them. The one rule behind [`Storage::writable`], refusals and
/// health reports.
pub fn write_refusal(enabled: bool, health: StorageHealth) -> Option<&'static str> {
    if !enabled {
        Some("disabled")
    } else if health != StorageHealth::Healthy {
        Some(health.as_str())
    } else {
        None
    }
}

/// One storage backend, shareable by many groups and instances.
///
/// Records written before `spec` existed decode with `spec: None`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Storage {
    /// Unique name; locations refer to their storage by this name.
    pub name: String,
    /// Backend kind.
    pub kind: StorageKind,
    /// Base URI; location URIs are built under it
    /// (`kvtier://node-1/pool`, `file:///mnt/kv`, `s3://bucket/prefix`).
    pub uri: String,
    /// Disabled storages receive no new writes; existing locations still serve.
    pub enabled: bool,
    /// Probe result.
    pub health: StorageHealth,
    /// The backend's settings as the admin API gave them (Tair KVCM's spec
    /// object, in its JSON form), kept only to be listed back, for the
    /// kinds kvtier has no backend for; for a `kvtier_node` storage, the
    /// node's peer address (`{"peer": "10.0.0.5:7470"}`, written by the
    /// node itself); `None` for kvtier's other kinds, whose `uri` says
    /// everything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<serde_json::Value>,
}

impl Storage {
    /// Whether new writes may be placed on this storage.
    pub fn writable(&self) -> bool {
        self.kind.has_backend() && write_refusal(self.enabled, self.health).is_none()
    }

    /// Why no new writes are placed on this storage, as a clause that names
    /// it (for [`crate::MetaError::NoAvailableStorage`]); `None` when it
    /// takes them. A kind without a backend comes first: enabling it or a
    /// passing probe changes nothing.
    pub fn refusal_clause(&self) -> Option<String> {
        if !self.kind.has_backend() {
            return Some(format!(
                "storage {:?} has no backend in kvtier ({})",
                self.name,
                self.kind.as_str()
            ));
        }
        let refusal = write_refusal(self.enabled, self.health)?;
        Some(if self.enabled {
            format!(
                "storage {:?} is {refusal} (see its health probe)",
                self.name
            )
        } else {
            format!("storage {:?} is {refusal}", self.name)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [StorageKind; 6] = [
        StorageKind::KvtierNode,
        StorageKind::FilePool,
        StorageKind::S3,
        StorageKind::Mooncake,
        StorageKind::TairMemPool,
        StorageKind::FileObjects,
    ];

    /// Tags and names are stable, distinct, and read back; the names are
    /// the serialized ones.
    #[test]
    fn kinds_round_trip_through_tags_and_names() {
        for (i, k) in ALL.iter().enumerate() {
            assert_eq!(StorageKind::from_tag(k.tag()), Some(*k));
            assert_eq!(usize::from(k.tag()), i, "{k:?} keeps its tag");
            let json = serde_json::to_string(k).unwrap();
            assert_eq!(json, format!("\"{}\"", k.as_str()));
        }
        assert_eq!(StorageKind::from_tag(ALL.len() as u8), None);
        assert!(StorageKind::FileObjects.has_backend());
    }
}
