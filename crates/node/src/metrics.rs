//! The node's figures as OpenMetrics text (served on the admin `/metrics`
//! of `kvtier serve`): the session counters, and per tier and per transfer
//! path what the manager counts.

use std::fmt::Write;

use kvtier_core::{Tier, TierKind};
use kvtier_manager::manager::ManagerStats;

use crate::peer::PeerMetrics;
use crate::peer_source::ServedByTier;
use crate::{Node, NodeStats};

/// Appends families to an OpenMetrics text.
struct Text(String);

impl Text {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        // Writing into a String cannot fail.
        let _ = writeln!(self.0, "# TYPE {name} {kind}\n# HELP {name} {help}");
    }

    fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.family(name, "counter", help);
        let _ = writeln!(self.0, "{name}_total {value}");
    }

    fn gauge(&mut self, name: &str, help: &str, value: u64) {
        self.family(name, "gauge", help);
        let _ = writeln!(self.0, "{name} {value}");
    }

    /// One family with a sample per label value.
    fn labelled(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        label: &str,
        samples: &[(String, f64)],
    ) {
        self.family(name, kind, help);
        let suffix = if kind == "counter" { "_total" } else { "" };
        for (value, sample) in samples {
            let _ = writeln!(self.0, "{name}{suffix}{{{label}=\"{value}\"}} {sample}");
        }
    }
}

impl Node {
    /// The node's metric families (no `# EOF`), for a scrape.
    pub fn metrics_text(&self) -> String {
        let manager = self.manager().stats();
        let node = self.stats();
        let mut t = Text(String::new());
        sessions(&mut t, &node);
        tiers(&mut t, &manager);
        paths(&mut t, &manager);
        if let Some(reader) = self.peer_reader() {
            reader_families(&mut t, &reader.pool().stats());
        }
        t.0
    }
}

fn sessions(t: &mut Text, s: &NodeStats) {
    t.gauge(
        "kvtier_node_sessions_open",
        "Engine connections open now.",
        s.sessions_open,
    );
    t.gauge(
        "kvtier_node_connections_open",
        "Connections open now, before and after the handshake.",
        s.connections_open,
    );
    for (name, help, value) in [
        (
            "sessions_opened",
            "Connections that completed the handshake.",
            s.sessions_opened,
        ),
        (
            "handshake_refusals",
            "Connections refused at the handshake.",
            s.handshake_refusals,
        ),
        ("bad_frames", "Frames that did not decode.", s.bad_frames),
        ("requests", "Requests served.", s.requests),
        ("lookups", "Blocks looked up.", s.lookups),
        (
            "cluster_lookups",
            "Lookups that asked the cluster for the keys past the node's own prefix.",
            s.cluster_lookups,
        ),
        (
            "cluster_hits",
            "Blocks the cluster located past the node's own prefix.",
            s.cluster_hits,
        ),
        (
            "cluster_misses",
            "Cluster lookups that located nothing.",
            s.cluster_misses,
        ),
        (
            "peer_loads",
            "Loads that read located blocks from other nodes.",
            s.peer_loads,
        ),
        (
            "peer_hits",
            "Blocks a Load brought from other nodes into G2.",
            s.peer_hits,
        ),
        (
            "peer_misses",
            "Located blocks a Load could not bring from other nodes.",
            s.peer_misses,
        ),
        (
            "peer_bytes",
            "Bytes of the blocks brought from other nodes.",
            s.peer_bytes,
        ),
        (
            "shared_g4_hits",
            "Blocks a Load brought from the cluster's shared G4 into G2.",
            s.shared_g4_hits,
        ),
        (
            "shared_g4_misses",
            "Blocks located in the shared G4 a Load could not bring.",
            s.shared_g4_misses,
        ),
        (
            "shared_g4_bytes",
            "Bytes of the blocks brought from the shared G4.",
            s.shared_g4_bytes,
        ),
        (
            "reserved",
            "Slots reserved for clients to fill.",
            s.reserved,
        ),
        (
            "committed",
            "Client-filled blocks made readable.",
            s.committed,
        ),
        (
            "commit_bad_checksum",
            "Commits whose bytes did not match their sums.",
            s.commit_bad_checksum,
        ),
        ("aborted", "Reservations dropped unfilled.", s.aborted),
        (
            "loaded",
            "Blocks made resident and pinned for a client.",
            s.loaded,
        ),
        (
            "load_misses",
            "Blocks asked for that no tier could serve.",
            s.load_misses,
        ),
        ("released", "Pins released.", s.released),
        ("removed", "Block copies removed on request.", s.removed),
        (
            "leases_expired",
            "Reservations and pins dropped by lease expiry.",
            s.leases_expired,
        ),
        (
            "connections_refused",
            "Connections refused with BUSY (connection cap, out of descriptors).",
            s.connections_refused,
        ),
        (
            "accept_failures",
            "Failed accepts of the node socket.",
            s.accept_failures,
        ),
        (
            "write_timeouts",
            "Connections closed because a write to the client timed out.",
            s.write_timeouts,
        ),
        (
            "handshake_timeouts",
            "Connections closed because Hello did not arrive in time.",
            s.handshake_timeouts,
        ),
        (
            "frame_timeouts",
            "Connections closed because a started frame did not complete in time.",
            s.frame_timeouts,
        ),
        (
            "idle_closed",
            "Idle connections closed while holding nothing.",
            s.idle_closed,
        ),
        (
            "pin_cap_refusals",
            "Loads refused at the session's pin cap.",
            s.pin_cap_refusals,
        ),
    ] {
        t.counter(&format!("kvtier_node_{name}"), help, value);
    }
    t.labelled(
        "kvtier_node_adopted_blocks",
        "gauge",
        "Blocks adopted into a tier at start (G2: a crashed daemon's arena; G3: the disk log; G4: the remote prefix).",
        "tier",
        &[
            ("g2".to_owned(), s.adopted_g2 as f64),
            ("g3".to_owned(), s.adopted_g3 as f64),
            ("g4".to_owned(), s.adopted_g4 as f64),
        ],
    );
}

fn tiers(t: &mut Text, m: &ManagerStats) {
    let per = |f: &dyn Fn(&kvtier_manager::manager::TierStats) -> f64| -> Vec<(String, f64)> {
        m.tiers
            .iter()
            .map(|s| (s.tier.name().to_owned(), f(s)))
            .collect()
    };
    t.labelled(
        "kvtier_tier_blocks",
        "gauge",
        "Blocks a tier holds.",
        "tier",
        &per(&|s| (s.pool.capacity - s.pool.free) as f64),
    );
    t.labelled(
        "kvtier_tier_capacity_blocks",
        "gauge",
        "Blocks a tier can hold.",
        "tier",
        &per(&|s| s.pool.capacity as f64),
    );
    t.labelled(
        "kvtier_tier_hits",
        "counter",
        "Prefix blocks a tier served.",
        "tier",
        &per(&|s| s.hits as f64),
    );
    t.labelled(
        "kvtier_tier_offloaded",
        "counter",
        "Blocks moved down from a tier.",
        "tier",
        &per(&|s| s.offloaded as f64),
    );
    t.labelled(
        "kvtier_tier_evictions",
        "counter",
        "Blocks a tier's policy evicted.",
        "tier",
        &per(&|s| s.pool.evictions as f64),
    );
    t.counter(
        "kvtier_manager_misses",
        "Blocks looked up that no tier held.",
        m.misses,
    );
    t.counter(
        "kvtier_manager_verify_failures",
        "Blocks that failed verification on the way.",
        m.verify_failures,
    );
    t.counter(
        "kvtier_manager_onboard_failures",
        "Onboarded blocks that did not arrive.",
        m.onboard_failures,
    );
    t.counter(
        "kvtier_manager_dropped",
        "Blocks that left the hierarchy.",
        m.dropped,
    );
    t.counter(
        "kvtier_manager_admission_refusals",
        "Blocks the admission filter kept off disk.",
        m.admission_refusals,
    );
}

fn paths(t: &mut Text, m: &ManagerStats) {
    let per = |f: &dyn Fn(&kvtier_manager::transfer::PathStats) -> f64| -> Vec<(String, f64)> {
        m.paths
            .iter()
            .map(|p| (p.path.name().to_owned(), f(p)))
            .collect()
    };
    t.labelled(
        "kvtier_path_bytes",
        "counter",
        "Bytes a transfer path delivered.",
        "path",
        &per(&|p| p.bytes as f64),
    );
    t.labelled(
        "kvtier_path_blocks",
        "counter",
        "Blocks a transfer path completed.",
        "path",
        &per(&|p| p.blocks as f64),
    );
    t.labelled(
        "kvtier_path_failed_blocks",
        "counter",
        "Blocks a transfer path failed.",
        "path",
        &per(&|p| p.failed_blocks as f64),
    );
    t.labelled(
        "kvtier_path_latency_p50_seconds",
        "gauge",
        "Median transfer latency of a path.",
        "path",
        &per(&|p| p.latency.p50_us as f64 / 1e6),
    );
    t.labelled(
        "kvtier_path_latency_p99_seconds",
        "gauge",
        "99th percentile transfer latency of a path.",
        "path",
        &per(&|p| p.latency.p99_us as f64 / 1e6),
    );
    t.labelled(
        "kvtier_path_queue_depth",
        "gauge",
        "Blocks queued on a path now.",
        "path",
        &per(&|p| p.queue_depth as f64),
    );
}

/// The peer server's families: its connections and handshakes, what it
/// sent, and per tier of `tiers` what the node's tiers served to peers.
pub(crate) fn peer_families(peer: &PeerMetrics, tiers: &[(Tier, TierKind)]) -> String {
    let s = peer.server.snapshot();
    let mut t = Text(String::new());
    t.gauge(
        "kvtier_peer_connections_open",
        "Peer connections open now.",
        s.open,
    );
    for (name, help, value) in [
        (
            "connections_accepted",
            "Peer connections given a slot (under peer.max_connections).",
            s.accepted,
        ),
        (
            "connections_refused",
            "Peer connections refused at peer.max_connections.",
            s.refused,
        ),
        (
            "authenticated",
            "Peer handshakes completed (the peer proved the cluster secret).",
            s.authenticated,
        ),
        (
            "auth_failures",
            "Peer handshakes refused: a bad proof (another secret), another cluster or protocol major.",
            s.auth_failures,
        ),
        (
            "handshake_failures",
            "Peer handshakes that timed out, closed early or were malformed.",
            s.handshake_failures,
        ),
        ("reads", "Read requests from peers.", s.reads),
        ("blocks_sent", "Blocks sent to peers.", s.blocks_sent),
        (
            "blocks_missing",
            "Blocks peers asked for that were answered as not held.",
            s.blocks_missing,
        ),
        ("bytes_sent", "Block bytes sent to peers.", s.bytes_sent),
    ] {
        t.counter(&format!("kvtier_peer_{name}"), help, value);
    }
    let served = peer.served.snapshot(tiers.iter().map(|(tier, _)| *tier));
    let per = |f: &dyn Fn(&ServedByTier) -> u64| -> Vec<(String, f64)> {
        served
            .iter()
            .map(|s| (s.tier.name().to_owned(), f(s) as f64))
            .collect()
    };
    t.labelled(
        "kvtier_peer_served_blocks",
        "counter",
        "Blocks a tier read back verified for peers.",
        "tier",
        &per(&|s| s.blocks),
    );
    t.labelled(
        "kvtier_peer_served_bytes",
        "counter",
        "Bytes a tier read back verified for peers.",
        "tier",
        &per(&|s| s.bytes),
    );
    t.labelled(
        "kvtier_peer_read_failures",
        "counter",
        "Blocks a tier held for a peer but did not read back verified (answered as not held).",
        "tier",
        &per(&|s| s.failed),
    );
    t.0
}

/// The family that says whether the node knows its block shape.
pub(crate) fn shape_family(known: bool) -> String {
    let mut t = Text(String::new());
    t.gauge(
        "kvtier_node_shape_known",
        "1 once the node knows its block shape; 0 while it waits for the first engine's Hello (no shape yet).",
        u64::from(known),
    );
    t.0
}

/// A label value as OpenMetrics quotes it: a node name comes from the
/// cluster and may hold any character.
fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// What the node's reader counted per peer (docs/peer-protocol.md §10-11).
fn reader_families(t: &mut Text, peers: &[(kvtier_peer::PeerAddr, kvtier_peer::PeerStats)]) {
    type Field = fn(&kvtier_peer::PeerStats) -> u64;
    let families: [(&str, &str, &str, Field); 10] = [
        (
            "reads",
            "counter",
            "Reads asked of a peer (skipped ones included).",
            |s| s.reads,
        ),
        (
            "found",
            "counter",
            "Block frames (a block, or a group of its layers when a Load streams) a peer returned verified.",
            |s| s.found,
        ),
        (
            "missing",
            "counter",
            "Block frames a peer answered it does not hold.",
            |s| s.missing,
        ),
        (
            "corrupt",
            "counter",
            "Block frames from a peer that failed verification.",
            |s| s.corrupt,
        ),
        (
            "bytes",
            "counter",
            "Verified bytes received from a peer.",
            |s| s.bytes,
        ),
        (
            "failures",
            "counter",
            "Reads of a peer that failed (connect, i/o, protocol, timeout).",
            |s| s.failures,
        ),
        (
            "timeouts",
            "counter",
            "Reads of a peer that ran out of their deadline.",
            |s| s.timeouts,
        ),
        (
            "skipped",
            "counter",
            "Reads refused at once while a failing peer was skipped.",
            |s| s.skipped,
        ),
        (
            "read_microseconds",
            "counter",
            "Microseconds the completed reads of a peer took.",
            |s| s.latency_sum_us,
        ),
        (
            "connections_open",
            "gauge",
            "Connections open to a peer.",
            |s| s.connections_open,
        ),
    ];
    for (name, kind, help, field) in families {
        let samples: Vec<(String, f64)> = peers
            .iter()
            .map(|(p, s)| (label_value(&p.node), field(s) as f64))
            .collect();
        t.labelled(
            &format!("kvtier_peer_reader_{name}"),
            kind,
            help,
            "peer",
            &samples,
        );
    }
    read_latency(t, peers);
}

/// The latency of each peer's completed reads as a histogram in seconds
/// (cumulative `le` buckets over [`kvtier_peer::LATENCY_BOUNDS_US`]), so
/// dashboards can take quantiles per peer.
fn read_latency(t: &mut Text, peers: &[(kvtier_peer::PeerAddr, kvtier_peer::PeerStats)]) {
    let name = "kvtier_peer_reader_read_seconds";
    t.family(
        name,
        "histogram",
        "Latency of a peer's completed reads (waiting for a connection and connecting included).",
    );
    let bounds = kvtier_peer::LATENCY_BOUNDS_US
        .iter()
        .map(|us| format!("{}", *us as f64 / 1e6));
    for (p, s) in peers {
        let peer = label_value(&p.node);
        let mut count = 0u64;
        for (le, n) in bounds
            .clone()
            .chain(["+Inf".to_owned()])
            .zip(s.latency_buckets)
        {
            count += n;
            let _ = writeln!(t.0, "{name}_bucket{{peer=\"{peer}\",le=\"{le}\"}} {count}");
        }
        let sum = s.latency_sum_us as f64 / 1e6;
        let _ = writeln!(t.0, "{name}_sum{{peer=\"{peer}\"}} {sum}");
        let _ = writeln!(t.0, "{name}_count{{peer=\"{peer}\"}} {count}");
    }
}

#[cfg(test)]
mod tests {
    use super::{Text, label_value, read_latency};

    #[test]
    fn read_latency_is_a_cumulative_histogram_in_seconds() {
        let mut stats = kvtier_peer::PeerStats::default();
        stats.latency_buckets[0] = 2;
        stats.latency_buckets[3] = 1;
        stats.latency_buckets[kvtier_peer::LATENCY_BOUNDS_US.len()] = 1;
        stats.latency_sum_us = 2_500_000;
        let peer = kvtier_peer::PeerAddr {
            node: "node-a".into(),
            addr: ([127, 0, 0, 1], 7470).into(),
        };
        let mut t = Text(String::new());
        read_latency(&mut t, &[(peer, stats)]);
        let name = "kvtier_peer_reader_read_seconds";
        for line in [
            format!("# TYPE {name} histogram"),
            format!("{name}_bucket{{peer=\"node-a\",le=\"0.0001\"}} 2"),
            format!("{name}_bucket{{peer=\"node-a\",le=\"0.0005\"}} 2"),
            format!("{name}_bucket{{peer=\"node-a\",le=\"0.001\"}} 3"),
            format!("{name}_bucket{{peer=\"node-a\",le=\"1\"}} 3"),
            format!("{name}_bucket{{peer=\"node-a\",le=\"+Inf\"}} 4"),
            format!("{name}_sum{{peer=\"node-a\"}} 2.5"),
            format!("{name}_count{{peer=\"node-a\"}} 4"),
        ] {
            assert!(t.0.lines().any(|l| l == line), "no {line:?} in\n{}", t.0);
        }
    }

    #[test]
    fn label_values_are_quoted() {
        assert_eq!(label_value("node-a"), "node-a");
        assert_eq!(label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
