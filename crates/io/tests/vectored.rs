//! Vectored ops (`ReadV`, `WriteV`) against every engine: psync, io_uring,
//! and `FaultyEngine` without faults over each (the faults themselves are in
//! `fault.rs`). Each test is written once as a function of an engine factory
//! and instantiated per engine by `suite!`, as in `engines.rs`. Files live
//! under /tmp (ext4 here), whose direct I/O enforces alignment.

mod common;
use common::{BLOCK, Factory, pattern, pattern_byte, psync, uring};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvtier_io::{
    AlignedBuf, DioAlignment, FaultyEngine, FileId, IoBatch, IoEngine, IoError, IoKind,
    PsyncEngine, UringEngine, VectoredError, dio_alignment, open_direct, uring_unavailable,
};

fn faulty_psync(queue_depth: u32) -> Option<Arc<dyn IoEngine>> {
    Some(Arc::new(FaultyEngine::new(psync(queue_depth)?, Vec::new())))
}

fn faulty_uring(queue_depth: u32) -> Option<Arc<dyn IoEngine>> {
    Some(Arc::new(FaultyEngine::new(uring(queue_depth)?, Vec::new())))
}

/// Instantiates each named test for every engine.
macro_rules! suite {
    ($($name:ident),* $(,)?) => {
        mod psync_engine {
            $( #[test] fn $name() { super::$name(super::psync) } )*
        }
        mod uring_engine {
            $( #[test] fn $name() { super::$name(super::uring) } )*
        }
        mod faulty_over_psync {
            $( #[test] fn $name() { super::$name(super::faulty_psync) } )*
        }
        mod faulty_over_uring {
            $( #[test] fn $name() { super::$name(super::faulty_uring) } )*
        }
    };
}

suite!(
    readv_scatters_like_pread,
    writev_gathers_and_reads_back,
    owned_vectored_ops_round_trip,
    invalid_vectored_ops_submit_nothing,
    readv_past_eof_is_short,
    stats_count_a_vectored_op_once,
);

/// What memory no read should reach holds.
const UNTOUCHED: u8 = 0xAA;
/// File size of every test file.
const FILE: u64 = 16 << 20;

/// A temporary directory on a real (alignment-enforcing) file system.
fn tmpdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("kvtier-io-readv")
        .tempdir_in("/tmp")
        .expect("tempdir in /tmp")
}

/// Opens `dir/name` for direct I/O, registers it, and fills its first 12 MiB
/// with the pattern of `seed`.
fn patterned(engine: &dyn IoEngine, dir: &Path, name: &str, seed: u64) -> (FileId, PathBuf) {
    let path = dir.join(name);
    let id = engine
        .register_file(open_direct(&path, FILE).expect("open_direct"))
        .expect("register_file");
    let mut batch = IoBatch::new();
    batch.write_owned(id, 0, pattern(seed, 0, 12 << 20));
    engine.submit(batch).wait().check().expect("fill");
    (id, path)
}

/// `len` bytes of the file at `offset`, read with a plain `pread` through
/// the page cache (a second, buffered descriptor).
fn pread(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0; len];
    let f = std::fs::File::open(path).expect("open buffered");
    f.read_exact_at(&mut out, offset).expect("pread");
    out
}

/// `n` segments laid out in one buffer scattered: in reverse order, each in
/// a slot of its own with a free slot between neighbours, so no two are
/// adjacent or in file order. Segment `i` is 1 to 3 blocks (1 block when
/// there are 1024).
struct Scatter {
    mem: AlignedBuf,
    /// (offset in `mem`, length) per segment, in file order.
    segs: Vec<(usize, usize)>,
}

impl Scatter {
    fn new(n: usize) -> Self {
        let len = |i: usize| {
            if n >= 1024 {
                BLOCK
            } else {
                BLOCK * (1 + i % 3)
            }
        };
        let slot = 3 * BLOCK;
        let segs = (0..n)
            .map(|i| ((2 * (n - 1 - i) + 1) * slot, len(i)))
            .collect();
        let mut mem = AlignedBuf::zeroed(2 * n * slot, BLOCK);
        mem.fill(UNTOUCHED);
        Self { mem, segs }
    }

    fn total(&self) -> usize {
        self.segs.iter().map(|s| s.1).sum()
    }

    /// The segments as (address, length).
    fn iov(&mut self) -> Segments {
        let base = self.mem.as_mut_ptr();
        // SAFETY: every segment lies inside `mem` by construction.
        self.segs
            .iter()
            .map(|&(at, len)| (unsafe { base.add(at) }, len))
            .collect()
    }

    /// The segments' bytes concatenated in file order.
    fn gathered(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.total());
        for &(at, len) in &self.segs {
            out.extend_from_slice(&self.mem[at..at + len]);
        }
        out
    }

    /// Whether every byte outside the segments still holds `UNTOUCHED`.
    fn gaps_untouched(&self) -> bool {
        let mut inside = vec![false; self.mem.len()];
        for &(at, len) in &self.segs {
            inside[at..at + len].fill(true);
        }
        self.mem
            .iter()
            .zip(inside)
            .all(|(&b, i)| i || b == UNTOUCHED)
    }
}

/// Submits one vectored op of `kind` over `scatter` and waits.
fn vectored(
    engine: &dyn IoEngine,
    kind: IoKind,
    id: FileId,
    offset: u64,
    scatter: &mut Scatter,
    align: DioAlignment,
) -> kvtier_io::BatchDone {
    let mut batch = IoBatch::new();
    // SAFETY: the segments lie in `scatter.mem`, which the caller holds and
    // does not touch until the wait below returns.
    unsafe { batch.push_vectored(kind, id, offset, scatter.iov(), Some(align)) }
        .expect("a valid vectored op");
    engine.submit(batch).wait()
}

fn readv_scatters_like_pread(make: Factory) {
    let Some(engine) = make(32) else { return };
    let dir = tmpdir();
    let align = dio_alignment(dir.path());
    let (id, path) = patterned(&*engine, dir.path(), "f", 1);
    for n in [1, 2, 17, 1024] {
        let mut scatter = Scatter::new(n);
        let offset = (5 + n as u64) * BLOCK as u64;
        let done = vectored(&*engine, IoKind::ReadV, id, offset, &mut scatter, align);
        done.check().unwrap_or_else(|e| panic!("{n} segments: {e}"));
        assert_eq!(
            done.results[0].as_ref().ok(),
            Some(&(scatter.total() as u32))
        );
        assert!(
            scatter.gathered() == pread(&path, offset, scatter.total()),
            "{n} segments: not what pread reads"
        );
        assert!(scatter.gaps_untouched(), "{n} segments: wrote between them");
    }
}

fn writev_gathers_and_reads_back(make: Factory) {
    let Some(engine) = make(32) else { return };
    let dir = tmpdir();
    let align = dio_alignment(dir.path());
    let (id, path) = patterned(&*engine, dir.path(), "f", 2);
    // Each write gets its own range, a block apart, all below 12 MiB where
    // the pattern ends.
    let mut offset = BLOCK as u64;
    for n in [1, 2, 17, 1024] {
        let mut scatter = Scatter::new(n);
        for (i, &(at, len)) in scatter.segs.clone().iter().enumerate() {
            scatter.mem[at..at + len].fill(i as u8 ^ n as u8);
        }
        let want = scatter.gathered();
        let done = vectored(&*engine, IoKind::WriteV, id, offset, &mut scatter, align);
        done.check().unwrap_or_else(|e| panic!("{n} segments: {e}"));
        assert!(
            pread(&path, offset, want.len()) == want,
            "{n} segments: file differs"
        );
        // The bytes just before and after the write are the old pattern.
        let end = offset + want.len() as u64;
        assert_eq!(pread(&path, offset - 1, 1)[0], pattern_byte(2, offset - 1));
        assert_eq!(pread(&path, end, 1)[0], pattern_byte(2, end));
        offset = end + BLOCK as u64;
    }
}

fn owned_vectored_ops_round_trip(make: Factory) {
    let Some(engine) = make(8) else { return };
    let dir = tmpdir();
    let align = dio_alignment(dir.path());
    let (id, _path) = patterned(&*engine, dir.path(), "f", 3);
    let sources: Vec<AlignedBuf> = (0..3)
        .map(|i| pattern(9, (i * 2 * BLOCK) as u64, 2 * BLOCK))
        .collect();
    let mut batch = IoBatch::new();
    batch
        .writev_owned(id, 0, sources, Some(align))
        .expect("valid writev");
    let targets: Vec<AlignedBuf> = (0..2)
        .map(|_| AlignedBuf::zeroed(3 * BLOCK, BLOCK))
        .collect();
    batch
        .readv_owned(id, 64 * BLOCK as u64, targets, Some(align))
        .expect("valid readv");
    batch.keep_alive(7u32);
    let mut done = engine.submit(batch).wait();
    done.check().expect("both");
    // Owners in the order added; the segment lists do not shift them.
    assert_eq!(done.take_owner::<u32>(2), Some(7));
    let back: Vec<AlignedBuf> = done.take_owner(1).expect("targets back");
    for (i, t) in back.iter().enumerate() {
        let at = 64 * BLOCK as u64 + (i * 3 * BLOCK) as u64;
        assert!(
            t.iter()
                .enumerate()
                .all(|(j, &b)| b == pattern_byte(3, at + j as u64))
        );
    }
    let mut batch = IoBatch::new();
    batch.read_owned(id, 0, AlignedBuf::zeroed(6 * BLOCK, BLOCK));
    let mut done = engine.submit(batch).wait();
    done.check().expect("read back");
    let all: AlignedBuf = done.take_owner(0).expect("buf");
    assert!(
        all.iter()
            .enumerate()
            .all(|(j, &b)| b == pattern_byte(9, j as u64))
    );
}

/// A segment list: (address, length) per segment.
type Segments = Vec<(*mut u8, usize)>;

/// Each bad op is refused with its reason, leaves the batch empty, and the
/// engine sees no operation.
fn invalid_vectored_ops_submit_nothing(make: Factory) {
    let Some(engine) = make(8) else { return };
    let dir = tmpdir();
    let align = dio_alignment(dir.path());
    let (id, _path) = patterned(&*engine, dir.path(), "f", 4);
    let mut mem = AlignedBuf::zeroed(1 << 20, BLOCK);
    let base = mem.as_mut_ptr();
    let ok = (base, BLOCK);
    // SAFETY: inside `mem`.
    let at = |off: usize| unsafe { base.add(off) };
    let cases: Vec<(&str, IoKind, u64, Segments, VectoredError)> = vec![
        ("empty", IoKind::ReadV, 0, vec![], VectoredError::Empty),
        (
            "zero bytes",
            IoKind::ReadV,
            0,
            vec![(base, 0)],
            VectoredError::Empty,
        ),
        (
            "misaligned address",
            IoKind::ReadV,
            0,
            vec![ok, (at(BLOCK + 1), BLOCK)],
            VectoredError::MisalignedSegment {
                index: 1,
                addr: at(BLOCK + 1) as usize,
                len: BLOCK,
                mem: align.mem,
                offset: align.offset,
            },
        ),
        (
            "misaligned length",
            IoKind::WriteV,
            0,
            vec![(base, align.offset + 1)],
            VectoredError::MisalignedSegment {
                index: 0,
                addr: base as usize,
                len: align.offset + 1,
                mem: align.mem,
                offset: align.offset,
            },
        ),
        (
            "misaligned offset",
            IoKind::ReadV,
            align.offset as u64 / 2,
            vec![ok],
            VectoredError::MisalignedOffset {
                align: align.offset,
            },
        ),
        (
            "too many segments",
            IoKind::ReadV,
            0,
            vec![ok; IoBatch::MAX_SEGMENTS + 1],
            VectoredError::TooManySegments { max: 1024 },
        ),
        (
            "too long",
            IoKind::ReadV,
            0,
            vec![(base, 1 << 30), (base, 1 << 30)],
            VectoredError::TooLong {
                total: 1 << 31,
                max: IoBatch::MAX_VECTORED_LEN,
            },
        ),
        (
            "not vectored",
            IoKind::Read,
            0,
            vec![ok],
            VectoredError::NotVectored,
        ),
    ];
    let before = engine.stats();
    for (what, kind, offset, segs, want) in cases {
        let mut batch = IoBatch::new();
        // SAFETY: refused before anything could use the memory (and valid
        // anyway where it is inside `mem`).
        let res = unsafe { batch.push_vectored(kind, id, offset, segs, Some(align)) };
        match res {
            Err(IoError::InvalidVectored {
                reason,
                kind: k,
                offset: o,
            }) => {
                assert_eq!(reason, want, "{what}");
                assert_eq!((k, o), (kind.name(), offset), "{what}");
            }
            other => panic!("{what}: expected a refusal, got {other:?}"),
        }
        assert!(batch.is_empty(), "{what}: the batch changed");
        assert!(engine.submit(batch).wait().results.is_empty());
    }
    let after = engine.stats();
    assert_eq!(after.ops, before.ops, "an op reached the engine");
    assert_eq!(after.vectored_ops, 0);
    // The message says what is wrong, for logs.
    let mut batch = IoBatch::new();
    // SAFETY: refused before use.
    let err = unsafe { batch.push_vectored(IoKind::ReadV, id, 0, [], None) }.expect_err("empty");
    assert_eq!(
        err.to_string(),
        "readv at offset 0 refused: no bytes to transfer"
    );
    drop(mem);
}

fn readv_past_eof_is_short(make: Factory) {
    let Some(engine) = make(8) else { return };
    let dir = tmpdir();
    let align = dio_alignment(dir.path());
    let (id, _path) = patterned(&*engine, dir.path(), "f", 5);
    let mut scatter = Scatter::new(4);
    let total = scatter.total() as u64;
    // The first 2 blocks are in the file, the rest past its end.
    let offset = FILE - 2 * BLOCK as u64;
    let mut batch = IoBatch::new();
    batch.write_owned(id, offset, pattern(5, offset, 2 * BLOCK));
    engine.submit(batch).wait().check().expect("last blocks");
    let done = vectored(&*engine, IoKind::ReadV, id, offset, &mut scatter, align);
    assert_eq!(done.results[0].as_ref().ok(), Some(&(2 * BLOCK as u32)));
    assert!(matches!(
        done.check_op(0),
        Err(IoError::Short { kind: "readv", len, done: d, .. })
            if u64::from(len) == total && d == 2 * BLOCK as u32
    ));
    let got = scatter.gathered();
    // The segments past EOF are the kernel's business: ext4 (6.18) zero-fills
    // them although it reports only the bytes before EOF.
    assert!(
        got[..2 * BLOCK]
            .iter()
            .enumerate()
            .all(|(j, &b)| b == pattern_byte(5, offset + j as u64))
    );
}

fn stats_count_a_vectored_op_once(make: Factory) {
    let Some(engine) = make(8) else { return };
    let dir = tmpdir();
    let align = dio_alignment(dir.path());
    let (id, _path) = patterned(&*engine, dir.path(), "f", 6);
    let before = engine.stats();
    let mut scatter = Scatter::new(17);
    let total = scatter.total() as u64;
    let done = vectored(&*engine, IoKind::ReadV, id, 0, &mut scatter, align);
    done.check().expect("readv");
    let done = vectored(&*engine, IoKind::WriteV, id, 0, &mut scatter, align);
    done.check().expect("writev");
    let s = engine.stats();
    assert_eq!(s.ops - before.ops, 2);
    assert_eq!((s.reads - before.reads, s.writes - before.writes), (1, 1));
    assert_eq!(s.vectored_ops - before.vectored_ops, 2);
    assert_eq!(s.bytes_read - before.bytes_read, total);
    assert_eq!(s.bytes_written - before.bytes_written, total);
    assert_eq!(s.errors, before.errors);
}

// ---- registered buffers ----

/// Whether this kernel is 6.15 or later, which has `READV_FIXED`.
fn kernel_has_fixed_vectored() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release
        .split(['.', '-'])
        .map(|p| p.trim().parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (6, 15)
}

const SEG: usize = 64 << 10;

/// 16 segments of 64 KiB in the first 2 MiB of `m`, scattered: segment `i`
/// in 64 KiB slot `2 * (15 - i) + 1`.
fn scattered(m: &mut AlignedBuf) -> Vec<*mut u8> {
    let base = m.as_mut_ptr();
    // SAFETY: slot <= 31, so inside the first 2 MiB.
    (0..16)
        .map(|i| unsafe { base.add((2 * (15 - i) + 1) * SEG) })
        .collect()
}

/// Reads 16 x 64 KiB at file offset 0 into `segs` and checks the bytes;
/// returns how many fixed vectored ops the engine issued for it.
fn fixed_ops_for(engine: &UringEngine, id: FileId, path: &Path, segs: &[*mut u8]) -> u64 {
    let before = engine.stats().fixed_vectored_ops;
    let mut batch = IoBatch::new();
    let iov = segs.iter().map(|&p| (p, SEG));
    // SAFETY: every segment lies in memory the caller keeps alive and
    // untouched until the wait below returns.
    unsafe { batch.push_vectored(IoKind::ReadV, id, 0, iov, None) }.expect("valid");
    engine.submit(batch).wait().check().expect("readv");
    let want = pread(path, 0, segs.len() * SEG);
    for (i, &p) in segs.iter().enumerate() {
        // SAFETY: as above; the read has completed.
        let got = unsafe { std::slice::from_raw_parts(p, SEG) };
        assert!(got == &want[i * SEG..(i + 1) * SEG], "segment {i}");
    }
    engine.stats().fixed_vectored_ops - before
}

/// `READV_FIXED` is used exactly when every segment lies in one registered
/// piece: not across two registrations (adjacent ones included), not with
/// one segment outside registered memory.
#[test]
fn uring_fixed_vectored_iff_one_registered_piece() {
    // Declared before the engine so they are dropped after it: registered
    // memory must outlive the engine.
    let mut a = AlignedBuf::zeroed(4 << 20, BLOCK);
    let mut b = AlignedBuf::zeroed(4 << 20, BLOCK);
    let mut plain = AlignedBuf::zeroed(4 << 20, BLOCK);
    let engine = match UringEngine::new(16) {
        Ok(e) => e,
        Err(e) => return uring_unavailable(&e),
    };
    let dir = tmpdir();
    let (id, path) = patterned(&engine, dir.path(), "f", 7);
    let half = a.len() / 2;
    // SAFETY: `a` and `b` outlive `engine` (see above). `a` is registered
    // as two adjacent pieces.
    let registered = unsafe {
        engine.register_memory(a.as_mut_ptr(), half)
            && engine.register_memory(a.as_mut_ptr().add(half), half)
            && engine.register_memory(b.as_mut_ptr(), b.len())
    };
    assert!(registered, "running as root, 8 MiB must register");
    if kernel_has_fixed_vectored() {
        assert!(
            engine.fixed_vectored(),
            "6.15+ but the probe found no READV_FIXED"
        );
    }
    let fixed = u64::from(engine.fixed_vectored());
    let (in_a, in_b, in_plain) = (scattered(&mut a), scattered(&mut b), scattered(&mut plain));
    assert_eq!(
        fixed_ops_for(&engine, id, &path, &in_a),
        fixed,
        "all in a's first piece"
    );
    assert_eq!(fixed_ops_for(&engine, id, &path, &in_b), fixed, "all in b");
    let mixed: Vec<_> = in_a[..8].iter().chain(&in_b[8..]).copied().collect();
    assert_eq!(
        fixed_ops_for(&engine, id, &path, &mixed),
        0,
        "two registrations"
    );
    let mut straddle = in_a.clone();
    // SAFETY: 32 KiB before the middle of `a`: half in each piece.
    straddle[0] = unsafe { a.as_mut_ptr().add(half - SEG / 2) };
    assert_eq!(
        fixed_ops_for(&engine, id, &path, &straddle),
        0,
        "across adjacent pieces"
    );
    let one_out: Vec<_> = in_a[..15].iter().chain(&in_plain[15..]).copied().collect();
    assert_eq!(
        fixed_ops_for(&engine, id, &path, &one_out),
        0,
        "one segment unregistered"
    );
    assert_eq!(
        fixed_ops_for(&engine, id, &path, &in_plain),
        0,
        "none registered"
    );
    let s = engine.stats();
    assert_eq!((s.fixed_vectored_ops, s.vectored_ops), (2 * fixed, 6));
    assert!(
        s.fixed_buffer_ops >= 2 * fixed,
        "fixed vectored ops are fixed ops"
    );
    drop(engine);
}

#[test]
fn psync_never_uses_fixed_vectored_ops() {
    let engine = PsyncEngine::new(2, 8).expect("psync");
    let dir = tmpdir();
    let align = dio_alignment(dir.path());
    let (id, _path) = patterned(&engine, dir.path(), "f", 8);
    let mut scatter = Scatter::new(2);
    vectored(&engine, IoKind::ReadV, id, 0, &mut scatter, align)
        .check()
        .expect("readv");
    let s = engine.stats();
    assert_eq!(
        (s.fixed_vectored_ops, s.fixed_buffer_ops, s.vectored_ops),
        (0, 0, 1)
    );
}
