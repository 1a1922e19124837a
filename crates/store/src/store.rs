//! [`Store`]: put, get and remove over DRAM and disk.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kvtier_core::{BlockHash, BlockSums, Config, Geometry, Lookup};
use kvtier_disk::{DiskTier, DiskTierConfig};
use kvtier_io::{AlignedBuf, IoEngine};
use kvtier_mem::{MemoryTier, MemoryTierConfig, PutOutcome, Reserve};
use tokio::sync::Notify;

use crate::StoreError;
use crate::demote::Demoter;
use crate::read_target::ReadTarget;
use crate::stats::{StoreCounters, StoreStats};

/// Which tier served a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    /// G2, host DRAM.
    Memory,
    /// G3, local disk.
    Disk,
}

/// Tuning of the store itself (the tiers have their own configuration).
#[derive(Debug, Clone, Copy)]
pub struct StoreOptions {
    /// Blocks written behind per disk batch. Default: 32.
    pub demote_batch: usize,
    /// Fraction of DRAM slots the demoter keeps free so puts rarely wait.
    /// Default: 0.1.
    pub free_target: f64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            demote_batch: 32,
            free_target: 0.1,
        }
    }
}

pub(crate) struct Inner {
    pub(crate) geometry: Geometry,
    // Field order is drop order: the disk tier and the engine go before the
    // memory tier, whose arena is registered with the engine, so the arena
    // outlives every user of that registration.
    pub(crate) disk: Option<DiskTier>,
    pub(crate) engine: Option<Arc<dyn IoEngine>>,
    pub(crate) memory: MemoryTier,
    pub(crate) counters: StoreCounters,
    pub(crate) options: StoreOptions,
    /// Serialises write-behind rounds so two callers never write the same
    /// candidates twice.
    pub(crate) demote_lock: tokio::sync::Mutex<()>,
    /// Wakes the background demoter when free slots run low.
    pub(crate) wake_demoter: Notify,
    pub(crate) closed: AtomicBool,
    /// Tells the demoter task to finish.
    pub(crate) demoter_stop: AtomicBool,
}

/// The node's block store over DRAM and disk. Cheap to clone; all clones
/// share one store.
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<Inner>,
    demoter: Arc<Demoter>,
}

impl Store {
    /// Builds the store from a whole configuration: the I/O engine, the
    /// shared-memory arena and the disk tier (recovering what the disk
    /// holds). Must be called inside a tokio runtime (the demoter is a task).
    pub async fn open(config: &Config) -> Result<Self, StoreError> {
        let geometry = config.geometry.resolve()?;
        let memory = MemoryTier::create(MemoryTierConfig::new(&config.memory, &geometry))?;
        let engine = kvtier_io::build_engine(
            config.disk.io_engine,
            config.disk.queue_depth,
            config.disk.psync_threads,
        )?;
        if config.disk.register_buffers {
            let (ptr, len) = memory.arena();
            // SAFETY: the arena stays mapped while `memory` lives, and the
            // store keeps `memory` alive as long as the engine (both in Inner;
            // the engine is dropped with the store, after the last I/O).
            unsafe { engine.register_memory(ptr, len) };
        }
        let disk_cfg = DiskTierConfig::new(&config.disk, config.disk_dirs(), geometry);
        let disk_engine = engine.clone();
        let disk = tokio::task::spawn_blocking(move || DiskTier::open(disk_cfg, disk_engine))
            .await
            .map_err(|_| StoreError::Closed)??;
        Ok(Self::from_parts(
            geometry,
            memory,
            Some((disk, engine)),
            StoreOptions::default(),
        ))
    }

    /// Builds a store from tiers made by the caller (tests, benchmarks).
    /// Without a disk tier, DRAM evicts its coldest blocks when full. Must
    /// be called inside a tokio runtime (the demoter is a task).
    pub fn from_parts(
        geometry: Geometry,
        memory: MemoryTier,
        disk: Option<(DiskTier, Arc<dyn IoEngine>)>,
        options: StoreOptions,
    ) -> Self {
        let (disk, engine) = match disk {
            Some((d, e)) => (Some(d), Some(e)),
            None => (None, None),
        };
        let inner = Arc::new(Inner {
            geometry,
            memory,
            disk,
            engine,
            counters: StoreCounters::default(),
            options,
            demote_lock: tokio::sync::Mutex::new(()),
            wake_demoter: Notify::new(),
            closed: AtomicBool::new(false),
            demoter_stop: AtomicBool::new(false),
        });
        let demoter = Arc::new(Demoter::start(inner.clone()));
        Self { inner, demoter }
    }

    /// The block geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.inner.geometry
    }

    /// The memory tier.
    pub fn memory(&self) -> &MemoryTier {
        &self.inner.memory
    }

    /// The disk tier, if any.
    pub fn disk(&self) -> Option<&DiskTier> {
        self.inner.disk.as_ref()
    }

    fn block_len(&self) -> usize {
        self.inner.geometry.block_bytes() as usize
    }

    fn check_open(&self) -> Result<(), StoreError> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(StoreError::Closed);
        }
        Ok(())
    }

    /// Stores a block in DRAM; returns once it is readable. Computes the
    /// block's checksums here; they travel with it to every tier.
    pub async fn put(&self, key: BlockHash, data: &[u8]) -> Result<(), StoreError> {
        self.check_open()?;
        if data.len() != self.block_len() {
            return Err(StoreError::WrongLength {
                got: data.len(),
                want: self.block_len(),
            });
        }
        let sums = BlockSums::compute(key, self.inner.geometry.layer_bytes() as usize, data);
        self.put_with_sums(key, data, &sums).await
    }

    async fn put_with_sums(
        &self,
        key: BlockHash,
        data: &[u8],
        sums: &BlockSums,
    ) -> Result<(), StoreError> {
        let inner = &self.inner;
        loop {
            match inner.memory.put(key, data, sums)? {
                PutOutcome::Stored => {
                    StoreCounters::add(&inner.counters.puts, 1);
                    StoreCounters::add(&inner.counters.put_bytes, data.len() as u64);
                    // DRAM may drop the block when it needs room if the disk
                    // already has it, or if there is no lower tier at all.
                    if inner.disk.as_ref().is_none_or(|d| d.contains(key)) {
                        inner.memory.set_persisted(key, true);
                    }
                    self.maybe_wake_demoter();
                    return Ok(());
                }
                PutOutcome::AlreadyPresent => return Ok(()),
                PutOutcome::Full => {
                    if !self.make_room(1).await? {
                        return Err(StoreError::Full);
                    }
                }
            }
        }
    }

    /// Stores many blocks; one result per block.
    pub async fn put_batch(&self, blocks: &[(BlockHash, &[u8])]) -> Vec<Result<(), StoreError>> {
        let mut out = Vec::with_capacity(blocks.len());
        for (key, data) in blocks {
            out.push(self.put(*key, data).await);
        }
        out
    }

    /// Frees at least `want` DRAM slots: evicts blocks already on disk, and
    /// if that is not enough writes the coldest blocks behind first. Returns
    /// whether any room was made.
    pub(crate) async fn make_room(&self, want: usize) -> Result<bool, StoreError> {
        let inner = &self.inner;
        let mut freed = inner.memory.evict(want).len();
        if freed >= want {
            return Ok(true);
        }
        if inner.disk.is_none() {
            return Ok(freed > 0);
        }
        let demoted =
            crate::demote::demote_round(inner, inner.options.demote_batch.max(want)).await;
        freed += inner.memory.evict(want - freed).len();
        Ok(freed > 0 || demoted > 0 && inner.memory.free_blocks() > 0)
    }

    fn maybe_wake_demoter(&self) {
        let m = &self.inner.memory;
        let target = (m.capacity_blocks() as f64 * self.inner.options.free_target).ceil() as usize;
        if m.free_blocks() < target.max(1) {
            self.inner.wake_demoter.notify_one();
        }
    }

    /// Copies block `key` into `dst` (exactly one block long). Returns the
    /// tier that served it, or `None` on a miss. Disk hits are promoted to
    /// DRAM when a slot can be had.
    pub async fn get(&self, key: BlockHash, dst: &mut [u8]) -> Result<Option<Tier>, StoreError> {
        let got = self.get_batch(&[key], &mut [dst]).await?;
        Ok(got.into_iter().next().flatten())
    }

    /// Reads many blocks: DRAM hits are copied, the rest are read from disk
    /// in one batch (one submission), straight into reserved DRAM slots
    /// (promotion) or, when DRAM has no slot to spare, into bounce buffers.
    /// `dsts[i]` receives block `keys[i]`; the result says which tier
    /// served it.
    pub async fn get_batch(
        &self,
        keys: &[BlockHash],
        dsts: &mut [&mut [u8]],
    ) -> Result<Vec<Option<Tier>>, StoreError> {
        self.check_open()?;
        let want = self.block_len();
        if let Some(bad) = dsts.iter().find(|d| d.len() != want) {
            return Err(StoreError::WrongLength {
                got: bad.len(),
                want,
            });
        }
        let inner = &self.inner;
        let c = &inner.counters;
        let mut out = vec![None; keys.len()];
        let mut idx: Vec<usize> = Vec::new();
        let mut reqs: Vec<(BlockHash, ReadTarget)> = Vec::new();
        for (i, key) in keys.iter().copied().enumerate() {
            match inner.memory.get(key, dsts[i]) {
                Lookup::Hit => {
                    self.account_memory_hit(i, &mut out);
                    continue;
                }
                Lookup::Corrupt => StoreCounters::add(&c.corrupt_memory, 1),
                Lookup::Miss => {}
            }
            if !inner.disk.as_ref().is_some_and(|d| d.contains(key)) {
                StoreCounters::add(&c.misses, 1);
                continue;
            }
            let target = match inner.memory.reserve(key)? {
                Reserve::Reserved(slot) => ReadTarget::Slot(slot),
                Reserve::Full => ReadTarget::Bounce(AlignedBuf::zeroed(want, 4096)),
                // Promoted or put meanwhile: serve it from DRAM.
                Reserve::AlreadyPresent => {
                    match inner.memory.get(key, dsts[i]) {
                        Lookup::Hit => self.account_memory_hit(i, &mut out),
                        Lookup::Corrupt => {
                            StoreCounters::add(&c.corrupt_memory, 1);
                            StoreCounters::add(&c.misses, 1);
                        }
                        Lookup::Miss => StoreCounters::add(&c.misses, 1),
                    }
                    continue;
                }
            };
            idx.push(i);
            reqs.push((key, target));
        }
        if let (Some(disk), false) = (inner.disk.as_ref(), reqs.is_empty()) {
            let keys_read: Vec<BlockHash> = reqs.iter().map(|(k, _)| *k).collect();
            let results = disk.get_batch_with_sums(reqs).await;
            for ((i, key), (target, lookup, sums)) in idx.into_iter().zip(keys_read).zip(results) {
                let lookup = if lookup.is_hit() && sums.is_none() {
                    Lookup::Miss
                } else {
                    lookup
                };
                self.account_disk(lookup, i, &mut out);
                let (Lookup::Hit, Some(sums)) = (lookup, sums) else {
                    continue;
                };
                match target {
                    ReadTarget::Slot(slot) => {
                        dsts[i].copy_from_slice(slot.as_slice());
                        // Verified by the disk tier in this very slot: no second hash.
                        if slot.commit_verified(&sums).is_ok() {
                            inner.memory.set_persisted(key, true);
                            StoreCounters::add(&c.promotions, 1);
                        }
                    }
                    ReadTarget::Bounce(buf) => dsts[i].copy_from_slice(&buf),
                }
            }
        }
        self.maybe_wake_demoter();
        Ok(out)
    }

    fn account_memory_hit(&self, i: usize, out: &mut [Option<Tier>]) {
        let c = &self.inner.counters;
        StoreCounters::add(&c.hits_memory, 1);
        StoreCounters::add(&c.get_bytes, self.block_len() as u64);
        out[i] = Some(Tier::Memory);
    }

    fn account_disk(&self, lookup: Lookup, i: usize, out: &mut [Option<Tier>]) {
        let c = &self.inner.counters;
        match lookup {
            Lookup::Hit => {
                StoreCounters::add(&c.hits_disk, 1);
                StoreCounters::add(&c.get_bytes, self.block_len() as u64);
                out[i] = Some(Tier::Disk);
            }
            Lookup::Corrupt => {
                StoreCounters::add(&c.corrupt_disk, 1);
                StoreCounters::add(&c.misses, 1);
            }
            Lookup::Miss => StoreCounters::add(&c.misses, 1),
        }
    }

    /// Which tier holds `key` (DRAM first), if any.
    pub fn contains(&self, key: BlockHash) -> Option<Tier> {
        if self.inner.memory.contains(key) {
            Some(Tier::Memory)
        } else if self.inner.disk.as_ref().is_some_and(|d| d.contains(key)) {
            Some(Tier::Disk)
        } else {
            None
        }
    }

    /// Removes `key` from every tier. Readers holding it keep their copy.
    pub fn remove(&self, key: BlockHash) -> bool {
        let m = self.inner.memory.remove(key);
        let d = self.inner.disk.as_ref().is_some_and(|d| d.remove(key));
        m || d
    }

    /// Pins `key` in DRAM: it is never evicted until unpinned.
    pub fn pin(&self, key: BlockHash) -> bool {
        self.inner.memory.pin(key)
    }

    /// Releases one pin of `key`.
    pub fn unpin(&self, key: BlockHash) -> bool {
        self.inner.memory.unpin(key)
    }

    /// Writes every DRAM block that is not yet on disk to disk.
    pub async fn flush(&self) -> Result<(), StoreError> {
        if self.inner.disk.is_none() {
            return Ok(());
        }
        loop {
            let written =
                crate::demote::demote_round(&self.inner, self.inner.options.demote_batch).await;
            if written == 0 {
                return Ok(());
            }
        }
    }

    /// Stops the demoter, flushes DRAM to disk and checkpoints the disk
    /// index. Further calls fail with [`StoreError::Closed`].
    pub async fn close(&self) -> Result<(), StoreError> {
        self.demoter.stop().await;
        self.flush().await?;
        self.inner.closed.store(true, Ordering::Release);
        if let Some(disk) = &self.inner.disk {
            disk.close().await?;
        }
        Ok(())
    }

    /// A snapshot of every counter.
    pub fn stats(&self) -> StoreStats {
        let i = &self.inner;
        i.counters.snapshot(
            i.memory.stats(),
            i.disk.as_ref().map(|d| d.stats()),
            i.engine.as_ref().map(|e| e.stats()),
        )
    }
}
