//! The tiers of the hierarchy ([`Tier`], kvtier-core's) and the paths
//! blocks move along.

use serde::{Deserialize, Serialize};

/// The tier type is kvtier-core's, shared with the node protocol and the
/// Python binding; re-exported here because every seam of this crate is
/// keyed by it.
pub use kvtier_core::Tier;

/// A directed path a transfer takes; the transfer engine keeps one queue
/// per path. These are the node's paths: G2 is the fastest tier (engines
/// keep their own GPU cache in front of the node).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TransferPath {
    /// Host to disk (G2 -> G3 offload).
    HostToDisk,
    /// Disk to host (G3 -> G2 onboard).
    DiskToHost,
    /// Host to remote (G2 -> G4 offload, when no G3 is configured).
    HostToRemote,
    /// Disk to remote (G3 -> G4 offload).
    DiskToRemote,
    /// Remote to host (G4 -> G2 onboard).
    RemoteToHost,
}

impl TransferPath {
    /// Every path.
    pub const ALL: [TransferPath; 5] = [
        TransferPath::HostToDisk,
        TransferPath::DiskToHost,
        TransferPath::HostToRemote,
        TransferPath::DiskToRemote,
        TransferPath::RemoteToHost,
    ];

    /// The path from one tier to another, if blocks move that way.
    pub fn between(from: Tier, to: Tier) -> Option<TransferPath> {
        TransferPath::ALL
            .into_iter()
            .find(|p| p.endpoints() == (from, to))
    }

    /// The source and destination tiers.
    pub fn endpoints(self) -> (Tier, Tier) {
        const G2: Tier = Tier::G2;
        const G3: Tier = Tier::G3;
        const G4: Tier = Tier::G4;
        match self {
            TransferPath::HostToDisk => (G2, G3),
            TransferPath::DiskToHost => (G3, G2),
            TransferPath::HostToRemote => (G2, G4),
            TransferPath::DiskToRemote => (G3, G4),
            TransferPath::RemoteToHost => (G4, G2),
        }
    }

    /// Whether the path reads from storage toward G2 (an onboard), as
    /// opposed to an offload. The scheduler serves reads first.
    pub fn is_read(self) -> bool {
        let (from, to) = self.endpoints();
        to < from
    }

    /// Whether the path reads into host memory from the disk or G4, whose
    /// layer spans land in reserved arena slots
    /// ([`HostLanding`](crate::transfer::HostLanding)).
    pub fn lands_in_host(self) -> bool {
        matches!(self, TransferPath::DiskToHost | TransferPath::RemoteToHost)
    }

    /// Metric label (`h2disk`, `disk2h`, ...).
    pub fn name(self) -> &'static str {
        match self {
            TransferPath::HostToDisk => "h2disk",
            TransferPath::DiskToHost => "disk2h",
            TransferPath::HostToRemote => "h2remote",
            TransferPath::DiskToRemote => "disk2remote",
            TransferPath::RemoteToHost => "remote2h",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_between_tiers() {
        assert_eq!(
            TransferPath::between(Tier::G2, Tier::G3),
            Some(TransferPath::HostToDisk)
        );
        assert_eq!(
            TransferPath::between(Tier::G4, Tier::G2),
            Some(TransferPath::RemoteToHost)
        );
        assert_eq!(
            TransferPath::between(Tier::G3, Tier::G4),
            Some(TransferPath::DiskToRemote)
        );
        for p in TransferPath::ALL {
            let (from, to) = p.endpoints();
            assert_eq!(TransferPath::between(from, to), Some(p));
            assert_eq!(p.is_read(), to < from, "{}", p.name());
            assert_eq!(p.lands_in_host(), p.is_read(), "{}", p.name());
        }
        // G1 is the engine's, never the node's.
        for t in Tier::all() {
            assert_eq!(TransferPath::between(Tier::G1, t), None);
            assert_eq!(TransferPath::between(t, Tier::G1), None);
        }
        assert_eq!(TransferPath::between(Tier::G2, Tier::G2), None);
        assert_eq!(TransferPath::between(Tier::G4, Tier::G3), None);
        assert!(!TransferPath::DiskToRemote.is_read());
    }
}
