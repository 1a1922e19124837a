//! The TTFT and cost model against hand-computed values and its invariants.

use kvtier_core::ModelPreset;
use kvtier_sim::model::{
    GpuKind, ModelSpec, ServingModel, TierModel, cost_summary, request_ttft, ttft_summary,
};
use kvtier_sim::replay::{RequestOutcome, TierSpec};

fn model(tiers: &[&str]) -> ServingModel {
    ServingModel::new(
        ModelSpec::preset(ModelPreset::Llama3_70B),
        GpuKind::H100Sxm.spec(),
        tiers,
        512,
    )
}

#[test]
fn more_cached_prefix_means_lower_ttft() {
    for tier in ["G2", "G3", "G4", "G1"] {
        let m = model(&[tier]);
        let input = 32 * 512;
        let mut last = f64::INFINITY;
        for blocks in 0..=32u32 {
            let t = request_ttft(&m, input, blocks * 512, &[blocks]);
            // Never slower; strictly faster from tiers that beat recompute.
            assert!(
                t.with_cache <= last,
                "{tier}: {blocks} blocks -> {}",
                t.with_cache
            );
            if tier != "G3" {
                assert!(
                    t.with_cache < last,
                    "{tier}: {blocks} blocks -> {}",
                    t.with_cache
                );
            }
            assert!(t.with_cache_serial <= t.without_cache);
            last = t.with_cache;
        }
    }
}

#[test]
fn overlap_is_never_slower_than_serial_loading() {
    for tiers in [&["G2"][..], &["G3"], &["G1", "G2", "G3"], &["G4"]] {
        let m = model(tiers);
        for input in [512u32, 4096, 100_000] {
            for hit_frac in [0.0, 0.25, 0.5, 0.9, 1.0] {
                let hit = (f64::from(input) * hit_frac) as u32;
                let blocks = hit.div_ceil(512);
                let mut per_tier = vec![0; tiers.len()];
                per_tier[tiers.len() - 1] = blocks;
                let t = request_ttft(&m, input, hit, &per_tier);
                assert!(t.with_cache <= t.with_cache_serial + 1e-12);
                assert!(t.bubble >= 0.0 && t.bubble <= t.with_cache);
            }
        }
    }
}

#[test]
fn zero_cache_is_the_no_cache_prefill() {
    let m = model(&["G2"]);
    let t = request_ttft(&m, 12_000, 0, &[0]);
    assert_eq!(t.with_cache, t.without_cache);
    assert_eq!(t.with_cache_serial, t.without_cache);
    assert_eq!(t.bubble, 0.0);
    // 2 x 70.6e9 x 12000 + 4 x 80 x 8192 x 12000 x 6000 FLOPs at 494.5 TFLOP/s.
    let flops = 2.0 * 70.6e9 * 12_000.0 + 4.0 * 80.0 * 8192.0 * 12_000.0 * 6000.0;
    assert!((t.without_cache - flops / (989e12 * 0.5)).abs() < 1e-12);
}

#[test]
fn a_full_hit_still_computes_one_token() {
    let m = model(&["G1"]);
    let t = request_ttft(&m, 1024, 1024, &[2]);
    let one = m.compute_seconds(1.0, 1023.0);
    assert!((t.with_cache - one).abs() < 1e-15);
    assert!(t.with_cache > 0.0);
}

#[test]
fn io_bound_loads_show_as_bubble() {
    // NVMe at 7 GB/s: 80 layers x 4096 cached tokens x 320 KiB is 1.34 GB,
    // ~192 ms to load; computing 512 new tokens takes ~ 80 ms.
    let m = model(&["G3"]);
    let t = request_ttft(&m, 4608, 4096, &[8]);
    let load = 4096.0 * 327_680.0 / 7e9;
    let compute = m.compute_seconds(512.0, 4096.0);
    assert!(load > compute);
    // Load-bound pipeline: all loads, then the last layer's compute.
    assert!((t.with_cache - (load + compute / 80.0)).abs() < 1e-9);
    assert!((t.bubble - (t.with_cache - compute)).abs() < 1e-9);
    assert!((t.with_cache_serial - (load + compute)).abs() < 1e-9);
    assert_eq!(t.loaded_blocks, 8);
}

#[test]
fn a_slow_tier_is_loaded_only_as_far_as_it_pays() {
    // 32 blocks of 512 tokens on NVMe: loading all 16,384 tokens' KV takes
    // 0.77 s, more than a partial load plus recompute.
    let m = model(&["G3"]);
    let t = request_ttft(&m, 32 * 512, 31 * 512, &[31]);
    assert!(
        t.loaded_blocks > 0 && t.loaded_blocks < 31,
        "{}",
        t.loaded_blocks
    );
    let all = 31.0 * 512.0 * 327_680.0 / 7e9;
    assert!(t.with_cache < all);
}

#[test]
fn summary_and_cost_on_hand_values() {
    let mut m = model(&["G2"]);
    m.tiers = vec![TierModel::for_name("G2")];
    let outcome = |input, hit_blocks| RequestOutcome {
        timestamp_ms: 0,
        instance: 0,
        input_tokens: input,
        requested_blocks: input.div_ceil(512),
        hit_blocks,
        hit_tokens: hit_blocks * 512,
        hit_blocks_per_tier: vec![hit_blocks],
    };
    let outcomes = [outcome(2048, 0), outcome(2048, 2), outcome(2048, 4)];
    let s = ttft_summary(&outcomes, &m);
    assert_eq!(s.requests, 3);
    let per: Vec<f64> = outcomes
        .iter()
        .map(|o| request_ttft(&m, o.input_tokens, o.hit_tokens, &o.hit_blocks_per_tier).with_cache)
        .collect();
    assert!((s.with_cache.mean - per.iter().sum::<f64>() / 3.0).abs() < 1e-15);
    assert_eq!(s.with_cache.p50, per[1]);
    assert_eq!(s.with_cache.p99, per[0]);
    assert!((s.without_cache.mean - s.without_cache.p50).abs() < 1e-15);

    // One hour, 3.6M tokens, 1000 blocks of 512 tokens x 327,680 B in DRAM.
    let tiers = [TierSpec {
        name: "G2".into(),
        capacity_blocks: 1000,
    }];
    let c = cost_summary(&m, &tiers, &s, 3_600_000, 3_600_000);
    let gb = 1000.0 * 512.0 * 327_680.0 / 1e9;
    assert!((c.storage_gb - gb).abs() < 1e-9);
    let gpus = s.with_cache.total / 3600.0;
    let expected = (gpus * 5.0 + gb * 0.0088) / 3.6;
    assert!((c.dollars_per_mtok_with_cache - expected).abs() < 1e-12);
    assert!(
        (c.dollars_per_mtok_without_cache - s.without_cache.total / 3600.0 * 5.0 / 3.6).abs()
            < 1e-12
    );
    assert!((c.gpus_saved - (s.without_cache.total - s.with_cache.total) / 3600.0).abs() < 1e-15);
}

#[test]
fn bad_parameters_are_refused() {
    let mut m = model(&["G2"]);
    assert!(m.validate().is_ok());
    m.mfu = 1.5;
    assert!(m.validate().is_err());
    let mut m = model(&["G2"]);
    m.tiers[0].bandwidth_gbps = 0.0;
    assert!(m.validate().is_err());
}
