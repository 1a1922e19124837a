//! Reports: the HTML is well formed and its plots hold the data; CSV and
//! JSON have one entry per result with the documented fields.

use kvtier_core::ModelPreset;
use kvtier_sim::model::{CostSummary, GpuKind, ModelSpec, ServingModel, Stats, TtftSummary};
use kvtier_sim::replay::{Histogram, TierSpec, TimelinePoint};
use kvtier_sim::report::{Report, csv::COLUMNS, escape, to_csv, to_html};
use kvtier_sim::sweep::{Point, SearchResult, Target, TraceFacts};

fn stats(mean: f64) -> Stats {
    Stats {
        mean,
        p50: mean,
        p99: 2.0 * mean,
        total: 10.0 * mean,
    }
}

fn point(policy: &str, capacity: u64, hit_rate: f64) -> Point {
    Point {
        policy: policy.to_owned(),
        capacity,
        tiers: vec![TierSpec {
            name: "G2".into(),
            capacity_blocks: capacity,
        }],
        hit_rate,
        gap_closed: None,
        requests: 10,
        requested_blocks: 100,
        hit_blocks: (hit_rate * 100.0) as u64,
        tier_hit_blocks: vec![(hit_rate * 100.0) as u64],
        ttft: Some(TtftSummary {
            requests: 10,
            with_cache: stats(1.0 - hit_rate),
            with_cache_serial: stats(1.1 - hit_rate),
            without_cache: stats(1.0),
            bubble: stats(0.01),
        }),
        cost: Some(CostSummary {
            dollars_per_mtok_with_cache: 2.0 - hit_rate,
            dollars_per_mtok_without_cache: 2.0,
            ..Default::default()
        }),
        timeline: vec![
            TimelinePoint {
                t_ms: 1000,
                requests: 5,
                hit_rate: hit_rate / 2.0,
                cumulative_hit_rate: hit_rate / 2.0,
            },
            TimelinePoint {
                t_ms: 2000,
                requests: 10,
                hit_rate,
                cumulative_hit_rate: 0.75 * hit_rate,
            },
        ],
        reuse_distance: Histogram {
            buckets: vec![(1, 2), (2, 1), (4, 1)],
            total: 4,
        },
        access_frequency: Histogram::default(),
        accesses: 100,
        replay_s: 0.0,
    }
}

fn report() -> Report {
    let results = vec![
        point("lru", 1000, 0.25),
        point("lru", 2000, 0.5),
        point("<script>alert(1)</script>", 1000, 0.375),
        point("<script>alert(1)</script>", 2000, 0.625),
    ];
    let model = ServingModel::new(
        ModelSpec::preset(ModelPreset::Llama3_8B),
        GpuKind::H100Sxm.spec(),
        &["G2"],
        512,
    );
    let facts = TraceFacts {
        requests: 10,
        input_tokens: 5120,
        span_ms: 2000,
        tokens_per_block: 512,
    };
    let search = SearchResult {
        target: Target::HitRate(0.5),
        best: Some(1),
        points: results,
    };
    Report::from_search("trace \"a&b\".jsonl", facts, model, search)
}

const VOID: [&str; 3] = ["meta", "br", "hr"];

/// Checks every tag closes in order; returns the opening tag names seen.
fn balanced(html: &str) -> Result<Vec<String>, String> {
    let mut stack: Vec<String> = Vec::new();
    let mut seen = Vec::new();
    let mut rest = html;
    while let Some(start) = rest.find('<') {
        let end = rest[start..].find('>').ok_or("unclosed <")? + start;
        let tag = &rest[start + 1..end];
        rest = &rest[end + 1..];
        if tag.starts_with('!') {
            continue;
        }
        let self_closing = tag.ends_with('/');
        let name: String = tag
            .trim_start_matches('/')
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        if name.is_empty() {
            return Err(format!("bad tag <{tag}>"));
        }
        if tag.starts_with('/') {
            match stack.pop() {
                Some(open) if open == name => {}
                other => return Err(format!("</{name}> closes {other:?}")),
            }
        } else if !self_closing && !VOID.contains(&name.as_str()) {
            stack.push(name.clone());
            seen.push(name);
        } else {
            seen.push(name);
        }
    }
    if stack.is_empty() {
        Ok(seen)
    } else {
        Err(format!("unclosed {stack:?}"))
    }
}

#[test]
fn html_is_well_formed_and_plots_hold_the_data() {
    let html = to_html(&report());
    let tags = balanced(&html).unwrap_or_else(|e| panic!("{e}"));
    assert!(html.starts_with("<!DOCTYPE html>"));
    // Hit rate, timeline, TTFT, cost, reuse distance; no access frequencies.
    assert_eq!(
        tags.iter().filter(|t| *t == "svg").count(),
        5,
        "one svg per plot"
    );
    // The reuse-distance CDF: half the reuses within distance 1, 3/4 within 2.
    assert!(html.contains("trace: x=1, y=0.5000") && html.contains("trace: x=2, y=0.7500"));
    assert!(!html.contains("<script>"), "names are escaped");
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(html.contains("trace &quot;a&amp;b&quot;.jsonl"));
    assert!(
        !html.contains("http://")
            || html.matches("http://").count()
                == html.matches("xmlns=\"http://www.w3.org/2000/svg\"").count(),
        "no external assets"
    );

    // Hit rate vs capacity: every (capacity, hit rate) is a point.
    for (x, y) in [
        ("1000", "0.2500"),
        ("2000", "0.5000"),
        ("1000", "0.3750"),
        ("2000", "0.6250"),
    ] {
        assert!(
            html.contains(&format!("data-x=\"{x}\" data-y=\"{y}\"")),
            "{x} {y}"
        );
    }
    // Timelines in seconds, the search winner's among them.
    assert!(html.contains("lru G2=2000: x=2, y=0.3750"));
    // TTFT and cost: mean TTFT 0.75 s for lru at 1000, cost 1.5 at 2000.
    assert!(html.contains("lru: x=1000, y=0.7500"));
    assert!(html.contains("lru: x=2000, y=1.5000"));
    assert!(html.contains("no cache: x=1000, y=2</title>"));
    // The table has a row per result, the winner highlighted.
    assert_eq!(html.matches("<tr").count(), 5);
    assert_eq!(html.matches("class=\"best\"").count(), 1);
}

#[test]
fn html_without_a_model_has_only_the_hit_rate_plots() {
    let mut r = report();
    r.model = None;
    for p in &mut r.results {
        p.ttft = None;
        p.cost = None;
        p.reuse_distance = Histogram::default();
    }
    let html = to_html(&r);
    balanced(&html).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(html.matches("<svg").count(), 2);
}

#[test]
fn csv_has_a_header_and_one_row_per_result() {
    let csv = to_csv(&report());
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 5);
    assert_eq!(lines[0], COLUMNS.join(","));
    for line in &lines[1..] {
        // No field of these rows needs quoting.
        assert_eq!(line.split(',').count(), COLUMNS.len(), "{line}");
    }
    assert!(lines[2].starts_with("lru,2000,G2=2000,0.500000,"));
}

#[test]
fn json_has_policy_capacity_and_hit_rate_per_result() {
    let json = report().to_json().unwrap_or_else(|e| panic!("{e}"));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"));
    let results = v["results"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    assert_eq!(results.len(), 4);
    for r in results {
        assert!(r["policy"].is_string());
        assert!(r["capacity"].is_u64());
        assert!(r["hit_rate"].is_f64());
        assert!(r["ttft"]["with_cache"]["mean"].is_f64());
    }
    assert_eq!(v["search"]["best"], 1);
    assert_eq!(v["search"]["target"]["kind"], "hit_rate");
}

#[test]
fn escape_covers_the_five_characters() {
    assert_eq!(
        escape("<a href='x'>\"&\"</a>"),
        "&lt;a href=&#39;x&#39;&gt;&quot;&amp;&quot;&lt;/a&gt;"
    );
}

#[test]
fn the_gap_closed_has_a_plot_a_table_a_csv_column_and_a_json_field() {
    let mut r = report();
    let html = to_html(&r);
    assert!(!html.contains("gap closed</h2>"), "no shares, no gap table");
    for (p, share) in r.results.iter_mut().zip([0.0, 0.0, 0.25, 0.5]) {
        p.gap_closed = Some(share);
    }
    let html = to_html(&r);
    balanced(&html).unwrap_or_else(|e| panic!("{e}"));
    assert!(html.contains("Share of the LRU→Belady gap closed</h2>"));
    assert!(html.contains("<td>25%</td>") && html.contains("<td>50%</td>"));
    let csv = to_csv(&r);
    assert!(csv.lines().nth(4).is_some_and(|l| l.ends_with(",0.500000")));
    let json = r.to_json().unwrap_or_else(|e| panic!("{e}"));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(v["results"][3]["gap_closed"], 0.5);
}
