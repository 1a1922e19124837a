//! The HTML page: a summary, up to six plots and the table of every point.
//!
//! Plots (each an inline `<svg>` from [`svg`](super::svg)):
//! 1. hit rate vs total capacity, one line per policy;
//! 2. cumulative hit rate over trace time for the first results (the search
//!    winner first when there is one);
//! 3. mean TTFT (cache overlapped) vs capacity per policy, with the no-cache
//!    TTFT as a reference line (only with a model);
//! 4. cost per million prompt tokens vs capacity per policy, with the
//!    no-cache cost as a reference line (only with a model);
//! 5. the trace's reuse distances as a CDF (a block reused within fewer
//!    distinct blocks than the capacity is, roughly, an LRU hit);
//! 6. the trace's uses per distinct block as a CDF;
//! 7. the share of the LRU→Belady gap each policy closes vs capacity (only
//!    when the sweep ran both LRU and Belady), with a table of the shares
//!    per layout: one row per layout, one column per policy.
//!
//! Every string from outside (title, policy and tier names) is escaped.

use std::fmt::Write as _;

use super::svg::{Chart, Series, fmt_num, line_chart};
use super::{Report, escape, layout_label};
use crate::replay::Histogram;
use crate::sweep::{Point, percent};

/// Timelines drawn in plot 2 at most (more lines are unreadable).
const MAX_TIMELINES: usize = 8;

/// One series per policy (in order of first appearance) of `(capacity,
/// f(point))`, sorted by capacity; points where `f` is `None` are skipped.
fn per_policy(points: &[Point], f: impl Fn(&Point) -> Option<f64>) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    for p in points {
        let Some(y) = f(p) else { continue };
        let i = match out.iter().position(|s| s.name == p.policy) {
            Some(i) => i,
            None => {
                out.push(Series {
                    name: p.policy.clone(),
                    points: Vec::new(),
                });
                out.len() - 1
            }
        };
        out[i].points.push((p.capacity as f64, y));
    }
    for s in &mut out {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// The no-cache reference: the value at each capacity of the first policy.
fn reference(points: &[Point], f: impl Fn(&Point) -> Option<f64>) -> Option<Series> {
    let first = points.first()?.policy.clone();
    let mut pts: Vec<(f64, f64)> = points
        .iter()
        .filter(|p| p.policy == first)
        .filter_map(|p| Some((p.capacity as f64, f(p)?)))
        .collect();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    (!pts.is_empty()).then(|| Series {
        name: "no cache".to_owned(),
        points: pts,
    })
}

/// A log capacity axis when the capacities span a factor of 10 or more.
fn log_capacity(points: &[Point]) -> bool {
    let lo = points.iter().map(|p| p.capacity).min().unwrap_or(0);
    let hi = points.iter().map(|p| p.capacity).max().unwrap_or(0);
    lo > 0 && hi >= 10 * lo
}

fn plots(report: &Report) -> Vec<String> {
    let r = &report.results;
    let x_log = log_capacity(r);
    let x_label = if x_log {
        "capacity (blocks, all tiers, log scale)"
    } else {
        "capacity (blocks, all tiers)"
    };
    let mut out = vec![line_chart(&Chart {
        title: "Hit rate vs capacity".into(),
        x_label: x_label.into(),
        y_label: "hit rate".into(),
        series: per_policy(r, |p| Some(p.hit_rate)),
        y_from_zero: true,
        x_log,
    })];
    let mut order: Vec<usize> = (0..r.len()).collect();
    if let Some(best) = report.search.and_then(|s| s.best) {
        order.retain(|&i| i != best);
        order.insert(0, best);
    }
    let timelines = order
        .into_iter()
        .take(MAX_TIMELINES)
        .filter_map(|i| r.get(i))
        .map(|p| Series {
            name: format!("{} {}", p.policy, layout_label(p)),
            points: p
                .timeline
                .iter()
                .map(|t| (t.t_ms as f64 / 1000.0, t.cumulative_hit_rate))
                .collect(),
        })
        .collect();
    out.push(line_chart(&Chart {
        title: "Cumulative hit rate over time".into(),
        x_label: "trace time (s)".into(),
        y_label: "hit rate".into(),
        series: timelines,
        y_from_zero: true,
        x_log: false,
    }));
    if r.iter().any(|p| p.gap_closed.is_some()) {
        out.push(line_chart(&Chart {
            title: "Share of the LRU→Belady gap closed".into(),
            x_label: x_label.into(),
            y_label: "gap closed (0 = LRU, 1 = Belady)".into(),
            series: per_policy(r, |p| p.gap_closed),
            y_from_zero: true,
            x_log,
        }));
    }
    if r.iter().any(|p| p.ttft.is_some()) {
        let mut ttft = per_policy(r, |p| p.ttft.map(|t| t.with_cache.mean));
        ttft.extend(reference(r, |p| p.ttft.map(|t| t.without_cache.mean)));
        out.push(line_chart(&Chart {
            title: "Mean TTFT vs capacity (layer-wise overlap)".into(),
            x_label: x_label.into(),
            y_label: "mean TTFT (s)".into(),
            series: ttft,
            y_from_zero: true,
            x_log,
        }));
        let mut cost = per_policy(r, |p| p.cost.map(|c| c.dollars_per_mtok_with_cache));
        cost.extend(reference(r, |p| {
            p.cost.map(|c| c.dollars_per_mtok_without_cache)
        }));
        out.push(line_chart(&Chart {
            title: "Cost vs capacity".into(),
            x_label: x_label.into(),
            y_label: "$ per million prompt tokens".into(),
            series: cost,
            y_from_zero: true,
            x_log,
        }));
    }
    out
}

/// The cumulative fraction of `h` at each bucket's upper bound.
fn cdf(name: &str, h: &Histogram) -> Option<Series> {
    if h.total == 0 {
        return None;
    }
    let mut seen = 0;
    let points = h
        .buckets
        .iter()
        .map(|&(bound, count)| {
            seen += count;
            (bound.max(1) as f64, seen as f64 / h.total as f64)
        })
        .collect();
    Some(Series {
        name: name.to_owned(),
        points,
    })
}

/// Plots of the trace itself (from the first result: every result has the
/// same): reuse distance and access frequency as CDFs, log x.
fn trace_plots(report: &Report) -> Vec<String> {
    let Some(p) = report.results.first() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (title, x_label, h) in [
        (
            "Reuse distance (CDF)",
            "distinct blocks between two uses (log scale)",
            &p.reuse_distance,
        ),
        (
            "Uses per distinct block (CDF)",
            "uses (log scale)",
            &p.access_frequency,
        ),
    ] {
        if let Some(series) = cdf("trace", h) {
            out.push(line_chart(&Chart {
                title: title.into(),
                x_label: x_label.into(),
                y_label: "fraction".into(),
                series: vec![series],
                y_from_zero: true,
                x_log: true,
            }));
        }
    }
    out
}

/// The gap table: one row per tier layout that has shares, one column per
/// policy (in order of first appearance); empty without LRU and Belady.
fn gap_table(report: &Report) -> String {
    let r = &report.results;
    let mut policies: Vec<&str> = Vec::new();
    let mut layouts: Vec<String> = Vec::new();
    for p in r.iter().filter(|p| p.gap_closed.is_some()) {
        if !policies.contains(&p.policy.as_str()) {
            policies.push(&p.policy);
        }
        let label = layout_label(p);
        if !layouts.contains(&label) {
            layouts.push(label);
        }
    }
    if layouts.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "<h2>Share of the LRU→Belady gap closed</h2>\n\
         <p>(hit rate − LRU) / (Belady − LRU) on the same tiers: 0% is LRU, \
         100% is the offline optimum, negative is below LRU.</p>\n\
         <table>\n<thead><tr><th>tiers</th>",
    );
    for name in &policies {
        let _ = write!(s, "<th>{}</th>", escape(name));
    }
    s.push_str("</tr></thead>\n<tbody>\n");
    for label in &layouts {
        let _ = write!(s, "<tr><td>{}</td>", escape(label));
        for name in &policies {
            let share = r
                .iter()
                .find(|p| p.policy == *name && layout_label(p) == *label)
                .and_then(|p| p.gap_closed);
            let _ = write!(s, "<td>{}</td>", percent(share));
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</tbody>\n</table>\n");
    s
}

fn table(report: &Report) -> String {
    let best = report.search.and_then(|s| s.best);
    let mut s = String::from(
        "<table>\n<thead><tr><th>policy</th><th>tiers</th><th>capacity</th><th>hit rate</th>\
         <th>gap closed</th><th>hits per tier</th><th>TTFT mean (s)</th><th>TTFT p99 (s)</th>\
         <th>TTFT serial mean (s)</th><th>TTFT no cache (s)</th><th>bubble mean (s)</th>\
         <th>$/Mtok</th><th>GPUs saved</th></tr></thead>\n<tbody>\n",
    );
    for (i, p) in report.results.iter().enumerate() {
        let opt = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), fmt_num);
        let t = p.ttft;
        let c = p.cost;
        let hits: Vec<String> = p
            .tiers
            .iter()
            .zip(&p.tier_hit_blocks)
            .map(|(t, h)| format!("{}: {h}", t.name))
            .collect();
        let class = if best == Some(i) {
            " class=\"best\""
        } else {
            ""
        };
        let _ = writeln!(
            s,
            "<tr{class}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&p.policy),
            escape(&layout_label(p)),
            p.capacity,
            fmt_num(p.hit_rate),
            percent(p.gap_closed),
            escape(&hits.join(", ")),
            opt(t.map(|t| t.with_cache.mean)),
            opt(t.map(|t| t.with_cache.p99)),
            opt(t.map(|t| t.with_cache_serial.mean)),
            opt(t.map(|t| t.without_cache.mean)),
            opt(t.map(|t| t.bubble.mean)),
            opt(c.map(|c| c.dollars_per_mtok_with_cache)),
            opt(c.map(|c| c.gpus_saved)),
        );
    }
    s.push_str("</tbody>\n</table>\n");
    s
}

/// The report as one self-contained HTML page.
pub fn to_html(report: &Report) -> String {
    let title = escape(&report.title);
    let tr = &report.trace;
    let mut s = format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>kvtier replay: {title}</title>\n<style>\n\
         body {{ font-family: sans-serif; margin: 2em; color: #222; }}\n\
         .plots {{ display: flex; flex-wrap: wrap; gap: 1em; }}\n\
         table {{ border-collapse: collapse; font-size: 13px; }}\n\
         th, td {{ border: 1px solid #ccc; padding: 3px 8px; text-align: right; }}\n\
         tr.best {{ background: #e6f4ea; font-weight: bold; }}\n\
         </style>\n</head>\n<body>\n<h1>kvtier replay: {title}</h1>\n\
         <p>{} requests, {} prompt tokens, {} tokens per block, spanning {:.0} s.</p>\n",
        tr.requests,
        tr.input_tokens,
        tr.tokens_per_block,
        tr.span_ms as f64 / 1000.0,
    );
    match &report.model {
        Some(m) => {
            let _ = writeln!(
                s,
                "<p>Model: {} on {} ({} TFLOPS BF16 at MFU {}, ${}/h); tiers: {}.</p>",
                escape(m.model.name),
                escape(m.gpu.name),
                fmt_num(m.gpu.bf16_tflops),
                m.mfu,
                fmt_num(m.gpu.dollars_per_hour),
                escape(
                    &m.tiers
                        .iter()
                        .map(|t| if t.resident {
                            format!("{} resident", t.name)
                        } else {
                            format!("{} {} GB/s", t.name, fmt_num(t.bandwidth_gbps))
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
        }
        None => s.push_str("<p>No TTFT or cost model: hit rates only.</p>\n"),
    }
    if let Some(search) = report.search {
        let target = search.target.to_string();
        let verdict = match search.best.and_then(|i| report.results.get(i)) {
            Some(p) => format!(
                "cheapest meeting it: {} {} (highlighted below)",
                p.policy,
                layout_label(p)
            ),
            None => "no configuration meets it".to_owned(),
        };
        let _ = writeln!(
            s,
            "<p>Search target: {}; {}.</p>",
            escape(&target),
            escape(&verdict)
        );
    }
    s.push_str("<div class=\"plots\">\n");
    for plot in plots(report).into_iter().chain(trace_plots(report)) {
        s.push_str("<figure>\n");
        s.push_str(&plot);
        s.push_str("</figure>\n");
    }
    s.push_str("</div>\n");
    s.push_str(&gap_table(report));
    s.push_str("<h2>Results</h2>\n");
    s.push_str(&table(report));
    s.push_str("</body>\n</html>\n");
    s
}
