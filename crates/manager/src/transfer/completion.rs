//! Completion of a transfer, per block and as a whole.
//!
//! A [`CompletionCell`] holds one result slot per block. The engine fills
//! slots through a [`Completer`] (each slot once; dropping the completer
//! fails every unfilled slot as [`BlockFailure::Abandoned`], so no waiter
//! hangs when an executor dies); any number of futures wait for one block
//! or for all. The cell is generic over its lock so the shuttle test below
//! can explore interleavings with shuttle's mutex; the crate uses
//! `parking_lot`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use super::request::{BlockFailure, BlockResult};

/// The state behind the lock.
#[derive(Debug)]
pub(crate) struct CellState {
    results: Vec<Option<BlockResult>>,
    remaining: usize,
    waiters: Vec<Waker>,
}

/// The lock a cell uses (parking_lot's in the crate, shuttle's in tests).
pub(crate) trait CellLock: Send + Sync + 'static {
    /// A lock around `state`.
    fn wrap(state: CellState) -> Self;
    /// Runs `f` under the lock.
    fn with<R>(&self, f: impl FnOnce(&mut CellState) -> R) -> R;
}

impl CellLock for parking_lot::Mutex<CellState> {
    fn wrap(state: CellState) -> Self {
        parking_lot::Mutex::new(state)
    }
    fn with<R>(&self, f: impl FnOnce(&mut CellState) -> R) -> R {
        f(&mut self.lock())
    }
}

/// The lock the crate uses.
pub(crate) type DefaultLock = parking_lot::Mutex<CellState>;

/// One result slot per block, and the wakers waiting on them.
#[derive(Debug)]
pub(crate) struct CompletionCell<L = DefaultLock> {
    lock: L,
}

impl<L: CellLock> CompletionCell<L> {
    /// A cell of `n` empty slots (done at once when `n == 0`).
    pub(crate) fn new(n: usize) -> Self {
        Self {
            lock: L::wrap(CellState {
                results: vec![None; n],
                remaining: n,
                waiters: Vec::new(),
            }),
        }
    }

    /// Fills slot `i`; returns false (and changes nothing) when it was
    /// already filled or does not exist.
    pub(crate) fn complete(&self, i: usize, result: BlockResult) -> bool {
        let (filled, wake) = self.lock.with(|s| match s.results.get_mut(i) {
            Some(slot @ None) => {
                *slot = Some(result);
                s.remaining -= 1;
                (true, std::mem::take(&mut s.waiters))
            }
            _ => (false, Vec::new()),
        });
        // Wake outside the lock: a woken task may poll on this thread.
        for w in wake {
            w.wake();
        }
        filled
    }

    /// Fills every empty slot with `failure`.
    pub(crate) fn fail_rest(&self, failure: BlockFailure) {
        let wake = self.lock.with(|s| {
            for slot in s.results.iter_mut().filter(|r| r.is_none()) {
                *slot = Some(Err(failure.clone()));
            }
            s.remaining = 0;
            std::mem::take(&mut s.waiters)
        });
        for w in wake {
            w.wake();
        }
    }

    /// Slots filled so far.
    pub(crate) fn done_count(&self) -> usize {
        self.lock.with(|s| s.results.len() - s.remaining)
    }

    /// Whether every slot is filled.
    pub(crate) fn is_done(&self) -> bool {
        self.lock.with(|s| s.remaining == 0)
    }

    /// Every result, once all are in.
    pub(crate) fn try_all(&self) -> Option<Vec<BlockResult>> {
        self.lock
            .with(|s| (s.remaining == 0).then(|| s.results.iter().flatten().cloned().collect()))
    }

    fn register(s: &mut CellState, cx: &Context<'_>) {
        if !s.waiters.iter().any(|w| w.will_wake(cx.waker())) {
            s.waiters.push(cx.waker().clone());
        }
    }

    /// Polls for every result.
    pub(crate) fn poll_all(&self, cx: &Context<'_>) -> Poll<Vec<BlockResult>> {
        self.lock.with(|s| {
            if s.remaining == 0 {
                Poll::Ready(s.results.iter().flatten().cloned().collect())
            } else {
                Self::register(s, cx);
                Poll::Pending
            }
        })
    }

    /// Polls for slot `i`'s result (`InvalidRequest` for a slot that does
    /// not exist).
    pub(crate) fn poll_one(&self, i: usize, cx: &Context<'_>) -> Poll<BlockResult> {
        self.lock.with(|s| match s.results.get(i) {
            None => Poll::Ready(Err(BlockFailure::InvalidRequest(format!(
                "block {i} of a transfer of {}",
                s.results.len()
            )))),
            Some(Some(r)) => Poll::Ready(r.clone()),
            Some(None) => {
                Self::register(s, cx);
                Poll::Pending
            }
        })
    }
}

/// The engine's side of a cell: fills slots; on drop fails the rest as
/// abandoned.
#[derive(Debug)]
pub(crate) struct Completer<L: CellLock = DefaultLock> {
    cell: Arc<CompletionCell<L>>,
}

impl<L: CellLock> Completer<L> {
    /// A completer of `cell`.
    pub(crate) fn new(cell: Arc<CompletionCell<L>>) -> Self {
        Self { cell }
    }

    /// Fills slot `i` (see [`CompletionCell::complete`]).
    pub(crate) fn complete(&self, i: usize, result: BlockResult) -> bool {
        self.cell.complete(i, result)
    }
}

impl<L: CellLock> Drop for Completer<L> {
    fn drop(&mut self) {
        if !self.cell.is_done() {
            self.cell.fail_rest(BlockFailure::Abandoned);
        }
    }
}

/// Resolves to every block's result, in request order.
#[derive(Debug)]
pub struct WaitAll {
    cell: Arc<CompletionCell>,
}

impl WaitAll {
    pub(crate) fn new(cell: Arc<CompletionCell>) -> Self {
        Self { cell }
    }
}

impl Future for WaitAll {
    type Output = Vec<BlockResult>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.cell.poll_all(cx)
    }
}

/// Resolves to one block's result.
#[derive(Debug)]
pub struct WaitBlock {
    cell: Arc<CompletionCell>,
    index: usize,
}

impl WaitBlock {
    pub(crate) fn new(cell: Arc<CompletionCell>, index: usize) -> Self {
        Self { cell, index }
    }
}

impl Future for WaitBlock {
    type Output = BlockResult;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.cell.poll_one(self.index, cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct ShuttleLock(shuttle::sync::Mutex<CellState>);

    impl CellLock for ShuttleLock {
        fn wrap(state: CellState) -> Self {
            ShuttleLock(shuttle::sync::Mutex::new(state))
        }
        fn with<R>(&self, f: impl FnOnce(&mut CellState) -> R) -> R {
            // A poisoned lock means another shuttle thread panicked; the
            // test fails through that panic anyway.
            let mut guard = match self.0.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            f(&mut guard)
        }
    }

    struct AllOf(Arc<CompletionCell<ShuttleLock>>);
    impl Future for AllOf {
        type Output = Vec<BlockResult>;
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            self.0.poll_all(cx)
        }
    }
    struct OneOf(Arc<CompletionCell<ShuttleLock>>, usize);
    impl Future for OneOf {
        type Output = BlockResult;
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            self.0.poll_one(self.1, cx)
        }
    }

    fn result_of(i: usize) -> BlockResult {
        if i.is_multiple_of(2) {
            Ok(())
        } else {
            Err(BlockFailure::Corrupt)
        }
    }

    /// Completers on three threads (one racing a duplicate completion of
    /// block 0), waiters for everything and for single blocks on others:
    /// no waiter misses its wake-up (shuttle reports a deadlock if one
    /// does), each sees exactly the first result stored, and "all" is seen
    /// only with every slot filled.
    fn scenario() {
        const N: usize = 4;
        let cell = Arc::new(CompletionCell::<ShuttleLock>::new(N));
        let mut threads = Vec::new();
        // Two executors share the cell directly: a `Completer` is one per
        // cell (its drop fails whatever is left).
        for part in 0..2 {
            let cell = cell.clone();
            threads.push(shuttle::thread::spawn(move || {
                for i in (part..N).step_by(2) {
                    let first = cell.complete(i, result_of(i));
                    // Only block 0 has a rival completion.
                    assert!(first || i == 0, "block {i} completed twice");
                }
            }));
        }
        // A rival completion of block 0: whichever comes first stays.
        let rival = {
            let cell = cell.clone();
            shuttle::thread::spawn(move || cell.complete(0, Err(BlockFailure::Miss)))
        };
        let waiter_all = {
            let cell = cell.clone();
            shuttle::thread::spawn(move || {
                let all = shuttle::future::block_on(AllOf(cell.clone()));
                assert_eq!(all.len(), N);
                assert!(cell.is_done());
                assert_eq!(cell.done_count(), N);
                all
            })
        };
        let waiter_one = {
            let cell = cell.clone();
            shuttle::thread::spawn(move || shuttle::future::block_on(OneOf(cell, 3)))
        };
        for t in threads {
            t.join().expect("completer thread");
        }
        let rival_won = rival.join().expect("rival thread");
        let all = waiter_all.join().expect("waiter thread");
        let one = waiter_one.join().expect("waiter thread");
        assert_eq!(one, result_of(3));
        for (i, r) in all.iter().enumerate().skip(1) {
            assert_eq!(*r, result_of(i), "block {i}");
        }
        let expect0 = if rival_won {
            Err(BlockFailure::Miss)
        } else {
            result_of(0)
        };
        assert_eq!(all[0], expect0, "block 0 holds the first completion");
    }

    #[test]
    fn shuttle_completion_wakes_every_waiter_once_filled() {
        shuttle::check_random(scenario, 2000);
    }

    #[test]
    fn shuttle_pct_completion_wakes_every_waiter_once_filled() {
        shuttle::check_pct(scenario, 1000, 3);
    }

    /// A completer dropped before filling every slot fails the rest, so
    /// waiters never hang on a dead executor.
    fn abandoned_scenario() {
        let cell = Arc::new(CompletionCell::<ShuttleLock>::new(3));
        let completer = Completer::new(cell.clone());
        let t = shuttle::thread::spawn(move || {
            completer.complete(1, Ok(()));
            drop(completer);
        });
        let all = shuttle::future::block_on(AllOf(cell));
        t.join().expect("completer thread");
        assert_eq!(all[1], Ok(()));
        assert_eq!(all[0], Err(BlockFailure::Abandoned));
        assert_eq!(all[2], Err(BlockFailure::Abandoned));
    }

    #[test]
    fn shuttle_dropped_completer_fails_the_rest() {
        shuttle::check_random(abandoned_scenario, 1000);
    }
}
