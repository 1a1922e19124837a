//! `GatedEngine`: holds the kind it is told to, in arrival order, passes
//! everything else, and lets held batches go one by one or all at once.

use std::sync::Arc;

use kvtier_io::{AlignedBuf, GatedEngine, Held, IoBatch, IoEngine, PsyncEngine, open_direct};

const BLOCK: usize = 4096;

fn gate() -> (tempfile::TempDir, Arc<GatedEngine>, kvtier_io::FileId) {
    let dir = tempfile::tempdir().expect("tempdir");
    let inner: Arc<dyn IoEngine> = Arc::new(PsyncEngine::new(2, 8).expect("psync"));
    let gate = Arc::new(GatedEngine::new(inner));
    let file = open_direct(&dir.path().join("f"), 4 * BLOCK as u64).expect("open");
    let id = gate.register_file(file).expect("register");
    (dir, gate, id)
}

fn write(id: kvtier_io::FileId, block: u64, byte: u8) -> IoBatch {
    let mut buf = AlignedBuf::zeroed(BLOCK, BLOCK);
    buf.fill(byte);
    let mut batch = IoBatch::new();
    batch.write_owned(id, block * BLOCK as u64, buf);
    batch
}

fn read(id: kvtier_io::FileId, block: u64) -> IoBatch {
    let mut batch = IoBatch::new();
    batch.read_owned(id, block * BLOCK as u64, AlignedBuf::zeroed(BLOCK, BLOCK));
    batch
}

#[tokio::test]
async fn holds_only_the_kind_asked_and_releases_in_arrival_order() {
    let (_dir, gate, id) = gate();
    gate.hold(Held::Reads);
    // A write passes while reads are held.
    gate.submit(write(id, 0, 7)).wait().check().expect("write");
    let first = gate.submit(read(id, 0));
    let second = gate.submit(read(id, 1));
    gate.wait_held(2).await;
    assert_eq!(gate.held(), 2);
    gate.release_next().await;
    assert_eq!(gate.held(), 1);
    let done = tokio::task::spawn_blocking(move || first.wait())
        .await
        .expect("join");
    done.check().expect("first read");
    gate.open();
    assert_eq!(gate.held(), 0);
    let done = tokio::task::spawn_blocking(move || second.wait())
        .await
        .expect("join");
    done.check().expect("second read");
    assert_eq!(gate.log(), [Held::Writes, Held::Reads, Held::Reads]);
    // Open: nothing is held any more.
    gate.submit(read(id, 2))
        .wait()
        .check()
        .expect("read after open");
    assert_eq!(gate.held(), 0);
}

#[tokio::test]
async fn stop_holding_keeps_what_is_held() {
    let (_dir, gate, id) = gate();
    gate.hold(Held::Writes);
    let held = gate.submit(write(id, 0, 1));
    gate.wait_held(1).await;
    gate.stop_holding(Held::Writes);
    gate.submit(write(id, 1, 2))
        .wait()
        .check()
        .expect("write passes");
    assert_eq!(gate.held(), 1);
    gate.release_next().await;
    let done = tokio::task::spawn_blocking(move || held.wait())
        .await
        .expect("join");
    done.check().expect("held write");
}
