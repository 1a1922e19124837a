//! Sweeps: many replay configurations of one trace, evaluated with the
//! model, and the search for the cheapest one that meets a target.
//!
//! A sweep is embarrassingly parallel (every configuration replays the same
//! read-only trace), so [`run`] hands grid points to a few scoped threads;
//! each thread replays a point and immediately reduces it to a [`Point`]
//! (TTFT and cost summaries instead of one outcome per request), so memory
//! stays one trace plus one replay per thread. Points come back in grid
//! order whatever the threads' timing.
//!
//! - [`grid`]: which configurations ([`Grid`]);
//! - [`point`]: one evaluated configuration ([`Point`], [`TraceFacts`]);
//! - [`search`](mod@search): the cheapest configuration meeting a [`Target`];
//! - [`gap`]: the share of the LRU→Belady gap each point closes.

pub mod gap;
pub mod grid;
pub mod point;
pub mod search;

pub use gap::{gap_closed, percent};
pub use grid::{Grid, tier_candidates};
pub use point::{Point, TraceFacts, evaluate};
pub use search::{SearchResult, Target, search, select};

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::model::ServingModel;
use crate::replay::{ReplayConfig, replay};
use crate::trace::Request;

/// Replays every configuration of `configs` over `requests` on `threads`
/// threads (at least one) and evaluates each with `model` (when given;
/// configurations then keep their outcomes for the TTFT summary).
/// `progress(done, total)` is called from the worker threads after each
/// point. Points are returned in the order of `configs`, with
/// [`Point::gap_closed`] set where LRU and Belady ran on the same layout.
pub fn run(
    requests: &[Request],
    configs: &[ReplayConfig],
    model: Option<&ServingModel>,
    threads: usize,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Vec<Point> {
    let facts = TraceFacts::of(requests);
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let total = configs.len();
    let workers = threads.clamp(1, total.max(1));
    let mut indexed: Vec<(usize, Point)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(cfg) = configs.get(i) else { break };
                        let mut cfg = cfg.clone();
                        cfg.keep_outcomes |= model.is_some();
                        let result = replay(requests, &cfg);
                        mine.push((i, evaluate(result, model, &facts)));
                        progress(done.fetch_add(1, Ordering::Relaxed) + 1, total);
                    }
                    mine
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    indexed.sort_by_key(|(i, _)| *i);
    let mut points: Vec<Point> = indexed.into_iter().map(|(_, p)| p).collect();
    gap::fill(&mut points);
    points
}

/// Sweeps `grid` over `requests`: [`Grid::configs`] through [`run`].
pub fn sweep(
    requests: &[Request],
    grid: &Grid,
    model: Option<&ServingModel>,
    threads: usize,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Vec<Point> {
    run(requests, &grid.configs(), model, threads, progress)
}
