//! CPU cost per operation (submit + complete), measured with `getrusage`
//! over the whole process (the engine's threads and the kernel's io-wq
//! workers included). Prints figures and asserts nothing about time: run it
//! by hand, in release mode:
//!
//! ```text
//! cargo test --release -p kvtier-io --test cpu -- --ignored --nocapture
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvtier_io::{
    AlignedBuf, IoBatch, IoEngine, IoKind, IoOp, PsyncEngine, UringEngine, open_direct,
};

/// User plus system CPU time of the whole process.
fn cpu_time() -> Duration {
    // SAFETY: rusage is plain old data; all-zero is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Reads `ops` blocks of `len` bytes at pseudo-random aligned offsets, in
/// batches of `batch`, keeping `in_flight` batches outstanding.
fn measure(engine: &Arc<dyn IoEngine>, label: &str, len: usize, register: bool) {
    let dir = tempfile::Builder::new()
        .prefix("kvtier-io-cpu")
        .tempdir_in("/tmp")
        .expect("tmp");
    let file_size: u64 = 256 << 20;
    let id = engine
        .register_file(open_direct(&dir.path().join("f"), file_size).expect("open"))
        .expect("register");
    // Write the file once so reads hit allocated blocks.
    let chunk = 4 << 20;
    for off in (0..file_size).step_by(chunk) {
        let mut b = IoBatch::new();
        b.write_owned(id, off, AlignedBuf::zeroed(chunk, 4096));
        engine.submit(b).wait().check().expect("fill");
    }
    let batch = 32usize;
    let in_flight = 2usize;
    let mut arena = AlignedBuf::zeroed(batch * in_flight * len, 4096);
    let base = arena.as_mut_ptr();
    // SAFETY: `register_memory` wants the range valid for the engine's life.
    // The caller creates an engine per call and drops it right after, while
    // `arena` is dropped at the end of this function; no operation uses the
    // range after the waits below, and the driver never touches registered
    // memory on its own, so the short gap is harmless.
    let fixed = register && unsafe { engine.register_memory(base, arena.len()) };
    let blocks = file_size / len as u64;
    let total_ops = (200_000 * 4096 / len).clamp(4_000, 200_000);
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let stats0 = engine.stats();
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    let mut queue = std::collections::VecDeque::new();
    let mut submitted = 0;
    let mut slot = 0usize;
    while submitted < total_ops || !queue.is_empty() {
        while queue.len() < in_flight && submitted < total_ops {
            let mut b = IoBatch::with_capacity(batch);
            for i in 0..batch {
                let op = IoOp {
                    kind: IoKind::Read,
                    file: id,
                    offset: next(blocks) * len as u64,
                    // SAFETY: inside `arena`.
                    buf: unsafe { base.add((slot * batch + i) * len) },
                    len: len as u32,
                };
                // SAFETY: each in-flight batch uses its own part of `arena`,
                // which outlives the batch (we wait for all below).
                unsafe { b.push(op) };
            }
            slot = (slot + 1) % in_flight;
            queue.push_back(engine.submit(b));
            submitted += batch;
        }
        if let Some(c) = queue.pop_front() {
            c.wait().check().expect("read");
        }
    }
    let wall = t0.elapsed();
    let cpu = cpu_time() - cpu0;
    let s = engine.stats();
    let ops = (s.ops - stats0.ops) as f64;
    println!(
        "{label:<28} {:>4} KiB  ops {ops:>7}  cpu/op {:>6.2} us  wall/op {:>6.2} us  \
         enters/batch {:.2}  fixed {}  {:.0} MB/s",
        len / 1024,
        cpu.as_secs_f64() * 1e6 / ops,
        wall.as_secs_f64() * 1e6 / ops,
        (s.syscalls - stats0.syscalls) as f64 / (ops / batch as f64),
        fixed,
        ops * len as f64 / wall.as_secs_f64() / 1e6,
    );
    drop(arena);
}

#[test]
#[ignore = "a measurement, not a check; run by hand in release mode"]
fn cpu_per_op() {
    for &len in &[4096usize, 128 << 10] {
        for register in [false, true] {
            let e: Arc<dyn IoEngine> = Arc::new(UringEngine::new(64).expect("io_uring"));
            let label = if register {
                "io_uring qd64 fixed-buf"
            } else {
                "io_uring qd64"
            };
            measure(&e, label, len, register);
        }
        let e: Arc<dyn IoEngine> = Arc::new(PsyncEngine::new(8, 64).expect("psync"));
        measure(&e, "psync 8 threads", len, false);
    }
}
