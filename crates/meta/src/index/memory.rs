//! [`MemoryIndex`]: the in-memory reference backend. Simple on purpose: it is
//! the model the durable backends are tested against, and the backend for
//! tests of the service.

use std::collections::{BTreeMap, HashMap};

use parking_lot::RwLock;
use rand::Rng;

use super::{AccessHit, MetaIndex, Modifier, Modify, RecordKind, ShardLocks};

/// Keys whose hits [`MetaIndex::touch`] applies under one hold of the
/// write lock.
const TOUCH_CHUNK: usize = 1024;
use crate::error::Result;
use crate::model::{BlockKey, BlockMeta};

/// Block records in ordered maps per instance, behind one `RwLock` that is
/// held only for the duration of a map operation; [`ShardLocks`] give
/// read-modify-write its per-key atomicity.
#[derive(Debug, Default)]
pub struct MemoryIndex {
    blocks: RwLock<HashMap<String, BTreeMap<BlockKey, BlockMeta>>>,
    records: RwLock<BTreeMap<(&'static str, String), Vec<u8>>>,
    locks: ShardLocks,
}

impl MemoryIndex {
    /// An empty index with default shard locks.
    pub fn new() -> Self {
        Self::default()
    }
}

impl MetaIndex for MemoryIndex {
    fn get(&self, instance: &str, keys: &[BlockKey]) -> Result<Vec<Option<BlockMeta>>> {
        let blocks = self.blocks.read();
        let map = blocks.get(instance);
        Ok(keys
            .iter()
            .map(|k| map.and_then(|m| m.get(k)).cloned())
            .collect())
    }

    fn put(&self, instance: &str, metas: &[BlockMeta]) -> Result<()> {
        let keys: Vec<BlockKey> = metas.iter().map(|m| m.key).collect();
        let by_key: HashMap<BlockKey, &BlockMeta> = metas.iter().map(|m| (m.key, m)).collect();
        self.locks.for_each_chunk(instance, &keys, |chunk| {
            let mut blocks = self.blocks.write();
            let map = blocks.entry(instance.to_owned()).or_default();
            for k in chunk {
                if let Some(m) = by_key.get(k) {
                    map.insert(*k, (*m).clone());
                }
            }
            Ok(())
        })
    }

    fn delete(&self, instance: &str, keys: &[BlockKey]) -> Result<usize> {
        let mut n = 0;
        self.locks.for_each_chunk(instance, keys, |chunk| {
            let mut blocks = self.blocks.write();
            if let Some(map) = blocks.get_mut(instance) {
                n += chunk.iter().filter(|k| map.remove(k).is_some()).count();
            }
            Ok::<_, crate::MetaError>(())
        })?;
        Ok(n)
    }

    fn modify(&self, instance: &str, keys: &[BlockKey], f: &mut Modifier<'_>) -> Result<()> {
        self.locks.for_each_chunk(instance, keys, |chunk| {
            let current = self.get(instance, chunk)?;
            let decisions: Vec<Modify> = chunk
                .iter()
                .zip(current)
                .map(|(&k, cur)| f(k, cur))
                .collect();
            let mut blocks = self.blocks.write();
            let map = blocks.entry(instance.to_owned()).or_default();
            for (k, d) in chunk.iter().zip(decisions) {
                match d {
                    Modify::Keep => {}
                    Modify::Put(m) => {
                        map.insert(*k, BlockMeta { key: *k, ..m });
                    }
                    Modify::Delete => {
                        map.remove(k);
                    }
                }
            }
            Ok(())
        })
    }

    /// In place, without the shard locks: a hit that lands between a
    /// `modify`'s read and its write is lost, which the trait allows for
    /// these hints, and no record is cloned. The write lock is taken per
    /// 1,024 keys (`TOUCH_CHUNK`), so readers wait at most one chunk.
    fn touch(&self, instance: &str, hits: &[AccessHit]) -> Result<()> {
        let merged: Vec<AccessHit> = AccessHit::merge(hits).into_values().collect();
        for chunk in merged.chunks(TOUCH_CHUNK) {
            let mut blocks = self.blocks.write();
            let Some(map) = blocks.get_mut(instance) else {
                return Ok(());
            };
            for h in chunk {
                if let Some(m) = map.get_mut(&h.key) {
                    h.apply(m);
                }
            }
        }
        Ok(())
    }

    fn scan(&self, instance: &str, after: Option<BlockKey>, limit: usize) -> Result<Vec<BlockKey>> {
        let blocks = self.blocks.read();
        let Some(map) = blocks.get(instance) else {
            return Ok(Vec::new());
        };
        let iter: Box<dyn Iterator<Item = &BlockKey>> = match after {
            Some(a) => Box::new(
                map.range((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded))
                    .map(|(k, _)| k),
            ),
            None => Box::new(map.keys()),
        };
        Ok(iter.take(limit).copied().collect())
    }

    fn sample(&self, instance: &str, count: usize) -> Result<Vec<BlockMeta>> {
        let blocks = self.blocks.read();
        let Some(map) = blocks.get(instance) else {
            return Ok(Vec::new());
        };
        let want = count.min(map.len());
        let mut rng = rand::rng();
        let mut picked: BTreeMap<BlockKey, BlockMeta> = BTreeMap::new();
        let mut tries = 0;
        while picked.len() < want && tries < want * 4 + 8 {
            tries += 1;
            let at = BlockKey(rng.random());
            let hit = map.range(at..).next().or_else(|| map.iter().next());
            if let Some((k, m)) = hit {
                picked.entry(*k).or_insert_with(|| m.clone());
            }
        }
        Ok(picked.into_values().collect())
    }

    fn count(&self, instance: &str) -> Result<u64> {
        Ok(self
            .blocks
            .read()
            .get(instance)
            .map_or(0, |m| m.len() as u64))
    }

    fn drop_instance(&self, instance: &str) -> Result<u64> {
        Ok(self
            .blocks
            .write()
            .remove(instance)
            .map_or(0, |m| m.len() as u64))
    }

    fn get_record(&self, kind: RecordKind, name: &str) -> Result<Option<Vec<u8>>> {
        Ok(self
            .records
            .read()
            .get(&(kind.prefix(), name.to_owned()))
            .cloned())
    }

    fn put_record(&self, kind: RecordKind, name: &str, value: &[u8]) -> Result<()> {
        self.records
            .write()
            .insert((kind.prefix(), name.to_owned()), value.to_vec());
        Ok(())
    }

    fn delete_record(&self, kind: RecordKind, name: &str) -> Result<bool> {
        Ok(self
            .records
            .write()
            .remove(&(kind.prefix(), name.to_owned()))
            .is_some())
    }

    fn list_records(&self, kind: RecordKind) -> Result<Vec<(String, Vec<u8>)>> {
        Ok(self
            .records
            .read()
            .iter()
            .filter(|((p, _), _)| *p == kind.prefix())
            .map(|((_, n), v)| (n.clone(), v.clone()))
            .collect())
    }
}
