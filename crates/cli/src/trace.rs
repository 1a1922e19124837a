//! `kvtier trace`: writes traces for `kvtier replay` and `kvtier bench
//! trace` beyond the shared ones.

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

/// What `kvtier trace` writes.
#[derive(Debug, Subcommand)]
pub enum TraceCommand {
    /// A random trace in the Mooncake format (conversations growing turn by
    /// turn on shared system prompts, among one-off prompts): the
    /// generator the agreement test and docs/optimizer.md use; one seed
    /// names one trace on every machine.
    Random(RandomArgs),
}

/// Arguments of `kvtier trace random`.
#[derive(Debug, Args)]
pub struct RandomArgs {
    /// The generator's seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Requests to write.
    #[arg(long, default_value_t = 3000)]
    requests: usize,
    /// The file to write (default: standard output).
    #[arg(long, short)]
    out: Option<PathBuf>,
}

/// Runs `kvtier trace`.
pub fn run(cmd: TraceCommand) -> Result<()> {
    match cmd {
        TraceCommand::Random(a) => random(&a),
    }
}

fn random(a: &RandomArgs) -> Result<()> {
    let write = |w: &mut dyn Write| -> std::io::Result<()> {
        let mut w = BufWriter::new(w);
        kvtier_sim::trace::random::write_mooncake(&mut w, a.seed, a.requests)?;
        w.flush()
    };
    match &a.out {
        Some(path) => {
            let mut f = std::fs::File::create(path)
                .with_context(|| format!("creating {}", path.display()))?;
            write(&mut f).with_context(|| format!("writing {}", path.display()))
        }
        None => write(&mut std::io::stdout().lock()).context("writing to standard output"),
    }
}
