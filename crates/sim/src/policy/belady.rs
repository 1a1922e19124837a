//! Belady's MIN: evict the block whose next use is farthest in the future.
//!
//! The replay computes, for every block access, the position of the next
//! access to the same block (`u64::MAX` for never) from the whole trace, and
//! hands it in [`Access::next_use`]. A max-heap of `(next_use, id)` picks
//! the victim; entries made stale by a later access are skipped when popped
//! and the heap is rebuilt when stale entries outnumber live ones.
//!
//! The newly inserted block competes too, so a block never used again is
//! dropped at once (MIN with bypass): this is the upper bound the other
//! policies are measured against. A parent is used before its child in every
//! request that uses the child, so its next use is always nearer: MIN keeps
//! prefixes whole and its per-block hits are leading-run hits.

use std::collections::BinaryHeap;

use super::list::ensure;
use super::{Access, Policy};

/// Belady's MIN over dense ids.
#[derive(Debug)]
pub(crate) struct Belady {
    cap: usize,
    len: usize,
    resident: Vec<bool>,
    next_use: Vec<u64>,
    heap: BinaryHeap<(u64, u32)>,
}

impl Belady {
    pub(crate) fn new(cap: u64) -> Self {
        Belady {
            cap: cap as usize,
            len: 0,
            resident: Vec::new(),
            next_use: Vec::new(),
            heap: BinaryHeap::new(),
        }
    }

    fn set(&mut self, a: &Access) {
        self.next_use[a.id as usize] = a.next_use;
        self.heap.push((a.next_use, a.id));
        if self.heap.len() > 2 * self.len + 1024 {
            let (resident, next_use) = (&self.resident, &self.next_use);
            self.heap
                .retain(|&(n, id)| resident[id as usize] && next_use[id as usize] == n);
        }
    }
}

impl Policy for Belady {
    fn hit(&mut self, a: &Access) {
        self.set(a);
    }

    fn insert(&mut self, a: &Access, evicted: &mut Vec<u32>) {
        ensure(&mut self.resident, a.id, false);
        ensure(&mut self.next_use, a.id, 0);
        self.resident[a.id as usize] = true;
        self.len += 1;
        self.set(a);
        while self.len > self.cap {
            let Some((n, id)) = self.heap.pop() else {
                break;
            };
            if self.resident[id as usize] && self.next_use[id as usize] == n {
                self.resident[id as usize] = false;
                self.len -= 1;
                evicted.push(id);
            }
        }
    }

    fn remove(&mut self, id: u32) {
        if self.resident[id as usize] {
            self.resident[id as usize] = false;
            self.len -= 1;
        }
    }

    fn len(&self) -> usize {
        self.len
    }
}
