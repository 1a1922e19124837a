//! Belady's MIN: evict the block whose next use is farthest in the future.
//!
//! The replay computes, for every block access, the position of the next
//! access to the same block (`u64::MAX` for never) from the whole trace, and
//! hands it in [`Use::next_use`]. A max-heap of `(next_use, id)` picks the
//! victim; entries made stale by a later use are skipped when popped and the
//! heap is rebuilt when stale entries outnumber live ones. Candidates the
//! tier may not evict now are put back after the pick.
//!
//! The replay makes room before a request's blocks come in, so a block never
//! used again still enters (no bypass); with the node's leaf-first filter
//! on, a parent with a resident child waits for it. Both make this the bound
//! for the node's way of caching rather than the unconstrained optimum.

use std::collections::BinaryHeap;

use kvtier_policy::{EvictionPolicy, PolicyKind, Use, Verdict};

/// Belady's MIN over dense ids.
#[derive(Debug, Default)]
pub(crate) struct Belady {
    len: usize,
    resident: Vec<bool>,
    next_use: Vec<u64>,
    heap: BinaryHeap<(u64, u32)>,
}

impl Belady {
    fn set(&mut self, id: u32, next_use: u64) {
        self.next_use[id as usize] = next_use;
        self.heap.push((next_use, id));
        if self.heap.len() > 2 * self.len + 1024 {
            let (resident, next) = (&self.resident, &self.next_use);
            self.heap
                .retain(|&(n, id)| resident[id as usize] && next[id as usize] == n);
        }
    }

    fn live(&self, n: u64, id: u32) -> bool {
        self.resident[id as usize] && self.next_use[id as usize] == n
    }
}

impl EvictionPolicy<u32> for Belady {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Belady
    }

    fn insert(&mut self, id: u32, u: &Use) {
        let i = id as usize;
        if self.resident.len() <= i {
            self.resident.resize(i + 1, false);
            self.next_use.resize(i + 1, 0);
        }
        self.resident[i] = true;
        self.len += 1;
        self.set(id, u.next_use);
    }

    fn access(&mut self, id: u32, u: &Use) {
        if self.contains(id) {
            self.set(id, u.next_use);
        }
    }

    fn remove(&mut self, id: u32) {
        if self.contains(id) {
            self.resident[id as usize] = false;
            self.len -= 1;
        }
    }

    fn victim(&mut self, _now: u64, eligible: &mut dyn FnMut(u32) -> Verdict) -> Option<u32> {
        let mut skipped = Vec::new();
        let mut found = None;
        while let Some((n, id)) = self.heap.pop() {
            if !self.live(n, id) {
                continue;
            }
            match eligible(id) {
                Verdict::Evict => {
                    found = Some(id);
                    break;
                }
                Verdict::Skip => skipped.push((n, id)),
                Verdict::Stop => {
                    skipped.push((n, id));
                    break;
                }
            }
        }
        self.heap.extend(skipped);
        let id = found?;
        self.resident[id as usize] = false;
        self.len -= 1;
        Some(id)
    }

    /// Farthest next use first (a sort: the replay never asks).
    fn coldest(&self, visit: &mut dyn FnMut(u32) -> Verdict) {
        let mut live: Vec<(u64, u32)> = (0..self.resident.len() as u32)
            .filter(|id| self.resident[*id as usize])
            .map(|id| (self.next_use[id as usize], id))
            .collect();
        live.sort_unstable_by(|a, b| b.cmp(a));
        let _ = live.iter().any(|(_, id)| visit(*id) == Verdict::Stop);
    }

    fn contains(&self, id: u32) -> bool {
        self.resident.get(id as usize).copied().unwrap_or(false)
    }

    fn len(&self) -> usize {
        self.len
    }
}
