//! The replay loop: interning, residency across tiers, hit counting.
//!
//! Each `(instance, prefix key)` is interned once to a dense `u32` id; the
//! intern table also records the id's parent (the previous key of the
//! request that first used it), which makes the table a radix tree over
//! prefix keys with one block per edge (the leaf-aware policy reads it).
//! `tier_of[id]` says which tier holds a block, so finding a request's
//! leading run of hits costs no policy call.
//!
//! Per request: TTL expiry at the request's time; the leading run of held
//! blocks is counted (by the tier each was found in); then every block is
//! applied in order: a block held by tier 0 is a hit there, a block held by
//! a slower tier is promoted (taken out of that tier and inserted into tier
//! 0: tiers are exclusive), any other block is inserted into tier 0. Blocks
//! evicted from tier k are inserted into tier k + 1, and those evicted from
//! the last tier are dropped. Counting before applying is equivalent to
//! counting while applying: the leading run only touches, never inserts.

use hashbrown::HashMap;

use super::stats::{Pow2Counter, Timeline};
use super::{ReplayConfig, RequestOutcome};
use crate::policy::list::NIL;
use crate::policy::{self, Access, Policy, PolicyKind};
use crate::trace::Request;

/// `tier_of` of a block no tier holds.
const NOWHERE: u8 = u8::MAX;

/// Most tiers a replay simulates (`tier_of` is a `u8`, 255 means none).
pub(crate) const MAX_TIERS: usize = 254;

pub(crate) struct Engine {
    index: HashMap<(u32, u128), u32>,
    parent: Vec<u32>,
    tier_of: Vec<u8>,
    next_use_of: Vec<u64>,
    last_pos: Vec<u64>,
    uses: Vec<u32>,
    tiers: Vec<Box<dyn Policy>>,
    caps: Vec<u64>,
    scratch: Vec<Vec<u32>>,
    dropped: Vec<u32>,
    ids: Vec<u32>,
    pos: u64,
    belady: bool,
    keep_outcomes: bool,
    pub(crate) requests: u64,
    pub(crate) requested_blocks: u64,
    pub(crate) hit_blocks: u64,
    pub(crate) tier_hit_blocks: Vec<u64>,
    pub(crate) outcomes: Vec<RequestOutcome>,
    pub(crate) timeline: Timeline,
    pub(crate) reuse: Pow2Counter,
    per_tier: Vec<u32>,
}

impl Engine {
    pub(crate) fn new(cfg: &ReplayConfig, span: Option<(u64, u64)>) -> Self {
        let tiers: Vec<Box<dyn Policy>> = cfg
            .tiers
            .iter()
            .take(MAX_TIERS)
            .enumerate()
            .map(|(k, t)| {
                policy::build(
                    cfg.policy,
                    t.capacity_blocks,
                    cfg.ttl_ms,
                    cfg.seed.wrapping_add(k as u64),
                )
            })
            .collect();
        let n = tiers.len();
        let caps = cfg
            .tiers
            .iter()
            .take(n)
            .map(|t| t.capacity_blocks)
            .collect();
        Engine {
            index: HashMap::new(),
            parent: Vec::new(),
            tier_of: Vec::new(),
            next_use_of: Vec::new(),
            last_pos: Vec::new(),
            uses: Vec::new(),
            tiers,
            caps,
            scratch: vec![Vec::new(); n],
            dropped: Vec::new(),
            ids: Vec::new(),
            pos: 0,
            belady: cfg.policy == PolicyKind::Belady,
            keep_outcomes: cfg.keep_outcomes,
            requests: 0,
            requested_blocks: 0,
            hit_blocks: 0,
            tier_hit_blocks: vec![0; n],
            outcomes: Vec::new(),
            timeline: Timeline::new(cfg.timeline_points, span),
            reuse: Pow2Counter::default(),
            per_tier: vec![0; n],
        }
    }

    /// Distinct blocks seen.
    pub(crate) fn distinct_blocks(&self) -> usize {
        self.parent.len()
    }

    /// Uses per distinct block.
    pub(crate) fn uses(&self) -> &[u32] {
        &self.uses
    }

    /// Block accesses replayed.
    pub(crate) fn accesses(&self) -> u64 {
        self.pos
    }

    /// Replays one request. `next_use[p]` is the position of the next access
    /// to the block accessed at position `p` (Belady only).
    pub(crate) fn step(&mut self, r: &Request, next_use: &[u64]) {
        let now = r.timestamp_ms;
        for t in &mut self.tiers {
            self.dropped.clear();
            t.expire(now, &mut self.dropped);
            for &d in &self.dropped {
                self.tier_of[d as usize] = NOWHERE;
            }
        }

        // Intern, and count the leading run of held blocks.
        let mut ids = std::mem::take(&mut self.ids);
        ids.clear();
        let mut parent = NIL;
        for k in &r.keys {
            let next = self.parent.len() as u32;
            let id = *self.index.entry((r.instance, k.0)).or_insert(next);
            if id == next {
                self.parent.push(parent);
                self.tier_of.push(NOWHERE);
                self.last_pos.push(0);
                self.uses.push(0);
                if self.belady {
                    self.next_use_of.push(u64::MAX);
                }
            }
            ids.push(id);
            parent = id;
        }
        self.per_tier.iter_mut().for_each(|c| *c = 0);
        let mut hits = 0u32;
        for &id in &ids {
            let t = self.tier_of[id as usize];
            if t == NOWHERE {
                break;
            }
            hits += 1;
            self.per_tier[t as usize] += 1;
        }

        // Apply every block.
        for &id in &ids {
            let i = id as usize;
            self.pos += 1;
            if self.uses[i] > 0 {
                self.reuse.add(self.pos - self.last_pos[i]);
            }
            self.uses[i] = self.uses[i].saturating_add(1);
            self.last_pos[i] = self.pos;
            let nu = if self.belady {
                let nu = next_use
                    .get(self.pos as usize - 1)
                    .copied()
                    .unwrap_or(u64::MAX);
                self.next_use_of[i] = nu;
                nu
            } else {
                0
            };
            let a = Access {
                id,
                parent: self.parent[i],
                now_ms: now,
                next_use: nu,
            };
            match self.tier_of[i] {
                0 => self.tiers[0].hit(&a),
                NOWHERE => self.insert_at(0, &a),
                k => {
                    self.tiers[k as usize].remove(id);
                    self.tier_of[i] = NOWHERE;
                    self.insert_at(0, &a);
                }
            }
        }
        for t in &mut self.tiers {
            t.end_request(&ids);
        }

        let n = ids.len() as u32;
        self.requests += 1;
        self.requested_blocks += u64::from(n);
        self.hit_blocks += u64::from(hits);
        for (total, &c) in self.tier_hit_blocks.iter_mut().zip(&self.per_tier) {
            *total += u64::from(c);
        }
        self.timeline.add(now, u64::from(n), u64::from(hits));
        if self.keep_outcomes {
            self.outcomes.push(RequestOutcome {
                timestamp_ms: now,
                instance: r.instance,
                input_tokens: r.input_tokens,
                requested_blocks: n,
                hit_blocks: hits,
                hit_tokens: u32::try_from(r.tokens_in_blocks(hits as usize)).unwrap_or(u32::MAX),
                hit_blocks_per_tier: self.per_tier.clone(),
            });
        }
        self.ids = ids;
    }

    /// Inserts a block into tier `k`, demoting what it evicts.
    fn insert_at(&mut self, k: usize, a: &Access) {
        if k >= self.tiers.len() {
            return;
        }
        let mut evicted = std::mem::take(&mut self.scratch[k]);
        evicted.clear();
        self.tiers[k].insert(a, &mut evicted);
        debug_assert!(
            self.tiers[k].len() as u64 <= self.caps[k],
            "tier {k} over capacity"
        );
        self.tier_of[a.id as usize] = k as u8;
        for &e in &evicted {
            self.tier_of[e as usize] = NOWHERE;
        }
        if k + 1 < self.tiers.len() {
            for &e in &evicted {
                let i = e as usize;
                let next_use = if self.belady { self.next_use_of[i] } else { 0 };
                let d = Access {
                    id: e,
                    parent: self.parent[i],
                    now_ms: a.now_ms,
                    next_use,
                };
                self.insert_at(k + 1, &d);
            }
        }
        self.scratch[k] = evicted;
    }
}
