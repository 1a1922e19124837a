//! Replay speed: block accesses per second for every policy, with the
//! node's leaf-first filter (the default) and without it ("plain"), and the
//! time of the Mooncake conversation trace.
//!
//! `cargo run --release -p kvtier-sim --example replay_speed [TRACE]`
//! (default trace: `../shared/traces/mooncake_conversation_trace.jsonl` beside the repository,
//! or `$KVTIER_TRACE`). The trace is replayed `REPEAT` times back to back
//! (timestamps shifted) so each figure covers a few million accesses.

use std::path::PathBuf;
use std::time::Instant;

use kvtier_sim::policy::PolicyKind;
use kvtier_sim::replay::{ReplayConfig, replay};
use kvtier_sim::trace::{self, Request};

const REPEAT: u64 = 8;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("KVTIER_TRACE").ok())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../../shared/traces/mooncake_conversation_trace.jsonl"
            ))
        });
    let t = Instant::now();
    let requests = trace::read_all(&path, None)?;
    let read_s = t.elapsed().as_secs_f64();
    let accesses: usize = requests.iter().map(|r| r.keys.len()).sum();
    println!(
        "trace {}: {} requests, {} block accesses, read in {:.3} s",
        path.display(),
        requests.len(),
        accesses,
        read_s
    );

    // A capacity of a quarter of the distinct blocks keeps every policy busy
    // evicting.
    let mut distinct: Vec<u128> = requests
        .iter()
        .flat_map(|r| r.keys.iter().map(|k| k.0))
        .collect();
    distinct.sort_unstable();
    distinct.dedup();
    let cap = (distinct.len() / 4) as u64;

    let mut cfg = ReplayConfig::single(PolicyKind::Lru, cap);
    cfg.ttl_ms = Some(600_000);
    let once = replay(&requests, &cfg);
    println!(
        "conversation trace, lru, capacity {cap}: hit rate {:.4}, {:.3} s",
        once.hit_rate, once.elapsed_s
    );

    let span = requests.iter().map(|r| r.timestamp_ms).max().unwrap_or(0) + 1;
    let long: Vec<Request> = (0..REPEAT)
        .flat_map(|i| {
            requests.iter().map(move |r| {
                let mut r = r.clone();
                r.timestamp_ms += i * span;
                r.instance = 0;
                r
            })
        })
        .collect();
    println!(
        "{:>11} {:>10} {:>14} {:>10} {:>14}",
        "policy", "hit rate", "accesses/s", "plain hit", "plain acc/s"
    );
    for policy in PolicyKind::ALL {
        // Cost-aware scans every block per eviction (O(n)): one pass of
        // the trace, not REPEAT.
        let input = if policy == PolicyKind::CostAware {
            &requests
        } else {
            &long
        };
        cfg.policy = policy;
        let node = replay(input, &cfg.clone().with_leaf_first(true));
        let plain = replay(input, &cfg.clone().with_leaf_first(false));
        let rate = |r: &kvtier_sim::replay::ReplayResult| r.accesses as f64 / r.elapsed_s;
        println!(
            "{:>11} {:>10.4} {:>14.0} {:>10.4} {:>14.0}",
            policy.name(),
            node.hit_rate,
            rate(&node),
            plain.hit_rate,
            rate(&plain)
        );
    }
    Ok(())
}
