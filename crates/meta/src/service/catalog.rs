//! The control-plane catalog: storages, groups and instances, cached in
//! memory and written through to the index, so request paths never decode
//! JSON. One frontend per index is assumed until the Redis step adds
//! invalidation.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{MetaError, Result};
use crate::index::{MetaIndex, RecordKind};
use crate::model::{BlockKey, Instance, InstanceGroup, Storage};

#[derive(Debug, Default)]
struct Maps {
    storages: HashMap<String, Storage>,
    groups: HashMap<String, Arc<InstanceGroup>>,
    instances: HashMap<String, Arc<Instance>>,
}

/// Cached control-plane records.
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    maps: RwLock<Maps>,
}

fn decode<T: DeserializeOwned>(name: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| MetaError::Corrupt {
        key: BlockKey(0),
        reason: format!("record {name:?}: {e}"),
    })
}

fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(v).map_err(MetaError::backend)
}

impl Catalog {
    pub(crate) fn load(index: &dyn MetaIndex) -> Result<Self> {
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
        Ok(Catalog {
            maps: RwLock::new(maps),
        })
    }

    pub(crate) fn put_storage(&self, index: &dyn MetaIndex, s: Storage) -> Result<()> {
        index.put_record(RecordKind::Storage, &s.name, &encode(&s)?)?;
        self.maps.write().storages.insert(s.name.clone(), s);
        Ok(())
    }

    pub(crate) fn put_group(&self, index: &dyn MetaIndex, g: InstanceGroup) -> Result<()> {
        index.put_record(RecordKind::Group, &g.name, &encode(&g)?)?;
        self.maps.write().groups.insert(g.name.clone(), Arc::new(g));
        Ok(())
    }

    /// Adds `inst` unless its group is full; the caller checked for conflicts.
    pub(crate) fn put_instance(
        &self,
        index: &dyn MetaIndex,
        inst: Instance,
    ) -> Result<Arc<Instance>> {
        let mut maps = self.maps.write();
        let group = maps
            .groups
            .get(&inst.group)
            .ok_or_else(|| MetaError::GroupNotFound(inst.group.clone()))?;
        let members = maps
            .instances
            .values()
            .filter(|i| i.group == inst.group)
            .count();
        if members >= group.max_instances as usize {
            return Err(MetaError::GroupFull(inst.group.clone()));
        }
        index.put_record(RecordKind::Instance, &inst.id, &encode(&inst)?)?;
        let inst = Arc::new(inst);
        maps.instances.insert(inst.id.clone(), inst.clone());
        Ok(inst)
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
