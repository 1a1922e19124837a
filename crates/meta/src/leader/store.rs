//! [`LeaseStore`]: where the leader lease lives, and [`MemoryLease`], the
//! in-process store (one process, or tests).

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Why a lease store could not answer.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The Redis/Valkey server failed or could not be reached.
    #[error("leader lease on redis: {0}")]
    Redis(#[from] ::redis::RedisError),
    /// The lock file could not be opened, locked, read or written.
    #[error("leader lock file {path}: {source}")]
    File {
        /// The lock file.
        path: std::path::PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The blocking call panicked or was cancelled with its runtime.
    #[error("leader lease call did not finish: {0}")]
    Interrupted(String),
    /// The stored value is not `<epoch>|<node>`.
    #[error("leader lease holds {0:?}, not <epoch>|<node>")]
    Malformed(String),
}

/// Result of the lease stores.
pub type LeaseResult<T> = std::result::Result<T, LeaseError>;

/// Who holds the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The holder's node id.
    pub node: String,
    /// The holder's epoch: strictly larger for every new acquisition, so a
    /// stale leader's epoch is always smaller than the current one's.
    pub epoch: u64,
}

/// A store of one leader lease. Every call is short and blocking (callers
/// in async code run it on a blocking thread). Implementations:
/// [`MemoryLease`], [`super::RedisLease`], [`super::FileLease`].
pub trait LeaseStore: Send + Sync + std::fmt::Debug {
    /// Takes the lease for `node` for `ttl` if nobody holds it; returns the
    /// new epoch. If `node` already holds it, extends it and returns its
    /// epoch. `None` if another node holds it.
    fn try_acquire(&self, node: &str, ttl: Duration) -> LeaseResult<Option<u64>>;
    /// Extends `node`'s lease of `epoch` by `ttl` from now; `false` if it is
    /// no longer held under that epoch.
    fn renew(&self, node: &str, epoch: u64, ttl: Duration) -> LeaseResult<bool>;
    /// Gives the lease up if `node` still holds it under `epoch`.
    fn release(&self, node: &str, epoch: u64) -> LeaseResult<()>;
    /// The current holder, if any.
    fn holder(&self) -> LeaseResult<Option<Holder>>;
}

/// The value a store keeps: `<epoch>|<node>`.
pub(super) fn encode(epoch: u64, node: &str) -> String {
    format!("{epoch}|{node}")
}

/// Parses [`encode`]'s form.
pub(super) fn decode(v: &str) -> LeaseResult<(u64, String)> {
    let (e, node) = v
        .split_once('|')
        .ok_or_else(|| LeaseError::Malformed(v.to_owned()))?;
    let epoch = e.parse().map_err(|_| LeaseError::Malformed(v.to_owned()))?;
    Ok((epoch, node.to_owned()))
}

#[derive(Debug, Default)]
struct MemoryState {
    /// (node, epoch, expiry) of the holder.
    held: Option<(String, u64, Instant)>,
    last_epoch: u64,
}

/// A lease in this process's memory: electors sharing one instance elect
/// among themselves (tests; a single frontend).
#[derive(Debug, Default)]
pub struct MemoryLease {
    state: Mutex<MemoryState>,
}

impl MemoryLease {
    /// A lease nobody holds.
    pub fn new() -> Self {
        Self::default()
    }
}

impl LeaseStore for MemoryLease {
    fn try_acquire(&self, node: &str, ttl: Duration) -> LeaseResult<Option<u64>> {
        let mut st = self.state.lock();
        let now = Instant::now();
        match &mut st.held {
            Some((n, e, exp)) if *exp > now => {
                if n != node {
                    return Ok(None);
                }
                *exp = now + ttl;
                Ok(Some(*e))
            }
            _ => {
                st.last_epoch += 1;
                let e = st.last_epoch;
                st.held = Some((node.to_owned(), e, now + ttl));
                Ok(Some(e))
            }
        }
    }

    fn renew(&self, node: &str, epoch: u64, ttl: Duration) -> LeaseResult<bool> {
        let mut st = self.state.lock();
        let now = Instant::now();
        match &mut st.held {
            Some((n, e, exp)) if *exp > now && n == node && *e == epoch => {
                *exp = now + ttl;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn release(&self, node: &str, epoch: u64) -> LeaseResult<()> {
        let mut st = self.state.lock();
        if matches!(&st.held, Some((n, e, _)) if n == node && *e == epoch) {
            st.held = None;
        }
        Ok(())
    }

    fn holder(&self) -> LeaseResult<Option<Holder>> {
        let st = self.state.lock();
        let now = Instant::now();
        Ok(st
            .held
            .as_ref()
            .filter(|h| h.2 > now)
            .map(|(n, e, _)| Holder {
                node: n.clone(),
                epoch: *e,
            }))
    }
}
