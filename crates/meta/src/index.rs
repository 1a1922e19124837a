//! The metadata storage seam: [`MetaIndex`].
//!
//! Everything the service persists goes through this trait, so the embedded
//! store ([`RedbIndex`]), the reference model ([`MemoryIndex`]) and the
//! shared Redis/Valkey store ([`RedisIndex`]) are interchangeable and run
//! the same test suite.
//!
//! Block records are keyed by (instance, [`BlockKey`]). Every batch method
//! accepts any number of keys. Read-modify-write ([`MetaIndex::modify`]) is
//! atomic per key against other `modify`/`put`/`delete` calls: keys hash to
//! one of [`ShardLocks`]' shards, a batch is split into chunks of at most
//! `batch_shards` distinct shards, and each chunk locks its shards in
//! ascending order (no deadlock) and releases them before the next chunk
//! (a huge batch does not starve small ones). Reads take no shard lock
//! (Tair KVCM: queries are neither locked nor blocked by locks).
//!
//! Control-plane objects are stored as opaque bytes under a
//! ([`RecordKind`], name) key; the service encodes them.

mod memory;
mod redb;
mod redis;
mod shard;

pub use self::redis::{RedisIndex, RedisIndexConfig, RedisIndexError, RedisLedger, RedisTimeouts};
pub use memory::MemoryIndex;
pub use redb::RedbIndex;
pub use shard::ShardLocks;

use crate::error::Result;
use crate::model::{BlockKey, BlockMeta};

/// What a [`MetaIndex::modify`] modifier decides for one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Modify {
    /// Leave the record as it is (or absent).
    Keep,
    /// Store this record (its key must be the visited key).
    Put(BlockMeta),
    /// Remove the record.
    Delete,
}

/// The kind of a control-plane record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordKind {
    /// [`crate::model::Storage`].
    Storage,
    /// [`crate::model::InstanceGroup`].
    Group,
    /// [`crate::model::Instance`].
    Instance,
    /// [`crate::model::Account`].
    Account,
}

impl RecordKind {
    /// Every kind, for listing.
    pub const ALL: [RecordKind; 4] = [
        RecordKind::Storage,
        RecordKind::Group,
        RecordKind::Instance,
        RecordKind::Account,
    ];

    /// Key prefix in flat key spaces.
    pub fn prefix(self) -> &'static str {
        match self {
            RecordKind::Storage => "storage/",
            RecordKind::Group => "group/",
            RecordKind::Instance => "instance/",
            RecordKind::Account => "account/",
        }
    }
}

/// Modifier callback of [`MetaIndex::modify`]: sees the current record (or
/// `None`) and decides. Called exactly once per distinct key, under that
/// key's shard lock.
pub type Modifier<'a> = dyn FnMut(BlockKey, Option<BlockMeta>) -> Modify + 'a;

/// Reads of one block to record with [`MetaIndex::touch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccessHit {
    /// The block.
    pub key: BlockKey,
    /// The latest read, ms since the Unix epoch.
    pub last_ms: u64,
    /// How many reads.
    pub count: u32,
}

impl AccessHit {
    /// Folds the reads into `m`: the later last access, the summed count.
    pub fn apply(&self, m: &mut BlockMeta) {
        m.last_access_ms = m.last_access_ms.max(self.last_ms);
        m.access_count = m.access_count.saturating_add(self.count);
    }

    /// One entry per key: entries of one key folded together.
    pub fn merge(hits: &[AccessHit]) -> std::collections::HashMap<BlockKey, AccessHit> {
        let mut by_key = std::collections::HashMap::with_capacity(hits.len());
        for h in hits {
            by_key
                .entry(h.key)
                .and_modify(|e: &mut AccessHit| {
                    e.last_ms = e.last_ms.max(h.last_ms);
                    e.count = e.count.saturating_add(h.count);
                })
                .or_insert(*h);
        }
        by_key
    }
}

/// What a leader-only write carries to prove it comes from the current
/// leader: the epoch of the lease it acts under (docs/server.md §9) and a
/// way to ask whether this frontend still acts under it. Get one from
/// [`crate::leader::Elector::fence`].
#[derive(Clone)]
pub struct Fence {
    epoch: u64,
    acting: std::sync::Arc<dyn Fn() -> Option<u64> + Send + Sync>,
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fence").field("epoch", &self.epoch).finish()
    }
}

impl Fence {
    /// A fence for `epoch`; `acting` answers the epoch this frontend acts
    /// under now (`None` when it does not lead).
    pub fn new(epoch: u64, acting: std::sync::Arc<dyn Fn() -> Option<u64> + Send + Sync>) -> Self {
        Fence { epoch, acting }
    }

    /// The lease epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// [`crate::MetaError::NotLeader`] unless this frontend still acts as leader
    /// under the fence's epoch.
    pub fn check(&self) -> Result<()> {
        match (self.acting)() {
            Some(e) if e == self.epoch => Ok(()),
            _ => Err(crate::error::MetaError::NotLeader(self.epoch)),
        }
    }
}

/// Storage of metadata records. Implementations must be safe to share
/// across threads. Calls are synchronous and short (one batch); the
/// durable backend may wait on an fsync.
pub trait MetaIndex: Send + Sync + std::fmt::Debug {
    /// Records for `keys`, in order; `None` where absent.
    fn get(&self, instance: &str, keys: &[BlockKey]) -> Result<Vec<Option<BlockMeta>>>;

    /// Stores `blocks` (overwriting), each under its own key.
    fn put(&self, instance: &str, blocks: &[BlockMeta]) -> Result<()>;

    /// Removes `keys`; returns how many existed.
    fn delete(&self, instance: &str, keys: &[BlockKey]) -> Result<usize>;

    /// Atomic read-modify-write: for each distinct key, calls `f` with the
    /// current record and applies its decision before any other writer sees
    /// the key. Duplicate keys are visited once. A chunk's decisions are
    /// applied all together; on error, earlier chunks stay applied.
    fn modify(&self, instance: &str, keys: &[BlockKey], f: &mut Modifier<'_>) -> Result<()>;

    /// [`MetaIndex::modify`] for a leader-only write (the reclaimer's):
    /// refused with [`crate::MetaError::NotLeader`], changing nothing more,
    /// once `fence` no longer holds. The default checks the fence before
    /// each call, which suffices for an index only this process writes
    /// (memory, embedded); a shared index also refuses, on its server, a
    /// commit that lands after another frontend took the lease.
    fn modify_fenced(
        &self,
        instance: &str,
        keys: &[BlockKey],
        fence: &Fence,
        f: &mut Modifier<'_>,
    ) -> Result<()> {
        fence.check()?;
        self.modify(instance, keys, f)
    }

    /// Records reads (`hits`, one entry per key: the latest read and how
    /// many) into last access and access count. Access statistics are
    /// hints for eviction: a backend may apply them without waiting for
    /// durability (and should: the service applies them in large batches),
    /// and a crash may lose recent ones. Absent keys are ignored; a key
    /// listed twice counts twice.
    fn touch(&self, instance: &str, hits: &[AccessHit]) -> Result<()> {
        let merged = AccessHit::merge(hits);
        let keys: Vec<BlockKey> = merged.keys().copied().collect();
        self.modify(
            instance,
            &keys,
            &mut |key, cur| match (cur, merged.get(&key)) {
                (Some(mut m), Some(h)) => {
                    h.apply(&mut m);
                    Modify::Put(m)
                }
                _ => Modify::Keep,
            },
        )
    }

    /// Up to `limit` keys of `instance` greater than `after` (all when
    /// `None`), ascending. Page with the last key returned.
    fn scan(&self, instance: &str, after: Option<BlockKey>, limit: usize) -> Result<Vec<BlockKey>>;

    /// Up to `count` distinct records picked at random (for the reclaimer;
    /// not necessarily uniform: each pick is the first key at or after a
    /// random point).
    fn sample(&self, instance: &str, count: usize) -> Result<Vec<BlockMeta>>;

    /// Number of block records of `instance`.
    fn count(&self, instance: &str) -> Result<u64>;

    /// Removes every block record of `instance`; returns how many.
    fn drop_instance(&self, instance: &str) -> Result<u64>;

    /// A control-plane record.
    fn get_record(&self, kind: RecordKind, name: &str) -> Result<Option<Vec<u8>>>;

    /// Stores a control-plane record (overwriting).
    fn put_record(&self, kind: RecordKind, name: &str, value: &[u8]) -> Result<()>;

    /// Removes a control-plane record; returns whether it existed.
    fn delete_record(&self, kind: RecordKind, name: &str) -> Result<bool>;

    /// Every record of `kind` as (name, value), by name.
    fn list_records(&self, kind: RecordKind) -> Result<Vec<(String, Vec<u8>)>>;

    /// Why this index refuses writes now (its disk is full, or a write
    /// failed and it has not recovered), or `None` when it takes them.
    /// Reads are served either way. A backend may try a write to find out
    /// whether the cause is gone, so this can clear a fault. The default
    /// (backends that refuse nothing on their own) is `None`.
    fn write_fault(&self) -> Option<String> {
        None
    }
}
