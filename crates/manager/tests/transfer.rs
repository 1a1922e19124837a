//! The transfer engine end to end over real tiers: a [`HostDevice`], a
//! shared-memory [`MemoryTier`] in /dev/shm and a [`DiskTier`] in a
//! temporary directory, on both I/O engines (io_uring and the pread/pwrite
//! pool). Bytes must arrive equal, verified; a corrupted disk block is a
//! per-block failure, never delivered; destinations are unreadable until
//! their transfer completes.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use kvtier_core::{BlockHash, BlockSums, Geometry, Lookup};
use kvtier_disk::DiskTier;
use kvtier_io::{IoEngine, PsyncEngine, UringEngine};
use kvtier_manager::device::{
    CopyDirection, Device, DeviceBlockId, GatedDevice, HostDevice, HostDeviceOptions, HostSource,
    Span, Upload,
};
use kvtier_manager::transfer::{
    BlockFailure, BlockMove, InFlightTable, TransferEngine, TransferRequest,
};
use kvtier_manager::{Tier, TransferPath};

#[path = "support/tiers.rs"]
mod tiers;
use tiers::{disk, geometry, memory};

#[derive(Debug, Clone, Copy)]
enum Kind {
    Psync,
    Uring,
}

impl Kind {
    fn engine(self) -> Arc<dyn IoEngine> {
        match self {
            Kind::Psync => Arc::new(PsyncEngine::new(4, 64).expect("psync engine")),
            Kind::Uring => Arc::new(UringEngine::new(64).expect("io_uring engine")),
        }
    }
}

fn key(seed: u64, i: u64) -> BlockHash {
    BlockHash(((seed as u128) << 64) | (i as u128 + 1))
}

/// Deterministic bytes of a block: a function of its key.
fn content(key: BlockHash, len: usize) -> Vec<u8> {
    let mut x = key.fold64() | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Writes `content(key)` into fresh device blocks, directly.
async fn fill_device(device: &dyn Device, keys: &[BlockHash]) -> Vec<DeviceBlockId> {
    let len = geometry().block_bytes() as usize;
    let ids = device.allocate(keys.len()).expect("device blocks");
    let copies = keys
        .iter()
        .zip(&ids)
        .map(|(k, id)| Upload {
            dst: *id,
            src: Box::new(content(*k, len)) as Box<dyn HostSource>,
        })
        .collect();
    for (_, r) in device.upload(Span::Block, copies).await.expect("upload") {
        r.expect("copy");
    }
    ids
}

fn moves(keys: &[BlockHash], ids: &[DeviceBlockId]) -> Vec<BlockMove> {
    keys.iter()
        .zip(ids)
        .map(|(k, id)| BlockMove::with_device(*k, *id))
        .collect()
}

fn key_moves(keys: &[BlockHash]) -> Vec<BlockMove> {
    keys.iter().map(|k| BlockMove::key(*k)).collect()
}

/// Flips one byte of block `key` at `offset` in its disk data file.
fn flip_on_disk(disk: &DiskTier, key: BlockHash, offset: u64) {
    let loc = disk.location(key).expect("block on disk");
    let path = disk.data_file(loc.dir).expect("data file");
    let at = disk.layout().data_offset(loc.region, loc.slot) + offset;
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .expect("open data file");
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).expect("pread");
    f.write_all_at(&[b[0] ^ 0x5a], at).expect("pwrite");
    f.sync_all().expect("fsync");
}

macro_rules! both_engines {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn psync() {
                    super::$name(super::Kind::Psync).await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn uring() {
                    super::$name(super::Kind::Uring).await
                }
            }
        )*
    };
}

both_engines!(
    every_path_moves_bytes_intact,
    corrupted_disk_blocks_are_per_block_misses
);

/// G1 -> G2 -> G3 -> G2 -> G1 and G3 -> G1 (whole and per layer): the bytes
/// that arrive are the bytes that left, with the checksums they entered
/// with; metrics count every path.
async fn every_path_moves_bytes_intact(kind: Kind) {
    let g = geometry();
    let len = g.block_bytes() as usize;
    let device: Arc<HostDevice> = Arc::new(HostDevice::new(g, 64, HostDeviceOptions::default()));
    let mem = memory("e2e", 32);
    let (_dir, disk) = disk("kvtier-mgr-transfer", 4 << 20, kind.engine());
    let engine = TransferEngine::builder(g)
        .with_device(device.clone())
        .with_memory(mem.clone())
        .with_disk(disk.clone())
        .build()
        .expect("engine");
    let keys: Vec<BlockHash> = (0..8).map(|i| key(1, i)).collect();
    let ids = fill_device(device.as_ref(), &keys).await;

    // G1 -> G2: the blocks enter kvtier; checksums computed from the bytes.
    let out = engine
        .submit(TransferRequest::blocks(
            TransferPath::DeviceToHost,
            moves(&keys, &ids),
        ))
        .wait()
        .await;
    assert!(out.all_delivered(), "{:?}", out.failures());
    for k in &keys {
        let r = mem.get_ref(*k).expect("in DRAM");
        assert!(r[..] == content(*k, len)[..], "DRAM bytes of {k}");
        assert_eq!(
            r.sums(),
            BlockSums::compute(*k, g.layer_bytes() as usize, &content(*k, len))
        );
    }

    // G2 -> G3, in two requests submitted together (one batch if the
    // worker sees both).
    let a = engine.submit(TransferRequest::blocks(
        TransferPath::HostToDisk,
        key_moves(&keys[..4]),
    ));
    let b = engine.submit(TransferRequest::blocks(
        TransferPath::HostToDisk,
        key_moves(&keys[4..]),
    ));
    assert!(a.wait().await.all_delivered());
    assert!(b.wait().await.all_delivered());
    assert!(keys.iter().all(|k| disk.contains(*k)));

    // G3 -> G2 after DRAM lost them.
    for k in &keys {
        assert!(mem.remove(*k));
    }
    let io_batches = disk.engine().stats().batches;
    let out = engine
        .submit(TransferRequest::blocks(
            TransferPath::DiskToHost,
            key_moves(&keys),
        ))
        .wait()
        .await;
    assert!(out.all_delivered(), "{:?}", out.failures());
    assert_eq!(
        disk.engine().stats().batches - io_batches,
        1,
        "8 blocks from disk in one I/O submission"
    );
    let mut buf = vec![0u8; len];
    for k in &keys {
        assert_eq!(mem.get(*k, &mut buf), Lookup::Hit);
        assert!(buf == content(*k, len), "DRAM bytes of {k} after disk");
    }

    // G2 -> G1 into fresh device blocks.
    let fresh = device.allocate(keys.len()).expect("device blocks");
    let out = engine
        .submit(TransferRequest::blocks(
            TransferPath::HostToDevice,
            moves(&keys, &fresh),
        ))
        .wait()
        .await;
    assert!(out.all_delivered(), "{:?}", out.failures());
    for (k, id) in keys.iter().zip(&fresh) {
        assert!(device.read_block(*id).expect("block") == content(*k, len));
    }

    // G3 -> G1, whole blocks, then layer by layer into other fresh blocks.
    let whole = device.allocate(keys.len()).expect("device blocks");
    let out = engine
        .submit(TransferRequest::blocks(
            TransferPath::DiskToDevice,
            moves(&keys, &whole),
        ))
        .wait()
        .await;
    assert!(out.all_delivered(), "{:?}", out.failures());
    let layered = device.allocate(keys.len()).expect("device blocks");
    for l in 0..g.layers {
        let io_batches = disk.engine().stats().batches;
        let out = engine
            .submit(TransferRequest {
                path: TransferPath::DiskToDevice,
                span: Span::Layer(l),
                blocks: moves(&keys, &layered),
            })
            .wait()
            .await;
        assert!(out.all_delivered(), "layer {l}: {:?}", out.failures());
        assert_eq!(
            disk.engine().stats().batches - io_batches,
            1,
            "layer {l} of 8 blocks in one I/O submission"
        );
    }
    for ((k, w), y) in keys.iter().zip(&whole).zip(&layered) {
        assert!(device.read_block(*w).expect("block") == content(*k, len));
        assert!(device.read_block(*y).expect("block") == content(*k, len));
    }

    let d2h = engine.stats(TransferPath::DeviceToHost);
    assert_eq!((d2h.transfers, d2h.blocks, d2h.failed_blocks), (1, 8, 0));
    assert_eq!(d2h.bytes, 8 * g.block_bytes());
    assert_eq!(d2h.queue_depth, 0);
    assert!(d2h.max_queue_depth >= 8);
    assert_eq!(d2h.latency.count, 1);
    let h2disk = engine.stats(TransferPath::HostToDisk);
    assert_eq!((h2disk.transfers, h2disk.blocks), (2, 8));
    assert!((1..=2).contains(&h2disk.batches));
    let disk2d = engine.stats(TransferPath::DiskToDevice);
    assert_eq!(disk2d.bytes, 2 * 8 * g.block_bytes());
    assert_eq!(disk2d.transfers, 1 + g.layers as u64);
    disk.close().await.expect("close disk");
}

/// Flipped bytes on disk: those blocks fail as `Corrupt` on every read path
/// (whole, per layer, into DRAM, onto the device) and their destination
/// never holds them; the other blocks of the same batch arrive.
async fn corrupted_disk_blocks_are_per_block_misses(kind: Kind) {
    let g = geometry();
    let len = g.block_bytes() as usize;
    let device: Arc<HostDevice> = Arc::new(HostDevice::new(g, 64, HostDeviceOptions::default()));
    let mem = memory("corrupt", 32);
    let (_dir, disk) = disk("kvtier-mgr-transfer", 4 << 20, kind.engine());
    let engine = TransferEngine::builder(g)
        .with_device(device.clone())
        .with_memory(mem.clone())
        .with_disk(disk.clone())
        .build()
        .expect("engine");
    let keys: Vec<BlockHash> = (0..6).map(|i| key(2, i)).collect();
    for k in &keys {
        let data = content(*k, len);
        let sums = BlockSums::compute(*k, g.layer_bytes() as usize, &data);
        mem.put(*k, &data, &sums).expect("put");
    }
    let out = engine
        .submit(TransferRequest::blocks(
            TransferPath::HostToDisk,
            key_moves(&keys),
        ))
        .wait()
        .await;
    assert!(out.all_delivered());
    for k in &keys {
        mem.remove(*k);
    }
    // Block 1: a byte in layer 0; block 3: a byte in layer 2; block 5: a
    // byte in layer 1 (read per layer below).
    flip_on_disk(&disk, keys[1], 100);
    flip_on_disk(&disk, keys[3], 2 * g.layer_bytes() + 7);
    flip_on_disk(&disk, keys[5], g.layer_bytes() + 3);

    // Per layer onto the device: only the damaged layer of block 5 fails.
    let ids = device.allocate(keys.len()).expect("device blocks");
    let out = engine
        .submit(TransferRequest {
            path: TransferPath::DiskToDevice,
            span: Span::Layer(1),
            blocks: moves(&keys[4..], &ids[4..]),
        })
        .wait()
        .await;
    assert_eq!(out.blocks[0].1, Ok(()));
    assert_eq!(out.blocks[1].1, Err(BlockFailure::Corrupt));
    let lr = g.layer_range(1);
    let lr = lr.start as usize..lr.end as usize;
    assert!(
        device.read_block(ids[4]).expect("block")[lr.clone()] == content(keys[4], len)[lr.clone()]
    );
    assert!(
        device
            .read_block(ids[5])
            .expect("block")
            .iter()
            .all(|b| *b == 0),
        "a corrupt layer was copied to the device"
    );

    // Whole blocks into DRAM.
    let out = engine
        .submit(TransferRequest::blocks(
            TransferPath::DiskToHost,
            key_moves(&keys[..4]),
        ))
        .wait()
        .await;
    let expect = [
        Ok(()),
        Err(BlockFailure::Corrupt),
        Ok(()),
        Err(BlockFailure::Corrupt),
    ];
    for (i, (_, r)) in out.blocks.iter().enumerate() {
        assert_eq!(*r, expect[i], "block {i}");
    }
    let mut buf = vec![0u8; len];
    assert_eq!(mem.get(keys[0], &mut buf), Lookup::Hit);
    assert!(buf == content(keys[0], len));
    assert!(
        !mem.contains(keys[1]),
        "a corrupt block became visible in DRAM"
    );
    assert!(
        !mem.contains(keys[3]),
        "a corrupt block became visible in DRAM"
    );

    // The disk dropped them: now plain misses onto the device.
    let out = engine
        .submit(TransferRequest::blocks(
            TransferPath::DiskToDevice,
            moves(&keys[1..2], &ids[1..2]),
        ))
        .wait()
        .await;
    assert_eq!(out.blocks[0].1, Err(BlockFailure::Miss));
    assert!(
        device
            .read_block(ids[1])
            .expect("block")
            .iter()
            .all(|b| *b == 0)
    );

    let s = engine.stats(TransferPath::DiskToHost);
    assert_eq!((s.blocks, s.failed_blocks), (4, 2));
    assert_eq!(s.bytes, 2 * g.block_bytes());
    disk.close().await.expect("close disk");
}

/// A DRAM block whose bytes were damaged in place is `Corrupt` onto the
/// device (whole and per layer), never copied, and dropped from DRAM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_dram_block_is_not_uploaded() {
    let g = geometry();
    let len = g.block_bytes() as usize;
    let device: Arc<HostDevice> = Arc::new(HostDevice::new(g, 8, HostDeviceOptions::default()));
    let mem = memory("dram-bad", 8);
    let engine = TransferEngine::builder(g)
        .with_device(device.clone())
        .with_memory(mem.clone())
        .build()
        .expect("engine");
    let k = key(3, 0);
    let data = content(k, len);
    // Stored with the checksums of other bytes: as if DRAM flipped a bit.
    let mut other = data.clone();
    other[g.layer_bytes() as usize * 3 + 5] ^= 1;
    let sums = BlockSums::compute(k, g.layer_bytes() as usize, &other);
    mem.put(k, &data, &sums).expect("put");
    let ids = device.allocate(2).expect("device blocks");
    // Layer 0 is intact: it is delivered.
    let out = engine
        .submit(TransferRequest {
            path: TransferPath::HostToDevice,
            span: Span::Layer(0),
            blocks: moves(&[k], &ids[..1]),
        })
        .wait()
        .await;
    assert_eq!(out.blocks[0].1, Ok(()));
    // Layer 3 is not.
    let out = engine
        .submit(TransferRequest {
            path: TransferPath::HostToDevice,
            span: Span::Layer(3),
            blocks: moves(&[k], &ids[1..]),
        })
        .wait()
        .await;
    assert_eq!(out.blocks[0].1, Err(BlockFailure::Corrupt));
    assert!(
        device
            .read_block(ids[1])
            .expect("block")
            .iter()
            .all(|b| *b == 0)
    );
    assert!(!mem.contains(k), "the damaged block stays in DRAM");
}

/// Requests the engine cannot serve fail per block with a reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unservable_requests_fail_per_block() {
    let g = geometry();
    let mem = memory("unservable", 8);
    let engine = TransferEngine::builder(g)
        .with_memory(mem.clone())
        .build()
        .expect("engine");
    let k = key(4, 0);
    let out = engine
        .submit(TransferRequest::blocks(
            TransferPath::HostToDisk,
            key_moves(&[k]),
        ))
        .wait()
        .await;
    assert_eq!(out.blocks[0].1, Err(BlockFailure::Unsupported("h2disk")));
    let out = engine
        .submit(TransferRequest {
            path: TransferPath::HostToRemote,
            span: Span::Layer(0),
            blocks: key_moves(&[k]),
        })
        .wait()
        .await;
    assert!(matches!(
        out.blocks[0].1,
        Err(BlockFailure::InvalidRequest(_))
    ));
    assert!(
        TransferEngine::builder(Geometry::raw(2, 8192).expect("geometry"))
            .with_memory(mem)
            .build()
            .is_err()
    );
}

/// In flight, a destination is not readable and a source not evictable:
/// through the hooks (an [`InFlightTable`]) for the device, and through the
/// tier itself for DRAM (an uncommitted slot is invisible). Completion makes
/// both readable, and the handle reports done only then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destinations_are_unreadable_until_completion() {
    let g = geometry();
    let len = g.block_bytes() as usize;
    let host: Arc<dyn Device> = Arc::new(HostDevice::new(g, 16, HostDeviceOptions::default()));
    let device = Arc::new(GatedDevice::new(host));
    let mem = memory("inflight", 16);
    let table = Arc::new(InFlightTable::new());
    let engine = TransferEngine::builder(g)
        .with_device(device.clone())
        .with_memory(mem.clone())
        .with_hooks(table.clone())
        .build()
        .expect("engine");
    let keys: Vec<BlockHash> = (0..3).map(|i| key(5, i)).collect();
    let ids = fill_device(device.as_ref(), &keys).await;

    // G1 -> G2 held at the device.
    device.hold(CopyDirection::Download, true);
    let h = engine.submit(TransferRequest::blocks(
        TransferPath::DeviceToHost,
        moves(&keys, &ids),
    ));
    for k in &keys {
        assert!(!table.is_readable(Tier::G2, *k));
        assert!(!table.is_evictable(Tier::G1, *k));
    }
    let released = device.release_next(CopyDirection::Download).await;
    // The copy has been issued (we released it), but until the engine
    // commits, DRAM must not serve the block.
    assert_eq!(released.blocks, ids);
    let out = h.wait().await;
    assert!(out.all_delivered(), "{:?}", out.failures());
    let mut buf = vec![0u8; len];
    for k in &keys {
        assert!(table.is_readable(Tier::G2, *k));
        assert!(table.is_evictable(Tier::G1, *k));
        assert_eq!(mem.get(*k, &mut buf), Lookup::Hit);
    }

    // A second offload held: DRAM does not serve it before completion.
    let k2 = key(5, 9);
    let id2 = fill_device(device.as_ref(), &[k2]).await;
    let h2 = engine.submit(TransferRequest::blocks(
        TransferPath::DeviceToHost,
        moves(&[k2], &id2),
    ));
    assert!(!h2.is_done());
    assert_eq!(
        mem.get(k2, &mut buf),
        Lookup::Miss,
        "readable before completion"
    );
    assert!(!mem.contains(k2));
    assert!(!table.is_readable(Tier::G2, k2));
    device.release_next(CopyDirection::Download).await;
    assert_eq!(h2.block(0).await, Ok(()));
    assert!(h2.is_done());
    assert_eq!(mem.get(k2, &mut buf), Lookup::Hit);
    assert!(buf == content(k2, len));

    // G2 -> G1 held: the device block is not readable, the DRAM source not
    // evictable, until completion.
    device.hold(CopyDirection::Upload, true);
    let fresh = device.allocate(1).expect("device block");
    let h3 = engine.submit(TransferRequest::blocks(
        TransferPath::HostToDevice,
        moves(&keys[..1], &fresh),
    ));
    assert!(!table.is_readable(Tier::G1, keys[0]));
    assert!(!table.is_evictable(Tier::G2, keys[0]));
    device.release_next(CopyDirection::Upload).await;
    assert_eq!(h3.wait().await.delivered(), 1);
    assert!(table.is_readable(Tier::G1, keys[0]));
    assert!(table.is_evictable(Tier::G2, keys[0]));
    assert_eq!(table.in_flight_blocks(), 0);
}

/// With several batches in flight per path, layer batches overlap at the
/// device (all three held at once) and each still completes intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_in_flight_overlap_on_one_path() {
    let g = geometry();
    let len = g.block_bytes() as usize;
    let host: Arc<HostDevice> = Arc::new(HostDevice::new(g, 8, HostDeviceOptions::default()));
    let device = Arc::new(GatedDevice::new(host.clone()));
    let mem = memory("overlap", 8);
    let engine = TransferEngine::builder(g)
        .with_device(device.clone())
        .with_memory(mem.clone())
        .with_batches_in_flight(3)
        .build()
        .expect("engine");
    let keys: Vec<BlockHash> = (0..2).map(|i| key(6, i)).collect();
    for k in &keys {
        let data = content(*k, len);
        mem.put(
            *k,
            &data,
            &BlockSums::compute(*k, g.layer_bytes() as usize, &data),
        )
        .expect("put");
    }
    let ids = device.allocate(2).expect("device blocks");
    device.hold(CopyDirection::Upload, true);
    let handles: Vec<_> = (0..3)
        .map(|l| {
            engine.submit(TransferRequest {
                path: TransferPath::HostToDevice,
                span: Span::Layer(l),
                blocks: moves(&keys, &ids),
            })
        })
        .collect();
    tokio::time::timeout(Duration::from_secs(30), device.wait_held(3))
        .await
        .expect("three layer batches should be at the device at once");
    device.release_all();
    for h in handles {
        assert!(h.wait().await.all_delivered());
    }
    for (k, id) in keys.iter().zip(&ids) {
        let got = host.read_block(*id).expect("block");
        let upto = g.layer_range(2).end as usize;
        assert!(got[..upto] == content(*k, len)[..upto]);
    }
    assert_eq!(engine.stats(TransferPath::HostToDevice).batches, 3);
}
