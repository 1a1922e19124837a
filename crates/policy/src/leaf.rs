//! Leaves first: a filter over any policy that evicts the leaves of the
//! prefix tree before their parents.
//!
//! A block's children are the blocks one position deeper under the same
//! prefix. Evicting a block that has a child in the same tier strands the
//! child, which can never be hit without its prefix; so a tier first asks
//! its policy for a victim among the eligible keys with no resident child,
//! and only when there is none for any eligible key. The tier reports each
//! key's arrival and departure with its parent; the counts are per tier.

use hashbrown::HashMap;

use crate::{EvictionPolicy, PolicyKey, Verdict};

/// Resident children per key of one tier, and the leaf-first victim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafFirst<K: PolicyKey> {
    children: HashMap<K, u32>,
}

impl<K: PolicyKey> Default for LeafFirst<K> {
    fn default() -> Self {
        Self {
            children: HashMap::new(),
        }
    }
}

impl<K: PolicyKey> LeafFirst<K> {
    /// A key whose parent is `parent` entered the tier.
    pub fn entered(&mut self, parent: Option<K>) {
        if let Some(p) = parent {
            *self.children.entry(p).or_insert(0) += 1;
        }
    }

    /// A key whose parent is `parent` left the tier.
    pub fn left(&mut self, parent: Option<K>) {
        let Some(p) = parent else { return };
        if let Some(c) = self.children.get_mut(&p) {
            *c -= 1;
            if *c == 0 {
                self.children.remove(&p);
            }
        }
    }

    /// Resident children of `key`.
    pub fn children(&self, key: K) -> u32 {
        self.children.get(&key).copied().unwrap_or(0)
    }

    /// Whether `key` has no resident child.
    pub fn is_leaf(&self, key: K) -> bool {
        !self.children.contains_key(&key)
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
