//! The error type of `kvtier-core`.

use thiserror::Error;

/// Result alias used throughout `kvtier-core`.
pub type Result<T, E = CoreError> = std::result::Result<T, E>;

/// Everything that can go wrong in the core model: invalid shapes and
/// invalid configuration. Both are caller errors; nothing here touches I/O.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CoreError {
    /// A geometry field is out of range (zero layers, a TP rank past the TP
    /// size, ...). The message names the field.
    #[error("invalid geometry: {0}")]
    InvalidGeometry(String),
    /// A model preset name was not recognised.
    #[error("unknown model preset {name:?}; known presets: {known}")]
    UnknownPreset {
        /// The name that was asked for.
        name: String,
        /// The names that exist, comma separated.
        known: String,
    },
    /// The configuration text could not be parsed or has a bad value.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// An environment override `KVTIER_...` could not be applied.
    #[error("invalid environment override {var}: {reason}")]
    InvalidEnvOverride {
        /// The variable's name.
        var: String,
        /// Why it was refused.
        reason: String,
    },
}
