//! Cost per million tokens and GPUs saved, for a prefill-bound fleet.
//!
//! Tutti's serving cost (seed 000) is the hourly price of what serves
//! divided by the throughput it serves:
//!
//! ```text
//! $/Mtok = (N_gpu x C_gpu + sum_t GB_t x C_t) / (tokens per hour / 10^6)
//! ```
//!
//! `C_gpu` dollars per GPU-hour, `C_t` dollars per GB-hour of tier `t`.
//! Over a trace spanning `D` hours whose requests need `S` GPU-seconds of
//! prefill, a fleet that keeps up runs `N_gpu = S / (3600 D)` GPUs; the
//! tokens are the trace's prompt tokens. Prefill time saved by the cache is
//! therefore GPUs saved at equal throughput:
//! `(S_without - S_with) / (3600 D)`.

use serde::Serialize;

use super::ttft::{ServingModel, TtftSummary};
use crate::replay::TierSpec;

/// Dollars per million tokens for `gpus` GPUs at `gpu_dollars_per_hour`,
/// `storage` as `(GB, dollars per GB-hour)` per tier, serving
/// `tokens_per_hour`. Zero throughput costs nothing per token by
/// convention (there is nothing to divide).
pub fn cost_per_million_tokens(
    gpus: f64,
    gpu_dollars_per_hour: f64,
    storage: &[(f64, f64)],
    tokens_per_hour: f64,
) -> f64 {
    if tokens_per_hour <= 0.0 {
        return 0.0;
    }
    let hourly = gpus * gpu_dollars_per_hour + storage.iter().map(|(gb, p)| gb * p).sum::<f64>();
    hourly / (tokens_per_hour / 1e6)
}

/// Cost figures of one configuration over one trace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CostSummary {
    /// Trace span, hours (first to last arrival).
    pub span_hours: f64,
    /// Prompt tokens of the trace.
    pub tokens: u64,
    /// GPUs a prefill-bound fleet needs with the cache.
    pub gpus_with_cache: f64,
    /// GPUs it needs without.
    pub gpus_without_cache: f64,
    /// `gpus_without_cache - gpus_with_cache`.
    pub gpus_saved: f64,
    /// Storage held in the tiers, GB (10^9 bytes).
    pub storage_gb: f64,
    /// Dollars per hour of the tiers' storage.
    pub storage_dollars_per_hour: f64,
    /// Dollars per million prompt tokens with the cache (GPUs + storage).
    pub dollars_per_mtok_with_cache: f64,
    /// Dollars per million prompt tokens without a cache (GPUs only).
    pub dollars_per_mtok_without_cache: f64,
}

/// The cost of serving a trace of `tokens` prompt tokens spanning `span_ms`
/// with `tiers` of storage, given its TTFT summary (whose totals are the
/// fleet's prefill seconds). A span of zero is taken as the prefill time
/// itself (one GPU, back to back).
pub fn cost_summary(
    m: &ServingModel,
    tiers: &[TierSpec],
    ttft: &TtftSummary,
    tokens: u64,
    span_ms: u64,
) -> CostSummary {
    let span_s = if span_ms > 0 {
        span_ms as f64 / 1000.0
    } else {
        ttft.without_cache.total.max(f64::MIN_POSITIVE)
    };
    let hours = span_s / 3600.0;
    let tokens_per_hour = tokens as f64 / hours;
    let gpus_with = ttft.with_cache.total / span_s;
    let gpus_without = ttft.without_cache.total / span_s;
    let storage: Vec<(f64, f64)> = tiers
        .iter()
        .zip(&m.tiers)
        .filter(|(_, t)| !t.resident)
        .map(|(spec, t)| {
            (
                m.tier_bytes(spec.capacity_blocks) / 1e9,
                t.dollars_per_gb_hour,
            )
        })
        .collect();
    let gpu_price = m.gpu.dollars_per_hour;
    CostSummary {
        span_hours: hours,
        tokens,
        gpus_with_cache: gpus_with,
        gpus_without_cache: gpus_without,
        gpus_saved: gpus_without - gpus_with,
        storage_gb: storage.iter().map(|s| s.0).sum(),
        storage_dollars_per_hour: storage.iter().map(|(gb, p)| gb * p).sum(),
        dollars_per_mtok_with_cache: cost_per_million_tokens(
            gpus_with,
            gpu_price,
            &storage,
            tokens_per_hour,
        ),
        dollars_per_mtok_without_cache: cost_per_million_tokens(
            gpus_without,
            gpu_price,
            &[],
            tokens_per_hour,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_computed_cost() {
        // 2 GPUs at $5/h + 100 GB DRAM at $0.0088 + 1000 GB SSD at $0.000082
        // = 10 + 0.88 + 0.082 = $10.962/h; 3.6M tokens/h -> $3.045/Mtok.
        let c = cost_per_million_tokens(2.0, 5.0, &[(100.0, 0.0088), (1000.0, 0.000_082)], 3.6e6);
        assert!((c - 10.962 / 3.6).abs() < 1e-12, "{c}");
        assert_eq!(cost_per_million_tokens(1.0, 5.0, &[], 0.0), 0.0);
    }
}
