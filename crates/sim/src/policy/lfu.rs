//! Least frequently used, ties broken by recency (the least recent of the
//! least used goes first).
//!
//! O(1) per access: one recency list per use count, and the smallest count
//! with a non-empty list. A block's count starts at 1 on insertion and is
//! forgotten on eviction (no history of evicted blocks).

use hashbrown::HashMap;

use super::list::{Links, List, ensure};
use super::{Access, Policy};

/// LFU over dense ids.
#[derive(Debug)]
pub(crate) struct Lfu {
    cap: usize,
    len: usize,
    links: Links,
    freq: Vec<u32>,
    buckets: HashMap<u32, List>,
    min_freq: u32,
}

impl Lfu {
    pub(crate) fn new(cap: u64) -> Self {
        Lfu {
            cap: cap as usize,
            len: 0,
            links: Links::default(),
            freq: Vec::new(),
            buckets: HashMap::new(),
            min_freq: 1,
        }
    }

    fn take_out(&mut self, id: u32) {
        let f = self.freq[id as usize];
        if let Some(list) = self.buckets.get_mut(&f) {
            self.links.unlink(list, id);
            if list.len() == 0 {
                self.buckets.remove(&f);
            }
        }
        self.len -= 1;
    }

    fn recompute_min(&mut self) {
        self.min_freq = self.buckets.keys().copied().min().unwrap_or(1);
    }
}

impl Policy for Lfu {
    fn hit(&mut self, a: &Access) {
        let id = a.id;
        let f = self.freq[id as usize];
        self.take_out(id);
        self.len += 1;
        let nf = f.saturating_add(1);
        self.freq[id as usize] = nf;
        let list = self.buckets.entry(nf).or_default();
        self.links.push_front(list, id);
        if f == self.min_freq && !self.buckets.contains_key(&f) {
            self.min_freq = nf;
        }
    }

    fn insert(&mut self, a: &Access, evicted: &mut Vec<u32>) {
        if self.cap == 0 {
            evicted.push(a.id);
            return;
        }
        // Make room first: a new block (count 1) would otherwise often be
        // its own victim, and never get the chance to be used again.
        while self.len >= self.cap {
            let victim = self.buckets.get(&self.min_freq).map(|l| l.tail());
            match victim {
                Some(v) => {
                    self.take_out(v);
                    evicted.push(v);
                    if !self.buckets.contains_key(&self.min_freq) {
                        self.recompute_min();
                    }
                }
                None => self.recompute_min(),
            }
        }
        ensure(&mut self.freq, a.id, 0);
        self.freq[a.id as usize] = 1;
        let list = self.buckets.entry(1).or_default();
        self.links.push_front(list, a.id);
        self.len += 1;
        self.min_freq = 1;
    }

    fn remove(&mut self, id: u32) {
        self.take_out(id);
        if !self.buckets.contains_key(&self.min_freq) {
            self.recompute_min();
        }
    }

    fn len(&self) -> usize {
        self.len
    }
}
