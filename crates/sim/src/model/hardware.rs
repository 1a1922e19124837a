//! GPU and model tables: the few numbers per device and per model that the
//! prefill formula needs.
//!
//! GPU figures are the vendors' published dense (no sparsity) BF16 tensor
//! throughput, HBM bandwidth and capacity. Hourly prices are round on-demand
//! cloud figures; the H100's $5/h is the one Tutti's cost formula uses
//! (seed 000). Every price is a default meant to be overridden.

use kvtier_core::{Geometry, ModelPreset};
use serde::Serialize;
use std::str::FromStr;

use super::ModelError;

/// One GPU's compute, memory and price.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GpuSpec {
    /// Table name (`h100`, `h200`, ...).
    pub name: &'static str,
    /// Dense BF16 tensor throughput, TFLOP/s (10^12).
    pub bf16_tflops: f64,
    /// HBM bandwidth, GB/s (10^9).
    pub hbm_gbps: f64,
    /// HBM capacity, GB (10^9).
    pub hbm_gb: f64,
    /// Price, dollars per GPU-hour.
    pub dollars_per_hour: f64,
}

/// The GPUs in the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GpuKind {
    /// NVIDIA H100 SXM 80 GB.
    H100Sxm,
    /// NVIDIA H200 141 GB.
    H200,
    /// NVIDIA A100 SXM 80 GB.
    A100_80G,
    /// NVIDIA L40S 48 GB.
    L40S,
    /// NVIDIA B200 180 GB.
    B200,
}

impl GpuKind {
    /// Every GPU in the table.
    pub const ALL: [GpuKind; 5] = [
        GpuKind::H100Sxm,
        GpuKind::H200,
        GpuKind::A100_80G,
        GpuKind::L40S,
        GpuKind::B200,
    ];

    /// The GPU's published figures and default price.
    pub const fn spec(self) -> GpuSpec {
        let (name, bf16_tflops, hbm_gbps, hbm_gb, dollars_per_hour) = match self {
            GpuKind::H100Sxm => ("h100", 989.0, 3350.0, 80.0, 5.0),
            GpuKind::H200 => ("h200", 989.0, 4800.0, 141.0, 6.0),
            GpuKind::A100_80G => ("a100-80g", 312.0, 2039.0, 80.0, 2.5),
            GpuKind::L40S => ("l40s", 362.0, 864.0, 48.0, 1.5),
            GpuKind::B200 => ("b200", 2250.0, 8000.0, 180.0, 8.0),
        };
        GpuSpec {
            name,
            bf16_tflops,
            hbm_gbps,
            hbm_gb,
            dollars_per_hour,
        }
    }

    /// The name used on the command line.
    pub const fn name(self) -> &'static str {
        self.spec().name
    }
}

impl FromStr for GpuKind {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self, ModelError> {
        let wanted = s.to_ascii_lowercase().replace('_', "-");
        let alias = match wanted.as_str() {
            "h100-sxm" | "h100sxm" => "h100",
            "a100" | "a100-80" | "a100-80gb" => "a100-80g",
            other => other,
        };
        Self::ALL
            .into_iter()
            .find(|g| g.name() == alias)
            .ok_or_else(|| ModelError::UnknownGpu {
                name: s.to_owned(),
                known: Self::ALL.map(|g| g.name()).join(", "),
            })
    }
}

/// What the prefill formula needs to know about a model.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ModelSpec {
    /// Preset name (`llama3-70b`, ...).
    pub name: &'static str,
    /// KV geometry (layers, bytes per token); built at 16 tokens per block,
    /// only per-token figures are used.
    pub geometry: Geometry,
    /// Parameters that take part in each token's forward pass (the active
    /// parameters of a mixture of experts).
    pub active_params: f64,
    /// All parameters (what HBM must hold).
    pub total_params: f64,
    /// Width of the attention (query heads x head dim), the `d` of the
    /// attention FLOPs term.
    pub attention_width: u32,
}

impl ModelSpec {
    /// The table entry for `preset`.
    pub fn preset(preset: ModelPreset) -> Self {
        // (active params, total params, attention width = heads x head dim)
        let (active, total, width) = match preset {
            ModelPreset::Llama3_8B => (8.0e9, 8.0e9, 4096),
            ModelPreset::Llama3_70B => (70.6e9, 70.6e9, 8192),
            ModelPreset::Qwen3_32B => (32.8e9, 32.8e9, 8192),
            // 128 heads; MLA attends over a 192-wide q.k and 128-wide v, so
            // we use the mean, 160 x 128 = 20,480.
            ModelPreset::DeepSeekV3 => (37.0e9, 671.0e9, 20480),
            ModelPreset::Tiny => (1.0e6, 1.0e6, 128),
        };
        ModelSpec {
            name: preset.name(),
            geometry: preset.geometry(16),
            active_params: active,
            total_params: total,
            attention_width: width,
        }
    }

    /// KV bytes per token (all layers).
    pub fn kv_bytes_per_token(&self) -> u64 {
        self.geometry.bytes_per_token()
    }

    /// Transformer layers.
    pub fn layers(&self) -> u32 {
        self.geometry.layers
    }
}

impl FromStr for ModelSpec {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self, ModelError> {
        let preset: ModelPreset = s.parse().map_err(|_| ModelError::UnknownModel {
            name: s.to_owned(),
            known: ModelPreset::ALL.map(|p| p.name()).join(", "),
        })?;
        Ok(Self::preset(preset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for g in GpuKind::ALL {
            assert_eq!(g.name().parse::<GpuKind>().ok(), Some(g));
        }
        assert_eq!("H100_SXM".parse::<GpuKind>().ok(), Some(GpuKind::H100Sxm));
        assert!("tpu".parse::<GpuKind>().is_err());
        assert!("gpt-9".parse::<ModelSpec>().is_err());
        assert_eq!(
            "llama3-70b".parse::<ModelSpec>().ok().map(|m| m.layers()),
            Some(80)
        );
    }
}
