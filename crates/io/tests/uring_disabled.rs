//! `KVTIER_DISABLE_IO_URING=1` makes io_uring refuse as under a seccomp
//! profile, and `auto` selection falls back to the thread pool. In a file of
//! its own because environment variables are process-wide and each
//! integration-test file runs as its own process.

use kvtier_core::IoEngineKind;
use kvtier_io::{
    AlignedBuf, DISABLE_IO_URING_ENV, IoBatch, IoError, UringEngine, build_engine, open_direct,
};

#[test]
fn disabled_io_uring_falls_back_to_psync() {
    // SAFETY: the only test in this process, so no other thread reads the
    // environment concurrently.
    unsafe { std::env::set_var(DISABLE_IO_URING_ENV, "1") };

    match UringEngine::new(8) {
        Err(IoError::EngineSetup { engine, source }) => {
            assert_eq!(engine, "io_uring");
            assert!(source.to_string().contains(DISABLE_IO_URING_ENV));
        }
        other => panic!("expected EngineSetup, got {other:?}"),
    }
    assert!(matches!(
        build_engine(IoEngineKind::IoUring, 8, 2),
        Err(IoError::EngineSetup { .. })
    ));

    let engine = build_engine(IoEngineKind::Auto, 8, 2).expect("auto falls back");
    assert_eq!(engine.name(), "psync");

    // And the fallback works.
    let dir = tempfile::Builder::new()
        .prefix("kvtier-io-disabled")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let id = engine
        .register_file(open_direct(&dir.path().join("f"), 1 << 16).expect("open"))
        .expect("register");
    let mut buf = AlignedBuf::zeroed(4096, 4096);
    buf.fill(3);
    let mut batch = IoBatch::new();
    batch.write_owned(id, 0, buf);
    engine.submit(batch).wait().check().expect("write");
    let mut batch = IoBatch::new();
    batch.read_owned(id, 0, AlignedBuf::zeroed(4096, 4096));
    let mut done = engine.submit(batch).wait();
    done.check().expect("read");
    let back: AlignedBuf = done.take_owner(0).expect("buf");
    assert!(back.iter().all(|&b| b == 3));
}
