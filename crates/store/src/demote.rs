//! Write-behind from DRAM to disk.
//!
//! The memory tier never evicts a block that exists only in DRAM. The
//! demoter keeps `free_target` of DRAM slots free by taking the coldest
//! DRAM-only blocks ([`MemoryTier::demotion_candidates`](kvtier_mem::MemoryTier::demotion_candidates)),
//! writing them to disk in one batch, marking the ones the disk acknowledged
//! as persisted, and then letting DRAM evict persisted blocks. A failed
//! write leaves the block in DRAM (it was never acknowledged by the disk),
//! counted in `demotion_errors`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use kvtier_disk::{DiskError, DiskPut, DiskTier};
use kvtier_mem::{BlockRef, MemoryTier};
use parking_lot::Mutex;
use tokio::task::JoinHandle;

use crate::stats::StoreCounters;
use crate::store::Inner;

/// One write-behind round of at most `max` blocks; returns how many the disk
/// acknowledged.
pub(crate) async fn demote_round(inner: &Inner, max: usize) -> usize {
    let Some(disk) = inner.disk.as_ref() else {
        return 0;
    };
    let _one_round_at_a_time = inner.demote_lock.lock().await;
    let candidates = inner.memory.demotion_candidates(max);
    if candidates.is_empty() {
        return 0;
    }
    let results = persist(&inner.memory, disk, &candidates).await;
    let c = &inner.counters;
    StoreCounters::add(&c.demotion_batches, 1);
    let mut ok = 0;
    for (r, res) in candidates.iter().zip(results) {
        match res {
            Ok(()) => ok += 1,
            Err(e) => {
                StoreCounters::add(&c.demotion_errors, 1);
                tracing::warn!(key = %r.key(), error = %e, "write-behind failed; block stays in DRAM");
            }
        }
    }
    StoreCounters::add(&c.demotions, ok as u64);
    ok
}

/// Writes DRAM blocks to disk in one batch (one disk submission) with the
/// checksums they were stored with, and marks each block the disk
/// acknowledged as persisted, so DRAM may evict it. One result per block,
/// in order; a failed block stays DRAM-only. The write-behind above and
/// the block manager's host-to-disk transfers both move blocks down this
/// way.
pub async fn persist(
    memory: &MemoryTier,
    disk: &DiskTier,
    blocks: &[BlockRef],
) -> Vec<Result<(), DiskError>> {
    let puts: Vec<DiskPut<'_>> = blocks
        .iter()
        .map(|r| DiskPut {
            key: r.key(),
            data: r,
            sums: r.shared_sums(),
        })
        .collect();
    let results = disk.put_batch(&puts).await;
    for (r, res) in blocks.iter().zip(&results) {
        if res.is_ok() {
            // A copy now exists below: DRAM may evict it.
            memory.set_persisted(r.key(), true);
        }
    }
    results
}

/// The background task that keeps DRAM slots free.
pub(crate) struct Demoter {
    task: Mutex<Option<JoinHandle<()>>>,
    inner: Arc<Inner>,
}

impl Demoter {
    /// Starts the task on the current tokio runtime.
    pub(crate) fn start(inner: Arc<Inner>) -> Self {
        let task_inner = inner.clone();
        let task = tokio::spawn(async move { run(task_inner).await });
        Self {
            task: Mutex::new(Some(task)),
            inner,
        }
    }

    /// Stops the task and waits for its current round to finish.
    pub(crate) async fn stop(&self) {
        self.inner.demoter_stop.store(true, Ordering::Release);
        self.inner.wake_demoter.notify_one();
        let task = self.task.lock().take();
        if let Some(t) = task {
            let _ = t.await;
        }
    }
}

impl Drop for Demoter {
    fn drop(&mut self) {
        if let Some(t) = self.task.lock().take() {
            t.abort();
        }
    }
}

async fn run(inner: Arc<Inner>) {
    loop {
        inner.wake_demoter.notified().await;
        if inner.demoter_stop.load(Ordering::Acquire) {
            return;
        }
        let m = &inner.memory;
        let target =
            ((m.capacity_blocks() as f64 * inner.options.free_target).ceil() as usize).max(1);
        while m.free_blocks() < target && !inner.demoter_stop.load(Ordering::Acquire) {
            let need = target - m.free_blocks();
            let evicted = m.evict(need).len();
            if evicted >= need {
                break;
            }
            let written = demote_round(&inner, inner.options.demote_batch).await;
            if written == 0 && m.evict(need - evicted).is_empty() {
                // Nothing left to write or evict (all pinned or failing):
                // wait for the next wake-up rather than spin.
                break;
            }
        }
    }
}
