//! One evaluated configuration: its replay reduced to the figures a report
//! and a search need.

use serde::Serialize;

use crate::model::{CostSummary, ServingModel, TtftSummary, cost_summary, ttft_summary};
use crate::replay::{Histogram, ReplayResult, TierSpec, TimelinePoint};
use crate::trace::Request;

/// What the cost model needs to know about the trace as a whole.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct TraceFacts {
    /// Requests in the trace.
    pub requests: u64,
    /// Prompt tokens of all requests.
    pub input_tokens: u64,
    /// Last arrival minus first arrival, milliseconds.
    pub span_ms: u64,
    /// Tokens per block of the first request (the trace's block size).
    pub tokens_per_block: u32,
}

impl TraceFacts {
    /// The facts of `requests`.
    pub fn of(requests: &[Request]) -> Self {
        let first = requests.iter().map(|r| r.timestamp_ms).min().unwrap_or(0);
        let last = requests.iter().map(|r| r.timestamp_ms).max().unwrap_or(0);
        TraceFacts {
            requests: requests.len() as u64,
            input_tokens: requests.iter().map(|r| u64::from(r.input_tokens)).sum(),
            span_ms: last - first,
            tokens_per_block: requests.first().map_or(0, |r| r.tokens_per_block),
        }
    }
}

/// One configuration's results.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Point {
    /// Eviction policy.
    pub policy: String,
    /// Blocks over all tiers.
    pub capacity: u64,
    /// The tiers, fastest first.
    pub tiers: Vec<TierSpec>,
    /// Leading-block hit rate (hit blocks / requested blocks).
    pub hit_rate: f64,
    /// Share of the LRU→Belady gap this point closes, `(hit_rate − LRU) /
    /// (Belady − LRU)` on the same tier layout: 0 is LRU, 1 is Belady,
    /// negative is below LRU. `None` unless the sweep ran both LRU and
    /// Belady on this layout and Belady is above LRU ([`super::gap`]).
    pub gap_closed: Option<f64>,
    /// Requests replayed.
    pub requests: u64,
    /// Blocks requested.
    pub requested_blocks: u64,
    /// Leading blocks found.
    pub hit_blocks: u64,
    /// Hit blocks per tier, fastest first.
    pub tier_hit_blocks: Vec<u64>,
    /// TTFT statistics, seconds (when a model was given).
    pub ttft: Option<TtftSummary>,
    /// Cost figures (when a model was given).
    pub cost: Option<CostSummary>,
    /// Hit rate over trace time.
    pub timeline: Vec<TimelinePoint>,
    /// Reuse distances (distinct blocks between two uses of a block): a
    /// property of the trace, equal for every configuration.
    pub reuse_distance: Histogram,
    /// Uses per distinct block: a property of the trace.
    pub access_frequency: Histogram,
    /// Block accesses replayed.
    pub accesses: u64,
    /// Wall-clock seconds the replay took.
    pub replay_s: f64,
}

/// Reduces `result` to a [`Point`], with TTFT and cost when `model` is
/// given (the result must then carry its outcomes).
pub fn evaluate(result: ReplayResult, model: Option<&ServingModel>, facts: &TraceFacts) -> Point {
    let (ttft, cost) = match model {
        Some(m) => {
            let mut m = m.for_tiers(&result.tiers);
            if facts.tokens_per_block > 0 {
                m.tokens_per_block = facts.tokens_per_block;
            }
            let t = ttft_summary(&result.outcomes, &m);
            let c = cost_summary(&m, &result.tiers, &t, facts.input_tokens, facts.span_ms);
            (Some(t), Some(c))
        }
        None => (None, None),
    };
    Point {
        policy: result.policy,
        capacity: result.capacity,
        tiers: result.tiers,
        hit_rate: result.hit_rate,
        gap_closed: None,
        requests: result.requests,
        requested_blocks: result.requested_blocks,
        hit_blocks: result.hit_blocks,
        tier_hit_blocks: result.tier_hit_blocks,
        ttft,
        cost,
        timeline: result.timeline,
        reuse_distance: result.reuse_distance,
        access_frequency: result.access_frequency,
        accesses: result.accesses,
        replay_s: result.elapsed_s,
    }
}
