//! Doubly linked lists of keys over one slab: the building block of every
//! list-shaped policy (LRU's recency list, ARC's four lists, S3-FIFO's three
//! queues, LFU's frequency buckets).
//!
//! A key lives in at most one list of a [`Lists`] at a time. Nodes sit in a
//! vector addressed by `u32` slots (freed slots are reused), so pushing,
//! moving and removing are a few stores after one `key -> slot` lookup, and
//! nothing is allocated per operation once the slab has grown. Each node
//! carries one `u64` a policy may use (a use count, a time).

use crate::Verdict;
use crate::key::{NIL, PolicyKey, SlotIndex};

#[derive(Debug, Clone, Copy)]
struct Node<K> {
    key: K,
    older: u32,
    newer: u32,
    list: u32,
    value: u64,
}

/// A victim scan ended by the tier ([`Verdict::Stop`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stopped;

/// One list's ends and length.
#[derive(Debug, Clone, Copy)]
struct Head {
    oldest: u32,
    newest: u32,
    len: usize,
}

const EMPTY: Head = Head {
    oldest: NIL,
    newest: NIL,
    len: 0,
};

/// Lists of keys, oldest to newest, sharing one slab.
#[derive(Debug)]
pub(crate) struct Lists<K: PolicyKey> {
    index: K::Index,
    nodes: Vec<Node<K>>,
    free: Vec<u32>,
    heads: Vec<Head>,
    free_heads: Vec<u32>,
}

impl<K: PolicyKey> Lists<K> {
    /// `n` empty lists, numbered `0..n`.
    pub(crate) fn new(n: usize) -> Self {
        Self {
            index: K::Index::default(),
            nodes: Vec::new(),
            free: Vec::new(),
            heads: vec![EMPTY; n],
            free_heads: Vec::new(),
        }
    }

    /// A new empty list (reusing a dropped one's number).
    pub(crate) fn add_list(&mut self) -> u32 {
        match self.free_heads.pop() {
            Some(l) => l,
            None => {
                self.heads.push(EMPTY);
                (self.heads.len() - 1) as u32
            }
        }
    }

    /// Gives an empty list's number back for [`add_list`](Self::add_list).
    pub(crate) fn drop_list(&mut self, list: u32) {
        debug_assert_eq!(self.heads[list as usize].len, 0);
        self.free_heads.push(list);
    }

    /// The slot of `key`, if it is in a list.
    #[inline]
    pub(crate) fn slot(&self, key: K) -> Option<u32> {
        self.index.get(key)
    }

    /// The list holding `key`.
    #[inline]
    pub(crate) fn list_of(&self, key: K) -> Option<u32> {
        self.slot(key).map(|s| self.nodes[s as usize].list)
    }

    /// The key in `slot`.
    #[inline]
    pub(crate) fn key(&self, slot: u32) -> K {
        self.nodes[slot as usize].key
    }

    /// The list of `slot`.
    #[inline]
    pub(crate) fn list_at(&self, slot: u32) -> u32 {
        self.nodes[slot as usize].list
    }

    /// The policy's value of `slot`.
    #[inline]
    pub(crate) fn value(&self, slot: u32) -> u64 {
        self.nodes[slot as usize].value
    }

    /// Sets the policy's value of `slot`.
    #[inline]
    pub(crate) fn set_value(&mut self, slot: u32, value: u64) {
        self.nodes[slot as usize].value = value;
    }

    /// Keys in `list`.
    #[inline]
    pub(crate) fn len(&self, list: u32) -> usize {
        self.heads[list as usize].len
    }

    /// The oldest slot of `list`.
    #[inline]
    pub(crate) fn oldest(&self, list: u32) -> Option<u32> {
        Some(self.heads[list as usize].oldest).filter(|s| *s != NIL)
    }

    /// The next newer slot in the same list.
    #[inline]
    pub(crate) fn newer(&self, slot: u32) -> Option<u32> {
        Some(self.nodes[slot as usize].newer).filter(|s| *s != NIL)
    }

    /// Adds `key` as the newest of `list` with `value`, or moves it there
    /// (keeping nothing of its old place but the slot) if present.
    pub(crate) fn push_newest(&mut self, key: K, list: u32, value: u64) -> u32 {
        let slot = match self.slot(key) {
            Some(s) => {
                self.unlink(s);
                s
            }
            None => self.alloc(key),
        };
        self.nodes[slot as usize].value = value;
        self.link_newest(slot, list);
        slot
    }

    /// Moves a present `slot` to the newest end of `list`.
    #[inline]
    pub(crate) fn move_newest(&mut self, slot: u32, list: u32) {
        self.unlink(slot);
        self.link_newest(slot, list);
    }

    /// Takes `key` out; its list and value, if it was present.
    pub(crate) fn remove(&mut self, key: K) -> Option<(u32, u64)> {
        let slot = self.slot(key)?;
        Some(self.remove_slot(slot))
    }

    /// Takes `slot` out; its list and value.
    pub(crate) fn remove_slot(&mut self, slot: u32) -> (u32, u64) {
        self.unlink(slot);
        let n = self.nodes[slot as usize];
        self.index.clear(n.key);
        self.free.push(slot);
        (n.list, n.value)
    }

    /// Takes the oldest key of `list` out.
    pub(crate) fn pop_oldest(&mut self, list: u32) -> Option<K> {
        let slot = self.oldest(list)?;
        let key = self.key(slot);
        self.remove_slot(slot);
        Some(key)
    }

    /// The oldest slot of `list` that `eligible` accepts, walking from the
    /// oldest end; `Ok(None)` when none does, `Err(Stopped)` when
    /// `eligible` ended the walk.
    pub(crate) fn find_oldest(
        &self,
        list: u32,
        eligible: &mut dyn FnMut(K) -> Verdict,
    ) -> Result<Option<u32>, Stopped> {
        let mut s = self.oldest(list);
        while let Some(slot) = s {
            match eligible(self.key(slot)) {
                Verdict::Evict => return Ok(Some(slot)),
                Verdict::Skip => s = self.newer(slot),
                Verdict::Stop => return Err(Stopped),
            }
        }
        Ok(None)
    }

    /// Visits `list`'s keys oldest first until `visit` stops; whether it
    /// stopped.
    pub(crate) fn visit_oldest(&self, list: u32, visit: &mut dyn FnMut(K) -> Verdict) -> bool {
        self.iter_oldest(list)
            .any(|(_, k)| visit(k) == Verdict::Stop)
    }

    /// Takes out and returns the oldest key of `list` that `eligible`
    /// accepts (`None` when none does or it stopped the walk).
    pub(crate) fn take_oldest(
        &mut self,
        list: u32,
        eligible: &mut dyn FnMut(K) -> Verdict,
    ) -> Option<K> {
        let slot = self.find_oldest(list, eligible).ok()??;
        let key = self.key(slot);
        self.remove_slot(slot);
        Some(key)
    }

    /// Keys of `list`, oldest first.
    pub(crate) fn iter_oldest(&self, list: u32) -> impl Iterator<Item = (u32, K)> + '_ {
        std::iter::successors(self.oldest(list), |s| self.newer(*s)).map(|s| (s, self.key(s)))
    }

    fn alloc(&mut self, key: K) -> u32 {
        let node = Node {
            key,
            older: NIL,
            newer: NIL,
            list: NIL,
            value: 0,
        };
        let slot = match self.free.pop() {
            Some(s) => {
                self.nodes[s as usize] = node;
                s
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        self.index.set(key, slot);
        slot
    }

    fn link_newest(&mut self, slot: u32, list: u32) {
        let head = &mut self.heads[list as usize];
        let old_newest = head.newest;
        head.newest = slot;
        if old_newest == NIL {
            head.oldest = slot;
        }
        head.len += 1;
        if old_newest != NIL {
            self.nodes[old_newest as usize].newer = slot;
        }
        let n = &mut self.nodes[slot as usize];
        n.older = old_newest;
        n.newer = NIL;
        n.list = list;
    }

    fn unlink(&mut self, slot: u32) {
        let Node {
            older, newer, list, ..
        } = self.nodes[slot as usize];
        if list == NIL {
            return;
        }
        if older != NIL {
            self.nodes[older as usize].newer = newer;
        }
        if newer != NIL {
            self.nodes[newer as usize].older = older;
        }
        let head = &mut self.heads[list as usize];
        if head.oldest == slot {
            head.oldest = newer;
        }
        if head.newest == slot {
            head.newest = older;
        }
        head.len -= 1;
        self.nodes[slot as usize].list = NIL;
    }
}
