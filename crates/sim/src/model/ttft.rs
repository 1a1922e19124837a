//! Time to first token of replayed requests.
//!
//! A request of `input` tokens whose first `hit` tokens were found in the
//! cache prefills `new = input - hit` tokens (at least one: the engine
//! always computes the last prompt token to sample the first output token)
//! over a prefix of `input - new`. Its cached KV loads tier by tier, one
//! layer at a time, `hit_tokens_in_tier x kv_bytes_per_token / L` bytes per
//! layer per tier, the tiers one after another on the path into HBM (the
//! fastest tiers holding the leading blocks). Then
//! ([`prefill`](super::prefill) has the pipeline):
//!
//! - **with cache, overlapped**: the layer pipeline;
//! - **with cache, serial**: all loads, then all compute;
//! - **without cache**: the whole prompt prefilled from scratch;
//! - **bubble**: overlapped TTFT minus its compute, the GPU waiting on I/O.
//!
//! Loading is not always worth it: from a slow tier (NVMe at 7 GB/s) a long
//! cached prefix can take longer to load than to recompute (seed 000's
//! LMCache-SSD measurement). The engine modelled here loads the first `k`
//! hit blocks and recomputes the rest, with the `k` (from 0 to all) that
//! minimises each TTFT. So a longer cached prefix never makes a request
//! slower, the overlapped TTFT never exceeds the serial one, and with no
//! hit both equal the no-cache prefill.
//!
//! Queueing is not modelled: these are service times of one request on an
//! idle GPU, the quantity whose sum a prefill-bound fleet must supply.

use serde::Serialize;

use super::ModelError;
use super::hardware::{GpuSpec, ModelSpec};
use super::prefill::{pipeline_uniform, prefill_flops};
use super::tier::TierModel;
use crate::replay::{RequestOutcome, TierSpec};

/// Model, GPU, efficiency and tiers: everything a TTFT needs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServingModel {
    /// The served model.
    pub model: ModelSpec,
    /// The GPU prefilling it.
    pub gpu: GpuSpec,
    /// Model FLOPs utilisation during prefill, in (0, 1]. Default 0.5.
    pub mfu: f64,
    /// One entry per replayed tier, fastest first (the order of
    /// `hit_blocks_per_tier`).
    pub tiers: Vec<TierModel>,
    /// Tokens per block of the trace (sizes a tier's bytes from its blocks).
    pub tokens_per_block: u32,
}

impl ServingModel {
    /// A model with default MFU (0.5) and the default tier model for each
    /// tier name ([`TierModel::for_name`]).
    pub fn new(model: ModelSpec, gpu: GpuSpec, tier_names: &[&str], tokens_per_block: u32) -> Self {
        ServingModel {
            model,
            gpu,
            mfu: 0.5,
            tiers: tier_names.iter().map(|n| TierModel::for_name(n)).collect(),
            tokens_per_block,
        }
    }

    /// This model with one tier model per replayed tier in `specs`: the
    /// entry of `self.tiers` of the same name, else the default for the
    /// name ([`TierModel::for_name`]).
    pub fn for_tiers(&self, specs: &[TierSpec]) -> ServingModel {
        let tiers = specs
            .iter()
            .map(|s| {
                self.tiers
                    .iter()
                    .find(|t| t.name.eq_ignore_ascii_case(&s.name))
                    .cloned()
                    .unwrap_or_else(|| TierModel::for_name(&s.name))
            })
            .collect();
        ServingModel {
            tiers,
            ..self.clone()
        }
    }

    /// Checks every figure is usable.
    pub fn validate(&self) -> Result<(), ModelError> {
        if !(self.mfu > 0.0 && self.mfu <= 1.0) {
            return Err(ModelError::Invalid(format!(
                "mfu must be in (0, 1], got {}",
                self.mfu
            )));
        }
        if !(self.gpu.bf16_tflops > 0.0 && self.gpu.dollars_per_hour >= 0.0) {
            return Err(ModelError::Invalid(format!(
                "GPU {}: TFLOPS must be positive and price not negative",
                self.gpu.name
            )));
        }
        if self.tokens_per_block == 0 {
            return Err(ModelError::Invalid(
                "tokens_per_block must be positive".into(),
            ));
        }
        self.tiers.iter().try_for_each(TierModel::validate)
    }

    /// Seconds of prefill compute for `new` tokens after `prefix` cached.
    pub fn compute_seconds(&self, new: f64, prefix: f64) -> f64 {
        let m = &self.model;
        let flops = prefill_flops(m.active_params, m.layers(), m.attention_width, new, prefix);
        flops / (self.gpu.bf16_tflops * 1e12 * self.mfu)
    }

    /// Bytes of KV a tier of `blocks` blocks holds.
    pub fn tier_bytes(&self, blocks: u64) -> f64 {
        blocks as f64 * f64::from(self.tokens_per_block) * self.model.kv_bytes_per_token() as f64
    }
}

/// The TTFTs of one request, seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RequestTtft {
    /// Cache loaded layer by layer under compute.
    pub with_cache: f64,
    /// Cache loaded whole before compute.
    pub with_cache_serial: f64,
    /// No cache: the whole prompt prefilled.
    pub without_cache: f64,
    /// GPU time waiting on loads in the overlapped case.
    pub bubble: f64,
    /// Hit blocks loaded in the overlapped case (the rest recomputed).
    pub loaded_blocks: u32,
}

/// TTFTs of a request of `input_tokens` with `hit_tokens` cached, found
/// `hit_blocks_per_tier[i]` blocks in tier `i` (see the module docs).
pub fn request_ttft(
    m: &ServingModel,
    input_tokens: u32,
    hit_tokens: u32,
    hit_blocks_per_tier: &[u32],
) -> RequestTtft {
    let input = f64::from(input_tokens);
    let hit = f64::from(hit_tokens.min(input_tokens));
    let hit_blocks: u32 = hit_blocks_per_tier.iter().sum();
    let layers = m.model.layers();
    let per_layer = |x: f64| x / f64::from(layers.max(1));
    let bytes_per_token = m.model.kv_bytes_per_token() as f64;
    let without = m.compute_seconds(input, 0.0);
    // The tokens of the first k hit blocks (the last hit block may be
    // partial: tokens are spread evenly over the hit blocks).
    let tokens_of = |k: u32| {
        if hit_blocks == 0 {
            0.0
        } else {
            hit * f64::from(k) / f64::from(hit_blocks)
        }
    };
    // Load time of the first k hit blocks, fastest tiers holding the
    // leading blocks; tiers load one after another.
    let load_of = |k: u32| {
        let (mut left, mut secs) = (k, 0.0);
        for (tier, &blocks) in m.tiers.iter().zip(hit_blocks_per_tier) {
            let take = left.min(blocks);
            left -= take;
            secs += tier.load_seconds(tokens_of(take) * bytes_per_token, f64::from(take));
        }
        secs
    };
    let mut best = RequestTtft {
        with_cache: f64::INFINITY,
        with_cache_serial: f64::INFINITY,
        without_cache: without,
        bubble: 0.0,
        loaded_blocks: 0,
    };
    for k in 0..=hit_blocks {
        let cached = tokens_of(k);
        // The last prompt token is always computed (it yields the first
        // output token), so at least one token is new.
        let new = if input_tokens == 0 {
            0.0
        } else {
            (input - cached).max(1.0)
        };
        let compute = m.compute_seconds(new, input - new);
        let load = load_of(k);
        let p = pipeline_uniform(layers, per_layer(load), per_layer(compute));
        if p.total_s < best.with_cache {
            best.with_cache = p.total_s;
            best.bubble = p.bubble_s;
            best.loaded_blocks = k;
        }
        best.with_cache_serial = best.with_cache_serial.min(load + compute);
    }
    best
}

/// Mean and percentiles of a sample, seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Stats {
    /// Mean.
    pub mean: f64,
    /// Median (nearest rank).
    pub p50: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// Sum of the sample.
    pub total: f64,
}

impl Stats {
    /// Statistics of `values` (all zero when empty).
    pub fn of(mut values: Vec<f64>) -> Self {
        if values.is_empty() {
            return Stats::default();
        }
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let rank = |q: f64| values[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
        let total: f64 = values.iter().sum();
        Stats {
            mean: total / n as f64,
            p50: rank(0.5),
            p99: rank(0.99),
            total,
        }
    }
}

/// TTFT statistics over a replay's requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct TtftSummary {
    /// Requests summarised.
    pub requests: u64,
    /// Cache loaded layer by layer under compute.
    pub with_cache: Stats,
    /// Cache loaded whole before compute.
    pub with_cache_serial: Stats,
    /// No cache.
    pub without_cache: Stats,
    /// GPU waiting on loads (overlapped case).
    pub bubble: Stats,
}

/// TTFT statistics of `outcomes` (a replay run with `keep_outcomes`).
pub fn ttft_summary(outcomes: &[RequestOutcome], m: &ServingModel) -> TtftSummary {
    let all: Vec<RequestTtft> = outcomes
        .iter()
        .map(|o| request_ttft(m, o.input_tokens, o.hit_tokens, &o.hit_blocks_per_tier))
        .collect();
    let pick = |f: fn(&RequestTtft) -> f64| Stats::of(all.iter().map(f).collect());
    TtftSummary {
        requests: outcomes.len() as u64,
        with_cache: pick(|t| t.with_cache),
        with_cache_serial: pick(|t| t.with_cache_serial),
        without_cache: pick(|t| t.without_cache),
        bubble: pick(|t| t.bubble),
    }
}
