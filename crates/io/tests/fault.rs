//! `FaultyEngine`: every rule injects exactly the faults it describes,
//! deterministically, over both inner engines; failed operations never touch
//! their buffers.

use std::sync::Arc;

use kvtier_io::{
    AlignedBuf, Fault, FaultyEngine, FileId, IoBatch, IoEngine, IoError, IoKind, PsyncEngine,
    UringEngine, open_direct, uring_unavailable,
};

const BLOCK: usize = 4096;
/// What an untouched read buffer holds.
const UNTOUCHED: u8 = 0xAA;
/// What the file holds.
const DATA: u8 = 0x5C;

type Factory = fn() -> Option<Arc<dyn IoEngine>>;

fn psync() -> Option<Arc<dyn IoEngine>> {
    Some(Arc::new(PsyncEngine::new(2, 16).expect("psync")))
}

fn uring() -> Option<Arc<dyn IoEngine>> {
    match UringEngine::new(16) {
        Ok(e) => Some(Arc::new(e)),
        Err(e) => {
            uring_unavailable(&e);
            None
        }
    }
}

macro_rules! suite {
    ($($name:ident),* $(,)?) => {
        mod over_psync {
            $( #[test] fn $name() { super::$name(super::psync) } )*
        }
        mod over_uring {
            $( #[test] fn $name() { super::$name(super::uring) } )*
        }
    };
}

suite!(
    fail_every_third_op,
    fail_only_writes,
    short_reads,
    flip_bits,
    fail_after_latches,
    set_faults_changes_and_resets,
    no_faults_is_transparent,
    dropped_completion_keeps_owners,
    fail_only_syncs,
    vectored_fail_ops,
    vectored_short_reads,
    vectored_flip_bits,
    vectored_fail_after,
);

/// A faulty engine over `inner` with a 16-block file full of `DATA`.
fn setup(make: Factory, faults: Vec<Fault>) -> Option<(FaultyEngine, FileId, tempfile::TempDir)> {
    let inner = make()?;
    let dir = tempfile::Builder::new()
        .prefix("kvtier-io-fault")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let file = open_direct(&dir.path().join("f"), 16 * BLOCK as u64).expect("open");
    let id = inner.register_file(file).expect("register");
    let mut batch = IoBatch::new();
    let mut buf = AlignedBuf::zeroed(16 * BLOCK, BLOCK);
    buf.fill(DATA);
    batch.write_owned(id, 0, buf);
    inner.submit(batch).wait().check().expect("fill");
    Some((FaultyEngine::new(inner, faults), id, dir))
}

/// Reads blocks `0..n` as `n` one-block operations in one batch, into
/// buffers pre-filled with `UNTOUCHED`.
fn read_blocks(engine: &dyn IoEngine, id: FileId, n: usize) -> kvtier_io::BatchDone {
    let mut batch = IoBatch::new();
    for i in 0..n {
        let mut buf = AlignedBuf::zeroed(BLOCK, BLOCK);
        buf.fill(UNTOUCHED);
        batch.read_owned(id, (i * BLOCK) as u64, buf);
    }
    engine.submit(batch).wait()
}

fn buffer(done: &mut kvtier_io::BatchDone, i: usize) -> AlignedBuf {
    done.take_owner::<AlignedBuf>(i).expect("owner back")
}

fn fail_every_third_op(make: Factory) {
    let faults = vec![Fault::FailOps {
        kind: None,
        errno: libc::EIO,
        every: 3,
    }];
    let Some((engine, id, _dir)) = setup(make, faults) else {
        return;
    };
    let mut done = read_blocks(&engine, id, 9);
    for i in 0..9 {
        let buf = buffer(&mut done, i);
        if (i + 1) % 3 == 0 {
            let err = done.results[i].as_ref().expect_err("injected");
            assert_eq!(err.raw_os_error(), Some(libc::EIO));
            assert!(matches!(done.check_op(i), Err(IoError::Op { .. })));
            assert!(
                buf.iter().all(|&b| b == UNTOUCHED),
                "failed op {i} touched its buffer"
            );
        } else {
            assert!(done.check_op(i).is_ok(), "op {i}");
            assert!(buf.iter().all(|&b| b == DATA));
        }
    }
    assert_eq!(engine.injected(), 3);
    // The counter carries over between batches: ops 10..=12 -> op 12 fails.
    let done = read_blocks(&engine, id, 3);
    assert!(done.results[0].is_ok() && done.results[1].is_ok());
    assert!(done.results[2].is_err());
    assert_eq!(engine.injected(), 4);
}

fn fail_only_writes(make: Factory) {
    let faults = vec![Fault::FailOps {
        kind: Some(IoKind::Write),
        errno: libc::ENOSPC,
        every: 1,
    }];
    let Some((engine, id, _dir)) = setup(make, faults) else {
        return;
    };
    let mut batch = IoBatch::new();
    let mut buf = AlignedBuf::zeroed(BLOCK, BLOCK);
    buf.fill(0x11);
    batch.write_owned(id, 0, buf);
    let done = engine.submit(batch).wait();
    let err = done.results[0].as_ref().expect_err("write fails");
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    // The write never reached the disk; reads are unaffected.
    let mut done = read_blocks(&engine, id, 2);
    done.check().expect("reads pass");
    assert!(buffer(&mut done, 0).iter().all(|&b| b == DATA));
    assert_eq!(engine.injected(), 1);
}

/// A sync fault fails exactly the syncs, which never reach the inner
/// engine, and leaves writes alone; `FailAfter` counts syncs as operations.
fn fail_only_syncs(make: Factory) {
    let faults = vec![Fault::FailOps {
        kind: Some(IoKind::Fdatasync),
        errno: libc::EIO,
        every: 1,
    }];
    let Some((engine, id, _dir)) = setup(make, faults) else {
        return;
    };
    let before = engine.stats();
    let mut batch = IoBatch::new();
    let mut buf = AlignedBuf::zeroed(BLOCK, BLOCK);
    buf.fill(0x22);
    batch.write_owned(id, 0, buf);
    batch.sync(id, IoKind::Fdatasync);
    batch.sync(id, IoKind::Fsync);
    let done = engine.submit(batch).wait();
    done.check_op(0).expect("the write passes");
    let err = done.results[1].as_ref().expect_err("the data sync fails");
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    done.check_op(2).expect("a full sync is another kind");
    assert_eq!(engine.injected(), 1);
    let after = engine.stats();
    assert_eq!(
        after.syncs - before.syncs,
        1,
        "the failed sync never reached the inner engine"
    );
    assert_eq!(after.writes - before.writes, 1);

    engine.set_faults(vec![Fault::FailAfter {
        ops: 1,
        errno: libc::EIO,
    }]);
    let mut batch = IoBatch::new();
    batch.sync(id, IoKind::Fdatasync);
    batch.sync(id, IoKind::Fdatasync);
    let done = engine.submit(batch).wait();
    done.check_op(0).expect("the first op passes");
    assert!(done.check_op(1).is_err(), "the second op is past the limit");
}

fn short_reads(make: Factory) {
    let Some((engine, id, _dir)) = setup(make, vec![Fault::ShortReads { every: 2 }]) else {
        return;
    };
    let mut done = read_blocks(&engine, id, 4);
    for i in 0..4 {
        let buf = buffer(&mut done, i);
        if i % 2 == 1 {
            match done.check_op(i) {
                Err(IoError::Short { done: n, len, .. }) => {
                    assert_eq!(len, BLOCK as u32);
                    assert!(n < len);
                    let n = n as usize;
                    assert!(buf[..n].iter().all(|&b| b == DATA));
                    assert!(buf[n..].iter().all(|&b| b == UNTOUCHED), "tail not filled");
                }
                other => panic!("op {i}: expected short, got {other:?}"),
            }
        } else {
            assert!(done.check_op(i).is_ok());
        }
    }
    assert_eq!(engine.injected(), 2);

    // Reads too small to halve on a 512-byte boundary report 0 bytes.
    let mut batch = IoBatch::new();
    batch.read_owned(id, 0, AlignedBuf::zeroed(512, BLOCK));
    batch.read_owned(id, 0, AlignedBuf::zeroed(512, BLOCK));
    let done = engine.submit(batch).wait();
    assert_eq!(done.results[0].as_ref().ok(), Some(&512));
    assert_eq!(done.results[1].as_ref().ok(), Some(&0));
    // Writes are never shortened.
    let mut batch = IoBatch::new();
    batch.write_owned(id, 0, AlignedBuf::zeroed(BLOCK, BLOCK));
    batch.write_owned(id, BLOCK as u64, AlignedBuf::zeroed(BLOCK, BLOCK));
    engine.submit(batch).wait().check().expect("writes");
}

fn flip_bits(make: Factory) {
    let Some((engine, id, _dir)) = setup(make, vec![Fault::FlipBits { every: 3 }]) else {
        return;
    };
    let mut done = read_blocks(&engine, id, 6);
    done.check().expect("flipped reads still succeed");
    for i in 0..6 {
        let buf = buffer(&mut done, i);
        let flipped: u32 = buf.iter().map(|&b| (b ^ DATA).count_ones()).sum();
        let expected = u32::from((i + 1) % 3 == 0);
        assert_eq!(flipped, expected, "op {i}");
    }
    assert_eq!(engine.injected(), 2);
}

fn fail_after_latches(make: Factory) {
    let faults = vec![Fault::FailAfter {
        ops: 5,
        errno: libc::EIO,
    }];
    let Some((engine, id, _dir)) = setup(make, faults) else {
        return;
    };
    let done = read_blocks(&engine, id, 3);
    done.check().expect("first three pass");
    let done = read_blocks(&engine, id, 4);
    assert!(done.results[0].is_ok() && done.results[1].is_ok());
    assert!(done.results[2].is_err() && done.results[3].is_err());
    for _ in 0..3 {
        let done = read_blocks(&engine, id, 2);
        assert!(done.results.iter().all(Result::is_err), "stays failed");
    }
    assert_eq!(engine.injected(), 8);
}

fn set_faults_changes_and_resets(make: Factory) {
    let faults = vec![Fault::FailAfter {
        ops: 0,
        errno: libc::EIO,
    }];
    let Some((engine, id, _dir)) = setup(make, faults) else {
        return;
    };
    assert!(
        read_blocks(&engine, id, 2)
            .results
            .iter()
            .all(Result::is_err)
    );
    engine.set_faults(Vec::new());
    read_blocks(&engine, id, 2).check().expect("healed");
    engine.set_faults(vec![Fault::FailOps {
        kind: None,
        errno: libc::EIO,
        every: 2,
    }]);
    let done = read_blocks(&engine, id, 2);
    assert!(done.results[0].is_ok(), "counters restart at set_faults");
    assert!(done.results[1].is_err());
    assert_eq!(engine.injected(), 3);
}

fn no_faults_is_transparent(make: Factory) {
    let Some((engine, id, _dir)) = setup(make, Vec::new()) else {
        return;
    };
    let before = engine.stats().ops;
    let mut done = read_blocks(&engine, id, 8);
    done.check().expect("reads");
    assert!(buffer(&mut done, 7).iter().all(|&b| b == DATA));
    assert_eq!(engine.injected(), 0);
    assert_eq!(
        engine.stats().ops - before,
        8,
        "stats are the inner engine's"
    );
    assert_eq!(engine.name(), "faulty");
    // Empty batches and owners pass through.
    let mut batch = IoBatch::new();
    batch.keep_alive(7u8);
    let mut done = engine.submit(batch).wait();
    assert_eq!(done.take_owner::<u8>(0), Some(7));
}

fn dropped_completion_keeps_owners(make: Factory) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    struct Counted(Arc<AtomicUsize>);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let faults = vec![Fault::FailOps {
        kind: None,
        errno: libc::EIO,
        every: 2,
    }];
    let Some((engine, id, _dir)) = setup(make, faults) else {
        return;
    };
    let drops = Arc::new(AtomicUsize::new(0));
    for _ in 0..10 {
        let mut batch = IoBatch::new();
        batch.read_owned(id, 0, AlignedBuf::zeroed(BLOCK, BLOCK));
        batch.read_owned(id, BLOCK as u64, AlignedBuf::zeroed(BLOCK, BLOCK));
        batch.keep_alive(Counted(Arc::clone(&drops)));
        drop(engine.submit(batch));
    }
    // Dropping the faulty engine finishes its relays; every owner is freed.
    drop(engine);
    assert_eq!(drops.load(Ordering::SeqCst), 10);
}

// ---- vectored ops: one op to every rule, whatever its segment count ----

/// Segments of `sizes` bytes pre-filled with `UNTOUCHED`.
fn untouched(sizes: &[usize]) -> Vec<AlignedBuf> {
    sizes
        .iter()
        .map(|&n| {
            let mut b = AlignedBuf::zeroed(n, BLOCK);
            b.fill(UNTOUCHED);
            b
        })
        .collect()
}

/// Adds a vectored read of the file's start into segments of `sizes`.
fn add_readv(batch: &mut IoBatch, id: FileId, sizes: &[usize]) {
    batch
        .readv_owned(id, 0, untouched(sizes), None)
        .expect("valid readv");
}

/// The segments of vectored read `i` (owner `i`) of `done`.
fn segments(done: &mut kvtier_io::BatchDone, i: usize) -> Vec<AlignedBuf> {
    done.take_owner::<Vec<AlignedBuf>>(i)
        .expect("segments back")
}

/// A failed vectored op fails whole and never reaches the inner engine;
/// `Read` (`Write`) rules take in vectored reads (writes), `ReadV` only
/// those.
fn vectored_fail_ops(make: Factory) {
    let faults = vec![Fault::FailOps {
        kind: Some(IoKind::ReadV),
        errno: libc::EIO,
        every: 2,
    }];
    let Some((engine, id, _dir)) = setup(make, faults) else {
        return;
    };
    let four = [BLOCK; 4];
    let mut batch = IoBatch::new();
    add_readv(&mut batch, id, &four);
    batch.read_owned(id, 0, AlignedBuf::zeroed(BLOCK, BLOCK));
    add_readv(&mut batch, id, &four);
    add_readv(&mut batch, id, &four);
    let before = engine.stats().ops;
    let mut done = engine.submit(batch).wait();
    assert_eq!(engine.stats().ops - before, 3, "the failed op stayed here");
    for i in [0, 1, 3] {
        done.check_op(i).unwrap_or_else(|e| panic!("op {i}: {e}"));
    }
    let err = done.results[2].as_ref().expect_err("second readv fails");
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    assert!(
        matches!(done.check_op(2), Err(IoError::Op { kind: "readv", len, .. }) if len == 4 * BLOCK as u32)
    );
    for (s, seg) in segments(&mut done, 2).iter().enumerate() {
        assert!(seg.iter().all(|&b| b == UNTOUCHED), "segment {s} touched");
    }
    assert!(
        segments(&mut done, 0)
            .iter()
            .all(|s| s.iter().all(|&b| b == DATA))
    );
    assert_eq!(engine.injected(), 1, "one fault for four segments");

    for (filter, fails_readv, fails_writev) in [
        (IoKind::Read, true, false),
        (IoKind::Write, false, true),
        (IoKind::WriteV, false, true),
    ] {
        engine.set_faults(vec![Fault::FailOps {
            kind: Some(filter),
            errno: libc::EIO,
            every: 1,
        }]);
        let mut batch = IoBatch::new();
        add_readv(&mut batch, id, &[BLOCK, BLOCK]);
        let mut data = AlignedBuf::zeroed(2 * BLOCK, BLOCK);
        data.fill(DATA);
        batch
            .writev_owned(id, 0, vec![data], None)
            .expect("valid writev");
        let done = engine.submit(batch).wait();
        assert_eq!(done.results[0].is_err(), fails_readv, "{filter:?} on readv");
        assert_eq!(
            done.results[1].is_err(),
            fails_writev,
            "{filter:?} on writev"
        );
    }
}

/// A shortened vectored read keeps its first segments and cuts the one the
/// new length falls in; the rest stay untouched.
fn vectored_short_reads(make: Factory) {
    let Some((engine, id, _dir)) = setup(make, vec![Fault::ShortReads { every: 1 }]) else {
        return;
    };
    // (segments, bytes each keeps after halving to 512-byte multiples)
    let cases: [(&[usize], &[usize]); 3] = [
        (&[BLOCK, BLOCK, 2 * BLOCK], &[BLOCK, BLOCK, 0]),
        (&[BLOCK, 2 * BLOCK], &[BLOCK, BLOCK / 2]),
        (&[2 * BLOCK], &[BLOCK]),
    ];
    let mut batch = IoBatch::new();
    for (sizes, _) in cases {
        add_readv(&mut batch, id, sizes);
    }
    let mut done = engine.submit(batch).wait();
    for (i, (sizes, kept)) in cases.iter().enumerate() {
        let total: usize = sizes.iter().sum();
        match done.check_op(i) {
            Err(IoError::Short {
                kind: "readv",
                len,
                done: n,
                ..
            }) => {
                assert_eq!(
                    (len as usize, n as usize),
                    (total, kept.iter().sum()),
                    "op {i}"
                );
            }
            other => panic!("op {i}: expected short, got {other:?}"),
        }
        for (s, (seg, &keep)) in segments(&mut done, i).iter().zip(*kept).enumerate() {
            assert!(seg[..keep].iter().all(|&b| b == DATA), "op {i} segment {s}");
            assert!(
                seg[keep..].iter().all(|&b| b == UNTOUCHED),
                "op {i} segment {s} tail"
            );
        }
    }
    assert_eq!(engine.injected(), 3);
    // Vectored writes are never shortened.
    let mut batch = IoBatch::new();
    let data = vec![
        AlignedBuf::zeroed(BLOCK, BLOCK),
        AlignedBuf::zeroed(BLOCK, BLOCK),
    ];
    batch.writev_owned(id, 0, data, None).expect("valid writev");
    engine.submit(batch).wait().check().expect("writev");
}

/// One bit of one segment flips; the op still succeeds whole.
fn vectored_flip_bits(make: Factory) {
    let Some((engine, id, _dir)) = setup(make, vec![Fault::FlipBits { every: 2 }]) else {
        return;
    };
    let mut batch = IoBatch::new();
    for _ in 0..4 {
        add_readv(&mut batch, id, &[BLOCK; 4]);
    }
    let mut done = engine.submit(batch).wait();
    done.check().expect("flipped reads still succeed");
    for i in 0..4 {
        let flips: Vec<u32> = segments(&mut done, i)
            .iter()
            .map(|seg| seg.iter().map(|&b| (b ^ DATA).count_ones()).sum())
            .collect();
        let total: u32 = flips.iter().sum();
        assert_eq!(total, u32::from(i % 2 == 1), "op {i}: {flips:?}");
        assert!(flips.iter().all(|&f| f <= 1), "op {i}: one segment only");
    }
    assert_eq!(engine.injected(), 2);
}

/// `FailAfter` counts a vectored op once, whatever its segments.
fn vectored_fail_after(make: Factory) {
    let faults = vec![Fault::FailAfter {
        ops: 2,
        errno: libc::EIO,
    }];
    let Some((engine, id, _dir)) = setup(make, faults) else {
        return;
    };
    let mut batch = IoBatch::new();
    add_readv(&mut batch, id, &[BLOCK; 8]);
    add_readv(&mut batch, id, &[BLOCK; 3]);
    add_readv(&mut batch, id, &[BLOCK; 2]);
    let mut done = engine.submit(batch).wait();
    done.check_op(0).expect("first op");
    done.check_op(1).expect("second op");
    assert!(done.results[2].is_err(), "third op is past the limit");
    assert!(
        segments(&mut done, 2)
            .iter()
            .all(|s| s.iter().all(|&b| b == UNTOUCHED))
    );
    let mut batch = IoBatch::new();
    batch
        .writev_owned(id, 0, vec![AlignedBuf::zeroed(BLOCK, BLOCK)], None)
        .expect("valid writev");
    assert!(
        engine.submit(batch).wait().results[0].is_err(),
        "stays failed"
    );
    assert_eq!(engine.injected(), 2);
}
