//! The replay loop: interning, residency across tiers, hit counting.
//!
//! Each `(instance, prefix key)` is interned once to a dense `u32` id; the
//! intern table also records the id's parent (the previous key of the
//! request that first used it), which makes the table a radix tree over
//! prefix keys with one block per edge (the leaf-first filter reads it).
//! `held[id]` says which tiers hold a block (a bit per tier), so finding a
//! request's leading run of hits costs no policy call. Tiers are exclusive
//! as the node's are: a block moves down when evicted and up when hit, and
//! sits in one tier at a time (a block some tier holds is not stored
//! again: the node answers a client's `Reserve` of it `AlreadyStored`).
//!
//! A request is served the way the node's block manager serves it (see
//! `replay` for the rules), so the optimizer's hit rates are the node's:
//!
//! 1. TTL expiry at the request's time, in every tier;
//! 2. the leading run of held blocks is the request's hit (counted by the
//!    fastest tier each was found in); only the first `capacity(tier 0)`
//!    blocks are applied, as the node's top tier (G2) cannot hold more of
//!    one request;
//! 3. hits in tier 0 are used twice (the manager takes a handle when it
//!    matches the prefix and another when it plans the onboarding); room
//!    is made in tier 0 for the hits below it and the new blocks, with the
//!    request's hits protected (in the tier they were found in): victims
//!    are chosen by the tier's policy, leaves first, and go one tier down
//!    (which makes room there first the same way) unless that tier already
//!    holds them; the last tier drops them;
//! 4. hits below tier 0 move to tier 0 from the tier they were found in,
//!    fastest source tier first, each tier's in request order (the order
//!    the manager settles an onboarding's blocks in, whichever of its
//!    loads lands first); then every hit is used once more, in request order (the handles the
//!    onboarding returns);
//! 5. the blocks after the hit run that no tier holds enter tier 0; those
//!    some tier holds (after a gap in the run) stay where they are, unused,
//!    as the node's `reserve_host` leaves them.
//!
//! The number of uses matters to the counting policies (LFU, S3-FIFO,
//! cost-aware) and the order to the recency ones; the agreement test in
//! `kvtier-bench` holds this model to the manager.

use hashbrown::HashMap;
use kvtier_policy::{EvictionPolicy, LeafFirst, Use, Verdict};

use super::stats::{Pow2Counter, Timeline};
use super::{ReplayConfig, RequestOutcome};
use crate::policy::{self, NIL};
use crate::trace::Request;

/// Most tiers a replay simulates (`held` has a bit per tier).
pub(crate) const MAX_TIERS: usize = 64;

/// One tier: its policy, its resident-children counts and its fill.
struct TierState {
    policy: Box<dyn EvictionPolicy<u32>>,
    leaves: LeafFirst<u32>,
    capacity: usize,
    len: usize,
    /// The victims of a `make_room` in flight (kept to reuse its memory).
    victims: Vec<u32>,
}

/// Per-block state, by id.
#[derive(Default)]
struct Blocks {
    parent: Vec<u32>,
    /// Tiers holding the block, a bit per tier.
    held: Vec<u64>,
    /// Position in its sequence as the holding tier counts it (the
    /// cost-aware policy's depth).
    depth: Vec<u32>,
    /// The request that protects the block from eviction right now, and
    /// the tier it protects it in.
    guard: Vec<(u64, u8)>,
    next_use: Vec<u64>,
    last_pos: Vec<u64>,
    uses: Vec<u32>,
}

impl Blocks {
    fn push(&mut self, parent: u32) {
        self.parent.push(parent);
        self.held.push(0);
        self.depth.push(0);
        self.guard.push((0, 0));
        self.next_use.push(u64::MAX);
        self.last_pos.push(0);
        self.uses.push(0);
    }

    fn parent_of(&self, id: u32) -> Option<u32> {
        Some(self.parent[id as usize]).filter(|p| *p != NIL)
    }

    /// The fastest tier holding `id`.
    fn fastest(&self, id: u32) -> Option<usize> {
        let h = self.held[id as usize];
        (h != 0).then(|| h.trailing_zeros() as usize)
    }

    fn holds(&self, t: usize, id: u32) -> bool {
        self.held[id as usize] & (1 << t) != 0
    }
}

pub(crate) struct Engine {
    index: HashMap<(u32, u128), u32>,
    blocks: Blocks,
    tiers: Vec<TierState>,
    leaf_first: bool,
    request_no: u64,
    scratch: Vec<u32>,
    ids: Vec<u32>,
    pos: u64,
    future: bool,
    keep_outcomes: bool,
    pub(crate) requests: u64,
    pub(crate) requested_blocks: u64,
    pub(crate) hit_blocks: u64,
    pub(crate) tier_hit_blocks: Vec<u64>,
    pub(crate) dropped_blocks: u64,
    pub(crate) outcomes: Vec<RequestOutcome>,
    pub(crate) timeline: Timeline,
    pub(crate) reuse: Pow2Counter,
    per_tier: Vec<u32>,
}

impl Engine {
    pub(crate) fn new(cfg: &ReplayConfig, span: Option<(u64, u64)>) -> Self {
        let tiers: Vec<TierState> = cfg
            .tiers
            .iter()
            .take(MAX_TIERS)
            .enumerate()
            .map(|(k, t)| TierState {
                policy: policy::build(
                    cfg.policy,
                    t.capacity_blocks,
                    cfg.ttl_ms,
                    cfg.seed.wrapping_add(k as u64),
                ),
                leaves: LeafFirst::default(),
                capacity: usize::try_from(t.capacity_blocks).unwrap_or(usize::MAX),
                len: 0,
                victims: Vec::new(),
            })
            .collect();
        let n = tiers.len();
        Engine {
            index: HashMap::new(),
            blocks: Blocks::default(),
            tiers,
            leaf_first: cfg.leaf_first,
            request_no: 0,
            scratch: Vec::new(),
            ids: Vec::new(),
            pos: 0,
            future: cfg.policy.needs_future(),
            keep_outcomes: cfg.keep_outcomes,
            requests: 0,
            requested_blocks: 0,
            hit_blocks: 0,
            tier_hit_blocks: vec![0; n],
            dropped_blocks: 0,
            outcomes: Vec::new(),
            timeline: Timeline::new(cfg.timeline_points, span),
            reuse: Pow2Counter::default(),
            per_tier: vec![0; n],
        }
    }

    /// Distinct blocks seen.
    pub(crate) fn distinct_blocks(&self) -> usize {
        self.blocks.parent.len()
    }

    /// Uses per distinct block.
    pub(crate) fn uses(&self) -> &[u32] {
        &self.blocks.uses
    }

    /// Block accesses replayed.
    pub(crate) fn accesses(&self) -> u64 {
        self.pos
    }

    /// Replays one request. `next_use[p]` is the position of the next access
    /// to the block accessed at position `p` (Belady only).
    pub(crate) fn step(&mut self, r: &Request, next_use: &[u64]) {
        let now = r.timestamp_ms;
        self.request_no += 1;
        self.expire(now);
        let mut ids = std::mem::take(&mut self.ids);
        self.intern(r, &mut ids);
        let hits = self.count_hits(&ids);
        self.record_accesses(&ids, next_use);
        if !self.tiers.is_empty() {
            let applied = ids.len().min(self.tiers[0].capacity);
            self.serve(&ids[..applied], hits.min(applied), now);
        }
        self.record_request(r, ids.len() as u32, hits as u32);
        self.ids = ids;
    }

    /// Drops what every tier's policy reports expired at `now`.
    fn expire(&mut self, now: u64) {
        for t in 0..self.tiers.len() {
            let mut expired = std::mem::take(&mut self.scratch);
            expired.clear();
            self.tiers[t]
                .policy
                .expired(now, &mut |id| expired.push(id));
            for &id in &expired {
                self.take_out(t, id);
                self.dropped_blocks += 1;
            }
            self.scratch = expired;
        }
    }

    fn intern(&mut self, r: &Request, ids: &mut Vec<u32>) {
        ids.clear();
        let mut parent = NIL;
        for k in &r.keys {
            let next = self.blocks.parent.len() as u32;
            let id = *self.index.entry((r.instance, k.0)).or_insert(next);
            if id == next {
                self.blocks.push(parent);
            }
            ids.push(id);
            parent = id;
        }
    }

    /// The leading run of held blocks, counted per tier in `per_tier`.
    fn count_hits(&mut self, ids: &[u32]) -> usize {
        self.per_tier.iter_mut().for_each(|c| *c = 0);
        let mut hits = 0;
        for &id in ids {
            let Some(t) = self.blocks.fastest(id) else {
                break;
            };
            hits += 1;
            self.per_tier[t] += 1;
        }
        hits
    }

    /// Reuse distances, use counts and (Belady) next uses of every access.
    fn record_accesses(&mut self, ids: &[u32], next_use: &[u64]) {
        let b = &mut self.blocks;
        for &id in ids {
            let i = id as usize;
            self.pos += 1;
            if b.uses[i] > 0 {
                self.reuse.add(self.pos - b.last_pos[i]);
            }
            b.uses[i] = b.uses[i].saturating_add(1);
            b.last_pos[i] = self.pos;
            if self.future {
                b.next_use[i] = next_use
                    .get(self.pos as usize - 1)
                    .copied()
                    .unwrap_or(u64::MAX);
            }
        }
    }

    /// Steps 3 to 5 of the module docs for the applied blocks `ids`, of
    /// which the first `hits` are held.
    fn serve(&mut self, ids: &[u32], hits: usize, now: u64) {
        let (prefix, rest) = ids.split_at(hits);
        let mut below = 0;
        for &id in prefix {
            let t = self.blocks.fastest(id).unwrap_or(0);
            self.blocks.guard[id as usize] = (self.request_no, t as u8);
            if t != 0 {
                below += 1;
            }
        }
        for _matched_then_planned in 0..2 {
            for &id in prefix {
                if self.blocks.holds(0, id) {
                    self.use_in_top(id, now);
                }
            }
        }
        self.make_room(0, below + rest.len(), now);
        // The manager loads one batch per source tier and settles the
        // blocks in tier 0 fastest source first, each source's in request
        // order, whichever load lands first (`MoveHooks::stage_ordered`).
        for source in 1..self.tiers.len() {
            for &id in prefix {
                if self.blocks.fastest(id) == Some(source) {
                    self.take_out(source, id);
                    self.put_in(0, id, now);
                }
            }
        }
        for &id in prefix {
            self.use_in_top(id, now);
        }
        for &id in rest {
            if self.blocks.fastest(id).is_none() {
                self.put_in(0, id, now);
            }
        }
    }

    /// Frees `n` places in tier `t`: victims go one tier down, which makes
    /// room first; the last tier drops them.
    fn make_room(&mut self, t: usize, n: usize, now: u64) {
        let free = self.tiers[t].capacity.saturating_sub(self.tiers[t].len);
        if free >= n {
            return;
        }
        let mut victims = std::mem::take(&mut self.tiers[t].victims);
        victims.clear();
        for _ in 0..n - free {
            let Some(v) = self.victim(t, now) else { break };
            self.take_out(t, v);
            victims.push(v);
        }
        if t + 1 == self.tiers.len() {
            self.dropped_blocks += victims.len() as u64;
        } else {
            // A copy already below: the victim leaves for free.
            victims.retain(|v| !self.blocks.holds(t + 1, *v));
            self.chain_order(&mut victims);
            self.make_room(t + 1, victims.len(), now);
            for &v in &victims {
                if self.tiers[t + 1].len < self.tiers[t + 1].capacity {
                    self.put_in(t + 1, v, now);
                } else {
                    self.dropped_blocks += 1;
                }
            }
        }
        self.tiers[t].victims = victims;
    }

    /// Puts `victims` in the order the node's block manager moves them
    /// down (`kvtier_core::chain_order`): each prefix chain contiguous,
    /// root first, so the tier below takes them in the same order.
    fn chain_order(&self, victims: &mut Vec<u32>) {
        if victims.len() < 2 {
            return;
        }
        let at: HashMap<u32, usize> = victims.iter().enumerate().map(|(i, v)| (*v, i)).collect();
        let up: Vec<Option<usize>> = victims
            .iter()
            .map(|v| self.blocks.parent_of(*v).and_then(|p| at.get(&p).copied()))
            .collect();
        let order = kvtier_core::chain_order::preorder(&up);
        let moved: Vec<u32> = order.iter().map(|&i| victims[i]).collect();
        *victims = moved;
    }

    /// Tier `t`'s next victim among the blocks no request protects.
    fn victim(&mut self, t: usize, now: u64) -> Option<u32> {
        let guard = &self.blocks.guard;
        let protected = (self.request_no, t as u8);
        let mut eligible = |id: u32| Verdict::from(guard[id as usize] != protected);
        let tier = &mut self.tiers[t];
        if self.leaf_first {
            tier.leaves.victim(&mut *tier.policy, now, &mut eligible)
        } else {
            tier.policy.victim(now, &mut eligible)
        }
    }

    /// Takes `id` out of tier `t` (the policy has already forgotten it if
    /// it chose it as a victim).
    fn take_out(&mut self, t: usize, id: u32) {
        let parent = self.blocks.parent_of(id);
        let tier = &mut self.tiers[t];
        tier.policy.remove(id);
        if self.leaf_first {
            tier.leaves.left(parent);
        }
        tier.len -= 1;
        self.blocks.held[id as usize] &= !(1 << t);
    }

    /// Puts `id` into tier `t`, which has room.
    fn put_in(&mut self, t: usize, id: u32, now: u64) {
        let parent = self.blocks.parent_of(id);
        let depth = match parent {
            Some(p) if self.blocks.holds(t, p) => self.blocks.depth[p as usize] + 1,
            _ => 0,
        };
        self.blocks.depth[id as usize] = depth;
        self.blocks.held[id as usize] |= 1 << t;
        let u = Use {
            depth,
            ..self.use_of(id, now)
        };
        let tier = &mut self.tiers[t];
        tier.policy.insert(id, &u);
        if self.leaf_first {
            tier.leaves.entered(parent);
        }
        tier.len += 1;
    }

    /// A use of `id` in tier 0.
    fn use_in_top(&mut self, id: u32, now: u64) {
        let u = self.use_of(id, now);
        self.tiers[0].policy.access(id, &u);
    }

    fn use_of(&self, id: u32, now: u64) -> Use {
        Use {
            now,
            depth: 0,
            next_use: self.blocks.next_use[id as usize],
        }
    }

    fn record_request(&mut self, r: &Request, n: u32, hits: u32) {
        let now = r.timestamp_ms;
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
    }
}
