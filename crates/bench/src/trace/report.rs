//! The human-readable rendering of a [`TraceBenchReport`].

use std::fmt::Write;

use super::TraceBenchReport;

/// The report as text: hit rates per tier, bytes and latency per path,
/// bubble, modelled TTFTs and the verification count.
pub fn render_text(r: &TraceBenchReport) -> String {
    let mut out = String::new();
    let pct = |n: u64| {
        if r.blocks == 0 {
            0.0
        } else {
            100.0 * n as f64 / r.blocks as f64
        }
    };
    // Writing to a String cannot fail.
    let _ = writeln!(out, "kvtier bench trace: {}", r.settings);
    let _ = writeln!(
        out,
        "requests {}  blocks {}  truncated {}  elapsed {:.2} s",
        r.requests, r.blocks, r.truncated_blocks, r.elapsed_s
    );
    let _ = writeln!(
        out,
        "\nhits per tier (fastest holder of each prefix block):"
    );
    for (tier, hits) in &r.hits {
        let _ = writeln!(out, "  {tier}: {hits:>8} blocks  {:>6.2} %", pct(*hits));
    }
    let _ = writeln!(
        out,
        "  miss {:>6} blocks  {:>6.2} %",
        r.misses,
        pct(r.misses)
    );
    let _ = writeln!(out, "\ntier occupancy and evictions:");
    for t in &r.stats.tiers {
        let _ = writeln!(
            out,
            "  {}: {}/{} used  evictions {}  offloaded down {}  stored events {}  removed events {}",
            t.tier,
            t.pool.capacity - t.pool.free,
            t.pool.capacity,
            t.pool.evictions,
            t.offloaded,
            t.stored_events,
            t.removed_events
        );
    }
    let _ = writeln!(
        out,
        "  dropped from the hierarchy {} (of which reclaimed by the disk log {}, lost re-inserting {})  admission refusals {}",
        r.stats.dropped,
        r.stats.reclaimed_by_disk,
        r.stats.lost_by_disk,
        r.stats.admission_refusals
    );
    let _ = writeln!(out, "\nbytes moved per path:");
    for p in &r.stats.paths {
        let _ = writeln!(
            out,
            "  {:<7} {:>12} B  {:>7} blocks  {:>6} transfers  failed {:>4}  latency mean {} us p99 {} us",
            p.path.name(),
            p.bytes,
            p.blocks,
            p.transfers,
            p.failed_blocks,
            p.latency.mean_us,
            p.latency.p99_us
        );
    }
    if let Some(d) = &r.disk {
        let _ = writeln!(
            out,
            "\ndisk reads ({:?} layout): {} ops ({} runs, {} layer pieces) for {} block-layers to G2: {:.3} ops per block-layer",
            d.layout,
            d.read_ios,
            d.read_runs,
            d.layer_pieces,
            d.block_layers,
            d.ops_per_block_layer
        );
        let _ = writeln!(
            out,
            "disk log: {} regions reclaimed of {} ({:.1} wraps), {} blocks re-inserted",
            d.regions_reclaimed,
            d.regions,
            d.regions_reclaimed as f64 / d.regions.max(1) as f64,
            d.reinserted
        );
    }
    let _ = writeln!(
        out,
        "\nbubble (measured, consumer waiting for layers): {:.3} ms over {} layer waits ({} blocked)",
        r.stats.bubble.as_secs_f64() * 1e3,
        r.stats.scheduler.layer_waits,
        r.stats.scheduler.blocked_layer_waits
    );
    let _ = writeln!(out, "\nmodelled TTFT (mean per request):");
    let _ = writeln!(
        out,
        "  layer-wise overlap  {:>9.2} ms",
        r.ttft.overlapped_s * 1e3
    );
    let _ = writeln!(
        out,
        "  load then compute   {:>9.2} ms",
        r.ttft.serial_s * 1e3
    );
    let _ = writeln!(
        out,
        "  no cache            {:>9.2} ms",
        r.ttft.no_cache_s * 1e3
    );
    let _ = writeln!(
        out,
        "  modelled bubble     {:>9.2} ms",
        r.ttft.bubble_s * 1e3
    );
    let _ = writeln!(
        out,
        "\nverification: {} blocks compared, {} failures; {} onboards failed (recomputed)",
        r.verified_blocks, r.verify_failures, r.onboard_failures
    );
    out
}
