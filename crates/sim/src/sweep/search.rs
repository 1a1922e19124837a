//! The cheapest configuration that meets a target.
//!
//! Every candidate is replayed and priced (an exhaustive search: candidate
//! lists are short and the whole table is what an operator wants to see);
//! among the points that meet the target the one with the lowest cost per
//! million tokens wins, ties going to less storage, then to the earlier
//! candidate. The points of policies that need the future (Belady and
//! the oracles) are never selected: they bound what a policy could reach
//! but are not configurations anyone can deploy.

use serde::Serialize;

use super::point::Point;
use crate::model::ServingModel;
use crate::policy::PolicyKind;
use crate::replay::{ReplayConfig, TierSpec};
use crate::trace::Request;

/// What a configuration must achieve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "value")]
pub enum Target {
    /// A hit rate of at least this (0..=1).
    HitRate(f64),
    /// A mean TTFT (cache overlapped) of at most this many seconds.
    MeanTtftS(f64),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::HitRate(h) => write!(f, "hit rate >= {h}"),
            Target::MeanTtftS(s) => write!(f, "mean TTFT <= {s} s"),
        }
    }
}

impl Target {
    /// Whether `p` meets the target (a TTFT target needs a priced point).
    pub fn met_by(&self, p: &Point) -> bool {
        match *self {
            Target::HitRate(h) => p.hit_rate >= h,
            Target::MeanTtftS(s) => p.ttft.is_some_and(|t| t.with_cache.mean <= s),
        }
    }
}

/// The outcome of a search: every evaluated point and the winner.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SearchResult {
    /// The target searched for.
    pub target: Target,
    /// Index into `points` of the cheapest point meeting the target, if any.
    pub best: Option<usize>,
    /// Every evaluated point, in candidate order.
    pub points: Vec<Point>,
}

impl SearchResult {
    /// The winning point.
    pub fn best_point(&self) -> Option<&Point> {
        self.best.and_then(|i| self.points.get(i))
    }
}

fn price(p: &Point) -> (f64, f64) {
    let storage = p.cost.map_or(p.capacity as f64, |c| c.storage_gb);
    let dollars = p.cost.map_or(0.0, |c| c.dollars_per_mtok_with_cache);
    (dollars, storage)
}

/// Whether the policy named `name` needs the future (so is no candidate).
fn needs_future(name: &str) -> bool {
    name.parse::<PolicyKind>()
        .is_ok_and(PolicyKind::needs_future)
}

/// Index of the cheapest point of `points` meeting `target` (see the
/// module docs for the order).
pub fn select(points: &[Point], target: Target) -> Option<usize> {
    points
        .iter()
        .enumerate()
        .filter(|(_, p)| !needs_future(&p.policy) && target.met_by(p))
        .min_by(|(ia, a), (ib, b)| {
            let (pa, pb) = (price(a), price(b));
            pa.0.total_cmp(&pb.0)
                .then(pa.1.total_cmp(&pb.1))
                .then(ia.cmp(ib))
        })
        .map(|(i, _)| i)
}

/// Replays `policy` over every layout of `candidates`, prices each with
/// `model` and selects the cheapest meeting `target`.
pub fn search(
    requests: &[Request],
    policy: PolicyKind,
    candidates: &[Vec<TierSpec>],
    target: Target,
    model: &ServingModel,
    threads: usize,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> SearchResult {
    let configs: Vec<ReplayConfig> = candidates
        .iter()
        .map(|tiers| ReplayConfig {
            tiers: tiers.clone(),
            ..ReplayConfig::single(policy, 0)
        })
        .collect();
    let points = super::run(requests, &configs, Some(model), threads, progress);
    SearchResult {
        target,
        best: select(&points, target),
        points,
    }
}
