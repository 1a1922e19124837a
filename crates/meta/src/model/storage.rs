//! Storages: the backends that hold block bytes. The metadata service never
//! touches the bytes; it only hands out URIs under a storage's base URI.

use serde::{Deserialize, Serialize};

/// What kind of backend a [`Storage`] is. Quotas can be set per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StorageKind {
    /// A kvtier node's block store (G2/G3 of a peer), `kvtier://node/...`.
    KvtierNode,
    /// A shared file pool (NFS, 3FS), `file://...`.
    FilePool,
    /// An S3-compatible object store, `s3://bucket/prefix`.
    S3,
}

impl StorageKind {
    /// Stable one-byte tag used by the block record encoding.
    pub fn tag(self) -> u8 {
        match self {
            StorageKind::KvtierNode => 0,
            StorageKind::FilePool => 1,
            StorageKind::S3 => 2,
        }
    }

    /// Inverse of [`StorageKind::tag`].
    pub fn from_tag(tag: u8) -> Option<Self> {
        match tag {
            0 => Some(StorageKind::KvtierNode),
            1 => Some(StorageKind::FilePool),
            2 => Some(StorageKind::S3),
            _ => None,
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
}

impl Storage {
    /// Whether new writes may be placed on this storage.
    pub fn writable(&self) -> bool {
        write_refusal(self.enabled, self.health).is_none()
    }
}
