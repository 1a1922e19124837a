//! Instance groups: the unit of quota, watermark and eviction policy.
//! Instances own no quota; they draw on their group's (Tair KVCM).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::StorageKind;

/// How the reclaimer picks victims once a group is above its watermark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvictionPolicy {
    /// Least recently used first.
    Lru,
    /// Least frequently used first.
    Lfu,
    /// Anything idle for longer than `ttl_secs`.
    Ttl {
        /// Idle time after which a block may be dropped.
        ttl_secs: u64,
    },
}

/// A set of instances sharing quotas and storages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceGroup {
    /// Unique name.
    pub name: String,
    /// Hard limit on the bytes of all locations (writing and serving) of the
    /// group's instances. `u64::MAX` means unlimited.
    pub quota_bytes: u64,
    /// Hard limit per storage kind; a kind not listed is limited only by
    /// `quota_bytes`. Past it, writes go to another candidate storage.
    pub kind_quota_bytes: BTreeMap<StorageKind, u64>,
    /// Soft limit as a fraction of the quota (>= 0): above it the
    /// reclaimer evicts. Not enforced on writes; above 1 it is never
    /// reached (the quota refuses writes first).
    pub watermark: f64,
    /// Victim choice above the watermark.
    pub eviction: EvictionPolicy,
    /// Storage names writes may go to, in order of preference.
    pub storages: Vec<String>,
    /// Most instances the group accepts.
    pub max_instances: u32,
}
