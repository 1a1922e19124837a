//! S3-FIFO (Yang et al., SOSP'23): a small FIFO (10% of the capacity), a
//! main FIFO and a ghost FIFO of ids recently evicted from the small one.
//!
//! New blocks enter the small queue (or the main one when their id is in the
//! ghost). Evicting from the small queue moves a block that was used since
//! it entered (count >= 1, as the paper's text says) to the main queue, and
//! otherwise drops it into the ghost. Evicting from the main queue gives a
//! block with a count > 0 another round with its count decremented. Counts
//! saturate at 3. The ghost holds as many ids as the main queue's share of
//! the capacity.

use super::list::{Links, List, ensure};
use super::{Access, Policy};

const NONE: u8 = 0;
const SMALL: u8 = 1;
const MAIN: u8 = 2;
const GHOST: u8 = 3;

/// S3-FIFO over dense ids.
#[derive(Debug)]
pub(crate) struct S3Fifo {
    cap: usize,
    small_cap: usize,
    ghost_cap: usize,
    links: Links,
    lists: [List; 4],
    place: Vec<u8>,
    freq: Vec<u8>,
}

impl S3Fifo {
    pub(crate) fn new(cap: u64) -> Self {
        let cap = cap as usize;
        let small_cap = (cap / 10).max(1);
        S3Fifo {
            cap,
            small_cap,
            ghost_cap: cap.saturating_sub(small_cap),
            links: Links::default(),
            lists: [List::default(); 4],
            place: Vec::new(),
            freq: Vec::new(),
        }
    }

    fn push(&mut self, id: u32, to: u8) {
        self.links.push_front(&mut self.lists[to as usize], id);
        self.place[id as usize] = to;
    }

    fn pop(&mut self, from: u8) -> Option<u32> {
        let v = self.links.pop_back(&mut self.lists[from as usize])?;
        self.place[v as usize] = NONE;
        Some(v)
    }

    fn evict_one(&mut self, evicted: &mut Vec<u32>) {
        loop {
            let small = self.lists[SMALL as usize].len();
            if small >= self.small_cap || self.lists[MAIN as usize].len() == 0 {
                let Some(t) = self.pop(SMALL) else { return };
                if self.freq[t as usize] >= 1 {
                    self.freq[t as usize] = 0;
                    self.push(t, MAIN);
                } else {
                    self.push(t, GHOST);
                    while self.lists[GHOST as usize].len() > self.ghost_cap {
                        self.pop(GHOST);
                    }
                    evicted.push(t);
                    return;
                }
            } else {
                let Some(t) = self.pop(MAIN) else { return };
                if self.freq[t as usize] > 0 {
                    self.freq[t as usize] -= 1;
                    self.push(t, MAIN);
                } else {
                    evicted.push(t);
                    return;
                }
            }
        }
    }
}

impl Policy for S3Fifo {
    fn hit(&mut self, a: &Access) {
        let f = &mut self.freq[a.id as usize];
        *f = (*f + 1).min(3);
    }

    fn insert(&mut self, a: &Access, evicted: &mut Vec<u32>) {
        let x = a.id;
        ensure(&mut self.place, x, NONE);
        ensure(&mut self.freq, x, 0);
        self.freq[x as usize] = 0;
        if self.place[x as usize] == GHOST {
            self.links.unlink(&mut self.lists[GHOST as usize], x);
            self.push(x, MAIN);
        } else {
            self.push(x, SMALL);
        }
        while self.len() > self.cap {
            let before = self.len();
            self.evict_one(evicted);
            if self.len() == before {
                break;
            }
        }
    }

    fn remove(&mut self, id: u32) {
        let from = self.place[id as usize];
        if from == SMALL || from == MAIN {
            self.links.unlink(&mut self.lists[from as usize], id);
            self.place[id as usize] = NONE;
        }
    }

    fn len(&self) -> usize {
        self.lists[SMALL as usize].len() + self.lists[MAIN as usize].len()
    }
}
