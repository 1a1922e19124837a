//! [`NodeHost`]: the node of a daemon that may not know its block shape
//! yet. With a shape configured or kept, the node opens at once; without
//! one, the first engine's `Hello` sets it: the node opens with the shape
//! that `Hello` declares, keeps it in the shape file, and every later
//! `Hello` is checked against it like any other (docs/node-protocol.md
//! I27).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use kvtier_manager::events::EventSink;
use kvtier_protocol::{ErrorCode, Hello};
use parking_lot::Mutex;
use tokio::sync::{OnceCell, watch};

use crate::peer::PeerMetrics;
use crate::shape::{Shape, ShapeOrigin};
use crate::stats::Counters;
use crate::{Node, NodeConfig, NodeError, NodeOptions};

/// What runs once the node is open ([`NodeHost::when_open`]).
pub type OpenHook = Box<dyn FnOnce(Arc<Node>) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// What opens the node once the shape is known.
struct Opener {
    config: NodeConfig,
    sinks: Vec<Arc<dyn EventSink>>,
}

/// A node daemon's node, open or waiting for its shape. The server serves
/// connections either way; until the shape is known they are counted here.
pub struct NodeHost {
    /// `None` for a host made around a node already open.
    opener: Option<Opener>,
    options: NodeOptions,
    pub(crate) counters: Arc<Counters>,
    node: OnceCell<Arc<Node>>,
    /// Tells [`wait`](Self::wait) that the node is open.
    opened: watch::Sender<bool>,
    /// Runs when the first `Hello` has opened the node, before it is
    /// answered.
    hook: Mutex<Option<OpenHook>>,
    /// The peer server's counters, once one serves this host.
    peer: OnceLock<PeerMetrics>,
}

impl std::fmt::Debug for NodeHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeHost")
            .field("node", &self.node.get())
            .finish_non_exhaustive()
    }
}

impl NodeHost {
    /// Prepares the directories (as [`Node::open`] does) and opens the
    /// node at once when the shape is configured or kept; otherwise the
    /// node waits for the first engine's `Hello`. Must run inside a tokio
    /// runtime.
    pub async fn open(
        config: &NodeConfig,
        sinks: Vec<Arc<dyn EventSink>>,
    ) -> Result<Arc<Self>, NodeError> {
        let options = NodeOptions::from_config(config)?;
        crate::access::prepare_dirs(config, options.access_group)?;
        let shape = crate::shape::at_start(config)?;
        let host = Self {
            opener: Some(Opener {
                config: config.clone(),
                sinks: sinks.clone(),
            }),
            options: options.clone(),
            counters: Arc::default(),
            node: OnceCell::new(),
            opened: watch::Sender::new(false),
            hook: Mutex::new(None),
            peer: OnceLock::new(),
        };
        match shape {
            Some(shape) => {
                let node =
                    Node::open_kept(config, options, shape, sinks, host.counters.clone()).await?;
                host.set(node);
            }
            None => tracing::info!(
                shape_file = %config.shape_file().display(),
                "no block shape configured or kept: the first engine's Hello sets it"
            ),
        }
        Ok(Arc::new(host))
    }

    /// A host of `node`, already open.
    pub fn of(node: Arc<Node>) -> Arc<Self> {
        let host = Self {
            opener: None,
            options: node.options().clone(),
            counters: node.counters.clone(),
            node: OnceCell::new(),
            opened: watch::Sender::new(false),
            hook: Mutex::new(None),
            peer: OnceLock::new(),
        };
        host.set(node);
        Arc::new(host)
    }

    fn set(&self, node: Arc<Node>) {
        let _ = self.node.set(node);
        self.opened.send_replace(true);
    }

    /// The node, once its shape is known.
    pub fn node(&self) -> Option<&Arc<Node>> {
        self.node.get()
    }

    /// Waits until the node is open, and returns it.
    pub async fn wait(&self) -> Arc<Node> {
        let mut opened = self.opened.subscribe();
        loop {
            if let Some(node) = self.node.get() {
                return node.clone();
            }
            // The sender lives in `self`: `changed` cannot fail while
            // `self` is borrowed.
            let _ = opened.changed().await;
        }
    }

    /// Runs `hook` with the node once it is open: now if it is, else when
    /// the first `Hello` has opened it, before that `Hello` is answered (so
    /// what the hook starts sees the first engine's commits). Call it
    /// before the server binds; a later hook replaces an earlier one that
    /// has not run.
    pub async fn when_open(&self, hook: OpenHook) {
        match self.node.get() {
            Some(node) => hook(node.clone()).await,
            None => *self.hook.lock() = Some(hook),
        }
    }

    /// The settings.
    pub fn options(&self) -> &NodeOptions {
        &self.options
    }

    /// The node's metric families (no `# EOF`), and whether its shape is
    /// known: before it is, that family alone.
    pub fn metrics_text(&self) -> String {
        let node = self.node();
        let mut text = crate::metrics::shape_family(node.is_some());
        if let Some(node) = node {
            text.push_str(&node.metrics_text());
        }
        if let Some(peer) = self.peer.get() {
            let tiers = node.map(|n| n.tier_list()).unwrap_or_default();
            text.push_str(&crate::metrics::peer_families(peer, &tiers));
        }
        text
    }

    /// Adds the peer server's counters to the metrics; false if a peer
    /// server already serves this host.
    pub(crate) fn set_peer_metrics(&self, metrics: PeerMetrics) -> bool {
        self.peer.set(metrics).is_ok()
    }

    /// The node that serves `hello`: the open one, or one opened now with
    /// the shape `hello` declares. Of concurrent first `Hello`s exactly
    /// one opens the node; the others wait for it and are then checked
    /// against its shape like any later `Hello`. A `Hello` whose shape the
    /// node cannot take, or a node that fails to open, gets the error to
    /// answer with (the next `Hello` tries again).
    pub(crate) async fn node_for(&self, hello: &Hello) -> Result<Arc<Node>, (ErrorCode, String)> {
        let Some(opener) = &self.opener else {
            return Ok(self.wait().await);
        };
        let node = self
            .node
            .get_or_try_init(|| self.open_learned(opener, hello))
            .await?
            .clone();
        self.opened.send_replace(true);
        Ok(node)
    }

    async fn open_learned(
        &self,
        opener: &Opener,
        hello: &Hello,
    ) -> Result<Arc<Node>, (ErrorCode, String)> {
        let geometry =
            crate::shape::learn(hello).map_err(|why| (ErrorCode::GEOMETRY_MISMATCH, why))?;
        let shape = Shape {
            geometry,
            origin: ShapeOrigin::Learned,
            file: opener.config.shape_file(),
        };
        let internal = |e: NodeError| {
            tracing::error!(error = %e, "could not open the node with the first engine's shape");
            (
                ErrorCode::INTERNAL,
                format!("the node could not open with this engine's block shape: {e}"),
            )
        };
        // Not kept, the shape would be learned again after a restart,
        // maybe another: a node whose shape cannot be kept is not used.
        let node = Node::open_kept(
            &opener.config,
            self.options.clone(),
            shape,
            opener.sinks.clone(),
            self.counters.clone(),
        )
        .await
        .map_err(internal)?;
        tracing::info!(
            shape = %node.shape().describe(),
            model = crate::conn::clip(&hello.namespace.model),
            "learned the block shape from the first engine"
        );
        let hook = self.hook.lock().take();
        if let Some(hook) = hook {
            hook(node.clone()).await;
        }
        Ok(node)
    }
}
