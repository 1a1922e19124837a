//! Every sync and checkpoint write goes through the I/O engine, so
//! `FaultyEngine` can fail them; a failed sync latches the whole tier (I12):
//! the blocks whose acknowledgement waited for it are refused, every later
//! put and checkpoint is refused, and after a restart nothing refused is
//! served.

use std::sync::Arc;

use kvtier_disk::{DiskError, DiskTier};
use kvtier_io::{Fault, FaultyEngine, IoEngine, IoKind};

use crate::both_engines;
use crate::common::*;

both_engines!(
    a_failed_seal_sync_latches_the_tier,
    a_failed_checkpoint_sync_latches_the_tier,
    checkpoint_writes_go_through_the_engine,
);

fn fail_data_syncs() -> Vec<Fault> {
    vec![Fault::FailOps {
        kind: Some(IoKind::Fdatasync),
        errno: libc::EIO,
        every: 1,
    }]
}

fn is_sync_failed<T: std::fmt::Debug>(r: &Result<T, DiskError>) -> bool {
    matches!(r, Err(DiskError::SyncFailed { .. }))
}

async fn a_failed_seal_sync_latches_the_tier(kind: Kind) {
    // Two directories: a latch of the directory alone would let later puts
    // go to the other one.
    let (_t, d) = dirs(2);
    let g = geometry();
    let faulty = Arc::new(FaultyEngine::new(kind.engine(), vec![]));
    let engine: Arc<dyn IoEngine> = faulty.clone();
    let mut cfg = config(d, 4 * REGION);
    cfg.sync = true;
    let tier = DiskTier::open(cfg.clone(), engine).unwrap();
    let spr = u64::from(tier.layout().slots_per_region);

    // One full region per directory, each sealed and synced: acknowledged.
    let acked = Blocks::range(&g, 90, 0..2 * spr);
    let syncs = faulty.stats().syncs;
    put_all(&tier, &acked, 2 * spr as usize).await;
    assert_eq!(
        faulty.stats().syncs - syncs,
        2,
        "one sync per sealed region"
    );

    // A third full region: its writes complete, its seal's sync fails, so
    // none of its blocks is acknowledged.
    faulty.set_faults(fail_data_syncs());
    let unacked = Blocks::range(&g, 91, 0..spr);
    let r = tier.put_batch(&unacked.puts()).await;
    assert!(r.iter().all(is_sync_failed), "{r:?}");
    assert_eq!(faulty.injected(), 1);
    assert!(unacked.keys.iter().all(|k| !tier.contains(*k)));
    let s = tier.stats();
    assert_eq!(s.failed_dirs, 1, "the other directory did not fail");
    assert_eq!(s.io_errors, 1);

    // Syncs work again, but the tier stays latched: nothing more is
    // written, synced or acknowledged, neither blocks nor checkpoints.
    faulty.set_faults(vec![]);
    let io = faulty.stats();
    let later = Blocks::range(&g, 92, 0..4);
    let r = tier.put_batch(&later.puts()).await;
    assert!(r.iter().all(is_sync_failed), "{r:?}");
    assert!(later.keys.iter().all(|k| !tier.contains(*k)));
    assert!(is_sync_failed(&tier.checkpoint().await));
    // Reads go on.
    check_all_hit(&tier, &acked.keys).await;
    assert!(is_sync_failed(&tier.close().await));
    let after = faulty.stats();
    assert_eq!(after.writes, io.writes, "nothing written after the latch");
    assert_eq!(after.syncs, io.syncs, "nothing synced after the latch");
    drop(tier);

    // Restart: the latch is gone; every acknowledged block is back.
    let tier = DiskTier::open(cfg, kind.engine()).unwrap();
    check_all_hit(&tier, &acked.keys).await;
    // Refused blocks were never written.
    assert_eq!(check_never_wrong(&tier, &later.keys).await, 0);
    // The blocks whose sync failed were written: as after a crash before
    // their acknowledgement (crash case 3), they may come back, and only
    // with their exact bytes.
    check_never_wrong(&tier, &unacked.keys).await;
    let again = Blocks::range(&g, 93, 0..4);
    put_all(&tier, &again, 4).await;
    check_all_hit(&tier, &again.keys).await;
    tier.close().await.unwrap();
}

async fn a_failed_checkpoint_sync_latches_the_tier(kind: Kind) {
    let (_t, d) = dirs(1);
    let g = geometry();
    let faulty = Arc::new(FaultyEngine::new(kind.engine(), vec![]));
    let engine: Arc<dyn IoEngine> = faulty.clone();
    let mut cfg = config(d.clone(), 4 * REGION);
    cfg.sync = true;
    let tier = DiskTier::open(cfg.clone(), engine).unwrap();
    let acked = Blocks::range(&g, 94, 0..8);
    put_all(&tier, &acked, 8).await;
    tier.checkpoint().await.unwrap();
    let index = d[0].join("kvtier-disk.index");
    let before = std::fs::read(&index).unwrap();

    // The checkpoint's sync of the data file fails: no checkpoint is
    // written, and the tier is latched.
    let more = Blocks::range(&g, 95, 0..8);
    put_all(&tier, &more, 8).await;
    faulty.set_faults(fail_data_syncs());
    assert!(is_sync_failed(&tier.checkpoint().await));
    assert_eq!(
        std::fs::read(&index).unwrap(),
        before,
        "checkpoint unchanged"
    );
    faulty.set_faults(vec![]);
    let later = Blocks::range(&g, 96, 0..4);
    let r = tier.put_batch(&later.puts()).await;
    assert!(r.iter().all(is_sync_failed), "{r:?}");
    assert!(is_sync_failed(&tier.close().await));
    assert_eq!(std::fs::read(&index).unwrap(), before, "close wrote none");
    drop(tier);

    let tier = DiskTier::open(cfg, kind.engine()).unwrap();
    check_all_hit(&tier, &acked.keys).await;
    // Acknowledged as readable before the failure: never wrong bytes.
    check_never_wrong(&tier, &more.keys).await;
    assert_eq!(check_never_wrong(&tier, &later.keys).await, 0);
    tier.close().await.unwrap();
}

/// A failed checkpoint write (not a sync) fails that checkpoint only: the
/// previous one stays, and the tier goes on.
async fn checkpoint_writes_go_through_the_engine(kind: Kind) {
    let (_t, d) = dirs(1);
    let g = geometry();
    let faulty = Arc::new(FaultyEngine::new(kind.engine(), vec![]));
    let engine: Arc<dyn IoEngine> = faulty.clone();
    let tier = DiskTier::open(config(d.clone(), 4 * REGION), engine).unwrap();
    let blocks = Blocks::range(&g, 97, 0..8);
    put_all(&tier, &blocks, 8).await;
    let io = faulty.stats();
    tier.checkpoint().await.unwrap();
    let after = faulty.stats();
    assert!(
        after.writes > io.writes,
        "the checkpoint was written through the engine"
    );
    assert_eq!(
        after.syncs - io.syncs,
        2,
        "its file and its directory synced"
    );
    let index = d[0].join("kvtier-disk.index");
    let before = std::fs::read(&index).unwrap();

    faulty.set_faults(vec![Fault::FailOps {
        kind: Some(IoKind::Write),
        errno: libc::EIO,
        every: 1,
    }]);
    let e = tier.checkpoint().await.unwrap_err();
    assert!(matches!(e, DiskError::Engine { .. }), "{e}");
    assert_eq!(std::fs::read(&index).unwrap(), before);
    faulty.set_faults(vec![]);
    let more = Blocks::range(&g, 98, 0..4);
    put_all(&tier, &more, 4).await;
    tier.close().await.unwrap();
    assert_ne!(std::fs::read(&index).unwrap(), before, "close checkpointed");
}
