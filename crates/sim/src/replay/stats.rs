//! Replay statistics that do not depend on the policy: power-of-two
//! histograms and the time-bucketed hit-rate timeline.

use super::{Histogram, TimelinePoint};

/// Counts values into power-of-two buckets (`v` falls in the bucket whose
/// upper bound is the smallest power of two `>= v`; 0 counts as 1).
#[derive(Debug, Clone)]
pub(crate) struct Pow2Counter {
    counts: [u64; 65],
}

impl Default for Pow2Counter {
    fn default() -> Self {
        Pow2Counter { counts: [0; 65] }
    }
}

impl Pow2Counter {
    #[inline]
    pub(crate) fn add(&mut self, v: u64) {
        let i = if v <= 1 {
            0
        } else {
            64 - (v - 1).leading_zeros() as usize
        };
        self.counts[i] += 1;
    }

    /// Buckets from 1 up to the largest non-empty one, empty ones included.
    pub(crate) fn finish(&self) -> Histogram {
        let last = self.counts.iter().rposition(|&c| c > 0);
        let buckets: Vec<(u64, u64)> = match last {
            None => Vec::new(),
            Some(last) => (0..=last)
                .map(|i| {
                    (
                        1u64.checked_shl(i as u32).unwrap_or(u64::MAX),
                        self.counts[i],
                    )
                })
                .collect(),
        };
        Histogram {
            total: self.counts.iter().sum(),
            buckets,
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Window {
    requests: u64,
    blocks: u64,
    hits: u64,
}

/// Hit rates over fixed-width time windows, at most `points` of them.
///
/// When the trace's span is known the width is span / points; when it is not
/// (streaming) the width starts at 1 ms and doubles, merging neighbouring
/// windows, whenever a timestamp falls past the last window, so memory stays
/// `O(points)` and between `points / 2` and `points` windows cover the trace.
#[derive(Debug, Clone)]
pub(crate) struct Timeline {
    points: usize,
    t0: Option<u64>,
    width: u64,
    windows: Vec<Window>,
}

impl Timeline {
    pub(crate) fn new(points: usize, span: Option<(u64, u64)>) -> Self {
        let (t0, width) = match span {
            Some((first, last)) if points > 0 => {
                let span = last.saturating_sub(first).saturating_add(1);
                (Some(first), span.div_ceil(points as u64).max(1))
            }
            _ => (None, 1),
        };
        Timeline {
            points,
            t0,
            width,
            windows: vec![Window::default(); points],
        }
    }

    pub(crate) fn add(&mut self, t_ms: u64, blocks: u64, hits: u64) {
        if self.points == 0 {
            return;
        }
        let t0 = *self.t0.get_or_insert(t_ms);
        let off = t_ms.saturating_sub(t0);
        let mut idx = off / self.width;
        while idx >= self.points as u64 {
            self.merge();
            idx = off / self.width;
        }
        let w = &mut self.windows[idx as usize];
        w.requests += 1;
        w.blocks += blocks;
        w.hits += hits;
    }

    /// Doubles the width: window `i` becomes windows `2i` and `2i + 1`.
    fn merge(&mut self) {
        let n = self.points;
        for i in 0..n {
            let (a, b) = (
                self.windows.get(2 * i).copied(),
                self.windows.get(2 * i + 1).copied(),
            );
            let mut w = a.unwrap_or_default();
            if let Some(b) = b {
                w.requests += b.requests;
                w.blocks += b.blocks;
                w.hits += b.hits;
            }
            self.windows[i] = w;
        }
        self.width = self.width.saturating_mul(2);
    }

    /// One point per non-empty window, at the window's end.
    pub(crate) fn finish(&self) -> Vec<TimelinePoint> {
        let Some(t0) = self.t0 else { return Vec::new() };
        let (mut requests, mut blocks, mut hits) = (0u64, 0u64, 0u64);
        let mut out = Vec::new();
        for (i, w) in self.windows.iter().enumerate() {
            if w.requests == 0 {
                continue;
            }
            requests += w.requests;
            blocks += w.blocks;
            hits += w.hits;
            out.push(TimelinePoint {
                t_ms: t0.saturating_add((i as u64 + 1).saturating_mul(self.width)),
                requests,
                hit_rate: ratio(w.hits, w.blocks),
                cumulative_hit_rate: ratio(hits, blocks),
            });
        }
        out
    }
}

/// `a / b`, 0 when `b` is 0.
pub(crate) fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pow2_buckets() {
        let mut c = Pow2Counter::default();
        for v in [0, 1, 2, 3, 4, 5, 1000] {
            c.add(v);
        }
        let h = c.finish();
        assert_eq!(h.total, 7);
        assert_eq!(&h.buckets[..4], &[(1, 2), (2, 1), (4, 2), (8, 1)]);
        assert_eq!(h.buckets.last(), Some(&(1024, 1)));
        assert_eq!(Pow2Counter::default().finish().buckets, vec![]);
    }

    #[test]
    fn known_span_uses_equal_windows() {
        let mut t = Timeline::new(4, Some((100, 499)));
        t.add(100, 10, 0);
        t.add(250, 10, 10);
        t.add(499, 10, 5);
        let p = t.finish();
        assert_eq!(
            p.iter().map(|p| p.t_ms).collect::<Vec<_>>(),
            vec![200, 300, 500]
        );
        assert_eq!(
            p.iter().map(|p| p.requests).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        assert_eq!(p[1].hit_rate, 1.0);
        assert_eq!(p[2].cumulative_hit_rate, 0.5);
    }

    #[test]
    fn unknown_span_doubles_and_keeps_the_totals() {
        let mut t = Timeline::new(8, None);
        for ts in 0..10_000u64 {
            t.add(ts * 7, 2, ts % 2);
        }
        let p = t.finish();
        assert!(p.len() >= 4 && p.len() <= 8, "{}", p.len());
        let last = p.last().unwrap();
        assert_eq!(last.requests, 10_000);
        assert_eq!(last.cumulative_hit_rate, 0.25);
        assert!(last.t_ms > 7 * 9_999);
    }

    #[test]
    fn no_points_no_timeline() {
        let mut t = Timeline::new(0, None);
        t.add(5, 1, 1);
        assert!(t.finish().is_empty());
    }
}
