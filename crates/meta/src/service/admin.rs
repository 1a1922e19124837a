//! Administration: storages, instance groups and instances (create, update,
//! remove, list), health, the default bootstrap and statistics.
//!
//! Every mutation validates first and changes nothing when refused. Group
//! settings (quotas, watermark, policy, storages) are read from the catalog
//! by each write request, so an update applies to the next request.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};

use super::catalog::{Change, Maps};
use super::storage_admin::Opened;
use super::{GroupUsage, MetaService};
use crate::error::{MetaError, Result};
use crate::index::{Modify, RecordKind};
use crate::model::{
    ALL_GROUPS, BlockKey, CacheLocation, EvictionPolicy, Instance, InstanceGroup, LocationId,
    LocationStatus, Storage, StorageHealth, StorageKind, write_refusal,
};
use crate::path_safe;

/// Name of the group [`MetaService::ensure_default_group`] creates.
pub const DEFAULT_GROUP: &str = "default";

/// Watermark of the default group: the reclaimer starts at 90 % of quota.
const DEFAULT_WATERMARK: f64 = 0.9;

/// Keys per index batch when dropping an instance's blocks.
const SWEEP_BATCH: usize = 4096;

/// Result of [`MetaService::check_health`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthReport {
    /// The index answered and takes writes, and at least one storage
    /// takes writes (or none is configured yet, as on a fresh server).
    pub healthy: bool,
    /// Why the index is unreachable; `None` when it answered.
    pub index_error: Option<String>,
    /// Why the index refuses writes (e.g. its disk is full) while it still
    /// serves reads; `None` when it takes writes.
    pub index_read_only: Option<String>,
    /// What is wrong, in words, when not healthy; `None` when healthy.
    pub reason: Option<String>,
    /// Every storage, by name.
    pub storages: Vec<StorageStatus>,
}

/// One storage in a [`HealthReport`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageStatus {
    /// Storage name.
    pub name: String,
    /// Its kind: one kvtier has no backend for never takes writes.
    pub kind: StorageKind,
    /// Whether it takes new writes (admin switch).
    pub enabled: bool,
    /// Last probe result.
    pub health: StorageHealth,
}

/// Usage and limits of one group, in [`MetaStats`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupStats {
    /// Bytes in use (writing + serving).
    pub usage: GroupUsage,
    /// Hard limit, all kinds together.
    pub quota_bytes: u64,
    /// Hard limits per storage kind.
    pub kind_quota_bytes: BTreeMap<StorageKind, u64>,
    /// Registered instances.
    pub instances: usize,
}

/// Monotonic counters of administrative events since start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AdminCounters {
    /// Successful catalog mutations (storages, groups, accounts, snapshots,
    /// instance removals).
    pub catalog_changes: u64,
    /// Successful authentications.
    pub auth_ok: u64,
    /// Refused authentications.
    pub auth_failed: u64,
    /// Instances removed (directly or by a snapshot load).
    pub instances_removed: u64,
    /// Block records dropped with removed instances.
    pub blocks_dropped: u64,
}

/// Result of [`MetaService::stats`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetaStats {
    /// Block records per instance id.
    pub blocks_per_instance: BTreeMap<String, u64>,
    /// Figures that could not be read and are left out (or zero): an
    /// instance's count from the index, a group's usage or the open
    /// sessions from the ledger.
    pub count_errors: u64,
    /// Per group name.
    pub groups: BTreeMap<String, GroupStats>,
    /// Open write sessions.
    pub open_sessions: usize,
    /// Event counters.
    pub counters: AdminCounters,
}

/// Counters behind [`AdminCounters`]; relaxed atomics, no locks.
#[derive(Debug, Default)]
pub(crate) struct AdminState {
    catalog_changes: AtomicU64,
    auth_ok: AtomicU64,
    auth_failed: AtomicU64,
    instances_removed: AtomicU64,
    blocks_dropped: AtomicU64,
}

impl AdminState {
    pub(crate) fn count_change(&self) {
        self.catalog_changes.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_auth(&self, ok: bool) {
        let c = if ok { &self.auth_ok } else { &self.auth_failed };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_removal(&self, blocks: u64) {
        self.instances_removed.fetch_add(1, Ordering::Relaxed);
        self.blocks_dropped.fetch_add(blocks, Ordering::Relaxed);
    }

    fn values(&self) -> AdminCounters {
        AdminCounters {
            catalog_changes: self.catalog_changes.load(Ordering::Relaxed),
            auth_ok: self.auth_ok.load(Ordering::Relaxed),
            auth_failed: self.auth_failed.load(Ordering::Relaxed),
            instances_removed: self.instances_removed.load(Ordering::Relaxed),
            blocks_dropped: self.blocks_dropped.load(Ordering::Relaxed),
        }
    }
}

/// Checks a storage on its own.
pub(crate) fn check_storage(s: &Storage) -> Result<()> {
    check_name("storage name", &s.name)?;
    if s.uri.is_empty() {
        return Err(MetaError::InvalidArgument(format!(
            "storage {:?} has no uri",
            s.name
        )));
    }
    Ok(())
}

/// Checks a group's settings. Its storages need not exist yet (as
/// upstream): writes use those that exist when they come, and name the
/// missing ones when none can take them.
pub(crate) fn check_group(g: &InstanceGroup) -> Result<()> {
    let bad = |why: String| {
        Err(MetaError::InvalidArgument(format!(
            "group {:?}: {why}",
            g.name
        )))
    };
    check_name("group name", &g.name)?;
    if g.name == ALL_GROUPS {
        // Reserved: in an account's groups it means every group.
        return bad(format!("{ALL_GROUPS:?} is reserved (it means every group)"));
    }
    check_watermark(g)?;
    // A quota of 0 bytes refuses every write (upstream's negative capacity).
    // A kind quota above the group's is allowed (as upstream): both limits
    // apply, so the smaller one decides.
    if g.max_instances == 0 {
        return bad("max_instances of 0".into());
    }
    if let EvictionPolicy::Ttl { ttl_secs: 0 } = g.eviction {
        return bad("ttl of 0 seconds".into());
    }
    if g.storages.is_empty() {
        return bad("no storages".into());
    }
    let mut names: Vec<&String> = g.storages.iter().collect();
    names.sort_unstable();
    if names.windows(2).any(|w| w[0] == w[1]) {
        return bad("a storage is listed twice".into());
    }
    Ok(())
}

/// Checks a group's watermark: a finite number >= 0. Above 1 is upstream's
/// way to say "never reclaim for usage": the hard quota refuses writes
/// before usage gets there.
pub(crate) fn check_watermark(g: &InstanceGroup) -> Result<()> {
    // NaN fails `>=`.
    if g.watermark >= 0.0 && g.watermark.is_finite() {
        return Ok(());
    }
    Err(MetaError::InvalidArgument(format!(
        "group {:?}: watermark {} is not a finite number >= 0",
        g.name, g.watermark
    )))
}

/// Longest name (instance id, spec name, ...) accepted, in bytes.
pub const MAX_NAME_BYTES: usize = 1024;

/// Whether `c` may not appear in a name: control characters (NUL, C0, DEL,
/// C1), bidirectional overrides and isolates, and the invisible separators
/// and joiners. Such names log and display as something they are not.
fn forbidden_in_name(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061C}' | '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}'
        )
}

/// Checks a client-supplied name: not empty, at most [`MAX_NAME_BYTES`],
/// no [`forbidden_in_name`] character. `what` names it in the error.
pub(crate) fn check_name(what: &str, name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(MetaError::InvalidArgument(format!("empty {what}")));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(MetaError::InvalidArgument(format!(
            "{what} longer than {MAX_NAME_BYTES} bytes"
        )));
    }
    if let Some(c) = name.chars().find(|&c| forbidden_in_name(c)) {
        return Err(MetaError::InvalidArgument(format!(
            "{what} {name:?} contains the control or invisible character U+{:04X}",
            u32::from(c)
        )));
    }
    Ok(())
}

/// Checks an instance's own configuration (the rules of
/// `register_instance`).
pub(crate) fn check_instance(i: &Instance) -> Result<()> {
    // A block size of 0 is allowed (as upstream): such an instance is
    // addressed by block keys only.
    check_name("instance id", &i.id)?;
    if i.location_specs.is_empty() {
        return Err(MetaError::InvalidArgument(format!(
            "instance {:?}: no location specs",
            i.id
        )));
    }
    for spec in &i.location_specs {
        check_name("location spec name", &spec.name)?;
        if spec.size == 0 {
            return Err(MetaError::InvalidArgument(format!(
                "instance {:?}: location spec {:?} has size 0",
                i.id, spec.name
            )));
        }
    }
    check_path_names(i)?;
    let mut names: Vec<&str> = i.location_specs.iter().map(|s| s.name.as_str()).collect();
    names.sort_unstable();
    if names.windows(2).any(|w| w[0] == w[1]) {
        return Err(MetaError::InvalidArgument(format!(
            "instance {:?}: spec names must be unique",
            i.id
        )));
    }
    for g in &i.spec_groups {
        check_name("spec group name", &g.name)?;
        if let Some(bad) = g
            .specs
            .iter()
            .find(|s| names.binary_search(&s.as_str()).is_err())
        {
            return Err(MetaError::InvalidArgument(format!(
                "instance {:?}: spec group {:?} names unknown spec {bad:?}",
                i.id, g.name
            )));
        }
    }
    Ok(())
}

/// Checks that the instance id and every spec name fit in one path
/// component of a part URI once escaped (see [`crate::path_safe`]).
pub(crate) fn check_path_names(i: &Instance) -> Result<()> {
    let specs = i
        .location_specs
        .iter()
        .map(|s| ("spec name", s.name.as_str()));
    for (what, name) in std::iter::once(("instance id", i.id.as_str())).chain(specs) {
        path_safe::check_name(what, name)
            .map_err(|e| MetaError::InvalidArgument(format!("instance {:?}: {e}", i.id)))?;
    }
    Ok(())
}

/// Why `group` may not be removed: an account scoped to it (always: a new
/// group of that name would inherit the grant) or, when `instances_too`, a
/// member instance.
fn group_users(maps: &Maps, group: &str, instances_too: bool) -> Option<String> {
    if let Some(i) = maps.members(group).next().filter(|_| instances_too) {
        return Some(format!("group {group:?} (instance {:?})", i.id));
    }
    maps.accounts
        .values()
        .find(|a| a.allowed_groups.iter().any(|g| g == group))
        .map(|a| format!("group {group:?} (account {:?})", a.name))
}

/// Upstream's compare-and-set rule: the caller names the stored version
/// and brings a higher one.
fn check_version(stored: &InstanceGroup, new: &InstanceGroup, expected: i64) -> Result<()> {
    if expected == stored.version && new.version > stored.version {
        return Ok(());
    }
    Err(MetaError::VersionMismatch {
        group: new.name.clone(),
        expected,
        requested: new.version,
        stored: stored.version,
    })
}

fn sorted_by<T, K: Ord>(mut v: Vec<T>, key: impl Fn(&T) -> K) -> Vec<T> {
    v.sort_by_key(key);
    v
}

impl MetaService {
    /// Adds a storage; [`MetaError::AlreadyExists`] if the name is taken.
    /// A `file://` directory must be absolute and normal and, with
    /// `MetaConfig::storage_roots`, under a root. With a
    /// `MetaConfig::backend_opener` the storage's backend is opened (a file
    /// pool creates its files) and attached at once; one that cannot be
    /// opened now is added all the same (as Tair KVCM does), unhealthy,
    /// with a warning: it takes no writes until the health checker opens
    /// its backend and the probe passes. A kind kvtier has no backend for
    /// (`StorageKind::has_backend`) is added and never written. Refused:
    /// nothing changes.
    pub fn add_storage(&self, s: Storage) -> Result<()> {
        check_storage(&s)?;
        self.check_storage_dir(&s)?;
        // Before the backend creates anything.
        if self.catalog.storage(&s.name).is_ok() {
            return Err(MetaError::AlreadyExists(format!("storage {:?}", s.name)));
        }
        let opened = self.open_changed(&self.catalog.snapshot(), std::slice::from_ref(&s));
        let s = opened.registered(s);
        self.apply_with_backends(opened, |maps| {
            if maps.storages.contains_key(&s.name) {
                return Err(MetaError::AlreadyExists(format!("storage {:?}", s.name)));
            }
            Ok((vec![Change::PutStorage(s)], ()))
        })?;
        self.admin.count_change();
        Ok(())
    }

    /// Replaces a storage's configuration (kind, base URI);
    /// [`MetaError::StorageNotFound`] if absent. The admin switch
    /// (`enabled`) and the probed `health` are kept as they are: the wire's
    /// UpdateStorage carries neither, and an update must not silently
    /// re-enable a disabled or unhealthy storage (use
    /// [`MetaService::enable_storage`]). Existing locations keep their URIs
    /// and kind. The directory rules of [`MetaService::add_storage`]
    /// apply; with a backend opener a changed kind or URI opens a new
    /// backend that replaces the old one (same kind and URI: the backend is
    /// kept). A new backend that cannot be opened now leaves the storage
    /// unhealthy and without a backend, as [`MetaService::add_storage`].
    pub fn update_storage(&self, s: Storage) -> Result<()> {
        check_storage(&s)?;
        self.check_storage_dir(&s)?;
        self.catalog.storage(&s.name)?;
        let opened = self.open_changed(&self.catalog.snapshot(), std::slice::from_ref(&s));
        let unopened = opened.unopened(&s.name);
        self.apply_with_backends(opened, |maps| {
            let Some(cur) = maps.storages.get(&s.name) else {
                return Err(MetaError::StorageNotFound(s.name.clone()));
            };
            let s = Storage {
                enabled: cur.enabled,
                health: if unopened {
                    StorageHealth::Unhealthy
                } else {
                    cur.health
                },
                ..s
            };
            Ok((vec![Change::PutStorage(s)], ()))
        })?;
        self.admin.count_change();
        Ok(())
    }

    fn set_storage_enabled(&self, name: &str, enabled: bool) -> Result<()> {
        self.catalog.apply(self.index.as_ref(), |maps| {
            let mut s = maps
                .storages
                .get(name)
                .cloned()
                .ok_or_else(|| MetaError::StorageNotFound(name.to_owned()))?;
            s.enabled = enabled;
            Ok((vec![Change::PutStorage(s)], ()))
        })?;
        self.admin.count_change();
        Ok(())
    }

    /// Lets the storage take new writes again.
    pub fn enable_storage(&self, name: &str) -> Result<()> {
        self.set_storage_enabled(name, true)
    }

    /// Stops placing new writes on the storage; its blocks stay readable.
    pub fn disable_storage(&self, name: &str) -> Result<()> {
        self.set_storage_enabled(name, false)
    }

    /// Removes a storage; [`MetaError::InUse`] while a group lists it
    /// (unless `MetaConfig::strict_removals` is off: the groups then skip
    /// it).
    /// Locations already on it keep their URIs (removing blocks is the
    /// reclaimer's or the instance's business). With a backend opener the
    /// storage's backend is detached: nothing on it is freed any more.
    pub fn remove_storage(&self, name: &str) -> Result<()> {
        self.apply_with_backends(Opened::default(), |maps| {
            if !maps.storages.contains_key(name) {
                return Err(MetaError::StorageNotFound(name.to_owned()));
            }
            let listed_by = maps
                .groups
                .values()
                .find(|g| g.storages.iter().any(|s| s == name));
            if let Some(g) = listed_by.filter(|_| self.config.strict_removals) {
                return Err(MetaError::InUse(format!(
                    "storage {name:?} (group {:?})",
                    g.name
                )));
            }
            Ok((vec![Change::DeleteStorage(name.to_owned())], ()))
        })?;
        self.admin.count_change();
        Ok(())
    }

    /// Every storage, by name.
    pub fn list_storages(&self) -> Vec<Storage> {
        let maps = self.catalog.snapshot();
        sorted_by(maps.storages.into_values().collect(), |s| s.name.clone())
    }

    /// Creates a group; [`MetaError::AlreadyExists`] if the name is taken,
    /// [`MetaError::InvalidArgument`] for bad settings (a watermark that is
    /// negative or not finite, no storages, ...). Its storages may be added
    /// later (as upstream); a quota of 0 bytes refuses every write.
    pub fn create_group(&self, g: InstanceGroup) -> Result<()> {
        self.catalog.apply(self.index.as_ref(), |maps| {
            check_group(&g)?;
            if maps.groups.contains_key(&g.name) {
                return Err(MetaError::AlreadyExists(format!("group {:?}", g.name)));
            }
            Ok((vec![Change::PutGroup(g)], ()))
        })?;
        self.admin.count_change();
        Ok(())
    }

    /// Replaces a group's settings (same checks as
    /// [`MetaService::create_group`]), whatever its version; they apply
    /// from the next request. Shrinking a quota below current usage refuses
    /// new writes until the reclaimer or removals bring usage down;
    /// `max_instances` may not drop below the current number of instances.
    /// The admin API's update is [`MetaService::update_group_versioned`].
    pub fn update_group(&self, g: InstanceGroup) -> Result<()> {
        self.replace_group(g, None)
    }

    /// Tair KVCM's `UpdateInstanceGroup`: [`MetaService::update_group`]
    /// when `current_version` is the stored version and `g.version` is
    /// above it, [`MetaError::VersionMismatch`] otherwise (upstream's
    /// compare-and-set, `config/registry_manager.cc`), so two admins that
    /// read the same version cannot both update. Nothing changes when
    /// refused.
    pub fn update_group_versioned(&self, g: InstanceGroup, current_version: i64) -> Result<()> {
        self.replace_group(g, Some(current_version))
    }

    /// Replaces a group, checking its version against `expected` when
    /// given; checked under the catalog's edit lock, so the compare and
    /// the set are one step.
    fn replace_group(&self, g: InstanceGroup, expected: Option<i64>) -> Result<()> {
        self.catalog.apply(self.index.as_ref(), |maps| {
            check_group(&g)?;
            let Some(stored) = maps.groups.get(&g.name) else {
                return Err(MetaError::GroupNotFound(g.name.clone()));
            };
            if let Some(expected) = expected {
                check_version(stored, &g, expected)?;
            }
            let members = maps.members(&g.name).count();
            if members > g.max_instances as usize {
                return Err(MetaError::InvalidArgument(format!(
                    "group {:?} has {members} instances, more than max_instances {}",
                    g.name, g.max_instances
                )));
            }
            Ok((vec![Change::PutGroup(g)], ()))
        })?;
        self.admin.count_change();
        Ok(())
    }

    /// Removes a group; [`MetaError::InUse`] while an account is restricted
    /// to it or (with `MetaConfig::strict_removals`, the default) it has
    /// instances.
    pub fn remove_group(&self, name: &str) -> Result<()> {
        self.catalog.apply(self.index.as_ref(), |maps| {
            if !maps.groups.contains_key(name) {
                return Err(MetaError::GroupNotFound(name.to_owned()));
            }
            if let Some(why) = group_users(maps, name, self.config.strict_removals) {
                return Err(MetaError::InUse(why));
            }
            Ok((vec![Change::DeleteGroup(name.to_owned())], ()))
        })?;
        self.admin.count_change();
        Ok(())
    }

    /// A group and its current usage.
    pub fn get_group(&self, name: &str) -> Result<(InstanceGroup, GroupUsage)> {
        let g = self.catalog.group(name)?;
        Ok(((*g).clone(), self.ledger.usage(name)?))
    }

    /// Every group, by name.
    pub fn list_groups(&self) -> Vec<InstanceGroup> {
        let maps = self.catalog.snapshot();
        let groups = maps.groups.into_values().map(|g| (*g).clone()).collect();
        sorted_by(groups, |g: &InstanceGroup| g.name.clone())
    }

    /// Instances, by id; only those of `group` when given.
    pub fn list_instances(&self, group: Option<&str>) -> Vec<Instance> {
        let all = self.catalog.instances().into_iter();
        let picked = all
            .filter(|i| group.is_none_or(|g| i.group == g))
            .map(|i| (*i).clone())
            .collect();
        sorted_by(picked, |i: &Instance| i.id.clone())
    }

    /// Forgets an instance: cancels its open write sessions, drops every
    /// block record and releases their bytes from the group's quota.
    /// Returns the number of block records dropped.
    ///
    /// Blocks are dropped before the instance leaves the catalog, so a
    /// failed index call leaves it registered and the call can be retried;
    /// a second sweep afterwards catches writes that raced the removal.
    pub async fn remove_instance(&self, id: &str) -> Result<u64> {
        let inst = self.catalog.instance_or_load(self.index.as_ref(), id)?;
        let mut dropped = self.drop_blocks(&inst)?;
        self.catalog.apply(self.index.as_ref(), |maps| {
            if !maps.instances.contains_key(id) {
                return Err(MetaError::InstanceNotFound(id.to_owned()));
            }
            Ok((vec![Change::DeleteInstance(id.to_owned())], ()))
        })?;
        dropped += self.drop_blocks(&inst)?;
        // Removes the instance's (now empty) table; anything a request
        // still in flight wrote after the sweep goes with it.
        dropped += self.index.drop_instance(id)?;
        self.admin.count_change();
        self.admin.count_removal(dropped);
        tracing::info!(instance = id, dropped, "instance removed");
        Ok(dropped)
    }

    /// Cancels the instance's sessions and removes its block records,
    /// releasing every byte they were charged and, through the storages'
    /// backends, the space of every removed location (writing ones too:
    /// their writes are abandoned). Writing locations are charged to their
    /// session: the charge of a cancelled session is released with it, and
    /// a session finishing meanwhile finds its records gone and releases
    /// its own.
    pub(crate) fn drop_blocks(&self, inst: &Instance) -> Result<u64> {
        let sessions = self.ledger.claim_instance(&inst.id, self.claim_lease())?;
        // A target an interrupted finish already made serving is charged
        // once, through its session: the sweep leaves its bytes to the
        // session's close, which releases every target's.
        let targets: HashSet<(BlockKey, LocationId)> = sessions
            .iter()
            .flat_map(|(_, s)| s.targets.iter().map(|t| (t.key, t.location)))
            .collect();
        let mut dropped = 0u64;
        loop {
            // Deleted keys leave the scan, so always start from the top.
            let keys = self.index.scan(&inst.id, None, SWEEP_BATCH)?;
            if keys.is_empty() {
                break;
            }
            let mut gone: Vec<CacheLocation> = Vec::new();
            let mut freed: HashMap<StorageKind, u64> = HashMap::new();
            let result = self.index.modify(&inst.id, &keys, &mut |key, cur| {
                let Some(m) = cur else {
                    return Modify::Keep;
                };
                for l in &m.locations {
                    let charged_to_session =
                        l.status == LocationStatus::Writing || targets.contains(&(key, l.id));
                    if !charged_to_session {
                        *freed.entry(l.kind).or_default() += l.size();
                    }
                }
                gone.extend(m.locations);
                dropped += 1;
                Modify::Delete
            });
            self.search_cache.invalidate_instance(&inst.id);
            // After an index error we cannot tell which chunks were applied:
            // keep the bytes charged and the space allocated rather than
            // free space a record may still point to. The sessions stay
            // claimed; the reaper closes them once the claim runs out.
            result?;
            for (kind, bytes) in freed {
                self.release_usage(&inst.group, kind, bytes);
            }
            self.release_locations(gone);
        }
        for (id, s) in &sessions {
            if let Err(e) = self.ledger.close(*id, s, 0) {
                tracing::warn!(session = %id, error = %e, "quota ledger: cancelled session left to the reaper");
            }
        }
        // No read after this call may see a dropped block.
        self.search_cache.invalidate_instance(&inst.id);
        Ok(dropped)
    }

    /// Whether the index answers and takes writes, and every storage's
    /// state. While the index refuses writes this may try one (see
    /// [`crate::MetaIndex::write_fault`]), so a recovered disk shows as healthy
    /// without waiting for a client's write.
    pub async fn check_health(&self) -> HealthReport {
        let index_error = self
            .index
            .list_records(RecordKind::Storage)
            .err()
            .map(|e| e.to_string());
        let index_read_only = self.index.write_fault();
        let storages: Vec<StorageStatus> = self
            .list_storages()
            .into_iter()
            .map(|s| StorageStatus {
                name: s.name,
                kind: s.kind,
                enabled: s.enabled,
                health: s.health,
            })
            .collect();
        let reason = health_problem(
            index_error.as_deref(),
            index_read_only.as_deref(),
            &storages,
        );
        HealthReport {
            healthy: reason.is_none(),
            index_error,
            index_read_only,
            reason,
            storages,
        }
    }

    /// Bootstrap of a fresh server: adds `storage` unless a storage of that
    /// name exists, and a group [`DEFAULT_GROUP`] on it (no quota limit,
    /// watermark 0.9, LRU, any number of instances) unless that group
    /// exists. Idempotent; never overwrites either.
    pub fn ensure_default_group(&self, storage: Storage) -> Result<()> {
        check_storage(&storage)?;
        let changed = self.catalog.apply(self.index.as_ref(), |maps| {
            let mut changes = Vec::new();
            if !maps.groups.contains_key(DEFAULT_GROUP) {
                changes.push(Change::PutGroup(InstanceGroup {
                    name: DEFAULT_GROUP.into(),
                    quota_bytes: u64::MAX,
                    kind_quota_bytes: BTreeMap::new(),
                    watermark: DEFAULT_WATERMARK,
                    eviction: EvictionPolicy::Lru,
                    storages: vec![storage.name.clone()],
                    max_instances: u32::MAX,
                    ..InstanceGroup::default()
                }));
            }
            if !maps.storages.contains_key(&storage.name) {
                changes.insert(0, Change::PutStorage(storage));
            }
            let changed = !changes.is_empty();
            Ok((changes, changed))
        })?;
        if changed {
            self.admin.count_change();
        }
        Ok(())
    }

    /// Blocks per instance, usage and limits per group, open sessions and
    /// counters. Counts every instance's records (one index call each).
    pub fn stats(&self) -> MetaStats {
        let maps = self.catalog.snapshot();
        let mut stats = MetaStats {
            counters: self.admin.values(),
            ..MetaStats::default()
        };
        match self.ledger.held_sessions() {
            Ok(n) => stats.open_sessions = n,
            Err(_) => stats.count_errors += 1,
        }
        for id in maps.instances.keys() {
            match self.index.count(id) {
                Ok(n) => {
                    stats.blocks_per_instance.insert(id.clone(), n);
                }
                Err(_) => stats.count_errors += 1,
            }
        }
        for (name, g) in &maps.groups {
            let usage = self.ledger.usage(name).unwrap_or_else(|_| {
                stats.count_errors += 1;
                GroupUsage::default()
            });
            stats.groups.insert(
                name.clone(),
                GroupStats {
                    usage,
                    quota_bytes: g.quota_bytes,
                    kind_quota_bytes: g.kind_quota_bytes.clone(),
                    instances: maps.members(name).count(),
                },
            );
        }
        stats
    }
}

/// The first thing wrong, in words, or `None` when healthy: the index
/// unreachable, then the index refusing writes, then no storage taking
/// writes (a fresh server with no storage is healthy).
fn health_problem(
    index_error: Option<&str>,
    index_read_only: Option<&str>,
    storages: &[StorageStatus],
) -> Option<String> {
    if let Some(e) = index_error {
        return Some(format!("metadata index unreachable: {e}"));
    }
    if let Some(why) = index_read_only {
        return Some(format!("metadata index read-only: {why}"));
    }
    let refusals: Vec<Option<&str>> = storages
        .iter()
        .map(|s| {
            if s.kind.has_backend() {
                write_refusal(s.enabled, s.health)
            } else {
                Some("without a backend in kvtier")
            }
        })
        .collect();
    if storages.is_empty() || refusals.iter().any(Option::is_none) {
        return None;
    }
    let states: Vec<String> = storages
        .iter()
        .zip(refusals)
        .map(|(s, why)| format!("{} {}", s.name, why.unwrap_or("healthy")))
        .collect();
    Some(format!("no storage takes writes: {}", states.join(", ")))
}
