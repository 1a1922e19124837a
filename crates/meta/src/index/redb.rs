//! [`RedbIndex`]: the embedded, durable backend on redb.
//!
//! Why redb over fjall: the metadata service is read-mostly (every request
//! matches a prefix; writes are one per new block), and redb's B-tree gives
//! faster point reads than an LSM, in one file, with no background
//! compaction threads and no dependencies of its own (cheap to build).
//! fjall writes faster; if write-heavy clusters need it, it fits the same
//! trait.
//!
//! Layout: one table per instance, `b/<instance>`, key `u64` block key,
//! value the [`crate::codec`] encoding; one table `records` keyed by
//! `<kind prefix><name>` for control-plane records. Every mutating call is
//! one write transaction per lock chunk, committed with
//! `Durability::Immediate` (fsync) before it returns, except access
//! statistics ([`MetaIndex::touch`]), which skip the fsync.

use std::path::Path;

use rand::Rng;
use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
};

use super::{MetaIndex, Modifier, Modify, RecordKind, ShardLocks};
use crate::codec::{decode_block, encode_block};
use crate::error::{MetaError, Result};
use crate::model::{BlockKey, BlockMeta};

const RECORDS: TableDefinition<'static, &str, &[u8]> = TableDefinition::new("records");

fn table_name(instance: &str) -> String {
    format!("b/{instance}")
}

fn blocks_def(name: &str) -> TableDefinition<'_, u64, &'static [u8]> {
    TableDefinition::new(name)
}

fn record_key(kind: RecordKind, name: &str) -> String {
    format!("{}{name}", kind.prefix())
}

/// redb-backed [`MetaIndex`].
#[derive(Debug)]
pub struct RedbIndex {
    db: Database,
    locks: ShardLocks,
}

impl RedbIndex {
    /// Opens (or creates) the database file at `path`, with redb's page
    /// cache capped at `cache_bytes`.
    pub fn open(path: impl AsRef<Path>, cache_bytes: usize) -> Result<Self> {
        let db = Database::builder()
            .set_cache_size(cache_bytes)
            .create(path)
            .map_err(MetaError::backend)?;
        let txn = db.begin_write().map_err(MetaError::backend)?;
        txn.open_table(RECORDS).map_err(MetaError::backend)?;
        txn.commit().map_err(MetaError::backend)?;
        Ok(RedbIndex {
            db,
            locks: ShardLocks::default(),
        })
    }

    fn write_chunk(
        &self,
        instance: &str,
        f: impl FnOnce(&mut redb::Table<'_, u64, &'static [u8]>) -> Result<()>,
    ) -> Result<()> {
        self.write_chunk_with(instance, Durability::Immediate, f)
    }

    fn write_chunk_with(
        &self,
        instance: &str,
        durability: Durability,
        f: impl FnOnce(&mut redb::Table<'_, u64, &'static [u8]>) -> Result<()>,
    ) -> Result<()> {
        let name = table_name(instance);
        let mut txn = self.db.begin_write().map_err(MetaError::backend)?;
        txn.set_durability(durability).map_err(MetaError::backend)?;
        {
            let mut table = txn
                .open_table(blocks_def(&name))
                .map_err(MetaError::backend)?;
            f(&mut table)?;
        }
        txn.commit().map_err(MetaError::backend)
    }

    fn read_table<T>(
        &self,
        instance: &str,
        empty: T,
        f: impl FnOnce(&redb::ReadOnlyTable<u64, &'static [u8]>) -> Result<T>,
    ) -> Result<T> {
        let name = table_name(instance);
        let txn = self.db.begin_read().map_err(MetaError::backend)?;
        match txn.open_table(blocks_def(&name)) {
            Ok(table) => f(&table),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(empty),
            Err(e) => Err(MetaError::backend(e)),
        }
    }
}

impl MetaIndex for RedbIndex {
    fn get(&self, instance: &str, keys: &[BlockKey]) -> Result<Vec<Option<BlockMeta>>> {
        self.read_table(instance, vec![None; keys.len()], |t| {
            keys.iter()
                .map(|&k| match t.get(k.0).map_err(MetaError::backend)? {
                    Some(v) => decode_block(k, v.value()).map(Some),
                    None => Ok(None),
                })
                .collect()
        })
    }

    fn put(&self, instance: &str, metas: &[BlockMeta]) -> Result<()> {
        let keys: Vec<BlockKey> = metas.iter().map(|m| m.key).collect();
        let by_key: std::collections::HashMap<BlockKey, &BlockMeta> =
            metas.iter().map(|m| (m.key, m)).collect();
        self.locks.for_each_chunk(instance, &keys, |chunk| {
            self.write_chunk(instance, |t| {
                for k in chunk {
                    if let Some(m) = by_key.get(k) {
                        t.insert(k.0, encode_block(m).as_slice())
                            .map_err(MetaError::backend)?;
                    }
                }
                Ok(())
            })
        })
    }

    fn delete(&self, instance: &str, keys: &[BlockKey]) -> Result<usize> {
        let mut n = 0;
        self.locks.for_each_chunk(instance, keys, |chunk| {
            self.write_chunk(instance, |t| {
                for k in chunk {
                    if t.remove(k.0).map_err(MetaError::backend)?.is_some() {
                        n += 1;
                    }
                }
                Ok(())
            })
        })?;
        Ok(n)
    }

    fn modify(&self, instance: &str, keys: &[BlockKey], f: &mut Modifier<'_>) -> Result<()> {
        self.locks.for_each_chunk(instance, keys, |chunk| {
            self.write_chunk(instance, |t| {
                for &k in chunk {
                    let cur = match t.get(k.0).map_err(MetaError::backend)? {
                        Some(v) => Some(decode_block(k, v.value())?),
                        None => None,
                    };
                    match f(k, cur) {
                        Modify::Keep => {}
                        Modify::Put(m) => {
                            let m = BlockMeta { key: k, ..m };
                            t.insert(k.0, encode_block(&m).as_slice())
                                .map_err(MetaError::backend)?;
                        }
                        Modify::Delete => {
                            t.remove(k.0).map_err(MetaError::backend)?;
                        }
                    }
                }
                Ok(())
            })
        })
    }

    /// Applied without fsync (`Durability::None`): the next durable commit
    /// persists it; a crash before that loses only access statistics.
    fn touch(&self, instance: &str, keys: &[BlockKey], now_ms: u64) -> Result<()> {
        self.locks.for_each_chunk(instance, keys, |chunk| {
            self.write_chunk_with(instance, Durability::None, |t| {
                for &k in chunk {
                    let cur = match t.get(k.0).map_err(MetaError::backend)? {
                        Some(v) => decode_block(k, v.value())?,
                        None => continue,
                    };
                    let m = BlockMeta {
                        last_access_ms: cur.last_access_ms.max(now_ms),
                        access_count: cur.access_count.saturating_add(1),
                        ..cur
                    };
                    t.insert(k.0, encode_block(&m).as_slice())
                        .map_err(MetaError::backend)?;
                }
                Ok(())
            })
        })
    }

    fn scan(&self, instance: &str, after: Option<BlockKey>, limit: usize) -> Result<Vec<BlockKey>> {
        self.read_table(instance, Vec::new(), |t| {
            let range = match after {
                Some(BlockKey(u64::MAX)) => return Ok(Vec::new()),
                Some(a) => t.range(a.0 + 1..),
                None => t.range(0..),
            }
            .map_err(MetaError::backend)?;
            let mut out = Vec::new();
            for item in range.take(limit) {
                let (k, _) = item.map_err(MetaError::backend)?;
                out.push(BlockKey(k.value()));
            }
            Ok(out)
        })
    }

    fn sample(&self, instance: &str, count: usize) -> Result<Vec<BlockMeta>> {
        self.read_table(instance, Vec::new(), |t| {
            let len = t.len().map_err(MetaError::backend)? as usize;
            let want = count.min(len);
            let mut rng = rand::rng();
            let mut picked = std::collections::BTreeMap::new();
            let mut tries = 0;
            while picked.len() < want && tries < want * 4 + 8 {
                tries += 1;
                let at: u64 = rng.random();
                let hit = match t.range(at..).map_err(MetaError::backend)?.next() {
                    Some(item) => Some(item.map_err(MetaError::backend)?),
                    None => t.first().map_err(MetaError::backend)?,
                };
                if let Some((k, v)) = hit {
                    let key = BlockKey(k.value());
                    if let std::collections::btree_map::Entry::Vacant(e) = picked.entry(key) {
                        e.insert(decode_block(key, v.value())?);
                    }
                }
            }
            Ok(picked.into_values().collect())
        })
    }

    fn count(&self, instance: &str) -> Result<u64> {
        self.read_table(instance, 0, |t| t.len().map_err(MetaError::backend))
    }

    fn drop_instance(&self, instance: &str) -> Result<u64> {
        let n = self.count(instance)?;
        let name = table_name(instance);
        let txn = self.db.begin_write().map_err(MetaError::backend)?;
        txn.delete_table(blocks_def(&name))
            .map_err(MetaError::backend)?;
        txn.commit().map_err(MetaError::backend)?;
        Ok(n)
    }

    fn get_record(&self, kind: RecordKind, name: &str) -> Result<Option<Vec<u8>>> {
        let txn = self.db.begin_read().map_err(MetaError::backend)?;
        let t = txn.open_table(RECORDS).map_err(MetaError::backend)?;
        Ok(t.get(record_key(kind, name).as_str())
            .map_err(MetaError::backend)?
            .map(|v| v.value().to_vec()))
    }

    fn put_record(&self, kind: RecordKind, name: &str, value: &[u8]) -> Result<()> {
        let txn = self.db.begin_write().map_err(MetaError::backend)?;
        {
            let mut t = txn.open_table(RECORDS).map_err(MetaError::backend)?;
            t.insert(record_key(kind, name).as_str(), value)
                .map_err(MetaError::backend)?;
        }
        txn.commit().map_err(MetaError::backend)
    }

    fn delete_record(&self, kind: RecordKind, name: &str) -> Result<bool> {
        let txn = self.db.begin_write().map_err(MetaError::backend)?;
        let existed = {
            let mut t = txn.open_table(RECORDS).map_err(MetaError::backend)?;
            t.remove(record_key(kind, name).as_str())
                .map_err(MetaError::backend)?
                .is_some()
        };
        txn.commit().map_err(MetaError::backend)?;
        Ok(existed)
    }

    fn list_records(&self, kind: RecordKind) -> Result<Vec<(String, Vec<u8>)>> {
        let txn = self.db.begin_read().map_err(MetaError::backend)?;
        let t = txn.open_table(RECORDS).map_err(MetaError::backend)?;
        let mut out = Vec::new();
        for item in t.range(kind.prefix()..).map_err(MetaError::backend)? {
            let (k, v) = item.map_err(MetaError::backend)?;
            let Some(name) = k.value().strip_prefix(kind.prefix()) else {
                break;
            };
            out.push((name.to_owned(), v.value().to_vec()));
        }
        Ok(out)
    }
}
