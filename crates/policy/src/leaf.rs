//! Leaves first: a filter over any policy that evicts the leaves of the
//! prefix tree before their parents.
//!
//! A block's children are the blocks one position deeper under the same
//! prefix. Evicting a block that has a child in the same tier strands the
//! child, which can never be hit without its prefix; so a tier first asks
//! its policy for a victim among the eligible keys with no resident child,
//! and only when there is none for any eligible key. The tier reports each
//! key's arrival and departure with its parent; the counts are per tier.

use crate::{EvictionPolicy, PolicyKey, SlotIndex, Verdict};

/// Resident children per key of one tier, and the leaf-first victim. The
/// counts live in the key type's map (a flat vector for dense ids), only
/// for keys with at least one child.
#[derive(Debug)]
pub struct LeafFirst<K: PolicyKey> {
    children: K::Index,
}

impl<K: PolicyKey> Default for LeafFirst<K> {
    fn default() -> Self {
        Self {
            children: K::Index::default(),
        }
    }
}

impl<K: PolicyKey> PartialEq for LeafFirst<K>
where
    K::Index: PartialEq,
{
    fn eq(&self, other: &Self) -> bool {
        self.children == other.children
    }
}

impl<K: PolicyKey> LeafFirst<K> {
    /// A key whose parent is `parent` entered the tier.
    pub fn entered(&mut self, parent: Option<K>) {
        if let Some(p) = parent {
            let n = self.children.get(p).unwrap_or(0);
            self.children.set(p, n + 1);
        }
    }

    /// A key whose parent is `parent` left the tier.
    pub fn left(&mut self, parent: Option<K>) {
        let Some(p) = parent else { return };
        match self.children.get(p) {
            Some(n) if n > 1 => self.children.set(p, n - 1),
            Some(_) => self.children.clear(p),
            None => {}
        }
    }

    /// Whether `key` has no resident child.
    pub fn is_leaf(&self, key: K) -> bool {
        self.children.get(key).is_none()
    }

    /// The policy's victim among eligible leaves, else among all eligible
    /// keys. `eligible` says whether a key may go now.
    pub fn victim<P>(
        &self,
        policy: &mut P,
        now: u64,
        eligible: &mut dyn FnMut(K) -> Verdict,
    ) -> Option<K>
    where
        P: EvictionPolicy<K> + ?Sized,
    {
        let mut stopped = false;
        let leaf = policy.victim(now, &mut |k| {
            if !self.is_leaf(k) {
                return Verdict::Skip;
            }
            let v = eligible(k);
            stopped |= v == Verdict::Stop;
            v
        });
        if leaf.is_some() || stopped {
            return leaf;
        }
        policy.victim(now, eligible)
    }
}
