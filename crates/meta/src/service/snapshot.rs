//! Configuration snapshots: the whole catalog (storages, groups, instances,
//! accounts with their salted key hashes) as one JSON document, for backup
//! and for moving a configuration between servers (Tair KVCM
//! `GenConfigSnapshot` / `LoadConfigSnapshot`).
//!
//! Loading validates the snapshot completely (names, settings, references
//! between objects, and that instances present on both sides are
//! identical: an instance's layout never changes) before touching
//! anything. It then replaces the catalog; instances the snapshot leaves
//! out are removed with their blocks, as by
//! [`MetaService::remove_instance`].

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::MetaService;
use super::accounts::{check_account_groups, valid_hash};
use super::admin::{check_group, check_instance, check_storage};
use super::catalog::{Change, Maps};
use crate::error::{MetaError, Result};
use crate::model::{Account, Instance, InstanceGroup, Storage};

/// The catalog as one serializable document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfigSnapshot {
    /// Document format; [`ConfigSnapshot::FORMAT`] is the only one so far.
    #[serde(default = "current_format")]
    pub format: u32,
    /// Storages, by name.
    #[serde(default)]
    pub storages: Vec<Storage>,
    /// Instance groups, by name.
    #[serde(default)]
    pub groups: Vec<InstanceGroup>,
    /// Instances, by id.
    #[serde(default)]
    pub instances: Vec<Instance>,
    /// Accounts, by name; they carry salted key hashes, never keys.
    #[serde(default)]
    pub accounts: Vec<Account>,
}

fn current_format() -> u32 {
    ConfigSnapshot::FORMAT
}

impl ConfigSnapshot {
    /// The format this version writes and reads.
    pub const FORMAT: u32 = 1;

    /// The snapshot as JSON text (the wire's `config_snapshot`).
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string_pretty(self).map_err(MetaError::backend)
    }

    /// Parses JSON text; [`MetaError::InvalidArgument`] if malformed.
    pub fn from_json(text: &str) -> Result<Self> {
        serde_json::from_str(text)
            .map_err(|e| MetaError::InvalidArgument(format!("config snapshot: {e}")))
    }
}

/// Fails on the first name that is empty or repeated.
fn unique<'a>(what: &str, names: impl Iterator<Item = &'a str>) -> Result<HashSet<&'a str>> {
    let mut seen = HashSet::new();
    for n in names {
        if n.is_empty() {
            return Err(MetaError::InvalidArgument(format!("empty {what} name")));
        }
        if !seen.insert(n) {
            return Err(MetaError::InvalidArgument(format!(
                "{what} {n:?} appears twice"
            )));
        }
    }
    Ok(seen)
}

/// Checks `snap` on its own and against the current catalog (instances on
/// both sides must be identical).
fn validate(snap: &ConfigSnapshot, current: &Maps) -> Result<()> {
    if snap.format != ConfigSnapshot::FORMAT {
        return Err(MetaError::InvalidArgument(format!(
            "config snapshot format {} (this server reads {})",
            snap.format,
            ConfigSnapshot::FORMAT
        )));
    }
    unique("storage", snap.storages.iter().map(|s| s.name.as_str()))?;
    let groups = unique("group", snap.groups.iter().map(|g| g.name.as_str()))?;
    unique("instance", snap.instances.iter().map(|i| i.id.as_str()))?;
    unique("account", snap.accounts.iter().map(|a| a.name.as_str()))?;
    for s in &snap.storages {
        check_storage(s)?;
    }
    for g in &snap.groups {
        check_group(g)?;
    }
    let mut members: HashMap<&str, u32> = HashMap::new();
    for i in &snap.instances {
        check_instance(i)?;
        let Some(g) = snap.groups.iter().find(|g| g.name == i.group) else {
            return Err(MetaError::GroupNotFound(i.group.clone()));
        };
        let n = members.entry(g.name.as_str()).or_default();
        *n += 1;
        if *n > g.max_instances {
            return Err(MetaError::GroupFull(g.name.clone()));
        }
        if current.instances.get(&i.id).is_some_and(|c| **c != *i) {
            return Err(MetaError::InstanceConflict(i.id.clone()));
        }
    }
    for a in &snap.accounts {
        if !valid_hash(&a.api_key_hash) {
            return Err(MetaError::InvalidArgument(format!(
                "account {:?}: malformed key hash",
                a.name
            )));
        }
        check_account_groups(&a.allowed_groups, |g| groups.contains(g))?;
    }
    Ok(())
}

/// The changes that turn `current` into `snap`: puts in dependency order
/// (storages, groups, instances, accounts), then deletes in reverse, so a
/// failure midway leaves no record pointing at a missing one. Records
/// equal on both sides are not rewritten.
fn plan(snap: ConfigSnapshot, current: &Maps) -> Vec<Change> {
    let mut puts = Vec::new();
    let mut deletes = Vec::new();
    let keep_s: HashSet<String> = snap.storages.iter().map(|s| s.name.clone()).collect();
    let keep_g: HashSet<String> = snap.groups.iter().map(|g| g.name.clone()).collect();
    let keep_i: HashSet<String> = snap.instances.iter().map(|i| i.id.clone()).collect();
    let keep_a: HashSet<String> = snap.accounts.iter().map(|a| a.name.clone()).collect();
    for s in snap.storages {
        if current.storages.get(&s.name) != Some(&s) {
            puts.push(Change::PutStorage(s));
        }
    }
    for g in snap.groups {
        if current.groups.get(&g.name).is_none_or(|c| **c != g) {
            puts.push(Change::PutGroup(g));
        }
    }
    for i in snap.instances {
        if !current.instances.contains_key(&i.id) {
            puts.push(Change::PutInstance(i));
        }
    }
    for a in snap.accounts {
        if current.accounts.get(&a.name).is_none_or(|c| **c != a) {
            puts.push(Change::PutAccount(a));
        }
    }
    let gone = |names: Vec<&String>, keep: &HashSet<String>| -> Vec<String> {
        let mut v: Vec<String> = names
            .into_iter()
            .filter(|n| !keep.contains(*n))
            .cloned()
            .collect();
        v.sort();
        v
    };
    for n in gone(current.accounts.keys().collect(), &keep_a) {
        deletes.push(Change::DeleteAccount(n));
    }
    for n in gone(current.instances.keys().collect(), &keep_i) {
        deletes.push(Change::DeleteInstance(n));
    }
    for n in gone(current.groups.keys().collect(), &keep_g) {
        deletes.push(Change::DeleteGroup(n));
    }
    for n in gone(current.storages.keys().collect(), &keep_s) {
        deletes.push(Change::DeleteStorage(n));
    }
    puts.extend(deletes);
    puts
}

impl MetaService {
    /// The whole catalog, each list sorted by name.
    pub fn gen_config_snapshot(&self) -> ConfigSnapshot {
        let maps = self.catalog.snapshot();
        let mut snap = ConfigSnapshot {
            format: ConfigSnapshot::FORMAT,
            storages: maps.storages.into_values().collect(),
            groups: maps.groups.into_values().map(|g| (*g).clone()).collect(),
            instances: maps.instances.into_values().map(|i| (*i).clone()).collect(),
            accounts: maps.accounts.into_values().map(|a| (*a).clone()).collect(),
        };
        snap.storages.sort_by(|a, b| a.name.cmp(&b.name));
        snap.groups.sort_by(|a, b| a.name.cmp(&b.name));
        snap.instances.sort_by(|a, b| a.id.cmp(&b.id));
        snap.accounts.sort_by(|a, b| a.name.cmp(&b.name));
        snap
    }

    /// Replaces the catalog with `snap`. Storages follow the rules of
    /// [`MetaService::add_storage`] (storage roots; with a backend opener
    /// new or changed storages get their backends, or are registered
    /// unhealthy when theirs cannot be opened, and removed ones lose
    /// theirs). Validated first: on any error
    /// ([`MetaError::InvalidArgument`], [`MetaError::StorageNotFound`],
    /// [`MetaError::GroupNotFound`], [`MetaError::GroupFull`],
    /// [`MetaError::InstanceConflict`]) nothing changes. Instances left
    /// out are removed with their blocks. Only an index failure while
    /// writing can leave part of the snapshot applied (the catalog in
    /// memory still mirrors the index).
    pub fn load_config_snapshot(&self, snap: ConfigSnapshot) -> Result<()> {
        for s in &snap.storages {
            self.check_storage_dir(s)?;
        }
        // Validated before any backend creates files; again under the lock.
        validate(&snap, &self.catalog.snapshot())?;
        let opened = self.open_changed(&self.catalog.snapshot(), &snap.storages);
        let mut snap = snap;
        snap.storages = snap
            .storages
            .into_iter()
            .map(|s| opened.registered(s))
            .collect();
        let removed: Vec<Instance> = self.apply_with_backends(opened, |maps| {
            validate(&snap, maps)?;
            let keep: HashSet<&str> = snap.instances.iter().map(|i| i.id.as_str()).collect();
            let removed = maps
                .instances
                .values()
                .filter(|i| !keep.contains(i.id.as_str()))
                .map(|i| (**i).clone())
                .collect();
            Ok((plan(snap, maps), removed))
        })?;
        self.admin.count_change();
        for inst in &removed {
            let dropped = self.drop_blocks(inst)?;
            self.admin.count_removal(dropped);
        }
        Ok(())
    }
}
