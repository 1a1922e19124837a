//! Eviction policies: which resident block goes first.
//!
//! A policy orders slot indices from coldest to hottest. The tier tells it
//! about every block that becomes resident ([`insert`](EvictionPolicy::insert)),
//! is used ([`touch`](EvictionPolicy::touch)) or leaves
//! ([`remove`](EvictionPolicy::remove)), and asks it for victims. Which
//! blocks *may* go (unpinned, unreferenced, persisted) is the tier's
//! business: it passes a filter, and the policy returns the coldest slot the
//! filter accepts.

mod lru;
mod none;

use std::ops::ControlFlow;

use kvtier_core::EvictionPolicyKind;

pub use lru::Lru;
pub use none::NoEviction;

/// An eviction order over slot indices `0..capacity`.
///
/// Contract: the tier calls `insert` once when a slot becomes resident,
/// `remove` once when it stops being resident, and `touch` only for resident
/// slots. Implementations must tolerate the tier asking about a slot that is
/// not resident (ignore it) rather than panic. Every method runs under the
/// tier's lock, so all of them should be O(1) except the scans, which visit
/// at most what their caller asks for.
pub trait EvictionPolicy: Send {
    /// The policy's name, for logs.
    fn name(&self) -> &'static str;

    /// `slot` became resident (it is now the hottest, for recency policies).
    fn insert(&mut self, slot: usize);

    /// `slot` was used.
    fn touch(&mut self, slot: usize);

    /// `slot` is no longer resident.
    fn remove(&mut self, slot: usize);

    /// Number of resident slots.
    fn len(&self) -> usize;

    /// Whether no slot is resident.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Visits resident slots from the coldest (the next victim) towards the
    /// hottest until `visit` breaks or every slot was visited.
    fn scan_coldest(&self, visit: &mut dyn FnMut(usize) -> ControlFlow<()>);

    /// The coldest slot among the first `scan_limit` coldest that `eligible`
    /// accepts. Bounding the scan keeps eviction O(1) when many cold blocks
    /// are pinned or not yet persisted; the cost is that a block past the
    /// bound is not found and the caller sees the tier as full.
    fn victim(&self, scan_limit: usize, eligible: &mut dyn FnMut(usize) -> bool) -> Option<usize> {
        let mut seen = 0usize;
        let mut found = None;
        self.scan_coldest(&mut |slot| {
            if seen >= scan_limit {
                return ControlFlow::Break(());
            }
            seen += 1;
            if eligible(slot) {
                found = Some(slot);
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        found
    }
}

/// The policy named by `kind` for an arena of `capacity` slots.
pub fn build_policy(kind: EvictionPolicyKind, capacity: usize) -> Box<dyn EvictionPolicy> {
    match kind {
        EvictionPolicyKind::Lru => Box::new(Lru::new(capacity)),
    }
}
