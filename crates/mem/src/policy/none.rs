//! [`NoEviction`]: an order that never offers a victim.

use std::ops::ControlFlow;

use super::EvictionPolicy;

/// A policy for an arena whose blocks are removed only by its owner (the
/// node's block manager, whose G2 pool is the tier's one eviction
/// authority): `put` and `reserve` on a full tier answer `Full` instead of
/// evicting. Tracks which slots are resident so `len` stays exact.
#[derive(Debug, Clone)]
pub struct NoEviction {
    resident: Vec<bool>,
    len: usize,
}

impl NoEviction {
    /// An empty order over `capacity` slots.
    pub fn new(capacity: usize) -> Self {
        Self {
            resident: vec![false; capacity],
            len: 0,
        }
    }

    fn set(&mut self, slot: usize, resident: bool) {
        if let Some(r) = self.resident.get_mut(slot)
            && *r != resident
        {
            *r = resident;
            if resident {
                self.len += 1;
            } else {
                self.len -= 1;
            }
        }
    }
}

impl EvictionPolicy for NoEviction {
    fn name(&self) -> &'static str {
        "none"
    }

    fn insert(&mut self, slot: usize) {
        self.set(slot, true);
    }

    fn touch(&mut self, _slot: usize) {}

    fn remove(&mut self, slot: usize) {
        self.set(slot, false);
    }

    fn len(&self) -> usize {
        self.len
    }

    /// Visits nothing: no slot is ever a candidate.
    fn scan_coldest(&self, _visit: &mut dyn FnMut(usize) -> ControlFlow<()>) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_residents_and_never_offers_a_victim() {
        let mut p = NoEviction::new(4);
        p.insert(1);
        p.insert(1);
        p.insert(3);
        p.remove(0);
        p.insert(9);
        assert_eq!(p.len(), 2);
        assert_eq!(p.victim(usize::MAX, &mut |_| true), None);
        p.remove(1);
        assert_eq!(p.len(), 1);
    }
}
