//! Replay of a request trace through an eviction policy and a tier
//! hierarchy: what hit rate would a cache of this size, with this policy,
//! have had on this traffic?
//!
//! Definitions (see `docs/traces.md`):
//! - a request's **hit blocks** are the leading run of its blocks found in
//!   the cache when it arrives (a block after the first miss is recomputed
//!   anyway); **hit rate** = hit blocks / requested blocks;
//! - after a request, all of its blocks are in the fastest tier (touched,
//!   or inserted after room was made), up to that tier's capacity: a
//!   longer request keeps only its first blocks, as on the node;
//! - caches are per instance (blocks are keyed by `(instance, key)`), and
//!   the capacities are shared by all instances of the trace;
//! - tiers are fastest first and **exclusive**, served the way the node's
//!   block manager serves them: a hit in tier k counts for tier k and
//!   promotes the block to tier 0; room for a request is made before its
//!   blocks come in, with its hits protected; victims are chosen by the
//!   tier's policy, **leaves of the prefix tree first** (unless
//!   `leaf_first` is off), and go to tier k + 1, each prefix chain among
//!   them contiguous and root first, as the node writes them; those evicted from the
//!   last tier are dropped (`engine` lists every step; `kvtier-bench`'s
//!   agreement test holds the replay to the real manager);
//! - time: TTL expiry runs at each request's timestamp; the timeline buckets
//!   requests by timestamp;
//! - `reuse_distance` counts block accesses since the previous use of the
//!   same block (1 = the very next access), `access_frequency` the uses of
//!   each distinct block.
//!
//! The loop itself lives in `engine`; `stats` has the histograms and the
//! timeline.
//!
//! ```
//! use kvtier_core::BlockHash;
//! use kvtier_sim::policy::PolicyKind;
//! use kvtier_sim::replay::{ReplayConfig, replay};
//! use kvtier_sim::trace::Request;
//!
//! let req = |t, keys: &[u128]| Request {
//!     timestamp_ms: t,
//!     instance: 0,
//!     input_tokens: 16 * keys.len() as u32,
//!     output_tokens: 1,
//!     keys: keys.iter().copied().map(BlockHash).collect(),
//!     tokens_per_block: 16,
//!     last_block_tokens: 16,
//! };
//! let trace = [req(0, &[1, 2, 3]), req(10, &[1, 2, 4])];
//! let r = replay(&trace, &ReplayConfig::single(PolicyKind::Lru, 100));
//! assert_eq!((r.hit_blocks, r.requested_blocks), (2, 6));
//! ```
//!
//! Limits: at most 2^32 - 2 distinct `(instance, key)` blocks per replay
//! (ids are `u32`) and 64 tiers.

use std::time::Instant;

use hashbrown::HashMap;
use serde::{Deserialize, Serialize};

mod engine;
mod stats;

use engine::Engine;
use stats::{Pow2Counter, ratio};

use crate::policy::PolicyKind;
use crate::trace::{Request, TraceError};

/// One tier of the simulated hierarchy.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TierSpec {
    /// Display name (`G1`, `G2`, `dram`, ...).
    pub name: String,
    /// Capacity in blocks.
    pub capacity_blocks: u64,
}

/// What to replay and how. Deserializing fills left-out options with the
/// defaults of [`ReplayConfig::single`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayConfig {
    /// The eviction policy of every tier.
    pub policy: PolicyKind,
    /// Tiers, fastest first (G1..G4); a single tier is the common case.
    pub tiers: Vec<TierSpec>,
    /// Idle time after which [`PolicyKind::Ttl`] drops a block. Default:
    /// `None` (TTL behaves as LRU).
    #[serde(default)]
    pub ttl_ms: Option<u64>,
    /// Most points of the hit-rate timeline. Default: 50.
    #[serde(default = "default_timeline_points")]
    pub timeline_points: usize,
    /// Seed of the policies' randomness (random-LRU). Default: 0.
    #[serde(default)]
    pub seed: u64,
    /// Keep one [`RequestOutcome`] per request in the result. Default:
    /// false.
    #[serde(default)]
    pub keep_outcomes: bool,
    /// Evict leaves of the prefix tree before their parents, as the node
    /// always does. Default: true; false shows what the plain policy would
    /// do.
    #[serde(default = "default_leaf_first")]
    pub leaf_first: bool,
}

fn default_leaf_first() -> bool {
    true
}

fn default_timeline_points() -> usize {
    50
}

impl TierSpec {
    /// A tier named `name` of `capacity_blocks` blocks.
    pub fn new(name: impl Into<String>, capacity_blocks: u64) -> Self {
        TierSpec {
            name: name.into(),
            capacity_blocks,
        }
    }
}

impl ReplayConfig {
    /// One tier named `G1` of `capacity_blocks`, default options.
    pub fn single(policy: PolicyKind, capacity_blocks: u64) -> Self {
        Self::tiered(policy, vec![TierSpec::new("G1", capacity_blocks)])
    }

    /// `tiers`, fastest first, default options.
    pub fn tiered(policy: PolicyKind, tiers: Vec<TierSpec>) -> Self {
        ReplayConfig {
            policy,
            tiers,
            ttl_ms: None,
            timeline_points: default_timeline_points(),
            seed: 0,
            keep_outcomes: false,
            leaf_first: default_leaf_first(),
        }
    }

    /// Sets [`ReplayConfig::ttl_ms`].
    pub fn with_ttl_ms(mut self, ttl_ms: u64) -> Self {
        self.ttl_ms = Some(ttl_ms);
        self
    }

    /// Sets [`ReplayConfig::seed`].
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Sets [`ReplayConfig::leaf_first`].
    pub fn with_leaf_first(mut self, leaf_first: bool) -> Self {
        self.leaf_first = leaf_first;
        self
    }

    /// Sets [`ReplayConfig::keep_outcomes`].
    pub fn with_outcomes(mut self, keep: bool) -> Self {
        self.keep_outcomes = keep;
        self
    }

    /// Total blocks over all tiers.
    pub fn capacity(&self) -> u64 {
        self.tiers.iter().map(|t| t.capacity_blocks).sum()
    }
}

/// What happened to one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestOutcome {
    /// Arrival time in milliseconds.
    pub timestamp_ms: u64,
    /// Instance of the request.
    pub instance: u32,
    /// Prompt tokens.
    pub input_tokens: u32,
    /// Blocks of the prompt.
    pub requested_blocks: u32,
    /// Leading blocks found in the cache.
    pub hit_blocks: u32,
    /// Tokens covered by the hit blocks.
    pub hit_tokens: u32,
    /// Hit blocks by the tier they were found in (fastest first).
    pub hit_blocks_per_tier: Vec<u32>,
}

/// One point of the hit-rate timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimelinePoint {
    /// End of the window (trace time, milliseconds).
    pub t_ms: u64,
    /// Requests replayed up to this point.
    pub requests: u64,
    /// Hit rate over the window since the previous point.
    pub hit_rate: f64,
    /// Hit rate from the start up to this point.
    pub cumulative_hit_rate: f64,
}

/// A histogram over power-of-two buckets.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Histogram {
    /// `(upper bound, count)`, bounds powers of two.
    pub buckets: Vec<(u64, u64)>,
    /// Sum of the counts.
    pub total: u64,
}

/// The result of one replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayResult {
    /// Name of the policy.
    pub policy: String,
    /// Total blocks over all tiers.
    pub capacity: u64,
    /// The tiers replayed.
    pub tiers: Vec<TierSpec>,
    /// Requests replayed.
    pub requests: u64,
    /// Blocks requested.
    pub requested_blocks: u64,
    /// Leading blocks found in the cache.
    pub hit_blocks: u64,
    /// `hit_blocks / requested_blocks` (0 when nothing was requested).
    pub hit_rate: f64,
    /// Hit blocks by tier, fastest first.
    pub tier_hit_blocks: Vec<u64>,
    /// Blocks dropped from the last tier or expired (TTL).
    #[serde(default)]
    pub dropped_blocks: u64,
    /// Hit rate over time.
    pub timeline: Vec<TimelinePoint>,
    /// Distribution of reuse distances (distinct blocks between two uses).
    pub reuse_distance: Histogram,
    /// Distribution of uses per distinct block.
    pub access_frequency: Histogram,
    /// One entry per request when `keep_outcomes`, else empty.
    pub outcomes: Vec<RequestOutcome>,
    /// Block accesses replayed.
    pub accesses: u64,
    /// Wall-clock seconds the replay took.
    pub elapsed_s: f64,
}

/// Replays `requests` under `cfg`; every policy, Belady included.
pub fn replay(requests: &[Request], cfg: &ReplayConfig) -> ReplayResult {
    let start = Instant::now();
    let next_use = if cfg.policy.needs_future() {
        next_uses(requests)
    } else {
        Vec::new()
    };
    let span = match (
        requests.iter().map(|r| r.timestamp_ms).min(),
        requests.iter().map(|r| r.timestamp_ms).max(),
    ) {
        (Some(a), Some(b)) => Some((a, b)),
        _ => None,
    };
    let mut engine = Engine::new(cfg, span);
    for r in requests {
        engine.step(r, &next_use);
    }
    finish(engine, cfg, start)
}

/// Replays a stream of requests under `cfg`, holding one request at a time
/// (memory grows with the distinct blocks, not with the trace). Belady needs
/// the whole trace and is refused with [`TraceError::Unsupported`]: read the
/// trace with [`crate::trace::read_all`] and call [`replay`] instead.
pub fn replay_stream<I: Iterator<Item = Result<Request, TraceError>>>(
    requests: I,
    cfg: &ReplayConfig,
) -> Result<ReplayResult, TraceError> {
    if cfg.policy.needs_future() {
        return Err(TraceError::Unsupported(format!(
            "{} needs the whole trace: replay it from memory (replay, not replay_stream)",
            cfg.policy
        )));
    }
    let start = Instant::now();
    let mut engine = Engine::new(cfg, None);
    for r in requests {
        engine.step(&r?, &[]);
    }
    Ok(finish(engine, cfg, start))
}

/// For each block access, in replay order, the 1-based position of the next
/// access to the same block (`u64::MAX`: never again).
fn next_uses(requests: &[Request]) -> Vec<u64> {
    let total: usize = requests.iter().map(|r| r.keys.len()).sum();
    let mut next = vec![u64::MAX; total];
    let mut seen: HashMap<(u32, u128), u64> = HashMap::new();
    let mut p = total;
    for r in requests.iter().rev() {
        for k in r.keys.iter().rev() {
            p -= 1;
            if let Some(n) = seen.insert((r.instance, k.0), p as u64 + 1) {
                next[p] = n;
            }
        }
    }
    next
}

fn finish(engine: Engine, cfg: &ReplayConfig, start: Instant) -> ReplayResult {
    let mut freq = Pow2Counter::default();
    for &u in &engine.uses()[..engine.distinct_blocks()] {
        freq.add(u64::from(u));
    }
    let tiers: Vec<TierSpec> = cfg.tiers.iter().take(engine::MAX_TIERS).cloned().collect();
    ReplayResult {
        policy: cfg.policy.name().to_owned(),
        capacity: tiers.iter().map(|t| t.capacity_blocks).sum(),
        tiers,
        requests: engine.requests,
        requested_blocks: engine.requested_blocks,
        hit_blocks: engine.hit_blocks,
        hit_rate: ratio(engine.hit_blocks, engine.requested_blocks),
        tier_hit_blocks: engine.tier_hit_blocks.clone(),
        dropped_blocks: engine.dropped_blocks,
        timeline: engine.timeline.finish(),
        reuse_distance: engine.reuse.finish(),
        access_frequency: freq.finish(),
        accesses: engine.accesses(),
        outcomes: engine.outcomes,
        elapsed_s: start.elapsed().as_secs_f64(),
    }
}
