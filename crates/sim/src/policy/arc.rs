//! Adaptive Replacement Cache (Megiddo and Modha, FAST'03).
//!
//! Two resident lists, T1 (seen once recently) and T2 (seen at least twice),
//! and two ghost lists of evicted ids, B1 and B2, each up to the capacity
//! `c`. A hit in a ghost list moves the target size `p` of T1 towards the
//! list that would have hit, so the cache adapts between recency and
//! frequency. `p` adapts by `max(|B2| / |B1|, 1)` (integer division) as in
//! the paper's pseudo-code. A block taken out by the replay (promotion to a
//! faster tier) leaves without a ghost.

use super::list::{Links, List, ensure};
use super::{Access, Policy};

const NONE: u8 = 0;
const T1: u8 = 1;
const T2: u8 = 2;
const B1: u8 = 3;
const B2: u8 = 4;

/// ARC over dense ids.
#[derive(Debug)]
pub(crate) struct Arc {
    c: usize,
    p: usize,
    links: Links,
    lists: [List; 5],
    place: Vec<u8>,
}

impl Arc {
    pub(crate) fn new(cap: u64) -> Self {
        Arc {
            c: cap as usize,
            p: 0,
            links: Links::default(),
            lists: [List::default(); 5],
            place: Vec::new(),
        }
    }

    fn len_of(&self, l: u8) -> usize {
        self.lists[l as usize].len()
    }

    fn move_to(&mut self, id: u32, to: u8) {
        let from = self.place[id as usize];
        if from != NONE {
            self.links.unlink(&mut self.lists[from as usize], id);
        }
        if to != NONE {
            self.links.push_front(&mut self.lists[to as usize], id);
        }
        self.place[id as usize] = to;
    }

    fn pop_lru(&mut self, l: u8) -> Option<u32> {
        let v = self.links.pop_back(&mut self.lists[l as usize])?;
        self.place[v as usize] = NONE;
        Some(v)
    }

    /// The paper's REPLACE: demote the LRU of T1 or T2 to its ghost list.
    fn replace(&mut self, in_b2: bool, evicted: &mut Vec<u32>) {
        let t1 = self.len_of(T1);
        let (from, to) = if t1 >= 1 && ((in_b2 && t1 == self.p) || t1 > self.p) {
            (T1, B1)
        } else {
            (T2, B2)
        };
        if let Some(v) = self.pop_lru(from) {
            self.move_to(v, to);
            evicted.push(v);
        } else if let Some(v) = self.pop_lru(if from == T1 { T2 } else { T1 }) {
            // Only reachable after promotions emptied the chosen list.
            self.move_to(v, if from == T1 { B2 } else { B1 });
            evicted.push(v);
        }
    }
}

impl Policy for Arc {
    fn hit(&mut self, a: &Access) {
        self.move_to(a.id, T2);
    }

    fn insert(&mut self, a: &Access, evicted: &mut Vec<u32>) {
        let x = a.id;
        ensure(&mut self.place, x, NONE);
        if self.c == 0 {
            evicted.push(x);
            return;
        }
        let c = self.c;
        match self.place[x as usize] {
            B1 => {
                let delta = (self.len_of(B2) / self.len_of(B1)).max(1);
                self.p = (self.p + delta).min(c);
                self.replace(false, evicted);
                self.move_to(x, T2);
            }
            B2 => {
                let delta = (self.len_of(B1) / self.len_of(B2)).max(1);
                self.p = self.p.saturating_sub(delta);
                self.replace(true, evicted);
                self.move_to(x, T2);
            }
            _ => {
                let l1 = self.len_of(T1) + self.len_of(B1);
                let total = l1 + self.len_of(T2) + self.len_of(B2);
                if l1 >= c {
                    if self.len_of(T1) < c {
                        self.pop_lru(B1);
                        self.replace(false, evicted);
                    } else if let Some(v) = self.pop_lru(T1) {
                        evicted.push(v);
                    }
                } else if total >= c {
                    if total >= 2 * c {
                        self.pop_lru(B2);
                    }
                    if self.len_of(T1) + self.len_of(T2) >= c {
                        self.replace(false, evicted);
                    }
                }
                self.move_to(x, T1);
            }
        }
    }

    fn remove(&mut self, id: u32) {
        self.move_to(id, NONE);
    }

    fn len(&self) -> usize {
        self.len_of(T1) + self.len_of(T2)
    }
}
