//! [`UringEngine`]: io_uring with `O_DIRECT`, registered files and registered
//! buffers.
//!
//! See [`UringEngine`] for the design; this module holds its implementation.

mod buffers;
mod driver;
mod register;
mod slab;

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::thread::{JoinHandle, ThreadId};

use io_uring::IoUring;
use parking_lot::{Mutex, RwLock};

use crate::stats::Counters;
use crate::{
    BatchDone, Completer, Completion, FileId, IoBatch, IoEngine, IoError, IoOp, IoStats, Result,
};
use buffers::BufferTable;
use register::{Control, Registration};

/// The environment variable that, set to `1`, makes [`UringEngine::new`]
/// refuse (see [`UringEngine`], *Disabling*).
pub const DISABLE_IO_URING_ENV: &str = "KVTIER_DISABLE_IO_URING";

/// The environment variable that, set to `1`, says io_uring must be
/// available: tests that need it fail instead of skipping (see
/// [`uring_unavailable`]). CI sets it, since its machines have io_uring.
pub const REQUIRE_IO_URING_ENV: &str = "KVTIER_REQUIRE_IO_URING";

/// What a test that needs io_uring does when [`UringEngine::new`] failed
/// with `why`: panics when [`KVTIER_REQUIRE_IO_URING=1`](REQUIRE_IO_URING_ENV)
/// is set (so a CI host without io_uring fails loudly), else prints
/// `skipping: io_uring unavailable (why)` and returns, for the caller to
/// skip. For the tests of this and other crates.
pub fn uring_unavailable(why: &dyn std::fmt::Display) {
    if std::env::var_os(REQUIRE_IO_URING_ENV).is_some_and(|v| v == "1") {
        panic!("io_uring unavailable but {REQUIRE_IO_URING_ENV}=1: {why}");
    }
    eprintln!("skipping: io_uring unavailable ({why})");
}

/// Slots in the sparse registered-file table (capped by `RLIMIT_NOFILE`).
const FILE_SLOTS: u32 = 1024;

/// The largest queue depth accepted (the kernel's limit on ring entries is
/// 32,768, and the driver needs one entry for its wake-up read).
const MAX_QUEUE_DEPTH: u32 = 16384;

/// The io_uring engine.
///
/// # Threading model
///
/// One *driver* thread owns the ring: it alone pushes submission entries,
/// calls `io_uring_enter` and reaps completions. [`submit`](IoEngine::submit)
/// runs on the caller's thread; it resolves files and registered buffers,
/// hands the batch to the driver through a mutex-protected inbox and, only if
/// the driver is asleep in the kernel, wakes it by writing an eventfd that the
/// driver keeps a read armed on. A new batch therefore never waits for an
/// unrelated completion, and under load (driver awake) costs no extra system
/// call.
///
/// Why one owner rather than submitting from the caller's thread: the kernel
/// ties each request to the task that submitted it (completion task work runs
/// in that task, its io-wq workers belong to it, and work still queued there
/// can be cancelled when that thread exits). With a single long-lived
/// owner, a short-lived caller thread can neither lose nor delay I/O.
///
/// The driver pushes every operation it can (at most `queue_depth` in flight;
/// the rest wait in a backlog and go out as completions free slots) and then
/// makes one `io_uring_enter` that both submits and waits: one system call per
/// batch at most, fewer when batches arrive together. [`IoStats::syscalls`]
/// counts the `io_uring_enter` calls that submitted entries (waits alone and
/// eventfd wake-ups are not counted).
///
/// The ring is created on the driver thread with `DEFER_TASKRUN |
/// SINGLE_ISSUER` (Linux 6.1+; [`defers_task_run`](Self::defers_task_run)
/// tells): completion work runs only when the driver waits in
/// `io_uring_enter`, in one pass, and the kernel neither signals nor wakes
/// it per completion while it works. Older kernels get `COOP_TASKRUN`
/// (completions processed when the driver enters the kernel, without
/// interrupting it), then a plain ring. See `build_ring` for the figures.
///
/// [`IoStats::syscalls`]: crate::IoStats::syscalls
///
/// # Registered files and buffers
///
/// Files go into a sparse registered-file table when the kernel has one
/// (falling back to plain descriptors). Memory offered through
/// [`register_memory`](IoEngine::register_memory) goes into a sparse
/// registered-buffer table in pieces of at most 1 GiB; an operation whose
/// buffer lies inside one piece uses `READ_FIXED`/`WRITE_FIXED`, saving the
/// per-I/O page pinning. A vectored op uses `READV_FIXED`/`WRITEV_FIXED`
/// when every one of its segments lies inside the same piece and the kernel
/// has those opcodes (6.15+, probed when the ring starts:
/// [`fixed_vectored`](Self::fixed_vectored)), else `READV`/`WRITEV`, which
/// pin per op; [`IoStats::fixed_vectored_ops`](crate::IoStats::fixed_vectored_ops)
/// counts the fixed ones. Registering pins memory: a service not running as
/// root needs `RLIMIT_MEMLOCK` raised (or `CAP_IPC_LOCK`); without it,
/// registration reports `false` and I/O stays on the plain path.
///
/// A `SINGLE_ISSUER` ring accepts table changes only from its issuer, so
/// [`register_file`](IoEngine::register_file),
/// [`close_file`](IoEngine::close_file) and `register_memory` hand them to
/// the driver through the inbox and wait for it (a wake-up and one system
/// call; they are rare), on every ring alike. They may be called from any
/// thread, a batch owner's `Drop` on the driver included.
///
/// # Disabling
///
/// Setting the environment variable `KVTIER_DISABLE_IO_URING=1` makes
/// [`UringEngine::new`] fail with [`IoError::EngineSetup`] as if the kernel
/// had refused, so `auto` engine selection falls back to the thread pool.
/// It exists to test the fallback path that hosts with a seccomp profile
/// blocking io_uring (Docker's default) take.
pub struct UringEngine {
    shared: Arc<Shared>,
    /// The driver thread; `None` once joined.
    driver: Option<JoinHandle<()>>,
}

/// How an operation names its file in a submission entry.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target {
    /// Index in the registered-file table.
    Fixed(u32),
    /// A plain descriptor (the table was unavailable or full).
    Fd(RawFd),
}

/// What `submit` resolved for one operation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Prep {
    pub(crate) target: Target,
    /// Registered-buffer index when the buffer lies inside one.
    pub(crate) buf_index: Option<u16>,
}

/// A batch on its way from `submit` to the driver.
pub(crate) struct Pending {
    pub(crate) ops: Vec<IoOp>,
    /// `None` for an operation on an unregistered file (fails with `EBADF`).
    pub(crate) preps: Vec<Option<Prep>>,
    pub(crate) owners: Vec<Box<dyn std::any::Any + Send>>,
    pub(crate) completer: Completer,
}

/// The hand-over point between submitters and the driver. One mutex guards
/// the queue *and* the driver's sleeping flag, so "driver checks the queue is
/// empty, then sleeps" and "submitter queues, then sees whether to wake"
/// cannot interleave badly.
#[derive(Default)]
pub(crate) struct Inbox {
    pub(crate) batches: Vec<Pending>,
    /// Registrations for the driver to apply, in order (see `register`).
    pub(crate) controls: Vec<Control>,
    /// The driver is (about to be) blocked in `io_uring_enter` and needs an
    /// eventfd write to notice new work.
    pub(crate) sleeping: bool,
    /// The engine is dropping: finish what is queued and in flight, then exit.
    pub(crate) shutdown: bool,
}

/// What the engine handle and the driver share.
pub(crate) struct Shared {
    pub(crate) ring: IoUring,
    /// The ring was set up with `DEFER_TASKRUN | SINGLE_ISSUER`.
    deferred: bool,
    /// The driver: the thread that created the ring, its only issuer.
    driver_thread: ThreadId,
    pub(crate) queue_depth: u32,
    pub(crate) inbox: Mutex<Inbox>,
    /// Written to wake the driver; the driver keeps a read on it in the ring.
    pub(crate) wake_fd: OwnedFd,
    /// Registered files in `FileId` order, with how entries should name them;
    /// `None` for an id closed and not reused yet. A `File` is kept open
    /// until [`close_file`](IoEngine::close_file) (whose caller has no
    /// operation on it in flight) or the engine drops.
    files: RwLock<Vec<Option<(File, Target)>>>,
    /// Slots of the sparse file table (0 if the kernel refused it).
    file_slots: u32,
    buffers: BufferTable,
    /// The kernel has `READV_FIXED` and `WRITEV_FIXED` (and they are wanted).
    fixed_vectored: bool,
    pub(crate) stats: Counters,
}

impl Shared {
    /// Wakes the driver out of `io_uring_enter`.
    pub(crate) fn wake(&self) {
        let one: u64 = 1;
        loop {
            // SAFETY: writes 8 bytes from a live u64 to our own eventfd.
            let n = unsafe {
                libc::write(
                    self.wake_fd.as_raw_fd(),
                    (&raw const one).cast::<libc::c_void>(),
                    8,
                )
            };
            if n == 8 {
                return;
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                // Only possible if the counter would overflow, i.e. the
                // driver is not reading: it is already awake or gone.
                tracing::error!(error = %err, "io_uring: cannot wake the driver");
                return;
            }
        }
    }

    /// The registered buffer `op` may name: the piece holding its whole
    /// buffer, or for a vectored op the one piece holding every segment
    /// (when the kernel has the fixed vectored opcodes); `None` for a sync,
    /// which has no memory, and for memory outside the registered pieces.
    fn buf_index(&self, op: &IoOp, lookup: &dyn Fn(*mut u8, usize) -> Option<u16>) -> Option<u16> {
        if op.kind.is_sync() {
            return None;
        }
        // SAFETY: the op is in the batch being submitted, whose owners (its
        // segment list among them) are alive.
        let Some(vecs) = (unsafe { op.vecs() }) else {
            return lookup(op.buf, op.len as usize);
        };
        if !self.fixed_vectored {
            return None;
        }
        let mut segments = vecs.iov().iter();
        let first = segments.next()?;
        let index = lookup(first.iov_base.cast(), first.iov_len)?;
        segments
            .all(|s| lookup(s.iov_base.cast(), s.iov_len) == Some(index))
            .then_some(index)
    }
}

fn setup_err(source: io::Error) -> IoError {
    IoError::EngineSetup {
        engine: "io_uring",
        source,
    }
}

impl UringEngine {
    /// Creates a ring for at most `queue_depth` operations in flight (clamped
    /// to 1..=16384) and starts its driver thread.
    ///
    /// # Errors
    /// [`IoError::EngineSetup`] when `io_uring_setup` fails (kernel too old,
    /// seccomp, `kernel.io_uring_disabled`), when `KVTIER_DISABLE_IO_URING=1`
    /// is set, or when the eventfd or thread cannot be created.
    pub fn new(queue_depth: u32) -> Result<Self> {
        Self::with_options(queue_depth, Options::default())
    }

    /// [`new`](Self::new) with some features turned off (see [`Options`]).
    fn with_options(queue_depth: u32, options: Options) -> Result<Self> {
        if std::env::var_os(DISABLE_IO_URING_ENV).is_some_and(|v| v == "1") {
            return Err(setup_err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("disabled by {DISABLE_IO_URING_ENV}=1"),
            )));
        }
        let queue_depth = queue_depth.clamp(1, MAX_QUEUE_DEPTH);
        // The ring is created on the driver thread: with SINGLE_ISSUER the
        // creating thread is the only one the kernel lets submit and
        // register, so the driver must be it.
        let (ready, setup) = std::sync::mpsc::sync_channel(1);
        let driver = std::thread::Builder::new()
            .name("kvtier-uring".into())
            .spawn(move || {
                let shared = match Shared::new(queue_depth, options) {
                    Ok(shared) => Arc::new(shared),
                    Err(e) => {
                        let _ = ready.send(Err(e));
                        return;
                    }
                };
                // Nothing is in flight yet, so if `new` is gone (it cannot
                // be: it waits for this message) the ring can just drop.
                if ready.send(Ok(Arc::clone(&shared))).is_ok() {
                    driver::run(&shared);
                }
            })
            .map_err(setup_err)?;
        let shared = match setup.recv() {
            Ok(Ok(shared)) => shared,
            Ok(Err(e)) => {
                let _ = driver.join();
                return Err(e);
            }
            Err(_) => {
                let _ = driver.join();
                return Err(setup_err(io::Error::other(
                    "the io_uring driver thread exited during setup",
                )));
            }
        };
        Ok(Self {
            shared,
            driver: Some(driver),
        })
    }

    /// The maximum number of operations in flight.
    pub fn queue_depth(&self) -> u32 {
        self.shared.queue_depth
    }

    /// Whether files are named through the registered-file table.
    pub fn uses_registered_files(&self) -> bool {
        self.shared.file_slots > 0
    }

    /// Whether the ring defers completion work to the driver's waits
    /// (`IORING_SETUP_DEFER_TASKRUN | SINGLE_ISSUER`, Linux 6.1 and later);
    /// `false` where the kernel refused it and the ring uses
    /// `COOP_TASKRUN` or neither.
    pub fn defers_task_run(&self) -> bool {
        self.shared.deferred
    }

    /// Whether vectored ops whose segments all lie in one registered piece
    /// go out as `READV_FIXED`/`WRITEV_FIXED` (Linux 6.15 and later, found
    /// by probing the ring at start); `false` where the kernel lacks them
    /// and every vectored op is a plain `READV`/`WRITEV`.
    pub fn fixed_vectored(&self) -> bool {
        self.shared.fixed_vectored
    }
}

/// Features [`UringEngine::new`] turns on where the kernel has them, which
/// tests turn off to cover the paths older kernels take.
#[derive(Debug, Clone, Copy)]
struct Options {
    /// A sparse registered-file table (else plain descriptors).
    file_table: bool,
    /// `DEFER_TASKRUN | SINGLE_ISSUER` (else `COOP_TASKRUN` or neither).
    defer: bool,
    /// `READV_FIXED`/`WRITEV_FIXED` (else plain `READV`/`WRITEV` always).
    fixed_vectored: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            file_table: true,
            defer: true,
            fixed_vectored: true,
        }
    }
}

impl Shared {
    /// Creates the ring, its wake-up eventfd and its sparse tables; on the
    /// driver thread, which becomes the ring's issuer.
    fn new(queue_depth: u32, options: Options) -> Result<Self> {
        let (ring, deferred) = build_ring(queue_depth + 1, options.defer).map_err(setup_err)?;
        // SAFETY: eventfd has no memory-safety preconditions.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(setup_err(io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns. It is
        // blocking on purpose: io_uring completes a read of a non-blocking
        // fd with EAGAIN instead of waiting for it.
        let wake_fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let file_slots = if options.file_table {
            sparse_file_slots(&ring)
        } else {
            0
        };
        let buffers = BufferTable::new(&ring);
        let fixed_vectored = options.fixed_vectored && probe_fixed_vectored(&ring);
        Ok(Shared {
            ring,
            deferred,
            driver_thread: std::thread::current().id(),
            queue_depth,
            inbox: Mutex::new(Inbox::default()),
            wake_fd,
            files: RwLock::new(Vec::new()),
            file_slots,
            buffers,
            fixed_vectored,
            stats: Counters::default(),
        })
    }
}

/// Creates a ring of `entries` entries (one more than the queue depth, for
/// the driver's wake-up read; the completion queue is twice that by default,
/// and no more than `entries` requests are ever outstanding, so it cannot
/// overflow). Returns whether it defers completion work.
///
/// Preferred is `DEFER_TASKRUN | SINGLE_ISSUER` (6.1): completion work then
/// runs only when the driver enters the kernel to wait, in one pass, and the
/// kernel neither signals nor wakes the driver per completion while it
/// works. Measured on `bench store`'s engine_read_4k (docs/benchmarks.md):
/// about 0.35 µs less CPU per 4 KiB read than `COOP_TASKRUN` (the engine
/// side minus the raw loop of the same rounds, 2026-11-25). The price is
/// that only the creating thread may submit or register, which the driver
/// model already guarantees for submission, and `register` routes
/// registrations through the driver. Older kernels get `COOP_TASKRUN`
/// (5.19: completions are processed when the driver enters the kernel,
/// without interrupting it; 15-30% less CPU than the default in
/// `tests/cpu.rs`), then a plain ring.
fn build_ring(entries: u32, defer: bool) -> io::Result<(IoUring, bool)> {
    if defer
        && let Ok(ring) = IoUring::builder()
            .setup_submit_all()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_taskrun_flag()
            .build(entries)
    {
        return Ok((ring, true));
    }
    let ring = IoUring::builder()
        .setup_submit_all()
        .setup_coop_taskrun()
        .setup_taskrun_flag()
        .build(entries)
        .or_else(|_| IoUring::new(entries))?;
    Ok((ring, false))
}

/// Whether the kernel knows `READV_FIXED` and `WRITEV_FIXED` (Linux 6.15):
/// older ones fail them with `EINVAL` at completion, too late to fall back
/// per op, so the ring asks once with `IORING_REGISTER_PROBE` (5.6).
fn probe_fixed_vectored(ring: &IoUring) -> bool {
    let mut probe = io_uring::Probe::new();
    match ring.submitter().register_probe(&mut probe) {
        Ok(()) => {
            probe.is_supported(io_uring::opcode::ReadvFixed::CODE)
                && probe.is_supported(io_uring::opcode::WritevFixed::CODE)
        }
        Err(e) => {
            tracing::info!(error = %e, "io_uring: cannot probe opcodes; vectored ops stay unfixed");
            false
        }
    }
}

/// Creates the sparse registered-file table, as large as the descriptor limit
/// allows; 0 if the kernel refuses (descriptors are then used directly).
fn sparse_file_slots(ring: &IoUring) -> u32 {
    let nofile = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    let slots = FILE_SLOTS.min(u32::try_from(nofile).unwrap_or(u32::MAX));
    if slots == 0 {
        return 0;
    }
    match ring.submitter().register_files_sparse(slots) {
        Ok(()) => slots,
        Err(e) => {
            tracing::info!(error = %e, "io_uring: no registered-file table; using plain descriptors");
            0
        }
    }
}

impl IoEngine for UringEngine {
    fn name(&self) -> &'static str {
        "io_uring"
    }

    fn register_file(&self, file: File) -> Result<FileId> {
        let fd = file.as_raw_fd();
        let (index, queued) = {
            let mut files = self.shared.files.write();
            // The lowest free id, so that closing and registering short-lived
            // files keeps reusing the same slots of the registered-file table.
            let index = files
                .iter()
                .position(Option::is_none)
                .unwrap_or(files.len());
            let id = u32::try_from(index)
                .map_err(|_| setup_err(io::Error::other("too many files registered")))?;
            // Named by its descriptor until the driver has put it in the
            // table. The update is queued under the lock so that it is
            // applied after the emptying of the slot by an earlier close of
            // the same id, never before.
            let entry = Some((file, Target::Fd(fd)));
            if index == files.len() {
                files.push(entry);
            } else {
                files[index] = entry;
            }
            let queued = (id < self.shared.file_slots).then(|| {
                self.shared
                    .queue_registration(Registration::files(id, vec![fd]))
            });
            (index, queued)
        };
        let id = index as u32;
        if let Some(queued) = queued {
            match self.shared.finish(queued) {
                Ok(()) => {
                    let mut files = self.shared.files.write();
                    // Still this file: the id was not handed out yet, so
                    // nobody could have closed it.
                    if let Some(Some((f, target))) = files.get_mut(index)
                        && f.as_raw_fd() == fd
                    {
                        *target = Target::Fixed(id);
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "io_uring: file not registered; using its descriptor");
                }
            }
        }
        Ok(FileId(id))
    }

    fn close_file(&self, id: FileId) -> Result<()> {
        let (file, queued) = {
            let mut files = self.shared.files.write();
            let Some((file, target)) = files.get_mut(id.0 as usize).and_then(Option::take) else {
                return Err(IoError::NotRegistered { id: id.0 });
            };
            // -1 empties the slot. Requests still holding the file keep
            // their own reference in the kernel; the caller has none left.
            // Queued under the lock: see `register_file`.
            let queued = match target {
                Target::Fixed(slot) => Some(
                    self.shared
                        .queue_registration(Registration::files(slot, vec![-1])),
                ),
                Target::Fd(_) => None,
            };
            (file, queued)
        };
        if let Some(queued) = queued
            && let Err(e) = self.shared.finish(queued)
        {
            tracing::warn!(error = %e, id = id.0, "io_uring: cannot empty a registered-file slot");
        }
        drop(file);
        Ok(())
    }

    unsafe fn register_memory(&self, ptr: *mut u8, len: usize) -> bool {
        // SAFETY: our caller promises the range outlives the engine, and the
        // ring lives exactly as long as the engine (the driver is joined in
        // Drop before `shared` can go).
        unsafe {
            self.shared
                .buffers
                .register(|r| self.shared.register(r), ptr, len)
        }
    }

    fn submit(&self, batch: IoBatch) -> Completion {
        self.shared.stats.batch();
        let (ops, owners) = batch.into_parts();
        if ops.is_empty() {
            return Completion::ready(BatchDone {
                ops,
                results: Vec::new(),
                owners,
            });
        }
        let files = self.shared.files.read();
        let preps = self.shared.buffers.with_lookup(|lookup| {
            ops.iter()
                .map(|op| {
                    let (_, target) = files.get(op.file.0 as usize)?.as_ref()?;
                    Some(Prep {
                        target: *target,
                        buf_index: self.shared.buf_index(op, lookup),
                    })
                })
                .collect()
        });
        drop(files);
        let (completer, completion) = Completion::pair();
        let pending = Pending {
            ops,
            preps,
            owners,
            completer,
        };
        let wake = {
            let mut inbox = self.shared.inbox.lock();
            inbox.batches.push(pending);
            std::mem::replace(&mut inbox.sleeping, false)
        };
        if wake {
            self.shared.wake();
        }
        completion
    }

    fn stats(&self) -> IoStats {
        self.shared.stats.snapshot()
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        self.shared.inbox.lock().shutdown = true;
        // Always write: the driver must see its armed wake-up read complete
        // before it may exit (the read's buffer lives on its stack frame).
        self.shared.wake();
        if let Some(driver) = self.driver.take() {
            // A batch owner holding the last reference to the engine is
            // dropped on the driver thread, which cannot join itself; it
            // finishes on its own (it holds `Shared`, the ring included).
            if driver.thread().id() != std::thread::current().id() {
                let _ = driver.join();
            }
        }
    }
}

impl std::fmt::Debug for UringEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringEngine")
            .field("queue_depth", &self.shared.queue_depth)
            .field("registered_files", &(self.shared.file_slots > 0))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AlignedBuf;

    /// The plain-descriptor path (no registered-file table, as on kernels
    /// without one or past its slots) moves the same bytes.
    #[test]
    fn plain_descriptors_work() {
        let engine = match UringEngine::with_options(
            8,
            Options {
                file_table: false,
                ..Options::default()
            },
        ) {
            Ok(e) => e,
            Err(e) => return uring_unavailable(&e),
        };
        assert!(!engine.uses_registered_files());
        let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
        let file = crate::open_direct(&dir.path().join("f"), 1 << 16).expect("open");
        let id = engine.register_file(file).expect("register");
        let mut buf = AlignedBuf::zeroed(8192, 4096);
        buf.fill(0x3c);
        let mut batch = IoBatch::new();
        batch.write_owned(id, 4096, buf);
        engine.submit(batch).wait().check().expect("write");
        let mut batch = IoBatch::new();
        batch.read_owned(id, 4096, AlignedBuf::zeroed(8192, 4096));
        let mut done = engine.submit(batch).wait();
        done.check().expect("read");
        let back: AlignedBuf = done.take_owner(0).expect("buf");
        assert!(back.iter().all(|&b| b == 0x3c));
    }

    /// Without the fixed vectored opcodes (kernels before 6.15, as the
    /// probe reports them), a vectored op inside registered memory goes out
    /// as a plain `READV`/`WRITEV` and still moves the right bytes.
    #[test]
    fn vectored_ops_without_the_fixed_opcodes() {
        // Before the engine, so it outlives it (registered memory must).
        let mut arena = AlignedBuf::zeroed(1 << 20, 4096);
        let engine = match UringEngine::with_options(
            8,
            Options {
                fixed_vectored: false,
                ..Options::default()
            },
        ) {
            Ok(e) => e,
            Err(e) => return uring_unavailable(&e),
        };
        assert!(!engine.fixed_vectored());
        let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
        let file = crate::open_direct(&dir.path().join("f"), 1 << 16).expect("open");
        let id = engine.register_file(file).expect("register");
        let base = arena.as_mut_ptr();
        // SAFETY: `arena` outlives the engine (declared before it).
        assert!(unsafe { engine.register_memory(base, arena.len()) });
        // SAFETY: both 4 KiB segments lie in `arena`, untouched until the
        // waits return.
        let segs = unsafe { [(base.add(8192), 4096), (base, 4096)] };
        arena[8192..12288].fill(1);
        arena[..4096].fill(2);
        let vectored = |kind| {
            let mut batch = IoBatch::new();
            // SAFETY: see `segs`.
            unsafe { batch.push_vectored(kind, id, 4096, segs, None) }.expect("valid");
            engine.submit(batch).wait().check()
        };
        vectored(crate::IoKind::WriteV).expect("writev");
        arena.fill(0);
        vectored(crate::IoKind::ReadV).expect("readv");
        assert!(arena[8192..12288].iter().all(|&b| b == 1));
        assert!(arena[..4096].iter().all(|&b| b == 2));
        let s = engine.stats();
        assert_eq!(
            (s.vectored_ops, s.fixed_vectored_ops, s.fixed_buffer_ops),
            (2, 0, 0)
        );
    }

    /// The target `register_file` left for `id`.
    fn target(engine: &UringEngine, id: FileId) -> Option<Target> {
        engine.shared.files.read()[id.0 as usize]
            .as_ref()
            .map(|(_, t)| *t)
    }

    /// Writes a block of `byte` at `offset` of `id` and reads it back,
    /// through `buf` (which may lie in registered memory).
    fn round_trip(engine: &UringEngine, id: FileId, offset: u64, buf: *mut u8, byte: u8) {
        // SAFETY: the callers pass 4 KiB they own and do not touch until
        // the waits below return.
        let block = unsafe { std::slice::from_raw_parts_mut(buf, 4096) };
        block.fill(byte);
        let op = |kind| IoOp {
            kind,
            file: id,
            offset,
            buf,
            len: 4096,
        };
        let mut batch = IoBatch::new();
        // SAFETY: see above.
        unsafe { batch.push(op(crate::IoKind::Write)) };
        engine.submit(batch).wait().check().expect("write");
        block.fill(0);
        let mut batch = IoBatch::new();
        // SAFETY: see above.
        unsafe { batch.push(op(crate::IoKind::Read)) };
        engine.submit(batch).wait().check().expect("read");
        assert!(
            block.iter().all(|&b| b == byte),
            "file {} offset {offset}",
            id.0
        );
    }

    /// Registrations from many threads while I/O runs, on both rings (with
    /// `SINGLE_ISSUER` the kernel refuses them on any thread but the
    /// driver): every file lands in the registered table, and closes and
    /// re-registrations of the same ids apply in order (an emptying applied
    /// after the slot's next file was registered would fail its I/O with
    /// EBADF).
    #[test]
    fn registrations_from_many_threads_apply_in_order() {
        for defer in [true, false] {
            let engine = match UringEngine::with_options(
                16,
                Options {
                    defer,
                    ..Options::default()
                },
            ) {
                Ok(e) => e,
                Err(e) => return uring_unavailable(&e),
            };
            assert!(engine.uses_registered_files());
            let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
            std::thread::scope(|s| {
                for t in 0..4u8 {
                    let (engine, dir) = (&engine, &dir);
                    s.spawn(move || {
                        // Memory registered by this thread; leaked, since
                        // registered memory must outlive the engine.
                        let arena: &'static mut AlignedBuf =
                            Box::leak(Box::new(AlignedBuf::zeroed(4096, 4096)));
                        // SAFETY: leaked above, so it outlives the engine.
                        let fixed = unsafe { engine.register_memory(arena.as_mut_ptr(), 4096) };
                        assert!(fixed, "running as root, 4 KiB must register");
                        let mut plain = AlignedBuf::zeroed(4096, 4096);
                        for round in 0..25u8 {
                            let path = dir.path().join(format!("f{t}-{round}"));
                            let file = crate::open_direct(&path, 1 << 16).expect("open");
                            let id = engine.register_file(file).expect("register");
                            assert!(
                                matches!(target(engine, id), Some(Target::Fixed(slot)) if slot == id.0),
                                "defer {defer}: file {} not in the registered table",
                                id.0
                            );
                            let byte = t * 50 + round + 1;
                            round_trip(engine, id, 0, arena.as_mut_ptr(), byte);
                            round_trip(engine, id, 4096, plain.as_mut_ptr(), byte ^ 0xff);
                            engine.close_file(id).expect("close");
                        }
                    });
                }
            });
            let stats = engine.stats();
            assert_eq!(stats.errors, 0, "defer {defer}: {stats:?}");
            assert_eq!(
                stats.fixed_buffer_ops,
                4 * 25 * 2,
                "defer {defer}: {stats:?}"
            );
        }
    }

    /// Drops `engine`'s file `close` and registers `open` and `memory` from
    /// its `Drop`, reporting the outcome and the thread it ran on.
    struct RegistersOnDrop {
        engine: Arc<UringEngine>,
        close: FileId,
        open: Option<File>,
        memory: *mut u8,
        report: std::sync::mpsc::Sender<(bool, Result<FileId>, Result<()>, bool)>,
    }

    // SAFETY: `memory` points to a leaked buffer only this value uses.
    unsafe impl Send for RegistersOnDrop {}

    impl Drop for RegistersOnDrop {
        fn drop(&mut self) {
            let on_driver = std::thread::current().name() == Some("kvtier-uring");
            let closed = self.engine.close_file(self.close);
            let opened = match self.open.take() {
                Some(f) => self.engine.register_file(f),
                None => Err(IoError::NotRegistered { id: u32::MAX }),
            };
            // SAFETY: leaked by the test, so it outlives the engine.
            let fixed = unsafe { self.engine.register_memory(self.memory, 4096) };
            let _ = self.report.send((on_driver, opened, closed, fixed));
        }
    }

    /// A batch owner dropped on the driver thread (its completion was
    /// dropped) may register and close files and memory: the driver applies
    /// them itself rather than waiting for itself, which would hang.
    #[test]
    fn owner_dropped_on_the_driver_may_register() {
        for defer in [true, false] {
            let engine = match UringEngine::with_options(
                8,
                Options {
                    defer,
                    ..Options::default()
                },
            ) {
                Ok(e) => Arc::new(e),
                Err(e) => return uring_unavailable(&e),
            };
            let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
            let big = 8 << 20;
            let data = engine
                .register_file(crate::open_direct(&dir.path().join("data"), big).expect("open"))
                .expect("register");
            let mut on_driver = false;
            // The owner is dropped on the driver only if the completion is
            // dropped before the I/O ends; 8 MiB of writes make that likely,
            // and a few tries certain.
            for attempt in 0..20 {
                let close = engine
                    .register_file(
                        crate::open_direct(&dir.path().join(format!("c{attempt}")), 4096)
                            .expect("open"),
                    )
                    .expect("register");
                let open = crate::open_direct(&dir.path().join(format!("o{attempt}")), 4096)
                    .expect("open");
                let memory = Box::leak(Box::new(AlignedBuf::zeroed(4096, 4096))).as_mut_ptr();
                let (report, reports) = std::sync::mpsc::channel();
                let mut batch = IoBatch::new();
                batch.write_owned(data, 0, AlignedBuf::zeroed(big as usize, 4096));
                batch.keep_alive(RegistersOnDrop {
                    engine: Arc::clone(&engine),
                    close,
                    open: Some(open),
                    memory,
                    report,
                });
                drop(engine.submit(batch));
                let (driver, opened, closed, fixed) = reports
                    .recv_timeout(std::time::Duration::from_secs(20))
                    .expect("the owner's registrations hung");
                closed.expect("close from the owner");
                let id = opened.expect("register from the owner");
                assert!(fixed, "memory registered from the owner");
                if engine.shared.file_slots > 0 {
                    assert!(matches!(target(&engine, id), Some(Target::Fixed(_))));
                }
                engine.close_file(id).expect("close");
                if driver {
                    on_driver = true;
                    break;
                }
            }
            assert!(
                on_driver,
                "defer {defer}: no owner was dropped on the driver"
            );
        }
    }
}
