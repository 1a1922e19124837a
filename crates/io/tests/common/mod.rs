//! Helpers shared by the engine test binaries.

use std::sync::Arc;

use kvtier_io::{AlignedBuf, IoEngine, IoError, PsyncEngine, UringEngine, uring_unavailable};

/// Alignment and unit of the test files' direct I/O.
pub const BLOCK: usize = 4096;

/// Deterministic, position-dependent bytes: a misplaced block never matches.
pub fn pattern_byte(seed: u64, pos: u64) -> u8 {
    let x = (seed ^ 0x9E37_79B9_7F4A_7C15)
        .wrapping_mul(pos | 1)
        .wrapping_add(pos >> 9);
    (x ^ (x >> 29)) as u8
}

/// A buffer of `len` bytes holding the pattern for file offsets `offset..`.
pub fn pattern(seed: u64, offset: u64, len: usize) -> AlignedBuf {
    let mut buf = AlignedBuf::zeroed(len, BLOCK);
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pattern_byte(seed, offset + i as u64);
    }
    buf
}

/// Builds an engine with the given queue depth, or `None` where the engine
/// cannot exist on this host (io_uring under a seccomp filter).
pub type Factory = fn(u32) -> Option<Arc<dyn IoEngine>>;

/// The psync engine (4 threads).
pub fn psync(queue_depth: u32) -> Option<Arc<dyn IoEngine>> {
    Some(Arc::new(
        PsyncEngine::new(4, queue_depth).expect("psync engine"),
    ))
}

/// The io_uring engine; `None` (said on stderr) where io_uring cannot run.
pub fn uring(queue_depth: u32) -> Option<Arc<dyn IoEngine>> {
    match UringEngine::new(queue_depth) {
        Ok(e) => Some(Arc::new(e)),
        Err(IoError::EngineSetup { source, .. }) => {
            uring_unavailable(&source);
            None
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
}
