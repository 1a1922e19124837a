//! Tiers as the model sees them: how fast a hit there reaches HBM and what a
//! GB held there costs per hour.
//!
//! Defaults come from seed 001's transfer table (CPU DRAM -> HBM over PCIe
//! Gen5 28 GB/s, NVMe 7 GB/s, a remote GPU over InfiniBand NDR 50 GB/s) and
//! seed 000's prices (DRAM $0.0088/GB-h, NVMe $0.000082/GB-h). The remote
//! tier's price is S3 Standard's list price ($0.023/GB-month); HBM costs
//! nothing on top of the GPU that holds it.

use serde::Serialize;

use super::ModelError;

/// One tier's transfer path to HBM and its storage price.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TierModel {
    /// Tier name as in the replay (`G1`, `G2`, ...).
    pub name: String,
    /// True for HBM (G1): a hit there is already in place and loads nothing.
    pub resident: bool,
    /// Bandwidth of the path into HBM, GB/s (10^9 bytes).
    pub bandwidth_gbps: f64,
    /// Fixed cost per block loaded, microseconds (request set-up, metadata);
    /// 0 by default: the seed tables give bandwidths only.
    pub per_block_latency_us: f64,
    /// Storage price, dollars per GB (10^9 bytes) per hour.
    pub dollars_per_gb_hour: f64,
}

impl TierModel {
    /// HBM: resident, no transfer, priced inside the GPU. The bandwidth
    /// (an H100's HBM, 3,350 GB/s, seed 001) is never used while resident.
    pub fn hbm() -> Self {
        Self::new("G1", true, 3350.0, 0.0)
    }

    /// Host DRAM over PCIe Gen5: 28 GB/s, $0.0088/GB-h.
    pub fn dram() -> Self {
        Self::new("G2", false, 28.0, 0.0088)
    }

    /// Local NVMe: 7 GB/s, $0.000082/GB-h.
    pub fn nvme() -> Self {
        Self::new("G3", false, 7.0, 0.000_082)
    }

    /// A remote node over InfiniBand NDR: 50 GB/s, priced as object storage
    /// ($0.023/GB-month = $0.0000315/GB-h).
    pub fn remote() -> Self {
        Self::new("G4", false, 50.0, 0.023 / 730.0)
    }

    fn new(name: &str, resident: bool, bandwidth_gbps: f64, dollars_per_gb_hour: f64) -> Self {
        TierModel {
            name: name.to_owned(),
            resident,
            bandwidth_gbps,
            per_block_latency_us: 0.0,
            dollars_per_gb_hour,
        }
    }

    /// The default model for a tier called `name`: `G1`/`hbm`, `G2`/`dram`,
    /// `G3`/`nvme`/`ssd`/`disk`, `G4`/`remote`; any other name (a
    /// single-tier replay's) is taken as host DRAM, where kvtier keeps its
    /// first tier of its own. The returned model carries `name`.
    pub fn for_name(name: &str) -> Self {
        let mut m = match name.to_ascii_lowercase().as_str() {
            "g1" | "hbm" | "gpu" => Self::hbm(),
            "g3" | "nvme" | "ssd" | "disk" => Self::nvme(),
            "g4" | "remote" | "s3" => Self::remote(),
            _ => Self::dram(),
        };
        m.name = name.to_owned();
        m
    }

    /// Checks the figures are usable (positive bandwidth, no negatives).
    pub fn validate(&self) -> Result<(), ModelError> {
        if !(self.bandwidth_gbps.is_finite() && self.bandwidth_gbps > 0.0) {
            return Err(ModelError::Invalid(format!(
                "tier {}: bandwidth must be positive, got {}",
                self.name, self.bandwidth_gbps
            )));
        }
        if !(self.per_block_latency_us >= 0.0 && self.dollars_per_gb_hour >= 0.0) {
            return Err(ModelError::Invalid(format!(
                "tier {}: latency and price must not be negative",
                self.name
            )));
        }
        Ok(())
    }

    /// Seconds to bring `bytes` in `blocks` blocks from this tier into HBM:
    /// `bytes / bandwidth + blocks x per_block_latency`; zero when resident.
    pub fn load_seconds(&self, bytes: f64, blocks: f64) -> f64 {
        if self.resident {
            return 0.0;
        }
        bytes / (self.bandwidth_gbps * 1e9) + blocks * self.per_block_latency_us * 1e-6
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_001_block_times() {
        // Seed 001: a 5.24 MB block takes 187 us from DRAM, 749 us from NVMe,
        // 105 us from a remote GPU over IB NDR.
        let b = 5.24e6;
        let us = |t: TierModel| (t.load_seconds(b, 1.0) * 1e6).round();
        assert_eq!(us(TierModel::dram()), 187.0);
        assert_eq!(us(TierModel::nvme()), 749.0);
        assert_eq!(us(TierModel::remote()), 105.0);
        assert_eq!(TierModel::hbm().load_seconds(b, 1.0), 0.0);
        assert_eq!(TierModel::for_name("cache").bandwidth_gbps, 28.0);
        assert_eq!(TierModel::for_name("cache").name, "cache");
    }
}
