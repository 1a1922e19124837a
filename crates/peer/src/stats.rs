//! What a [`crate::PeerServer`] counts: connections, handshakes and the
//! blocks it sent, for the node's `/metrics` ([`ServerStats`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of a server's counters (all since it started).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections given a slot (under `max_connections`).
    pub accepted: u64,
    /// Connections refused at the connection limit (`Busy`, or closed
    /// without a word when too many refusals are under way).
    pub refused: u64,
    /// Connections open now.
    pub open: u64,
    /// Handshakes completed: peers that proved the cluster secret.
    pub authenticated: u64,
    /// Handshakes refused for a bad proof (another secret), another
    /// cluster or another major version.
    pub auth_failures: u64,
    /// Handshakes that ended otherwise: timed out, closed early, malformed.
    pub handshake_failures: u64,
    /// `Read` requests served.
    pub reads: u64,
    /// Blocks sent found.
    pub blocks_sent: u64,
    /// Blocks answered as not held (or not those layers).
    pub blocks_missing: u64,
    /// Block bytes sent (the layers asked, without frame heads or sums).
    pub bytes_sent: u64,
}

/// The live counters, shared by the server's connections and every
/// [`crate::ServerHandle`] clone of them.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) accepted: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) closed: AtomicU64,
    pub(crate) authenticated: AtomicU64,
    pub(crate) auth_failures: AtomicU64,
    pub(crate) handshake_failures: AtomicU64,
    pub(crate) reads: AtomicU64,
    pub(crate) blocks_sent: AtomicU64,
    pub(crate) blocks_missing: AtomicU64,
    pub(crate) bytes_sent: AtomicU64,
}

impl Counters {
    /// Adds `n` to `counter` (relaxed: counters order nothing).
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// The counters now.
    pub(crate) fn snapshot(&self) -> ServerStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let accepted = get(&self.accepted);
        ServerStats {
            accepted,
            refused: get(&self.refused),
            open: accepted.saturating_sub(get(&self.closed)),
            authenticated: get(&self.authenticated),
            auth_failures: get(&self.auth_failures),
            handshake_failures: get(&self.handshake_failures),
            reads: get(&self.reads),
            blocks_sent: get(&self.blocks_sent),
            blocks_missing: get(&self.blocks_missing),
            bytes_sent: get(&self.bytes_sent),
        }
    }
}

/// A server's counters, readable for as long as anyone holds this (after
/// the server stopped too): what the node's metrics keep.
#[derive(Debug, Clone, Default)]
pub struct StatsHandle(pub(crate) Arc<Counters>);

impl StatsHandle {
    /// The counters now.
    pub fn snapshot(&self) -> ServerStats {
        self.0.snapshot()
    }
}
