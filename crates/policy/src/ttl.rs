//! Time to live: LRU order, and keys idle for `ttl_ms` or longer are
//! reported [`expired`](EvictionPolicy::expired) so the tier can drop them
//! before it fills up. A node's value is its last use.

use crate::lists::Lists;
use crate::{EvictionPolicy, PolicyKey, PolicyKind, Use, Verdict};

const RECENCY: u32 = 0;

/// LRU with an idle-time limit.
#[derive(Debug)]
pub struct Ttl<K: PolicyKey> {
    ttl_ms: u64,
    lists: Lists<K>,
}

impl<K: PolicyKey> Ttl<K> {
    /// A policy that expires keys idle for `ttl_ms` milliseconds.
    pub fn new(ttl_ms: u64) -> Self {
        Self {
            ttl_ms,
            lists: Lists::new(1),
        }
    }
}

impl<K: PolicyKey> EvictionPolicy<K> for Ttl<K> {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Ttl
    }

    fn insert(&mut self, key: K, u: &Use) {
        self.lists.push_newest(key, RECENCY, u.now);
    }

    fn access(&mut self, key: K, u: &Use) {
        if let Some(s) = self.lists.slot(key) {
            // `max` keeps the recency order and the idle times consistent
            // even if a caller's clock is not monotonic.
            let last = self.lists.value(s).max(u.now);
            self.lists.set_value(s, last);
            self.lists.move_newest(s, RECENCY);
        }
    }

    fn remove(&mut self, key: K) {
        self.lists.remove(key);
    }

    fn victim(&mut self, _now: u64, eligible: &mut dyn FnMut(K) -> Verdict) -> Option<K> {
        self.lists.take_oldest(RECENCY, eligible)
    }

    fn expired(&self, now: u64, visit: &mut dyn FnMut(K)) {
        for (s, k) in self.lists.iter_oldest(RECENCY) {
            if now.saturating_sub(self.lists.value(s)) < self.ttl_ms {
                break;
            }
            visit(k);
        }
    }

    fn coldest(&self, visit: &mut dyn FnMut(K) -> Verdict) {
        self.lists.visit_oldest(RECENCY, visit);
    }

    fn contains(&self, key: K) -> bool {
        self.lists.slot(key).is_some()
    }

    fn len(&self) -> usize {
        self.lists.len(RECENCY)
    }
}
