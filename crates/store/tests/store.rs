//! Store over both tiers: put lands in DRAM, write-behind to disk under
//! pressure, promotion on read, restart keeps blocks, corruption is a miss.
//! Run against both I/O engines.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use kvtier_core::{
    BlockHash, Geometry, IoEngineKind, MemoryConfig, ModelPreset, RegionEvictionKind,
};
use kvtier_disk::{DiskTier, DiskTierConfig};
use kvtier_io::IoEngine;
use kvtier_mem::{MemoryTier, MemoryTierConfig};
use kvtier_store::{Store, StoreOptions, Tier};

fn geometry() -> Geometry {
    // 2 layers x K/V x 32 tokens x 2 heads x 32 dims x f32 = 32 KiB blocks.
    ModelPreset::Tiny.geometry(32)
}

fn block(key: u128, g: &Geometry) -> Vec<u8> {
    let mut x = (key as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..g.block_bytes())
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn shm_name() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "kvtier-store-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn engine(kind: IoEngineKind) -> Arc<dyn IoEngine> {
    kvtier_io::build_engine(kind, 32, 4).expect("engine")
}

fn memory(g: &Geometry, blocks: u64) -> MemoryTier {
    let cfg = MemoryConfig {
        capacity: kvtier_core::ByteSize(blocks * g.block_bytes()),
        shm_name: shm_name(),
        ..Default::default()
    };
    MemoryTier::create(MemoryTierConfig::new(&cfg, g)).expect("memory tier")
}

fn disk(dir: &Path, g: &Geometry, engine: Arc<dyn IoEngine>) -> DiskTier {
    let cfg = DiskTierConfig {
        dirs: vec![dir.to_path_buf()],
        capacity_per_dir: 16 << 20,
        region_size: 1 << 20,
        geometry: *g,
        eviction: RegionEvictionKind::Fifo,
        reinsert_hot: false,
        checkpoint_interval: Duration::ZERO,
        sync: false,
        register_buffers: true,
        reset: false,
        buffers_per_dir: 2,
        layer_sums_cache: 16384,
    };
    DiskTier::open(cfg, engine).expect("disk tier")
}

fn store(dir: &Path, kind: IoEngineKind, dram_blocks: u64) -> Store {
    let g = geometry();
    let e = engine(kind);
    let d = disk(dir, &g, e.clone());
    Store::from_parts(
        g,
        memory(&g, dram_blocks),
        Some((d, e)),
        StoreOptions {
            demote_batch: 8,
            free_target: 0.25,
        },
    )
}

const ENGINES: [IoEngineKind; 2] = [IoEngineKind::IoUring, IoEngineKind::Psync];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_in_dram() {
    for kind in ENGINES {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), kind, 16);
        let g = *s.geometry();
        for k in 0..8u128 {
            s.put(BlockHash(k), &block(k, &g)).await.unwrap();
        }
        let mut out = vec![0u8; g.block_bytes() as usize];
        for k in 0..8u128 {
            assert_eq!(
                s.get(BlockHash(k), &mut out).await.unwrap(),
                Some(Tier::Memory)
            );
            assert_eq!(out, block(k, &g));
        }
        assert_eq!(s.get(BlockHash(999), &mut out).await.unwrap(), None);
        let st = s.stats();
        assert_eq!((st.hits_memory, st.misses, st.puts), (8, 1, 8));
        s.close().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pressure_writes_behind_and_promotes_back() {
    for kind in ENGINES {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), kind, 8);
        let g = *s.geometry();
        // Four times what DRAM holds: the rest must have gone to disk.
        for k in 0..32u128 {
            s.put(BlockHash(k), &block(k, &g)).await.unwrap();
        }
        let st = s.stats();
        assert!(st.demotions >= 24, "demotions {}", st.demotions);
        assert!(s.memory().len() <= 8);
        let mut out = vec![0u8; g.block_bytes() as usize];
        let mut from_disk = 0;
        for k in 0..32u128 {
            let tier = s.get(BlockHash(k), &mut out).await.unwrap();
            assert!(tier.is_some(), "block {k} lost");
            assert_eq!(out, block(k, &g), "block {k} wrong");
            if tier == Some(Tier::Disk) {
                from_disk += 1;
            }
        }
        assert!(from_disk >= 24);
        assert!(s.stats().promotions >= 1);
        // Batched reads agree with single reads.
        let keys: Vec<BlockHash> = (0..32u128).map(BlockHash).collect();
        let mut bufs: Vec<Vec<u8>> = (0..32)
            .map(|_| vec![0u8; g.block_bytes() as usize])
            .collect();
        let mut dsts: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        let got = s.get_batch(&keys, &mut dsts).await.unwrap();
        assert!(got.iter().all(|t| t.is_some()));
        for (k, b) in bufs.iter().enumerate() {
            assert_eq!(b, &block(k as u128, &g));
        }
        s.close().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_flushes_and_restart_finds_every_block() {
    for kind in ENGINES {
        let dir = tempfile::tempdir().unwrap();
        let g = geometry();
        {
            let s = store(dir.path(), kind, 64);
            for k in 0..20u128 {
                s.put(BlockHash(k), &block(k, &g)).await.unwrap();
            }
            // Everything is still DRAM-only; close must write it all down.
            s.close().await.unwrap();
            assert!(
                s.put(BlockHash(100), &block(100, &g)).await.is_err(),
                "closed store accepted a put"
            );
        }
        let s = store(dir.path(), kind, 64);
        let mut out = vec![0u8; g.block_bytes() as usize];
        for k in 0..20u128 {
            assert_eq!(
                s.get(BlockHash(k), &mut out).await.unwrap(),
                Some(Tier::Disk),
                "block {k}"
            );
            assert_eq!(out, block(k, &g));
        }
        s.close().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_blocks_stay_in_dram_and_bad_lengths_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), IoEngineKind::Auto, 8);
    let g = *s.geometry();
    s.put(BlockHash(1), &block(1, &g)).await.unwrap();
    assert!(s.pin(BlockHash(1)));
    for k in 2..40u128 {
        s.put(BlockHash(k), &block(k, &g)).await.unwrap();
    }
    assert_eq!(s.contains(BlockHash(1)), Some(Tier::Memory));
    assert!(s.put(BlockHash(500), &[0u8; 3]).await.is_err());
    assert_eq!(s.contains(BlockHash(500)), None);
    let mut small = vec![0u8; 7];
    assert!(s.get(BlockHash(1), &mut small).await.is_err());
    s.unpin(BlockHash(1));
    s.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_disk_block_is_a_counted_miss() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let g = geometry();
    {
        let s = store(dir.path(), IoEngineKind::Auto, 64);
        for k in 0..4u128 {
            s.put(BlockHash(k), &block(k, &g)).await.unwrap();
        }
        s.close().await.unwrap();
    }
    // Flip bytes all over the data file (past the first header page): every
    // block's data area gets hit.
    let data = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "regions"))
        .expect("regions file");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&data)
        .unwrap();
    let len = 1u64 << 20; // the first region holds all four blocks
    let mut off = 8192;
    while off < len {
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, off).unwrap();
        b[0] ^= 0x40;
        f.write_all_at(&b, off).unwrap();
        off += 4096;
    }
    f.sync_all().unwrap();
    let s = store(dir.path(), IoEngineKind::Auto, 64);
    let mut out = vec![0u8; g.block_bytes() as usize];
    for k in 0..4u128 {
        // Never the wrong bytes: either a miss, or (if the header page was hit
        // and the block dropped at recovery) also a miss.
        assert_eq!(
            s.get(BlockHash(k), &mut out).await.unwrap(),
            None,
            "block {k} served corrupted"
        );
    }
    let st = s.stats();
    assert_eq!(st.hits_disk, 0);
    assert_eq!(st.misses, 4);
    s.close().await.unwrap();
}

/// Writers and readers race while DRAM holds a fraction of the blocks, so
/// demotion, eviction and promotion run all the time: every read of an
/// acknowledged block returns exactly its bytes (never a miss: a block is
/// never in neither tier), and nothing else ever comes back. Readers keep
/// going until the writers are done, so the phases overlap by construction;
/// a final pass reads every block back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_puts_and_gets_under_pressure_never_lose_or_corrupt() {
    use std::collections::HashSet;
    use std::sync::Mutex;
    use std::sync::atomic::AtomicBool;
    for kind in ENGINES {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), kind, 12);
        let g = *s.geometry();
        let acked: Arc<Mutex<HashSet<u128>>> = Arc::default();
        let writing = Arc::new(AtomicBool::new(true));
        let mut writers = Vec::new();
        for w in 0..3u128 {
            let (s, acked) = (s.clone(), acked.clone());
            writers.push(tokio::spawn(async move {
                for i in 0..40u128 {
                    let k = w * 1000 + i;
                    s.put(BlockHash(k), &block(k, &g)).await.unwrap();
                    acked.lock().unwrap().insert(k);
                    tokio::task::yield_now().await;
                }
            }));
        }
        let mut readers = Vec::new();
        for r in 0..2u64 {
            let (s, acked, writing) = (s.clone(), acked.clone(), writing.clone());
            readers.push(tokio::spawn(async move {
                let mut out = vec![0u8; g.block_bytes() as usize];
                let mut x = r + 1;
                let mut reads = 0u64;
                while writing.load(Ordering::Acquire) || reads < 100 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let k = ((x >> 33) % 3) as u128 * 1000 + ((x >> 40) % 40) as u128;
                    let was_acked = acked.lock().unwrap().contains(&k);
                    match s.get(BlockHash(k), &mut out).await.unwrap() {
                        Some(_) => assert_eq!(out, block(k, &g), "block {k} came back wrong"),
                        None => assert!(!was_acked, "acknowledged block {k} was lost"),
                    }
                    reads += 1;
                    tokio::task::yield_now().await;
                }
            }));
        }
        for t in writers {
            t.await.unwrap();
        }
        writing.store(false, Ordering::Release);
        for t in readers {
            t.await.unwrap();
        }
        // Every block, once more: 120 blocks, 12 DRAM slots, so most come
        // back from disk through promotion.
        let mut out = vec![0u8; g.block_bytes() as usize];
        for w in 0..3u128 {
            for i in 0..40u128 {
                let k = w * 1000 + i;
                assert!(
                    s.get(BlockHash(k), &mut out).await.unwrap().is_some(),
                    "{kind:?}: block {k} lost"
                );
                assert_eq!(out, block(k, &g), "{kind:?}: block {k} wrong");
            }
        }
        let st = s.stats();
        assert_eq!(st.corrupt_memory + st.corrupt_disk, 0);
        assert!(st.demotions > 0 && st.promotions > 0, "{kind:?}: {st:?}");
        s.close().await.unwrap();
    }
}
