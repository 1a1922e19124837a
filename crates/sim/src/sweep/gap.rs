//! The share of the LRU→Belady gap a policy closes: where a policy stands
//! between the deployable baseline (LRU) and the offline optimum (Belady)
//! on the same trace and tier layout.
//!
//! `gap_closed = (hit rate − LRU's) / (Belady's − LRU's)`: 0 is LRU, 1 is
//! Belady, a negative share is below LRU. It is defined only where both
//! ends were replayed on the same layout and Belady is above LRU by more
//! than [`MIN_GAP`]; where the two meet (a tier that holds the whole
//! working set, or one too small to keep anything) there is no gap to
//! close and the share is `None`, not a division by zero.

use std::collections::HashMap;

use crate::policy::PolicyKind;
use crate::replay::TierSpec;
use crate::sweep::Point;

/// The smallest LRU→Belady gap, in hit rate, that a share is computed
/// against: below it the share is noise over a rounding error.
pub const MIN_GAP: f64 = 1e-9;

/// The share of the gap between `lru` and `belady` (hit rates) that a
/// policy with hit rate `policy` closes; `None` when there is no gap.
pub fn gap_closed(lru: f64, belady: f64, policy: f64) -> Option<f64> {
    let gap = belady - lru;
    (gap > MIN_GAP).then(|| (policy - lru) / gap)
}

/// A share as a whole percentage (`0.3` is `30%`), `-` when there is
/// none: how the reports print [`Point::gap_closed`].
pub fn percent(share: Option<f64>) -> String {
    share.map_or_else(|| "-".to_owned(), |v| format!("{:.0}%", v * 100.0))
}

/// Sets [`Point::gap_closed`] on every point whose tier layout was also
/// replayed with LRU and with Belady (the same tiers, names and sizes);
/// the others get `None`.
pub fn fill(points: &mut [Point]) {
    // Per layout, the first LRU and the first Belady hit rate.
    let mut by_layout: HashMap<&[TierSpec], (Option<f64>, Option<f64>)> = HashMap::new();
    for q in points.iter() {
        let e = by_layout.entry(&q.tiers).or_default();
        if q.policy == PolicyKind::Lru.name() {
            e.0 = e.0.or(Some(q.hit_rate));
        } else if q.policy == PolicyKind::Belady.name() {
            e.1 = e.1.or(Some(q.hit_rate));
        }
    }
    let ends: Vec<Option<(f64, f64)>> = points
        .iter()
        .map(|p| match by_layout.get(p.tiers.as_slice()) {
            Some(&(Some(lru), Some(belady))) => Some((lru, belady)),
            _ => None,
        })
        .collect();
    for (p, end) in points.iter_mut().zip(ends) {
        p.gap_closed = end.and_then(|(lru, belady)| gap_closed(lru, belady, p.hit_rate));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ends_are_zero_and_one() {
        assert_eq!(gap_closed(0.2, 0.6, 0.2), Some(0.0));
        assert_eq!(gap_closed(0.2, 0.6, 0.6), Some(1.0));
        let half = gap_closed(0.2, 0.6, 0.4).unwrap_or(f64::NAN);
        assert!((half - 0.5).abs() < 1e-12, "{half}");
    }

    #[test]
    fn below_lru_is_negative() {
        let s = gap_closed(0.30, 0.40, 0.29).unwrap_or(f64::NAN);
        assert!((s + 0.1).abs() < 1e-9, "{s}");
    }

    #[test]
    fn no_gap_has_no_share() {
        assert_eq!(gap_closed(0.5, 0.5, 0.5), None);
        assert_eq!(gap_closed(0.5, 0.5, 0.4), None);
        assert_eq!(gap_closed(0.0, 0.0, 0.0), None);
        // Belady below LRU cannot happen in a replay; no share either.
        assert_eq!(gap_closed(0.5, 0.4, 0.45), None);
    }
}
