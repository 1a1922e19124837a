//! The bound of reuse prediction: LRU, but a block the trace never uses
//! again goes before any block it does (a perfect predictor of *whether* a
//! block returns, knowing the future from [`Use::next_use`] as Belady
//! does). What it closes of the LRU->Belady gap is the most a policy that
//! predicts reuse and keeps LRU order among the reused can close; the rest
//! is Belady choosing *which* returning blocks to keep by *when* they
//! return.

use kvtier_policy::{EvictionPolicy, Lru, PolicyKind, Use, Verdict};

/// Two LRU lists: blocks not used again (evicted first) and the rest.
#[derive(Debug, Default)]
pub(crate) struct OracleLru {
    dead: Lru<u32>,
    live: Lru<u32>,
}

impl OracleLru {
    /// The list a block whose next use is `next_use` belongs to.
    fn list(&mut self, next_use: u64) -> &mut Lru<u32> {
        if next_use == u64::MAX {
            &mut self.dead
        } else {
            &mut self.live
        }
    }
}

impl EvictionPolicy<u32> for OracleLru {
    fn kind(&self) -> PolicyKind {
        PolicyKind::OracleLru
    }

    fn insert(&mut self, id: u32, u: &Use) {
        self.list(u.next_use).insert(id, u);
    }

    fn access(&mut self, id: u32, u: &Use) {
        // A use may be the block's last: it moves to the other list.
        if self.contains(id) {
            self.remove(id);
            self.insert(id, u);
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
