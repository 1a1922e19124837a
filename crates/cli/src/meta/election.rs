//! The frontend's leader election as `[meta]` configures it: its node id,
//! where the lease lives and how often it is renewed (docs/server.md §9,
//! docs/configuration.md).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use kvtier_meta::leader::{
    Elector, ElectorConfig, FileLease, LeaseStore, MemoryLease, RedisLease, lock_path,
};
use rand::distr::{Alphanumeric, SampleString};

use crate::config::Config;

/// Starts this frontend's election and runs its first campaign, so a
/// frontend that can lead does before it serves.
pub async fn start(config: &Config) -> Result<Arc<Elector>> {
    let m = &config.meta;
    let cfg = ElectorConfig {
        node_id: node_id(config),
        lease: Duration::from_millis(m.leader_lease_ms),
        interval: Duration::from_millis(m.leader_loop_interval_ms),
    };
    let store = lease_store(config, cfg.lease)?;
    tracing::info!(node_id = %cfg.node_id, store = ?store, lease_ms = m.leader_lease_ms, "leader election");
    let elector = Elector::start_after_first_pass(store, cfg).await;
    tracing::info!(
        leader = elector.is_leader(),
        leader_node_id = %elector.leader_node_id(),
        "first campaign done"
    );
    Ok(Arc::new(elector))
}

/// `meta.node_id`, or upstream's form
/// `<host>:<admin_http_port>_<16 random characters>`: unique per start.
pub fn node_id(config: &Config) -> String {
    let m = &config.meta;
    if !m.node_id.is_empty() {
        return m.node_id.clone();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty() && !h.contains('|'))
        .unwrap_or_else(|| "localhost".into());
    let suffix = Alphanumeric.sample_string(&mut rand::rng(), 16);
    format!("{host}:{}_{suffix}", m.admin_http_port)
}

/// The lease store `meta.leader_lock` names, or the index's own place
/// when it is empty.
fn lease_store(config: &Config, lease: Duration) -> Result<Arc<dyn LeaseStore>> {
    let m = &config.meta;
    let data_dir = config.serve.data_dir.display().to_string();
    let lock = match (m.leader_lock.as_str(), m.index.as_str()) {
        ("", "memory") => "memory://".to_owned(),
        ("", "embedded") => format!("file://{data_dir}"),
        ("", url) => url.to_owned(),
        (lock, _) => lock.to_owned(),
    };
    if lock == "memory://" {
        return Ok(Arc::new(MemoryLease::new()));
    }
    if let Some(dir) = lock.strip_prefix("file://") {
        let dir = Path::new(dir);
        // New directories 0700; an existing one (the data directory by
        // default) keeps its mode. The lock file itself is 0600.
        kvtier_io::create_private_dir_all(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        return Ok(Arc::new(FileLease::new(lock_path(dir))));
    }
    // Each call gives up well before the lease could lapse unnoticed.
    let timeout = (lease / 4).clamp(Duration::from_millis(50), Duration::from_secs(2));
    let store = RedisLease::open(&lock, &m.redis_prefix, timeout)
        .with_context(|| format!("meta.leader_lock: {lock}"))?;
    Ok(Arc::new(store))
}
