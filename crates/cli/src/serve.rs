//! `kvtier serve`: the node daemon. One block manager over the arena
//! (G2), the disk log (G3) and G4 when configured, serving every engine
//! process of the host on a Unix socket, and the metadata service when
//! `meta.enabled`.

use anyhow::{Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::sync::{Arc, OnceLock};

use kvtier_backend::{
    ClusterLookupConfig, ClusterNode, MetaClusterLookup, NodeView, NodeViewConfig, NodeViewSink,
    SharedG4Writer, SharedLookup,
};
use kvtier_manager::Tier;
use kvtier_manager::events::EventSink;
use kvtier_node::{Node, NodeHost, NodePeer, NodeServer, OpenHook, PeerOptions, PeerReader};
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
    // A missing or unsafe cluster secret stops the start before the arena
    // and the disk tier are made.
    let peer_options = PeerOptions::from_config(&config.peer)?;
    check_peer_name(peer_options.as_ref())?;
    let publish = config.meta.enabled && config.meta.publish_node_blocks;
    if let Some(o) = peer_options
        .as_ref()
        .filter(|o| publish && !o.can_advertise())
    {
        anyhow::bail!(
            "peer.listen {} is a wildcard address, which tells other nodes nothing; set peer.advertise to the address they reach this node at (the node publishes it with its blocks)",
            o.listen
        );
    }
    if config.meta.enabled {
        // Before the arena and the disk tier exist: a missing account key
        // must leave nothing behind.
        crate::meta::configured_accounts(&config)?;
        crate::meta::check_admin_exists(&config)?;
    }
    rt.block_on(async move {
        // A pool the file system cannot hold stops the start before the
        // arena and the disk tier are made.
        crate::meta::check_default_pool_space(&config)?;
        let view_sink = NodeViewSink::new();
        let sinks: Vec<Arc<dyn EventSink>> = if publish {
            vec![Arc::new(view_sink.clone())]
        } else {
            Vec::new()
        };
        // The node opens now when its shape is configured or kept, else
        // at the first engine's Hello.
        let host = NodeHost::open(&config.node(), sinks)
            .await
            .context("opening the node")?;
        // Install the handlers before announcing readiness, so a signal sent
        // as soon as the ready line appears still gets a clean shutdown.
        let signals = Signals::install()?;
        // Before the view: the address it publishes is the one bound.
        let peer = match peer_options.clone() {
            Some(options) => Some(
                NodePeer::start(&host, options)
                    .await
                    .context("starting the peer server")?,
            ),
            None => None,
        };
        let cluster = match (&peer_options, &peer, publish) {
            (Some(o), Some(p), true) => cluster_of(o, p.local_addr(), &config.shared_g4),
            _ => None,
        };
        let view: Arc<OnceLock<NodeView>> = Arc::default();
        let lookup: Arc<OnceLock<Arc<MetaClusterLookup>>> = Arc::default();
        let shared_g4: Arc<OnceLock<SharedG4Writer>> = Arc::default();
        let meta = if config.meta.enabled {
            let identity = peer_options.as_ref().map(|o| o.server.identity.clone());
            let installed = Installed {
                view: view.clone(),
                lookup: lookup.clone(),
                shared_g4: shared_g4.clone(),
            };
            Some(start_meta(&config, &host, installed, identity).await?)
        } else {
            None
        };
        if let (true, Some(m)) = (publish, &meta) {
            if let Some(c) = &cluster {
                let _ = lookup.set(Arc::new(MetaClusterLookup::new(
                    m.svc.clone(),
                    c.node.key.clone(),
                    c.lookup.clone(),
                )));
            }
            let hook = ViewHook {
                sink: view_sink,
                svc: m.svc.clone(),
                view: view.clone(),
                cluster: cluster.as_ref().map(|c| c.node.clone()),
                lookup: lookup.get().cloned(),
                reader: (peer_options.as_ref())
                    .filter(|_| cluster.is_some())
                    .map(|o| Arc::new(PeerReader::from_options(o))),
                shared_g4: (peer_options.as_ref())
                    .filter(|_| config.shared_g4.enabled())
                    .map(|o| SharedG4Hook {
                        keys: o.shared_keys.clone(),
                        load_timeout: o.load_timeout,
                        section: config.shared_g4.clone(),
                        writer: shared_g4.clone(),
                    }),
            };
            // Engines connect only once the view observes their commits.
            host.when_open(view_hook(&host, hook)).await;
            if host.node().is_some() && view.get().is_none() {
                anyhow::bail!(
                    "could not publish the node's blocks to the metadata service (see the log)"
                );
            }
            if host.node().is_some() && config.shared_g4.enabled() && shared_g4.get().is_none() {
                anyhow::bail!("could not start writing the shared G4 (see the log)");
            }
        }
        let server = NodeServer::bind_host(host.clone(), &config.node_socket())
            .await
            .context("listening on the node socket")?;
        let http = if config.manager.metrics_addr.is_empty() {
            None
        } else {
            Some(
                crate::node_http::NodeHttp::start(host.clone(), &config.manager.metrics_addr)
                    .await?,
            )
        };
        log_ready(&host, &server, http.as_ref(), peer.as_ref(), &config);
        signals.wait(&host, args.stats_interval).await;
        tracing::info!("shutting down: closing client sessions");
        server.shutdown().await;
        if let Some(p) = peer {
            tracing::info!("shutting down: closing peer connections");
            p.shutdown().await;
        }
        if let Some(h) = http {
            h.stop().await;
        }
        if let Some(m) = meta {
            tracing::info!("shutting down: stopping the metadata service");
            m.shutdown().await;
        }
        if let Some(w) = shared_g4.get() {
            w.stop().await;
        }
        if let Some(node) = host.node() {
            tracing::info!("shutting down: moving G2 blocks to disk and checkpointing");
            node.close().await.context("closing the node")?;
            if let Some(v) = view.get() {
                v.stop().await;
            }
            log_stats(node);
        }
        tracing::info!("stopped cleanly");
        Ok(())
    })
}

/// The line that says the daemon is ready, with its shape or that it waits
/// for one.
fn log_ready(
    host: &NodeHost,
    server: &NodeServer,
    http: Option<&crate::node_http::NodeHttp>,
    peer: Option<&NodePeer>,
    config: &crate::config::Config,
) {
    let shape = host.node().map_or_else(
        || "none yet: the first engine's Hello sets it".to_owned(),
        |n| n.shape().describe(),
    );
    let (dram_blocks, adopted) = host.node().map_or((0, Default::default()), |n| {
        (n.memory().capacity_blocks(), n.adopted())
    });
    tracing::info!(
        shape = %shape,
        socket = %server.path().display(),
        dram_blocks,
        adopted_g2 = adopted.in_tier(Tier::G2),
        adopted_g3 = adopted.in_tier(Tier::G3),
        adopted_g4 = adopted.in_tier(Tier::G4),
        metrics = %http.map_or("off".into(), |h| h.addr().to_string()),
        peer = %peer.map_or("off".into(), |p| p.local_addr().to_string()),
        data_dir = %config.serve.data_dir.display(),
        "kvtier serving; Ctrl-C or SIGTERM to stop"
    );
}

/// Refuses a peer name other than the node's own: its locations name the
/// node by that, and a peer that proves another name is refused by every
/// reader (`WrongNode`), so no block of it would ever be read.
fn check_peer_name(options: Option<&PeerOptions>) -> Result<()> {
    let node = kvtier_node::node_name();
    match options.map(|o| o.server.identity.node.as_str()) {
        Some(peer) if peer != node => anyhow::bail!(
            "peer.node_name {peer:?} is not this node's name {node:?} ($KVTIER_NODE, else the host name), which its locations carry; leave peer.node_name empty or set KVTIER_NODE={peer:?}"
        ),
        _ => Ok(()),
    }
}

/// The node in its cluster: what its locations carry and how it looks up
/// the other nodes' blocks.
struct Cluster {
    node: ClusterNode,
    lookup: ClusterLookupConfig,
}

/// The cluster identity of a node whose peer server listens on `bound`
/// and that publishes its blocks; `None` when it has no address to
/// publish (checked before the start: see `PeerOptions::can_advertise`).
fn cluster_of(
    options: &PeerOptions,
    bound: std::net::SocketAddr,
    shared_g4: &kvtier_node::SharedG4SectionConfig,
) -> Option<Cluster> {
    let addr = options.advertised(bound)?;
    // The name the node view publishes under (the authority of its URIs).
    let name = kvtier_node::node_name();
    Some(Cluster {
        node: ClusterNode {
            node: name.clone(),
            addr,
            key: options.location_key.clone(),
        },
        lookup: ClusterLookupConfig {
            timeout: options.lookup_timeout,
            shared: shared_g4.enabled().then(|| SharedLookup {
                keys: options.shared_keys.clone(),
                instance: shared_g4.instance.clone(),
            }),
            ..ClusterLookupConfig::new(name)
        },
    })
}

/// What the node view starts with once the node is open.
struct ViewHook {
    sink: NodeViewSink,
    svc: Arc<kvtier_meta::MetaService>,
    view: Arc<OnceLock<NodeView>>,
    /// The node's cluster identity, when it has a peer server.
    cluster: Option<ClusterNode>,
    /// Installed on the node with the view.
    lookup: Option<Arc<MetaClusterLookup>>,
    /// Reads the blocks the lookup locates; installed with it.
    reader: Option<Arc<PeerReader>>,
    /// Writes the shared G4, when `[shared_g4]` is on.
    shared_g4: Option<SharedG4Hook>,
}

/// What the shared G4's writer starts with once the node is open.
struct SharedG4Hook {
    keys: kvtier_node::SharedKeys,
    /// How long a `Load` waits for the shared G4 (`peer.load_timeout_ms`).
    load_timeout: Duration,
    section: kvtier_node::SharedG4SectionConfig,
    writer: Arc<OnceLock<SharedG4Writer>>,
}

impl SharedG4Hook {
    /// Installs the shared G4's reader on `node` and starts its writer; a
    /// writer that fails is logged.
    async fn start(self, node: Arc<Node>, svc: Arc<kvtier_meta::MetaService>) {
        let store = kvtier_node::remote_config(&self.section.url);
        match kvtier_remote::ObjectBlocks::open(&store, *node.geometry()) {
            Ok(blocks) => {
                let reader = kvtier_node::SharedReader::new(blocks, self.load_timeout);
                node.set_shared_reader(Arc::new(reader));
            }
            Err(e) => tracing::error!(error = %e, "could not open the shared G4"),
        }
        match SharedG4Writer::start(node, svc, self.keys, &store, self.section).await {
            Ok(w) => {
                let _ = self.writer.set(w);
            }
            Err(e) => tracing::error!(error = %e, "could not start writing the shared G4"),
        }
    }
}

/// Starts the node view (the node's blocks published to the metadata
/// service) once the node is open, and installs the cluster lookup; a
/// view that fails to start is logged.
fn view_hook(host: &NodeHost, hook: ViewHook) -> OpenHook {
    let name = host.options().node_name.clone();
    Box::new(move |node| {
        Box::pin(async move {
            let ViewHook {
                sink,
                svc,
                view,
                cluster,
                lookup,
                reader,
                shared_g4,
            } = hook;
            if let Some(l) = lookup {
                node.set_cluster_lookup(l);
            }
            if let Some(r) = reader {
                node.set_peer_reader(r);
            }
            let config = NodeViewConfig {
                cluster,
                ..NodeViewConfig::new(name)
            };
            if let Some(h) = shared_g4 {
                h.start(node.clone(), svc.clone()).await;
            }
            match NodeView::start(&sink, node, svc, config).await {
                Ok(started) => {
                    let _ = view.set(started);
                }
                Err(e) => tracing::error!(
                    error = %e,
                    "could not publish the node's blocks to the metadata service"
                ),
            }
        })
    })
}

/// What the node installs once it is open, whose figures join `/metrics`.
struct Installed {
    view: Arc<OnceLock<NodeView>>,
    lookup: Arc<OnceLock<Arc<MetaClusterLookup>>>,
    shared_g4: Arc<OnceLock<SharedG4Writer>>,
}

/// Starts the metadata service beside this host's node; its `/metrics`
/// carries the node's figures (and whether its shape is known yet).
async fn start_meta(
    config: &crate::config::Config,
    host: &Arc<NodeHost>,
    installed: Installed,
    peer_identity: Option<kvtier_backend::PeerIdentity>,
) -> Result<crate::meta::RunningMeta> {
    let h = host.clone();
    let metrics: kvtier_server::ExtraMetrics = Arc::new(move || {
        let mut text = h.metrics_text();
        if let Some(v) = installed.view.get() {
            text.push_str(&v.metrics_text());
        }
        if let Some(l) = installed.lookup.get() {
            text.push_str(&l.metrics_text());
        }
        if let Some(w) = installed.shared_g4.get() {
            text.push_str(&w.metrics_text());
        }
        text
    });
    let node = crate::meta::HostNode {
        name: host.options().node_name.clone(),
        host: host.clone(),
        metrics,
        peer_identity,
    };
    crate::meta::RunningMeta::start(config, Some(node))
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
    async fn wait(mut self, host: &NodeHost, stats_interval: u64) {
        let mut tick = tokio::time::interval(Duration::from_secs(stats_interval.max(1)));
        tick.tick().await;
        loop {
            tokio::select! {
                _ = self.interrupt.recv() => return,
                _ = self.terminate.recv() => return,
                _ = tick.tick(), if stats_interval > 0 => match host.node() {
                    Some(node) => log_stats(node),
                    None => tracing::info!("stats: no shape yet (no engine has connected)"),
                },
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
