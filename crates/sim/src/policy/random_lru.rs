//! Random-LRU (sampled LRU, as Redis and Tair KVCM do it): sample `k = 5`
//! resident blocks at random and evict the least recent of them.
//!
//! Cheaper than a recency list under concurrency in a real cache; here it
//! shows how close sampling gets to LRU. Residents live in a dense array
//! (swap-remove on eviction) so a sample is one random index. Draws the
//! tier may not evict now do not count as samples; when no draw is
//! eligible, the least recent eligible resident goes (a full scan, rare).

use kvtier_policy::{EvictionPolicy, PolicyKind, Use, Verdict};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::NIL;

/// Blocks sampled per eviction.
pub const SAMPLES: usize = 5;

/// Random draws per eviction before the full scan.
const MAX_DRAWS: usize = 64 * SAMPLES;

/// Random-LRU over dense ids.
#[derive(Debug)]
pub(crate) struct RandomLru {
    rng: SmallRng,
    tick: u64,
    residents: Vec<u32>,
    slot: Vec<u32>,
    last_use: Vec<u64>,
}

impl RandomLru {
    pub(crate) fn new(seed: u64) -> Self {
        RandomLru {
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

    /// The least recent of `SAMPLES` random residents that `eligible`
    /// accepts, drawing up to `MAX_DRAWS` (a tier whose blocks are mostly
    /// parents under the leaf-first filter skips many); `Err` when it
    /// stopped the scan.
    fn sample(&mut self, eligible: &mut dyn FnMut(u32) -> Verdict) -> Result<Option<u32>, ()> {
        let n = self.residents.len();
        let mut best: Option<u32> = None;
        let mut accepted = 0;
        for _ in 0..MAX_DRAWS {
            if accepted == SAMPLES {
                break;
            }
            let c = self.residents[self.rng.random_range(0..n)];
            match eligible(c) {
                Verdict::Evict => {
                    accepted += 1;
                    if best.is_none_or(|b| self.last_use[c as usize] < self.last_use[b as usize]) {
                        best = Some(c);
                    }
                }
                Verdict::Skip => {}
                Verdict::Stop => return Err(()),
            }
        }
        Ok(best)
    }
}

impl EvictionPolicy<u32> for RandomLru {
    fn kind(&self) -> PolicyKind {
        PolicyKind::RandomLru
    }

    fn insert(&mut self, id: u32, _u: &Use) {
        self.tick += 1;
        let i = id as usize;
        if self.slot.len() <= i {
            self.slot.resize(i + 1, NIL);
            self.last_use.resize(i + 1, 0);
        }
        self.last_use[i] = self.tick;
        self.slot[i] = self.residents.len() as u32;
        self.residents.push(id);
    }

    fn access(&mut self, id: u32, _u: &Use) {
        self.tick += 1;
        if self.contains(id) {
            self.last_use[id as usize] = self.tick;
        }
    }

    fn remove(&mut self, id: u32) {
        if self.contains(id) {
            self.take_out(id);
        }
    }

    fn victim(&mut self, _now: u64, eligible: &mut dyn FnMut(u32) -> Verdict) -> Option<u32> {
        if self.residents.is_empty() {
            return None;
        }
        let found = match self.sample(eligible).ok()? {
            Some(v) => Some(v),
            None => {
                let mut best: Option<u32> = None;
                for &c in &self.residents {
                    if best.is_some_and(|b| self.last_use[b as usize] <= self.last_use[c as usize])
                    {
                        continue;
                    }
                    match eligible(c) {
                        Verdict::Evict => best = Some(c),
                        Verdict::Skip => {}
                        Verdict::Stop => return None,
                    }
                }
                best
            }
        };
        let v = found?;
        self.take_out(v);
        Some(v)
    }

    /// Least recent first, the order sampling approximates (a sort: the
    /// replay never asks).
    fn coldest(&self, visit: &mut dyn FnMut(u32) -> Verdict) {
        let mut order = self.residents.clone();
        order.sort_unstable_by_key(|id| self.last_use[*id as usize]);
        let _ = order.iter().any(|id| visit(*id) == Verdict::Stop);
    }

    fn contains(&self, id: u32) -> bool {
        self.slot.get(id as usize).is_some_and(|s| *s != NIL)
    }

    fn len(&self) -> usize {
        self.residents.len()
    }
}
