//! [`FaultyEngine`]: wraps another engine and injects failures, short reads
//! and bit flips, for tests of everything above the I/O layer.
//!
//! See [`FaultyEngine`] for the design; this module holds its implementation.

mod forwarder;

use std::any::Any;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::{BatchDone, Completion, IoBatch, IoEngine, IoKind, IoOp, IoStats, OpResult};
use forwarder::Forwarder;

/// One rule of injected faults. A period of 0 disables a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Every `every`-th operation (of `kind`, or of any kind when `None`)
    /// fails with `errno` without reaching the inner engine. Syncs are
    /// operations too: `kind: Some(IoKind::Fdatasync)` fails data syncs, as
    /// a device that lost its volatile cache reports them.
    FailOps {
        /// Only operations of this kind count and fail; `None` for all.
        /// `Read` takes in vectored reads (`ReadV`) and `Write` vectored
        /// writes (`WriteV`); `ReadV` and `WriteV` take only those.
        kind: Option<IoKind>,
        /// The error number reported (e.g. `libc::EIO`).
        errno: i32,
        /// Period: operations number `every`, `2 * every`, ... fail.
        every: u64,
    },
    /// Every `every`-th read (`Read` or `ReadV`) transfers fewer bytes than
    /// asked: see [`FaultyEngine`] for how much.
    ShortReads {
        /// Period, counted over reads.
        every: u64,
    },
    /// Every `every`-th read (`Read` or `ReadV`) has one bit of its data
    /// flipped after it completes successfully (silent corruption, for
    /// checksum tests). For a vectored read the bit lies in one segment:
    /// the one holding the chosen byte of the bytes read, in order.
    FlipBits {
        /// Period, counted over reads; a chosen read that fails (or is
        /// failed by another rule) is left alone.
        every: u64,
    },
    /// After the first `ops` operations, every operation fails with `errno`
    /// (a dying disk: the failure latches until the rules are replaced).
    FailAfter {
        /// Operations that still succeed.
        ops: u64,
        /// The error number reported.
        errno: i32,
    },
}

/// An engine that injects [`Fault`]s into the operations it passes to an
/// inner engine.
///
/// Faults are chosen by counters, never by chance, so a test that fails
/// fails the same way on every run. Each [`Fault`] rule counts the operations
/// it applies to on its own (operation numbers start at 1 and restart when
/// [`FaultyEngine::set_faults`] replaces the rules); when several rules pick
/// one operation, a failure wins over a short read, and a bit flip applies to
/// whatever a read brought back.
///
/// A failed operation is never handed to the inner engine, so its buffer is
/// left untouched, as a real failed read may leave it. A short read is
/// forwarded with a shorter length (half, rounded down to 512 bytes; not at
/// all when that is zero), so the tail of the buffer is not filled either.
///
/// A vectored op ([`IoKind::ReadV`], [`IoKind::WriteV`]) is one operation
/// to every rule, whatever its segment count: one failure fails all of it,
/// [`Fault::FailAfter`] counts it once. Shortened, it keeps its segments up
/// to the new length, in order: the segments past it are dropped and the
/// one it falls in is cut, so the tail segments are left untouched. Its
/// result is the bytes moved across all segments, as for `readv(2)`.
///
/// [`stats`](IoEngine::stats) are the inner engine's: operations failed here
/// never reach it. [`injected`](Self::injected) counts the faults.
pub struct FaultyEngine {
    inner: Arc<dyn IoEngine>,
    rules: Mutex<Vec<Rule>>,
    injected: Arc<AtomicU64>,
    forwarder: Forwarder,
}

/// A fault plus how many operations it has counted.
#[derive(Debug)]
struct Rule {
    fault: Fault,
    seen: u64,
}

/// What happens to one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// Not forwarded; fails with this errno.
    Fail(i32),
    /// Not forwarded; reports 0 bytes (a read shortened to nothing).
    Empty,
    /// Forwarded as operation `inner` of the inner batch.
    Forward {
        inner: usize,
        /// Flip a bit of what comes back; the value picks which bit.
        flip: Option<u64>,
    },
}

/// How to turn the inner batch's results into the caller's.
pub(crate) struct Translation {
    ops: Vec<IoOp>,
    plans: Vec<Plan>,
    injected: Arc<AtomicU64>,
}

impl FaultyEngine {
    /// Wraps `inner`, injecting `faults`. Starts one thread that relays
    /// completions from the inner engine.
    pub fn new(inner: Arc<dyn IoEngine>, faults: Vec<Fault>) -> Self {
        Self {
            inner,
            rules: Mutex::new(rules(faults)),
            injected: Arc::new(AtomicU64::new(0)),
            forwarder: Forwarder::start(),
        }
    }

    /// Replaces the rules (an empty list stops injecting) and restarts their
    /// counters. Batches already submitted keep the faults they were given.
    pub fn set_faults(&self, faults: Vec<Fault>) {
        *self.rules.lock() = rules(faults);
    }

    /// Faults injected so far: failed operations, short reads and bit flips.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// The wrapped engine.
    pub fn inner(&self) -> &Arc<dyn IoEngine> {
        &self.inner
    }

    /// Decides the fate of every operation and builds the inner batch.
    fn plan(&self, ops: &[IoOp]) -> (Vec<Plan>, IoBatch) {
        let mut rules = self.rules.lock();
        let mut plans = Vec::with_capacity(ops.len());
        let mut inner = IoBatch::with_capacity(ops.len());
        for op in ops {
            let verdict = judge(&mut rules, op);
            let plan = match verdict.fail {
                Some(errno) => Plan::Fail(errno),
                None => match forward(&mut inner, op, verdict.short) {
                    Some(index) => Plan::Forward {
                        inner: index,
                        flip: verdict.flip,
                    },
                    None => Plan::Empty,
                },
            };
            if matches!(plan, Plan::Fail(_) | Plan::Empty) || verdict.short {
                self.injected.fetch_add(1, Ordering::Relaxed);
            }
            plans.push(plan);
        }
        (plans, inner)
    }
}

/// What the rules decided for one operation.
#[derive(Debug, Default)]
struct Verdict {
    /// Fail it with this errno.
    fail: Option<i32>,
    /// Shorten it (a read).
    short: bool,
    /// Flip a bit of what it reads; the value picks which.
    flip: Option<u64>,
}

/// Runs every rule over `op`, advancing the counters of those it applies to.
fn judge(rules: &mut [Rule], op: &IoOp) -> Verdict {
    let mut v = Verdict::default();
    for rule in rules.iter_mut() {
        match rule.fault {
            Fault::FailOps { kind, errno, every } => {
                if kind.is_none_or(|k| kind_matches(k, op.kind)) {
                    rule.seen += 1;
                    if every > 0 && rule.seen % every == 0 {
                        v.fail = v.fail.or(Some(errno));
                    }
                }
            }
            Fault::FailAfter { ops, errno } => {
                rule.seen += 1;
                if rule.seen > ops {
                    v.fail = v.fail.or(Some(errno));
                }
            }
            Fault::ShortReads { every } => {
                if op.kind.is_read() {
                    rule.seen += 1;
                    v.short |= every > 0 && rule.seen % every == 0;
                }
            }
            Fault::FlipBits { every } => {
                if op.kind.is_read() {
                    rule.seen += 1;
                    if every > 0 && rule.seen % every == 0 {
                        v.flip = Some(rule.seen);
                    }
                }
            }
        }
    }
    v
}

/// Whether a [`Fault::FailOps`] rule for `filter` applies to an op of
/// `kind`: its own kind, and for `Read` (`Write`) vectored reads (writes)
/// too, so rules written before vectored ops existed keep covering every
/// read (write).
fn kind_matches(filter: IoKind, kind: IoKind) -> bool {
    filter == kind
        || (filter == IoKind::Read && kind == IoKind::ReadV)
        || (filter == IoKind::Write && kind == IoKind::WriteV)
}

/// Adds `op`, or when `short` its first half (rounded down to 512 bytes),
/// to `inner`; returns its index there, or `None` when nothing is left to
/// forward (a read shortened to nothing).
fn forward(inner: &mut IoBatch, op: &IoOp, short: bool) -> Option<usize> {
    let len = if short { (op.len / 2) & !511 } else { op.len };
    if len == 0 && op.len > 0 {
        return None;
    }
    // SAFETY: the op's batch owners, its segment list among them, ride with
    // the inner batch (see `submit`).
    match unsafe { op.vecs() } {
        // A vectored op keeps its segments up to `len`: the tail ones are
        // dropped, the one `len` falls in is shortened.
        Some(vecs) if len < op.len => {
            inner.push_vecs(op.kind, op.file, op.offset, vecs.prefix(len)?);
        }
        _ => {
            let fwd = IoOp { len, ..*op };
            // SAFETY: `fwd` covers a prefix of `op`'s memory (or is `op`, a
            // vectored one included), which the caller promised valid until
            // this batch completes; the caller's owners travel with the
            // inner batch (see `submit`), and our completion waits for the
            // inner one.
            unsafe { inner.push(fwd) };
        }
    }
    Some(inner.len() - 1)
}

fn rules(faults: Vec<Fault>) -> Vec<Rule> {
    faults
        .into_iter()
        .map(|fault| Rule { fault, seen: 0 })
        .collect()
}

impl Translation {
    /// The caller's results from the inner batch's, flipping bits as planned.
    fn apply(self, inner: BatchDone, owners: Vec<Box<dyn Any + Send>>) -> BatchDone {
        let mut inner_results = inner.results.into_iter().map(Some).collect::<Vec<_>>();
        let results = self
            .ops
            .iter()
            .zip(&self.plans)
            .map(|(op, plan)| -> OpResult {
                match *plan {
                    Plan::Fail(errno) => Err(io::Error::from_raw_os_error(errno)),
                    Plan::Empty => Ok(0),
                    Plan::Forward { inner, flip } => {
                        let res = inner_results
                            .get_mut(inner)
                            .and_then(Option::take)
                            .unwrap_or_else(|| Err(io::Error::other("inner engine lost the op")));
                        if let (Ok(n), Some(seed)) = (&res, flip)
                            && *n > 0
                        {
                            flip_bit(op, *n, seed);
                            self.injected.fetch_add(1, Ordering::Relaxed);
                        }
                        res
                    }
                }
            })
            .collect();
        BatchDone {
            ops: self.ops,
            results,
            owners,
        }
    }
}

/// Flips one bit, picked by `seed`, of the first `n` bytes `op` read: in
/// its buffer, or for a vectored op in the segment that byte falls in.
fn flip_bit(op: &IoOp, n: u32, seed: u64) {
    let byte = (seed.wrapping_mul(7919) % u64::from(n)) as usize;
    // SAFETY: the op's owners, its segment list among them, are being
    // handed back with this completion and are alive.
    let at = match unsafe { op.vecs() } {
        Some(vecs) => crate::vectored::byte_at(vecs.iov(), byte),
        // `byte < n <= op.len`: inside the buffer.
        None => Some(op.buf.wrapping_add(byte)),
    };
    if let Some(at) = at {
        // SAFETY: the read has completed, `byte < n <= op.len`, and the
        // caller promised the memory is ours to write until the batch
        // completes, which it has not yet (we are completing it).
        unsafe { *at ^= 1 << (seed % 8) };
    }
}

impl IoEngine for FaultyEngine {
    fn name(&self) -> &'static str {
        "faulty"
    }

    forward_files_to_inner!();

    fn submit(&self, batch: IoBatch) -> Completion {
        let (ops, owners) = batch.into_parts();
        let (plans, mut inner) = self.plan(&ops);
        let translation = Translation {
            ops,
            plans,
            injected: Arc::clone(&self.injected),
        };
        if inner.is_empty() {
            let empty = BatchDone {
                ops: Vec::new(),
                results: Vec::new(),
                owners: Vec::new(),
            };
            return Completion::ready(translation.apply(empty, owners));
        }
        // The caller's owners ride along with the inner batch, so the inner
        // engine keeps them alive exactly as long as it uses their memory.
        inner.keep_alive(owners);
        let inner_done = self.inner.submit(inner);
        self.forwarder.relay(inner_done, translation)
    }

    fn stats(&self) -> IoStats {
        self.inner.stats()
    }
}

impl std::fmt::Debug for FaultyEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyEngine")
            .field("inner", &self.inner.name())
            .field("rules", &*self.rules.lock())
            .field("injected", &self.injected())
            .finish()
    }
}
