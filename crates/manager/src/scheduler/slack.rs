//! Slack learned online: per-layer compute times and the device's read and
//! write bandwidth as exponentially weighted moving averages, optionally
//! seeded from a JSON profile.
//!
//! Tutti profiles slack offline into a table; its review asks for an online
//! estimate instead, so a new model, batch mix or GPU needs no profiling
//! run. A profile file is still accepted as the starting point and can be
//! written back from what was learned.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Why a profile could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The profile file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a valid profile.
    #[error("{path}: invalid slack profile: {source}")]
    Format {
        /// The profile file.
        path: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// A value is negative or not finite.
    #[error("{0}")]
    Invalid(String),
}

/// A slack profile: what the estimator starts from, and what it can save.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SlackProfile {
    /// Compute time of each layer in microseconds (`null` where unknown).
    pub layer_compute_us: Vec<Option<f64>>,
    /// Read bandwidth of the device in bytes per second, if known.
    #[serde(default)]
    pub read_bytes_per_sec: Option<f64>,
    /// Write bandwidth of the device in bytes per second, if known.
    #[serde(default)]
    pub write_bytes_per_sec: Option<f64>,
}

impl SlackProfile {
    /// Reads a profile from a JSON file.
    pub fn load(path: &Path) -> Result<Self, ProfileError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Io {
            path: name.clone(),
            source,
        })?;
        let p: SlackProfile = serde_json::from_str(&text)
            .map_err(|source| ProfileError::Format { path: name, source })?;
        p.validate()?;
        Ok(p)
    }

    /// Writes the profile as JSON.
    pub fn save(&self, path: &Path) -> Result<(), ProfileError> {
        let name = path.display().to_string();
        let text = serde_json::to_string_pretty(self).map_err(|source| ProfileError::Format {
            path: name.clone(),
            source,
        })?;
        std::fs::write(path, text).map_err(|source| ProfileError::Io { path: name, source })
    }

    /// Checks every value is finite and non-negative (bandwidths positive).
    pub fn validate(&self) -> Result<(), ProfileError> {
        for (l, v) in self.layer_compute_us.iter().enumerate() {
            if let Some(v) = v
                && !(v.is_finite() && *v >= 0.0)
            {
                return Err(ProfileError::Invalid(format!(
                    "layer {l}: compute time {v}"
                )));
            }
        }
        for (what, v) in [
            ("read", self.read_bytes_per_sec),
            ("write", self.write_bytes_per_sec),
        ] {
            if let Some(v) = v
                && !(v.is_finite() && v > 0.0)
            {
                return Err(ProfileError::Invalid(format!("{what} bandwidth {v}")));
            }
        }
        Ok(())
    }
}

/// An exponentially weighted moving average; the first sample sets it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Ewma {
    value: Option<f64>,
}

impl Ewma {
    fn seed(value: Option<f64>) -> Self {
        Self { value }
    }
    fn record(&mut self, alpha: f64, sample: f64) {
        self.value = Some(match self.value {
            None => sample,
            Some(v) => v + alpha * (sample - v),
        });
    }
}

/// Online estimates of per-layer compute time and device bandwidth.
#[derive(Debug, Clone, PartialEq)]
pub struct SlackEstimator {
    alpha: f64,
    /// Seconds per layer.
    compute: Vec<Ewma>,
    samples: Vec<u64>,
    read_bw: Ewma,
    write_bw: Ewma,
}

impl SlackEstimator {
    /// An estimator knowing nothing, weighting each new sample by `alpha`
    /// (clamped to `(0, 1]`; 0.2 follows a shift within ~10 samples and
    /// damps noise ~3x).
    pub fn new(alpha: f64) -> Self {
        let alpha = if alpha.is_finite() {
            alpha.clamp(1e-6, 1.0)
        } else {
            0.2
        };
        Self {
            alpha,
            compute: Vec::new(),
            samples: Vec::new(),
            read_bw: Ewma::default(),
            write_bw: Ewma::default(),
        }
    }

    /// An estimator starting from `profile`.
    pub fn from_profile(alpha: f64, profile: &SlackProfile) -> Self {
        let mut e = Self::new(alpha);
        e.compute = profile
            .layer_compute_us
            .iter()
            .map(|us| Ewma::seed(us.map(|us| us / 1e6)))
            .collect();
        e.samples = vec![0; e.compute.len()];
        e.read_bw = Ewma::seed(profile.read_bytes_per_sec);
        e.write_bw = Ewma::seed(profile.write_bytes_per_sec);
        e
    }

    /// What was learned, as a profile to save.
    pub fn profile(&self) -> SlackProfile {
        SlackProfile {
            layer_compute_us: self
                .compute
                .iter()
                .map(|e| e.value.map(|s| s * 1e6))
                .collect(),
            read_bytes_per_sec: self.read_bw.value,
            write_bytes_per_sec: self.write_bw.value,
        }
    }

    /// Records that layer `layer` computed for `d`.
    pub fn record_layer_compute(&mut self, layer: u32, d: Duration) {
        let l = layer as usize;
        if self.compute.len() <= l {
            self.compute.resize(l + 1, Ewma::default());
            self.samples.resize(l + 1, 0);
        }
        self.compute[l].record(self.alpha, d.as_secs_f64());
        self.samples[l] += 1;
    }

    /// Records a completed read of `bytes` that took `d` (ignored when `d`
    /// or `bytes` is zero: no bandwidth to learn).
    pub fn record_read(&mut self, bytes: u64, d: Duration) {
        if bytes > 0 && !d.is_zero() {
            self.read_bw
                .record(self.alpha, bytes as f64 / d.as_secs_f64());
        }
    }

    /// Records a completed write of `bytes` that took `d`.
    pub fn record_write(&mut self, bytes: u64, d: Duration) {
        if bytes > 0 && !d.is_zero() {
            self.write_bw
                .record(self.alpha, bytes as f64 / d.as_secs_f64());
        }
    }

    /// Predicted compute time of `layer`.
    pub fn layer_compute(&self, layer: u32) -> Option<Duration> {
        self.compute
            .get(layer as usize)
            .and_then(|e| e.value)
            .map(Duration::from_secs_f64)
    }

    /// Samples recorded for `layer`.
    pub fn samples(&self, layer: u32) -> u64 {
        self.samples.get(layer as usize).copied().unwrap_or(0)
    }

    /// Learned read bandwidth, bytes per second.
    pub fn read_bandwidth(&self) -> Option<f64> {
        self.read_bw.value
    }

    /// Learned write bandwidth, bytes per second.
    pub fn write_bandwidth(&self) -> Option<f64> {
        self.write_bw.value
    }

    /// Predicted time to write `bytes`, if the write bandwidth is known.
    pub fn write_time(&self, bytes: u64) -> Option<Duration> {
        self.write_bw
            .value
            .map(|bw| Duration::from_secs_f64(bytes as f64 / bw))
    }

    /// The slack of `layer`: its predicted compute time minus the time the
    /// device needs to read `next_read_bytes` (the next layer's load) during
    /// it. `None` while the layer's compute time is unknown; zero when the
    /// reads alone fill the layer.
    pub fn slack(&self, layer: u32, next_read_bytes: u64) -> Option<Duration> {
        let compute = self.layer_compute(layer)?;
        let read = match self.read_bw.value {
            Some(bw) => Duration::from_secs_f64(next_read_bytes as f64 / bw),
            None if next_read_bytes == 0 => Duration::ZERO,
            // Reads of unknown speed are assumed to take the whole layer.
            None => compute,
        };
        Some(compute.saturating_sub(read))
    }
}
