//! Buffered access statistics: reads record which keys they hit in memory
//! (one short lock and one push per request, no index write), and the
//! buffer is applied to the index in batches, aggregated per key, by
//! [`super::MetaService::flush_access`]: from the reclaimer before every
//! round, from inspection paths that show the statistics, and inline by
//! the read that pushes the buffer past its bound.
//!
//! Statistics are eviction hints: until a flush, the index shows older
//! values, and a crash loses the buffer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::model::BlockKey;

/// Shards of the buffer: readers on different threads rarely share one.
const SHARDS: usize = 16;

/// The hits of one request.
#[derive(Debug)]
struct Hits {
    instance: String,
    keys: Vec<BlockKey>,
    at_ms: u64,
}

/// Aggregated touches of one key: latest access and number of accesses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Touch {
    pub last_ms: u64,
    pub count: u32,
}

/// Touches per instance, per key.
pub(crate) type Touches = HashMap<String, HashMap<BlockKey, Touch>>;

/// The buffer.
#[derive(Debug)]
pub(crate) struct AccessBuffer {
    shards: Box<[Mutex<Vec<Hits>>]>,
    next_shard: AtomicUsize,
    pending_keys: AtomicUsize,
    flush_at: usize,
    /// Held by a flush for its whole run, so a caller that flushes to see
    /// the statistics (inspection, the reclaimer) waits for a flush already
    /// applying what it drained instead of returning before it landed.
    pub(crate) flushing: Mutex<()>,
    /// Whether a background flush is scheduled or running.
    flush_scheduled: AtomicBool,
}

impl AccessBuffer {
    /// A buffer that asks for a flush once `flush_at` keys are pending.
    pub(crate) fn new(flush_at: usize) -> Self {
        AccessBuffer {
            shards: (0..SHARDS).map(|_| Mutex::new(Vec::new())).collect(),
            next_shard: AtomicUsize::new(0),
            pending_keys: AtomicUsize::new(0),
            flush_at: flush_at.max(1),
            flushing: Mutex::new(()),
            flush_scheduled: AtomicBool::new(false),
        }
    }

    /// Records that a read of `instance` hit `keys` at `at_ms`; returns
    /// whether the buffer is past its bound and should be flushed now.
    pub(crate) fn record(&self, instance: &str, keys: Vec<BlockKey>, at_ms: u64) -> bool {
        if keys.is_empty() {
            return false;
        }
        let n = keys.len();
        let shard = self.next_shard.fetch_add(1, Ordering::Relaxed) % SHARDS;
        self.shards[shard].lock().push(Hits {
            instance: instance.to_owned(),
            keys,
            at_ms,
        });
        self.pending_keys.fetch_add(n, Ordering::Relaxed) + n >= self.flush_at
    }

    /// Takes everything buffered, aggregated per instance and key.
    pub(crate) fn drain(&self) -> Touches {
        let mut out: Touches = HashMap::new();
        for shard in self.shards.iter() {
            let hits = std::mem::take(&mut *shard.lock());
            for h in hits {
                self.pending_keys.fetch_sub(h.keys.len(), Ordering::Relaxed);
                let per_key = out.entry(h.instance).or_default();
                for k in h.keys {
                    let t = per_key.entry(k).or_insert(Touch {
                        last_ms: 0,
                        count: 0,
                    });
                    t.last_ms = t.last_ms.max(h.at_ms);
                    t.count = t.count.saturating_add(1);
                }
            }
        }
        out
    }

    /// Claims the one background flush; false when one is already
    /// scheduled or running.
    pub(crate) fn try_schedule_flush(&self) -> bool {
        self.flush_scheduled
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Releases the claim of [`AccessBuffer::try_schedule_flush`].
    pub(crate) fn flush_finished(&self) {
        self.flush_scheduled.store(false, Ordering::Release);
    }

    /// The bound past which `record` asks for a flush.
    pub(crate) fn flush_at(&self) -> usize {
        self.flush_at
    }

    /// Keys recorded and not yet drained.
    pub(crate) fn pending(&self) -> usize {
        self.pending_keys.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregates_per_key() {
        let b = AccessBuffer::new(5);
        assert!(!b.record("a", vec![BlockKey(1), BlockKey(2)], 10));
        assert!(!b.record("a", vec![BlockKey(1)], 30));
        assert!(!b.record("b", vec![BlockKey(1)], 20));
        assert!(b.record("a", vec![BlockKey(1)], 5));
        assert_eq!(b.pending(), 5);
        let t = b.drain();
        assert_eq!(b.pending(), 0);
        assert_eq!(
            t["a"][&BlockKey(1)],
            Touch {
                last_ms: 30,
                count: 3
            }
        );
        assert_eq!(
            t["a"][&BlockKey(2)],
            Touch {
                last_ms: 10,
                count: 1
            }
        );
        assert_eq!(t["b"].len(), 1);
        assert!(b.drain().is_empty());
    }
}
