//! The transfer engine end to end over real tiers: a shared-memory
//! [`MemoryTier`] in /dev/shm (G2) and a [`DiskTier`] in a temporary
//! directory (G3), on both I/O engines (io_uring and the pread/pwrite
//! pool), the disk gated where the test decides when bytes move. Bytes must arrive equal, verified; a corrupted disk block is a
//! per-block failure, never delivered; destinations are unreadable until
//! their transfer completes.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use kvtier_core::{BlockHash, BlockSums, Geometry, Lookup};
use kvtier_disk::DiskTier;
use kvtier_io::{IoEngine, PsyncEngine, UringEngine};
use kvtier_manager::transfer::{
    BlockFailure, BlockMove, HostLanding, InFlightTable, Span, TransferEngine, TransferRequest,
};
use kvtier_manager::{Tier, TransferPath};
use kvtier_mem::{MemoryTier, Reserve};
use kvtier_tier::TierStore;

use kvtier_io::{GatedEngine, Held};

#[path = "support/tiers.rs"]
// Shared with other tests; this one needs DRAM and disks.
#[allow(dead_code)]
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

/// Puts `content(key)` of each of `keys` into DRAM, with its checksums.
fn fill_dram(mem: &MemoryTier, keys: &[BlockHash]) {
    let g = geometry();
    for k in keys {
        let data = content(*k, g.block_bytes() as usize);
        let sums = BlockSums::compute(*k, g.layer_bytes() as usize, &data);
        mem.put(*k, &data, &sums).expect("put");
    }
}

/// A DRAM slot reserved for each of `keys`, as landings of layer reads.
fn landings(mem: &MemoryTier, keys: &[BlockHash]) -> Vec<BlockMove> {
    keys.iter()
        .map(|k| match mem.reserve(*k).expect("reserve") {
            Reserve::Reserved(slot) => {
                BlockMove::landing(HostLanding::new(slot, geometry().layers))
            }
            other => panic!("no landing for {k}: {other:?}"),
        })
        .collect()
}

/// Reads layer `layer` of `blocks` from the disk into their landings.
fn layer_request(layer: u32, blocks: &[BlockMove]) -> TransferRequest {
    TransferRequest {
        path: TransferPath {
            from: Tier::G3,
            to: Tier::G2,
        },
        span: Span::Layer(layer),
        blocks: blocks.to_vec(),
    }
}

/// Checks that DRAM serves each of `keys` with its own bytes.
fn assert_in_dram(mem: &MemoryTier, keys: &[BlockHash]) {
    let len = geometry().block_bytes() as usize;
    let mut buf = vec![0u8; len];
    for k in keys {
        assert_eq!(mem.get(*k, &mut buf), Lookup::Hit, "{k} not in DRAM");
        assert!(buf == content(*k, len), "DRAM bytes of {k}");
    }
}

fn key_moves(keys: &[BlockHash]) -> Vec<BlockMove> {
    keys.iter().map(|k| BlockMove::key(*k)).collect()
}

/// Moves `keys` from DRAM down to the disk (every block delivered), then
/// drops DRAM's copies: the blocks are on the disk only.
async fn onto_disk_only(engine: &TransferEngine, mem: &MemoryTier, keys: &[BlockHash]) {
    let out = engine
        .submit(TransferRequest::blocks(
            TransferPath {
                from: Tier::G2,
                to: Tier::G3,
            },
            key_moves(keys),
        ))
        .wait()
        .await;
    assert!(out.all_delivered(), "{:?}", out.failures());
    for k in keys {
        assert!(mem.remove(*k));
    }
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

/// G2 -> G3 -> G2, whole blocks and layer by layer into landings: the
/// bytes that arrive are the bytes that left, with the checksums they
/// entered with; metrics count every path.
async fn every_path_moves_bytes_intact(kind: Kind) {
    let g = geometry();
    let len = g.block_bytes() as usize;
    let mem = memory("e2e", 32);
    let (_dir, disk) = disk("kvtier-mgr-transfer", 4 << 20, kind.engine());
    let engine = TransferEngine::builder(tiers::list(
        Some(&mem),
        vec![disk.clone() as Arc<dyn TierStore>],
    ))
    .build()
    .expect("engine");
    let keys: Vec<BlockHash> = (0..8).map(|i| key(1, i)).collect();
    fill_dram(&mem, &keys);

    // G2 -> G3, in two requests submitted together (one batch if the
    // worker sees both).
    let a = engine.submit(TransferRequest::blocks(
        TransferPath {
            from: Tier::G2,
            to: Tier::G3,
        },
        key_moves(&keys[..4]),
    ));
    let b = engine.submit(TransferRequest::blocks(
        TransferPath {
            from: Tier::G2,
            to: Tier::G3,
        },
        key_moves(&keys[4..]),
    ));
    assert!(a.wait().await.all_delivered());
    assert!(b.wait().await.all_delivered());
    assert!(keys.iter().all(|k| disk.contains(*k)));

    // G3 -> G2 after DRAM lost them, whole blocks.
    for k in &keys {
        assert!(mem.remove(*k));
    }
    let io_batches = disk.engine().stats().batches;
    let out = engine
        .submit(TransferRequest::blocks(
            TransferPath {
                from: Tier::G3,
                to: Tier::G2,
            },
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
    assert_in_dram(&mem, &keys);
    for k in &keys {
        let r = mem.get_ref(*k).expect("in DRAM");
        assert_eq!(
            r.sums(),
            BlockSums::compute(*k, g.layer_bytes() as usize, &content(*k, len))
        );
    }

    // G3 -> G2 again, layer by layer into landings: a block is published
    // by its last layer, not before.
    for k in &keys {
        assert!(mem.remove(*k));
    }
    let landed = landings(&mem, &keys);
    let mut buf = vec![0u8; len];
    for l in 0..g.layers {
        assert!(keys.iter().all(|k| mem.get(*k, &mut buf) == Lookup::Miss));
        let io_batches = disk.engine().stats().batches;
        let out = engine.submit(layer_request(l, &landed)).wait().await;
        assert!(out.all_delivered(), "layer {l}: {:?}", out.failures());
        assert_eq!(
            disk.engine().stats().batches - io_batches,
            1,
            "layer {l} of 8 blocks in one I/O submission"
        );
    }
    assert_in_dram(&mem, &keys);

    let h2disk = engine.stats(TransferPath {
        from: Tier::G2,
        to: Tier::G3,
    });
    assert_eq!(
        (h2disk.transfers, h2disk.blocks, h2disk.failed_blocks),
        (2, 8, 0)
    );
    assert_eq!(h2disk.bytes, 8 * g.block_bytes());
    assert!((1..=2).contains(&h2disk.batches));
    assert_eq!(h2disk.queue_depth, 0);
    assert!(h2disk.max_queue_depth >= 4);
    assert_eq!(h2disk.latency.count, 2);
    let disk2h = engine.stats(TransferPath {
        from: Tier::G3,
        to: Tier::G2,
    });
    assert_eq!(disk2h.bytes, 2 * 8 * g.block_bytes());
    assert_eq!(disk2h.transfers, 1 + g.layers as u64);
    assert_eq!(disk2h.failed_blocks, 0);
    disk.close().await.expect("close disk");
}

/// Flipped bytes on disk: those blocks fail as `Corrupt` on every read path
/// (whole and per layer into DRAM) and DRAM never holds them; the other
/// blocks of the same batch arrive.
async fn corrupted_disk_blocks_are_per_block_misses(kind: Kind) {
    let g = geometry();
    let len = g.block_bytes() as usize;
    let mem = memory("corrupt", 32);
    let (_dir, disk) = disk("kvtier-mgr-transfer", 4 << 20, kind.engine());
    let engine = TransferEngine::builder(tiers::list(
        Some(&mem),
        vec![disk.clone() as Arc<dyn TierStore>],
    ))
    .build()
    .expect("engine");
    let keys: Vec<BlockHash> = (0..6).map(|i| key(2, i)).collect();
    fill_dram(&mem, &keys);
    onto_disk_only(&engine, &mem, &keys).await;
    // Block 1: a byte in layer 0; block 3: a byte in layer 2; block 5: a
    // byte in layer 1 (read per layer below).
    flip_on_disk(&disk, keys[1], 100);
    flip_on_disk(&disk, keys[3], 2 * g.layer_bytes() + 7);
    flip_on_disk(&disk, keys[5], g.layer_bytes() + 3);

    // Per layer into landings: layer 0 of both arrives, only the damaged
    // layer of block 5 fails, and block 5 is never published.
    let landed = landings(&mem, &keys[4..]);
    let out = engine.submit(layer_request(0, &landed)).wait().await;
    assert!(out.all_delivered(), "{:?}", out.failures());
    let out = engine.submit(layer_request(1, &landed)).wait().await;
    assert_eq!(out.blocks[0].1, Ok(()));
    assert_eq!(out.blocks[1].1, Err(BlockFailure::Corrupt));
    for l in 2..g.layers {
        let out = engine.submit(layer_request(l, &landed)).wait().await;
        assert_eq!(out.blocks[0].1, Ok(()), "layer {l}");
    }
    assert_in_dram(&mem, &keys[4..5]);
    let mut buf = vec![0u8; len];
    assert_eq!(mem.get(keys[5], &mut buf), Lookup::Miss);
    assert!(
        !mem.contains(keys[5]),
        "a block with a corrupt layer became visible in DRAM"
    );

    // Whole blocks into DRAM.
    let before = engine.stats(TransferPath {
        from: Tier::G3,
        to: Tier::G2,
    });
    let out = engine
        .submit(TransferRequest::blocks(
            TransferPath {
                from: Tier::G3,
                to: Tier::G2,
            },
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
    assert_in_dram(&mem, &[keys[0], keys[2]]);
    assert!(
        !mem.contains(keys[1]),
        "a corrupt block became visible in DRAM"
    );
    assert!(
        !mem.contains(keys[3]),
        "a corrupt block became visible in DRAM"
    );
    let s = engine.stats(TransferPath {
        from: Tier::G3,
        to: Tier::G2,
    });
    assert_eq!(
        (
            s.blocks - before.blocks,
            s.failed_blocks - before.failed_blocks
        ),
        (4, 2)
    );
    assert_eq!(s.bytes - before.bytes, 2 * g.block_bytes());

    // The disk dropped them: now plain misses.
    let out = engine
        .submit(TransferRequest::blocks(
            TransferPath {
                from: Tier::G3,
                to: Tier::G2,
            },
            key_moves(&keys[1..2]),
        ))
        .wait()
        .await;
    assert_eq!(out.blocks[0].1, Err(BlockFailure::Miss));
    assert!(!mem.contains(keys[1]));
    disk.close().await.expect("close disk");
}

/// A DRAM block whose bytes were damaged in place goes down with the
/// checksums it carries, never new ones computed over the damage: the copy
/// below fails verification when read back (the damaged layer per layer,
/// and whole), is never published in DRAM, and the disk drops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_dram_block_never_comes_back_from_below() {
    let g = geometry();
    let len = g.block_bytes() as usize;
    let mem = memory("dram-bad", 8);
    let (_dir, disk) = disk("kvtier-mgr-transfer", 4 << 20, Kind::Psync.engine());
    let engine = TransferEngine::builder(tiers::list(
        Some(&mem),
        vec![disk.clone() as Arc<dyn TierStore>],
    ))
    .build()
    .expect("engine");
    let k = key(3, 0);
    let data = content(k, len);
    // Stored with the checksums of other bytes: as if DRAM flipped a bit.
    let mut other = data.clone();
    other[g.layer_bytes() as usize * 3 + 5] ^= 1;
    let sums = BlockSums::compute(k, g.layer_bytes() as usize, &other);
    mem.put(k, &data, &sums).expect("put");
    onto_disk_only(&engine, &mem, &[k]).await;

    // Layer 0 is intact: it lands. Layer 3 is not: the block is never
    // published.
    let landed = landings(&mem, &[k]);
    let out = engine.submit(layer_request(0, &landed)).wait().await;
    assert_eq!(out.blocks[0].1, Ok(()));
    let out = engine.submit(layer_request(3, &landed)).wait().await;
    assert_eq!(out.blocks[0].1, Err(BlockFailure::Corrupt));
    drop(landed);
    assert!(!mem.contains(k), "the damaged block reached DRAM");

    // The failed layer read dropped the disk's copy: whole, it is a miss.
    let out = engine
        .submit(TransferRequest::blocks(
            TransferPath {
                from: Tier::G3,
                to: Tier::G2,
            },
            key_moves(&[k]),
        ))
        .wait()
        .await;
    assert_eq!(out.blocks[0].1, Err(BlockFailure::Miss));
    assert!(!mem.contains(k), "the damaged block reached DRAM");
    assert!(!disk.contains(k), "the disk keeps a block that fails");
    disk.close().await.expect("close disk");
}

/// Requests the engine cannot serve fail per block with a reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unservable_requests_fail_per_block() {
    let mem = memory("unservable", 8);
    let engine = TransferEngine::builder(tiers::list(Some(&mem), vec![]))
        .build()
        .expect("engine");
    let k = key(4, 0);
    let out = engine
        .submit(TransferRequest::blocks(
            TransferPath {
                from: Tier::G2,
                to: Tier::G3,
            },
            key_moves(&[k]),
        ))
        .wait()
        .await;
    let g2_to_g3 = TransferPath {
        from: Tier::G2,
        to: Tier::G3,
    };
    assert_eq!(out.blocks[0].1, Err(BlockFailure::Unsupported(g2_to_g3)));
    let out = engine
        .submit(TransferRequest {
            path: TransferPath {
                from: Tier::G2,
                to: Tier::G4,
            },
            span: Span::Layer(0),
            blocks: key_moves(&[k]),
        })
        .wait()
        .await;
    // A path to a tier the engine lacks is not served, whatever its span.
    assert!(matches!(out.blocks[0].1, Err(BlockFailure::Unsupported(_))));
    // A tier of another block size is refused when the list is made.
    assert!(
        kvtier_manager::TierList::new(
            Geometry::raw(2, 8192).expect("geometry"),
            Some(mem),
            Vec::new()
        )
        .is_err()
    );
}

/// In flight, a destination is not readable and a source not evictable:
/// through the hooks (an [`InFlightTable`]) and through the tiers
/// themselves (a disk write not yet done is not indexed, an uncommitted
/// DRAM slot is invisible). Completion makes both readable, and the
/// handle reports done only then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destinations_are_unreadable_until_completion() {
    let g = geometry();
    let len = g.block_bytes() as usize;
    let mem = memory("inflight", 16);
    let gate = Arc::new(GatedEngine::new(Kind::Psync.engine()));
    let (_dir, disk) = disk("kvtier-mgr-transfer", 4 << 20, gate.clone());
    let table = Arc::new(InFlightTable::new());
    let engine = TransferEngine::builder(tiers::list(
        Some(&mem),
        vec![disk.clone() as Arc<dyn TierStore>],
    ))
    .with_hooks(table.clone())
    .build()
    .expect("engine");
    let keys: Vec<BlockHash> = (0..3).map(|i| key(5, i)).collect();
    fill_dram(&mem, &keys);

    // G2 -> G3 held at the disk's writes.
    gate.hold(Held::Writes);
    let h = engine.submit(TransferRequest::blocks(
        TransferPath {
            from: Tier::G2,
            to: Tier::G3,
        },
        key_moves(&keys),
    ));
    gate.wait_held(1).await;
    for k in &keys {
        assert!(!table.is_readable(Tier::G3, *k));
        assert!(!table.is_evictable(Tier::G2, *k));
        assert!(!disk.contains(*k), "indexed before its write completed");
    }
    assert!(!h.is_done());
    gate.open();
    let out = h.wait().await;
    assert!(out.all_delivered(), "{:?}", out.failures());
    for k in &keys {
        assert!(table.is_readable(Tier::G3, *k));
        assert!(table.is_evictable(Tier::G2, *k));
        assert!(disk.contains(*k));
    }

    // G3 -> G2 held at the disk's reads: DRAM does not serve the block
    // before completion, and the disk's copy is not evictable.
    assert!(mem.remove(keys[0]));
    gate.hold(Held::Reads);
    let h2 = engine.submit(TransferRequest::blocks(
        TransferPath {
            from: Tier::G3,
            to: Tier::G2,
        },
        key_moves(&keys[..1]),
    ));
    gate.wait_held(1).await;
    assert!(!h2.is_done());
    let mut buf = vec![0u8; len];
    assert_eq!(
        mem.get(keys[0], &mut buf),
        Lookup::Miss,
        "readable before completion"
    );
    assert!(!mem.contains(keys[0]));
    assert!(!table.is_readable(Tier::G2, keys[0]));
    assert!(!table.is_evictable(Tier::G3, keys[0]));
    gate.release_next().await;
    assert_eq!(h2.block(0).await, Ok(()));
    assert!(h2.is_done());
    assert_in_dram(&mem, &keys[..1]);
    assert!(table.is_readable(Tier::G2, keys[0]));
    assert!(table.is_evictable(Tier::G3, keys[0]));
    assert_eq!(table.in_flight_blocks(), 0);
    gate.open();
    disk.close().await.expect("close disk");
}

/// With several batches in flight per path, layer batches overlap at the
/// disk (all three held at once) and each still completes intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_in_flight_overlap_on_one_path() {
    let mem = memory("overlap", 8);
    let gate = Arc::new(GatedEngine::new(Kind::Psync.engine()));
    let (_dir, disk) = disk("kvtier-mgr-transfer", 4 << 20, gate.clone());
    let engine = TransferEngine::builder(tiers::list(
        Some(&mem),
        vec![disk.clone() as Arc<dyn TierStore>],
    ))
    .with_batches_in_flight(3)
    .build()
    .expect("engine");
    let keys: Vec<BlockHash> = (0..2).map(|i| key(6, i)).collect();
    fill_dram(&mem, &keys);
    onto_disk_only(&engine, &mem, &keys).await;
    let landed = landings(&mem, &keys);
    gate.hold(Held::Reads);
    let handles: Vec<_> = (0..3)
        .map(|l| engine.submit(layer_request(l, &landed)))
        .collect();
    tokio::time::timeout(Duration::from_secs(30), gate.wait_held(3))
        .await
        .expect("three layer batches should be at the disk at once");
    gate.open();
    for h in handles {
        assert!(h.wait().await.all_delivered());
    }
    assert_eq!(
        engine
            .stats(TransferPath {
                from: Tier::G3,
                to: Tier::G2
            })
            .batches,
        3
    );
    // The last layer publishes the blocks, whole and intact.
    let out = engine.submit(layer_request(3, &landed)).wait().await;
    assert!(out.all_delivered(), "{:?}", out.failures());
    assert_in_dram(&mem, &keys);
    disk.close().await.expect("close disk");
}
