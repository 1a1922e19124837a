//! [`NodeOptions`]: the `[manager]` section, parsed and checked.

use std::path::PathBuf;
use std::time::Duration;

use kvtier_core::Tier;
use kvtier_manager::admission::AdmissionConfig;
use kvtier_manager::manager::ManagerConfig;
use kvtier_manager::placement::{CascadeMode, HierarchyConfig, PlacementConfig};
use kvtier_manager::policy::{PolicyConfig, PolicyKind};
use kvtier_manager::pool::PoolConfig;

use crate::{NodeConfig, NodeError};

/// The node's settings, from `[manager]` (docs/configuration.md).
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// The Unix socket engines connect to.
    pub socket: PathBuf,
    /// `manager.access_group` resolved: the gid whose members may reach the
    /// socket and the arena, `None` for the daemon's user alone.
    pub access_group: Option<u32>,
    /// Eviction policy of every pool.
    pub policy: PolicyKind,
    /// Inclusive or exclusive cascade.
    pub mode: CascadeMode,
    /// Watermarks of every pool, as fractions of its capacity.
    pub watermarks: (f64, f64),
    /// Reuses a block needs before it is written to disk.
    pub admit_after: u32,
    /// Time between background steps.
    pub step_interval: Duration,
    /// Life of a reservation or pin of a connected client.
    pub lease: Duration,
    /// Hash client-filled slots on commit.
    pub verify_commits: bool,
    /// G4's URL, if any.
    pub g4_url: Option<String>,
    /// Blocks of the G4 pool.
    pub g4_capacity_blocks: usize,
    /// Largest batch of keys one request may name.
    pub max_batch: usize,
    /// Longest one write to a client may take before the connection closes.
    pub write_timeout: Duration,
    /// Time from connect within which `Hello` must arrive.
    pub handshake_timeout: Duration,
    /// Time a frame may take from its first byte to its last.
    pub frame_timeout: Duration,
    /// Quiet time after which a connection holding nothing is closed
    /// (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// Connections served at once.
    pub max_connections: usize,
    /// Pins one session may hold.
    pub max_pins_per_session: usize,
    /// NATS server for events, if any.
    pub events_nats_url: Option<String>,
    /// ZMQ endpoint for vLLM-format events, if any.
    pub events_zmq_endpoint: Option<String>,
    /// This node's name: `$KVTIER_NODE`, else the host name. Names the
    /// NATS subject and `kvtier://<node>` storages.
    pub node_name: String,
}

impl NodeOptions {
    /// The options of `config` (its `[manager]` section).
    pub fn from_config(config: &NodeConfig) -> Result<Self, NodeError> {
        let m = &config.manager;
        m.validate()?;
        let policy: PolicyKind = m
            .policy
            .parse()
            .map_err(|e| NodeError::Config(format!("manager.policy: {e}")))?;
        if policy.optimizer_only() {
            return Err(NodeError::Config(format!(
                "manager.policy: {policy} runs only in the optimizer (kvtier replay); a node runs one of lru, lfu, arc, s3-fifo, ttl, cost-aware, slru, hit-density"
            )));
        }
        let mode = match m.mode.as_str() {
            "inclusive" => CascadeMode::Inclusive,
            "exclusive" => CascadeMode::Exclusive,
            other => {
                return Err(NodeError::Config(format!(
                    "manager.mode must be exclusive or inclusive, not {other:?}"
                )));
            }
        };
        Ok(Self {
            socket: config.node_socket(),
            access_group: crate::access::resolve_group(&m.access_group)?,
            policy,
            mode,
            watermarks: (m.low_watermark, m.high_watermark),
            admit_after: m.admit_after,
            step_interval: Duration::from_millis(m.step_interval_ms),
            lease: Duration::from_secs(m.lease_secs),
            verify_commits: m.verify_commits,
            g4_url: non_empty(&m.g4_url),
            g4_capacity_blocks: m.g4_capacity_blocks,
            max_batch: m.max_batch,
            write_timeout: Duration::from_millis(m.write_timeout_ms),
            handshake_timeout: Duration::from_secs(m.handshake_timeout_secs),
            frame_timeout: Duration::from_secs(m.frame_timeout_secs),
            idle_timeout: (m.idle_timeout_secs > 0)
                .then(|| Duration::from_secs(m.idle_timeout_secs)),
            max_connections: m.max_connections,
            max_pins_per_session: m.max_pins_per_session,
            events_nats_url: non_empty(&m.events_nats_url),
            events_zmq_endpoint: non_empty(&m.events_zmq_endpoint),
            node_name: node_name(),
        })
    }

    /// The manager's configuration with a pool of the given size at each
    /// of `pools`' tiers (the arena's slot count at the top, what the disk
    /// log keeps below it ...).
    pub fn manager_config(
        &self,
        tokens_per_block: usize,
        pools: &[(Tier, usize)],
    ) -> ManagerConfig {
        let pool = |capacity_blocks: usize| PoolConfig {
            capacity_blocks,
            tokens_per_block,
            low_watermark: self.watermarks.0,
            high_watermark: self.watermarks.1,
            policy: PolicyConfig::of(self.policy),
            ..PoolConfig::default()
        };
        ManagerConfig {
            hierarchy: pools
                .iter()
                .fold(HierarchyConfig::none(), |h, &(tier, blocks)| {
                    h.with(tier, pool(blocks))
                })
                .with_placement(PlacementConfig {
                    mode: self.mode,
                    admission: AdmissionConfig {
                        min_reuses: self.admit_after,
                        ..AdmissionConfig::default()
                    },
                }),
            offload_on_demand: true,
            step_waits: false,
            verify_host_commits: self.verify_commits,
            ..ManagerConfig::default()
        }
    }
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

/// This node's name: `$KVTIER_NODE`, else the host name, else `localhost`.
pub fn node_name() -> String {
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
