//! Matching modes of `get_cache_location`, as pure functions over "is block
//! `i` available", so they can be checked against a brute-force reference.
//!
//! A position is *available* when it is masked (the engine already holds it)
//! or has a serving location.

use crate::error::{MetaError, Result};

/// Which blocks a location query returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchMode {
    /// Every key independently (KV-style batch get).
    Keys,
    /// The longest leading run of available blocks (the main read mode).
    Prefix,
    /// For sliding-window attention: the longest prefix `0..e` the engine can
    /// resume after, needing only the last `window` blocks before `e`. Found
    /// scanning backwards from the last block for the first full window of
    /// available blocks; if none, the leading run when it is shorter than a
    /// window. Locations are returned only for `e - window .. e`.
    ReverseSlidingWindow {
        /// Window length in blocks (at least 1).
        window: usize,
    },
}

/// Positions the engine already has and does not need located.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum BlockMask {
    /// Nothing masked.
    #[default]
    None,
    /// The first `n` positions are masked.
    Offset(usize),
    /// `true` positions are masked; must have one flag per key.
    Bits(Vec<bool>),
}

impl BlockMask {
    /// Whether position `i` is masked.
    pub fn is_masked(&self, i: usize) -> bool {
        match self {
            BlockMask::None => false,
            BlockMask::Offset(n) => i < *n,
            BlockMask::Bits(b) => b.get(i).copied().unwrap_or(false),
        }
    }

    /// Checks the mask fits `n` keys.
    pub fn validate(&self, n: usize) -> Result<()> {
        match self {
            BlockMask::Bits(b) if b.len() != n => Err(MetaError::InvalidArgument(format!(
                "mask has {} flags for {n} keys",
                b.len()
            ))),
            BlockMask::Offset(o) if *o > n => Err(MetaError::InvalidArgument(format!(
                "mask offset {o} past {n} keys"
            ))),
            _ => Ok(()),
        }
    }
}

/// Length of the leading run of available positions.
pub fn prefix_len(available: &[bool]) -> usize {
    available.iter().take_while(|&&a| a).count()
}

/// The resume point `e` of [`MatchMode::ReverseSlidingWindow`] (see there).
/// `window` 0 is treated as 1.
pub fn sliding_window_end(available: &[bool], window: usize) -> usize {
    let window = window.max(1);
    let mut run = 0;
    for i in (0..available.len()).rev() {
        if available[i] {
            run += 1;
            if run == window {
                return i + window;
            }
        } else {
            run = 0;
        }
    }
    // No full window anywhere: the run reaching position 0, if any.
    run
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ref_sliding(avail: &[bool], window: usize) -> usize {
        (0..=avail.len())
            .rev()
            .find(|&e| (e.saturating_sub(window)..e).all(|i| avail[i]))
            .unwrap_or(0)
    }

    fn ref_prefix(avail: &[bool]) -> usize {
        (0..=avail.len())
            .rev()
            .find(|&e| (0..e).all(|i| avail[i]))
            .unwrap_or(0)
    }

    proptest! {
        #[test]
        fn prefix_matches_reference(avail in proptest::collection::vec(any::<bool>(), 0..64)) {
            prop_assert_eq!(prefix_len(&avail), ref_prefix(&avail));
        }

        #[test]
        fn sliding_matches_reference(
            avail in proptest::collection::vec(prop::bool::weighted(0.8), 0..64),
            window in 1usize..10,
        ) {
            prop_assert_eq!(sliding_window_end(&avail, window), ref_sliding(&avail, window));
        }
    }

    #[test]
    fn sliding_examples() {
        let t = true;
        let f = false;
        assert_eq!(sliding_window_end(&[t, t, f, t, t, t, f], 3), 6);
        assert_eq!(sliding_window_end(&[t, t, f, t, t], 3), 2);
        assert_eq!(sliding_window_end(&[f, t, t], 3), 0);
        assert_eq!(sliding_window_end(&[], 3), 0);
    }
}
