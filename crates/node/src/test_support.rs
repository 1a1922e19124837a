//! Small real nodes for tests (feature `test-support`): an arena in
//! /dev/shm named per process and call, a disk log in a directory the
//! caller owns, geometry `tiny` (2 layers, 16 KiB blocks of 16 tokens).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use kvtier_core::{ByteSize, IoEngineKind};

use crate::NodeConfig;

/// A configuration for a node under `dir` with `dram_blocks` arena slots
/// and a 4 MiB disk log of 1 MiB regions (psync, no fsync), socket
/// `<dir>/node.sock`.
pub fn small_config(dir: &Path, dram_blocks: u64) -> NodeConfig {
    static N: AtomicU64 = AtomicU64::new(0);
    let geometry = kvtier_core::GeometryConfig {
        preset: Some("tiny".into()),
        tokens_per_block: 16,
        ..Default::default()
    };
    let block = geometry.resolve().map_or(16 << 10, |g| g.block_bytes());
    let mut c = NodeConfig {
        geometry: Some(geometry),
        ..NodeConfig::default()
    };
    c.memory.capacity = ByteSize(dram_blocks * block);
    c.memory.shm_name = format!(
        "kvtier-node-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    // 6 regions: a G3 pool of 3 regions' slots beside the 2 open for
    // writing and the one the log keeps free (docs/disk-format.md, I24).
    c.disk.capacity_per_dir = ByteSize(6 << 20);
    c.disk.region_size = ByteSize(1 << 20);
    c.disk.io_engine = IoEngineKind::Psync;
    c.disk.register_buffers = false;
    c.disk.sync = false;
    c.disk.checkpoint_interval_secs = 0;
    c.serve.data_dir = dir.to_owned();
    c.manager.lease_secs = 30;
    c
}

/// A node and its server on a runtime of their own, for tests that drive
/// it from plain threads (blocking clients). Stopped when dropped.
pub struct TestNode {
    /// The runtime the node's tasks run on.
    pub rt: tokio::runtime::Runtime,
    /// The node.
    pub node: std::sync::Arc<crate::Node>,
    /// The configuration it was opened with.
    pub config: NodeConfig,
    server: Option<crate::NodeServer>,
}

impl TestNode {
    /// Opens a node on `config` with `sinks` and listens on its socket.
    /// Panics (it is a test helper) when either fails.
    pub fn start(
        config: NodeConfig,
        sinks: Vec<std::sync::Arc<dyn kvtier_manager::events::EventSink>>,
    ) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime for the test node");
        let (node, server) = rt.block_on(async {
            let node = crate::Node::open(&config, sinks)
                .await
                .expect("open the node");
            let server = crate::NodeServer::bind(node.clone(), &config.node_socket())
                .await
                .expect("bind the node socket");
            (node, server)
        });
        Self {
            rt,
            node,
            config,
            server: Some(server),
        }
    }

    /// The socket clients connect to.
    pub fn socket(&self) -> std::path::PathBuf {
        self.config.node_socket()
    }

    /// Ends every session: the server stops and listens again.
    pub fn hang_up(&mut self) {
        if let Some(s) = self.server.take() {
            self.rt.block_on(s.shutdown());
        }
        let server = self
            .rt
            .block_on(crate::NodeServer::bind(self.node.clone(), &self.socket()))
            .expect("bind the node socket again");
        self.server = Some(server);
    }

    /// Stops the server and closes the node (G2 moves to the disk log);
    /// returns the configuration, to start it again.
    pub fn stop(mut self) -> NodeConfig {
        self.shut();
        self.config.clone()
    }

    /// Polls the node's stats until `done` holds; panics after 10 s.
    pub fn wait_stats(&self, what: &str, done: impl Fn(&crate::NodeStats) -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let s = self.node.stats();
            if done(&s) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {what}: {s:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    fn shut(&mut self) {
        if let Some(s) = self.server.take() {
            self.rt.block_on(s.shutdown());
            self.rt.block_on(self.node.close()).expect("close the node");
        }
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        self.shut();
    }
}

/// A test client's namespace: model `model`, f32, rank 0 of 1, 16 tokens
/// per block (what [`small_config`]'s nodes hold).
pub fn namespace(model: &str) -> kvtier_protocol::Namespace {
    kvtier_protocol::Namespace {
        model: model.into(),
        dtype: "f32".into(),
        layout_version: 1,
        block_size_tokens: 16,
        tp_rank: 0,
        tp_size: 1,
        tenant_salt: None,
    }
}
