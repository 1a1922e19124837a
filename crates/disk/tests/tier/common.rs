//! Shared helpers: engines, geometry, deterministic block contents, tiers
//! in temporary directories, and direct edits of data files.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kvtier_core::{BlockHash, BlockSums, Geometry, Lookup, RegionEvictionKind};
use kvtier_disk::{DiskTier, DiskTierConfig, RegionLayout};
use kvtier_io::{AlignedBuf, DmaTarget, IoEngine, PsyncEngine, UringEngine};
use kvtier_tier::BlockPut;

/// Which engine a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Psync,
    Uring,
}

impl Kind {
    pub fn engine(self) -> Arc<dyn IoEngine> {
        match self {
            Kind::Psync => Arc::new(PsyncEngine::new(4, 64).expect("psync engine")),
            Kind::Uring => Arc::new(UringEngine::new(64).expect("io_uring engine")),
        }
    }
}

tokio::task_local! {
    /// The region layout [`config`] gives tiers of the running test.
    static LAYOUT: RegionLayout;
}

/// The layout of the running test's tiers (block-major unless it runs under
/// [`with_layout`]).
pub fn layout() -> RegionLayout {
    LAYOUT.try_with(|l| *l).unwrap_or(RegionLayout::Block)
}

/// Runs `test` with [`config`] giving tiers of `layout`.
pub async fn with_layout<F: std::future::Future>(layout: RegionLayout, test: F) -> F::Output {
    LAYOUT.scope(layout, test).await
}

/// Generates `mod $name { psync, uring, psync_layer, uring_layer }`
/// running `$name(Kind)` on both engines and both region layouts.
#[macro_export]
macro_rules! both_engines {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                use $crate::common::{Kind, with_layout};
                use kvtier_disk::RegionLayout::{Block, Layer};
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn psync() {
                    with_layout(Block, super::$name(Kind::Psync)).await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn uring() {
                    with_layout(Block, super::$name(Kind::Uring)).await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn psync_layer() {
                    with_layout(Layer, super::$name(Kind::Psync)).await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn uring_layer() {
                    with_layout(Layer, super::$name(Kind::Uring)).await
                }
            }
        )*
    };
}

/// 4 layers of 4 KiB: 16 KiB blocks in 20 KiB slots.
pub fn geometry() -> Geometry {
    Geometry::raw(4, 16 << 10).expect("geometry")
}

pub const REGION: u64 = 1 << 20;

/// Generates `mod $name { block, layer }` running the engine-independent
/// test `$name()` with tiers of both region layouts.
#[macro_export]
macro_rules! both_layouts {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                use $crate::common::with_layout;
                use kvtier_disk::RegionLayout::{Block, Layer};
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn block() {
                    with_layout(Block, super::$name()).await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn layer() {
                    with_layout(Layer, super::$name()).await
                }
            }
        )*
    };
}

/// A config over `dirs` with small regions and no background checkpoints,
/// in the running test's [`layout`].
pub fn config(dirs: Vec<PathBuf>, capacity_per_dir: u64) -> DiskTierConfig {
    DiskTierConfig {
        dirs,
        capacity_per_dir,
        region_size: REGION,
        geometry: geometry(),
        eviction: RegionEvictionKind::Fifo,
        reinsert_hot: false,
        checkpoint_interval: Duration::ZERO,
        sync: false,
        register_buffers: true,
        reset: false,
        buffers_per_dir: 2,
        layer_sums_cache: 16384,
        write_op_bytes: kvtier_disk::DEFAULT_WRITE_OP_BYTES,
        prefill: false,
        layout: layout(),
    }
}

/// `n` directories under a fresh temporary directory in /tmp.
pub fn dirs(n: usize) -> (tempfile::TempDir, Vec<PathBuf>) {
    let t = tempfile::Builder::new()
        .prefix("kvtier-disk-test")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let d = (0..n).map(|i| t.path().join(format!("d{i}"))).collect();
    (t, d)
}

/// The key of block `i` of test `seed`.
pub fn key(seed: u64, i: u64) -> BlockHash {
    BlockHash(xxhash_rust::xxh3::xxh3_128(
        &[seed.to_le_bytes(), i.to_le_bytes()].concat(),
    ))
}

/// The bytes of block `key`: a deterministic function of the key.
pub fn content(key: BlockHash, len: usize) -> Vec<u8> {
    let mut x = key.fold64() | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Blocks with their checksums, ready to put.
pub struct Blocks {
    pub keys: Vec<BlockHash>,
    pub data: Vec<Vec<u8>>,
    pub sums: Vec<BlockSums>,
}

impl Blocks {
    pub fn new(g: &Geometry, keys: Vec<BlockHash>) -> Self {
        let data: Vec<Vec<u8>> = keys
            .iter()
            .map(|k| content(*k, g.block_bytes() as usize))
            .collect();
        let sums = keys
            .iter()
            .zip(&data)
            .map(|(k, d)| BlockSums::compute(*k, g.layer_bytes() as usize, d))
            .collect();
        Blocks { keys, data, sums }
    }

    pub fn range(g: &Geometry, seed: u64, r: std::ops::Range<u64>) -> Self {
        Self::new(g, r.map(|i| key(seed, i)).collect())
    }

    pub fn puts(&self) -> Vec<BlockPut<'_>> {
        self.keys
            .iter()
            .zip(&self.data)
            .zip(&self.sums)
            .map(|((k, d), s)| BlockPut {
                key: *k,
                data: d,
                sums: s,
                pinned: None,
            })
            .collect()
    }
}

/// Puts every block in batches of `batch`; panics on an error.
pub async fn put_all(tier: &DiskTier, blocks: &Blocks, batch: usize) {
    let puts = blocks.puts();
    for chunk in puts.chunks(batch) {
        for (r, p) in tier.put_batch(chunk).await.into_iter().zip(chunk) {
            r.unwrap_or_else(|e| panic!("put {}: {e}", p.key));
        }
    }
}

/// Reads `keys` whole; returns each outcome with the bytes.
pub async fn get(tier: &DiskTier, keys: &[BlockHash]) -> Vec<(Lookup, Vec<u8>)> {
    let len = tier.geometry().block_bytes() as usize;
    let reqs = keys
        .iter()
        .map(|k| (*k, AlignedBuf::zeroed(len, 4096)))
        .collect();
    tier.get_batch(reqs)
        .await
        .into_iter()
        .map(|(b, l)| (l, b.to_vec()))
        .collect()
}

/// Asserts every key either reads back exactly its content or is not a
/// hit; returns the number of hits.
pub async fn check_never_wrong(tier: &DiskTier, keys: &[BlockHash]) -> usize {
    check_never_wrong_by(tier, keys, 64).await
}

/// [`check_never_wrong`] reading `per_call` keys per call (1: every block
/// read on its own, with no runs of adjacent slots).
pub async fn check_never_wrong_by(tier: &DiskTier, keys: &[BlockHash], per_call: usize) -> usize {
    let len = tier.geometry().block_bytes() as usize;
    let mut hits = 0;
    for chunk in keys.chunks(per_call) {
        for ((l, bytes), k) in get(tier, chunk).await.into_iter().zip(chunk) {
            if l == Lookup::Hit {
                assert!(bytes == content(*k, len), "wrong bytes served for {k}");
                hits += 1;
            }
        }
    }
    hits
}

/// Asserts every key reads back exactly.
pub async fn check_all_hit(tier: &DiskTier, keys: &[BlockHash]) {
    let hits = check_never_wrong(tier, keys).await;
    assert_eq!(hits, keys.len(), "some blocks missing");
}

/// File offset of `byte` bytes into layer `layer` of the block at `loc`,
/// in the running test's layout.
pub fn piece_offset(tier: &DiskTier, loc: kvtier_disk::index::Loc, layer: u32, byte: u64) -> u64 {
    tier.layout()
        .piece_offset(layout(), loc.region, layer, loc.slot)
        + byte
}

/// File offset of the slot header of the block at `loc`, in the running
/// test's layout.
pub fn header_offset(tier: &DiskTier, loc: kvtier_disk::index::Loc) -> u64 {
    tier.layout().header_offset(layout(), loc.region, loc.slot)
}

/// Overwrites bytes of a data file (buffered pwrite + fsync; direct reads
/// see it).
pub fn poke(path: &Path, offset: u64, bytes: &[u8]) {
    let f = OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open data file");
    f.write_all_at(bytes, offset).expect("pwrite");
    f.sync_all().expect("fsync");
}

/// Reads bytes of a data file.
pub fn peek(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    let f = OpenOptions::new()
        .read(true)
        .open(path)
        .expect("open data file");
    let mut b = vec![0u8; len];
    f.read_exact_at(&mut b, offset).expect("pread");
    b
}

/// A read target that starts one byte into its buffer: never aligned.
pub struct Misaligned {
    buf: AlignedBuf,
    len: usize,
}

impl Misaligned {
    pub fn new(len: usize) -> Self {
        Misaligned {
            buf: AlignedBuf::zeroed(len + 1, 4096),
            len,
        }
    }
    pub fn bytes(&self) -> &[u8] {
        &self.buf[1..1 + self.len]
    }
}

// SAFETY: the memory is the AlignedBuf's heap allocation (stable across
// moves, owned exclusively); the range [1, 1 + len) lies inside it.
unsafe impl DmaTarget for Misaligned {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        // SAFETY: offset 1 is inside an allocation of len + 1 bytes.
        unsafe { self.buf.as_mut_ptr().add(1) }
    }
    fn len(&self) -> usize {
        self.len
    }
}
