//! What the node counts: sessions, requests and blocks per operation, on
//! top of the manager's own statistics.

use std::sync::atomic::{AtomicU64, Ordering};

use kvtier_manager::manager::ManagerStats;
use kvtier_protocol::Counter;

macro_rules! node_counters {
    ($($name:ident: $doc:literal),* $(,)?) => {
        /// The node's counters (atomics, shared by every session).
        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $( #[doc = $doc] pub(crate) $name: AtomicU64, )*
        }

        /// A snapshot of the node's counters and the manager's statistics.
        #[derive(Debug, Clone, Default, PartialEq)]
        pub struct NodeStats {
            $( #[doc = $doc] pub $name: u64, )*
            /// Blocks registered per tier (G2, G3, G4 when configured).
            pub tier_blocks: Vec<(String, u64)>,
            /// Capacity per tier, in blocks.
            pub tier_capacity: Vec<(String, u64)>,
            /// Blocks of a crashed daemon's arena adopted into G2 at start.
            pub adopted_g2: u64,
            /// Blocks of the disk log adopted into G3 at start.
            pub adopted_g3: u64,
            /// Objects of the remote prefix adopted into G4 at start.
            pub adopted_g4: u64,
        }

        impl Counters {
            pub(crate) fn snapshot(&self, manager: &ManagerStats) -> NodeStats {
                let mut s = NodeStats {
                    $( $name: self.$name.load(Ordering::Relaxed), )*
                    ..NodeStats::default()
                };
                for t in &manager.tiers {
                    let used = (t.pool.capacity - t.pool.free) as u64;
                    s.tier_blocks.push((t.tier.name().to_owned(), used));
                    s.tier_capacity.push((t.tier.name().to_owned(), t.pool.capacity as u64));
                }
                s
            }
        }

        impl NodeStats {
            /// Every counter by name, as a `StatsOk` reply carries them.
            pub fn counters(&self) -> Vec<Counter> {
                let mut out = vec![
                    $( Counter { name: stringify!($name).into(), value: self.$name }, )*
                ];
                out.push(Counter { name: "adopted_g2".into(), value: self.adopted_g2 });
                out.push(Counter { name: "adopted_g3".into(), value: self.adopted_g3 });
                out.push(Counter { name: "adopted_g4".into(), value: self.adopted_g4 });
                for (tier, n) in &self.tier_blocks {
                    out.push(Counter { name: format!("blocks_{tier}"), value: *n });
                }
                for (tier, n) in &self.tier_capacity {
                    out.push(Counter { name: format!("capacity_{tier}"), value: *n });
                }
                out
            }
        }
    };
}

node_counters! {
    sessions_opened: "Connections that completed the handshake.",
    sessions_open: "Connections open now.",
    handshake_refusals: "Connections refused at the handshake (version, geometry).",
    bad_frames: "Frames that did not decode (the connection was closed).",
    requests: "Requests served.",
    lookups: "Blocks looked up.",
    cluster_lookups: "Lookups that asked the cluster for the keys past the node's own prefix.",
    cluster_hits: "Blocks the cluster located past the node's own prefix.",
    cluster_misses: "Cluster lookups that located nothing.",
    peer_loads: "Loads that read located blocks from other nodes.",
    peer_hits: "Blocks a Load brought from other nodes into G2.",
    peer_misses: "Located blocks a Load could not bring (peer down, skipped, late, missing, corrupt, no room).",
    peer_bytes: "Bytes of the blocks brought from other nodes.",
    shared_g4_hits: "Blocks a Load brought from the cluster's shared G4 into G2.",
    shared_g4_misses: "Blocks located in the shared G4 a Load could not bring (missing, corrupt, late, no room).",
    shared_g4_bytes: "Bytes of the blocks brought from the shared G4.",
    reserved: "Slots reserved for clients to fill.",
    reserve_already_stored: "Reserve requests for blocks already stored.",
    reserve_in_flight: "Reserve requests for blocks another client was storing.",
    reserve_no_space: "Reserve requests refused for lack of room.",
    committed: "Client-filled blocks made readable.",
    commit_bad_checksum: "Commits whose bytes or sums did not check out.",
    aborted: "Reservations dropped by abort, disconnect or lease expiry.",
    loaded: "Blocks made resident and pinned for a client.",
    load_misses: "Blocks asked for that no tier could serve.",
    released: "Pins released (by release, disconnect or lease expiry).",
    removed: "Block copies removed on request.",
    leases_expired: "Reservations and pins dropped by lease expiry.",
    connections_open: "Connections open now, before and after the handshake.",
    connections_refused: "Connections refused with BUSY (the connection cap, out of descriptors).",
    accept_failures: "Failed accepts of the node socket (out of descriptors and the like).",
    write_timeouts: "Connections closed because a write to the client timed out.",
    handshake_timeouts: "Connections closed because Hello did not arrive in time.",
    frame_timeouts: "Connections closed because a started frame did not complete in time.",
    idle_closed: "Connections closed after the idle timeout while holding nothing.",
    pin_cap_refusals: "Loads refused because they could pass the session's pin cap.",
}

impl Counters {
    /// Adds `n` to `counter`.
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Subtracts `n` from `counter` (a gauge).
    pub(crate) fn sub(counter: &AtomicU64, n: u64) {
        counter.fetch_sub(n, Ordering::Relaxed);
    }
}
