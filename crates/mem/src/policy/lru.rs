//! [`Lru`]: least recently used, as an intrusive doubly-linked list over slot
//! indices.

use std::ops::ControlFlow;

use super::EvictionPolicy;

/// "No slot": the end of the list, or a slot that is not linked.
const NIL: u32 = u32::MAX;

/// One slot's links. `linked` tells a resident slot at the list's end (whose
/// neighbour is `NIL`) from a slot not in the list.
#[derive(Debug, Clone, Copy)]
struct Node {
    prev: u32,
    next: u32,
    linked: bool,
}

/// Least-recently-used order. The list runs from `head` (coldest) to `tail`
/// (hottest); the nodes live in a vector indexed by slot, so insert, touch
/// and remove are O(1) with no allocation after construction.
#[derive(Debug, Clone)]
pub struct Lru {
    nodes: Vec<Node>,
    head: u32,
    tail: u32,
    len: usize,
}

impl Lru {
    /// An empty order for slots `0..capacity` (`capacity` < 2^32).
    pub fn new(capacity: usize) -> Self {
        Self {
            nodes: vec![
                Node {
                    prev: NIL,
                    next: NIL,
                    linked: false,
                };
                capacity
            ],
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    fn is_linked(&self, slot: usize) -> bool {
        self.nodes.get(slot).is_some_and(|n| n.linked)
    }

    fn unlink(&mut self, slot: usize) {
        let Node { prev, next, .. } = self.nodes[slot];
        match prev {
            NIL => self.head = next,
            p => self.nodes[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.nodes[n as usize].prev = prev,
        }
        self.nodes[slot] = Node {
            prev: NIL,
            next: NIL,
            linked: false,
        };
        self.len -= 1;
    }

    fn push_hottest(&mut self, slot: usize) {
        let s = slot as u32;
        self.nodes[slot] = Node {
            prev: self.tail,
            next: NIL,
            linked: true,
        };
        match self.tail {
            NIL => self.head = s,
            t => self.nodes[t as usize].next = s,
        }
        self.tail = s;
        self.len += 1;
    }
}

impl EvictionPolicy for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn insert(&mut self, slot: usize) {
        if slot >= self.nodes.len() {
            return;
        }
        if self.is_linked(slot) {
            self.unlink(slot);
        }
        self.push_hottest(slot);
    }

    fn touch(&mut self, slot: usize) {
        if self.is_linked(slot) && self.tail != slot as u32 {
            self.unlink(slot);
            self.push_hottest(slot);
        }
    }

    fn remove(&mut self, slot: usize) {
        if self.is_linked(slot) {
            self.unlink(slot);
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn scan_coldest(&self, visit: &mut dyn FnMut(usize) -> ControlFlow<()>) {
        let mut at = self.head;
        while at != NIL {
            let next = self.nodes[at as usize].next;
            if visit(at as usize).is_break() {
                return;
            }
            at = next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn order(l: &Lru) -> Vec<usize> {
        let mut v = Vec::new();
        l.scan_coldest(&mut |s| {
            v.push(s);
            ControlFlow::Continue(())
        });
        v
    }

    proptest! {
        /// The list agrees with a vector kept in recency order.
        #[test]
        fn matches_a_vector_model(ops in proptest::collection::vec((0u8..3, 0usize..12), 0..200)) {
            let mut lru = Lru::new(10);
            let mut model: Vec<usize> = Vec::new();
            for (op, slot) in ops {
                match op {
                    0 => {
                        lru.insert(slot);
                        if slot < 10 {
                            model.retain(|&s| s != slot);
                            model.push(slot);
                        }
                    }
                    1 => {
                        lru.touch(slot);
                        if let Some(i) = model.iter().position(|&s| s == slot) {
                            model.remove(i);
                            model.push(slot);
                        }
                    }
                    _ => {
                        lru.remove(slot);
                        model.retain(|&s| s != slot);
                    }
                }
                prop_assert_eq!(order(&lru), model.clone());
                prop_assert_eq!(lru.len(), model.len());
            }
        }
    }

    #[test]
    fn victim_skips_ineligible_and_honours_the_bound() {
        let mut lru = Lru::new(8);
        for s in [3, 1, 4, 5] {
            lru.insert(s);
        }
        lru.touch(3); // order: 1 4 5 3
        assert_eq!(lru.victim(8, &mut |_| true), Some(1));
        assert_eq!(lru.victim(8, &mut |s| s != 1 && s != 4), Some(5));
        assert_eq!(lru.victim(2, &mut |s| s == 5), None);
        assert_eq!(lru.victim(8, &mut |_| false), None);
    }
}
