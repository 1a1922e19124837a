//! The bounds of reuse prediction: a block the trace never uses again goes
//! before any block it does (a perfect predictor of *whether* a block
//! returns, knowing the future from [`Use::next_use`] as Belady does), and
//! among the blocks that return a deployable policy chooses: LRU
//! (`oracle-lru`) or `hit-density` (`oracle-hit-density`). What they close
//! of the LRU->Belady gap is the most a policy that predicts reuse and
//! orders the returning blocks as they do can close; the rest is Belady
//! choosing *which* returning blocks to keep by *when* they return.

use kvtier_policy::{EvictionPolicy, HitDensity, Lru, PolicyKind, Use, Verdict};

/// Blocks not used again, least recent first (evicted first), and the
/// rest under `live`'s policy.
#[derive(Debug)]
pub(crate) struct Oracle {
    kind: PolicyKind,
    dead: Lru<u32>,
    live: Box<dyn EvictionPolicy<u32>>,
}

impl Oracle {
    /// `oracle-lru`: LRU among the blocks that return.
    pub(crate) fn lru() -> Self {
        Self {
            kind: PolicyKind::OracleLru,
            dead: Lru::default(),
            live: Box::new(Lru::default()),
        }
    }

    /// `oracle-hit-density`: `hit-density` of a tier of `capacity` blocks
    /// among the blocks that return.
    pub(crate) fn hit_density(capacity: usize) -> Self {
        Self {
            kind: PolicyKind::OracleHitDensity,
            dead: Lru::default(),
            live: Box::new(HitDensity::new(capacity)),
        }
    }
}

impl EvictionPolicy<u32> for Oracle {
    fn kind(&self) -> PolicyKind {
        self.kind
    }

    fn insert(&mut self, id: u32, u: &Use) {
        if u.next_use == u64::MAX {
            self.dead.insert(id, u);
        } else {
            self.live.insert(id, u);
        }
    }

    fn access(&mut self, id: u32, u: &Use) {
        // The live policy sees the use (a learning one counts it), then a
        // block's last use moves it to the dead list.
        if self.live.contains(id) {
            self.live.access(id, u);
            if u.next_use == u64::MAX {
                self.live.remove(id);
                self.dead.insert(id, u);
            }
        }
    }

    fn remove(&mut self, id: u32) {
        self.dead.remove(id);
        self.live.remove(id);
    }

    fn victim(&mut self, now: u64, eligible: &mut dyn FnMut(u32) -> Verdict) -> Option<u32> {
        // A `Stop` ends the search, in the first list as in one list.
        let mut stopped = false;
        let found = self.dead.victim(now, &mut |id| {
            let v = eligible(id);
            stopped |= v == Verdict::Stop;
            v
        });
        if found.is_some() || stopped {
            return found;
        }
        self.live.victim(now, eligible)
    }

    fn coldest(&self, visit: &mut dyn FnMut(u32) -> Verdict) {
        let mut stopped = false;
        self.dead.coldest(&mut |id| {
            let v = visit(id);
            stopped |= v == Verdict::Stop;
            v
        });
        if !stopped {
            self.live.coldest(visit);
        }
    }

    fn contains(&self, id: u32) -> bool {
        self.dead.contains(id) || self.live.contains(id)
    }

    fn len(&self) -> usize {
        self.dead.len() + self.live.len()
    }
}
