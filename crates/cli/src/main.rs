//! `kvtier`: the node's KV-cache store, its benchmarks and tools.
//!
//! A thin binary over the library crates: it parses arguments, loads the
//! configuration (file, then `KVTIER_*` environment overrides, then flags)
//! and hands off to `serve`, `meta`, `bench`, `replay` or `shape`.

mod bench;
mod config;
mod meta;
mod node_http;
mod replay;
mod serve;
mod shape;
mod trace;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// kvtier: a tiered KV-cache store for LLM serving engines.
#[derive(Parser)]
#[command(name = "kvtier", version, about)]
struct Cli {
    /// Configuration file (TOML). Default: $KVTIER_CONFIG, else ./kvtier.toml
    /// if it exists, else built-in defaults. `KVTIER_<SECTION>__<KEY>`
    /// environment variables override it.
    #[arg(long, global = true)]
    config: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the node store (DRAM + disk tiers) and, unless `meta.enabled` is
    /// false, the metadata service, until Ctrl-C or SIGTERM; then flush DRAM
    /// to disk and checkpoint.
    Serve(serve::ServeArgs),
    /// Run the metadata service alone (the global KV cache manager's meta +
    /// admin APIs over HTTP and gRPC), e.g. as a stateless frontend over a
    /// shared Redis/Valkey: `kvtier meta --index redis://host:6379/0`.
    Meta(meta::MetaArgs),
    /// The old name of `meta`, kept hidden for one release: prints a
    /// deprecation note, then runs `meta`.
    #[command(hide = true)]
    Manager(meta::MetaArgs),
    /// Benchmarks that run their baselines in the same run and print ratios.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Replay a request trace through eviction policies and tier layouts;
    /// print hit rates, modelled TTFT and cost (table, JSON or CSV) and
    /// optionally an HTML report.
    Replay(Box<replay::ReplayArgs>),
    /// Print the effective configuration (file + environment + defaults).
    Config,
    /// Print the node's `[geometry]` (and its `KVTIER_GEOMETRY__*`
    /// variables) for a Hugging Face model as an engine runs it, for a
    /// daemon whose shape is set by hand rather than by the first engine.
    Shape(shape::ShapeArgs),
    /// Write traces beyond the shared ones (`kvtier trace random`: the
    /// optimizer's random generator, in the Mooncake format).
    #[command(subcommand)]
    Trace(trace::TraceCommand),
}

/// What `kvtier manager` prints before it runs `meta`: scripts still using
/// the old name keep working for one release and are told what to change.
const MANAGER_DEPRECATED: &str = "kvtier: `kvtier manager` is deprecated and will be removed in the next release; use `kvtier meta` (same arguments)";

fn main() -> Result<()> {
    let cli = Cli::parse();
    // Benchmarks print their own progress; only warnings from the library.
    let default_level = if matches!(cli.command, Command::Bench(_) | Command::Replay(_)) {
        "warn"
    } else {
        "info"
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("KVTIER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal: piped logs (journald, files) stay plain.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli.command {
        Command::Serve(args) => serve::run(cli.config.as_deref(), args),
        Command::Meta(args) => meta::run(cli.config.as_deref(), args),
        Command::Manager(args) => {
            eprintln!("{MANAGER_DEPRECATED}");
            meta::run(cli.config.as_deref(), args)
        }
        Command::Bench(cmd) => bench::run(cmd),
        Command::Replay(args) => replay::run(*args),
        Command::Shape(args) => shape::run(args),
        Command::Trace(cmd) => trace::run(cmd),
        Command::Config => {
            let cfg = config::load(cli.config.as_deref())?;
            print!("{}", cfg.to_toml());
            Ok(())
        }
    }
}
