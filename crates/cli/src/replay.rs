//! `kvtier replay`: replays a request trace through eviction policies and
//! tier layouts, and prices each configuration with the TTFT and cost model.
//!
//! Arguments are taken in two steps: clap checks their syntax, then
//! [`Plan::resolve`] turns them into the library's objects (a sweep grid,
//! a serving model, an optional search target), so every bad value is
//! reported with the flag it came from before the (possibly long) replay
//! starts.

use anyhow::{Context, Result, bail, ensure};
use clap::Args;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use kvtier_sim::model::{GpuKind, ModelSpec, ServingModel, TierModel};
use kvtier_sim::policy::PolicyKind;
use kvtier_sim::replay::TierSpec;
use kvtier_sim::report::{Report, SearchSummary, layout_label, to_csv, to_html};
use kvtier_sim::sweep::{self, Grid, Point, Target, TraceFacts, select};
use kvtier_sim::trace::{self, TraceFormat};

/// Arguments of `kvtier replay`.
#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// Trace file (JSON lines).
    #[arg(long)]
    trace: PathBuf,
    /// Trace format: mooncake, bailian or kvtier. Default: detected from
    /// the first line.
    #[arg(long)]
    format: Option<String>,
    /// Eviction policies, comma-separated: lru, lfu, arc, s3fifo, slru,
    /// hit-density, cost-aware, random-lru, ttl, belady, oracle-lru,
    /// oracle-hit-density.
    #[arg(long, value_delimiter = ',', default_value = "lru")]
    policy: Vec<String>,
    /// Single-tier capacities, comma-separated: blocks (`4000`) or bytes
    /// with a unit (`64GiB`, converted with the model's KV bytes per token
    /// and the trace's tokens per block), or a sweep `FROM..TO` that
    /// doubles from FROM while it stays within TO (`1000..32000` is 1000,
    /// 2000, ..., 32000; `1000..32000x4` multiplies by 4 instead); each
    /// capacity is one configuration of a tier named by --capacity-tier.
    #[arg(long, value_delimiter = ',')]
    capacity: Vec<Capacities>,
    /// Name of the tier --capacity sizes: G1 (HBM, loads nothing), G2
    /// (DRAM), G3 (NVMe), G4 (remote).
    #[arg(long, default_value = "G2")]
    capacity_tier: String,
    /// A multi-tier layout, fastest first, e.g. G1=1000,G2=4000 (blocks) or
    /// G2=256GiB,G3=4TiB (bytes); repeat the flag for several layouts.
    #[arg(long)]
    tiers: Vec<String>,
    /// Idle milliseconds after which the ttl policy drops a block.
    #[arg(long)]
    ttl_ms: Option<u64>,
    /// GPU: h100, h200, a100-80g, l40s, b200.
    #[arg(long, default_value = "h100")]
    gpu: String,
    /// GPU price in dollars per hour (default: the GPU table's).
    #[arg(long)]
    gpu_price: Option<f64>,
    /// Model: llama3-8b, llama3-70b, qwen3-32b, deepseek-v3, tiny.
    #[arg(long, default_value = "llama3-70b")]
    model: String,
    /// Model FLOPs utilisation of prefill, in (0, 1].
    #[arg(long, default_value_t = 0.5)]
    mfu: f64,
    /// Tier bandwidths into HBM in GB/s, e.g. G3=12,G4=25.
    #[arg(long, value_delimiter = ',')]
    tier_bw: Vec<String>,
    /// Tier prices in dollars per GB-hour, e.g. G4=0.00003.
    #[arg(long, value_delimiter = ',')]
    tier_price: Vec<String>,
    /// Per-block load latency in microseconds, e.g. G4=20.
    #[arg(long, value_delimiter = ',')]
    tier_latency_us: Vec<String>,
    /// Replay only the first N requests.
    #[arg(long)]
    limit: Option<usize>,
    /// Points of each hit-rate timeline.
    #[arg(long, default_value_t = 50)]
    timeline_points: usize,
    /// Seed of randomised policies.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Replay the plain policies, without the node's leaves-before-parents
    /// filter (the default models the node).
    #[arg(long)]
    no_leaf_first: bool,
    /// Replay threads (configurations run in parallel).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Mark the cheapest configuration with at least this hit rate.
    #[arg(long, conflicts_with = "target_ttft_s")]
    target_hit_rate: Option<f64>,
    /// Mark the cheapest configuration with at most this mean TTFT (s).
    #[arg(long)]
    target_ttft_s: Option<f64>,
    /// Print one JSON object instead of a table.
    #[arg(long, conflicts_with = "csv")]
    json: bool,
    /// Print CSV instead of a table.
    #[arg(long)]
    csv: bool,
    /// Also write a self-contained HTML report to this file.
    #[arg(long)]
    report: Option<PathBuf>,
}

/// A tier capacity as given: blocks, or bytes to convert into blocks once
/// the trace (its tokens per block) is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Size {
    Blocks(u64),
    Bytes(u64),
}

impl std::str::FromStr for Size {
    type Err = kvtier_core::CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
            t.parse()
                .map(Size::Blocks)
                .map_err(|_| kvtier_core::CoreError::InvalidConfig(format!("{t:?} is too large")))
        } else {
            t.parse::<kvtier_core::ByteSize>()
                .map(|b| Size::Bytes(b.bytes()))
        }
    }
}

/// Largest number of capacities one `FROM..TO` sweep may expand to.
const MAX_SWEEP: usize = 32;

/// One item of `--capacity`: a size, or a geometric sweep of sizes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Capacities(Vec<Size>);

impl std::str::FromStr for Capacities {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let Some((from, rest)) = s.split_once("..") else {
            return s
                .parse()
                .map(|one| Capacities(vec![one]))
                .map_err(|e| format!("{e}"));
        };
        let (to, factor) = match rest.split_once(['x', 'X']) {
            Some((to, f)) => (
                to,
                f.trim()
                    .parse::<u64>()
                    .map_err(|e| format!("factor {f:?}: {e}"))?,
            ),
            None => (rest, 2),
        };
        let (from, to): (Size, Size) = (
            from.parse().map_err(|e| format!("{e}"))?,
            to.parse().map_err(|e| format!("{e}"))?,
        );
        sweep(from, to, factor).map(Capacities)
    }
}

/// `from`, `from * factor`, ... while within `to` (same unit, blocks or
/// bytes).
fn sweep(from: Size, to: Size, factor: u64) -> Result<Vec<Size>, String> {
    let (lo, hi, unit): (u64, u64, fn(u64) -> Size) = match (from, to) {
        (Size::Blocks(a), Size::Blocks(b)) => (a, b, Size::Blocks),
        (Size::Bytes(a), Size::Bytes(b)) => (a, b, Size::Bytes),
        _ => return Err("a sweep's ends must both be blocks or both be bytes".into()),
    };
    if lo == 0 || lo > hi || factor < 2 {
        return Err(format!(
            "sweep {lo}..{hi}x{factor}: need 0 < FROM <= TO and a factor of at least 2"
        ));
    }
    let mut out = Vec::new();
    let mut c = Some(lo);
    while let Some(v) = c.filter(|v| *v <= hi) {
        if out.len() == MAX_SWEEP {
            return Err(format!(
                "sweep {lo}..{hi}x{factor}: more than {MAX_SWEEP} capacities"
            ));
        }
        out.push(unit(v));
        c = v.checked_mul(factor);
    }
    Ok(out)
}

impl Size {
    /// Whole blocks of `block_bytes` that fit.
    fn blocks(self, block_bytes: u64) -> u64 {
        match self {
            Size::Blocks(n) => n,
            Size::Bytes(b) => b / block_bytes.max(1),
        }
    }
}

/// The resolved arguments.
struct Plan {
    format: Option<TraceFormat>,
    policies: Vec<PolicyKind>,
    /// Single-tier capacities and the tier they size.
    capacities: Vec<Size>,
    capacity_tier: String,
    /// Multi-tier layouts, fastest first.
    layouts: Vec<Vec<(String, Size)>>,
    ttl_ms: Option<u64>,
    timeline_points: usize,
    seed: u64,
    leaf_first: bool,
    model: ServingModel,
    target: Option<Target>,
}

/// Parses `NAME=VALUE`.
fn pair<T: std::str::FromStr>(flag: &str, s: &str) -> Result<(String, T)>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    let (name, value) = s
        .split_once('=')
        .with_context(|| format!("--{flag} {s:?}: expected NAME=VALUE"))?;
    let name = name.trim();
    ensure!(!name.is_empty(), "--{flag} {s:?}: empty tier name");
    let value = value
        .trim()
        .parse()
        .with_context(|| format!("--{flag} {s:?}: bad value"))?;
    Ok((name.to_owned(), value))
}

impl Plan {
    fn resolve(a: &ReplayArgs) -> Result<Self> {
        let format = a
            .format
            .as_deref()
            .map(str::parse::<TraceFormat>)
            .transpose()
            .context("--format")?;
        let policies = a
            .policy
            .iter()
            .map(|p| {
                p.trim()
                    .parse::<PolicyKind>()
                    .with_context(|| format!("--policy {p:?}"))
            })
            .collect::<Result<Vec<_>>>()?;
        ensure!(!policies.is_empty(), "--policy: give at least one policy");
        let layouts = a
            .tiers
            .iter()
            .map(|layout| {
                layout
                    .split(',')
                    .map(|t| pair::<Size>("tiers", t))
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        if a.capacity.is_empty() && layouts.is_empty() {
            bail!("give --capacity or --tiers: there is nothing to replay");
        }
        if policies.contains(&PolicyKind::Ttl) && a.ttl_ms.is_none() {
            bail!("--policy ttl needs --ttl-ms");
        }

        let mut gpu = a.gpu.parse::<GpuKind>().context("--gpu")?.spec();
        if let Some(p) = a.gpu_price {
            gpu.dollars_per_hour = p;
        }
        let spec: ModelSpec = a.model.parse().context("--model")?;
        // A catalogue with every tier named anywhere, then the overrides.
        let mut tiers: Vec<TierModel> = Vec::new();
        let mut tier = |name: &str| -> usize {
            match tiers.iter().position(|t| t.name.eq_ignore_ascii_case(name)) {
                Some(i) => i,
                None => {
                    tiers.push(TierModel::for_name(name));
                    tiers.len() - 1
                }
            }
        };
        if !a.capacity.is_empty() {
            tier(&a.capacity_tier);
        }
        for layout in &layouts {
            for (name, _) in layout {
                tier(name);
            }
        }
        let mut overrides: Vec<(usize, char, f64)> = Vec::new();
        for (flag, list, what) in [
            ("tier-bw", &a.tier_bw, 'b'),
            ("tier-price", &a.tier_price, 'p'),
            ("tier-latency-us", &a.tier_latency_us, 'l'),
        ] {
            for s in list {
                let (name, v) = pair::<f64>(flag, s)?;
                overrides.push((tier(&name), what, v));
            }
        }
        for (i, what, v) in overrides {
            let t = &mut tiers[i];
            match what {
                'b' => {
                    t.bandwidth_gbps = v;
                    t.resident = false;
                }
                'p' => t.dollars_per_gb_hour = v,
                _ => t.per_block_latency_us = v,
            }
        }
        let model = ServingModel {
            model: spec,
            gpu,
            mfu: a.mfu,
            tiers,
            tokens_per_block: 16,
        };
        model.validate().context("the TTFT and cost model")?;
        let target = match (a.target_hit_rate, a.target_ttft_s) {
            (Some(h), _) => {
                ensure!(
                    (0.0..=1.0).contains(&h),
                    "--target-hit-rate {h}: not in 0..=1"
                );
                Some(Target::HitRate(h))
            }
            (None, Some(t)) => {
                ensure!(t > 0.0, "--target-ttft-s {t}: must be positive");
                Some(Target::MeanTtftS(t))
            }
            (None, None) => None,
        };
        ensure!(a.threads > 0, "--threads must be positive");
        Ok(Plan {
            format,
            policies,
            capacities: a
                .capacity
                .iter()
                .flat_map(|c| c.0.iter().copied())
                .collect(),
            capacity_tier: a.capacity_tier.clone(),
            layouts,
            ttl_ms: a.ttl_ms,
            timeline_points: a.timeline_points,
            seed: a.seed,
            leaf_first: !a.no_leaf_first,
            model,
            target,
        })
    }

    /// The sweep grid, with byte sizes turned into blocks of `block_bytes`.
    fn grid(&self, block_bytes: u64) -> Result<Grid> {
        let caps: Vec<u64> = self
            .capacities
            .iter()
            .map(|c| c.blocks(block_bytes))
            .collect();
        let mut grid = Grid::capacities(&self.policies, &caps, &self.capacity_tier);
        for layout in &self.layouts {
            grid.layouts.push(
                layout
                    .iter()
                    .map(|(name, size)| TierSpec {
                        name: name.clone(),
                        capacity_blocks: size.blocks(block_bytes),
                    })
                    .collect(),
            );
        }
        if let Some(empty) = grid
            .layouts
            .iter()
            .flatten()
            .find(|t| t.capacity_blocks == 0)
        {
            bail!(
                "tier {} holds no block of {block_bytes} bytes: give more capacity",
                empty.name
            );
        }
        grid.ttl_ms = self.ttl_ms;
        grid.timeline_points = self.timeline_points;
        grid.seed = self.seed;
        grid.leaf_first = self.leaf_first;
        Ok(grid)
    }
}

/// Runs `kvtier replay`.
pub fn run(args: ReplayArgs) -> Result<()> {
    let plan = Plan::resolve(&args)?;
    let started = Instant::now();
    let mut requests = match args.limit {
        Some(n) => trace::open(&args.trace, plan.format)
            .and_then(|r| r.take(n).collect::<Result<Vec<_>, _>>()),
        None => trace::read_all(&args.trace, plan.format),
    }
    .with_context(|| format!("reading trace {}", args.trace.display()))?;
    requests.shrink_to_fit();
    let facts = TraceFacts::of(&requests);
    let read_s = started.elapsed().as_secs_f64();
    let block_bytes =
        plan.model.model.kv_bytes_per_token() * u64::from(facts.tokens_per_block.max(1));
    let grid = plan.grid(block_bytes)?;

    let total = grid.len();
    let tty = std::io::stderr().is_terminal();
    let progress = |done: usize, total: usize| {
        let mut err = std::io::stderr().lock();
        // Progress is best effort: a closed stderr must not stop the run.
        let _ = if tty {
            write!(err, "\rreplayed {done}/{total} configurations")
        } else {
            writeln!(err, "replayed {done}/{total}")
        };
        if tty && done == total {
            let _ = writeln!(err);
        }
    };
    let replay_started = Instant::now();
    let points = sweep::sweep(&requests, &grid, Some(&plan.model), args.threads, &progress);
    let replay_s = replay_started.elapsed().as_secs_f64();

    let title = args.trace.file_name().map_or_else(
        || args.trace.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let mut model = plan.model.clone();
    model.tokens_per_block = facts.tokens_per_block.max(1);
    let mut report = Report::new(&title, facts, Some(model), points);
    if let Some(target) = plan.target {
        report.search = Some(SearchSummary {
            target,
            best: select(&report.results, target),
        });
    }
    if let Some(path) = &args.report {
        std::fs::write(path, to_html(&report))
            .with_context(|| format!("writing the report {}", path.display()))?;
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", report.to_json().context("rendering JSON")?)?;
    } else if args.csv {
        write!(out, "{}", to_csv(&report))?;
    } else {
        print_table(&mut out, &report, total, read_s, replay_s)?;
    }
    Ok(())
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |s| format!("{:.1}", s * 1000.0))
}

fn print_table(
    out: &mut impl Write,
    report: &Report,
    configs: usize,
    read_s: f64,
    replay_s: f64,
) -> Result<()> {
    let f = &report.trace;
    writeln!(
        out,
        "trace {}: {} requests, {} prompt tokens, {} tokens/block, {:.0} s span",
        report.title,
        f.requests,
        f.input_tokens,
        f.tokens_per_block,
        f.span_ms as f64 / 1000.0
    )?;
    if let Some(m) = &report.model {
        writeln!(
            out,
            "model {} on {} (MFU {}, ${}/h); read {:.2} s, {} configurations replayed in {:.2} s",
            m.model.name, m.gpu.name, m.mfu, m.gpu.dollars_per_hour, read_s, configs, replay_s
        )?;
    }
    writeln!(
        out,
        "{:<10} {:<22} {:>8} {:>6} {:<24} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9}",
        "policy",
        "tiers",
        "hit rate",
        "gap",
        "hits per tier",
        "ttft ms",
        "serial ms",
        "nocache ms",
        "bubble ms",
        "$/Mtok",
        "gpus saved"
    )?;
    let best = report.search.and_then(|s| s.best);
    for (i, p) in report.results.iter().enumerate() {
        row(out, p, best == Some(i))?;
    }
    if let Some(s) = report.search {
        match best.and_then(|i| report.results.get(i)) {
            Some(p) => writeln!(
                out,
                "cheapest meeting {}: {} {} (marked *)",
                s.target,
                p.policy,
                layout_label(p)
            )?,
            None => writeln!(out, "no configuration meets {}", s.target)?,
        }
    }
    Ok(())
}

fn row(out: &mut impl Write, p: &Point, best: bool) -> Result<()> {
    let hits: Vec<String> = p
        .tiers
        .iter()
        .zip(&p.tier_hit_blocks)
        .map(|(t, h)| format!("{}:{h}", t.name))
        .collect();
    let t = p.ttft;
    let c = p.cost;
    writeln!(
        out,
        "{:<10} {:<22} {:>8.4} {:>6} {:<24} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9}{}",
        p.policy,
        layout_label(p),
        p.hit_rate,
        sweep::percent(p.gap_closed),
        hits.join(" "),
        ms(t.map(|t| t.with_cache.mean)),
        ms(t.map(|t| t.with_cache_serial.mean)),
        ms(t.map(|t| t.without_cache.mean)),
        ms(t.map(|t| t.bubble.mean)),
        c.map_or_else(
            || "-".to_owned(),
            |c| format!("{:.4}", c.dollars_per_mtok_with_cache)
        ),
        c.map_or_else(|| "-".to_owned(), |c| format!("{:.2}", c.gpus_saved)),
        if best { " *" } else { "" }
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(s: &str) -> Result<Vec<Size>, String> {
        s.parse::<Capacities>().map(|c| c.0)
    }

    #[test]
    fn capacity_sweeps_expand_geometrically() {
        let blocks = |v: &[u64]| v.iter().map(|&n| Size::Blocks(n)).collect::<Vec<_>>();
        assert_eq!(caps("4000"), Ok(blocks(&[4000])));
        assert_eq!(
            caps("1000..32000"),
            Ok(blocks(&[1000, 2000, 4000, 8000, 16000, 32000]))
        );
        assert_eq!(caps("1000..20000x4"), Ok(blocks(&[1000, 4000, 16000])));
        assert_eq!(caps("5..5"), Ok(blocks(&[5])));
        assert_eq!(
            caps("1GiB..4GiB"),
            Ok(vec![
                Size::Bytes(1 << 30),
                Size::Bytes(2 << 30),
                Size::Bytes(4 << 30)
            ])
        );
        for bad in [
            "0..10",
            "10..5",
            "1..8x1",
            "1GiB..4000",
            "1..x",
            "1..1000000000000x2",
        ] {
            assert!(caps(bad).is_err(), "{bad}");
        }
    }
}
