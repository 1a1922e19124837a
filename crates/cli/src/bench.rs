//! `kvtier bench ...`: benchmarks that measure their baseline in the same run.

mod baseline;
mod measure;
mod meta;
mod meta_wire;
mod node;
mod peer;
mod store;
mod trace;

use anyhow::Result;
use clap::Subcommand;

/// Benchmarks.
#[derive(Subcommand)]
pub enum BenchCommand {
    /// Disk and DRAM tiers against raw io_uring O_DIRECT, fio and memcpy on
    /// the same directory, object size and queue depth.
    Store(store::StoreBenchArgs),
    /// The metadata service: prefix matches of 1,024 keys in process and
    /// over HTTP and gRPC on loopback, two-phase write throughput, per
    /// index backend, next to data-structure and transport floors.
    Meta(meta::MetaBenchArgs),
    /// A request trace through the real block manager (G2/G3/G4 with real
    /// bytes): hit rates per tier, bytes per path, bubble, modelled TTFT.
    Trace(Box<trace::TraceBenchArgs>),
    /// N client processes storing and loading blocks through a node
    /// daemon (started in process unless `--socket`), against memcpy of the
    /// same bytes; control round trips of 64 keys; client and daemon CPU
    /// per block.
    Node(node::NodeBenchArgs),
    /// One node reading another's blocks over the peer data plane (whole
    /// blocks and single layers, verified, through the reader's pool)
    /// against a raw TCP copy of the same bytes; CPU per block per side.
    Peer(peer::PeerBenchArgs),
    /// One client process of `bench node` (started by it).
    #[command(hide = true)]
    NodeWorker(node::NodeWorkerArgs),
}

/// Runs a benchmark command.
pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Store(args) => store::run(args),
        BenchCommand::Meta(args) => meta::run(args),
        BenchCommand::Trace(args) => trace::run(*args),
        BenchCommand::Node(args) => node::run(args),
        BenchCommand::Peer(args) => peer::run(args),
        BenchCommand::NodeWorker(args) => node::run_worker(args),
    }
}
