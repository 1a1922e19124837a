//! `kvtier bench node-worker` (hidden): one client process of
//! `kvtier bench node`. It connects to the daemon, allocates and touches
//! its source and destination blocks, says [`Reply::Ready`], then runs the
//! phases its parent names on stdin (see [`super::wire`]).

use anyhow::{Context, Result, bail, ensure};
use clap::Args;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kvtier_client::{
    BlockHash, Client, ClientConfig, CommitEntry, CommitResult, Load, Namespace, ReserveResult,
    StoreOutcome, Tier, WireGeometry,
};
use kvtier_io::AlignedBuf;
use kvtier_protocol::KeyMap;

use super::echo::EchoClient;
use super::wire::{CONTROL_KEYS, Command, ControlResult, ControlRow, PhaseResult, Reply};
use crate::bench::measure::{process_cpu_time, process_minor_faults};

/// Arguments of the hidden `kvtier bench node-worker`, set by the parent.
#[derive(Args, Debug, Clone)]
pub struct NodeWorkerArgs {
    /// The daemon's socket.
    #[arg(long)]
    pub socket: PathBuf,
    /// The parent's echo socket (the raw round-trip baseline).
    #[arg(long)]
    pub echo: PathBuf,
    /// Tells this run's keys from any other run's on the same daemon.
    #[arg(long)]
    pub run_id: u32,
    /// This worker's number (its keys are its own).
    #[arg(long)]
    pub index: u32,
    /// Blocks stored and loaded per data phase.
    #[arg(long)]
    pub blocks: usize,
    /// Blocks per store or load call.
    #[arg(long)]
    pub batch: usize,
    /// Round trips timed per control operation.
    #[arg(long)]
    pub samples: usize,
    /// Layers per block.
    #[arg(long)]
    pub layers: u32,
    /// Bytes per layer.
    #[arg(long)]
    pub layer_bytes: u64,
    /// Tokens per block (the daemon checks it).
    #[arg(long)]
    pub tokens: u32,
}

impl NodeWorkerArgs {
    /// The arguments after `kvtier`, to start a worker with.
    pub fn to_argv(&self) -> Vec<String> {
        let mut argv = vec!["bench".to_owned(), "node-worker".to_owned()];
        let socket = self.socket.display().to_string();
        let pairs = [
            ("--socket", socket),
            ("--echo", self.echo.display().to_string()),
            ("--run-id", self.run_id.to_string()),
            ("--index", self.index.to_string()),
            ("--blocks", self.blocks.to_string()),
            ("--batch", self.batch.to_string()),
            ("--samples", self.samples.to_string()),
            ("--layers", self.layers.to_string()),
            ("--layer-bytes", self.layer_bytes.to_string()),
            ("--tokens", self.tokens.to_string()),
        ];
        for (flag, value) in pairs {
            argv.push(flag.to_owned());
            argv.push(value);
        }
        argv
    }
}

/// Runs a worker until its parent says [`Command::Exit`] or closes stdin.
pub fn run(args: NodeWorkerArgs) -> Result<()> {
    let mut worker = Worker::new(&args)?;
    let mut out = std::io::stdout().lock();
    reply(&mut out, &Reply::Ready)?;
    for line in std::io::stdin().lock().lines() {
        let cmd: Command = serde_json::from_str(&line.context("reading a command")?)
            .context("parsing a command")?;
        let answer = match cmd {
            Command::Memcpy => Reply::Phase(worker.memcpy()),
            Command::Store => Reply::Phase(worker.store()?),
            Command::Load => Reply::Phase(worker.load()?),
            Command::Remove => worker.remove().map(|()| Reply::Removed)?,
            Command::ControlBegin => worker.store_resident().map(|()| Reply::ControlReady)?,
            Command::Control { row, samples } => {
                Reply::Control(Box::new(worker.control(row, samples)?))
            }
            Command::ControlTidy => Reply::Control(Box::new(worker.tidy()?)),
            Command::ControlEnd => {
                worker.client.remove(&worker.resident)?;
                Reply::ControlReady
            }
            Command::Exit => break,
        };
        reply(&mut out, &answer)?;
    }
    Ok(())
}

fn reply(out: &mut impl Write, r: &Reply) -> Result<()> {
    serde_json::to_writer(&mut *out, r)?;
    out.write_all(b"\n")?;
    out.flush().context("writing a reply to the parent")
}

/// One client: its connection, its blocks and its keys.
struct Worker {
    client: Client,
    /// The raw round-trip baseline's socket.
    echo: EchoClient,
    key_map: KeyMap,
    /// The blocks stored, one buffer each (also the memcpy source).
    src: Vec<AlignedBuf>,
    /// Where loads (and the memcpy baseline) write.
    dst: Vec<AlignedBuf>,
    /// Keys of the data phases, one per source block.
    keys: Vec<BlockHash>,
    /// Keys kept resident for the `Lookup` and `Load` round trips.
    resident: Vec<BlockHash>,
    /// First key of the next new blocks a `Reserve` round trip stores.
    fresh_base: u128,
    /// Loads of the `Load` row, released after the row.
    loads: Vec<Load>,
    /// Keys the `Reserve` + `Commit` row stored, removed after the row.
    committed: Vec<BlockHash>,
    batch: usize,
    layers: u32,
}

impl Worker {
    fn new(args: &NodeWorkerArgs) -> Result<Self> {
        ensure!(args.blocks > 0 && args.batch > 0, "empty working set");
        let namespace = Namespace {
            model: "kvtier-bench-node".into(),
            dtype: "bf16".into(),
            layout_version: 1,
            block_size_tokens: args.tokens,
            tp_rank: 0,
            tp_size: 1,
            tenant_salt: None,
        };
        let geometry = WireGeometry {
            layers: args.layers,
            block_bytes: args.layer_bytes * args.layers as u64,
            layer_bytes: args.layer_bytes,
        };
        let config = ClientConfig::new(args.socket.clone(), namespace, geometry)
            .with_timeout(Duration::from_secs(60));
        let client = Client::connect(config).context("connecting to the daemon")?;
        let key_map = client.key_map();
        let block = geometry.block_bytes as usize;
        // Keys: run id, worker and range in the high bits, so runs and
        // workers never share a block unless asked to.
        let base = (u128::from(args.run_id) << 96) | (u128::from(args.index) << 80);
        let range = |r: u128, n: usize| (0..n as u128).map(move |j| BlockHash(base | r << 64 | j));
        Ok(Self {
            client,
            echo: EchoClient::connect(&args.echo)?,
            key_map,
            src: (0..args.blocks)
                .map(|i| source_block(block, args.index, i))
                .collect(),
            // Touched here, so no first-touch fault lands in a timed phase.
            dst: (0..args.blocks).map(|_| filled(block, 0xa5)).collect(),
            keys: range(1, args.blocks).collect(),
            resident: range(2, CONTROL_KEYS).collect(),
            fresh_base: base | 3 << 64,
            loads: Vec::new(),
            committed: Vec::new(),
            batch: args.batch,
            layers: args.layers,
        })
    }

    /// The baseline: single-thread memcpy of every source block into its
    /// destination buffer, the same bytes store reads and load writes.
    fn memcpy(&mut self) -> PhaseResult {
        let meter = Meter::start();
        for (d, s) in self.dst.iter_mut().zip(&self.src) {
            d.copy_from_slice(s);
        }
        std::hint::black_box(&self.dst);
        meter.finish(self.src.len(), self.block_bytes())
    }

    /// Stores every source block, `batch` per call; each must be stored.
    fn store(&mut self) -> Result<PhaseResult> {
        let meter = Meter::start();
        for (keys, srcs) in self
            .keys
            .chunks(self.batch)
            .zip(self.src.chunks(self.batch))
        {
            let blocks: Vec<(BlockHash, &[u8])> = keys
                .iter()
                .copied()
                .zip(srcs.iter().map(|b| &b[..]))
                .collect();
            let outcomes = self.client.store(&blocks)?;
            if let Some(o) = outcomes.iter().find(|o| **o != StoreOutcome::Stored) {
                bail!("a block was not stored: {o:?} (is the arena large enough?)");
            }
        }
        Ok(meter.finish(self.keys.len(), self.block_bytes()))
    }

    /// Loads every block back into the destination buffers, `batch` per
    /// call, each verified by the client as it is copied out.
    fn load(&mut self) -> Result<PhaseResult> {
        let meter = Meter::start();
        for (keys, dsts) in self
            .keys
            .chunks(self.batch)
            .zip(self.dst.chunks_mut(self.batch))
        {
            let mut views: Vec<&mut [u8]> = dsts.iter_mut().map(|d| &mut d[..]).collect();
            let n = self.client.load_into(keys, &mut views)?;
            ensure!(n == keys.len(), "only {n} of {} blocks loaded", keys.len());
        }
        Ok(meter.finish(self.keys.len(), self.block_bytes()))
    }

    fn remove(&mut self) -> Result<()> {
        for keys in self.keys.chunks(1024) {
            self.client.remove(keys)?;
        }
        Ok(())
    }

    /// Times `samples` round trips of `row`, one after the other (the
    /// parent measures the daemon's CPU over them and rotates the rows).
    fn control(&mut self, row: ControlRow, samples: usize) -> Result<ControlResult> {
        let mut out = ControlResult::default();
        for _ in 0..samples {
            match row {
                ControlRow::Floor => self.time_floor(&mut out)?,
                ControlRow::Lookup => self.time_lookup(&mut out)?,
                ControlRow::ReserveCommit => self.time_reserve_commit(&mut out)?,
                ControlRow::Load => self.time_load(&mut out)?,
                raw => self.time_raw(raw, &mut out)?,
            }
        }
        Ok(out)
    }

    /// Releases the loads and removes the blocks the last row left; times
    /// each `Release` (an engine sends it, but waits on nothing for it).
    fn tidy(&mut self) -> Result<ControlResult> {
        let mut out = ControlResult::default();
        for load in std::mem::take(&mut self.loads) {
            let t = Instant::now();
            self.client.release_load(load)?;
            out.release.push(nanos(t.elapsed()));
        }
        if !self.committed.is_empty() {
            self.client.remove(&std::mem::take(&mut self.committed))?;
        }
        Ok(out)
    }

    fn store_resident(&mut self) -> Result<()> {
        let blocks: Vec<(BlockHash, &[u8])> = self
            .resident
            .iter()
            .enumerate()
            .map(|(j, k)| (*k, &self.src[j % self.src.len()][..]))
            .collect();
        let outcomes = self.client.store(&blocks)?;
        ensure!(
            outcomes.iter().all(|o| o.is_stored()),
            "the resident control blocks were not all stored"
        );
        Ok(())
    }

    fn time_raw(&mut self, row: ControlRow, out: &mut ControlResult) -> Result<()> {
        let trips = row.raw_trips(self.layers);
        let t = Instant::now();
        for (req, reply) in trips {
            self.echo.round_trip(req, reply)?;
        }
        out.raw_series(row).push(nanos(t.elapsed()));
        Ok(())
    }

    fn time_floor(&mut self, out: &mut ControlResult) -> Result<()> {
        let t = Instant::now();
        let tiers = self.client.lookup(&[])?;
        out.floor.push(nanos(t.elapsed()));
        ensure!(tiers.is_empty(), "a lookup of no keys found {tiers:?}");
        Ok(())
    }

    fn time_lookup(&mut self, out: &mut ControlResult) -> Result<()> {
        let t = Instant::now();
        let tiers = self.client.lookup(&self.resident)?;
        out.lookup.push(nanos(t.elapsed()));
        ensure!(
            tiers.len() == CONTROL_KEYS && tiers.iter().all(|t| *t == Tier::G2),
            "the resident control blocks are not all in G2"
        );
        Ok(())
    }

    fn time_load(&mut self, out: &mut ControlResult) -> Result<()> {
        let t = Instant::now();
        let load = self.client.load(&self.resident)?;
        self.client.wait_layer(&load, self.layers - 1)?;
        out.load.push(nanos(t.elapsed()));
        ensure!(
            load.prefix_len() == CONTROL_KEYS,
            "only {} resident blocks loaded",
            load.prefix_len()
        );
        self.loads.push(load);
        Ok(())
    }

    fn time_reserve_commit(&mut self, out: &mut ControlResult) -> Result<()> {
        let first = self.fresh_base;
        self.fresh_base += CONTROL_KEYS as u128;
        let keys: Vec<BlockHash> = (0..CONTROL_KEYS as u128)
            .map(|j| BlockHash(first + j))
            .collect();
        let t = Instant::now();
        let granted = self.client.reserve(&keys)?;
        let reserved = t.elapsed();
        let entries = self.fill(&keys, &granted)?;
        let t = Instant::now();
        let committed = self.client.commit(entries)?;
        let commit = t.elapsed();
        ensure!(
            committed.iter().all(|c| *c == CommitResult::Stored),
            "a control block was not committed: {committed:?}"
        );
        self.committed.extend_from_slice(&keys);
        out.reserve.push(nanos(reserved));
        out.commit.push(nanos(commit));
        out.reserve_commit.push(nanos(reserved + commit));
        Ok(())
    }

    /// Fills the reserved slots (copy + checksum, as `Client::store` does).
    fn fill(&self, keys: &[BlockHash], granted: &[ReserveResult]) -> Result<Vec<CommitEntry>> {
        let arena = self.client.arena();
        let mut entries = Vec::with_capacity(keys.len());
        for (j, (key, result)) in keys.iter().zip(granted).enumerate() {
            let ReserveResult::Slot(s) = result else {
                bail!("control block {key} not reserved: {result:?}");
            };
            let slot = arena.slot_at(s.offset, s.len)?;
            let src = &self.src[j % self.src.len()];
            // SAFETY: the daemon reserved `slot` for this connection in the
            // reply just read, and nothing has committed or aborted it; this
            // thread alone fills it, once, and commits it right after.
            let sums = unsafe { arena.fill(slot, self.key_map.stored(*key), src) }?;
            entries.push(CommitEntry { key: *key, sums });
        }
        Ok(entries)
    }

    fn block_bytes(&self) -> u64 {
        self.src.first().map_or(0, |b| b.len() as u64)
    }
}

/// Block `i` of worker `w`: bytes that differ per block and worker, so no
/// two blocks share checksums.
fn source_block(len: usize, w: u32, i: usize) -> AlignedBuf {
    let mut b = AlignedBuf::zeroed(len, 4096);
    let seed = (w as usize * 7919 + i * 131) as u8;
    for (j, byte) in b.iter_mut().enumerate() {
        *byte = (j as u8).wrapping_mul(31) ^ seed;
    }
    b
}

fn filled(len: usize, value: u8) -> AlignedBuf {
    let mut b = AlignedBuf::zeroed(len, 4096);
    b.fill(value);
    b
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos() as u64
}

/// Wall time, CPU time and minor faults from a start point.
struct Meter {
    t0: Instant,
    cpu0: Duration,
    faults0: u64,
}

impl Meter {
    fn start() -> Self {
        Self {
            t0: Instant::now(),
            cpu0: process_cpu_time(),
            faults0: process_minor_faults(),
        }
    }

    fn finish(self, blocks: usize, block_bytes: u64) -> PhaseResult {
        PhaseResult {
            blocks: blocks as u64,
            bytes: blocks as u64 * block_bytes,
            wall_ns: nanos(self.t0.elapsed()),
            cpu_ns: nanos(process_cpu_time().saturating_sub(self.cpu0)),
            minor_faults: process_minor_faults().saturating_sub(self.faults0),
        }
    }
}
