//! One expectation run against every engine: each test below is written once
//! as a function of an engine factory and instantiated for the psync and the
//! io_uring engines by `suite!`. Files live under /tmp (ext4 here), never
//! /dev/shm, whose tmpfs ignores direct-I/O alignment.

mod common;
use common::{BLOCK, Factory, pattern, pattern_byte, psync, uring};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use kvtier_io::{
    AlignedBuf, BatchDone, FileId, IoBatch, IoEngine, IoError, IoKind, IoOp, PsyncEngine,
    UringEngine, dio_alignment, open_direct, uring_unavailable,
};
use proptest::prelude::*;

/// Instantiates each named test for both engines.
macro_rules! suite {
    ($($name:ident),* $(,)?) => {
        mod psync_engine {
            $( #[test] fn $name() { super::$name(super::psync) } )*
        }
        mod uring_engine {
            $( #[test] fn $name() { super::$name(super::uring) } )*
        }
    };
}

suite!(
    write_then_read_patterns,
    empty_batch_is_ready,
    concurrent_batches_from_threads,
    batch_larger_than_queue_depth,
    reads_past_eof_are_short,
    one_failure_does_not_fail_the_others,
    unknown_file_fails_with_ebadf,
    dropped_completion_keeps_owner_until_done,
    dropping_engine_waits_for_in_flight,
    stats_count_ops_and_bytes,
    last_reference_dropped_by_an_owner,
    awaits_on_a_tokio_runtime,
    model_check,
    syncs_are_operations,
    closed_files_are_forgotten_and_ids_reused,
);

/// A temporary directory on a real (alignment-enforcing) file system.
fn tmpdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("kvtier-io-test")
        .tempdir_in("/tmp")
        .expect("tempdir in /tmp")
}

/// Opens a `size`-byte direct-I/O file in `dir` and registers it.
fn file(engine: &dyn IoEngine, dir: &tempfile::TempDir, name: &str, size: u64) -> FileId {
    let path: PathBuf = dir.path().join(name);
    engine
        .register_file(open_direct(&path, size).expect("open_direct"))
        .expect("register_file")
}

fn is_pattern(buf: &[u8], seed: u64, offset: u64) -> bool {
    buf.iter()
        .enumerate()
        .all(|(i, &b)| b == pattern_byte(seed, offset + i as u64))
}

/// Writes the pattern over `[offset, offset + len)` in one batch.
fn write_pattern(engine: &dyn IoEngine, id: FileId, seed: u64, offset: u64, len: usize) {
    let mut batch = IoBatch::new();
    batch.write_owned(id, offset, pattern(seed, offset, len));
    engine.submit(batch).wait().check().expect("write");
}

fn write_then_read_patterns(make: Factory) {
    let Some(engine) = make(32) else { return };
    let dir = tmpdir();
    let id = file(&*engine, &dir, "f", 8 << 20);
    let sizes = [BLOCK, 2 * BLOCK, 64 << 10, 1 << 20];
    let mut offset = 0u64;
    let mut batch = IoBatch::new();
    let mut layout = Vec::new();
    for (i, &len) in sizes.iter().cycle().take(12).enumerate() {
        batch.write_owned(id, offset, pattern(i as u64, offset, len));
        layout.push((offset, len, i as u64));
        offset += len as u64;
    }
    engine.submit(batch).wait().check().expect("writes");

    let mut batch = IoBatch::new();
    for &(offset, len, _) in &layout {
        batch.read_owned(id, offset, AlignedBuf::zeroed(len, BLOCK));
    }
    let mut done = engine.submit(batch).wait();
    done.check().expect("reads");
    for (i, &(offset, len, seed)) in layout.iter().enumerate() {
        assert_eq!(done.results[i].as_ref().ok(), Some(&(len as u32)));
        let buf: AlignedBuf = done.take_owner(i).expect("buffer back");
        assert!(is_pattern(&buf, seed, offset), "op {i} read wrong data");
    }
}

fn empty_batch_is_ready(make: Factory) {
    let Some(engine) = make(8) else { return };
    let mut batch = IoBatch::new();
    batch.keep_alive(42u32);
    let mut done = engine.submit(batch).wait();
    assert!(done.results.is_empty() && done.ops.is_empty());
    assert_eq!(done.take_owner::<u32>(0), Some(42));
}

fn concurrent_batches_from_threads(make: Factory) {
    let Some(engine) = make(16) else { return };
    let dir = tmpdir();
    const THREADS: u64 = 4;
    const BATCHES: u64 = 20;
    const OPS: u64 = 6;
    let span = BATCHES * OPS * BLOCK as u64;
    let id = file(&*engine, &dir, "f", THREADS * span);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let engine = &engine;
            s.spawn(move || {
                let base = t * span;
                // Keep several batches in flight per thread before waiting.
                let mut in_flight = Vec::new();
                for b in 0..BATCHES {
                    let mut batch = IoBatch::new();
                    for o in 0..OPS {
                        let off = base + (b * OPS + o) * BLOCK as u64;
                        batch.write_owned(id, off, pattern(t, off, BLOCK));
                    }
                    in_flight.push(engine.submit(batch));
                }
                for c in in_flight {
                    c.wait().check().expect("write");
                }
                let mut reads = Vec::new();
                for b in 0..BATCHES {
                    let mut batch = IoBatch::new();
                    for o in 0..OPS {
                        let off = base + (b * OPS + o) * BLOCK as u64;
                        batch.read_owned(id, off, AlignedBuf::zeroed(BLOCK, BLOCK));
                    }
                    reads.push(engine.submit(batch));
                }
                for c in reads {
                    let mut done = c.wait();
                    done.check().expect("read");
                    for i in 0..done.ops.len() {
                        let off = done.ops[i].offset;
                        let buf: AlignedBuf = done.take_owner(i).expect("buf");
                        assert!(is_pattern(&buf, t, off), "thread {t} offset {off}");
                    }
                }
            });
        }
    });
    let stats = engine.stats();
    assert_eq!(stats.ops, 2 * THREADS * BATCHES * OPS);
    assert_eq!(stats.errors, 0);
}

fn batch_larger_than_queue_depth(make: Factory) {
    let Some(engine) = make(4) else { return };
    let dir = tmpdir();
    let n = 100u64;
    let id = file(&*engine, &dir, "f", n * BLOCK as u64);
    let mut batch = IoBatch::new();
    for i in 0..n {
        let off = i * BLOCK as u64;
        batch.write_owned(id, off, pattern(7, off, BLOCK));
    }
    engine.submit(batch).wait().check().expect("writes");
    let mut batch = IoBatch::new();
    for i in 0..n {
        batch.read_owned(id, i * BLOCK as u64, AlignedBuf::zeroed(BLOCK, BLOCK));
    }
    let mut done = engine.submit(batch).wait();
    done.check().expect("reads");
    for i in 0..n as usize {
        let buf: AlignedBuf = done.take_owner(i).expect("buf");
        assert!(is_pattern(&buf, 7, (i * BLOCK) as u64));
    }
}

fn reads_past_eof_are_short(make: Factory) {
    let Some(engine) = make(8) else { return };
    let dir = tmpdir();
    let size = 16 * BLOCK as u64;
    let id = file(&*engine, &dir, "f", size);
    write_pattern(&*engine, id, 3, size - BLOCK as u64, BLOCK);
    let mut batch = IoBatch::new();
    // Straddles the end: only the last block exists.
    batch.read_owned(
        id,
        size - BLOCK as u64,
        AlignedBuf::zeroed(2 * BLOCK, BLOCK),
    );
    // Entirely past the end.
    batch.read_owned(id, 2 * size, AlignedBuf::zeroed(BLOCK, BLOCK));
    let mut done = engine.submit(batch).wait();
    assert_eq!(done.results[0].as_ref().ok(), Some(&(BLOCK as u32)));
    assert_eq!(done.results[1].as_ref().ok(), Some(&0));
    match done.check_op(0) {
        Err(IoError::Short {
            done: d, len, kind, ..
        }) => {
            assert_eq!((d, len, kind), (BLOCK as u32, 2 * BLOCK as u32, "read"));
        }
        other => panic!("expected a short read, got {other:?}"),
    }
    assert!(matches!(done.check(), Err(IoError::Short { .. })));
    let buf: AlignedBuf = done.take_owner(0).expect("buf");
    assert!(is_pattern(&buf[..BLOCK], 3, size - BLOCK as u64));
    assert!(
        engine.stats().errors >= 2,
        "short transfers count as errors"
    );
}

fn one_failure_does_not_fail_the_others(make: Factory) {
    let Some(engine) = make(8) else { return };
    let dir = tmpdir();
    let id = file(&*engine, &dir, "f", 64 * BLOCK as u64);
    let align = dio_alignment(dir.path());
    write_pattern(&*engine, id, 5, 0, 4 * BLOCK);

    // A buffer deliberately misaligned for O_DIRECT (EINVAL from the kernel).
    let mut big = AlignedBuf::zeroed(2 * BLOCK, BLOCK);
    let misaligned = IoOp {
        kind: IoKind::Read,
        file: id,
        offset: 0,
        // SAFETY: 1 + BLOCK <= 2 * BLOCK: inside `big`.
        buf: unsafe { big.as_mut_ptr().add(1) },
        len: BLOCK as u32,
    };
    let mut batch = IoBatch::new();
    batch.read_owned(id, 0, AlignedBuf::zeroed(BLOCK, BLOCK));
    // SAFETY: `big` is kept alive by the batch below.
    unsafe { batch.push(misaligned) };
    batch.keep_alive(big);
    batch.read_owned(id, BLOCK as u64, AlignedBuf::zeroed(BLOCK, BLOCK));
    let mut done = engine.submit(batch).wait();
    assert!(done.check_op(0).is_ok());
    assert!(done.check_op(2).is_ok());
    if align.mem > 1 {
        let err = done.results[1]
            .as_ref()
            .expect_err("misaligned direct read");
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
        assert!(matches!(
            done.check_op(1),
            Err(IoError::Op { kind: "read", .. })
        ));
    }
    let a: AlignedBuf = done.take_owner(0).expect("buf 0");
    assert!(is_pattern(&a, 5, 0));
    let b: AlignedBuf = done.take_owner(2).expect("buf 2");
    assert!(is_pattern(&b, 5, BLOCK as u64));
}

fn unknown_file_fails_with_ebadf(make: Factory) {
    let Some(engine) = make(8) else { return };
    let dir = tmpdir();
    let id = file(&*engine, &dir, "f", 4 * BLOCK as u64);
    let mut batch = IoBatch::new();
    batch.read_owned(FileId(999), 0, AlignedBuf::zeroed(BLOCK, BLOCK));
    batch.read_owned(id, 0, AlignedBuf::zeroed(BLOCK, BLOCK));
    let done = engine.submit(batch).wait();
    let err = done.results[0].as_ref().expect_err("unknown file");
    assert_eq!(err.raw_os_error(), Some(libc::EBADF));
    assert!(done.check_op(1).is_ok());

    // A batch made only of bad operations still completes.
    let mut batch = IoBatch::new();
    batch.read_owned(FileId(12345), 0, AlignedBuf::zeroed(BLOCK, BLOCK));
    let done = engine.submit(batch).wait();
    assert_eq!(done.results.len(), 1);
    assert!(done.results[0].is_err());
}

/// Syncs go through `submit` like any operation: data syncs of a data file,
/// full syncs of a directory, each completing with `Ok(0)` and counted; a
/// sync of an unknown file fails with `EBADF`, and a failed sync fails
/// `check` with its kind named.
fn syncs_are_operations(make: Factory) {
    let Some(engine) = make(8) else { return };
    let dir = tmpdir();
    let id = file(&*engine, &dir, "f", 4 * BLOCK as u64);
    let dir_id = engine
        .register_file(std::fs::File::open(dir.path()).expect("open dir"))
        .expect("register dir");
    write_pattern(&*engine, id, 5, 0, BLOCK);
    let before = engine.stats();
    let mut batch = IoBatch::new();
    batch.sync(id, IoKind::Fdatasync);
    batch.sync(dir_id, IoKind::Fsync);
    let done = engine.submit(batch).wait();
    done.check().expect("syncs");
    assert_eq!(done.ops[0].kind, IoKind::Fdatasync);
    assert_eq!(done.ops[1].kind, IoKind::Fsync);
    assert!(done.results.iter().all(|r| matches!(r, Ok(0))));
    let after = engine.stats();
    assert_eq!(after.syncs - before.syncs, 2);
    assert_eq!(after.ops - before.ops, 2);
    assert_eq!(after.errors, before.errors);
    assert_eq!(after.bytes_written, before.bytes_written);

    let mut batch = IoBatch::new();
    batch.sync(FileId(4242), IoKind::Fdatasync);
    let done = engine.submit(batch).wait();
    assert_eq!(
        done.results[0]
            .as_ref()
            .expect_err("unknown file")
            .raw_os_error(),
        Some(libc::EBADF)
    );
    match done.check() {
        Err(IoError::Op { kind, len: 0, .. }) => assert_eq!(kind, "fdatasync"),
        other => panic!("expected a failed fdatasync, got {other:?}"),
    }
    assert_eq!(engine.stats().errors, after.errors + 1);
}

/// `close_file` forgets a file: later operations on its id fail with
/// `EBADF`, closing twice is refused, and the next registration reuses the
/// id (so short-lived files do not pile up).
fn closed_files_are_forgotten_and_ids_reused(make: Factory) {
    let Some(engine) = make(8) else { return };
    let dir = tmpdir();
    let keep = file(&*engine, &dir, "keep", 4 * BLOCK as u64);
    let gone = file(&*engine, &dir, "gone", 4 * BLOCK as u64);
    write_pattern(&*engine, gone, 9, 0, BLOCK);
    engine.close_file(gone).expect("close");
    let mut batch = IoBatch::new();
    batch.read_owned(gone, 0, AlignedBuf::zeroed(BLOCK, BLOCK));
    batch.sync(gone, IoKind::Fdatasync);
    batch.read_owned(keep, 0, AlignedBuf::zeroed(BLOCK, BLOCK));
    let done = engine.submit(batch).wait();
    for i in 0..2 {
        let err = done.results[i].as_ref().expect_err("closed file");
        assert_eq!(err.raw_os_error(), Some(libc::EBADF));
    }
    done.check_op(2).expect("the other file is untouched");
    assert!(matches!(
        engine.close_file(gone),
        Err(IoError::NotRegistered { .. })
    ));
    let again = file(&*engine, &dir, "again", 4 * BLOCK as u64);
    assert_eq!(again, gone, "the lowest free id is reused");
    write_pattern(&*engine, again, 11, 0, BLOCK);
    let mut batch = IoBatch::new();
    batch.read_owned(again, 0, AlignedBuf::zeroed(BLOCK, BLOCK));
    let mut done = engine.submit(batch).wait();
    done.check().expect("read the new file");
    let back: AlignedBuf = done.take_owner(0).expect("buf");
    assert!(is_pattern(&back, 11, 0), "the reused id names the new file");
}

/// An owner that, when dropped, records whether the read into its buffer had
/// already landed. Dropped early (under the kernel), it would see zeros.
struct Witness {
    buf: AlignedBuf,
    seed: u64,
    offset: u64,
    dropped: Arc<AtomicBool>,
    saw_data: Arc<AtomicBool>,
}

impl Drop for Witness {
    fn drop(&mut self) {
        self.saw_data.store(
            is_pattern(&self.buf, self.seed, self.offset),
            Ordering::SeqCst,
        );
        self.dropped.store(true, Ordering::SeqCst);
    }
}

/// What a `Witness` reports: (dropped, saw its data when dropped).
type WitnessFlags = (Arc<AtomicBool>, Arc<AtomicBool>);

/// Queues reads into `Witness` owners and returns the completions plus the
/// flags.
fn witnessed_reads(
    engine: &dyn IoEngine,
    id: FileId,
    n: u64,
    len: usize,
) -> (Vec<kvtier_io::Completion>, Vec<WitnessFlags>) {
    let mut completions = Vec::new();
    let mut flags = Vec::new();
    for i in 0..n {
        let offset = i * len as u64;
        let dropped = Arc::new(AtomicBool::new(false));
        let saw_data = Arc::new(AtomicBool::new(false));
        let mut w = Witness {
            buf: AlignedBuf::zeroed(len, BLOCK),
            seed: 11,
            offset,
            dropped: Arc::clone(&dropped),
            saw_data: Arc::clone(&saw_data),
        };
        let op = IoOp {
            kind: IoKind::Read,
            file: id,
            offset,
            buf: w.buf.as_mut_ptr(),
            len: len as u32,
        };
        let mut batch = IoBatch::new();
        // SAFETY: the buffer belongs to `w`, which the batch keeps alive; its
        // heap memory does not move when `w` does.
        unsafe { batch.push(op) };
        batch.keep_alive(w);
        completions.push(engine.submit(batch));
        flags.push((dropped, saw_data));
    }
    (completions, flags)
}

fn dropped_completion_keeps_owner_until_done(make: Factory) {
    let Some(engine) = make(8) else { return };
    let dir = tmpdir();
    let n = 16u64;
    let len = 64 << 10;
    let id = file(&*engine, &dir, "f", n * len as u64);
    write_pattern(&*engine, id, 11, 0, (n as usize) * len);
    let (completions, flags) = witnessed_reads(&*engine, id, n, len);
    drop(completions);
    // The engine gives no ordering to wait on, so wait for the owners by
    // dropping the engine, which must wait out every in-flight operation.
    drop(engine);
    for (i, (dropped, saw_data)) in flags.iter().enumerate() {
        assert!(dropped.load(Ordering::SeqCst), "owner {i} leaked");
        assert!(
            saw_data.load(Ordering::SeqCst),
            "owner {i} dropped before its read landed"
        );
    }
}

fn dropping_engine_waits_for_in_flight(make: Factory) {
    let Some(engine) = make(4) else { return };
    let dir = tmpdir();
    let n = 40u64;
    let id = file(&*engine, &dir, "f", n * BLOCK as u64);
    write_pattern(&*engine, id, 11, 0, n as usize * BLOCK);
    // More than the queue depth, with the completions kept: they must all
    // resolve with real results even though the engine goes away.
    let (completions, flags) = witnessed_reads(&*engine, id, n, BLOCK);
    drop(engine);
    for c in completions {
        let done: BatchDone = c.wait();
        done.check().expect("completed before the engine went away");
    }
    for (dropped, saw) in flags {
        assert!(dropped.load(Ordering::SeqCst) && saw.load(Ordering::SeqCst));
    }
}

/// Holds the engine; dropping it (on whatever thread completes the batch)
/// drops the engine's last reference, then reports.
struct EngineHolder {
    engine: Option<Arc<dyn IoEngine>>,
    done: std::sync::mpsc::Sender<()>,
}

impl Drop for EngineHolder {
    fn drop(&mut self) {
        drop(self.engine.take());
        let _ = self.done.send(());
    }
}

/// An owner holding the last reference to the engine is dropped on one of
/// the engine's own threads, which must not try to join itself.
fn last_reference_dropped_by_an_owner(make: Factory) {
    let Some(engine) = make(8) else { return };
    let dir = tmpdir();
    let id = file(&*engine, &dir, "f", 4 * BLOCK as u64);
    let (tx, rx) = std::sync::mpsc::channel();
    let mut batch = IoBatch::new();
    batch.read_owned(id, 0, AlignedBuf::zeroed(BLOCK, BLOCK));
    batch.keep_alive(EngineHolder {
        engine: Some(Arc::clone(&engine)),
        done: tx,
    });
    drop(engine.submit(batch));
    drop(engine);
    rx.recv()
        .expect("the holder is dropped once the read completes");
}

fn stats_count_ops_and_bytes(make: Factory) {
    let Some(engine) = make(8) else { return };
    let dir = tmpdir();
    let id = file(&*engine, &dir, "f", 16 * BLOCK as u64);
    let before = engine.stats();
    write_pattern(&*engine, id, 1, 0, 2 * BLOCK);
    let mut batch = IoBatch::new();
    batch.read_owned(id, 0, AlignedBuf::zeroed(BLOCK, BLOCK));
    batch.read_owned(id, BLOCK as u64, AlignedBuf::zeroed(BLOCK, BLOCK));
    engine.submit(batch).wait().check().expect("reads");
    let s = engine.stats();
    assert_eq!(s.batches - before.batches, 2);
    assert_eq!(s.ops - before.ops, 3);
    assert_eq!(s.reads - before.reads, 2);
    assert_eq!(s.writes - before.writes, 1);
    assert_eq!(s.bytes_written - before.bytes_written, 2 * BLOCK as u64);
    assert_eq!(s.bytes_read - before.bytes_read, 2 * BLOCK as u64);
    assert_eq!(s.errors, before.errors);
    assert!(s.syscalls > before.syscalls);
}

fn awaits_on_a_tokio_runtime(make: Factory) {
    let Some(engine) = make(8) else { return };
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let dir = tmpdir();
        let id = file(&*engine, &dir, "f", 8 * BLOCK as u64);
        let mut batch = IoBatch::new();
        batch.write_owned(id, 0, pattern(9, 0, 4 * BLOCK));
        engine.submit(batch).await.check().expect("write");
        // Several completions awaited concurrently on one thread.
        let reads = (0..4u64).map(|i| {
            let mut batch = IoBatch::new();
            batch.read_owned(id, i * BLOCK as u64, AlignedBuf::zeroed(BLOCK, BLOCK));
            engine.submit(batch)
        });
        let pending: Vec<_> = reads.collect();
        for (i, c) in pending.into_iter().enumerate() {
            let mut done = c.await;
            done.check().expect("read");
            let buf: AlignedBuf = done.take_owner(0).expect("buf");
            assert!(is_pattern(&buf, 9, (i * BLOCK) as u64));
        }
    });
}

/// One step of the model check: blocks `[block, block + blocks)`.
#[derive(Debug, Clone)]
enum Step {
    Write {
        block: u64,
        blocks: u64,
        seed: u8,
    },
    Read {
        block: u64,
        blocks: u64,
    },
    /// Several disjoint writes in one batch (in any order, concurrently).
    Scatter {
        blocks: Vec<u64>,
        seed: u8,
    },
}

const MODEL_BLOCKS: u64 = 64;
/// Model blocks are the file system's direct-I/O granule, 512 bytes, to mix
/// small, odd-sized transfers with larger ones.
const MODEL_BLOCK: usize = 512;

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..MODEL_BLOCKS, 1..16u64, any::<u8>()).prop_map(|(block, blocks, seed)| Step::Write {
            block,
            blocks: blocks.min(MODEL_BLOCKS - block),
            seed
        }),
        (0..MODEL_BLOCKS, 1..16u64).prop_map(|(block, blocks)| Step::Read {
            block,
            blocks: blocks.min(MODEL_BLOCKS - block)
        }),
        (
            proptest::collection::btree_set(0..MODEL_BLOCKS, 1..8),
            any::<u8>()
        )
            .prop_map(|(set, seed)| Step::Scatter {
                blocks: set.into_iter().collect(),
                seed
            }),
    ]
}

fn fill(seed: u8, offset: u64, len: usize) -> AlignedBuf {
    let mut buf = AlignedBuf::zeroed(len, MODEL_BLOCK);
    for (i, b) in buf.iter_mut().enumerate() {
        *b = seed ^ pattern_byte(u64::from(seed), offset + i as u64);
    }
    buf
}

/// Random writes and reads, checked against a `Vec<u8>` holding what the
/// file should contain.
fn model_check(make: Factory) {
    let Some(engine) = make(8) else { return };
    let dir = tmpdir();
    let size = MODEL_BLOCKS * MODEL_BLOCK as u64;
    let id = file(&*engine, &dir, "model", size);
    let file_no = AtomicUsize::new(0);
    let config = ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(steps in proptest::collection::vec(step(), 1..24))| {
        // A fresh zeroed file per case, as the model starts zeroed.
        let n = file_no.fetch_add(1, Ordering::Relaxed);
        let id = if n == 0 { id } else { file(&*engine, &dir, &format!("model{n}"), size) };
        let mut model = vec![0u8; size as usize];
        for step in steps {
            match step {
                Step::Write { block, blocks, seed } => {
                    let off = block * MODEL_BLOCK as u64;
                    let len = blocks as usize * MODEL_BLOCK;
                    let buf = fill(seed, off, len);
                    model[off as usize..off as usize + len].copy_from_slice(&buf);
                    let mut batch = IoBatch::new();
                    batch.write_owned(id, off, buf);
                    engine.submit(batch).wait().check().expect("write");
                }
                Step::Scatter { blocks, seed } => {
                    let mut batch = IoBatch::new();
                    for b in blocks {
                        let off = b * MODEL_BLOCK as u64;
                        let buf = fill(seed, off, MODEL_BLOCK);
                        model[off as usize..off as usize + MODEL_BLOCK].copy_from_slice(&buf);
                        batch.write_owned(id, off, buf);
                    }
                    engine.submit(batch).wait().check().expect("scatter");
                }
                Step::Read { block, blocks } => {
                    let off = block * MODEL_BLOCK as u64;
                    let len = blocks as usize * MODEL_BLOCK;
                    let mut batch = IoBatch::new();
                    batch.read_owned(id, off, AlignedBuf::zeroed(len, MODEL_BLOCK));
                    let mut done = engine.submit(batch).wait();
                    done.check().expect("read");
                    let buf: AlignedBuf = done.take_owner(0).expect("buf");
                    prop_assert_eq!(&buf[..], &model[off as usize..off as usize + len]);
                }
            }
        }
        // Finally the whole file.
        let mut batch = IoBatch::new();
        batch.read_owned(id, 0, AlignedBuf::zeroed(size as usize, BLOCK));
        let mut done = engine.submit(batch).wait();
        done.check().expect("full read");
        let buf: AlignedBuf = done.take_owner(0).expect("buf");
        prop_assert!(buf[..] == model[..]);
    });
}

// ---- engine-specific behaviour ----

#[test]
fn psync_does_not_register_memory() {
    let engine = PsyncEngine::new(1, 8).expect("engine");
    let mut buf = AlignedBuf::zeroed(BLOCK, BLOCK);
    // SAFETY: `buf` outlives `engine` (declared before it... and psync
    // ignores the range anyway).
    assert!(!unsafe { engine.register_memory(buf.as_mut_ptr(), BLOCK) });
    assert_eq!(engine.name(), "psync");
    assert_eq!(engine.threads(), 1);
}

#[test]
fn uring_uses_registered_buffers_inside_registered_memory() {
    // Declared before the engine so it is dropped after it: registered
    // memory must outlive the engine.
    let mut arena = AlignedBuf::zeroed(1 << 20, BLOCK);
    let engine = match UringEngine::new(16) {
        Ok(e) => e,
        Err(e) => return uring_unavailable(&e),
    };
    let dir = tmpdir();
    let id = file(&engine, &dir, "f", 1 << 20);
    let base = arena.as_mut_ptr();
    // SAFETY: `arena` outlives `engine` (see above).
    let registered = unsafe { engine.register_memory(base, arena.len()) };
    assert!(
        registered,
        "running as root with CAP_IPC_LOCK, 1 MiB must register"
    );

    // Write through the registered range, read back through it and through a
    // plain buffer.
    let src = pattern(21, 0, 64 << 10);
    arena[..src.len()].copy_from_slice(&src);
    let before = engine.stats().fixed_buffer_ops;
    let mut batch = IoBatch::new();
    let op = IoOp {
        kind: IoKind::Write,
        file: id,
        offset: 0,
        buf: base,
        len: src.len() as u32,
    };
    // SAFETY: inside `arena`, which outlives the engine and is not touched
    // until the batch completes (we wait below).
    unsafe { batch.push(op) };
    engine.submit(batch).wait().check().expect("fixed write");
    assert_eq!(engine.stats().fixed_buffer_ops, before + 1);

    arena.fill(0);
    let mut batch = IoBatch::new();
    // SAFETY: as above; a different part of the arena.
    let dst = unsafe { base.add(512 << 10) };
    let op = IoOp {
        kind: IoKind::Read,
        file: id,
        offset: 0,
        buf: dst,
        len: src.len() as u32,
    };
    // SAFETY: as above.
    unsafe { batch.push(op) };
    batch.read_owned(id, 0, AlignedBuf::zeroed(src.len(), BLOCK));
    let mut done = engine.submit(batch).wait();
    done.check().expect("reads");
    assert_eq!(
        engine.stats().fixed_buffer_ops,
        before + 2,
        "only the op in the arena is fixed"
    );
    assert!(is_pattern(
        &arena[512 << 10..(512 << 10) + src.len()],
        21,
        0
    ));
    let plain: AlignedBuf = done.take_owner(0).expect("buf");
    assert!(is_pattern(&plain, 21, 0));

    // Straddling the end of the registered range: plain path, still correct.
    let mut batch = IoBatch::new();
    let op = IoOp {
        kind: IoKind::Read,
        file: id,
        offset: 0,
        // SAFETY: inside the arena...
        buf: unsafe { base.add(arena.len() - BLOCK) },
        len: BLOCK as u32,
    };
    // SAFETY: ...and entirely inside it; the op is exactly its last block.
    unsafe { batch.push(op) };
    engine.submit(batch).wait().check().expect("edge read");
    assert_eq!(
        engine.stats().fixed_buffer_ops,
        before + 3,
        "the last block is still inside"
    );
    drop(engine);
}

#[test]
fn uring_one_enter_per_batch() {
    let engine = match UringEngine::new(64) {
        Ok(e) => e,
        Err(e) => return uring_unavailable(&e),
    };
    assert!(engine.uses_registered_files());
    let dir = tmpdir();
    let id = file(&engine, &dir, "f", 64 * BLOCK as u64);
    let before = engine.stats();
    let batches = 10;
    for _ in 0..batches {
        let mut batch = IoBatch::new();
        for i in 0..32u64 {
            batch.read_owned(id, i * BLOCK as u64, AlignedBuf::zeroed(BLOCK, BLOCK));
        }
        engine.submit(batch).wait().check().expect("reads");
    }
    let s = engine.stats();
    assert_eq!(s.ops - before.ops, 320);
    // One enter submits a whole batch (plus, at most, the driver re-arming
    // its wake-up read in a round of its own).
    assert!(s.syscalls - before.syscalls <= 2 * batches, "{s:?}");
}

#[test]
fn auto_prefers_io_uring() {
    if let Err(e) = UringEngine::new(8) {
        return uring_unavailable(&e);
    }
    let engine = kvtier_io::build_engine(kvtier_core::IoEngineKind::Auto, 8, 2).expect("auto");
    assert_eq!(engine.name(), "io_uring");
    let engine = kvtier_io::build_engine(kvtier_core::IoEngineKind::Psync, 8, 2).expect("psync");
    assert_eq!(engine.name(), "psync");
}

#[test]
fn alignment_is_reported_for_tmp() {
    let dir = tmpdir();
    let a = dio_alignment(dir.path());
    assert!(a.mem >= 512 && a.offset >= 512);
    assert_eq!(a.max(), a.mem.max(a.offset));
}
