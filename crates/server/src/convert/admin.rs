//! Admin-package messages <-> model: storages, instance groups, accounts.
//!
//! The model's storage kinds are kvtier's backends (kvtier node tiers,
//! shared file pools, S3) plus Tair KVCM's memory stores (`mooncake`,
//! `tair_mem_pool`), which kvtier keeps and lists but has no backend for;
//! the wire knows Tair KVCM's backends. The mapping is lossy in places and
//! written down in docs/server.md ("Admin mapping"). What of a group the
//! model does not hold is kept as the group's `passthrough`, so a group is
//! read back as it was given.

use std::collections::BTreeMap;

use kvtier_meta::proto::admin as pb;
use kvtier_meta::{
    Account, EvictionPolicy, InstanceGroup, MetaError, Role, Storage, StorageHealth, StorageKind,
};

use super::Fail;

/// Scheme of the URIs given to kvtier-node storages declared as `local`.
const LOCAL_SCHEME: &str = "kvtier://local/";

fn file_uri(path: &str) -> String {
    if path.contains("://") {
        path.to_owned()
    } else {
        format!("file://{path}")
    }
}

/// The kind of an `nfs` spec's storage: [`storage_to_wire`] writes the
/// whole URI of an S3 store or a shared directory of block files, and a
/// file pool's bare path (upstream's own NFS storages).
fn nfs_kind(root_path: &str) -> StorageKind {
    if root_path.starts_with("s3://") {
        StorageKind::S3
    } else if root_path.starts_with("file://") {
        StorageKind::FileObjects
    } else {
        StorageKind::FilePool
    }
}

/// The spec of a kind kvtier has no backend for, checked as upstream
/// checks it (`data_storage/storage_config.cc`), as the model keeps it.
fn foreign_spec<T: serde::Serialize>(
    name: &str,
    kind: &str,
    missing: &[&str],
    spec: &T,
) -> Result<serde_json::Value, Fail> {
    if !missing.is_empty() {
        let fields: String = missing.iter().map(|f| format!("{{{f}}}")).collect();
        return Err(Fail::invalid(format!(
            "storage {name:?}: missing or invalid fields: {{{kind}: {fields}}}"
        )));
    }
    serde_json::to_value(spec).map_err(|e| Fail::invalid(format!("storage {name:?}: {e}")))
}

/// The fields of a mooncake spec upstream requires that are empty.
fn mooncake_missing(m: &pb::MooncakeStorageSpec) -> Vec<&'static str> {
    let mut missing = Vec::new();
    for (field, value) in [
        ("local_hostname", &m.local_hostname),
        ("metadata_connstring", &m.metadata_connstring),
        ("protocol", &m.protocol),
        ("master_service_entry", &m.master_service_entry),
    ] {
        if value.is_empty() {
            missing.push(field);
        }
    }
    if m.protocol == "rdma" && m.rdma_device.is_empty() {
        missing.push("rdma_device");
    }
    missing
}

/// A wire storage as a model storage (enabled, healthy). `mooncake` and
/// `tair_mem_pool` are kept with their spec, under a URI that only names
/// them: kvtier has no backend for them, so they never take writes.
pub fn storage_from_wire(c: &pb::StorageConfig) -> Result<Storage, Fail> {
    use pb::storage_config::StorageSpec as S;
    let name = c.global_unique_name.clone();
    let mut spec = None;
    let (kind, uri) = match &c.storage_spec {
        Some(S::Local(_)) => (StorageKind::KvtierNode, format!("{LOCAL_SCHEME}{name}")),
        Some(S::Nfs(n)) => (nfs_kind(&n.root_path), file_uri(&n.root_path)),
        Some(S::Dummy(d)) => (StorageKind::FilePool, file_uri(&d.root_path)),
        Some(S::Threefs(t)) => (
            StorageKind::FilePool,
            file_uri(&format!(
                "{}/{}",
                t.mountpoint.trim_end_matches('/'),
                t.root_dir
            )),
        ),
        Some(S::Vcnsthreefs(t)) => (
            StorageKind::FilePool,
            file_uri(&format!(
                "{}/{}",
                t.mountpoint.trim_end_matches('/'),
                t.root_dir
            )),
        ),
        Some(S::Mooncake(m)) => {
            let missing = mooncake_missing(m);
            spec = Some(foreign_spec(&name, "MooncakeStorageSpec", &missing, m)?);
            (StorageKind::Mooncake, format!("mooncake://{name}"))
        }
        Some(S::TairMemPool(t)) => {
            let missing: &[&str] = if t.domain.is_empty() {
                &["domain"]
            } else {
                &[]
            };
            spec = Some(foreign_spec(&name, "TairMemPoolStorageSpec", missing, t)?);
            (StorageKind::TairMemPool, format!("tair-mem-pool://{name}"))
        }
        None => return Err(Fail::invalid(format!("storage {name:?} has no spec"))),
    };
    Ok(Storage {
        name,
        kind,
        uri,
        enabled: true,
        health: StorageHealth::Healthy,
        spec,
    })
}

/// The wire spec a model storage keeps (inverse of [`foreign_spec`]); the
/// default spec if the record holds none or another shape.
fn kept_spec<T: serde::de::DeserializeOwned + Default>(s: &Storage) -> T {
    s.spec
        .clone()
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default()
}

/// A model storage on the wire: node tiers as `local`, upstream's memory
/// stores with the spec they were given, everything else as `nfs` with the
/// storage URI as its root path.
pub fn storage_to_wire(s: &Storage) -> pb::StorageConfig {
    use pb::storage_config::StorageSpec as S;
    let spec = match s.kind {
        StorageKind::KvtierNode => S::Local(pb::LocalStorageSpec {}),
        StorageKind::FilePool => S::Nfs(pb::NfsStorageSpec {
            root_path: s.uri.strip_prefix("file://").unwrap_or(&s.uri).to_owned(),
            key_count_per_file: 0,
        }),
        // The whole URI: a shared directory of block files reads apart
        // from a file pool's bare path.
        StorageKind::S3 | StorageKind::FileObjects => S::Nfs(pb::NfsStorageSpec {
            root_path: s.uri.clone(),
            key_count_per_file: 0,
        }),
        StorageKind::Mooncake => S::Mooncake(kept_spec(s)),
        StorageKind::TairMemPool => S::TairMemPool(kept_spec(s)),
    };
    pb::StorageConfig {
        global_unique_name: s.name.clone(),
        storage_spec: Some(spec),
        check_storage_available_when_open: false,
    }
}

/// The storage kind a quota entry of `storage_type` limits.
fn quota_kind(t: i32) -> Option<StorageKind> {
    match pb::StorageType::try_from(t).ok()? {
        pb::StorageType::StNfs
        | pb::StorageType::St3fs
        | pb::StorageType::StVcns3fs
        | pb::StorageType::StDummy => Some(StorageKind::FilePool),
        pb::StorageType::StTairmempool | pb::StorageType::StMooncake => {
            Some(StorageKind::KvtierNode)
        }
        pb::StorageType::StUnspecified => None,
    }
}

fn quota_type(k: StorageKind) -> pb::StorageType {
    match k {
        StorageKind::FilePool | StorageKind::S3 | StorageKind::FileObjects => {
            pb::StorageType::StNfs
        }
        StorageKind::KvtierNode | StorageKind::TairMemPool => pb::StorageType::StTairmempool,
        StorageKind::Mooncake => pb::StorageType::StMooncake,
    }
}

/// `names` without repeats, first occurrences in order.
fn dedup_keep_order(names: &[String]) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    names
        .iter()
        .filter(|n| seen.insert(n.as_str()))
        .cloned()
        .collect()
}

/// A wire group as a model group. Absent or zero capacity means unlimited,
/// a negative one refuses every write (as upstream: `capacity < 0` takes
/// nothing); the watermark is `trigger_strategy.used_percentage` (0.9 when
/// unset).
pub fn group_from_wire(g: &pb::InstanceGroup) -> Result<InstanceGroup, Fail> {
    let quota = g.quota.clone().unwrap_or_default();
    let quota_bytes = match quota.capacity {
        0 => u64::MAX,
        n => u64::try_from(n).unwrap_or(0),
    };
    let mut kind_quota_bytes = BTreeMap::new();
    for q in &quota.quota_config {
        // As upstream: an entry of an unspecified or unknown storage type
        // limits nothing, and neither does a negative capacity (upstream
        // compares it as unsigned on writes).
        let Some(kind) = quota_kind(q.storage_type) else {
            continue;
        };
        let Ok(capacity) = u64::try_from(q.capacity) else {
            continue;
        };
        kind_quota_bytes.insert(kind, capacity);
    }
    let reclaim = g
        .cache_config
        .as_ref()
        .and_then(|c| c.reclaim_strategy.clone())
        .unwrap_or_default();
    let pct = reclaim
        .trigger_strategy
        .as_ref()
        .map_or(0.0, |t| t.used_percentage);
    let watermark = if pct > 0.0 { pct } else { 0.9 };
    let eviction = match pb::ReclaimPolicy::try_from(reclaim.reclaim_policy) {
        Ok(pb::ReclaimPolicy::PolicyLfu) => EvictionPolicy::Lfu,
        // The wire has no TTL field: the trigger period doubles as the TTL.
        // Without a positive one, LRU (upstream reclaims TTL groups by LRU).
        Ok(pb::ReclaimPolicy::PolicyTtl) if reclaim.trigger_period_seconds > 0 => {
            EvictionPolicy::Ttl {
                ttl_secs: u64::from(reclaim.trigger_period_seconds.unsigned_abs()),
            }
        }
        _ => EvictionPolicy::Lru,
    };
    let max_instances = match g.max_instance_count {
        n if n <= 0 => u32::MAX,
        n => u32::try_from(n).unwrap_or(u32::MAX),
    };
    // Unset, 0 or negative: no limit (upstream's default is the largest
    // size_t, and a negative int64 becomes one).
    let max_key_count = g
        .cache_config
        .as_ref()
        .and_then(|c| c.meta_indexer_config.as_ref())
        .map_or(0, |m| u64::try_from(m.max_key_count).unwrap_or(0));
    Ok(InstanceGroup {
        name: g.name.clone(),
        quota_bytes,
        kind_quota_bytes,
        watermark,
        eviction,
        // Upstream keeps a candidate listed twice; once is the same choice.
        storages: dedup_keep_order(&g.storage_candidates),
        max_instances,
        max_key_count,
        version: g.version,
        user_data: g.user_data.clone(),
        passthrough: passthrough(g),
    })
}

/// What of a wire group the model does not hold, as JSON: the group with
/// the fields [`group_from_wire`] reads blanked, so nothing is kept twice.
/// `None` if it cannot be written as JSON (then only the model's fields
/// are given back).
fn passthrough(g: &pb::InstanceGroup) -> Option<serde_json::Value> {
    let mut rest = pb::InstanceGroup {
        name: String::new(),
        storage_candidates: Vec::new(),
        max_instance_count: 0,
        quota: None,
        user_data: String::new(),
        version: 0,
        ..g.clone()
    };
    if let Some(c) = rest.cache_config.as_mut() {
        if let Some(r) = c.reclaim_strategy.as_mut() {
            r.reclaim_policy = 0;
            if let Some(t) = r.trigger_strategy.as_mut() {
                t.used_percentage = 0.0;
            }
        }
        if let Some(m) = c.meta_indexer_config.as_mut() {
            m.max_key_count = 0;
        }
    }
    serde_json::to_value(&rest).ok()
}

/// A group quota on the wire: unlimited is 0, "no writes" is -1 (inverse
/// of [`group_from_wire`]'s reading).
fn wire_bytes(v: u64) -> i64 {
    match v {
        u64::MAX => 0,
        0 => -1,
        v => i64::try_from(v).unwrap_or(i64::MAX),
    }
}

/// A model group on the wire (inverse of [`group_from_wire`]): its
/// `passthrough` with the model's settings written over it.
pub fn group_to_wire(g: &InstanceGroup) -> pb::InstanceGroup {
    let mut w: pb::InstanceGroup = g
        .passthrough
        .clone()
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default();
    w.name = g.name.clone();
    w.storage_candidates = g.storages.clone();
    if w.global_quota_group_name.is_empty() {
        w.global_quota_group_name = g.name.clone();
    }
    w.max_instance_count = if g.max_instances == u32::MAX {
        0
    } else {
        i64::from(g.max_instances)
    };
    w.quota = Some(quota_to_wire(g));
    let cache = w.cache_config.get_or_insert_with(Default::default);
    reclaim_to_wire(
        g,
        cache.reclaim_strategy.get_or_insert_with(Default::default),
    );
    if g.max_key_count > 0 || cache.meta_indexer_config.is_some() {
        let m = cache
            .meta_indexer_config
            .get_or_insert_with(Default::default);
        m.max_key_count = i64::try_from(g.max_key_count).unwrap_or(i64::MAX);
    }
    w.user_data = g.user_data.clone();
    w.version = g.version;
    w
}

fn quota_to_wire(g: &InstanceGroup) -> pb::InstanceGroupQuota {
    pb::InstanceGroupQuota {
        capacity: wire_bytes(g.quota_bytes),
        quota_config: g
            .kind_quota_bytes
            .iter()
            .map(|(k, v)| pb::QuotaConfig {
                storage_type: quota_type(*k) as i32,
                capacity: i64::try_from(*v).unwrap_or(i64::MAX),
            })
            .collect(),
    }
}

/// Writes the model's policy and watermark over `r`. A TTL is the trigger
/// period ([`group_from_wire`]); other policies keep the period given.
fn reclaim_to_wire(g: &InstanceGroup, r: &mut pb::CacheReclaimStrategy) {
    let policy = match g.eviction {
        EvictionPolicy::Lru => pb::ReclaimPolicy::PolicyLru,
        EvictionPolicy::Lfu => pb::ReclaimPolicy::PolicyLfu,
        EvictionPolicy::Ttl { ttl_secs } => {
            r.trigger_period_seconds = i32::try_from(ttl_secs).unwrap_or(i32::MAX);
            pb::ReclaimPolicy::PolicyTtl
        }
    };
    r.reclaim_policy = policy as i32;
    r.trigger_strategy
        .get_or_insert_with(Default::default)
        .used_percentage = g.watermark;
}

/// The model role of a wire role.
pub fn role_from_wire(r: i32) -> Role {
    match pb::AccountRole::try_from(r) {
        Ok(pb::AccountRole::RoleAdmin) => Role::Admin,
        // As upstream: any other value is an ordinary user, the least
        // privilege.
        Ok(pb::AccountRole::RoleUser) | Err(_) => Role::User,
    }
}

/// A model account on the wire (name and role; never key material).
pub fn account_to_wire(a: &Account) -> pb::Account {
    pb::Account {
        user_name: a.name.clone(),
        role: match a.role {
            Role::Admin => pb::AccountRole::RoleAdmin,
            Role::User => pb::AccountRole::RoleUser,
        } as i32,
        allowed_groups: a.allowed_groups.clone(),
    }
}

/// A service error for a missing name.
pub fn require_name(name: &str, what: &str) -> Result<(), Fail> {
    if name.is_empty() {
        return Err(MetaError::InvalidArgument(format!("empty {what}")).into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `g` read back from the wire is `g` plus what the wire adds (its
    /// passthrough), and reading that back changes nothing more.
    fn assert_round_trip(g: &InstanceGroup) {
        let back = group_from_wire(&group_to_wire(g)).unwrap();
        let without = InstanceGroup {
            passthrough: None,
            ..back.clone()
        };
        assert_eq!(&without, g);
        assert_eq!(group_from_wire(&group_to_wire(&back)).unwrap(), back);
    }

    #[test]
    fn groups_round_trip() {
        let g = InstanceGroup {
            name: "g".into(),
            quota_bytes: 1 << 30,
            kind_quota_bytes: [(StorageKind::FilePool, 1 << 20)].into_iter().collect(),
            watermark: 0.75,
            eviction: EvictionPolicy::Lfu,
            storages: vec!["s".into()],
            max_instances: 4,
            max_key_count: 16,
            version: 3,
            user_data: "u".into(),
            passthrough: None,
        };
        assert_round_trip(&g);
        let unlimited = InstanceGroup {
            quota_bytes: u64::MAX,
            max_instances: u32::MAX,
            kind_quota_bytes: BTreeMap::new(),
            eviction: EvictionPolicy::Ttl { ttl_secs: 60 },
            ..g
        };
        assert_round_trip(&unlimited);
    }

    #[test]
    fn storages_round_trip() {
        for s in [
            Storage {
                name: "nfs".into(),
                kind: StorageKind::FilePool,
                uri: "file:///mnt/kv".into(),
                enabled: true,
                health: StorageHealth::Healthy,
                spec: None,
            },
            Storage {
                name: "shared".into(),
                kind: StorageKind::FileObjects,
                uri: "file:///mnt/shared".into(),
                enabled: true,
                health: StorageHealth::Healthy,
                spec: None,
            },
            Storage {
                name: "bucket".into(),
                kind: StorageKind::S3,
                uri: "s3://b/p".into(),
                enabled: true,
                health: StorageHealth::Healthy,
                spec: None,
            },
            Storage {
                name: "node".into(),
                kind: StorageKind::KvtierNode,
                uri: "kvtier://local/node".into(),
                enabled: true,
                health: StorageHealth::Healthy,
                spec: None,
            },
        ] {
            assert_eq!(storage_from_wire(&storage_to_wire(&s)).unwrap(), s);
        }
        let none = pb::StorageConfig {
            global_unique_name: "x".into(),
            ..Default::default()
        };
        assert!(storage_from_wire(&none).is_err());
    }
}
