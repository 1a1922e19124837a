//! The control-plane catalog: storages, groups, instances and accounts,
//! cached in memory and written through to the index, so request paths
//! never decode JSON. One frontend per index is assumed until the Redis
//! step adds invalidation.
//!
//! Every mutation is a plan of [`Change`]s computed from the current maps
//! and applied by [`Catalog::apply`]: the `edit` mutex serializes planning
//! and persisting (so a check such as "no group lists this storage" still
//! holds when the removal lands), and the maps' write lock is taken only for
//! the in-memory update, so readers on the data path never wait on an
//! index write (an fsync with [`crate::RedbIndex`]).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{MetaError, Result};
use crate::index::{MetaIndex, RecordKind};
use crate::model::{Account, BlockKey, Instance, InstanceGroup, Storage, StorageHealth};

/// The cached records, by name.
#[derive(Debug, Default, Clone)]
pub(crate) struct Maps {
    pub(crate) storages: HashMap<String, Storage>,
    pub(crate) groups: HashMap<String, Arc<InstanceGroup>>,
    pub(crate) instances: HashMap<String, Arc<Instance>>,
    pub(crate) accounts: HashMap<String, Arc<Account>>,
}

impl Maps {
    /// Instances of `group`.
    pub(crate) fn members<'a>(&'a self, group: &'a str) -> impl Iterator<Item = &'a Instance> {
        self.instances
            .values()
            .filter(move |i| i.group == group)
            .map(|i| &**i)
    }
}

/// One catalog mutation.
#[derive(Debug, Clone)]
pub(crate) enum Change {
    PutStorage(Storage),
    DeleteStorage(String),
    PutGroup(InstanceGroup),
    DeleteGroup(String),
    PutInstance(Instance),
    DeleteInstance(String),
    PutAccount(Account),
    DeleteAccount(String),
}

impl Change {
    fn persist(&self, index: &dyn MetaIndex) -> Result<()> {
        match self {
            Change::PutStorage(s) => index.put_record(RecordKind::Storage, &s.name, &encode(s)?),
            Change::PutGroup(g) => index.put_record(RecordKind::Group, &g.name, &encode(g)?),
            Change::PutInstance(i) => index.put_record(RecordKind::Instance, &i.id, &encode(i)?),
            Change::PutAccount(a) => index.put_record(RecordKind::Account, &a.name, &encode(a)?),
            Change::DeleteStorage(n) => index.delete_record(RecordKind::Storage, n).map(drop),
            Change::DeleteGroup(n) => index.delete_record(RecordKind::Group, n).map(drop),
            Change::DeleteInstance(n) => index.delete_record(RecordKind::Instance, n).map(drop),
            Change::DeleteAccount(n) => index.delete_record(RecordKind::Account, n).map(drop),
        }
    }

    fn apply_to(self, maps: &mut Maps) {
        match self {
            Change::PutStorage(s) => {
                maps.storages.insert(s.name.clone(), s);
            }
            Change::PutGroup(g) => {
                maps.groups.insert(g.name.clone(), Arc::new(g));
            }
            Change::PutInstance(i) => {
                maps.instances.insert(i.id.clone(), Arc::new(i));
            }
            Change::PutAccount(a) => {
                maps.accounts.insert(a.name.clone(), Arc::new(a));
            }
            Change::DeleteStorage(n) => {
                maps.storages.remove(&n);
            }
            Change::DeleteGroup(n) => {
                maps.groups.remove(&n);
            }
            Change::DeleteInstance(n) => {
                maps.instances.remove(&n);
            }
            Change::DeleteAccount(n) => {
                maps.accounts.remove(&n);
            }
        }
    }

    /// The account whose credentials this change replaces or removes.
    fn account(&self) -> Option<&str> {
        match self {
            Change::PutAccount(a) => Some(&a.name),
            Change::DeleteAccount(n) => Some(n),
            _ => None,
        }
    }
}

/// Digest of a presented API key (unsalted SHA-256), the key of
/// [`Catalog::key_cache`].
pub(crate) type KeyDigest = [u8; 32];

/// Cached control-plane records.
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    maps: RwLock<Maps>,
    /// Serializes mutations (plan, persist, apply); see the module docs.
    edit: Mutex<()>,
    /// Memory-only map from the digest of a key that authenticated to its
    /// account, so `authenticate` costs one lookup instead of a salted hash
    /// per account. Never persisted: on disk there are only salted hashes.
    /// Entries of an account are dropped when it is replaced or deleted.
    key_cache: RwLock<HashMap<KeyDigest, String>>,
}

fn decode<T: DeserializeOwned>(name: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| MetaError::Corrupt {
        key: BlockKey(0),
        reason: format!("record {name:?}: {e}"),
    })
}

/// The accounts stored in `index`, read without starting a service (no
/// startup sweep, no quota scan): for checks a binary makes before it
/// creates anything else.
pub fn stored_accounts(index: &dyn MetaIndex) -> Result<Vec<Account>> {
    index
        .list_records(RecordKind::Account)?
        .into_iter()
        .map(|(n, v)| decode(&n, &v))
        .collect()
}

fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(v).map_err(MetaError::backend)
}

fn read_maps(index: &dyn MetaIndex) -> Result<Maps> {
    let mut maps = Maps::default();
    for (n, v) in index.list_records(RecordKind::Storage)? {
        maps.storages.insert(n.clone(), decode(&n, &v)?);
    }
    for (n, v) in index.list_records(RecordKind::Group)? {
        maps.groups.insert(n.clone(), Arc::new(decode(&n, &v)?));
    }
    for (n, v) in index.list_records(RecordKind::Instance)? {
        maps.instances.insert(n.clone(), Arc::new(decode(&n, &v)?));
    }
    for (n, v) in index.list_records(RecordKind::Account)? {
        maps.accounts.insert(n.clone(), Arc::new(decode(&n, &v)?));
    }
    Ok(maps)
}

impl Catalog {
    pub(crate) fn load(index: &dyn MetaIndex) -> Result<Self> {
        Ok(Catalog {
            maps: RwLock::new(read_maps(index)?),
            ..Catalog::default()
        })
    }

    /// Plans a mutation from the current maps and applies it: persists each
    /// change in order, then updates memory. If the index fails midway,
    /// the changes already persisted are applied in memory too (memory
    /// mirrors the index) and the error is returned.
    pub(crate) fn apply<R>(
        &self,
        index: &dyn MetaIndex,
        plan: impl FnOnce(&Maps) -> Result<(Vec<Change>, R)>,
    ) -> Result<R> {
        let _edit = self.edit.lock();
        let (changes, out) = plan(&self.maps.read())?;
        let mut done = 0;
        let mut failure = None;
        for c in &changes {
            match c.persist(index) {
                Ok(()) => done += 1,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        let touched: Vec<String> = changes
            .iter()
            .take(done)
            .filter_map(|c| c.account().map(str::to_owned))
            .collect();
        {
            let mut maps = self.maps.write();
            for c in changes.into_iter().take(done) {
                c.apply_to(&mut maps);
            }
        }
        if !touched.is_empty() {
            self.key_cache
                .write()
                .retain(|_, name| !touched.contains(name));
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// Replaces every cached record with the index's, for frontends that
    /// share an index with others (their changes are not seen otherwise).
    /// Cached API keys are forgotten: an account may have changed.
    pub(crate) fn refresh(&self, index: &dyn MetaIndex) -> Result<()> {
        let _edit = self.edit.lock();
        let fresh = read_maps(index)?;
        *self.maps.write() = fresh;
        self.key_cache.write().clear();
        Ok(())
    }

    /// An instance, reading it (and its group) from the index when this
    /// process has not seen it: another frontend may have registered it.
    pub(crate) fn instance_or_load(
        &self,
        index: &dyn MetaIndex,
        id: &str,
    ) -> Result<Arc<Instance>> {
        if let Ok(i) = self.instance(id) {
            return Ok(i);
        }
        let Some(bytes) = index.get_record(RecordKind::Instance, id)? else {
            return Err(MetaError::InstanceNotFound(id.to_owned()));
        };
        let inst: Instance = decode(id, &bytes)?;
        let group = match self.group(&inst.group) {
            Ok(_) => None,
            Err(_) => match index.get_record(RecordKind::Group, &inst.group)? {
                Some(g) => Some(decode::<InstanceGroup>(&inst.group, &g)?),
                None => return Err(MetaError::GroupNotFound(inst.group.clone())),
            },
        };
        let _edit = self.edit.lock();
        let mut maps = self.maps.write();
        if let Some(g) = group {
            for name in &g.storages {
                if !maps.storages.contains_key(name)
                    && let Some(s) = index.get_record(RecordKind::Storage, name)?
                {
                    maps.storages.insert(name.clone(), decode(name, &s)?);
                }
            }
            maps.groups
                .entry(g.name.clone())
                .or_insert_with(|| Arc::new(g));
        }
        Ok(maps
            .instances
            .entry(inst.id.clone())
            .or_insert_with(|| Arc::new(inst))
            .clone())
    }

    /// A consistent copy of every map (for listings and snapshots).
    pub(crate) fn snapshot(&self) -> Maps {
        self.maps.read().clone()
    }

    /// Sets a storage's health in memory only, for a probe result the index
    /// cannot record now (it refuses writes): the probe is runtime state,
    /// and a storage must not keep taking writes, or stay hidden, because
    /// the index's disk is full. The next probe persists it once the index
    /// writes again. A storage that is gone is left gone.
    pub(crate) fn set_health_unpersisted(&self, name: &str, health: StorageHealth) {
        let _edit = self.edit.lock();
        if let Some(s) = self.maps.write().storages.get_mut(name) {
            s.health = health;
        }
    }

    pub(crate) fn put_storage(&self, index: &dyn MetaIndex, s: Storage) -> Result<()> {
        self.apply(index, |_| Ok((vec![Change::PutStorage(s)], ())))
    }

    pub(crate) fn put_group(&self, index: &dyn MetaIndex, g: InstanceGroup) -> Result<()> {
        self.apply(index, |_| Ok((vec![Change::PutGroup(g)], ())))
    }

    /// Adds `inst` unless its group is missing or full; the caller checked
    /// for conflicts.
    pub(crate) fn put_instance(
        &self,
        index: &dyn MetaIndex,
        inst: Instance,
    ) -> Result<Arc<Instance>> {
        let id = inst.id.clone();
        self.apply(index, |maps| {
            let group = maps
                .groups
                .get(&inst.group)
                .ok_or_else(|| MetaError::GroupNotFound(inst.group.clone()))?;
            if maps.members(&inst.group).count() >= group.max_instances as usize {
                return Err(MetaError::GroupFull(inst.group.clone()));
            }
            Ok((vec![Change::PutInstance(inst)], ()))
        })?;
        self.instance(&id)
    }

    pub(crate) fn instance(&self, id: &str) -> Result<Arc<Instance>> {
        self.maps
            .read()
            .instances
            .get(id)
            .cloned()
            .ok_or_else(|| MetaError::InstanceNotFound(id.to_owned()))
    }

    pub(crate) fn instances(&self) -> Vec<Arc<Instance>> {
        self.maps.read().instances.values().cloned().collect()
    }

    pub(crate) fn group(&self, name: &str) -> Result<Arc<InstanceGroup>> {
        self.maps
            .read()
            .groups
            .get(name)
            .cloned()
            .ok_or_else(|| MetaError::GroupNotFound(name.to_owned()))
    }

    pub(crate) fn storage(&self, name: &str) -> Result<Storage> {
        self.maps
            .read()
            .storages
            .get(name)
            .cloned()
            .ok_or_else(|| MetaError::StorageNotFound(name.to_owned()))
    }

    pub(crate) fn account(&self, name: &str) -> Option<Arc<Account>> {
        self.maps.read().accounts.get(name).cloned()
    }

    pub(crate) fn accounts(&self) -> Vec<Arc<Account>> {
        self.maps.read().accounts.values().cloned().collect()
    }

    /// The account a key digest authenticated as before, if cached.
    pub(crate) fn cached_key(&self, digest: &KeyDigest) -> Option<String> {
        self.key_cache.read().get(digest).cloned()
    }

    /// Remembers that `digest` authenticated as `account`, unless the
    /// account was deleted meanwhile.
    pub(crate) fn cache_key(&self, digest: KeyDigest, account: &str) {
        let _edit = self.edit.lock();
        if self.maps.read().accounts.contains_key(account) {
            self.key_cache.write().insert(digest, account.to_owned());
        }
    }

    /// Forgets a cached digest (its account's key changed).
    pub(crate) fn forget_key(&self, digest: &KeyDigest) {
        self.key_cache.write().remove(digest);
    }

    /// The group's candidate storages that exist, in preference order.
    pub(crate) fn candidates(&self, group: &InstanceGroup) -> Vec<Storage> {
        let maps = self.maps.read();
        group
            .storages
            .iter()
            .filter_map(|n| maps.storages.get(n).cloned())
            .collect()
    }
}
