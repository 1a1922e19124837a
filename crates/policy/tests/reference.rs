//! Every policy against a plain reference model: the same decisions for
//! random operation sequences with random eligibility, for both key maps
//! (hashed `u64` keys and dense `u32` keys).
//!
//! The references are the obvious O(n) formulations (vectors in recency
//! order, a sort for LFU), written from the algorithms' definitions in the
//! module docs, so the O(1) lists, buckets and slab reuse are what is
//! tested.

use std::collections::HashMap;

use kvtier_policy::{CostModel, LeafFirst, PolicyConfig, PolicyKey, PolicyKind, Use, Verdict};
use proptest::prelude::*;

/// Keys oldest first.
#[derive(Debug, Default, Clone)]
struct Order(Vec<u64>);

impl Order {
    fn push(&mut self, k: u64) {
        self.remove(k);
        self.0.push(k);
    }
    fn remove(&mut self, k: u64) -> bool {
        match self.0.iter().position(|x| *x == k) {
            Some(i) => {
                self.0.remove(i);
                true
            }
            None => false,
        }
    }
    fn has(&self, k: u64) -> bool {
        self.0.contains(&k)
    }
    fn take_where(&mut self, ok: &dyn Fn(u64) -> bool) -> Option<u64> {
        let i = self.0.iter().position(|k| ok(*k))?;
        Some(self.0.remove(i))
    }
    fn trim(&mut self, cap: usize) {
        while self.0.len() > cap {
            self.0.remove(0);
        }
    }
}

/// The reference of one policy.
#[derive(Debug)]
enum Reference {
    Lru(Order),
    Ttl(Order, HashMap<u64, u64>, u64),
    Lfu(HashMap<u64, (u64, u64)>, u64),
    Arc {
        cap: usize,
        p: usize,
        t1: Order,
        t2: Order,
        b1: Order,
        b2: Order,
    },
    S3 {
        cap: usize,
        small: Order,
        main: Order,
        ghost: Order,
        uses: HashMap<u64, u64>,
    },
    Cost(CostModel, HashMap<u64, (u64, u64, u32, u64)>, u64),
    Slru(Slru),
    Density(Box<Density>),
}

/// SLRU's miniature of one share: the same segments over every key (the
/// reference's tiers are far below `2 × MINI_KEYS`, where all keys are
/// sampled), counting misses.
#[derive(Debug)]
struct Mini {
    cap: usize,
    protected_cap: usize,
    probation: Order,
    protected: Order,
    ghost: Order,
    misses: f64,
}

impl Mini {
    fn use_key(&mut self, k: u64) {
        if self.probation.has(k) || self.protected.has(k) {
            slru_promote(
                &mut self.probation,
                &mut self.protected,
                self.protected_cap,
                k,
            );
            return;
        }
        self.misses += 1.0;
        slru_admit(
            &mut self.probation,
            &mut self.protected,
            &mut self.ghost,
            self.protected_cap,
            k,
        );
        if self.probation.0.len() + self.protected.0.len() > self.cap {
            let old = if self.probation.0.is_empty() {
                self.protected.0.remove(0)
            } else {
                self.probation.0.remove(0)
            };
            slru_remember(&mut self.ghost, self.cap, old);
        }
    }
}

/// SLRU's admission: a remembered key (a ghost) goes to protected as a
/// promotion, any other to probation's newest end.
fn slru_admit(probation: &mut Order, protected: &mut Order, ghost: &mut Order, cap: usize, k: u64) {
    if ghost.remove(k) {
        slru_promote(probation, protected, cap, k);
    } else {
        probation.push(k);
    }
}

/// SLRU's memory of an evicted key: the newest ghost, the oldest beyond
/// `GHOST_FACTOR` tiers' worth forgotten.
fn slru_remember(ghost: &mut Order, cap: usize, k: u64) {
    ghost.push(k);
    ghost.trim(kvtier_policy::GHOST_FACTOR * cap);
}

/// SLRU's promotion: `k` to protected's newest end, then protected's
/// oldest back to probation's newest end while it holds more than `cap`.
fn slru_promote(probation: &mut Order, protected: &mut Order, cap: usize, k: u64) {
    probation.remove(k);
    protected.push(k);
    while protected.0.len() > cap {
        let old = protected.0.remove(0);
        probation.push(old);
    }
}

/// SLRU: the two segments and the ghosts of the tier, and the
/// miniatures.
#[derive(Debug)]
struct Slru {
    cap: usize,
    protected_cap: usize,
    probation: Order,
    protected: Order,
    ghost: Order,
    minis: Vec<Mini>,
    seen: usize,
}

impl Slru {
    fn new(cap: usize) -> Self {
        assert!(
            cap < 2 * kvtier_policy::MINI_KEYS,
            "the reference samples every key"
        );
        Slru {
            cap,
            protected_cap: cap * kvtier_policy::START_SHARE / 100,
            probation: Order::default(),
            protected: Order::default(),
            ghost: Order::default(),
            minis: kvtier_policy::SHARES
                .iter()
                .map(|&share| Mini {
                    cap,
                    protected_cap: cap * share / 100,
                    probation: Order::default(),
                    protected: Order::default(),
                    ghost: Order::default(),
                    misses: 0.0,
                })
                .collect(),
            seen: 0,
        }
    }

    fn has(&self, k: u64) -> bool {
        self.probation.has(k) || self.protected.has(k)
    }

    fn insert(&mut self, k: u64) {
        slru_admit(
            &mut self.probation,
            &mut self.protected,
            &mut self.ghost,
            self.protected_cap,
            k,
        );
        self.observe(k);
    }

    fn access(&mut self, k: u64) {
        if self.has(k) {
            slru_promote(
                &mut self.probation,
                &mut self.protected,
                self.protected_cap,
                k,
            );
            self.observe(k);
        }
    }

    /// A use the tuner sees: every miniature takes it; at the end of a
    /// window (as many uses as a miniature holds) the share of the one
    /// with the fewest misses (the first on ties) becomes the tier's
    /// bound, and the misses decay.
    fn observe(&mut self, k: u64) {
        for m in &mut self.minis {
            m.use_key(k);
        }
        self.seen += 1;
        if self.seen < self.cap {
            return;
        }
        self.seen = 0;
        // min_by keeps the first of equal minima: ties go to the smaller share.
        let best = self
            .minis
            .iter()
            .zip(kvtier_policy::SHARES)
            .min_by(|a, b| a.0.misses.total_cmp(&b.0.misses))
            .map_or(0, |(_, share)| share);
        self.minis
            .iter_mut()
            .for_each(|m| m.misses *= kvtier_policy::DECAY);
        self.protected_cap = self.cap * best / 100;
        while self.protected.0.len() > self.protected_cap {
            let old = self.protected.0.remove(0);
            self.probation.push(old);
        }
    }
}

/// Hit density: one record per tracked key; a list is the keys with the
/// same (ghost, class, bucket), in the order they were put there.
#[derive(Debug)]
struct Density {
    cap: u64,
    clock: u64,
    next: u64,
    keys: HashMap<u64, Life>,
    reached: [[f64; 32]; 2],
    reused: [[f64; 32]; 2],
    /// (class, bucket), lowest density first.
    ranking: Vec<(usize, usize)>,
    ranked_at: u64,
    swept_at: u64,
}

#[derive(Debug, Clone, Copy)]
struct Life {
    ghost: bool,
    class: usize,
    bucket: usize,
    last: u64,
    order: u64,
}

/// The octave of `age`: the largest `b` with `2^b - 1 <= age`.
fn octave(age: u64) -> usize {
    let mut b = 0;
    while b + 1 < 32 && (1u64 << (b + 1)) - 1 <= age {
        b += 1;
    }
    b
}

impl Density {
    fn new(cap: usize) -> Self {
        let mut d = Density {
            cap: cap as u64,
            clock: 0,
            next: 0,
            keys: HashMap::new(),
            reached: [[0.0; 32]; 2],
            reused: [[0.0; 32]; 2],
            ranking: Vec::new(),
            ranked_at: 0,
            swept_at: 0,
        };
        d.rank();
        d
    }

    fn has(&self, k: u64) -> bool {
        self.keys.get(&k).is_some_and(|l| !l.ghost)
    }

    /// Moves `k` to the newest end of its (ghost, class, bucket) list.
    fn put(&mut self, k: u64, ghost: bool, class: usize, bucket: usize) {
        self.next += 1;
        let life = self.keys.get_mut(&k).expect("tracked");
        (life.ghost, life.class, life.bucket, life.order) = (ghost, class, bucket, self.next);
    }

    fn oldest(
        &self,
        ghost: bool,
        class: usize,
        bucket: usize,
        ok: &dyn Fn(u64) -> bool,
    ) -> Option<u64> {
        let mut keys: Vec<(u64, u64)> = self
            .keys
            .iter()
            .filter(|(k, l)| l.ghost == ghost && l.class == class && l.bucket == bucket && ok(**k))
            .map(|(k, l)| (l.order, *k))
            .collect();
        keys.sort();
        keys.first().map(|(_, k)| *k)
    }

    /// Density per bucket from the definition: reuses still to come over
    /// time still to spend (a life passing a bucket spends its width, one
    /// ending in it half), summed from the oldest bucket down.
    fn densities(&self, class: usize) -> [f64; 32] {
        let (n, h) = (&self.reached[class], &self.reused[class]);
        let (mut hits, mut time) = (0.0, 0.0);
        let mut d = [0.0; 32];
        for b in (0..32).rev() {
            let width = if b < 31 {
                (1u64 << b) as f64
            } else {
                ((1u64 << 31) - 1) as f64
            };
            let passed = if b < 31 { n[b + 1] } else { 0.0 };
            hits += h[b];
            time += passed * width + (n[b] - passed).max(0.0) * width * 0.5;
            d[b] = if time > 0.0 { hits / time } else { 0.0 };
        }
        d
    }

    fn rank(&mut self) {
        let mut all = Vec::new();
        for class in 0..2 {
            let d = self.densities(class);
            for (b, x) in d.iter().enumerate() {
                all.push((*x, b, class));
            }
        }
        all.sort_by(|x, y| x.0.total_cmp(&y.0).then(y.1.cmp(&x.1)));
        self.ranking = all.into_iter().map(|(_, b, c)| (c, b)).collect();
        for x in self
            .reached
            .iter_mut()
            .chain(self.reused.iter_mut())
            .flatten()
        {
            *x *= kvtier_policy::DENSITY_DECAY;
        }
        self.ranked_at = self.clock;
    }

    fn sweep(&mut self) {
        let horizon = kvtier_policy::HORIZON_FACTOR * self.cap;
        for ghost in [false, true] {
            for class in 0..2 {
                for b in 0..32 {
                    while let Some(k) = self.oldest(ghost, class, b, &|_| true) {
                        let age = self.clock - self.keys[&k].last;
                        if ghost && age >= horizon {
                            self.keys.remove(&k);
                            continue;
                        }
                        let to = octave(age);
                        if to == b {
                            break;
                        }
                        for x in b + 1..=to {
                            self.reached[class][x] += 1.0;
                        }
                        self.put(k, ghost, class, to);
                    }
                }
            }
        }
        self.swept_at = self.clock;
    }

    fn start(&mut self, k: u64, class: usize) {
        self.reached[class][0] += 1.0;
        self.keys.get_mut(&k).expect("tracked").last = self.clock;
        self.put(k, false, class, 0);
    }

    /// The clock counts new keys only: a ghost coming back is not one.
    fn insert(&mut self, k: u64) {
        let class = match self.keys.get(&k) {
            Some(l) => {
                self.reused[l.class][octave(self.clock - l.last)] += 1.0;
                1
            }
            None => {
                self.clock += 1;
                let life = Life {
                    ghost: false,
                    class: 0,
                    bucket: 0,
                    last: 0,
                    order: 0,
                };
                self.keys.insert(k, life);
                0
            }
        };
        self.start(k, class);
        if self.clock - self.swept_at >= 8 {
            self.sweep();
        }
        if self.clock - self.ranked_at >= (self.cap / kvtier_policy::PERIOD_DIVISOR).max(16) {
            self.rank();
        }
    }

    fn access(&mut self, k: u64) {
        let Some(l) = self.keys.get(&k).copied() else {
            return;
        };
        if l.ghost {
            return;
        }
        if l.last == self.clock {
            // The same use: only its place in its list moves.
            self.put(k, false, l.class, l.bucket);
            return;
        }
        self.reused[l.class][octave(self.clock - l.last)] += 1.0;
        self.start(k, 1);
    }

    fn remove(&mut self, k: u64) {
        if self.has(k) {
            self.keys.remove(&k);
        }
    }

    fn victim(&mut self, ok: &dyn Fn(u64) -> bool) -> Option<u64> {
        for (class, b) in self.ranking.clone() {
            if let Some(k) = self.oldest(false, class, b, ok) {
                self.put(k, true, class, b);
                return Some(k);
            }
        }
        None
    }
}

impl Reference {
    fn new(kind: PolicyKind, cap: usize, ttl: u64) -> Self {
        let cap = cap.max(1);
        match kind {
            PolicyKind::Lru => Reference::Lru(Order::default()),
            PolicyKind::Ttl => Reference::Ttl(Order::default(), HashMap::new(), ttl),
            PolicyKind::Lfu => Reference::Lfu(HashMap::new(), 0),
            PolicyKind::Arc => Reference::Arc {
                cap,
                p: 0,
                t1: Order::default(),
                t2: Order::default(),
                b1: Order::default(),
                b2: Order::default(),
            },
            PolicyKind::S3Fifo => Reference::S3 {
                cap,
                small: Order::default(),
                main: Order::default(),
                ghost: Order::default(),
                uses: HashMap::new(),
            },
            PolicyKind::CostAware => Reference::Cost(CostModel::default(), HashMap::new(), 0),
            PolicyKind::Slru => Reference::Slru(Slru::new(cap)),
            PolicyKind::HitDensity => Reference::Density(Box::new(Density::new(cap))),
            _ => unreachable!("node policies only"),
        }
    }

    fn contains(&self, k: u64) -> bool {
        match self {
            Reference::Lru(o) | Reference::Ttl(o, ..) => o.has(k),
            Reference::Cost(_, m, _) => m.contains_key(&k),
            Reference::Lfu(m, _) => m.contains_key(&k),
            Reference::Arc { t1, t2, .. } => t1.has(k) || t2.has(k),
            Reference::S3 { small, main, .. } => small.has(k) || main.has(k),
            Reference::Slru(m) => m.has(k),
            Reference::Density(m) => m.has(k),
        }
    }

    fn insert(&mut self, k: u64, now: u64, depth: u32) {
        match self {
            Reference::Lru(o) => o.push(k),
            Reference::Ttl(o, last, _) => {
                o.push(k);
                last.insert(k, now);
            }
            Reference::Lfu(m, seq) => {
                *seq += 1;
                m.insert(k, (1, *seq));
            }
            Reference::Arc {
                cap,
                p,
                t2,
                t1,
                b1,
                b2,
            } => {
                if b1.has(k) {
                    let step = (b2.0.len() / b1.0.len()).max(1);
                    b1.remove(k);
                    *p = (*p + step).min(*cap);
                    t2.push(k);
                } else if b2.has(k) {
                    let step = (b1.0.len() / b2.0.len()).max(1);
                    b2.remove(k);
                    *p = p.saturating_sub(step);
                    t2.push(k);
                } else {
                    t1.push(k);
                }
            }
            Reference::S3 {
                small,
                main,
                ghost,
                uses,
                ..
            } => {
                uses.insert(k, 0);
                if ghost.remove(k) {
                    main.push(k);
                } else {
                    small.push(k);
                }
            }
            Reference::Cost(_, m, seq) => {
                *seq += 1;
                m.insert(k, (1, now, depth, *seq));
            }
            Reference::Slru(m) => m.insert(k),
            Reference::Density(m) => m.insert(k),
        }
    }

    fn access(&mut self, k: u64, now: u64) {
        match self {
            Reference::Lru(o) => {
                if o.has(k) {
                    o.push(k);
                }
            }
            Reference::Ttl(o, last, _) => {
                if o.has(k) {
                    o.push(k);
                    let t = last.entry(k).or_insert(0);
                    *t = (*t).max(now);
                }
            }
            Reference::Lfu(m, seq) => {
                *seq += 1;
                if let Some(e) = m.get_mut(&k) {
                    *e = (e.0 + 1, *seq);
                }
            }
            Reference::Arc { t1, t2, .. } => {
                if t1.remove(k) || t2.has(k) {
                    t2.push(k);
                }
            }
            Reference::S3 {
                small, main, uses, ..
            } => {
                if small.has(k) || main.has(k) {
                    let u = uses.entry(k).or_insert(0);
                    *u = (*u + 1).min(3);
                }
            }
            Reference::Cost(_, m, seq) => {
                *seq += 1;
                if let Some(e) = m.get_mut(&k) {
                    e.0 += 1;
                    e.1 = e.1.max(now);
                    e.3 = *seq;
                }
            }
            Reference::Slru(m) => m.access(k),
            Reference::Density(m) => m.access(k),
        }
    }

    fn remove(&mut self, k: u64) {
        match self {
            Reference::Lru(o) | Reference::Ttl(o, ..) => {
                o.remove(k);
            }
            Reference::Lfu(m, _) => {
                m.remove(&k);
            }
            Reference::Cost(_, m, _) => {
                m.remove(&k);
            }
            Reference::Arc { t1, t2, .. } => {
                t1.remove(k);
                t2.remove(k);
            }
            Reference::S3 {
                small, main, uses, ..
            } => {
                small.remove(k);
                main.remove(k);
                uses.remove(&k);
            }
            Reference::Slru(m) => {
                m.probation.remove(k);
                m.protected.remove(k);
            }
            Reference::Density(m) => m.remove(k),
        }
    }

    fn victim(&mut self, now: u64, ok: &dyn Fn(u64) -> bool) -> Option<u64> {
        match self {
            Reference::Lru(o) | Reference::Ttl(o, ..) => o.take_where(ok),
            Reference::Lfu(m, _) => {
                let mut v: Vec<(u64, u64, u64)> =
                    m.iter().map(|(k, (u, s))| (*u, *s, *k)).collect();
                v.sort();
                let k = v.into_iter().map(|e| e.2).find(|k| ok(*k))?;
                m.remove(&k);
                Some(k)
            }
            Reference::Cost(model, m, _) => {
                let mut best: Option<(f64, u64, u64)> = None;
                for (k, (uses, last, depth, seq)) in m.iter() {
                    let v = model.value(*uses, now.saturating_sub(*last), *depth);
                    let better = best.is_none_or(|(bv, bs, _)| v < bv || (v == bv && *seq < bs));
                    if better && ok(*k) {
                        best = Some((v, *seq, *k));
                    }
                }
                let (_, _, k) = best?;
                m.remove(&k);
                Some(k)
            }
            Reference::Arc {
                cap,
                p,
                t1,
                t2,
                b1,
                b2,
            } => {
                let recent_first = t1.0.len() > *p || t2.0.is_empty();
                for from_t1 in if recent_first {
                    [true, false]
                } else {
                    [false, true]
                } {
                    let (list, ghosts) = if from_t1 {
                        (&mut *t1, &mut *b1)
                    } else {
                        (&mut *t2, &mut *b2)
                    };
                    if let Some(k) = list.take_where(ok) {
                        ghosts.push(k);
                        ghosts.trim(*cap);
                        return Some(k);
                    }
                }
                None
            }
            Reference::S3 {
                cap,
                small,
                main,
                ghost,
                uses,
            } => {
                let target = (*cap / 10).max(1);
                let small_first = small.0.len() >= target || main.0.is_empty();
                let order = if small_first {
                    [true, false]
                } else {
                    [false, true]
                };
                for from_small in order {
                    let found = if from_small {
                        s3_small(small, main, ghost, uses, *cap, ok)
                    } else {
                        s3_main(main, uses, ok)
                    };
                    if found.is_some() {
                        return found;
                    }
                }
                None
            }
            Reference::Slru(m) => {
                let k = m
                    .probation
                    .take_where(ok)
                    .or_else(|| m.protected.take_where(ok))?;
                slru_remember(&mut m.ghost, m.cap, k);
                Some(k)
            }
            Reference::Density(m) => m.victim(ok),
        }
    }

    fn expired(&self, now: u64) -> Vec<u64> {
        match self {
            Reference::Ttl(o, last, ttl) => {
                o.0.iter()
                    .copied()
                    .take_while(|k| now.saturating_sub(last[k]) >= *ttl)
                    .collect()
            }
            _ => Vec::new(),
        }
    }
}

fn s3_small(
    small: &mut Order,
    main: &mut Order,
    ghost: &mut Order,
    uses: &mut HashMap<u64, u64>,
    cap: usize,
    ok: &dyn Fn(u64) -> bool,
) -> Option<u64> {
    let mut i = 0;
    while i < small.0.len() {
        let k = small.0[i];
        if !ok(k) {
            i += 1;
            continue;
        }
        if uses.get(&k).copied().unwrap_or(0) > 0 {
            small.0.remove(i);
            uses.insert(k, 0);
            main.push(k);
            continue;
        }
        small.remove(k);
        uses.remove(&k);
        ghost.push(k);
        ghost.trim(cap);
        return Some(k);
    }
    None
}

fn s3_main(
    main: &mut Order,
    uses: &mut HashMap<u64, u64>,
    ok: &dyn Fn(u64) -> bool,
) -> Option<u64> {
    let mut i = 0;
    while i < main.0.len() {
        let k = main.0[i];
        if !ok(k) {
            i += 1;
            continue;
        }
        let u = uses.get(&k).copied().unwrap_or(0);
        if u > 0 {
            uses.insert(k, u - 1);
            main.0.remove(i);
            main.0.push(k);
            continue;
        }
        main.0.remove(i);
        uses.remove(&k);
        return Some(k);
    }
    None
}

#[derive(Debug, Clone)]
enum Op {
    Insert(u64, u32),
    Access(u64),
    Remove(u64),
    Victim(u64),
    Tick(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..24, 0u32..40).prop_map(|(k, d)| Op::Insert(k, d)),
        4 => (0u64..24).prop_map(Op::Access),
        1 => (0u64..24).prop_map(Op::Remove),
        3 => any::<u64>().prop_map(Op::Victim),
        1 => (0u64..50_000).prop_map(Op::Tick),
    ]
}

/// Runs `ops` on the policy under test (keys of type `K`) and on the
/// reference; every answer must agree.
fn check<K: PolicyKey>(
    kind: PolicyKind,
    cap: usize,
    ops: &[Op],
    to: impl Fn(u64) -> K,
    from: impl Fn(K) -> u64,
) -> Result<(), TestCaseError> {
    let ttl = 20_000;
    let config = PolicyConfig {
        ttl_ms: ttl,
        ..PolicyConfig::of(kind)
    };
    let mut tested = config.build::<K>(cap).expect("node policy");
    let mut reference = Reference::new(kind, cap, ttl);
    let mut now = 0u64;
    for op in ops {
        match *op {
            Op::Insert(k, depth) => {
                if !reference.contains(k) {
                    let u = Use {
                        now,
                        depth,
                        next_use: u64::MAX,
                    };
                    tested.insert(to(k), &u);
                    reference.insert(k, now, depth);
                }
            }
            Op::Access(k) => {
                tested.access(to(k), &Use::at(now));
                reference.access(k, now);
            }
            Op::Remove(k) => {
                tested.remove(to(k));
                reference.remove(k);
            }
            Op::Victim(mask) => {
                let ok = |k: u64| (mask >> (k % 64)) & 1 == 1;
                let got = tested.victim(now, &mut |k| ok(from(k)).into());
                let want = reference.victim(now, &ok);
                prop_assert_eq!(got.map(&from), want, "victim after {:?}", op);
            }
            Op::Tick(dt) => {
                now += dt;
                let mut got = Vec::new();
                tested.expired(now, &mut |k| got.push(from(k)));
                prop_assert_eq!(got, reference.expired(now));
            }
        }
        for k in 0..24 {
            prop_assert_eq!(tested.contains(to(k)), reference.contains(k), "key {}", k);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn hashed_keys_match_the_reference(
        kind in prop::sample::select(PolicyKind::NODE.to_vec()),
        cap in 1usize..20,
        ops in prop::collection::vec(op(), 1..200),
    ) {
        check::<u64>(kind, cap, &ops, |k| k, |k| k)?;
    }

    #[test]
    fn dense_keys_match_the_reference(
        kind in prop::sample::select(PolicyKind::NODE.to_vec()),
        cap in 1usize..20,
        ops in prop::collection::vec(op(), 1..200),
    ) {
        check::<u32>(kind, cap, &ops, |k| k as u32, u64::from)?;
    }
}

/// A stop ends the scan: no victim, even though a later key was eligible.
#[test]
fn stop_ends_every_scan() {
    for kind in PolicyKind::NODE {
        let mut p = PolicyConfig::of(kind).build::<u64>(4).expect("node policy");
        for k in 0..4 {
            p.insert(k, &Use::at(0));
        }
        let mut asked = 0;
        let got = p.victim(0, &mut |_| {
            asked += 1;
            Verdict::Stop
        });
        assert_eq!((got, asked), (None, 1), "{kind}");
        assert_eq!(p.len(), 4, "{kind}");
    }
}

/// Leaf-first picks the policy's first leaf, and a parent only when no
/// eligible leaf is left.
#[test]
fn leaf_first_prefers_leaves() {
    for kind in PolicyKind::NODE {
        let mut p = PolicyConfig::of(kind).build::<u64>(8).expect("node policy");
        let mut leaves = LeafFirst::default();
        // A chain 0 <- 1 <- 2 inserted in order: 2 is the only leaf.
        for (k, parent) in [(0, None), (1, Some(0)), (2, Some(1))] {
            p.insert(k, &Use::at(0));
            leaves.entered(parent);
        }
        assert_eq!(
            leaves.victim(&mut *p, 0, &mut |_| Verdict::Evict),
            Some(2),
            "{kind}"
        );
        leaves.left(Some(1));
        assert_eq!(
            leaves.victim(&mut *p, 0, &mut |_| Verdict::Evict),
            Some(1),
            "{kind}"
        );
        leaves.left(Some(0));
        // 0 is not eligible: nothing goes.
        assert_eq!(
            leaves.victim(&mut *p, 0, &mut |k| (k != 0).into()),
            None,
            "{kind}"
        );
    }
}
