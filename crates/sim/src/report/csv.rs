//! CSV: a header and one row per point; model figures are empty when the
//! report has no model.

use super::{Report, layout_label};

/// The CSV columns, in order.
pub const COLUMNS: [&str; 18] = [
    "policy",
    "capacity",
    "tiers",
    "hit_rate",
    "requests",
    "requested_blocks",
    "hit_blocks",
    "tier_hit_blocks",
    "ttft_mean_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "ttft_serial_mean_s",
    "ttft_nocache_mean_s",
    "bubble_mean_s",
    "dollars_per_mtok",
    "dollars_per_mtok_nocache",
    "gpus_saved",
    "gap_closed",
];

/// Quotes a field that holds a comma, a quote or a line break (RFC 4180).
fn field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// The report as CSV (header + one row per result, `\n` line ends).
pub fn to_csv(report: &Report) -> String {
    let mut out = COLUMNS.join(",");
    out.push('\n');
    for p in &report.results {
        let opt = |v: Option<f64>| v.map(|x| format!("{x:.6}")).unwrap_or_default();
        let t = p.ttft;
        let c = p.cost;
        let row = [
            field(&p.policy),
            p.capacity.to_string(),
            field(&layout_label(p)),
            format!("{:.6}", p.hit_rate),
            p.requests.to_string(),
            p.requested_blocks.to_string(),
            p.hit_blocks.to_string(),
            p.tier_hit_blocks
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join("+"),
            opt(t.map(|t| t.with_cache.mean)),
            opt(t.map(|t| t.with_cache.p50)),
            opt(t.map(|t| t.with_cache.p99)),
            opt(t.map(|t| t.with_cache_serial.mean)),
            opt(t.map(|t| t.without_cache.mean)),
            opt(t.map(|t| t.bubble.mean)),
            opt(c.map(|c| c.dollars_per_mtok_with_cache)),
            opt(c.map(|c| c.dollars_per_mtok_without_cache)),
            opt(c.map(|c| c.gpus_saved)),
            opt(p.gap_closed),
        ];
        out.push_str(&row.join(","));
        out.push('\n');
    }
    out
}
