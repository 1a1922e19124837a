//! `kvtier bench trace` against an independent model, on the real
//! conversation trace.
//!
//! Configuration where the manager's behaviour is exactly LRU per tier:
//! exclusive cascade, LRU in every tier, admission off (`admit_after` 0),
//! no watermark pre-offload (`watermarks: None`, so `step` never moves a
//! block), room made on demand only; G1 large enough for the longest
//! request (256 blocks), G2 2048, G3 2048 blocks, so all three tiers
//! evict and G3 drops (a second run adds G4, in a directory, below G3).
//! Under it the model below is a plain LRU list per
//! tier with the manager's two documented refinements: victims are chosen
//! leaves first (the least recent block none of whose children sits in
//! the same tier, else the least recent block), and a request's own
//! prefix is protected while room is made for it. The test fails (does
//! not skip) when `../shared` is missing.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use kvtier_core::BlockHash;
use kvtier_manager::Tier;
use kvtier_manager::placement::CascadeMode;
use kvtier_manager::policy::PolicyKind;
use kvtier_manager::trace_bench::{self, TraceBenchConfig};

const TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/traces/mooncake_conversation_trace.jsonl"
);

/// One tier of the model: an LRU list (oldest first) and the count of
/// each block's children present in the tier.
#[derive(Default)]
struct LruTier {
    capacity: usize,
    order: Vec<BlockHash>,
    children: HashMap<BlockHash, u32>,
}

impl LruTier {
    fn holds(&self, h: BlockHash) -> bool {
        self.order.contains(&h)
    }

    fn free(&self) -> usize {
        self.capacity - self.order.len()
    }

    fn touch(&mut self, h: BlockHash) {
        if let Some(i) = self.order.iter().position(|x| *x == h) {
            self.order.remove(i);
            self.order.push(h);
        }
    }

    fn insert(&mut self, h: BlockHash, parent: Option<BlockHash>) {
        self.order.push(h);
        if let Some(p) = parent {
            *self.children.entry(p).or_default() += 1;
        }
    }

    fn remove(&mut self, h: BlockHash, parent: Option<BlockHash>) {
        if let Some(i) = self.order.iter().position(|x| *x == h) {
            self.order.remove(i);
            if let Some(p) = parent
                && let Some(c) = self.children.get_mut(&p)
            {
                *c -= 1;
            }
        }
    }

    /// The least recent unprotected leaf, else the least recent
    /// unprotected block.
    fn victim(&self, protected: &HashSet<BlockHash>) -> Option<BlockHash> {
        let open = |h: &&BlockHash| !protected.contains(*h);
        let leaf = |h: &&BlockHash| self.children.get(*h).copied().unwrap_or(0) == 0;
        self.order
            .iter()
            .filter(open)
            .find(leaf)
            .or_else(|| self.order.iter().find(open))
            .copied()
    }
}

/// LRU tiers with an exclusive cascade.
struct Model {
    tiers: Vec<LruTier>,
    parent: HashMap<BlockHash, Option<BlockHash>>,
    protected: Vec<HashSet<BlockHash>>,
    hits: Vec<u64>,
    misses: u64,
    dropped: u64,
}

impl Model {
    fn new(caps: &[usize]) -> Self {
        Self {
            tiers: caps
                .iter()
                .map(|&c| LruTier {
                    capacity: c,
                    ..LruTier::default()
                })
                .collect(),
            parent: HashMap::new(),
            protected: vec![HashSet::new(); caps.len()],
            hits: vec![0; caps.len()],
            misses: 0,
            dropped: 0,
        }
    }

    fn parent(&self, h: BlockHash) -> Option<BlockHash> {
        self.parent.get(&h).copied().flatten()
    }

    fn fastest(&self, h: BlockHash) -> Option<usize> {
        (0..self.tiers.len()).find(|&t| self.tiers[t].holds(h))
    }

    /// Frees `n` slots of tier `t`: victims go one tier down, which makes
    /// room first; the last tier drops them.
    fn make_room(&mut self, t: usize, n: usize) {
        let free = self.tiers[t].free();
        if free >= n {
            return;
        }
        let mut victims = Vec::new();
        for _ in 0..n - free {
            let Some(v) = self.tiers[t].victim(&self.protected[t]) else {
                break;
            };
            let p = self.parent(v);
            self.tiers[t].remove(v, p);
            victims.push(v);
        }
        if t + 1 == self.tiers.len() {
            self.dropped += victims.len() as u64;
            return;
        }
        let going: Vec<BlockHash> = victims
            .into_iter()
            .filter(|v| !self.tiers[t + 1].holds(*v))
            .collect();
        self.make_room(t + 1, going.len());
        for v in going {
            assert!(self.tiers[t + 1].free() > 0, "model: no room below");
            let p = self.parent(v);
            self.tiers[t + 1].insert(v, p);
        }
    }

    fn serve(&mut self, keys: &[BlockHash]) {
        let prefix: Vec<(BlockHash, usize)> = keys
            .iter()
            .map_while(|h| self.fastest(*h).map(|t| (*h, t)))
            .collect();
        for (_, t) in &prefix {
            self.hits[*t] += 1;
        }
        self.misses += (keys.len() - prefix.len()) as u64;
        for &(h, t) in &prefix {
            if t == 0 {
                self.tiers[0].touch(h);
            }
            self.protected[t].insert(h);
        }
        let below = prefix.iter().filter(|(_, t)| *t != 0).count();
        self.make_room(0, below + keys.len() - prefix.len());
        for &(h, t) in &prefix {
            if t != 0 {
                let p = self.parent(h);
                self.tiers[t].remove(h, p);
                self.tiers[0].insert(h, p);
            }
        }
        for &(h, _) in &prefix {
            self.tiers[0].touch(h);
        }
        self.protected.iter_mut().for_each(HashSet::clear);
        for i in prefix.len()..keys.len() {
            let h = keys[i];
            let p = i.checked_sub(1).map(|j| keys[j]);
            if self.tiers[0].holds(h) {
                self.tiers[0].touch(h);
            } else {
                self.parent.insert(h, p);
                self.tiers[0].insert(h, p);
            }
        }
    }
}

/// Runs the bench and the model over the first `requests` requests with
/// tier capacities `caps` (G1, G2, G3 and, when given, G4 in a directory)
/// and checks they agree block for block.
async fn bench_equals_model(requests: usize, caps: &[usize]) {
    let trace = PathBuf::from(TRACE);
    assert!(
        trace.exists(),
        "the conversation trace is missing at {} (../shared must be checked out next to the repository)",
        trace.display()
    );
    let config = TraceBenchConfig {
        trace: trace.clone(),
        requests: Some(requests),
        layers: 2,
        layer_bytes: 4096,
        g1_blocks: caps[0],
        g2_blocks: caps[1],
        g3_blocks: caps[2],
        g4_blocks: caps.get(3).copied().unwrap_or(0),
        policy: PolicyKind::Lru,
        mode: CascadeMode::Exclusive,
        admit_after: 0,
        watermarks: None,
        ..TraceBenchConfig::default()
    };
    let report = trace_bench::run(&config).await.expect("trace bench");

    let mut model = Model::new(caps);
    let mut blocks = 0u64;
    for r in kvtier_sim::trace::read_all(&trace, None)
        .expect("trace")
        .into_iter()
        .take(requests)
    {
        let keys = &r.keys[..r.keys.len().min(caps[0])];
        blocks += keys.len() as u64;
        model.serve(keys);
    }

    let tiers = &Tier::ALL[..caps.len()];
    assert_eq!(report.requests, requests);
    assert_eq!(report.blocks, blocks);
    let hits: Vec<(Tier, u64)> = tiers.iter().copied().zip(model.hits.clone()).collect();
    assert_eq!(report.hits, hits, "hits per tier: manager vs model");
    assert_eq!(report.misses, model.misses, "misses");
    assert!(
        model.hits.iter().all(|h| *h > 0) && model.dropped > 0,
        "the configuration exercises every tier: {:?}, dropped {}",
        model.hits,
        model.dropped
    );
    assert_eq!(
        report.stats.dropped, model.dropped,
        "blocks dropped from the last tier"
    );
    for (i, t) in tiers.iter().copied().enumerate() {
        let s = report.stats.tier(t).expect("tier configured");
        assert_eq!(
            s.pool.capacity - s.pool.free,
            model.tiers[i].order.len(),
            "{t} occupancy"
        );
        // Room is always made ahead, so allocation never had to evict.
        assert_eq!(s.pool.evictions, 0, "{t} evictions by allocation");
    }
    assert_eq!(report.verify_failures, 0);
    assert_eq!(report.onboard_failures, 0);
    assert!(report.verified_blocks > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_hit_rates_equal_an_lru_model() {
    bench_equals_model(300, &[256, 2048, 2048]).await;
}

/// The same with a fourth tier: G3 cascades into G4 (objects in a
/// directory through the remote tier) and G4 drops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_hit_rates_with_g4_equal_an_lru_model() {
    bench_equals_model(300, &[256, 2048, 1024, 1024]).await;
}
