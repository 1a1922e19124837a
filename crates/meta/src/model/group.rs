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
///
/// Fields added after the first release carry `#[serde(default)]`, so
/// records and snapshots written before them still decode.
/// [`InstanceGroup::default`] is a group with no limits and no storages.
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
    /// Most block records one instance of the group may hold, writing and
    /// serving (Tair KVCM's `meta_indexer_config.max_key_count`); a write
    /// that would go past it is refused. 0 means unlimited.
    #[serde(default)]
    pub max_key_count: u64,
    /// Version of these settings, set by the caller: an update names the
    /// stored version and brings a higher one (Tair KVCM's compare-and-set,
    /// [`crate::MetaService::update_group_versioned`]). 0 for groups stored
    /// before kvtier kept it.
    #[serde(default)]
    pub version: i64,
    /// Text the caller stores with the group; kvtier only gives it back.
    #[serde(default)]
    pub user_data: String,
    /// The rest of the group as the admin API gave it (Tair KVCM's
    /// `InstanceGroup` in its JSON form: `data_storage_strategy`,
    /// `meta_indexer_config`, ...), kept only to be given back. The
    /// settings the fields above model are always read from them, never
    /// from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passthrough: Option<serde_json::Value>,
}

impl Default for InstanceGroup {
    fn default() -> Self {
        InstanceGroup {
            name: String::new(),
            quota_bytes: u64::MAX,
            kind_quota_bytes: BTreeMap::new(),
            watermark: 0.9,
            eviction: EvictionPolicy::Lru,
            storages: Vec::new(),
            max_instances: u32::MAX,
            max_key_count: 0,
            version: 0,
            user_data: String::new(),
            passthrough: None,
        }
    }
}
