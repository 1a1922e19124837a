//! [`DiskTier`]: opening, closing, checkpoints and the shared state every
//! other module works on.

use std::collections::VecDeque;
use std::fs::File;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Weak};
use std::time::{Duration, Instant};

use kvtier_core::{BlockHash, BlockSums, Geometry, Lookup};
use kvtier_io::{DioAlignment, DmaTarget, FileId, IoEngine, IoError, IoKind};
use kvtier_tier::BlockPut;
use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;

use crate::checkpoint::{Checkpoint, CkEntry, RegionMark};
use crate::durability::SyncLatch;
use crate::format::{
    FORMAT_VERSION, FORMAT_VERSION_2, Layout, LifeFormat, MAX_DIRS, RegionLayout,
    geometry_fingerprint,
};
use crate::index::Index;
use crate::latch::state;
use crate::meta::{
    DATA_FILE, DirLock, INDEX_FILE, META_FILE, Meta, new_creation_id, read_optional,
    remove_optional, write_atomic,
};
use crate::pool::BufPool;
use crate::reclaim::ReclaimListener;
use crate::region::Region;
use crate::stats::{Counters, DiskStats, add};
use crate::writer::{DirWriter, Ticket};
use crate::{DiskError, DiskTierConfig, Result};

/// One directory (device).
pub(crate) struct Dir {
    /// Index in the configuration (and on disk).
    pub index: u8,
    /// The directory.
    pub path: PathBuf,
    /// The engine's id of the data file.
    pub file: FileId,
    /// Random id of the directory's creation.
    pub creation_id: u128,
    /// Header version of the lives this run opens: the meta file's (1, or 2
    /// once the directory may hold v2 lives).
    pub version: u32,
    /// Holds the directory's exclusive lock while the tier lives.
    pub _lock: DirLock,
    /// Latched after a failed write: no more writes go here.
    pub failed: AtomicBool,
    /// The regions of the data file.
    pub regions: Box<[Region]>,
    /// Region allocation and the open region; held while reserving slots.
    pub writer: tokio::sync::Mutex<DirWriter>,
    /// Region write buffers.
    pub pool: BufPool,
}

impl Dir {
    /// Latches the directory as failed (idempotent).
    pub fn fail(&self, why: &str) {
        if !self.failed.swap(true, Ordering::SeqCst) {
            tracing::error!(dir = %self.path.display(), reason = why, "disk tier directory failed; no more writes go to it");
        }
    }

    /// The directory's data file.
    pub fn data_path(&self) -> PathBuf {
        self.path.join(DATA_FILE)
    }
}

/// Wakes the background checkpoint thread or tells it to stop.
#[derive(Default)]
pub(crate) struct StopSignal {
    stopped: std::sync::Mutex<bool>,
    cv: Condvar,
}

impl StopSignal {
    fn stop(&self) {
        if let Ok(mut s) = self.stopped.lock() {
            *s = true;
        }
        self.cv.notify_all();
    }

    /// Waits up to `d`; returns whether stop was asked.
    fn wait(&self, d: Duration) -> bool {
        let Ok(guard) = self.stopped.lock() else {
            return true;
        };
        match self.cv.wait_timeout_while(guard, d, |s| !*s) {
            Ok((g, _)) => *g,
            Err(_) => true,
        }
    }
}

/// The state shared by every handle, the reaper threads and the checkpoint
/// thread. Field order matters for drop: the engine goes first, so registered
/// buffers are unregistered before the pools free them (see `Drop`).
pub(crate) struct Shared {
    pub engine: Arc<dyn IoEngine>,
    pub cfg: DiskTierConfig,
    pub layout: Layout,
    pub align: DioAlignment,
    pub dirs: Vec<Dir>,
    pub index: Index,
    pub stats: Counters,
    /// The last generation handed out.
    pub generation: AtomicU64,
    /// Read ticks for LRU.
    pub tick: AtomicU64,
    /// Round-robin cursor over directories.
    pub rr: AtomicUsize,
    pub closed: AtomicBool,
    /// `put_batch` calls in progress, and a wake-up when it drops to zero.
    pub active_puts: AtomicUsize,
    pub puts_idle: Notify,
    /// Serialises checkpoints.
    pub ckpt_lock: Mutex<()>,
    pub stop: Arc<StopSignal>,
    /// The background checkpoint thread, joined by `close`.
    pub checkpointer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Verified per-layer checksums of recently read blocks.
    pub layer_sums: crate::layer_sums::LayerSumsCache,
    /// Told about blocks reclaim drops and asked which to keep; read (and
    /// the `Arc` cloned out) once per reclaim.
    pub reclaim_listener: RwLock<Option<Arc<dyn ReclaimListener>>>,
    /// Set by the first failed sync: no more writes or checkpoints (I12).
    pub latch: SyncLatch,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.stop.stop();
        // The engine may use registered memory for its whole life. If someone
        // else still holds it, the registered buffers must outlive us.
        if Arc::strong_count(&self.engine) > 1 {
            for d in &self.dirs {
                d.pool.leak_registered();
            }
        }
    }
}

impl Shared {
    /// The format of a life `dir` opens in this run.
    pub fn new_life_format(&self, dir: &Dir) -> LifeFormat {
        LifeFormat {
            version: dir.version,
            layout: self.cfg.layout,
        }
    }

    /// The region `loc` names.
    pub fn region(&self, dir: u8, region: u32) -> Option<&Region> {
        self.dirs.get(dir as usize)?.regions.get(region as usize)
    }

    /// Checkpoints every directory (blocking file I/O).
    pub fn checkpoint_blocking(&self) -> Result<()> {
        let _serial = self.ckpt_lock.lock();
        // After a failed sync no checkpoint may claim anything durable (I12).
        self.latch.check()?;
        let mut first_err = None;
        for dir in &self.dirs {
            if let Err(e) = self.checkpoint_dir(dir) {
                tracing::warn!(dir = %dir.path.display(), error = %e, "checkpoint failed");
                first_err.get_or_insert(e);
            }
        }
        add(&self.stats.checkpoints, 1);
        first_err.map_or(Ok(()), Err)
    }

    fn checkpoint_dir(&self, dir: &Dir) -> Result<()> {
        if self.cfg.sync {
            // Slots the checkpoint names must be durable before it is.
            self.latch
                .sync(&*self.engine, dir.file, IoKind::Fdatasync, &dir.data_path())?;
        }
        let hwm = self.generation.load(Ordering::SeqCst);
        // Region marks first, entries second: an entry whose write finished
        // below a region's done-prefix was indexed before the mark was read,
        // so the entry copy below includes it (or it was removed since).
        let regions = dir
            .regions
            .iter()
            .map(|r| {
                let fill = r.fill.lock();
                match r.latch.state() {
                    state::FREE => RegionMark::default(),
                    _ => RegionMark {
                        generation: r.generation(),
                        // A sealed life with nothing in flight is complete.
                        fill: if fill.sealed && fill.inflight.is_empty() {
                            self.layout.slots_per_region
                        } else {
                            fill.done_prefix()
                        },
                    },
                }
            })
            .collect();
        let entries = self
            .index
            .entries_of_dir(dir.index)
            .into_iter()
            .map(|(key, e)| CkEntry {
                key,
                region: e.loc.region,
                slot: e.loc.slot,
                sum: e.sum,
            })
            .collect();
        let ck = Checkpoint {
            dir: dir.index as u32,
            creation_id: dir.creation_id,
            generation_hwm: hwm,
            slots_per_region: self.layout.slots_per_region,
            regions,
            entries,
        };
        write_atomic(
            &*self.engine,
            &self.latch,
            &dir.path.join(INDEX_FILE),
            &ck.encode(),
        )
    }

    /// Counts a `put_batch` in; `None` if the tier is closed.
    pub fn enter_put(self: &Arc<Self>) -> Option<PutGuard> {
        self.active_puts.fetch_add(1, Ordering::SeqCst);
        if self.closed.load(Ordering::SeqCst) {
            self.exit_put();
            return None;
        }
        Some(PutGuard(self.clone()))
    }

    fn exit_put(&self) {
        if self.active_puts.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.puts_idle.notify_waiters();
        }
    }
}

/// Counts a `put_batch` call as in progress until dropped (cancellation
/// included).
pub(crate) struct PutGuard(Arc<Shared>);

impl Drop for PutGuard {
    fn drop(&mut self) {
        self.0.exit_put();
    }
}

/// The disk tier. Cheap to clone (a handle on shared state). See the
/// [crate docs](crate) for how it works.
#[derive(Clone)]
pub struct DiskTier {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for DiskTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskTier")
            .field("dirs", &self.shared.cfg.dirs)
            .field("blocks", &self.len())
            .field("capacity_blocks", &self.capacity_blocks())
            .finish()
    }
}

impl DiskTier {
    /// Opens the tier: creates missing directories and files (preallocating
    /// `capacity_per_dir` in each), or recovers the blocks of an existing
    /// tier from its checkpoints and region and slot headers. Blocks the
    /// calling thread while it reads.
    ///
    /// # Errors
    /// [`DiskError::InvalidConfig`] for shapes that cannot work,
    /// [`DiskError::FormatMismatch`] for a directory written with another
    /// format or shape (unless `reset`), [`DiskError::NoSpace`] when a file
    /// system cannot hold the capacity, [`DiskError::Io`] /
    /// [`DiskError::Engine`] for failing files.
    pub fn open(cfg: DiskTierConfig, engine: Arc<dyn IoEngine>) -> Result<Self> {
        let started = Instant::now();
        if cfg.dirs.is_empty() {
            return Err(DiskError::InvalidConfig("no directories".into()));
        }
        if cfg.dirs.len() > MAX_DIRS {
            return Err(DiskError::InvalidConfig(format!(
                "{} directories; at most {MAX_DIRS}",
                cfg.dirs.len()
            )));
        }
        crate::config::check_write_op_bytes(cfg.write_op_bytes)
            .map_err(|why| DiskError::InvalidConfig(format!("write_op_bytes {why}")))?;
        let layout = Layout::new(&cfg.geometry, cfg.region_size, cfg.capacity_per_dir)?;
        if cfg.layout == RegionLayout::Layer && !layout.layer_eligible() {
            return Err(DiskError::InvalidConfig(format!(
                "layout = \"layer\" needs layers of a multiple of 4096 bytes; this geometry's are {} bytes",
                layout.layer_bytes
            )));
        }
        let region_bytes = usize::try_from(layout.region_bytes)
            .map_err(|_| DiskError::InvalidConfig("region_size too large".into()))?;
        let fp = geometry_fingerprint(&cfg.geometry);
        let mut dirs = Vec::with_capacity(cfg.dirs.len());
        let mut align = DioAlignment {
            mem: 512,
            offset: 512,
        };
        let latch = SyncLatch::default();
        for (i, path) in cfg.dirs.iter().enumerate() {
            let (lock, meta, file) =
                prepare_dir(&cfg, &layout, i as u32, path, fp, (&*engine, &latch))?;
            let a = kvtier_io::dio_alignment(&path.join(DATA_FILE));
            align.mem = align.mem.max(a.mem);
            align.offset = align.offset.max(a.offset);
            let id = engine
                .register_file(file)
                .map_err(|source| DiskError::Engine {
                    path: path.join(DATA_FILE),
                    source,
                })?;
            dirs.push(Dir {
                index: i as u8,
                path: path.clone(),
                file: id,
                creation_id: meta.creation_id,
                version: meta.version,
                _lock: lock,
                failed: AtomicBool::new(false),
                regions: (0..layout.regions_per_dir).map(|_| Region::new()).collect(),
                writer: tokio::sync::Mutex::new(DirWriter::new(VecDeque::new())),
                pool: BufPool::new(
                    cfg.buffers_per_dir,
                    region_bytes,
                    cfg.register_buffers,
                    &engine,
                ),
            });
        }
        if !layout.slot_header_bytes.is_multiple_of(align.offset as u64)
            || !layout.region_bytes.is_multiple_of(align.offset as u64)
        {
            return Err(DiskError::InvalidConfig(format!(
                "the file system needs {}-byte aligned direct I/O, larger than the format's 4096",
                align.offset
            )));
        }
        let capacity = dirs.len() * layout.slots_per_dir() as usize;
        let shared = Arc::new(Shared {
            engine,
            index: Index::with_capacity(capacity),
            layout,
            align,
            dirs,
            stats: Counters::default(),
            generation: AtomicU64::new(0),
            tick: AtomicU64::new(0),
            rr: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            active_puts: AtomicUsize::new(0),
            puts_idle: Notify::new(),
            ckpt_lock: Mutex::new(()),
            stop: Arc::new(StopSignal::default()),
            checkpointer: Mutex::new(None),
            layer_sums: crate::layer_sums::LayerSumsCache::new(cfg.layer_sums_cache),
            reclaim_listener: RwLock::new(None),
            latch,
            cfg,
        });
        crate::recover::recover(&shared)?;
        for dir in &shared.dirs {
            crate::writer::start_reaper(&shared, dir.index)?;
        }
        if !shared.cfg.checkpoint_interval.is_zero() {
            start_checkpointer(&shared)?;
        }
        add(
            &shared.stats.recovery_micros,
            started.elapsed().as_micros() as u64,
        );
        Ok(DiskTier { shared })
    }

    /// Writes blocks. One result per block, in order: `Ok` means the block
    /// is on disk (its direct write completed; with `sync`, a region's last
    /// blocks are also `fdatasync`ed when it seals) and readable. A key
    /// already present is `Ok` without a write. An `Err` block was not
    /// stored: keep your copy. A failed write latches its directory; others
    /// go on. A failed sync latches the whole tier: from then on every put
    /// is refused with [`DiskError::SyncFailed`] (I12).
    pub async fn put_batch(&self, blocks: &[BlockPut<'_>]) -> Vec<Result<(), DiskError>> {
        crate::writer::put_batch(&self.shared, blocks).await
    }

    /// Reads whole blocks into their targets (each `geometry.block_bytes()`
    /// long). All reads go in one I/O batch; every byte is verified against
    /// the block checksum. Returns each target with its outcome, in order;
    /// a target's bytes are meaningful only for [`Lookup::Hit`]. (Only if
    /// the engine shuts down mid-batch, which cannot happen while the tier
    /// holds it, would targets be lost and the result be shorter.)
    pub async fn get_batch<T: DmaTarget>(&self, reqs: Vec<(BlockHash, T)>) -> Vec<(T, Lookup)> {
        crate::reader::read(&self.shared, reqs, None, false)
            .await
            .into_iter()
            .map(|(t, l, _)| (t, l))
            .collect()
    }

    /// Like [`get_batch`](Self::get_batch), and for every hit also the
    /// block's checksums as computed while verifying it, so a caller moving
    /// the block on (promotion into DRAM) need not hash it again.
    pub async fn get_batch_with_sums<T: DmaTarget>(
        &self,
        reqs: Vec<(BlockHash, T)>,
    ) -> Vec<(T, Lookup, Option<BlockSums>)> {
        crate::reader::read(&self.shared, reqs, None, true).await
    }

    /// Reads layers `layers` of blocks into targets of
    /// `layers.len() * layer_bytes` bytes each, verified against each
    /// layer's checksum (read from the slot header in the same batch and
    /// trusted only if it combines to the indexed block checksum).
    pub async fn read_layers<T: DmaTarget>(
        &self,
        reqs: Vec<(BlockHash, T)>,
        layers: Range<u32>,
    ) -> Vec<(T, Lookup)> {
        crate::reader::read(&self.shared, reqs, Some(layers), false)
            .await
            .into_iter()
            .map(|(t, l, _)| (t, l))
            .collect()
    }

    /// Like [`read_layers`](Self::read_layers), and for every hit also the
    /// block's checksums (its layer sums authenticated by the indexed block
    /// checksum), so a caller assembling the block layer by layer can
    /// publish it without hashing it again.
    pub async fn read_layers_with_sums<T: DmaTarget>(
        &self,
        reqs: Vec<(BlockHash, T)>,
        layers: Range<u32>,
    ) -> Vec<(T, Lookup, Option<BlockSums>)> {
        crate::reader::read(&self.shared, reqs, Some(layers), true).await
    }

    /// Whether `key` is indexed (it may still turn out corrupt on read).
    pub fn contains(&self, key: BlockHash) -> bool {
        self.shared.index.contains(key)
    }

    /// Forgets `key`; returns whether it was indexed. Its slot is reclaimed
    /// with its region. (A block removed after the last checkpoint can
    /// reappear after a crash: its bytes are still valid.)
    pub fn remove(&self, key: BlockHash) -> bool {
        self.shared.index.remove(key).is_some()
    }

    /// Installs (or replaces) the listener region reclaim asks which blocks
    /// to keep and tells which blocks it dropped (see [`ReclaimListener`]):
    /// from then on it is the tier's one eviction authority, and it should
    /// hold at most [`live_capacity_blocks`](Self::live_capacity_blocks).
    /// Takes effect from the next reclaim; a reclaim in progress finishes
    /// with the listener it started with. Without a listener, reclaim
    /// re-inserts only hot blocks (with `reinsert_hot`) and tells nobody.
    pub fn set_reclaim_listener(&self, listener: Arc<dyn ReclaimListener>) {
        *self.shared.reclaim_listener.write() = Some(listener);
    }

    /// Where `key`'s slot is, if indexed (for tools and tests).
    pub fn location(&self, key: BlockHash) -> Option<crate::index::Loc> {
        self.shared.index.get(key).map(|e| e.loc)
    }

    /// The data file of directory `dir` (for tools and tests).
    pub fn data_file(&self, dir: u8) -> Option<PathBuf> {
        self.shared.dirs.get(dir as usize).map(|d| d.data_path())
    }

    /// Keys of the blocks indexed, directory by directory (what a restart
    /// recovered plus what was written since; a snapshot per index shard).
    pub fn keys(&self) -> Vec<BlockHash> {
        (0..self.shared.dirs.len())
            .flat_map(|d| self.shared.index.entries_of_dir(d as u8))
            .map(|(k, _)| k)
            .collect()
    }

    /// Blocks indexed.
    pub fn len(&self) -> usize {
        self.shared.index.len()
    }

    /// Whether no block is indexed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Most blocks an owner that evicts by its own policy (a
    /// [`ReclaimListener`]) may hold in the tier: every slot of every
    /// directory except those of the regions open for writing
    /// (`buffers_per_dir` per directory) and one region more
    /// (docs/disk-format.md, I24). Then a reclaim always finds a sealed
    /// region with a slot the owner does not want, and re-inserting all it
    /// wants never drops one: `(dirs x (regions_per_dir - buffers_per_dir)
    /// - 1) x slots_per_region`, at least 0.
    pub fn live_capacity_blocks(&self) -> usize {
        let l = &self.shared.layout;
        let spr = u64::from(l.slots_per_region);
        let regions_per_dir = l.slots_per_dir() / spr.max(1);
        let open = self.shared.cfg.buffers_per_dir as u64;
        let sealed = self.shared.dirs.len() as u64 * regions_per_dir.saturating_sub(open);
        (sealed.saturating_sub(1) * spr) as usize
    }

    /// Blocks the tier can hold (slots over every directory).
    pub fn capacity_blocks(&self) -> usize {
        self.shared.dirs.len() * self.shared.layout.slots_per_dir() as usize
    }

    /// The geometry of the blocks stored.
    pub fn geometry(&self) -> &Geometry {
        &self.shared.cfg.geometry
    }

    /// The on-disk layout (slot and region sizes).
    pub fn layout(&self) -> &Layout {
        &self.shared.layout
    }

    /// Writes an index checkpoint in every directory (blocking file I/O on
    /// the calling thread, through the engine). `Err(SyncFailed)` once a
    /// sync has failed.
    pub async fn checkpoint(&self) -> Result<(), DiskError> {
        self.shared.checkpoint_blocking()
    }

    /// Refuses further puts, waits for the puts in progress, writes a
    /// checkpoint and stops the background checkpoint thread. Reads keep
    /// working. Closing twice is fine. After a failed sync the checkpoint is
    /// refused: `Err(SyncFailed)`, everything else done.
    pub async fn close(&self) -> Result<(), DiskError> {
        let s = &self.shared;
        s.closed.store(true, Ordering::SeqCst);
        loop {
            let idle = s.puts_idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if s.active_puts.load(Ordering::SeqCst) == 0 {
                break;
            }
            idle.await;
        }
        // Every extent reserved before now is behind this in its reaper queue.
        for dir in &s.dirs {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let sent = dir.writer.lock().await.send(Ticket::Flush(tx));
            if sent {
                let _ = rx.await;
            }
        }
        s.stop.stop();
        // Join the checkpoint thread so it holds no reference once `close`
        // returns (it is never the caller: it does not close).
        let handle = s.checkpointer.lock().take();
        if let Some(h) = handle
            && h.thread().id() != std::thread::current().id()
        {
            let _ = h.join();
        }
        s.checkpoint_blocking()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> DiskStats {
        let s = &self.shared;
        let mut out = s.stats.snapshot();
        out.blocks = s.index.len() as u64;
        out.bytes_used = out.blocks * s.layout.block_bytes;
        out.capacity_blocks = self.capacity_blocks() as u64;
        out.failed_dirs = s
            .dirs
            .iter()
            .filter(|d| d.failed.load(Ordering::Relaxed))
            .count() as u64;
        out.region_bytes_used = s
            .dirs
            .iter()
            .flat_map(|d| d.regions.iter())
            .filter(|r| r.latch.state() != state::FREE)
            .count() as u64
            * s.layout.region_bytes;
        out
    }

    /// Bytes of RAM the index takes: the hash tables plus each region's key
    /// list (the reclaim walk). Region write buffers are not included; see
    /// [`buffer_bytes`](Self::buffer_bytes).
    pub fn memory_bytes(&self) -> usize {
        let s = &self.shared;
        s.index.memory_bytes()
            + s.dirs
                .iter()
                .flat_map(|d| d.regions.iter())
                .map(|r| r.memory_bytes())
                .sum::<usize>()
    }

    /// Bytes of region write buffers allocated.
    pub fn buffer_bytes(&self) -> usize {
        self.shared.dirs.iter().map(|d| d.pool.bytes()).sum()
    }

    /// The I/O engine the tier uses.
    pub fn engine(&self) -> &Arc<dyn IoEngine> {
        &self.shared.engine
    }
}

/// Writes zeros over a new data file ([`kvtier_io::prefill`]), logging
/// progress about every 10 % and the rate at the end.
fn prefill_data_file(file: &File, path: &std::path::Path, bytes: u64) -> Result<()> {
    let t0 = std::time::Instant::now();
    let mut next_tenth = 1;
    tracing::info!(file = %path.display(), bytes, "disk tier: prefilling the new data file");
    kvtier_io::prefill(file, path, bytes, &mut |done, total| {
        if done * 10 >= total * next_tenth && done < total {
            tracing::info!(file = %path.display(), percent = next_tenth * 10, "disk tier: prefilling");
            next_tenth = done * 10 / total + 1;
        }
    })
    .map_err(|e| match e {
        IoError::File { path, source } => DiskError::Io { path, source },
        other => DiskError::Engine {
            path: path.to_path_buf(),
            source: other,
        },
    })?;
    let secs = t0.elapsed().as_secs_f64();
    tracing::info!(
        file = %path.display(),
        seconds = secs,
        mb_per_s = bytes as f64 / 1e6 / secs.max(1e-9),
        "disk tier: data file prefilled"
    );
    Ok(())
}

/// Locks and checks or creates one directory; returns its lock, meta (as it
/// is on disk now) and data file. With `layout = "layer"` a v1 directory
/// becomes v2 (its meta file rewritten atomically) before anything is
/// written into its data file.
fn prepare_dir(
    cfg: &DiskTierConfig,
    layout: &Layout,
    index: u32,
    path: &std::path::Path,
    fp: u64,
    (engine, latch): (&dyn IoEngine, &SyncLatch),
) -> Result<(DirLock, Meta, File)> {
    // With std: creating a directory moves no data (the engine has no
    // mkdir); the files in it are made durable through the engine (the
    // meta file's atomic write syncs this directory). New directories are
    // the owner's user's only, like every file in them.
    kvtier_io::create_private_dir_all(path).map_err(|e| DiskError::io(path, e))?;
    let lock = crate::meta::lock_dir(path)?;
    let meta_path = path.join(META_FILE);
    let data_path = path.join(DATA_FILE);
    // An older build made these 0644; they are read before being written
    // again, so they are narrowed here (the data file by `open_direct`).
    for small in [&meta_path, &path.join(INDEX_FILE)] {
        crate::meta::narrow_if_present(small)?;
    }
    let existing = match read_optional(&meta_path)? {
        None => None,
        Some(bytes) => {
            let checked = Meta::decode(&bytes, &meta_path, path).and_then(|m| {
                m.check(&Meta::expected(index, layout, fp, m.creation_id), path)?;
                Ok(m)
            });
            match checked {
                Ok(m) => Some(m),
                Err(e) if cfg.reset => {
                    tracing::warn!(dir = %path.display(), error = %e, "wiping disk tier directory (reset)");
                    None
                }
                Err(e) => return Err(e),
            }
        }
    };
    let fresh = existing.is_none();
    if fresh {
        // No valid meta: whatever else is here is from an unfinished creation
        // or a wiped tier.
        for f in [META_FILE, INDEX_FILE, DATA_FILE] {
            remove_optional(&path.join(f))?;
        }
    }
    let file = kvtier_io::open_direct(&data_path, layout.file_bytes()).map_err(|e| match e {
        IoError::NoSpace { bytes, .. } => DiskError::NoSpace {
            dir: path.to_path_buf(),
            bytes,
        },
        IoError::File { path, source } => DiskError::Io { path, source },
        other => DiskError::Engine {
            path: data_path.clone(),
            source: other,
        },
    })?;
    tracing::info!(
        dir = %path.display(),
        file = %data_path.display(),
        bytes = layout.file_bytes(),
        "disk tier: disk space reserved"
    );
    if fresh && cfg.prefill {
        // Before the meta file exists: a crash mid-fill leaves a directory
        // that the next open treats as unfinished and creates again.
        prefill_data_file(&file, &data_path, layout.file_bytes())?;
    }
    let want_version = match cfg.layout {
        RegionLayout::Block => FORMAT_VERSION,
        RegionLayout::Layer => FORMAT_VERSION_2,
    };
    let meta = match existing {
        // A v2 directory stays v2 (its v2 lives need seeded headers).
        Some(m) if m.version >= want_version => m,
        Some(m) => {
            let up = Meta {
                version: want_version,
                ..m
            };
            write_atomic(engine, latch, &meta_path, &up.encode())?;
            tracing::info!(dir = %path.display(), "disk tier: directory upgraded to format v2");
            up
        }
        None => {
            let m = Meta {
                version: want_version,
                ..Meta::expected(index, layout, fp, new_creation_id(path))
            };
            write_atomic(engine, latch, &meta_path, &m.encode())?;
            m
        }
    };
    Ok((lock, meta, file))
}

/// Starts the periodic checkpoint thread; it holds only a weak reference and
/// stops when the tier is closed or dropped.
fn start_checkpointer(shared: &Arc<Shared>) -> Result<()> {
    let weak: Weak<Shared> = Arc::downgrade(shared);
    let stop = shared.stop.clone();
    let every = shared.cfg.checkpoint_interval;
    let handle = std::thread::Builder::new()
        .name("kvtier-disk-ckpt".into())
        .spawn(move || {
            while !stop.wait(every) {
                let Some(s) = weak.upgrade() else { break };
                match s.checkpoint_blocking() {
                    Ok(()) => {}
                    // Latched (logged once already): none will succeed.
                    Err(DiskError::SyncFailed { .. }) => break,
                    Err(e) => tracing::warn!(error = %e, "periodic checkpoint failed"),
                }
            }
        })
        .map_err(|e| DiskError::io("kvtier-disk-ckpt thread", e))?;
    *shared.checkpointer.lock() = Some(handle);
    Ok(())
}
