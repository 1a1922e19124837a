//! The replay against a straightforward model of the node's way of serving
//! requests, on random small traces and tier layouts: the same hits per
//! request and tier, and the same blocks dropped.
//!
//! The model keeps each tier as an LRU list in a plain `Vec` searched
//! linearly, with per-tier child counts, and follows the steps of the
//! replay's documentation directly: hits are the leading run found in any
//! tier; room is made in tier 0 for the hits below it and the new blocks,
//! the hits protected where they were found; victims are the least recent
//! leaf (else the least recent block) and go one tier down unless a copy is
//! there, each chain among them contiguous and root first; hits move up; then the
//! request's blocks no tier holds enter tier 0, in request order (those a
//! tier holds stay there, unused, as the node leaves them). (Every policy against the real manager: `kvtier-bench`'s
//! agreement test; every policy's decisions: `kvtier-policy`'s tests.)

use std::collections::{HashMap, HashSet};

use kvtier_core::BlockHash;
use kvtier_sim::policy::PolicyKind;
use kvtier_sim::replay::{ReplayConfig, TierSpec, replay};
use kvtier_sim::trace::Request;
use proptest::prelude::*;

type Key = (u32, u128);

/// One tier: an LRU list (oldest first) and each key's children present.
#[derive(Default)]
struct LruTier {
    capacity: usize,
    order: Vec<Key>,
    children: HashMap<Key, u32>,
}

impl LruTier {
    fn holds(&self, k: Key) -> bool {
        self.order.contains(&k)
    }

    fn free(&self) -> usize {
        self.capacity - self.order.len()
    }

    fn touch(&mut self, k: Key) {
        if let Some(i) = self.order.iter().position(|x| *x == k) {
            self.order.remove(i);
            self.order.push(k);
        }
    }

    fn insert(&mut self, k: Key, parent: Option<Key>) {
        self.order.push(k);
        if let Some(p) = parent {
            *self.children.entry(p).or_default() += 1;
        }
    }

    fn remove(&mut self, k: Key, parent: Option<Key>) {
        if let Some(i) = self.order.iter().position(|x| *x == k) {
            self.order.remove(i);
            if let Some(c) = parent.and_then(|p| self.children.get_mut(&p)) {
                *c -= 1;
            }
        }
    }

    fn victim(&self, protected: &HashSet<Key>) -> Option<Key> {
        let open = |k: &&Key| !protected.contains(*k);
        let leaf = |k: &&Key| self.children.get(*k).copied().unwrap_or(0) == 0;
        self.order
            .iter()
            .filter(open)
            .find(leaf)
            .or_else(|| self.order.iter().find(open))
            .copied()
    }
}

struct Model {
    tiers: Vec<LruTier>,
    parent: HashMap<Key, Option<Key>>,
    protected: Vec<HashSet<Key>>,
    dropped: u64,
}

impl Model {
    fn new(caps: &[usize]) -> Self {
        Self {
            tiers: caps
                .iter()
                .map(|&capacity| LruTier {
                    capacity,
                    ..LruTier::default()
                })
                .collect(),
            parent: HashMap::new(),
            protected: vec![HashSet::new(); caps.len()],
            dropped: 0,
        }
    }

    fn parent(&self, k: Key) -> Option<Key> {
        self.parent.get(&k).copied().flatten()
    }

    fn fastest(&self, k: Key) -> Option<usize> {
        (0..self.tiers.len()).find(|&t| self.tiers[t].holds(k))
    }

    /// `victims` in the order the node moves them down: every chain among
    /// them contiguous, root first, roots and siblings in victim order.
    fn chain_ordered(&self, victims: &[Key]) -> Vec<Key> {
        let among: HashSet<Key> = victims.iter().copied().collect();
        let mut out = Vec::new();
        for &v in victims {
            if self.parent(v).is_none_or(|p| !among.contains(&p)) {
                self.visit(v, victims, &mut out);
            }
        }
        out
    }

    /// `v`, then its children among `victims`, depth first.
    fn visit(&self, v: Key, victims: &[Key], out: &mut Vec<Key>) {
        out.push(v);
        for &c in victims {
            if self.parent(c) == Some(v) {
                self.visit(c, victims, out);
            }
        }
    }

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
        victims.retain(|v| !self.tiers[t + 1].holds(*v));
        let victims = self.chain_ordered(&victims);
        self.make_room(t + 1, victims.len());
        for v in victims {
            if self.tiers[t + 1].free() > 0 {
                let p = self.parent(v);
                self.tiers[t + 1].insert(v, p);
            } else {
                self.dropped += 1;
            }
        }
    }

    /// Serves one request; its hits per tier.
    fn serve(&mut self, keys: &[Key]) -> Vec<u32> {
        let mut hits = vec![0u32; self.tiers.len()];
        let found: Vec<(Key, usize)> = keys
            .iter()
            .map_while(|k| self.fastest(*k).map(|t| (*k, t)))
            .collect();
        for (_, t) in &found {
            hits[*t] += 1;
        }
        let mut parent = None;
        for k in keys {
            self.parent.entry(*k).or_insert(parent);
            parent = Some(*k);
        }
        let applied = &keys[..keys.len().min(self.tiers[0].capacity)];
        let prefix = &found[..found.len().min(applied.len())];
        for &(k, t) in prefix {
            self.protected[t].insert(k);
        }
        let below = prefix.iter().filter(|(_, t)| *t != 0).count();
        self.make_room(0, below + applied.len() - prefix.len());
        for &(k, t) in prefix {
            if t != 0 {
                let p = self.parent(k);
                self.tiers[t].remove(k, p);
                self.tiers[0].insert(k, p);
            }
        }
        for &(k, _) in prefix {
            self.tiers[0].touch(k);
        }
        self.protected.iter_mut().for_each(HashSet::clear);
        for &k in &applied[prefix.len()..] {
            if self.fastest(k).is_none() {
                let p = self.parent(k);
                self.tiers[0].insert(k, p);
            }
        }
        hits
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn lru_replay_matches_the_model(
        raw in prop::collection::vec(arb_request(), 1..60),
        caps in prop::collection::vec(1usize..6, 1..4),
    ) {
        let trace = build_trace(&raw);
        let tiers = caps
            .iter()
            .enumerate()
            .map(|(i, c)| TierSpec::new(format!("G{}", i + 1), *c as u64))
            .collect();
        let mut cfg = ReplayConfig::tiered(PolicyKind::Lru, tiers);
        cfg.keep_outcomes = true;
        let r = replay(&trace, &cfg);
        let mut model = Model::new(&caps);
        for (req, got) in trace.iter().zip(&r.outcomes) {
            let keys: Vec<Key> = req.keys.iter().map(|k| (req.instance, k.0)).collect();
            prop_assert_eq!(&got.hit_blocks_per_tier, &model.serve(&keys));
        }
        prop_assert_eq!(r.dropped_blocks, model.dropped);
    }
}
