//! Leaf-aware LRU: evicts leaves of the prefix tree before their parents.
//!
//! A block's children are the blocks one position deeper under the same
//! prefix; the replay's prefix tree (parent pointers by id, see
//! `replay::engine`) hands each access its parent, and this policy counts,
//! per resident block, its resident children. A block with a resident child
//! is not a leaf and is skipped by eviction: evicting it would strand the
//! child, which can never be hit without its prefix.
//!
//! Recency is per request: after a request its blocks are moved to the head
//! from the last to the first, so a prompt's tail is older than its head.
//! Because a parent is used by every request that uses its child, a parent is
//! then always more recent than its resident children, the tail of the list
//! is nearly always a leaf, and the skip walk stays short.

use super::list::{Links, List, NIL, ensure};
use super::{Access, Policy};

/// Leaf-aware LRU over dense ids.
#[derive(Debug)]
pub(crate) struct LeafLru {
    cap: usize,
    links: Links,
    list: List,
    resident: Vec<bool>,
    parent: Vec<u32>,
    children: Vec<u32>,
    /// Bumped at each insertion of a block, so a child only uncounts itself
    /// from the incarnation of its parent that counted it.
    generation: Vec<u32>,
    /// `generation` of the parent when this block was counted as its child,
    /// or [`NIL`] when it was not counted (its parent was not resident).
    counted_in: Vec<u32>,
}

impl LeafLru {
    pub(crate) fn new(cap: u64) -> Self {
        LeafLru {
            cap: cap as usize,
            links: Links::default(),
            list: List::default(),
            resident: Vec::new(),
            parent: Vec::new(),
            children: Vec::new(),
            generation: Vec::new(),
            counted_in: Vec::new(),
        }
    }

    fn take_out(&mut self, id: u32) {
        self.links.unlink(&mut self.list, id);
        self.resident[id as usize] = false;
        let p = self.parent[id as usize];
        let counted = self.counted_in[id as usize];
        if p != NIL
            && counted != NIL
            && self.resident[p as usize]
            && self.generation[p as usize] == counted
        {
            self.children[p as usize] -= 1;
        }
    }

    /// The least recent block without resident children (the least recent
    /// block at all if every block has one, which a cycle-free tree rules out).
    fn victim(&self) -> u32 {
        let mut v = self.list.tail();
        while v != NIL && self.children[v as usize] > 0 {
            v = self.links.prev(v);
        }
        if v == NIL { self.list.tail() } else { v }
    }
}

impl Policy for LeafLru {
    fn hit(&mut self, a: &Access) {
        self.links.move_to_front(&mut self.list, a.id);
    }

    fn insert(&mut self, a: &Access, evicted: &mut Vec<u32>) {
        let i = a.id;
        ensure(&mut self.resident, i, false);
        ensure(&mut self.parent, i, NIL);
        ensure(&mut self.children, i, 0);
        ensure(&mut self.generation, i, 0);
        ensure(&mut self.counted_in, i, NIL);
        let u = i as usize;
        self.resident[u] = true;
        self.parent[u] = a.parent;
        // Children already resident (possible when a parent comes back after
        // them) are not counted: the count is a hint that keeps eviction
        // leaf-first in the common case, never a reason to refuse to evict.
        self.children[u] = 0;
        self.generation[u] = self.generation[u].wrapping_add(1) % NIL;
        self.counted_in[u] = NIL;
        let p = a.parent;
        if p != NIL && self.resident.get(p as usize).copied().unwrap_or(false) {
            self.children[p as usize] += 1;
            self.counted_in[u] = self.generation[p as usize];
        }
        self.links.push_front(&mut self.list, i);
        while self.list.len() > self.cap {
            let v = self.victim();
            self.take_out(v);
            evicted.push(v);
        }
    }

    fn remove(&mut self, id: u32) {
        self.take_out(id);
    }

    fn end_request(&mut self, ids: &[u32]) {
        for &id in ids.iter().rev() {
            if self.resident.get(id as usize).copied().unwrap_or(false) {
                self.links.move_to_front(&mut self.list, id);
            }
        }
    }

    fn len(&self) -> usize {
        self.list.len()
    }
}
