//! The tiers of the hierarchy ([`Tier`], kvtier-core's) and the paths
//! blocks move along.

use serde::{Deserialize, Serialize};

/// The tier type is kvtier-core's, shared with the node protocol and the
/// Python binding; re-exported here because every seam of this crate is
/// keyed by it.
pub use kvtier_core::Tier;

/// A directed path a transfer takes; the transfer engine keeps one queue
/// per path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TransferPath {
    /// Device to host (G1 -> G2 offload).
    DeviceToHost,
    /// Host to device (G2 -> G1 onboard).
    HostToDevice,
    /// Host to disk (G2 -> G3 offload).
    HostToDisk,
    /// Disk to host (G3 -> G2 onboard).
    DiskToHost,
    /// Disk to device (G3 -> G1 onboard, bounced or direct).
    DiskToDevice,
    /// Host to remote (G2 -> G4 offload, when no G3 is configured).
    HostToRemote,
    /// Disk to remote (G3 -> G4 offload).
    DiskToRemote,
    /// Remote to host (G4 -> G2 onboard).
    RemoteToHost,
    /// Remote to device (G4 -> G1 onboard through a host bounce buffer).
    RemoteToDevice,
}

impl TransferPath {
    /// Every path.
    pub const ALL: [TransferPath; 9] = [
        TransferPath::DeviceToHost,
        TransferPath::HostToDevice,
        TransferPath::HostToDisk,
        TransferPath::DiskToHost,
        TransferPath::DiskToDevice,
        TransferPath::HostToRemote,
        TransferPath::DiskToRemote,
        TransferPath::RemoteToHost,
        TransferPath::RemoteToDevice,
    ];

    /// The path from one tier to another, if blocks move that way.
    pub fn between(from: Tier, to: Tier) -> Option<TransferPath> {
        TransferPath::ALL
            .into_iter()
            .find(|p| p.endpoints() == (from, to))
    }

    /// The source and destination tiers.
    pub fn endpoints(self) -> (Tier, Tier) {
        use Tier::*;
        match self {
            TransferPath::DeviceToHost => (G1, G2),
            TransferPath::HostToDevice => (G2, G1),
            TransferPath::HostToDisk => (G2, G3),
            TransferPath::DiskToHost => (G3, G2),
            TransferPath::DiskToDevice => (G3, G1),
            TransferPath::HostToRemote => (G2, G4),
            TransferPath::DiskToRemote => (G3, G4),
            TransferPath::RemoteToHost => (G4, G2),
            TransferPath::RemoteToDevice => (G4, G1),
        }
    }

    /// Whether the path reads from storage toward the device (an onboard),
    /// as opposed to an offload. The scheduler serves reads first.
    pub fn is_read(self) -> bool {
        let (from, to) = self.endpoints();
        to < from
    }

    /// Whether the path ends on the device (layer spans onto the device).
    pub fn to_device(self) -> bool {
        self.endpoints().1 == Tier::G1
    }

    /// Whether the path reads into host memory from the disk or G4, whose
    /// layer spans land in reserved arena slots
    /// ([`HostLanding`](crate::transfer::HostLanding)).
    pub fn lands_in_host(self) -> bool {
        matches!(self, TransferPath::DiskToHost | TransferPath::RemoteToHost)
    }

    /// Metric label (`d2h`, `h2d`, ...).
    pub fn name(self) -> &'static str {
        match self {
            TransferPath::DeviceToHost => "d2h",
            TransferPath::HostToDevice => "h2d",
            TransferPath::HostToDisk => "h2disk",
            TransferPath::DiskToHost => "disk2h",
            TransferPath::DiskToDevice => "disk2d",
            TransferPath::HostToRemote => "h2remote",
            TransferPath::DiskToRemote => "disk2remote",
            TransferPath::RemoteToHost => "remote2h",
            TransferPath::RemoteToDevice => "remote2d",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_between_tiers() {
        assert_eq!(
            TransferPath::between(Tier::G1, Tier::G2),
            Some(TransferPath::DeviceToHost)
        );
        assert_eq!(
            TransferPath::between(Tier::G3, Tier::G1),
            Some(TransferPath::DiskToDevice)
        );
        assert_eq!(
            TransferPath::between(Tier::G4, Tier::G2),
            Some(TransferPath::RemoteToHost)
        );
        assert_eq!(
            TransferPath::between(Tier::G3, Tier::G4),
            Some(TransferPath::DiskToRemote)
        );
        assert_eq!(TransferPath::between(Tier::G1, Tier::G4), None);
        for p in TransferPath::ALL {
            let (from, to) = p.endpoints();
            assert_eq!(TransferPath::between(from, to), Some(p));
            assert_eq!(p.is_read(), to < from, "{}", p.name());
        }
        assert_eq!(TransferPath::between(Tier::G2, Tier::G2), None);
        assert_eq!(TransferPath::between(Tier::G4, Tier::G4), None);
        assert_eq!(TransferPath::between(Tier::G1, Tier::G3), None);
        assert_eq!(Tier::G3.below(), Some(Tier::G4));
        assert!(TransferPath::DiskToHost.is_read() && !TransferPath::HostToDisk.is_read());
        assert!(TransferPath::RemoteToDevice.is_read() && TransferPath::RemoteToDevice.to_device());
        assert!(!TransferPath::DiskToRemote.is_read());
    }
}
