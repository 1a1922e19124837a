//! `kvtier serve`: the node daemon. One block manager over the arena
//! (G2), the disk log (G3) and G4 when configured, serving every engine
//! process of the host on a Unix socket, and the metadata service when
//! `meta.enabled`.

use anyhow::{Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::sync::{Arc, OnceLock};

use kvtier_backend::{NodeView, NodeViewConfig, NodeViewSink};
use kvtier_manager::events::EventSink;
use kvtier_node::{Node, NodeServer};
use tokio::signal::unix::{Signal, SignalKind, signal};

/// Arguments of `kvtier serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// Data directory (overrides `serve.data_dir`, default `./kvtier-data`).
    /// It holds the disk tier (`<data-dir>/disk`, unless `disk.dirs` is
    /// set), the metadata index (`<data-dir>/meta.redb`) and the metadata
    /// service's file pool (`<data-dir>/pool`, `meta.pool_capacity`
    /// reserved, unless `meta.default_storage` is set) and, unless
    /// `manager.socket` is set, the node socket (`<data-dir>/node.sock`).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The node socket engines connect to (overrides `manager.socket`).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Seconds between statistics lines in the log (0: none).
    #[arg(long, default_value_t = 60)]
    stats_interval: u64,
}

/// Runs the node until a shutdown signal, then moves G2 down to the disk
/// log and checkpoints it.
pub fn run(config_path: Option<&Path>, args: ServeArgs) -> Result<()> {
    let mut config = crate::config::load(config_path)?;
    if let Some(d) = args.data_dir {
        config.serve.data_dir = d;
    }
    if let Some(s) = args.socket {
        config.manager.socket = s;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    // Before anything opens or makes a file in them: a data, disk or
    // socket directory another user can write, or an unknown
    // manager.access_group, stops the start with nothing changed.
    kvtier_node::check_dirs(&config.node())?;
    if config.meta.enabled {
        // Before the arena and the disk tier exist: a missing account key
        // must leave nothing behind.
        crate::meta::configured_accounts(&config)?;
        crate::meta::check_admin_exists(&config)?;
    }
    rt.block_on(async move {
        let geometry = config.geometry.resolve()?;
        // A pool the file system cannot hold stops the start before the
        // arena and the disk tier are made.
        crate::meta::check_default_pool_space(&config)?;
        let publish = config.meta.enabled && config.meta.publish_node_blocks;
        let view_sink = NodeViewSink::new();
        let sinks: Vec<Arc<dyn EventSink>> = if publish {
            vec![Arc::new(view_sink.clone())]
        } else {
            Vec::new()
        };
        let node = Node::open(&config.node(), sinks)
            .await
            .context("opening the node")?;
        // Install the handlers before announcing readiness, so a signal sent
        // as soon as the ready line appears still gets a clean shutdown.
        let signals = Signals::install()?;
        let view: Arc<OnceLock<NodeView>> = Arc::default();
        let meta = if config.meta.enabled {
            Some(start_meta(&config, &node, &view).await?)
        } else {
            None
        };
        if let (true, Some(m)) = (publish, &meta) {
            let name = node.options().node_name.clone();
            let started = NodeView::start(
                &view_sink,
                node.clone(),
                m.svc.clone(),
                NodeViewConfig::new(name),
            )
            .await
            .context("publishing the node's blocks to the metadata service")?;
            let _ = view.set(started);
        }
        // Engines connect only once the view observes their commits.
        let server = NodeServer::bind(node.clone(), &config.node_socket())
            .await
            .context("listening on the node socket")?;
        let http = if config.manager.metrics_addr.is_empty() {
            None
        } else {
            Some(
                crate::node_http::NodeHttp::start(node.clone(), &config.manager.metrics_addr)
                    .await?,
            )
        };
        let adopted = node.adopted();
        tracing::info!(
            geometry = %geometry,
            socket = %server.path().display(),
            shm = %node.memory().shm_path().display(),
            dram_blocks = node.memory().capacity_blocks(),
            adopted_g2 = adopted.g2,
            adopted_g3 = adopted.g3,
            adopted_g4 = adopted.g4,
            metrics = %http.as_ref().map_or("off".into(), |h| h.addr().to_string()),
            data_dir = %config.serve.data_dir.display(),
            "kvtier serving; Ctrl-C or SIGTERM to stop"
        );
        signals.wait(&node, args.stats_interval).await;
        tracing::info!("shutting down: closing client sessions");
        server.shutdown().await;
        if let Some(h) = http {
            h.stop().await;
        }
        if let Some(m) = meta {
            tracing::info!("shutting down: stopping the metadata service");
            m.shutdown().await;
        }
        tracing::info!("shutting down: moving G2 blocks to disk and checkpointing");
        node.close().await.context("closing the node")?;
        if let Some(v) = view.get() {
            v.stop().await;
        }
        log_stats(&node);
        tracing::info!("stopped cleanly");
        Ok(())
    })
}

/// Starts the metadata service over this host's node; its `/metrics`
/// carries the node's figures and, once it runs, the view's.
async fn start_meta(
    config: &crate::config::Config,
    node: &Arc<Node>,
    view: &Arc<OnceLock<NodeView>>,
) -> Result<crate::meta::RunningMeta> {
    let (n, v) = (node.clone(), view.clone());
    let metrics: kvtier_server::ExtraMetrics = Arc::new(move || {
        let mut text = n.metrics_text();
        if let Some(v) = v.get() {
            text.push_str(&v.metrics_text());
        }
        text
    });
    let host = crate::meta::HostNode {
        name: node.options().node_name.clone(),
        node: node.clone(),
        metrics,
    };
    crate::meta::RunningMeta::start(config, Some(host))
        .await
        .context("starting the metadata service")
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
    async fn wait(mut self, node: &Node, stats_interval: u64) {
        let mut tick = tokio::time::interval(Duration::from_secs(stats_interval.max(1)));
        tick.tick().await;
        loop {
            tokio::select! {
                _ = self.interrupt.recv() => return,
                _ = self.terminate.recv() => return,
                _ = tick.tick(), if stats_interval > 0 => log_stats(node),
            }
        }
    }
}

fn log_stats(node: &Node) {
    let s = node.stats();
    tracing::info!(
        sessions_open = s.sessions_open,
        committed = s.committed,
        loaded = s.loaded,
        load_misses = s.load_misses,
        aborted = s.aborted,
        leases_expired = s.leases_expired,
        blocks = ?s.tier_blocks,
        "stats"
    );
}
