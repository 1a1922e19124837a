//! [`PeerHealth`]: whether a peer is worth asking now. A peer that failed
//! `failures_to_skip` times in a row is skipped for a backoff that doubles
//! with each further failure (up to a cap); once the backoff has passed, one
//! request is let through as a probe, and a success makes the peer healthy
//! again. The caller passes the time in, so tests need no clock.

use std::time::{Duration, Instant};

/// When a peer is skipped, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthPolicy {
    /// Consecutive failures after which the peer is skipped. Default: 3.
    pub failures_to_skip: u32,
    /// The first skip's length. Default: 1 s.
    pub backoff: Duration,
    /// The longest skip. Default: 60 s.
    pub max_backoff: Duration,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        Self {
            failures_to_skip: 3,
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
        }
    }
}

/// One peer's recent record.
#[derive(Debug, Clone)]
pub struct PeerHealth {
    policy: HealthPolicy,
    consecutive_failures: u32,
    skip_until: Option<Instant>,
}

impl PeerHealth {
    /// A peer with no failures.
    pub fn new(policy: HealthPolicy) -> Self {
        Self {
            policy,
            consecutive_failures: 0,
            skip_until: None,
        }
    }

    /// Whether to ask the peer at `now`.
    pub fn usable(&self, now: Instant) -> bool {
        self.skip_until.is_none_or(|until| now >= until)
    }

    /// Failures in a row so far.
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// A request to the peer succeeded.
    pub fn succeeded(&mut self) {
        self.consecutive_failures = 0;
        self.skip_until = None;
    }

    /// A request to the peer failed (error or timeout) at `now`.
    pub fn failed(&mut self, now: Instant) {
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        let over = self
            .consecutive_failures
            .checked_sub(self.policy.failures_to_skip);
        if let Some(over) = over {
            self.skip_until = Some(now + self.backoff(over));
        }
    }

    /// The skip after `over` failures beyond the threshold: doubled each
    /// time, capped.
    fn backoff(&self, over: u32) -> Duration {
        let factor = 1u32.checked_shl(over.min(31)).unwrap_or(u32::MAX);
        self.policy
            .backoff
            .saturating_mul(factor)
            .min(self.policy.max_backoff)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_failing_peer_is_skipped_then_probed_then_restored() {
        let policy = HealthPolicy::default();
        let t0 = Instant::now();
        let mut h = PeerHealth::new(policy);
        h.failed(t0);
        h.failed(t0);
        assert!(h.usable(t0), "two failures are not enough");
        h.failed(t0);
        assert!(!h.usable(t0));
        assert!(!h.usable(t0 + Duration::from_millis(999)));
        assert!(
            h.usable(t0 + Duration::from_secs(1)),
            "probe after the backoff"
        );
        let t1 = t0 + Duration::from_secs(1);
        h.failed(t1);
        assert!(
            !h.usable(t1 + Duration::from_millis(1999)),
            "backoff doubled"
        );
        assert!(h.usable(t1 + Duration::from_secs(2)));
        h.succeeded();
        assert!(h.usable(t1));
        assert_eq!(h.consecutive_failures(), 0);
    }

    proptest! {
        /// Against a model: after any history, the peer is usable exactly
        /// when fewer than the threshold failures are in a row, or the last
        /// failure's backoff (doubling, capped) has passed.
        #[test]
        fn usable_matches_the_model(
            events in prop::collection::vec((any::<bool>(), 0u64..5000), 0..40),
            probe in 0u64..200_000,
            threshold in 1u32..5,
        ) {
            let policy = HealthPolicy {
                failures_to_skip: threshold,
                backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(10),
            };
            let t0 = Instant::now();
            let mut h = PeerHealth::new(policy);
            let (mut now, mut run, mut last_fail) = (t0, 0u32, t0);
            for (ok, step) in events {
                now += Duration::from_millis(step);
                if ok { h.succeeded(); run = 0 } else { h.failed(now); run += 1; last_fail = now }
            }
            let at = now + Duration::from_millis(probe);
            let expect = run < threshold || {
                let ms = (100u64 << (run - threshold).min(20)).min(10_000);
                at >= last_fail + Duration::from_millis(ms)
            };
            prop_assert_eq!(h.usable(at), expect);
        }
    }
}
