//! Random-LRU (sampled LRU, as Redis and Tair KVCM do it): sample `k = 5`
//! resident blocks at random and evict the least recent of them.
//!
//! Cheaper than a recency list under concurrency in a real cache; here it
//! shows how close sampling gets to LRU. Residents live in a dense array
//! (swap-remove on eviction) so a sample is one random index.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::list::{NIL, ensure};
use super::{Access, Policy};

/// Blocks sampled per eviction.
pub const SAMPLES: usize = 5;

/// Random-LRU over dense ids.
#[derive(Debug)]
pub(crate) struct RandomLru {
    cap: usize,
    rng: SmallRng,
    tick: u64,
    residents: Vec<u32>,
    slot: Vec<u32>,
    last_use: Vec<u64>,
}

impl RandomLru {
    pub(crate) fn new(cap: u64, seed: u64) -> Self {
        RandomLru {
            cap: cap as usize,
            rng: SmallRng::seed_from_u64(seed),
            tick: 0,
            residents: Vec::new(),
            slot: Vec::new(),
            last_use: Vec::new(),
        }
    }

    fn take_out(&mut self, id: u32) {
        let s = self.slot[id as usize] as usize;
        self.residents.swap_remove(s);
        if let Some(&moved) = self.residents.get(s) {
            self.slot[moved as usize] = s as u32;
        }
        self.slot[id as usize] = NIL;
    }
}

impl Policy for RandomLru {
    fn hit(&mut self, a: &Access) {
        self.tick += 1;
        self.last_use[a.id as usize] = self.tick;
    }

    fn insert(&mut self, a: &Access, evicted: &mut Vec<u32>) {
        self.tick += 1;
        if self.cap == 0 {
            evicted.push(a.id);
            return;
        }
        // Make room first, so the new block is never sampled as a victim.
        while self.residents.len() >= self.cap {
            let n = self.residents.len();
            let mut victim = self.residents[self.rng.random_range(0..n)];
            for _ in 1..SAMPLES {
                let c = self.residents[self.rng.random_range(0..n)];
                if self.last_use[c as usize] < self.last_use[victim as usize] {
                    victim = c;
                }
            }
            self.take_out(victim);
            evicted.push(victim);
        }
        ensure(&mut self.slot, a.id, NIL);
        ensure(&mut self.last_use, a.id, 0);
        self.last_use[a.id as usize] = self.tick;
        self.slot[a.id as usize] = self.residents.len() as u32;
        self.residents.push(a.id);
    }

    fn remove(&mut self, id: u32) {
        self.take_out(id);
    }

    fn len(&self) -> usize {
        self.residents.len()
    }
}
