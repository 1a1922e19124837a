//! `kvtier bench ...`: benchmarks that measure their baseline in the same run.

mod baseline;
mod measure;
mod meta;
mod meta_wire;
mod store;

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
}

/// Runs a benchmark command.
pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Store(args) => store::run(args),
        BenchCommand::Meta(args) => meta::run(args),
    }
}
