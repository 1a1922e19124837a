//! `kvtier bench ...`: benchmarks that measure their baseline in the same run.

mod baseline;
mod measure;
mod store;

use anyhow::Result;
use clap::Subcommand;

/// Benchmarks.
#[derive(Subcommand)]
pub enum BenchCommand {
    /// Disk and DRAM tiers against raw io_uring O_DIRECT, fio and memcpy on
    /// the same directory, object size and queue depth.
    Store(store::StoreBenchArgs),
}

/// Runs a benchmark command.
pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Store(args) => store::run(args),
    }
}
