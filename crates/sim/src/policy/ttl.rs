//! Time to live: a block not used for longer than `ttl_ms` is dropped when
//! the trace's clock passes that point; while the cache is full, LRU.
//!
//! The recency list is also an idle-time list (the clock never goes back:
//! out-of-order timestamps are clamped to the latest seen), so expiry pops
//! from the tail until it meets a block young enough.

use super::list::{Links, List, ensure};
use super::{Access, Policy};

/// TTL over dense ids.
#[derive(Debug)]
pub(crate) struct Ttl {
    cap: usize,
    ttl_ms: u64,
    clock: u64,
    links: Links,
    list: List,
    last_use: Vec<u64>,
}

impl Ttl {
    pub(crate) fn new(cap: u64, ttl_ms: u64) -> Self {
        Ttl {
            cap: cap as usize,
            ttl_ms,
            clock: 0,
            links: Links::default(),
            list: List::default(),
            last_use: Vec::new(),
        }
    }

    fn stamp(&mut self, a: &Access) {
        self.clock = self.clock.max(a.now_ms);
        ensure(&mut self.last_use, a.id, 0);
        self.last_use[a.id as usize] = self.clock;
    }
}

impl Policy for Ttl {
    fn hit(&mut self, a: &Access) {
        self.stamp(a);
        self.links.move_to_front(&mut self.list, a.id);
    }

    fn insert(&mut self, a: &Access, evicted: &mut Vec<u32>) {
        self.stamp(a);
        self.links.push_front(&mut self.list, a.id);
        while self.list.len() > self.cap {
            if let Some(v) = self.links.pop_back(&mut self.list) {
                evicted.push(v);
            }
        }
    }

    fn remove(&mut self, id: u32) {
        self.links.unlink(&mut self.list, id);
    }

    fn expire(&mut self, now_ms: u64, dropped: &mut Vec<u32>) {
        self.clock = self.clock.max(now_ms);
        loop {
            let t = self.list.tail();
            if t == super::list::NIL || self.clock - self.last_use[t as usize] <= self.ttl_ms {
                break;
            }
            self.links.unlink(&mut self.list, t);
            dropped.push(t);
        }
    }

    fn len(&self) -> usize {
        self.list.len()
    }
}
