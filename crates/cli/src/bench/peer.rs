//! `kvtier bench peer`: one node reading another's blocks over the peer
//! data plane (`PeerPool::read_into` into a preallocated buffer, verified)
//! against a raw TCP copy of the same bytes, in the same run.
//!
//! Both peers live in this process: the serving node is a real
//! [`Node`] (its arena, blocks stored through the manager's host path)
//! served by a `PeerServer` over [`NodeSource`], as `kvtier serve` serves
//! peers, on one tokio runtime; the reader is a [`PeerPool`] on another.
//! The baseline is a plain TCP server on the serving runtime writing the
//! same bytes from memory to a client on the reading runtime that reads
//! them into a buffer. Each round runs every row's baseline and peer side,
//! the order turned around every other round; CPU is split by runtime
//! (the threads' own CPU time), and the whole process's is given too.
//!
//! With `--load`, a node's `Load` of the other's blocks instead, whole
//! against streamed ([`load`]).

mod load;

use anyhow::{Context, Result, bail, ensure};
use clap::Args;
use serde::Serialize;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use kvtier_core::{BlockHash, BlockSums, Geometry, ModelPreset};
use kvtier_manager::manager::HostCommit;
use kvtier_node::{Node, NodeSource};
use kvtier_peer::{
    ClusterSecret, Expect, Identity, LayerRange, PeerAddr, PeerPool, PeerServer, PoolConfig,
    ServerConfig, ServerHandle, Want,
};

use super::measure::{Latencies, kvtier_first, process_cpu_time};
use super::node::bench_node_config;
use super::node::report::{Spread, spread};

/// Arguments of `kvtier bench peer`.
#[derive(Args)]
pub struct PeerBenchArgs {
    /// Blocks the serving node holds; every row reads each once a round.
    #[arg(long, default_value_t = 64)]
    blocks: usize,
    /// Measured rounds (after one warm-up round).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Model preset of the blocks (llama3-8b with 16 tokens: 2 MiB;
    /// `tiny` for a smoke test).
    #[arg(long, default_value = "llama3-8b")]
    preset: String,
    /// Tokens per block.
    #[arg(long, default_value_t = 16)]
    tokens_per_block: u32,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Measure a node's `Load` of the blocks from the other node instead:
    /// the time to `LoadOk`, the first layer and the last.
    #[arg(long)]
    load: bool,
    /// With `--load`: the modes, alternated every round, as layer groups
    /// a streamed load reads in (0: whole blocks before the answer).
    #[arg(long, value_delimiter = ',', default_value = "0,4")]
    layer_groups: Vec<u32>,
}

/// Thread-name prefixes of the two runtimes, by which CPU is split.
const SERVER_THREADS: &str = "peer-srv";
const CLIENT_THREADS: &str = "peer-cli";

/// Runs the bench.
pub fn run(args: PeerBenchArgs) -> Result<()> {
    ensure!(args.blocks > 0, "--blocks must be at least 1");
    let preset = ModelPreset::from_str(&args.preset)
        .map_err(|e| anyhow::anyhow!("--preset {:?}: {e}", args.preset))?;
    let geometry = preset.geometry(args.tokens_per_block);
    if args.load {
        return load::run(&args, preset, geometry);
    }
    let server_rt = runtime(SERVER_THREADS)?;
    let client_rt = runtime(CLIENT_THREADS)?;
    let dir = tempfile::Builder::new()
        .prefix("kvtier-bench-peer-")
        .tempdir()
        .context("creating the node's directory")?;
    // Twice the blocks, so that none is evicted from G2 (the bench reads
    // G2, as a peer reads a block an engine just computed).
    let slots = 2 * args.blocks as u64 + 8;
    let config = bench_node_config(preset, geometry, slots, "peer", dir.path());
    let served = server_rt.block_on(Serving::start(&config, geometry, args.blocks))?;
    let report = client_rt.block_on(measure(&served, geometry, args.rounds));
    server_rt.block_on(served.stop())?;
    let report = Report::new(&args, preset, geometry, report?);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        report.print();
    }
    Ok(())
}

/// A multi-thread runtime (one worker per core, as `kvtier serve` runs)
/// whose threads are named `name`.
fn runtime(name: &str) -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .thread_name(name)
        .enable_all()
        .build()
        .context("starting a runtime")
}

/// The identity of node `node` of the bench's cluster.
fn identity(node: &str) -> Identity {
    Identity {
        cluster: "bench".into(),
        node: node.into(),
        secret: ClusterSecret::from_bytes(rand::random()),
    }
}

/// The serving side: the node, its peer server, the raw server, and what
/// the reader needs to know of the blocks.
struct Serving {
    node: Arc<Node>,
    peer: ServerHandle,
    raw: SocketAddr,
    raw_task: tokio::task::JoinHandle<()>,
    secret: ClusterSecret,
    blocks: Vec<(BlockHash, BlockSums)>,
}

impl Serving {
    /// Opens the node, stores `count` blocks through its host path and
    /// starts both servers on loopback.
    async fn start(
        config: &kvtier_node::NodeConfig,
        geometry: Geometry,
        count: usize,
    ) -> Result<Self> {
        let node = Node::open(config, Vec::new())
            .await
            .context("opening the node")?;
        let len = geometry.block_bytes() as usize;
        let layer_bytes = geometry.layer_bytes() as usize;
        let mut blocks = Vec::with_capacity(count);
        let mut bytes = Vec::with_capacity(count);
        for i in 0..count {
            let key = BlockHash(0xbe7c_0000_0000 + i as u128);
            let data = block_content(i, len);
            match node.manager().put_host(key, &data).await? {
                Some(HostCommit::Stored) => {}
                other => bail!("storing block {i} in G2: {other:?}"),
            }
            blocks.push((key, BlockSums::compute(key, layer_bytes, &data)));
            bytes.push(data);
        }
        let me = identity("server");
        let secret = me.secret.clone();
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let source = Arc::new(NodeSource::of(node.clone()));
        let peer = PeerServer::start(listener, ServerConfig::new(me), source)?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let raw = listener.local_addr()?;
        let raw_task = tokio::spawn(raw_serve(listener, Arc::new(bytes)));
        Ok(Self {
            node,
            peer,
            raw,
            raw_task,
            secret,
            blocks,
        })
    }

    async fn stop(self) -> Result<()> {
        self.raw_task.abort();
        self.peer.shutdown().await;
        self.node.close().await.context("closing the node")
    }
}

/// Distinct bytes per block and position.
fn block_content(i: usize, len: usize) -> Vec<u8> {
    let seed = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (0..len)
        .map(|j| (seed.rotate_left((j % 64) as u32) as u8) ^ (j as u8))
        .collect()
}

/// The raw baseline's request: block index, byte offset, length.
const RAW_REQUEST: usize = 12;

/// Serves raw copies: per request, the bytes asked, written as they are.
async fn raw_serve(listener: TcpListener, blocks: Arc<Vec<Vec<u8>>>) {
    while let Ok((stream, _)) = listener.accept().await {
        tokio::spawn(raw_connection(stream, blocks.clone()));
    }
}

async fn raw_connection(mut stream: TcpStream, blocks: Arc<Vec<Vec<u8>>>) -> Result<()> {
    stream.set_nodelay(true)?;
    let mut req = [0u8; RAW_REQUEST];
    while stream.read_exact(&mut req).await.is_ok() {
        let field = |i: usize| u32::from_le_bytes([req[i], req[i + 1], req[i + 2], req[i + 3]]);
        let (index, from, len) = (field(0) as usize, field(4) as usize, field(8) as usize);
        let block = blocks.get(index).context("no such block")?;
        let bytes = block.get(from..from + len).context("no such bytes")?;
        stream.write_all(bytes).await?;
    }
    Ok(())
}

/// One request of a row: block `index`, the layers `layers` (bytes
/// `offset..offset + len` of the block).
#[derive(Clone, Copy)]
struct Request {
    index: usize,
    layers: LayerRange,
    offset: usize,
    len: usize,
}

/// What a row reads: whole blocks, or one layer of each (a layer that
/// moves along with the block).
#[derive(Clone, Copy, PartialEq, Eq)]
enum RowKind {
    WholeBlock,
    SingleLayer,
}

impl RowKind {
    const ALL: [Self; 2] = [Self::WholeBlock, Self::SingleLayer];

    fn name(self) -> &'static str {
        match self {
            Self::WholeBlock => "whole_block",
            Self::SingleLayer => "single_layer",
        }
    }

    fn requests(self, g: Geometry, blocks: usize) -> Vec<Request> {
        let layer = g.layer_bytes() as usize;
        (0..blocks)
            .map(|index| match self {
                Self::WholeBlock => Request {
                    index,
                    layers: LayerRange::All,
                    offset: 0,
                    len: g.block_bytes() as usize,
                },
                Self::SingleLayer => {
                    let l = (index % g.layers as usize) as u32;
                    Request {
                        index,
                        layers: LayerRange::Span {
                            start: l,
                            end: l + 1,
                        },
                        offset: l as usize * layer,
                        len: layer,
                    }
                }
            })
            .collect()
    }
}

/// One side's totals over one pass of a row.
#[derive(Default, Clone)]
struct Pass {
    bytes: u64,
    requests: u64,
    wall: Duration,
    server_cpu: Duration,
    client_cpu: Duration,
    process_cpu: Duration,
    lat: Latencies,
}

/// The reader's side: the pool to the node, a raw connection, a buffer.
struct Reader<'a> {
    served: &'a Serving,
    pool: PeerPool,
    peer: PeerAddr,
    raw: TcpStream,
    buf: Vec<u8>,
}

impl Reader<'_> {
    /// Reads every request of a pass through the peer pool, verified.
    async fn peer_pass(&mut self, requests: &[Request]) -> Result<Pass> {
        let mut pass = Pass::default();
        for r in requests {
            let (key, sums) = &self.served.blocks[r.index];
            let want = Want {
                key: *key,
                expect: Expect::Checksum(sums.block),
            };
            let target = &mut self.buf[..r.len];
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            let t = Instant::now();
            let got = (self.pool)
                .read_into(&self.peer, &[want], r.layers, &mut [target], deadline)
                .await?;
            pass.lat.push(t.elapsed());
            ensure!(
                got.sums[0].is_some(),
                "block {} missed: {:?}",
                r.index,
                got.counts
            );
            pass.bytes += r.len as u64;
        }
        Ok(pass)
    }

    /// Copies the same bytes over the raw connection.
    async fn raw_pass(&mut self, requests: &[Request]) -> Result<Pass> {
        let mut pass = Pass::default();
        for r in requests {
            let mut req = [0u8; RAW_REQUEST];
            for (i, v) in [r.index, r.offset, r.len].into_iter().enumerate() {
                req[i * 4..i * 4 + 4].copy_from_slice(&(v as u32).to_le_bytes());
            }
            let t = Instant::now();
            self.raw.write_all(&req).await?;
            self.raw.read_exact(&mut self.buf[..r.len]).await?;
            pass.lat.push(t.elapsed());
            pass.bytes += r.len as u64;
        }
        Ok(pass)
    }

    /// Runs one pass of `requests` on one side, timed.
    async fn timed(&mut self, peer: bool, requests: &[Request]) -> Result<Pass> {
        let before = Cpu::now();
        let t = Instant::now();
        let mut pass = if peer {
            self.peer_pass(requests).await?
        } else {
            self.raw_pass(requests).await?
        };
        pass.wall = t.elapsed();
        let after = Cpu::now();
        pass.server_cpu = after.server.saturating_sub(before.server);
        pass.client_cpu = after.client.saturating_sub(before.client);
        pass.process_cpu = after.process.saturating_sub(before.process);
        pass.requests = requests.len() as u64;
        Ok(pass)
    }
}

/// CPU time so far: the serving runtime's threads, the reading runtime's,
/// the whole process.
struct Cpu {
    server: Duration,
    client: Duration,
    process: Duration,
}

impl Cpu {
    fn now() -> Self {
        Self {
            server: threads_cpu(SERVER_THREADS),
            client: threads_cpu(CLIENT_THREADS),
            process: process_cpu_time(),
        }
    }
}

/// CPU time of this process's threads named `prefix...` (live ones; the
/// runtimes' workers live for the whole run), from their schedstat.
fn threads_cpu(prefix: &str) -> Duration {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    let ns: u64 = tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix))
        })
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(ns)
}

/// Both sides of one row over every round.
#[derive(Default)]
struct RowRuns {
    raw: Vec<Pass>,
    peer: Vec<Pass>,
}

/// Warms up, then measures `rounds` rounds of every row.
async fn measure(served: &Serving, geometry: Geometry, rounds: usize) -> Result<Vec<RowRuns>> {
    let me = Identity {
        secret: served.secret.clone(),
        ..identity("client")
    };
    let raw = TcpStream::connect(served.raw).await?;
    raw.set_nodelay(true)?;
    let mut reader = Reader {
        served,
        pool: PeerPool::new(me, PoolConfig::default()),
        peer: PeerAddr {
            node: "server".into(),
            addr: served.peer.local_addr(),
        },
        raw,
        buf: vec![0u8; geometry.block_bytes() as usize],
    };
    let rows: Vec<Vec<Request>> = (RowKind::ALL.iter())
        .map(|k| k.requests(geometry, served.blocks.len()))
        .collect();
    let mut runs: Vec<RowRuns> = rows.iter().map(|_| RowRuns::default()).collect();
    for round in 0..=rounds as u64 {
        for (requests, run) in rows.iter().zip(runs.iter_mut()) {
            let peer_first = kvtier_first(round);
            let first = reader.timed(peer_first, requests).await?;
            let second = reader.timed(!peer_first, requests).await?;
            // Round 0 warms up: connections, page faults, caches.
            if round > 0 {
                let (p, r) = if peer_first {
                    (first, second)
                } else {
                    (second, first)
                };
                run.peer.push(p);
                run.raw.push(r);
            }
        }
    }
    Ok(runs)
}

/// The figures of one side of a row.
#[derive(Debug, Serialize)]
struct SideFigures {
    /// Megabytes (10^6 B) per second, per round.
    mb_s: Spread,
    /// Per-request latency over every round, µs.
    p50_us: f64,
    /// 99th percentile of the same.
    p99_us: f64,
    /// The serving runtime's CPU per block read, µs.
    server_cpu_us_per_block: Spread,
    /// The reading runtime's CPU per block read, µs.
    client_cpu_us_per_block: Spread,
    /// The whole process's CPU per block (both sides, and the node's own
    /// threads), µs.
    process_cpu_us_per_block: Spread,
}

impl SideFigures {
    fn of(passes: &[Pass]) -> Self {
        let per_block = |f: fn(&Pass) -> Duration| {
            Spread::of(
                passes
                    .iter()
                    .map(|p| f(p).as_secs_f64() * 1e6 / p.requests.max(1) as f64)
                    .collect(),
            )
        };
        let mut lat = Latencies::default();
        for p in passes {
            lat.0.extend(&p.lat.0);
        }
        Self {
            mb_s: Spread::of(passes.iter().map(mb_s).collect()),
            p50_us: lat.percentile_us(50.0),
            p99_us: lat.percentile_us(99.0),
            server_cpu_us_per_block: per_block(|p| p.server_cpu),
            client_cpu_us_per_block: per_block(|p| p.client_cpu),
            process_cpu_us_per_block: per_block(|p| p.process_cpu),
        }
    }
}

fn mb_s(p: &Pass) -> f64 {
    p.bytes as f64 / 1e6 / p.wall.as_secs_f64().max(1e-9)
}

/// One row: both sides and the ratio of their throughputs.
#[derive(Debug, Serialize)]
struct Row {
    name: &'static str,
    /// Bytes per request.
    request_bytes: u64,
    /// Requests per round and side.
    requests: u64,
    raw_tcp: SideFigures,
    peer: SideFigures,
    /// Peer MB/s over raw MB/s, per round.
    ratio: Spread,
}

/// The bench's report.
#[derive(Debug, Serialize)]
struct Report {
    preset: String,
    block_bytes: u64,
    layer_bytes: u64,
    blocks: usize,
    rounds: usize,
    /// Both peers run in this one process (CPU is split by runtime).
    one_process: bool,
    rows: Vec<Row>,
}

impl Report {
    fn new(args: &PeerBenchArgs, preset: ModelPreset, g: Geometry, runs: Vec<RowRuns>) -> Self {
        let rows = RowKind::ALL
            .iter()
            .zip(runs)
            .map(|(kind, run)| {
                let ratios = (run.peer.iter().zip(&run.raw))
                    .map(|(p, r)| mb_s(p) / mb_s(r).max(1e-9))
                    .collect();
                let first = run.peer.first();
                Row {
                    name: kind.name(),
                    request_bytes: first.map_or(0, |p| p.bytes / p.requests.max(1)),
                    requests: first.map_or(0, |p| p.requests),
                    raw_tcp: SideFigures::of(&run.raw),
                    peer: SideFigures::of(&run.peer),
                    ratio: Spread::of(ratios),
                }
            })
            .collect();
        Self {
            preset: preset.name().to_owned(),
            block_bytes: g.block_bytes(),
            layer_bytes: g.layer_bytes(),
            blocks: args.blocks,
            rounds: args.rounds,
            one_process: true,
            rows,
        }
    }

    fn print(&self) {
        println!(
            "kvtier bench peer: {} blocks of {} B ({} B layers), preset {}, {} rounds; \
             both peers in this process (CPU split by runtime); median [min .. max] over rounds",
            self.blocks, self.block_bytes, self.layer_bytes, self.preset, self.rounds
        );
        for row in &self.rows {
            println!(
                "\n{} ({} B per request, {} requests a round); peer/raw MB/s: {}",
                row.name,
                row.request_bytes,
                row.requests,
                spread(row.ratio, 3)
            );
            for (side, f) in [("raw tcp", &row.raw_tcp), ("peer", &row.peer)] {
                println!(
                    "  {side:8} MB/s {}  p50 {:.1} us  p99 {:.1} us  cpu us/block: server {}  client {}  process {}",
                    spread(f.mb_s, 1),
                    f.p50_us,
                    f.p99_us,
                    spread(f.server_cpu_us_per_block, 1),
                    spread(f.client_cpu_us_per_block, 1),
                    spread(f.process_cpu_us_per_block, 1),
                );
            }
        }
    }
}
