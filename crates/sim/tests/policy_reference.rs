//! Every policy against a straightforward reference model on random small
//! traces: the same per-request hit counts, request by request.
//!
//! The references keep their blocks in plain `Vec`s / `VecDeque`s searched
//! linearly and replay the documented semantics directly: count the leading
//! run of cached blocks, then touch or insert every block in order.

use std::collections::VecDeque;

use kvtier_core::BlockHash;
use kvtier_sim::policy::PolicyKind;
use kvtier_sim::replay::{ReplayConfig, replay};
use kvtier_sim::trace::Request;
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

type Key = (u32, u128);

/// One access as a reference model sees it.
struct Acc<'a> {
    key: Key,
    parent: Option<Key>,
    now: u64,
    /// The whole trace's accesses and this one's index (Belady only).
    future: &'a [Key],
    at: usize,
}

trait RefCache {
    fn contains(&self, k: &Key) -> bool;
    fn hit(&mut self, a: &Acc);
    fn insert(&mut self, a: &Acc);
    fn expire(&mut self, _now: u64) {}
    fn end_request(&mut self, _keys: &[Key]) {}
}

/// Runs the reference replay, returning hit blocks per request.
fn ref_replay(requests: &[Request], cache: &mut dyn RefCache) -> Vec<u32> {
    let future: Vec<Key> = requests
        .iter()
        .flat_map(|r| r.keys.iter().map(move |k| (r.instance, k.0)))
        .collect();
    let mut at = 0;
    let mut out = Vec::new();
    for r in requests {
        cache.expire(r.timestamp_ms);
        let keys: Vec<Key> = r.keys.iter().map(|k| (r.instance, k.0)).collect();
        out.push(keys.iter().take_while(|k| cache.contains(k)).count() as u32);
        for (i, &key) in keys.iter().enumerate() {
            let a = Acc {
                key,
                parent: i.checked_sub(1).map(|j| keys[j]),
                now: r.timestamp_ms,
                future: &future,
                at,
            };
            if cache.contains(&key) {
                cache.hit(&a);
            } else {
                cache.insert(&a);
            }
            at += 1;
        }
        cache.end_request(&keys);
    }
    out
}

/// LRU: a Vec from least to most recent.
struct RefLru {
    cap: usize,
    v: Vec<Key>,
}

impl RefCache for RefLru {
    fn contains(&self, k: &Key) -> bool {
        self.v.contains(k)
    }
    fn hit(&mut self, a: &Acc) {
        self.v.retain(|k| *k != a.key);
        self.v.push(a.key);
    }
    fn insert(&mut self, a: &Acc) {
        self.v.push(a.key);
        while self.v.len() > self.cap {
            self.v.remove(0);
        }
    }
}

/// TTL: LRU plus last use times; blocks idle longer than `ttl` expire.
struct RefTtl {
    lru: RefLru,
    ttl: u64,
    last: Vec<(Key, u64)>,
}

impl RefCache for RefTtl {
    fn contains(&self, k: &Key) -> bool {
        self.lru.contains(k)
    }
    fn hit(&mut self, a: &Acc) {
        self.lru.hit(a);
        self.last.retain(|(k, _)| *k != a.key);
        self.last.push((a.key, a.now));
    }
    fn insert(&mut self, a: &Acc) {
        self.lru.insert(a);
        self.last.retain(|(k, _)| *k != a.key);
        self.last.push((a.key, a.now));
    }
    fn expire(&mut self, now: u64) {
        let ttl = self.ttl;
        let old: Vec<Key> = self
            .last
            .iter()
            .filter(|(_, t)| now - t > ttl)
            .map(|(k, _)| *k)
            .collect();
        self.lru.v.retain(|k| !old.contains(k));
    }
}

/// LFU: (key, uses, last tick); evicts the fewest uses, then the oldest,
/// before inserting.
struct RefLfu {
    cap: usize,
    tick: u64,
    v: Vec<(Key, u64, u64)>,
}

impl RefCache for RefLfu {
    fn contains(&self, k: &Key) -> bool {
        self.v.iter().any(|e| e.0 == *k)
    }
    fn hit(&mut self, a: &Acc) {
        self.tick += 1;
        if let Some(e) = self.v.iter_mut().find(|e| e.0 == a.key) {
            e.1 += 1;
            e.2 = self.tick;
        }
    }
    fn insert(&mut self, a: &Acc) {
        self.tick += 1;
        if self.cap == 0 {
            return;
        }
        while self.v.len() >= self.cap {
            let i = (0..self.v.len())
                .min_by_key(|&i| (self.v[i].1, self.v[i].2))
                .unwrap();
            self.v.remove(i);
        }
        self.v.push((a.key, 1, self.tick));
    }
}

/// Leaf-aware LRU: least recent block without a cached child; a request's
/// blocks are re-touched from last to first when it ends.
struct RefLeafLru {
    cap: usize,
    v: Vec<Key>,
    parent: std::collections::HashMap<Key, Option<Key>>,
}

impl RefCache for RefLeafLru {
    fn contains(&self, k: &Key) -> bool {
        self.v.contains(k)
    }
    fn hit(&mut self, a: &Acc) {
        self.v.retain(|k| *k != a.key);
        self.v.push(a.key);
    }
    fn insert(&mut self, a: &Acc) {
        self.parent.entry(a.key).or_insert(a.parent);
        self.v.push(a.key);
        while self.v.len() > self.cap {
            let i = (0..self.v.len())
                .find(|&i| {
                    !self
                        .v
                        .iter()
                        .any(|c| self.parent.get(c).copied().flatten() == Some(self.v[i]))
                })
                .unwrap_or(0);
            self.v.remove(i);
        }
    }
    fn end_request(&mut self, keys: &[Key]) {
        for k in keys.iter().rev() {
            if self.v.contains(k) {
                self.v.retain(|x| x != k);
                self.v.push(*k);
            }
        }
    }
}

/// Random-LRU: the same draws as the policy (seeded SmallRng, 5 samples
/// over a swap-remove array), recency by a tick.
struct RefRandomLru {
    cap: usize,
    rng: SmallRng,
    tick: u64,
    v: Vec<(Key, u64)>,
}

impl RefCache for RefRandomLru {
    fn contains(&self, k: &Key) -> bool {
        self.v.iter().any(|e| e.0 == *k)
    }
    fn hit(&mut self, a: &Acc) {
        self.tick += 1;
        if let Some(e) = self.v.iter_mut().find(|e| e.0 == a.key) {
            e.1 = self.tick;
        }
    }
    fn insert(&mut self, a: &Acc) {
        self.tick += 1;
        if self.cap == 0 {
            return;
        }
        while self.v.len() >= self.cap {
            let n = self.v.len();
            let mut best = self.rng.random_range(0..n);
            for _ in 1..5 {
                let c = self.rng.random_range(0..n);
                if self.v[c].1 < self.v[best].1 {
                    best = c;
                }
            }
            self.v.swap_remove(best);
        }
        self.v.push((a.key, self.tick));
    }
}

/// ARC, straight from the paper's pseudo-code over VecDeques (front = MRU).
struct RefArc {
    c: usize,
    p: usize,
    t1: VecDeque<Key>,
    t2: VecDeque<Key>,
    b1: VecDeque<Key>,
    b2: VecDeque<Key>,
}

fn take(q: &mut VecDeque<Key>, k: &Key) -> bool {
    match q.iter().position(|x| x == k) {
        Some(i) => {
            q.remove(i);
            true
        }
        None => false,
    }
}

impl RefArc {
    fn replace(&mut self, in_b2: bool) {
        let t1 = self.t1.len();
        if t1 >= 1 && ((in_b2 && t1 == self.p) || t1 > self.p) {
            if let Some(v) = self.t1.pop_back() {
                self.b1.push_front(v);
            }
        } else if let Some(v) = self.t2.pop_back() {
            self.b2.push_front(v);
        } else if let Some(v) = self.t1.pop_back() {
            self.b1.push_front(v);
        }
    }
}

impl RefCache for RefArc {
    fn contains(&self, k: &Key) -> bool {
        self.t1.contains(k) || self.t2.contains(k)
    }
    fn hit(&mut self, a: &Acc) {
        if !take(&mut self.t1, &a.key) {
            take(&mut self.t2, &a.key);
        }
        self.t2.push_front(a.key);
    }
    fn insert(&mut self, a: &Acc) {
        let (c, x) = (self.c, a.key);
        if c == 0 {
            return;
        }
        if self.b1.contains(&x) {
            self.p = (self.p + (self.b2.len() / self.b1.len()).max(1)).min(c);
            self.replace(false);
            take(&mut self.b1, &x);
            self.t2.push_front(x);
        } else if self.b2.contains(&x) {
            self.p = self
                .p
                .saturating_sub((self.b1.len() / self.b2.len()).max(1));
            self.replace(true);
            take(&mut self.b2, &x);
            self.t2.push_front(x);
        } else {
            let l1 = self.t1.len() + self.b1.len();
            let total = l1 + self.t2.len() + self.b2.len();
            if l1 == c {
                if self.t1.len() < c {
                    self.b1.pop_back();
                    self.replace(false);
                } else {
                    self.t1.pop_back();
                }
            } else if total >= c {
                if total == 2 * c {
                    self.b2.pop_back();
                }
                if self.t1.len() + self.t2.len() >= c {
                    self.replace(false);
                }
            }
            self.t1.push_front(x);
        }
    }
}

/// S3-FIFO over VecDeques (front = newest): small (10%), main, ghost.
struct RefS3 {
    cap: usize,
    small_cap: usize,
    s: VecDeque<(Key, u8)>,
    m: VecDeque<(Key, u8)>,
    g: VecDeque<Key>,
}

impl RefCache for RefS3 {
    fn contains(&self, k: &Key) -> bool {
        self.s.iter().chain(self.m.iter()).any(|e| e.0 == *k)
    }
    fn hit(&mut self, a: &Acc) {
        for e in self.s.iter_mut().chain(self.m.iter_mut()) {
            if e.0 == a.key {
                e.1 = (e.1 + 1).min(3);
            }
        }
    }
    fn insert(&mut self, a: &Acc) {
        if take(&mut self.g, &a.key) {
            self.m.push_front((a.key, 0));
        } else {
            self.s.push_front((a.key, 0));
        }
        while self.s.len() + self.m.len() > self.cap {
            // Evict one block.
            loop {
                if self.s.len() >= self.small_cap || self.m.is_empty() {
                    let (k, f) = self.s.pop_back().unwrap();
                    if f >= 1 {
                        self.m.push_front((k, 0));
                    } else {
                        self.g.push_front(k);
                        while self.g.len() > self.cap.saturating_sub(self.small_cap) {
                            self.g.pop_back();
                        }
                        break;
                    }
                } else {
                    let (k, f) = self.m.pop_back().unwrap();
                    if f > 0 {
                        self.m.push_front((k, f - 1));
                    } else {
                        break;
                    }
                }
            }
        }
    }
}

/// Belady with bypass: when over capacity, drop the cached block (the new
/// one included) whose next use is farthest, found by scanning the future.
struct RefBelady {
    cap: usize,
    v: Vec<Key>,
}

impl RefCache for RefBelady {
    fn contains(&self, k: &Key) -> bool {
        self.v.contains(k)
    }
    fn hit(&mut self, _a: &Acc) {}
    fn insert(&mut self, a: &Acc) {
        self.v.push(a.key);
        if self.v.len() > self.cap {
            let next = |k: &Key| {
                a.future[a.at + 1..]
                    .iter()
                    .position(|f| f == k)
                    .unwrap_or(usize::MAX)
            };
            // Ties are only among blocks never used again: any of them will do.
            let i = (0..self.v.len()).max_by_key(|&i| next(&self.v[i])).unwrap();
            self.v.remove(i);
        }
    }
}

fn reference(kind: PolicyKind, cap: usize, ttl: u64, seed: u64) -> Box<dyn RefCache> {
    match kind {
        PolicyKind::Lru => Box::new(RefLru { cap, v: Vec::new() }),
        PolicyKind::Lfu => Box::new(RefLfu {
            cap,
            tick: 0,
            v: Vec::new(),
        }),
        PolicyKind::Arc => Box::new(RefArc {
            c: cap,
            p: 0,
            t1: VecDeque::new(),
            t2: VecDeque::new(),
            b1: VecDeque::new(),
            b2: VecDeque::new(),
        }),
        PolicyKind::S3Fifo => Box::new(RefS3 {
            cap,
            small_cap: (cap / 10).max(1),
            s: VecDeque::new(),
            m: VecDeque::new(),
            g: VecDeque::new(),
        }),
        PolicyKind::RandomLru => Box::new(RefRandomLru {
            cap,
            rng: SmallRng::seed_from_u64(seed),
            tick: 0,
            v: Vec::new(),
        }),
        PolicyKind::LeafLru => Box::new(RefLeafLru {
            cap,
            v: Vec::new(),
            parent: Default::default(),
        }),
        PolicyKind::Ttl => Box::new(RefTtl {
            lru: RefLru { cap, v: Vec::new() },
            ttl,
            last: Vec::new(),
        }),
        PolicyKind::Belady => Box::new(RefBelady { cap, v: Vec::new() }),
    }
}

/// A random request: a path of small tokens through a shared prefix tree,
/// chained into prefix keys, on one of two instances.
fn arb_request() -> impl Strategy<Value = (u32, Vec<u32>, u64)> {
    (0u32..2, prop::collection::vec(0u32..3, 0..7), 0u64..40)
}

fn build_trace(raw: &[(u32, Vec<u32>, u64)]) -> Vec<Request> {
    let mut t = 0;
    raw.iter()
        .map(|(instance, tokens, dt)| {
            t += dt;
            let mut parent = None;
            let keys: Vec<BlockHash> = tokens
                .iter()
                .map(|&tok| {
                    let k = BlockHash::chained(parent, 0, &[tok]);
                    parent = Some(k);
                    k
                })
                .collect();
            Request {
                timestamp_ms: t,
                instance: *instance,
                input_tokens: keys.len() as u32 * 4,
                output_tokens: 1,
                keys,
                tokens_per_block: 4,
                last_block_tokens: 4,
            }
        })
        .collect()
}

fn check(
    kind: PolicyKind,
    raw: &[(u32, Vec<u32>, u64)],
    cap: u64,
    ttl: u64,
    seed: u64,
) -> Result<(), TestCaseError> {
    let trace = build_trace(raw);
    let mut cfg = ReplayConfig::single(kind, cap);
    cfg.keep_outcomes = true;
    cfg.ttl_ms = Some(ttl);
    cfg.seed = seed;
    let got: Vec<u32> = replay(&trace, &cfg)
        .outcomes
        .iter()
        .map(|o| o.hit_blocks)
        .collect();
    let want = ref_replay(&trace, reference(kind, cap as usize, ttl, seed).as_mut());
    prop_assert_eq!(got, want, "policy {}", kind);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn lru_matches_reference(raw in prop::collection::vec(arb_request(), 1..40), cap in 0u64..12) {
        check(PolicyKind::Lru, &raw, cap, 0, 0)?;
    }

    #[test]
    fn lfu_matches_reference(raw in prop::collection::vec(arb_request(), 1..40), cap in 0u64..12) {
        check(PolicyKind::Lfu, &raw, cap, 0, 0)?;
    }

    #[test]
    fn arc_matches_reference(raw in prop::collection::vec(arb_request(), 1..40), cap in 0u64..12) {
        check(PolicyKind::Arc, &raw, cap, 0, 0)?;
    }

    #[test]
    fn s3fifo_matches_reference(raw in prop::collection::vec(arb_request(), 1..40), cap in 0u64..25) {
        check(PolicyKind::S3Fifo, &raw, cap, 0, 0)?;
    }

    #[test]
    fn random_lru_matches_reference(raw in prop::collection::vec(arb_request(), 1..40), cap in 0u64..12, seed in any::<u64>()) {
        check(PolicyKind::RandomLru, &raw, cap, 0, seed)?;
    }

    #[test]
    fn leaf_lru_matches_reference(raw in prop::collection::vec(arb_request(), 1..40), cap in 0u64..12) {
        check(PolicyKind::LeafLru, &raw, cap, 0, 0)?;
    }

    #[test]
    fn ttl_matches_reference(raw in prop::collection::vec(arb_request(), 1..40), cap in 0u64..12, ttl in 0u64..100) {
        check(PolicyKind::Ttl, &raw, cap, ttl, 0)?;
    }

    #[test]
    fn belady_matches_reference(raw in prop::collection::vec(arb_request(), 1..40), cap in 0u64..12) {
        check(PolicyKind::Belady, &raw, cap, 0, 0)?;
    }

    #[test]
    fn belady_is_never_beaten(raw in prop::collection::vec(arb_request(), 1..60), cap in 0u64..16, seed in any::<u64>()) {
        let trace = build_trace(&raw);
        let mut cfg = ReplayConfig::single(PolicyKind::Belady, cap);
        cfg.seed = seed;
        cfg.ttl_ms = Some(30);
        let best = replay(&trace, &cfg).hit_blocks;
        for kind in PolicyKind::ALL {
            cfg.policy = kind;
            let r = replay(&trace, &cfg);
            prop_assert!(r.hit_blocks <= best, "{} hit {} blocks, belady {}", kind, r.hit_blocks, best);
        }
    }
}
