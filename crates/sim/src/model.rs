//! The TTFT and cost model: what a replayed hit rate is worth in time and
//! money.
//!
//! A replay says which blocks of each request were found in which tier. This
//! module turns that into the two numbers an operator decides with:
//!
//! - **time to first token** of each request, with the cached prefix loaded
//!   layer by layer while earlier layers compute (Tutti's pipeline), loaded
//!   all at once before compute, or not cached at all ([`ttft`]);
//! - **cost per million prefill tokens** of a prefill-bound fleet, from the
//!   GPU's hourly price and each tier's price per GB-hour ([`cost`]).
//!
//! Every formula is analytic and documented where it is defined, so that a
//! figure in a report can be recomputed by hand; `docs/optimizer.md` lists
//! them with their sources. The pieces: [`hardware`] (GPU and model tables),
//! [`tier`] (transfer links and storage prices), [`prefill`] (FLOPs and the
//! layer pipeline).

pub mod cost;
pub mod hardware;
pub mod prefill;
pub mod tier;
pub mod ttft;

pub use cost::{CostSummary, cost_per_million_tokens, cost_summary};
pub use hardware::{GpuKind, GpuSpec, ModelSpec};
pub use prefill::{Pipeline, pipeline, pipeline_uniform, prefill_flops};
pub use tier::TierModel;
pub use ttft::{RequestTtft, ServingModel, Stats, TtftSummary, request_ttft, ttft_summary};

/// Errors of the model: names and parameters that do not describe hardware.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A GPU name not in the table.
    #[error("unknown GPU {name:?} (known: {known})")]
    UnknownGpu {
        /// The name asked for.
        name: String,
        /// The names the table has.
        known: String,
    },
    /// A model name not in the table.
    #[error("unknown model {name:?} (known: {known})")]
    UnknownModel {
        /// The name asked for.
        name: String,
        /// The names the table has.
        known: String,
    },
    /// A parameter outside its range (a bandwidth of zero, an MFU above 1).
    #[error("invalid model parameter: {0}")]
    Invalid(String),
}
