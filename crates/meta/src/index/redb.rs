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
//!
//! A failed write (a full disk, an I/O error) leaves redb's handle
//! poisoned: every later call answers "previous I/O error" until the
//! database is closed and opened again. So [`RedbIndex`] reopens the file
//! as soon as a call fails that way (redb repairs it from the last commit)
//! and serves reads from the fresh handle; writes are refused with
//! [`MetaError::StoreUnwritable`] until one succeeds again. While refused,
//! a write is tried for real at most once per backoff interval (200 ms,
//! doubling up to 5 s), and only when the file system has at least 1 MiB
//! free, so a full disk does not make every request pay for a failing
//! fsync and a reopen. A file opened on a file system with less than that
//! free starts with writes refused.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use rand::Rng;
use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
};

use super::{AccessHit, MetaIndex, Modifier, Modify, RecordKind, ShardLocks};
use crate::codec::{decode_block, encode_block};
use crate::error::{MetaError, Result};
use crate::model::{BlockKey, BlockMeta};

const RECORDS: TableDefinition<'static, &str, &[u8]> = TableDefinition::new("records");

/// Where [`MetaIndex::write_fault`] writes to find out whether the store
/// takes writes again: one record, rewritten by each probe.
const PROBE: TableDefinition<'static, u64, &[u8]> = TableDefinition::new("write_probe");

/// Bytes of a probe record: a page's worth, so the probe needs the same
/// room on disk a small real write does.
const PROBE_BYTES: usize = 4096;

/// First wait before a refused write is tried for real again.
const RETRY_FIRST: Duration = Duration::from_millis(200);

/// Longest wait between real tries while writes are refused.
const RETRY_MAX: Duration = Duration::from_secs(5);

/// Free bytes the file system must have before a refused write is tried
/// for real again (and for writes to be taken at open): below it a try
/// would only fail and poison the handle once more.
const MIN_FREE_BYTES: u64 = 1 << 20;

fn table_name(instance: &str) -> String {
    format!("b/{instance}")
}

fn blocks_def(name: &str) -> TableDefinition<'_, u64, &'static [u8]> {
    TableDefinition::new(name)
}

fn record_key(kind: RecordKind, name: &str) -> String {
    format!("{}{name}", kind.prefix())
}

/// Every redb failure as one [`redb::Error`] inside [`MetaError::Backend`],
/// so [`storage_failure`] can tell a failed disk from a bad record.
fn db_err(e: impl Into<redb::Error>) -> MetaError {
    MetaError::backend(e.into())
}

/// Why `e` means the file (not the request) failed: an I/O error, or a
/// handle poisoned or closed by an earlier one. `None` for anything else.
fn storage_failure(e: &MetaError) -> Option<String> {
    let MetaError::Backend(inner) = e else {
        return None;
    };
    match inner.downcast_ref::<redb::Error>()? {
        redb::Error::Io(io) => Some(io.to_string()),
        redb::Error::PreviousIo => Some("an earlier write to the file failed".into()),
        redb::Error::DatabaseClosed => Some("the database file is not open".into()),
        _ => None,
    }
}

/// Why writes are refused, and when to try one for real again.
#[derive(Debug)]
struct WriteFault {
    reason: String,
    retry_at: Instant,
    backoff: Duration,
}

/// The open database and how many times it was opened, so concurrent
/// callers that saw the same failure reopen it once.
#[derive(Debug)]
struct Handle {
    db: Option<Database>,
    generation: u64,
}

/// redb-backed [`MetaIndex`].
#[derive(Debug)]
pub struct RedbIndex {
    path: PathBuf,
    cache_bytes: usize,
    /// Every call holds the read side for its duration; a reopen takes the
    /// write side, so it waits for calls on the poisoned handle to finish
    /// (redb's file lock allows one handle at a time).
    handle: RwLock<Handle>,
    /// Set while writes are refused.
    fault: Mutex<Option<WriteFault>>,
    locks: ShardLocks,
}

impl RedbIndex {
    /// Opens (or creates) the database file at `path`, with redb's page
    /// cache capped at `cache_bytes`. An existing file opens even when its
    /// disk is full: it then serves reads and refuses writes until there is
    /// room again.
    pub fn open(path: impl AsRef<Path>, cache_bytes: usize) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let db = open_db(&path, cache_bytes)?;
        let index = RedbIndex {
            path,
            cache_bytes,
            handle: RwLock::new(Handle {
                db: Some(db),
                generation: 0,
            }),
            fault: Mutex::new(None),
            locks: ShardLocks::default(),
        };
        index.create_records_table()?;
        if let Some(why) = index.no_room() {
            index.record_fault(why);
        }
        Ok(index)
    }

    /// Why the file system of the database has no room for a write (less
    /// than [`MIN_FREE_BYTES`] free), or `None` when it has, or when that
    /// cannot be read (a try will tell).
    fn no_room(&self) -> Option<String> {
        let dir = match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let v = rustix::fs::statvfs(dir).ok()?;
        let free = v.f_bavail.saturating_mul(v.f_frsize);
        (free < MIN_FREE_BYTES).then(|| {
            format!(
                "no space left on device ({free} bytes free on the file system of {}, {MIN_FREE_BYTES} needed)",
                self.path.display()
            )
        })
    }

    /// Creates the records table of a new file. An existing file has it
    /// already and needs no write (its disk may be full).
    fn create_records_table(&self) -> Result<()> {
        let exists = self.read(|db| {
            let txn = db.begin_read().map_err(db_err)?;
            match txn.open_table(RECORDS) {
                Ok(_) => Ok(true),
                Err(redb::TableError::TableDoesNotExist(_)) => Ok(false),
                Err(e) => Err(db_err(e)),
            }
        })?;
        if exists {
            return Ok(());
        }
        self.write(|db| {
            let txn = db.begin_write().map_err(db_err)?;
            txn.open_table(RECORDS).map_err(db_err)?;
            txn.commit().map_err(db_err)
        })
    }

    /// Runs `f` on the open database; `Err` with the generation seen when
    /// none is open.
    fn with_db<T>(&self, f: impl FnOnce(&Database) -> Result<T>) -> (u64, Result<T>) {
        let handle = self.handle.read();
        let result = match &handle.db {
            Some(db) => f(db),
            None => Err(db_err(redb::StorageError::DatabaseClosed)),
        };
        (handle.generation, result)
    }

    /// A read. When the file failed under it (or an earlier write left the
    /// handle poisoned), reopens the database and reads once more: a failed
    /// write never makes reads fail.
    fn read<T>(&self, f: impl Fn(&Database) -> Result<T>) -> Result<T> {
        match self.with_db(&f) {
            (seen, Err(e)) if storage_failure(&e).is_some() => {
                self.reopen(seen);
                self.with_db(&f).1
            }
            (_, result) => result,
        }
    }

    /// A write. Refused up front while writes are failing and no retry is
    /// due; when the file fails under it, records why, reopens the
    /// database for reads and answers [`MetaError::StoreUnwritable`].
    fn write<T>(&self, f: impl FnOnce(&Database) -> Result<T>) -> Result<T> {
        self.admit_write()?;
        let (seen, result) = self.with_db(f);
        match &result {
            Ok(_) => self.clear_fault(),
            Err(e) => {
                if let Some(reason) = storage_failure(e) {
                    let reason = self.record_fault(reason);
                    self.reopen(seen);
                    return Err(MetaError::StoreUnwritable(reason));
                }
            }
        }
        result
    }

    /// `Err` while writes are refused and the next real try is not due
    /// (or the disk still has no room); otherwise lets this write be the
    /// try (and holds others back until it has answered).
    fn admit_write(&self) -> Result<()> {
        let mut fault = self.fault.lock();
        let Some(f) = fault.as_mut() else {
            return Ok(());
        };
        let now = Instant::now();
        if now < f.retry_at {
            return Err(MetaError::StoreUnwritable(f.reason.clone()));
        }
        f.retry_at = now + f.backoff;
        if self.no_room().is_some() {
            return Err(MetaError::StoreUnwritable(f.reason.clone()));
        }
        Ok(())
    }

    /// Notes a failed write and backs off; returns the reason to report
    /// (the first failure's: later ones only say the handle is poisoned).
    fn record_fault(&self, reason: String) -> String {
        let mut fault = self.fault.lock();
        let now = Instant::now();
        match fault.as_mut() {
            Some(f) => {
                f.backoff = (f.backoff * 2).min(RETRY_MAX);
                f.retry_at = now + f.backoff;
                f.reason.clone()
            }
            None => {
                tracing::error!(path = %self.path.display(), reason, "metadata index cannot write; serving reads only");
                *fault = Some(WriteFault {
                    reason: reason.clone(),
                    retry_at: now + RETRY_FIRST,
                    backoff: RETRY_FIRST,
                });
                reason
            }
        }
    }

    fn clear_fault(&self) {
        if self.fault.lock().take().is_some() {
            tracing::info!(path = %self.path.display(), "metadata index writes again");
        }
    }

    /// Closes the database and opens it again (redb recovers it from the
    /// last commit), unless another caller already did since generation
    /// `seen`. A failed open leaves none open; the next call tries again.
    fn reopen(&self, seen: u64) {
        let mut handle = self.handle.write();
        if handle.generation != seen {
            return;
        }
        // The old handle holds the file lock: drop it before opening.
        handle.db = None;
        handle.generation += 1;
        match open_db(&self.path, self.cache_bytes) {
            Ok(db) => handle.db = Some(db),
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "reopening the metadata index failed");
            }
        }
    }

    /// One durable write of a probe record: whether the store takes writes.
    fn probe_write(&self) -> Result<()> {
        let data: Vec<u8> = (0..PROBE_BYTES).map(|_| rand::random::<u8>()).collect();
        self.write(|db| {
            let txn = db.begin_write().map_err(db_err)?;
            txn.open_table(PROBE)
                .map_err(db_err)?
                .insert(0, data.as_slice())
                .map_err(db_err)?;
            txn.commit().map_err(db_err)
        })
    }

    fn write_chunk(
        &self,
        instance: &str,
        f: impl FnOnce(&mut redb::Table<'_, u64, &'static [u8]>) -> Result<bool>,
    ) -> Result<()> {
        self.write_chunk_with(instance, Durability::Immediate, f)
    }

    /// One write transaction on `instance`'s table. `f` says whether it
    /// changed anything; a transaction that changed nothing is not
    /// committed (no fsync, and nothing to write on a full disk).
    fn write_chunk_with(
        &self,
        instance: &str,
        durability: Durability,
        f: impl FnOnce(&mut redb::Table<'_, u64, &'static [u8]>) -> Result<bool>,
    ) -> Result<()> {
        let name = table_name(instance);
        self.write(|db| {
            let mut txn = db.begin_write().map_err(db_err)?;
            txn.set_durability(durability).map_err(db_err)?;
            let changed = {
                let mut table = txn.open_table(blocks_def(&name)).map_err(db_err)?;
                f(&mut table)?
            };
            if changed {
                txn.commit().map_err(db_err)
            } else {
                txn.abort().map_err(db_err)
            }
        })
    }

    fn read_table<T>(
        &self,
        instance: &str,
        empty: T,
        f: impl Fn(&redb::ReadOnlyTable<u64, &'static [u8]>) -> Result<T>,
    ) -> Result<T>
    where
        T: Clone,
    {
        let name = table_name(instance);
        self.read(|db| {
            let txn = db.begin_read().map_err(db_err)?;
            match txn.open_table(blocks_def(&name)) {
                Ok(table) => f(&table),
                Err(redb::TableError::TableDoesNotExist(_)) => Ok(empty.clone()),
                Err(e) => Err(db_err(e)),
            }
        })
    }
}

fn open_db(path: &Path, cache_bytes: usize) -> Result<Database> {
    Database::builder()
        .set_cache_size(cache_bytes)
        .create(path)
        .map_err(db_err)
}

impl MetaIndex for RedbIndex {
    fn get(&self, instance: &str, keys: &[BlockKey]) -> Result<Vec<Option<BlockMeta>>> {
        self.read_table(instance, vec![None; keys.len()], |t| {
            keys.iter()
                .map(|&k| match t.get(k.0).map_err(db_err)? {
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
                        t.insert(k.0, encode_block(m).as_slice()).map_err(db_err)?;
                    }
                }
                Ok(true)
            })
        })
    }

    fn delete(&self, instance: &str, keys: &[BlockKey]) -> Result<usize> {
        let mut n = 0;
        self.locks.for_each_chunk(instance, keys, |chunk| {
            let mut removed = 0;
            self.write_chunk(instance, |t| {
                for k in chunk {
                    if t.remove(k.0).map_err(db_err)?.is_some() {
                        removed += 1;
                    }
                }
                Ok(removed > 0)
            })?;
            // Counted once committed: a refused chunk removed nothing.
            n += removed;
            Ok::<_, MetaError>(())
        })?;
        Ok(n)
    }

    fn modify(&self, instance: &str, keys: &[BlockKey], f: &mut Modifier<'_>) -> Result<()> {
        self.locks.for_each_chunk(instance, keys, |chunk| {
            self.write_chunk(instance, |t| {
                let mut changed = false;
                for &k in chunk {
                    let cur = match t.get(k.0).map_err(db_err)? {
                        Some(v) => Some(decode_block(k, v.value())?),
                        None => None,
                    };
                    match f(k, cur) {
                        Modify::Keep => {}
                        Modify::Put(m) => {
                            let m = BlockMeta { key: k, ..m };
                            t.insert(k.0, encode_block(&m).as_slice()).map_err(db_err)?;
                            changed = true;
                        }
                        Modify::Delete => {
                            t.remove(k.0).map_err(db_err)?;
                            changed = true;
                        }
                    }
                }
                Ok(changed)
            })
        })
    }

    /// Applied without fsync (`Durability::None`): the next durable commit
    /// persists it; a crash before that loses only access statistics.
    fn touch(&self, instance: &str, hits: &[AccessHit]) -> Result<()> {
        let merged = AccessHit::merge(hits);
        let keys: Vec<BlockKey> = merged.keys().copied().collect();
        self.locks.for_each_chunk(instance, &keys, |chunk| {
            self.write_chunk_with(instance, Durability::None, |t| {
                let mut changed = false;
                for h in chunk.iter().filter_map(|k| merged.get(k)) {
                    let mut m = match t.get(h.key.0).map_err(db_err)? {
                        Some(v) => decode_block(h.key, v.value())?,
                        None => continue,
                    };
                    h.apply(&mut m);
                    t.insert(h.key.0, encode_block(&m).as_slice())
                        .map_err(db_err)?;
                    changed = true;
                }
                Ok(changed)
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
            .map_err(db_err)?;
            let mut out = Vec::new();
            for item in range.take(limit) {
                let (k, _) = item.map_err(db_err)?;
                out.push(BlockKey(k.value()));
            }
            Ok(out)
        })
    }

    fn sample(&self, instance: &str, count: usize) -> Result<Vec<BlockMeta>> {
        self.read_table(instance, Vec::new(), |t| {
            let len = t.len().map_err(db_err)? as usize;
            let want = count.min(len);
            let mut rng = rand::rng();
            let mut picked = std::collections::BTreeMap::new();
            let mut tries = 0;
            while picked.len() < want && tries < want * 4 + 8 {
                tries += 1;
                let at: u64 = rng.random();
                let hit = match t.range(at..).map_err(db_err)?.next() {
                    Some(item) => Some(item.map_err(db_err)?),
                    None => t.first().map_err(db_err)?,
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
        self.read_table(instance, 0, |t| t.len().map_err(db_err))
    }

    fn drop_instance(&self, instance: &str) -> Result<u64> {
        let n = self.count(instance)?;
        let name = table_name(instance);
        self.write(|db| {
            let txn = db.begin_write().map_err(db_err)?;
            txn.delete_table(blocks_def(&name)).map_err(db_err)?;
            txn.commit().map_err(db_err)
        })?;
        Ok(n)
    }

    fn get_record(&self, kind: RecordKind, name: &str) -> Result<Option<Vec<u8>>> {
        let key = record_key(kind, name);
        self.read(|db| {
            let txn = db.begin_read().map_err(db_err)?;
            let t = txn.open_table(RECORDS).map_err(db_err)?;
            Ok(t.get(key.as_str())
                .map_err(db_err)?
                .map(|v| v.value().to_vec()))
        })
    }

    fn put_record(&self, kind: RecordKind, name: &str, value: &[u8]) -> Result<()> {
        let key = record_key(kind, name);
        self.write(|db| {
            let txn = db.begin_write().map_err(db_err)?;
            {
                let mut t = txn.open_table(RECORDS).map_err(db_err)?;
                t.insert(key.as_str(), value).map_err(db_err)?;
            }
            txn.commit().map_err(db_err)
        })
    }

    fn delete_record(&self, kind: RecordKind, name: &str) -> Result<bool> {
        let key = record_key(kind, name);
        self.write(|db| {
            let txn = db.begin_write().map_err(db_err)?;
            let existed = {
                let mut t = txn.open_table(RECORDS).map_err(db_err)?;
                t.remove(key.as_str()).map_err(db_err)?.is_some()
            };
            txn.commit().map_err(db_err)?;
            Ok(existed)
        })
    }

    fn list_records(&self, kind: RecordKind) -> Result<Vec<(String, Vec<u8>)>> {
        self.read(|db| {
            let txn = db.begin_read().map_err(db_err)?;
            let t = txn.open_table(RECORDS).map_err(db_err)?;
            let mut out = Vec::new();
            for item in t.range(kind.prefix()..).map_err(db_err)? {
                let (k, v) = item.map_err(db_err)?;
                let Some(name) = k.value().strip_prefix(kind.prefix()) else {
                    break;
                };
                out.push((name.to_owned(), v.value().to_vec()));
            }
            Ok(out)
        })
    }

    /// While writes are refused: when a real try is due, writes a probe
    /// record, so the fault clears once the disk has room even when no
    /// client writes.
    fn write_fault(&self) -> Option<String> {
        if self.fault.lock().is_none() || self.probe_write().is_ok() {
            return None;
        }
        self.fault.lock().as_ref().map(|f| f.reason.clone())
    }
}
