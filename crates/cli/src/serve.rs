//! `kvtier serve`: the node store as a long-running process.

use anyhow::{Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kvtier_store::Store;
use tokio::signal::unix::{Signal, SignalKind, signal};

/// Arguments of `kvtier serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// Data directory (overrides `serve.data_dir`, default `./kvtier-data`).
    /// It holds the disk tier (`<data-dir>/disk`, unless `disk.dirs` is
    /// set), the metadata index (`<data-dir>/meta.redb`) and the KV cache
    /// manager's file pool (`<data-dir>/pool`, `meta.pool_capacity`
    /// reserved, unless `meta.default_storage` is set).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Seconds between statistics lines in the log (0: none).
    #[arg(long, default_value_t = 60)]
    stats_interval: u64,
}

/// Runs the store until a shutdown signal, then flushes and checkpoints.
pub fn run(config_path: Option<&Path>, args: ServeArgs) -> Result<()> {
    let mut config = crate::config::load(config_path)?;
    if let Some(d) = args.data_dir {
        config.serve.data_dir = d;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    if config.meta.enabled {
        // Before the arena and the disk tier exist: a missing account key
        // must leave nothing behind.
        crate::manager::configured_accounts(&config)?;
        crate::manager::check_admin_exists(&config)?;
    }
    rt.block_on(async move {
        let geometry = config.geometry.resolve()?;
        // A pool the file system cannot hold stops the start before the
        // arena and the disk tier are made.
        crate::manager::check_default_pool_space(&config)?;
        for dir in config.disk_dirs() {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let store = Store::open(&config).await.context("opening the store")?;
        // Install the handlers before announcing readiness, so a signal sent
        // as soon as the ready line appears still gets a clean shutdown.
        let signals = Signals::install()?;
        let manager = if config.meta.enabled {
            let node = node_name();
            Some(
                crate::manager::Manager::start(&config, Some((node, store.clone())))
                    .await
                    .context("starting the kv cache manager")?,
            )
        } else {
            None
        };
        let disk = store
            .disk()
            .map(|d| (d.len(), d.capacity_blocks()))
            .unwrap_or_default();
        tracing::info!(
            geometry = %geometry,
            shm = %store.memory().shm_path().display(),
            dram_blocks = store.memory().capacity_blocks(),
            disk_blocks = disk.1,
            recovered_blocks = disk.0,
            data_dir = %config.serve.data_dir.display(),
            "kvtier serving; Ctrl-C or SIGTERM to stop"
        );
        signals.wait(&store, args.stats_interval).await;
        if let Some(m) = manager {
            tracing::info!("shutting down: stopping the kv cache manager");
            m.shutdown().await;
        }
        tracing::info!("shutting down: writing DRAM blocks to disk and checkpointing");
        store.close().await.context("closing the store")?;
        log_stats(&store);
        tracing::info!("stopped cleanly");
        Ok(())
    })
}

/// This node's name in `kvtier://<node>` storage URIs: `$KVTIER_NODE`,
/// else the host name.
fn node_name() -> String {
    if let Ok(n) = std::env::var("KVTIER_NODE")
        && !n.is_empty()
    {
        return n;
    }
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into `buf`.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match std::str::from_utf8(&buf[..end]) {
        Ok(name) if rc == 0 && !name.is_empty() => name.to_owned(),
        _ => "localhost".to_owned(),
    }
}

/// SIGINT and SIGTERM, registered up front.
pub(crate) struct Signals {
    interrupt: Signal,
    terminate: Signal,
}

impl Signals {
    pub(crate) fn install() -> Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
            terminate: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
        })
    }

    /// Returns on the first SIGINT or SIGTERM.
    pub(crate) async fn wait_only(mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }

    /// Returns on the first SIGINT or SIGTERM, logging statistics every
    /// `stats_interval` seconds meanwhile (0: never).
    async fn wait(mut self, store: &Store, stats_interval: u64) {
        let mut tick = tokio::time::interval(Duration::from_secs(stats_interval.max(1)));
        tick.tick().await;
        loop {
            tokio::select! {
                _ = self.interrupt.recv() => return,
                _ = self.terminate.recv() => return,
                _ = tick.tick(), if stats_interval > 0 => log_stats(store),
            }
        }
    }
}

fn log_stats(store: &Store) {
    let s = store.stats();
    tracing::info!(
        puts = s.puts,
        hits_memory = s.hits_memory,
        hits_disk = s.hits_disk,
        misses = s.misses,
        corrupt_memory = s.corrupt_memory,
        corrupt_disk = s.corrupt_disk,
        demotions = s.demotions,
        demotion_errors = s.demotion_errors,
        promotions = s.promotions,
        "stats"
    );
}
