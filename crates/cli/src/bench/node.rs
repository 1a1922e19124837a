//! `kvtier bench node`: N client processes storing and loading blocks
//! through a running node daemon, against single-thread memcpy of the same
//! bytes between the same buffers, in the same run.
//!
//! The parent starts the daemon in this process (a [`Node`] and its
//! [`NodeServer`] on a tokio runtime, over a temporary directory and an
//! arena that holds every client's working set), unless `--socket` names a
//! running one. It then starts `--clients` copies of itself as workers
//! (`kvtier bench node-worker`, hidden) and drives them phase by phase
//! ([`wire`]): warm-up rounds until the clients have touched the arena
//! slots they are given (a client maps the arena lazily, and a slot's first
//! store in a process pays a page fault per 4 KiB page), then rounds of
//! memcpy, store, load and remove, every worker running each phase at
//! once; then control rounds of round trips of 64 keys, each round the
//! raw-socket baseline rows and the daemon's rows in a rotated order (each
//! daemon row times the requests an engine waits on; its raw row makes as
//! many round trips of about its message sizes). The
//! daemon's CPU per block (or key) is this process's CPU over a phase (or
//! row; it does nothing else meanwhile) divided by the blocks (keys) moved.
//! By default it runs twice, with `manager.verify_commits` on and off: the
//! difference is the daemon's checksum work.

mod echo;
pub(super) mod report;
mod wire;
mod worker;

use anyhow::{Context, Result, bail, ensure};
use clap::{Args, ValueEnum};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use kvtier_core::{ByteSize, Geometry, IoEngineKind, ModelPreset};
use kvtier_node::{Node, NodeConfig, NodeServer};

use super::measure::{kvtier_first, process_cpu_time};
use report::{ControlRound, Pass, PhaseTotals, Report, Round, RowRun};
use wire::{CONTROL_KEYS, Command, ControlResult, ControlRow, PhaseResult, Reply};
pub use worker::NodeWorkerArgs;

/// Arguments of `kvtier bench node`.
#[derive(Args)]
pub struct NodeBenchArgs {
    /// Client processes.
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// Blocks each client stores and loads per round (its working set).
    #[arg(long, default_value_t = 64)]
    blocks: usize,
    /// Blocks per store or load call.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Measured rounds of memcpy, store and load (after the warm-up).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Control round trips timed per operation and client (over all
    /// control rounds).
    #[arg(long, default_value_t = 200)]
    samples: usize,
    /// Control rounds: each times the raw-socket row and the daemon's rows
    /// (in an order rotated per round), `--samples / --control-rounds`
    /// round trips each.
    #[arg(long, default_value_t = 10)]
    control_rounds: usize,
    /// Model preset of the blocks (llama3-8b with 16 tokens: 2 MiB).
    #[arg(long, default_value = "llama3-8b")]
    preset: String,
    /// Tokens per block.
    #[arg(long, default_value_t = 16)]
    tokens_per_block: u32,
    /// A running daemon's socket (its geometry must be the preset's);
    /// default: start one in this process. The daemon's CPU is measured
    /// only for the in-process one.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// The in-process daemon's `manager.verify_commits`: `both` runs
    /// everything twice, and the difference is the daemon's checksum work.
    #[arg(long, value_enum, default_value_t = VerifyCommits::Both)]
    verify_commits: VerifyCommits,
    /// Tiny sizes for a smoke run (CI): 16 KiB blocks, few rounds.
    #[arg(long)]
    quick: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Which commit verification settings the in-process daemon runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum VerifyCommits {
    /// Verified commits only (the default configuration).
    On,
    /// Unverified commits only.
    Off,
    /// One pass each.
    Both,
}

/// What the run does, resolved from the arguments.
struct Plan {
    clients: usize,
    preset: ModelPreset,
    geometry: Geometry,
    blocks: usize,
    batch: usize,
    rounds: usize,
    samples: usize,
    control_rounds: usize,
    socket: Option<PathBuf>,
    verify: Vec<Option<bool>>,
    show: bool,
}

impl Plan {
    fn new(args: NodeBenchArgs) -> Result<Self> {
        ensure!(args.clients > 0, "--clients must be at least 1");
        ensure!(
            args.rounds > 0 && args.samples > 0 && args.control_rounds > 0,
            "--rounds, --samples and --control-rounds must be positive"
        );
        let (preset, tokens) = if args.quick {
            (ModelPreset::Tiny, 16)
        } else {
            let p = ModelPreset::from_str(&args.preset)
                .map_err(|e| anyhow::anyhow!("--preset {:?}: {e}", args.preset))?;
            (p, args.tokens_per_block)
        };
        let verify = match (&args.socket, args.verify_commits) {
            (Some(_), _) => vec![None],
            (None, VerifyCommits::On) => vec![Some(true)],
            (None, VerifyCommits::Off) => vec![Some(false)],
            (None, VerifyCommits::Both) => vec![Some(true), Some(false)],
        };
        let quick = |full: usize, small: usize| if args.quick { small } else { full };
        Ok(Self {
            clients: args.clients,
            preset,
            geometry: preset.geometry(tokens),
            blocks: quick(args.blocks, 8).max(1),
            batch: quick(args.batch, 4).max(1),
            rounds: quick(args.rounds, 2),
            samples: quick(args.samples, 10),
            control_rounds: quick(args.control_rounds, 2),
            socket: args.socket,
            verify,
            show: !args.json,
        })
    }

    /// Round trips per control row, client and round.
    fn samples_per_round(&self) -> usize {
        self.samples.div_ceil(self.control_rounds)
    }

    /// Arena slots for every client's peak (its working set, or the
    /// control phase's resident and reserved keys) below the low
    /// watermark, so no background offload runs during the bench.
    fn arena_slots(&self) -> u64 {
        let per_client = self.blocks.max((1 + COMMITS_PER_COMMAND) * CONTROL_KEYS) as u64;
        (self.clients as u64 * per_client) * 5 / 4 + 16
    }

    fn worker_args(
        &self,
        socket: &std::path::Path,
        echo: &std::path::Path,
        index: u32,
    ) -> NodeWorkerArgs {
        NodeWorkerArgs {
            socket: socket.to_owned(),
            echo: echo.to_owned(),
            run_id: std::process::id(),
            index,
            blocks: self.blocks,
            batch: self.batch,
            samples: self.samples,
            layers: self.geometry.layers,
            layer_bytes: self.geometry.layer_bytes(),
            tokens: self.geometry.tokens_per_block,
        }
    }
}

/// Runs the benchmark.
pub fn run(args: NodeBenchArgs) -> Result<()> {
    let json = args.json;
    let plan = Plan::new(args)?;
    let mut passes = Vec::new();
    for verify in plan.verify.clone() {
        passes.push(run_pass(&plan, verify)?);
    }
    let report = Report {
        clients: plan.clients,
        daemon: plan
            .socket
            .as_ref()
            .map_or("in-process".into(), |s| s.display().to_string()),
        preset: plan.preset.name().to_owned(),
        block_bytes: plan.geometry.block_bytes(),
        layers: plan.geometry.layers,
        blocks_per_client: plan.blocks,
        batch: plan.batch,
        rounds: plan.rounds,
        control_keys: CONTROL_KEYS,
        samples_per_client: plan.samples_per_round() * plan.control_rounds,
        control_rounds: plan.control_rounds,
        daemon_checksum_us_per_block: Report::checksum_cost(&passes),
        passes,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        report.print_table();
    }
    Ok(())
}

/// Runs the worker side (the hidden `kvtier bench node-worker`).
pub fn run_worker(args: NodeWorkerArgs) -> Result<()> {
    worker::run(args)
}

fn progress(plan: &Plan, what: &str) {
    if plan.show {
        eprintln!("  {what} ...");
    }
}

/// One daemon configuration: start the daemon and the workers, warm up,
/// measure the rounds and the control round trips, stop everything.
fn run_pass(plan: &Plan, verify: Option<bool>) -> Result<Pass> {
    let daemon = match (&plan.socket, verify) {
        (None, Some(v)) => Some(Daemon::start(plan, v)?),
        _ => None,
    };
    let socket = match (&daemon, &plan.socket) {
        (Some(d), _) => d.socket.clone(),
        (None, Some(s)) => s.clone(),
        (None, None) => bail!("no daemon to talk to"),
    };
    let label = verify.map_or("external daemon".into(), |v| {
        format!("verify_commits {}", if v { "on" } else { "off" })
    });
    progress(
        plan,
        &format!("{label}: starting {} client(s)", plan.clients),
    );
    let echo = echo::EchoServer::start()?;
    let mut workers = Workers::spawn(plan, &socket, echo.path())?;
    progress(plan, &format!("{label}: warm-up"));
    let warmup_rounds = warm_up(&mut workers, daemon.is_some())?;
    let mut rounds = Vec::with_capacity(plan.rounds);
    for r in 0..plan.rounds {
        progress(
            plan,
            &format!("{label}: round {} of {}", r + 1, plan.rounds),
        );
        rounds.push(measure_round(&mut workers, daemon.is_some())?);
    }
    progress(plan, &format!("{label}: control round trips"));
    let control = control_rounds(plan, &mut workers, daemon.is_some())?;
    workers.exit()?;
    if let Some(d) = daemon {
        d.stop()?;
    }
    Ok(Pass::new(verify, warmup_rounds, &rounds, &control))
}

/// Warm-up rounds at most: enough for two clients to have touched every
/// slot they are handed in turn (measured: 5 to 7 with two clients).
const MAX_WARMUP_ROUNDS: usize = 10;

/// Runs unmeasured rounds until one whose stores and loads take under one
/// minor fault per block (a slot new to a client takes one per page), at
/// most [`MAX_WARMUP_ROUNDS`]; returns how many ran.
fn warm_up(workers: &mut Workers, daemon: bool) -> Result<usize> {
    for n in 1..=MAX_WARMUP_ROUNDS {
        let r = measure_round(workers, daemon)?;
        let faults = r.store.minor_faults + r.load.minor_faults;
        if faults < r.store.blocks {
            return Ok(n);
        }
    }
    Ok(MAX_WARMUP_ROUNDS)
}

/// One round: memcpy, store, load (each measured), then remove.
fn measure_round(workers: &mut Workers, daemon: bool) -> Result<Round> {
    let round = Round {
        memcpy: measure_phase(workers, Command::Memcpy, daemon)?,
        store: measure_phase(workers, Command::Store, daemon)?,
        load: measure_phase(workers, Command::Load, daemon)?,
    };
    workers.all(Command::Remove)?;
    Ok(round)
}

/// Runs one phase on every worker, with this process's CPU time over it
/// standing for the in-process daemon's.
fn measure_phase(workers: &mut Workers, cmd: Command, daemon: bool) -> Result<PhaseTotals> {
    let cpu0 = process_cpu_time();
    let replies = workers.all(cmd)?;
    let daemon_cpu = daemon.then(|| process_cpu_time().saturating_sub(cpu0));
    let results = replies
        .into_iter()
        .map(|r| match r {
            Reply::Phase(p) => Ok(p),
            other => bail!("a worker answered {cmd:?} with {other:?}"),
        })
        .collect::<Result<Vec<PhaseResult>>>()?;
    Ok(PhaseTotals::new(&results, daemon_cpu))
}

/// The control rounds: in each, the raw-socket rows and the daemon's
/// rows, the raw rows first in even rounds and last in odd ones, each
/// group rotated by one per round, so no row always follows the same one.
fn control_rounds(plan: &Plan, workers: &mut Workers, daemon: bool) -> Result<Vec<ControlRound>> {
    workers.all(Command::ControlBegin)?;
    let mut rounds = Vec::with_capacity(plan.control_rounds);
    for r in 0..plan.control_rounds {
        let rotated = |mut rows: [ControlRow; 4]| {
            rows.rotate_left(r % ControlRow::DAEMON.len());
            rows
        };
        let (own, raw) = (rotated(ControlRow::DAEMON), rotated(ControlRow::RAW));
        let rows = if kvtier_first(r as u64) {
            [own, raw]
        } else {
            [raw, own]
        };
        let mut round = ControlRound::default();
        for row in rows.into_iter().flatten() {
            round.push(measure_row(plan, workers, row, daemon)?);
        }
        rounds.push(round);
    }
    workers.all(Command::ControlEnd)?;
    Ok(rounds)
}

/// `Reserve` + `Commit` samples per control command: the arena holds this
/// many samples' blocks per client beside the resident ones; the parent
/// removes them between commands, outside the row's window.
const COMMITS_PER_COMMAND: usize = 4;

/// One control row on every worker at once, with this process's CPU over
/// its round trips standing for the in-process daemon's. What the row
/// leaves (loads to release, blocks to remove) is tidied outside that
/// window: in chunks of [`COMMITS_PER_COMMAND`] samples for
/// `Reserve` + `Commit`, whose blocks must leave room in the arena.
fn measure_row(
    plan: &Plan,
    workers: &mut Workers,
    row: ControlRow,
    daemon: bool,
) -> Result<RowRun> {
    let samples = plan.samples_per_round();
    let chunk = match row {
        ControlRow::ReserveCommit => COMMITS_PER_COMMAND,
        _ => samples,
    };
    let mut cpu = Duration::ZERO;
    let mut all = ControlResult::default();
    let mut left = samples;
    while left > 0 {
        let n = left.min(chunk);
        left -= n;
        let cpu0 = process_cpu_time();
        let replies = workers.all(Command::Control { row, samples: n })?;
        cpu += process_cpu_time().saturating_sub(cpu0);
        let tidied = workers.all(Command::ControlTidy)?;
        for r in replies.into_iter().chain(tidied) {
            match r {
                Reply::Control(c) => all.extend(*c),
                other => bail!("a worker answered {row:?} with {other:?}"),
            }
        }
    }
    Ok(RowRun {
        row,
        samples: all,
        taken: samples * plan.clients,
        daemon_cpu: daemon.then_some(cpu),
    })
}

/// The in-process daemon: the node, its socket server, and the runtime
/// they run on.
struct Daemon {
    rt: tokio::runtime::Runtime,
    node: Arc<Node>,
    server: NodeServer,
    socket: PathBuf,
    /// The disk log and the socket live here; removed when dropped.
    _dir: tempfile::TempDir,
}

impl Daemon {
    fn start(plan: &Plan, verify_commits: bool) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("kvtier-bench-node-")
            .tempdir()
            .context("creating the daemon's directory")?;
        let config = daemon_config(plan, dir.path(), verify_commits);
        // Like `kvtier serve`: a multi-thread runtime, one worker per core.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("starting the daemon's runtime")?;
        let socket = config.node_socket();
        let (node, server) = rt.block_on(async {
            let node = Node::open(&config, Vec::new())
                .await
                .context("opening the node")?;
            let server = NodeServer::bind(node.clone(), &socket)
                .await
                .context("listening on the node socket")?;
            anyhow::Ok((node, server))
        })?;
        Ok(Self {
            rt,
            node,
            server,
            socket,
            _dir: dir,
        })
    }

    fn stop(self) -> Result<()> {
        self.rt.block_on(self.server.shutdown());
        self.rt
            .block_on(self.node.close())
            .context("closing the node")
    }
}

/// The daemon's configuration: the plan's geometry, an arena for every
/// client's peak, and a small disk log the bench never reaches.
fn daemon_config(plan: &Plan, dir: &std::path::Path, verify_commits: bool) -> NodeConfig {
    let tag = format!("node-{}", u8::from(verify_commits));
    let mut c = bench_node_config(plan.preset, plan.geometry, plan.arena_slots(), &tag, dir);
    c.manager.verify_commits = verify_commits;
    c
}

/// An in-process daemon's configuration for a bench: `geometry` of
/// `preset`, an arena of `slots` blocks (its shared-memory name tagged
/// with this process and `tag`), and a small disk log the bench never
/// reaches (psync, no fsync, so no io_uring or locked-memory needs).
pub(super) fn bench_node_config(
    preset: ModelPreset,
    geometry: Geometry,
    slots: u64,
    tag: &str,
    dir: &std::path::Path,
) -> NodeConfig {
    let mut c = NodeConfig {
        geometry: Some(kvtier_core::GeometryConfig {
            preset: Some(preset.name().to_owned()),
            tokens_per_block: geometry.tokens_per_block,
            ..Default::default()
        }),
        ..NodeConfig::default()
    };
    let block = geometry.block_bytes();
    c.memory.capacity = ByteSize(slots * block);
    c.memory.shm_name = format!("kvtier-bench-{}-{tag}", std::process::id());
    let region = (block * 4 + (64 << 10)).next_power_of_two().max(1 << 20);
    c.disk.region_size = ByteSize(region);
    c.disk.capacity_per_dir = ByteSize(region * 4);
    c.disk.io_engine = IoEngineKind::Psync;
    c.disk.register_buffers = false;
    c.disk.sync = false;
    c.disk.checkpoint_interval_secs = 0;
    c.serve.data_dir = dir.to_owned();
    c
}

/// One worker process and its pipes.
struct WorkerProc {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

/// Every worker process; killed if still running when dropped (a failed
/// run leaves none behind).
struct Workers(Vec<WorkerProc>);

impl Workers {
    /// Starts one worker per client and waits until each is ready.
    fn spawn(plan: &Plan, socket: &std::path::Path, echo: &std::path::Path) -> Result<Self> {
        let exe = std::env::current_exe().context("locating the kvtier binary")?;
        let mut procs = Vec::with_capacity(plan.clients);
        for i in 0..plan.clients {
            let mut child = std::process::Command::new(&exe)
                .args(plan.worker_args(socket, echo, i as u32).to_argv())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .with_context(|| format!("starting worker {i}"))?;
            let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
                bail!("worker {i} has no pipes");
            };
            procs.push(WorkerProc {
                child,
                stdin,
                stdout: BufReader::new(stdout),
            });
        }
        let mut workers = Self(procs);
        for i in 0..workers.0.len() {
            match workers.read(i)? {
                Reply::Ready => {}
                other => bail!("worker {i} greeted with {other:?}"),
            }
        }
        Ok(workers)
    }

    /// Sends `cmd` to every worker, then collects every reply.
    fn all(&mut self, cmd: Command) -> Result<Vec<Reply>> {
        let line = serde_json::to_string(&cmd)?;
        for (i, w) in self.0.iter_mut().enumerate() {
            writeln!(w.stdin, "{line}")
                .and_then(|()| w.stdin.flush())
                .with_context(|| format!("sending {cmd:?} to worker {i}"))?;
        }
        (0..self.0.len()).map(|i| self.read(i)).collect()
    }

    /// Tells every worker to leave and waits for it.
    fn exit(mut self) -> Result<()> {
        let line = serde_json::to_string(&Command::Exit)?;
        for (i, w) in self.0.iter_mut().enumerate() {
            // A worker gone already shows in its exit status below.
            let _ = writeln!(w.stdin, "{line}").and_then(|()| w.stdin.flush());
            let status = w
                .child
                .wait()
                .with_context(|| format!("waiting for worker {i}"))?;
            ensure!(status.success(), "worker {i} ended with {status}");
        }
        self.0.clear();
        Ok(())
    }

    /// Worker `i`'s next reply; its end of output is an error naming how
    /// it ended.
    fn read(&mut self, i: usize) -> Result<Reply> {
        let w = &mut self.0[i];
        let mut line = String::new();
        let n = w
            .stdout
            .read_line(&mut line)
            .with_context(|| format!("reading worker {i}"))?;
        if n == 0 {
            let status = w.child.wait().map(|s| s.to_string());
            bail!(
                "worker {i} stopped before answering ({})",
                status.unwrap_or_else(|e| e.to_string())
            );
        }
        serde_json::from_str(&line).with_context(|| format!("worker {i} said {line:?}"))
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for w in &mut self.0 {
            if matches!(w.child.try_wait(), Ok(None)) {
                let _ = w.child.kill();
            }
            let _ = w.child.wait();
        }
    }
}
