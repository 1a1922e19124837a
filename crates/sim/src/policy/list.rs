//! Intrusive doubly linked lists over dense block ids.
//!
//! The replay interns every block to a dense `u32`, so a policy's lists can
//! keep their links in two flat vectors indexed by id instead of allocating
//! nodes: moving a block to the front is four stores, and nothing is
//! allocated per access once the vectors have grown to the trace's size. A
//! block is in at most one list of a [`Links`] at a time; several [`List`]
//! heads (ARC's four, S3-FIFO's three) can share one [`Links`].

/// No block: the end of a list.
pub(crate) const NIL: u32 = u32::MAX;

/// The links of every block: `prev` and `next` by id.
#[derive(Debug, Default, Clone)]
pub(crate) struct Links {
    prev: Vec<u32>,
    next: Vec<u32>,
}

/// One list's head (most recent end), tail (oldest end) and length.
#[derive(Debug, Clone, Copy)]
pub(crate) struct List {
    head: u32,
    tail: u32,
    len: usize,
}

impl Default for List {
    fn default() -> Self {
        List {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
}

impl Links {
    /// Makes room for ids up to `id`.
    #[inline]
    pub(crate) fn grow(&mut self, id: u32) {
        let need = id as usize + 1;
        if self.prev.len() < need {
            let n = need.max(self.prev.len() * 2).max(1024);
            self.prev.resize(n, NIL);
            self.next.resize(n, NIL);
        }
    }

    /// Puts `id` (in no list) at the head of `list`.
    #[inline]
    pub(crate) fn push_front(&mut self, list: &mut List, id: u32) {
        self.grow(id);
        let i = id as usize;
        self.prev[i] = NIL;
        self.next[i] = list.head;
        if list.head == NIL {
            list.tail = id;
        } else {
            self.prev[list.head as usize] = id;
        }
        list.head = id;
        list.len += 1;
    }

    /// Takes `id` out of `list`, which must hold it.
    #[inline]
    pub(crate) fn unlink(&mut self, list: &mut List, id: u32) {
        let i = id as usize;
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            list.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            list.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[i] = NIL;
        self.next[i] = NIL;
        list.len -= 1;
    }

    /// Moves `id`, in `list`, to its head.
    #[inline]
    pub(crate) fn move_to_front(&mut self, list: &mut List, id: u32) {
        if list.head != id {
            self.unlink(list, id);
            self.push_front(list, id);
        }
    }

    /// Takes the tail (oldest) of `list` out.
    #[inline]
    pub(crate) fn pop_back(&mut self, list: &mut List) -> Option<u32> {
        let t = list.tail;
        if t == NIL {
            return None;
        }
        self.unlink(list, t);
        Some(t)
    }

    /// The block before `id` (towards the head), or [`NIL`].
    #[inline]
    pub(crate) fn prev(&self, id: u32) -> u32 {
        self.prev[id as usize]
    }
}

impl List {
    /// Blocks in the list.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The oldest block, or [`NIL`].
    #[inline]
    pub(crate) fn tail(&self) -> u32 {
        self.tail
    }
}

/// Grows a per-id vector so that `id` indexes it.
#[inline]
pub(crate) fn ensure<T: Clone>(v: &mut Vec<T>, id: u32, fill: T) {
    let need = id as usize + 1;
    if v.len() < need {
        let n = need.max(v.len() * 2).max(1024);
        v.resize(n, fill);
    }
}
