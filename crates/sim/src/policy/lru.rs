//! Least recently used: one recency list; a hit moves the block to the
//! head, an insertion evicts from the tail.

use super::list::{Links, List};
use super::{Access, Policy};

/// LRU over dense ids.
#[derive(Debug)]
pub(crate) struct Lru {
    cap: usize,
    links: Links,
    list: List,
}

impl Lru {
    pub(crate) fn new(cap: u64) -> Self {
        Lru {
            cap: cap as usize,
            links: Links::default(),
            list: List::default(),
        }
    }
}

impl Policy for Lru {
    fn hit(&mut self, a: &Access) {
        self.links.move_to_front(&mut self.list, a.id);
    }

    fn insert(&mut self, a: &Access, evicted: &mut Vec<u32>) {
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

    fn len(&self) -> usize {
        self.list.len()
    }
}
