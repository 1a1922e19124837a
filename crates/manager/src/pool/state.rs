//! A pool's bookkeeping: which slot holds what, the hash index, the child
//! counts and the eviction policy. Everything here runs under the pool's
//! lock and does no I/O.
//!
//! Invariants (checked by
//! [`BlockPool::check_invariants`](super::BlockPool::check_invariants) in tests):
//! 1. Every slot is in exactly one of `free` (and `Slot::Free`) or a
//!    non-free state.
//! 2. `by_hash` maps exactly the hashes of `Incoming` and `Registered`
//!    slots, each to its slot.
//! 3. The policy tracks exactly the Registered slots that are not leaving.
//! 4. `children[h]` counts the Registered, non-leaving slots whose parent
//!    is `h`.
//! 5. Eviction only takes Registered slots with no reference, no pin, no
//!    outgoing copy and not leaving.
//! 6. `leaving` and `evictable` count the leaving and the evictable
//!    Registered slots.

use std::sync::Arc;

use kvtier_core::BlockHash;

use super::config::PoolConfig;
use super::{PoolError, PoolEvent, PoolStats, TierBytes};
use crate::Tier;
use crate::block::BlockError;
use kvtier_core::BlockHashMap;
use kvtier_policy::{EvictionPolicy, LeafFirst, Use, Verdict};

/// Index of a block slot in its tier's pool.
pub type SlotId = u32;

/// A registered block's bookkeeping.
#[derive(Debug, Clone)]
struct Registered {
    hash: BlockHash,
    parent: Option<BlockHash>,
    depth: u32,
    /// Live immutable handles.
    refs: u32,
    /// Explicit pins.
    pins: u32,
    /// Transfers reading this block right now.
    outgoing: u32,
    /// Chosen by the planner to leave the tier once its copy below is
    /// done; out of the policy, still readable.
    leaving: bool,
}

/// What one slot holds.
#[derive(Debug, Clone)]
enum Slot {
    Free,
    /// Owned by a mutable handle.
    Mutable,
    /// A transfer is filling it; not readable until it finishes.
    Incoming {
        hash: BlockHash,
        parent: Option<BlockHash>,
    },
    Registered(Registered),
}

/// How a hash is present in a tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// Registered and readable.
    Ready,
    /// Being transferred in; not readable yet.
    Filling,
}

/// The outcome of registering a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Registration {
    /// The block's own slot now holds the registered block.
    New(SlotId),
    /// The hash was already registered in another slot, which gained a
    /// reference; the duplicate's slot was freed.
    Existing(SlotId),
}

/// The state of one tier's pool.
pub struct PoolState {
    tier: Tier,
    config: PoolConfig,
    slots: Vec<Slot>,
    free: Vec<SlotId>,
    by_hash: BlockHashMap<SlotId>,
    children: LeafFirst<BlockHash>,
    policy: Box<dyn EvictionPolicy<BlockHash>>,
    events: Vec<PoolEvent>,
    /// The tier's storage, told of each block that leaves (G2's arena).
    bytes: Option<Arc<dyn TierBytes>>,
    stats: PoolStats,
    /// Registered blocks marked leaving (kept as a count so the planner
    /// need not scan).
    leaving: usize,
    /// Registered blocks eviction may take (rule 5), so allocation knows
    /// whether it can succeed without scanning the slots.
    evictable: usize,
}

impl std::fmt::Debug for PoolState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolState")
            .field("tier", &self.tier)
            .field("capacity", &self.slots.len())
            .field("free", &self.free.len())
            .field("policy", &self.policy.kind())
            .finish()
    }
}

impl PoolState {
    pub(crate) fn new(
        tier: Tier,
        config: PoolConfig,
        policy: Box<dyn EvictionPolicy<BlockHash>>,
    ) -> Self {
        let capacity = config.capacity_blocks;
        // Reversed so slot 0 is handed out first; the order is cosmetic.
        let free = (0..capacity as SlotId).rev().collect();
        Self {
            tier,
            slots: vec![Slot::Free; capacity],
            free,
            by_hash: BlockHashMap::default(),
            children: LeafFirst::default(),
            policy,
            events: Vec::new(),
            bytes: None,
            stats: PoolStats::default(),
            leaving: 0,
            evictable: 0,
            config,
        }
    }

    /// See [`BlockPool::attach_bytes`](super::BlockPool::attach_bytes).
    pub(crate) fn attach_bytes(&mut self, bytes: Arc<dyn TierBytes>) {
        self.bytes = Some(bytes);
    }

    pub(crate) fn config(&self) -> &PoolConfig {
        &self.config
    }

    fn registered(&self, slot: SlotId) -> Option<&Registered> {
        match self.slots.get(slot as usize) {
            Some(Slot::Registered(r)) => Some(r),
            _ => None,
        }
    }

    /// Applies `f` to the registered block in `slot` (`None` if the slot
    /// holds none), keeping the count of evictable blocks current: every
    /// change to a registered block goes through here.
    fn update<R>(&mut self, slot: SlotId, f: impl FnOnce(&mut Registered) -> R) -> Option<R> {
        let Some(Slot::Registered(r)) = self.slots.get_mut(slot as usize) else {
            return None;
        };
        let before = Self::evictable(r);
        let out = f(r);
        let after = Self::evictable(r);
        match (before, after) {
            (false, true) => self.evictable += 1,
            (true, false) => self.evictable -= 1,
            _ => {}
        }
        Some(out)
    }

    fn event(&mut self, event: PoolEvent) {
        if self.config.record_events {
            self.events.push(event);
        }
    }

    pub(crate) fn drain_events(&mut self) -> Vec<PoolEvent> {
        std::mem::take(&mut self.events)
    }

    pub(crate) fn drain_events_into(&mut self, out: &mut Vec<PoolEvent>) {
        out.append(&mut self.events);
    }

    // ---- allocation and eviction -------------------------------------

    /// Whether a registered block may be evicted now (rule 5).
    fn evictable(r: &Registered) -> bool {
        r.refs == 0 && r.pins == 0 && r.outgoing == 0 && !r.leaving
    }

    /// Asks the policy for a victim: a leaf first, any evictable block if
    /// every evictable block has resident children.
    fn choose_victim(&mut self, now: u64) -> Option<SlotId> {
        let slots = &self.slots;
        let by_hash = &self.by_hash;
        let mut evictable = |h: BlockHash| -> Verdict {
            by_hash
                .get(&h)
                .is_some_and(
                    |s| matches!(&slots[*s as usize], Slot::Registered(r) if Self::evictable(r)),
                )
                .into()
        };
        let key = self
            .children
            .victim(&mut *self.policy, now, &mut evictable)?;
        self.by_hash.get(&key).copied()
    }

    /// Counts a block as a resident child of its parent (`delta` 1), or
    /// stops counting it (-1).
    fn count_child(&mut self, parent: Option<BlockHash>, delta: i64) {
        if delta > 0 {
            self.children.entered(parent);
        } else {
            self.children.left(parent);
        }
    }

    /// Removes a registered block from the tier; its slot becomes free.
    fn drop_registered(&mut self, slot: SlotId, was_counted: bool) {
        let old = std::mem::replace(&mut self.slots[slot as usize], Slot::Free);
        if let Slot::Registered(r) = old {
            if Self::evictable(&r) {
                self.evictable -= 1;
            }
            self.by_hash.remove(&r.hash);
            // Under the lock: nobody can book the hash again before its
            // old bytes are gone.
            if let Some(bytes) = &self.bytes {
                bytes.forget(r.hash);
            }
            if was_counted {
                self.count_child(r.parent, -1);
            }
            self.event(PoolEvent::Removed {
                tier: self.tier,
                hash: r.hash,
            });
        }
        self.free.push(slot);
    }

    /// Evicts one block chosen by the policy; `None` if none may go.
    fn evict_one(&mut self, now: u64) -> Option<SlotId> {
        let slot = self.choose_victim(now)?;
        self.drop_registered(slot, true);
        self.stats.evictions += 1;
        self.free.pop()
    }

    /// Takes `n` slots, evicting inactive blocks when no slot is free; all
    /// or nothing: fails without evicting when `n` cannot be had.
    pub(crate) fn allocate(&mut self, n: usize, now: u64) -> Result<Vec<SlotId>, PoolError> {
        self.check_available(n)?;
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let Some(slot) = self.take_slot(now) else {
                for s in out.drain(..) {
                    self.slots[s as usize] = Slot::Free;
                    self.free.push(s);
                }
                return Err(self.exhausted(n));
            };
            out.push(slot);
        }
        self.stats.allocations += n as u64;
        Ok(out)
    }

    /// [`allocate`](Self::allocate) of one slot, without a `Vec` (the hot
    /// path of every incoming block).
    fn allocate_one(&mut self, now: u64) -> Result<SlotId, PoolError> {
        self.check_available(1)?;
        let slot = self.take_slot(now).ok_or_else(|| self.exhausted(1))?;
        self.stats.allocations += 1;
        Ok(slot)
    }

    /// Whether `n` slots can be had now (free, or by eviction when the
    /// pool evicts on allocation).
    fn check_available(&self, n: usize) -> Result<(), PoolError> {
        if self.free.len() >= n {
            return Ok(());
        }
        let available = if self.config.evict_on_allocate {
            self.available()
        } else {
            self.free.len()
        };
        if available < n {
            return Err(PoolError::Exhausted {
                tier: self.tier,
                wanted: n,
                available,
            });
        }
        Ok(())
    }

    /// A free slot, or one the policy evicts, made `Mutable`. Counted by
    /// [`check_available`](Self::check_available): `None` only if the
    /// policy lost track of a block (a bug), which callers report rather
    /// than panic.
    fn take_slot(&mut self, now: u64) -> Option<SlotId> {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => self.evict_one(now)?,
        };
        self.slots[slot as usize] = Slot::Mutable;
        Some(slot)
    }

    fn exhausted(&self, wanted: usize) -> PoolError {
        PoolError::Exhausted {
            tier: self.tier,
            wanted,
            available: self.free.len(),
        }
    }

    /// Returns a mutable handle's slot.
    pub(crate) fn free_mutable(&mut self, slot: SlotId) {
        if matches!(self.slots.get(slot as usize), Some(Slot::Mutable)) {
            self.slots[slot as usize] = Slot::Free;
            self.free.push(slot);
        }
    }

    // ---- registration ------------------------------------------------

    fn depth_after(&self, parent: Option<BlockHash>) -> u32 {
        parent
            .and_then(|p| self.by_hash.get(&p))
            .and_then(|s| self.registered(*s))
            .map_or(0, |r| r.depth + 1)
    }

    /// Makes `slot` (Mutable or Incoming) a registered block with one
    /// reference. `by_hash` must already map `hash` to `slot` (an Incoming
    /// slot is mapped from its start; `register` maps a Mutable one).
    fn make_registered(
        &mut self,
        slot: SlotId,
        hash: BlockHash,
        parent: Option<BlockHash>,
        now: u64,
    ) {
        let depth = self.depth_after(parent);
        self.slots[slot as usize] = Slot::Registered(Registered {
            hash,
            parent,
            depth,
            refs: 1,
            pins: 0,
            outgoing: 0,
            leaving: false,
        });
        self.count_child(parent, 1);
        self.policy.insert(
            hash,
            &Use {
                now,
                depth,
                next_use: u64::MAX,
            },
        );
        self.event(PoolEvent::Stored {
            tier: self.tier,
            hash,
        });
    }

    /// Registers the Complete block in `slot` (held by a mutable handle),
    /// deduplicating by hash.
    pub(crate) fn register(
        &mut self,
        slot: SlotId,
        hash: BlockHash,
        parent: Option<BlockHash>,
        now: u64,
    ) -> Result<Registration, BlockError> {
        if let Some(&existing) = self.by_hash.get(&hash) {
            if self.update(existing, |r| r.refs += 1).is_none() {
                return Err(BlockError::InFlight(hash));
            }
            self.policy.access(hash, &Use::at(now));
            self.free_mutable(slot);
            self.stats.dedup_hits += 1;
            return Ok(Registration::Existing(existing));
        }
        self.by_hash.insert(hash, slot);
        self.make_registered(slot, hash, parent, now);
        Ok(Registration::New(slot))
    }

    /// A new reference to the registered, readable block `hash`.
    pub(crate) fn acquire(&mut self, hash: BlockHash, now: u64) -> Option<SlotId> {
        let slot = *self.by_hash.get(&hash)?;
        self.update(slot, |r| r.refs += 1)?;
        self.policy.access(hash, &Use::at(now));
        self.stats.hits += 1;
        Some(slot)
    }

    /// Drops a reference; at zero the block becomes inactive (evictable).
    pub(crate) fn release(&mut self, slot: SlotId) {
        self.update(slot, |r| r.refs = r.refs.saturating_sub(1));
    }

    /// Pins or unpins a registered block (pinned blocks are never evicted).
    pub(crate) fn set_pinned(&mut self, hash: BlockHash, pinned: bool) -> Result<(), PoolError> {
        let slot = *self
            .by_hash
            .get(&hash)
            .ok_or(PoolError::NotResident(hash))?;
        self.update(slot, |r| {
            r.pins = if pinned {
                r.pins + 1
            } else {
                r.pins.saturating_sub(1)
            }
        })
        .ok_or(PoolError::InFlight(hash))
    }

    // ---- in-flight transfers -----------------------------------------

    /// Reserves a slot to receive `hash` from another tier.
    pub(crate) fn begin_incoming(
        &mut self,
        hash: BlockHash,
        parent: Option<BlockHash>,
        now: u64,
    ) -> Result<SlotId, PoolError> {
        match self.presence(hash) {
            Some(Presence::Ready) => return Err(PoolError::AlreadyResident(hash)),
            Some(Presence::Filling) => return Err(PoolError::InFlight(hash)),
            None => {}
        }
        let slot = self.allocate_one(now)?;
        self.slots[slot as usize] = Slot::Incoming { hash, parent };
        self.by_hash.insert(hash, slot);
        Ok(slot)
    }

    /// The transfer into `slot` completed: the block is registered with one
    /// reference (the caller's handle).
    pub(crate) fn finish_incoming(&mut self, slot: SlotId, now: u64) -> Option<SlotId> {
        let Some(Slot::Incoming { hash, parent }) = self.slots.get(slot as usize).cloned() else {
            return None;
        };
        self.make_registered(slot, hash, parent, now);
        Some(slot)
    }

    /// The transfer into `slot` failed: the slot is free again.
    pub(crate) fn abort_incoming(&mut self, slot: SlotId) {
        if let Some(Slot::Incoming { hash, .. }) = self.slots.get(slot as usize).cloned() {
            self.by_hash.remove(&hash);
            self.slots[slot as usize] = Slot::Free;
            self.free.push(slot);
        }
    }

    /// A transfer starts reading the registered block `hash`: it may not be
    /// evicted until [`end_outgoing`](Self::end_outgoing).
    pub(crate) fn begin_outgoing(&mut self, hash: BlockHash) -> Result<SlotId, PoolError> {
        let slot = *self
            .by_hash
            .get(&hash)
            .ok_or(PoolError::NotResident(hash))?;
        self.update(slot, |r| r.outgoing += 1)
            .ok_or(PoolError::InFlight(hash))?;
        Ok(slot)
    }

    /// Chooses up to `n` blocks to leave the tier (the planner's offload
    /// victims): each is taken out of the policy and marked outgoing.
    pub(crate) fn plan_leaving(&mut self, n: usize, now: u64) -> Vec<(SlotId, BlockHash)> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let Some(slot) = self.choose_victim(now) else {
                break;
            };
            let marked = self.update(slot, |r| {
                r.leaving = true;
                r.outgoing += 1;
                (r.hash, r.parent)
            });
            let Some((hash, parent)) = marked else { break };
            self.leaving += 1;
            // A leaving block no longer keeps its parent from being a leaf,
            // so the next victim can be that parent.
            self.count_child(parent, -1);
            out.push((slot, hash));
        }
        out
    }

    /// A transfer reading `slot` ended. When it succeeded and
    /// `remove_source` asks for it, the block leaves the tier unless
    /// someone still holds, pins or reads it; otherwise a leaving block
    /// returns to the policy.
    pub(crate) fn end_outgoing(
        &mut self,
        slot: SlotId,
        succeeded: bool,
        remove_source: bool,
        now: u64,
    ) {
        let ended = self.update(slot, |r| {
            r.outgoing = r.outgoing.saturating_sub(1);
            let removable = r.refs == 0 && r.pins == 0 && r.outgoing == 0;
            (r.leaving, removable, r.outgoing, r.hash, r.parent, r.depth)
        });
        let Some((leaving, removable, still_reading, hash, parent, depth)) = ended else {
            return;
        };
        if succeeded && remove_source && removable {
            if leaving {
                self.leaving -= 1;
            } else {
                self.policy.remove(hash);
            }
            self.drop_registered(slot, !leaving);
            self.stats.offloaded += 1;
            return;
        }
        if leaving && still_reading == 0 {
            self.update(slot, |r| r.leaving = false);
            self.leaving -= 1;
            self.count_child(parent, 1);
            self.policy.insert(
                hash,
                &Use {
                    now,
                    depth,
                    next_use: u64::MAX,
                },
            );
        }
    }

    /// Removes an inactive registered block (e.g. TTL expiry); whether it
    /// went.
    pub(crate) fn remove_inactive(&mut self, hash: BlockHash) -> bool {
        let Some(&slot) = self.by_hash.get(&hash) else {
            return false;
        };
        match self.registered(slot) {
            Some(r) if Self::evictable(r) => {
                self.policy.remove(hash);
                self.drop_registered(slot, true);
                true
            }
            _ => false,
        }
    }

    // ---- queries -----------------------------------------------------

    /// How `hash` is present, if at all.
    pub(crate) fn presence(&self, hash: BlockHash) -> Option<Presence> {
        let slot = self.by_hash.get(&hash)?;
        match &self.slots[*slot as usize] {
            Slot::Registered(_) => Some(Presence::Ready),
            Slot::Incoming { .. } => Some(Presence::Filling),
            _ => None,
        }
    }

    /// The parent `hash` was registered after, if it is registered here.
    pub(crate) fn available(&self) -> usize {
        self.free.len() + self.evictable
    }

    pub(crate) fn slot_of(&self, hash: BlockHash) -> Option<SlotId> {
        self.by_hash.get(&hash).copied()
    }

    pub(crate) fn parent_of(&self, hash: BlockHash) -> Option<Option<BlockHash>> {
        let slot = self.by_hash.get(&hash)?;
        match &self.slots[*slot as usize] {
            Slot::Registered(r) => Some(r.parent),
            Slot::Incoming { parent, .. } => Some(*parent),
            _ => None,
        }
    }

    /// Blocks the policy reports expired at `now`.
    pub(crate) fn expired(&self, now: u64) -> Vec<BlockHash> {
        let mut out = Vec::new();
        self.policy.expired(now, &mut |h| out.push(h));
        out
    }

    pub(crate) fn stats(&self) -> PoolStats {
        let mut s = self.stats;
        s.capacity = self.slots.len();
        s.free = self.free.len();
        for slot in &self.slots {
            match slot {
                Slot::Free => {}
                Slot::Mutable => s.mutable += 1,
                Slot::Incoming { .. } => s.incoming += 1,
                Slot::Registered(r) if r.refs > 0 => s.active += 1,
                Slot::Registered(_) => s.inactive += 1,
            }
        }
        s
    }

    /// Slots in use (not free).
    pub(crate) fn used(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Slots in use that are not on their way out: what the tier will hold
    /// once the planned offloads complete.
    pub(crate) fn used_after_departures(&self) -> usize {
        self.used() - self.leaving
    }

    /// Checks the invariants in the module docs; a description of the first
    /// violation.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let mut seen_free = vec![false; self.slots.len()];
        for &f in &self.free {
            let Some(seen) = seen_free.get_mut(f as usize) else {
                return Err(format!("free slot {f} out of range"));
            };
            if *seen {
                return Err(format!("slot {f} is free twice"));
            }
            *seen = true;
        }
        let mut tracked = 0;
        let mut children = LeafFirst::default();
        for (i, slot) in self.slots.iter().enumerate() {
            let is_free = matches!(slot, Slot::Free);
            if is_free != seen_free[i] {
                return Err(format!(
                    "slot {i} free-list membership disagrees with {slot:?}"
                ));
            }
            let hash = match slot {
                Slot::Incoming { hash, .. } => Some(*hash),
                Slot::Registered(r) => {
                    if !r.leaving {
                        tracked += 1;
                        children.entered(r.parent);
                    } else if r.outgoing == 0 {
                        return Err(format!("slot {i} leaving without a transfer"));
                    }
                    Some(r.hash)
                }
                _ => None,
            };
            if let Some(h) = hash
                && self.by_hash.get(&h) != Some(&(i as SlotId))
            {
                return Err(format!("hash {h} of slot {i} not indexed to it"));
            }
        }
        if self.by_hash.len()
            != self
                .slots
                .iter()
                .filter(|s| matches!(s, Slot::Incoming { .. } | Slot::Registered(_)))
                .count()
        {
            return Err("hash index holds stale entries".into());
        }
        if self.policy.len() != tracked {
            return Err(format!(
                "policy tracks {} blocks, expected {tracked}",
                self.policy.len()
            ));
        }
        let leaving = self
            .slots
            .iter()
            .filter(|s| matches!(s, Slot::Registered(r) if r.leaving))
            .count();
        let evictable = self
            .slots
            .iter()
            .filter(|s| matches!(s, Slot::Registered(r) if Self::evictable(r)))
            .count();
        if evictable != self.evictable {
            return Err(format!(
                "{evictable} blocks evictable, counter says {}",
                self.evictable
            ));
        }
        if leaving != self.leaving {
            return Err(format!(
                "{leaving} blocks leaving, counter says {}",
                self.leaving
            ));
        }
        if children != self.children {
            return Err("child counts disagree".into());
        }
        Ok(())
    }
}
