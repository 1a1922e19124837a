//! Time to live: LRU order, and blocks idle for `ttl_ms` or longer are
//! reported [`expired`](EvictionPolicy::expired) so the placement planner
//! can drop them before the tier fills up.

use std::collections::HashMap;

use kvtier_core::BlockHash;

use super::order::OrderedKeys;
use super::{EvictionPolicy, InsertInfo, PolicyKind};

/// LRU with an idle-time limit.
#[derive(Debug)]
pub struct Ttl {
    ttl_ms: u64,
    recency: OrderedKeys,
    last_use: HashMap<BlockHash, u64>,
}

impl Ttl {
    /// A policy that expires blocks idle for `ttl_ms` milliseconds.
    pub fn new(ttl_ms: u64) -> Self {
        Self {
            ttl_ms,
            recency: OrderedKeys::default(),
            last_use: HashMap::new(),
        }
    }
}

impl EvictionPolicy for Ttl {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Ttl
    }

    fn insert(&mut self, key: BlockHash, info: InsertInfo) {
        self.recency.push_newest(key);
        self.last_use.insert(key, info.now);
    }

    fn access(&mut self, key: BlockHash, now: u64) {
        if let Some(t) = self.last_use.get_mut(&key) {
            // The pool's clock is monotonic; `max` keeps the recency order
            // and the idle times consistent even if a caller's is not.
            *t = (*t).max(now);
            self.recency.push_newest(key);
        }
    }

    fn remove(&mut self, key: BlockHash) {
        self.recency.remove(key);
        self.last_use.remove(&key);
    }

    fn victim(
        &mut self,
        _now: u64,
        eligible: &mut dyn FnMut(BlockHash) -> bool,
    ) -> Option<BlockHash> {
        let key = self.recency.take_oldest_where(eligible)?;
        self.last_use.remove(&key);
        Some(key)
    }

    fn expired(&self, now: u64) -> Vec<BlockHash> {
        self.recency
            .iter_oldest()
            .take_while(|k| {
                self.last_use
                    .get(k)
                    .is_some_and(|t| now.saturating_sub(*t) >= self.ttl_ms)
            })
            .collect()
    }

    fn len(&self) -> usize {
        self.recency.len()
    }
}
