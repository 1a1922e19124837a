//! Layer-major reads of adjacent slots: one op per layer of a run, headers
//! with layer 0, each slot decided by its own bytes (I17), failed run reads
//! retried slot by slot.

use std::sync::Arc;

use kvtier_core::{BlockHash, Lookup};
use kvtier_disk::{DiskTier, RegionLayout};
use kvtier_io::{AlignedBuf, Fault, FaultyEngine, IoEngine, IoKind};
use proptest::prelude::*;

use crate::common::*;

/// Only layer-major lives have runs.
macro_rules! layer_engines {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                use $crate::common::{Kind, with_layout};
                use kvtier_disk::RegionLayout::Layer;
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn psync() {
                    with_layout(Layer, super::$name(Kind::Psync)).await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn uring() {
                    with_layout(Layer, super::$name(Kind::Uring)).await
                }
            }
        )*
    };
}

layer_engines!(
    a_layer_wise_load_of_a_run_takes_one_read_per_layer,
    a_flipped_bit_in_a_run_fails_only_its_slot,
    a_failed_run_read_is_retried_slot_by_slot,
    short_run_reads_never_serve_wrong_bytes,
);

/// Reads layers `range` of `keys`; each outcome with its bytes.
async fn layers(
    tier: &DiskTier,
    keys: &[BlockHash],
    range: std::ops::Range<u32>,
) -> Vec<(Lookup, Vec<u8>)> {
    let len = range.len() * tier.geometry().layer_bytes() as usize;
    let reqs = keys
        .iter()
        .map(|k| (*k, AlignedBuf::zeroed(len, 4096)))
        .collect();
    tier.read_layers(reqs, range)
        .await
        .into_iter()
        .map(|(b, l)| (l, b.to_vec()))
        .collect()
}

/// The bytes of layers `range` of block `key`.
fn layer_content(tier: &DiskTier, key: BlockHash, range: &std::ops::Range<u32>) -> Vec<u8> {
    let g = tier.geometry();
    let lb = g.layer_bytes() as usize;
    content(key, g.block_bytes() as usize)[range.start as usize * lb..range.end as usize * lb]
        .to_vec()
}

/// A fresh tier over `engine` holding `n` blocks put in one batch (so on
/// adjacent slots of one region).
async fn run_of(engine: Arc<dyn IoEngine>, n: u64) -> (tempfile::TempDir, DiskTier, Blocks) {
    let (t, d) = dirs(1);
    let tier = DiskTier::open(config(d, 4 * REGION), engine).unwrap();
    let blocks = Blocks::range(&geometry(), 61, 0..n);
    put_all(&tier, &blocks, n as usize).await;
    (t, tier, blocks)
}

async fn a_layer_wise_load_of_a_run_takes_one_read_per_layer(kind: Kind) {
    let (_t, tier, blocks) = run_of(kind.engine(), 16).await;
    let g = geometry();
    let before = tier.stats();
    for layer in 0..g.layers {
        let ios = tier.stats().read_ios;
        for ((l, bytes), k) in layers(&tier, &blocks.keys, layer..layer + 1)
            .await
            .into_iter()
            .zip(&blocks.keys)
        {
            assert_eq!(l, Lookup::Hit);
            assert!(bytes == layer_content(&tier, *k, &(layer..layer + 1)));
        }
        // Layer 0 brings the headers; later layers find the sums cached.
        assert_eq!(tier.stats().read_ios - ios, 1, "layer {layer}");
    }
    let s = tier.stats();
    assert_eq!(s.read_runs - before.read_runs, g.layers as u64);
    assert_eq!(s.layer_pieces - before.layer_pieces, 16 * g.layers as u64);
    // Whole blocks of the run: one read per layer too.
    let ios = tier.stats().read_ios;
    check_all_hit(&tier, &blocks.keys).await;
    assert_eq!(tier.stats().read_ios - ios, g.layers as u64);
}

async fn a_flipped_bit_in_a_run_fails_only_its_slot(kind: Kind) {
    let faulty = Arc::new(FaultyEngine::new(kind.engine(), vec![]));
    let (_t, tier, blocks) = run_of(faulty.clone(), 16).await;
    // Layer sums cached: the layer-2 read is one op and nothing else.
    layers(&tier, &blocks.keys, 0..1).await;
    faulty.set_faults(vec![Fault::FlipBits { every: 1 }]);
    let out = layers(&tier, &blocks.keys, 2..3).await;
    faulty.set_faults(vec![]);
    let corrupt: Vec<usize> = (0..out.len())
        .filter(|&i| out[i].0 == Lookup::Corrupt)
        .collect();
    assert_eq!(
        corrupt.len(),
        1,
        "{:?}",
        out.iter().map(|o| o.0).collect::<Vec<_>>()
    );
    for (i, ((l, bytes), k)) in out.iter().zip(&blocks.keys).enumerate() {
        if i != corrupt[0] {
            assert_eq!(*l, Lookup::Hit);
            assert!(*bytes == layer_content(&tier, *k, &(2..3)));
        }
        assert_eq!(tier.contains(*k), i != corrupt[0]);
    }
    assert_eq!(tier.stats().run_retries, 0);
}

async fn a_failed_run_read_is_retried_slot_by_slot(kind: Kind) {
    let faulty = Arc::new(FaultyEngine::new(kind.engine(), vec![]));
    let (_t, tier, blocks) = run_of(faulty.clone(), 16).await;
    // Every vectored read fails; the plain reads of the retry do not.
    faulty.set_faults(vec![Fault::FailOps {
        kind: Some(IoKind::ReadV),
        errno: libc::EIO,
        every: 1,
    }]);
    for ((l, bytes), k) in layers(&tier, &blocks.keys, 0..2)
        .await
        .into_iter()
        .zip(&blocks.keys)
    {
        assert_eq!(l, Lookup::Hit);
        assert!(bytes == layer_content(&tier, *k, &(0..2)));
    }
    assert_eq!(tier.stats().run_retries, 16);
    check_all_hit(&tier, &blocks.keys).await;
    let s = tier.stats();
    assert_eq!(s.run_retries, 32);
    assert_eq!(s.corrupt, 0);
}

async fn short_run_reads_never_serve_wrong_bytes(kind: Kind) {
    let faulty = Arc::new(FaultyEngine::new(kind.engine(), vec![]));
    let (_t, tier, blocks) = run_of(faulty.clone(), 40).await;
    faulty.set_faults(vec![Fault::ShortReads { every: 3 }]);
    for range in [0..1, 1..3, 0..4] {
        for ((l, bytes), k) in layers(&tier, &blocks.keys, range.clone())
            .await
            .into_iter()
            .zip(&blocks.keys)
        {
            if l == Lookup::Hit {
                assert!(bytes == layer_content(&tier, *k, &range));
            }
        }
    }
    check_never_wrong(&tier, &blocks.keys).await;
    assert!(tier.stats().run_retries > 0);
}

/// The read ops `keys` take, from where the tier put them: per run of
/// adjacent slots one op per layer, per slot alone one per layer, plus a
/// header read for a slot alone, or in a run whose layers start past 0
/// (layer reads, with the layer-sums cache off).
fn expected_ios(
    tier: &DiskTier,
    keys: &[BlockHash],
    range: &std::ops::Range<u32>,
    layer_read: bool,
) -> u64 {
    let mut locs: Vec<_> = keys.iter().filter_map(|k| tier.location(*k)).collect();
    locs.sort_by_key(|l| (l.dir, l.region, l.slot));
    let mut runs: Vec<u64> = Vec::new();
    for (i, l) in locs.iter().enumerate() {
        let joins = i > 0 && {
            let p = locs[i - 1];
            p.dir == l.dir && p.region == l.region && p.slot + 1 == l.slot
        };
        match runs.last_mut() {
            Some(n) if joins => *n += 1,
            _ => runs.push(1),
        }
    }
    let layers = range.len() as u64;
    runs.iter()
        .map(|&n| {
            let headers = match (layer_read, n) {
                (false, _) => 0,
                (true, 1) => 1,
                (true, _) if range.start > 0 => n,
                (true, _) => 0,
            };
            layers + headers
        })
        .sum()
}

fn read_case(
    batches: Vec<usize>,
    removed: Vec<bool>,
    picks: Vec<(bool, u16)>,
    range: Option<(u32, u32)>,
) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(with_layout(RegionLayout::Layer, async move {
        let (_t, d) = dirs(1);
        let mut cfg = config(d, 8 * REGION);
        cfg.layer_sums_cache = 0;
        let tier = DiskTier::open(cfg, Kind::Uring.engine()).unwrap();
        let n: usize = batches.iter().sum();
        let blocks = Blocks::range(&geometry(), 62, 0..n as u64);
        let puts = blocks.puts();
        let mut at = 0;
        for b in &batches {
            for r in tier.put_batch(&puts[at..at + b]).await {
                r.unwrap();
            }
            at += b;
        }
        for (k, gone) in blocks.keys.iter().zip(&removed) {
            if *gone {
                tier.remove(*k);
            }
        }
        // A subset in a random order, no key twice.
        let mut keys: Vec<(u16, BlockHash)> = blocks
            .keys
            .iter()
            .zip(&picks)
            .filter(|(_, (take, _))| *take)
            .map(|(k, (_, order))| (*order, *k))
            .collect();
        keys.sort_by_key(|(o, _)| *o);
        let keys: Vec<BlockHash> = keys.into_iter().map(|(_, k)| k).collect();
        let (r, layer_read) = match range {
            Some((a, len)) => (a..(a + len).min(4), true),
            None => (0..4, false),
        };
        let want = expected_ios(&tier, &keys, &r, layer_read);
        let ios = tier.stats().read_ios;
        let out = match layer_read {
            true => layers(&tier, &keys, r.clone()).await,
            false => get(&tier, &keys).await,
        };
        prop_assert_eq!(tier.stats().read_ios - ios, want);
        for ((l, bytes), k) in out.iter().zip(&keys) {
            match l {
                Lookup::Hit => prop_assert!(*bytes == layer_content(&tier, *k, &r)),
                Lookup::Miss => prop_assert!(tier.location(*k).is_none()),
                other => prop_assert!(false, "{k}: {other:?}"),
            }
        }
        Ok(())
    }))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn any_subset_reads_exactly_in_the_ops_its_runs_take(
        batches in proptest::collection::vec(1usize..60, 1..5),
        removed in proptest::collection::vec(proptest::bool::weighted(0.15), 240),
        picks in proptest::collection::vec((proptest::bool::weighted(0.6), any::<u16>()), 240),
        range in proptest::option::of((0u32..4, 1u32..4)),
    ) {
        read_case(batches, removed, picks, range)?;
    }
}
