//! The transfer engine: moves blocks between the tiers of a
//! [`TierList`](crate::TierList), each a `TierStore` (kvtier-tier's).
//!
//! - [`TransferEngine`] keeps a queue and a worker per
//!   [`TransferPath`](crate::TransferPath); [`submit`](TransferEngine::submit)
//!   a [`TransferRequest`] and get a [`TransferHandle`] to await whole or
//!   block by block.
//! - Executors (module `executor`) run one batch per call over the real
//!   tiers: one disk or remote submission per batch, every read
//!   verified; a failed block is a [`BlockFailure`], never delivered.
//! - [`InFlightHooks`] is where the block pool marks destinations
//!   unreadable and sources unevictable until a block completes;
//!   [`InFlightTable`] is a standalone implementation.
//! - [`PathStats`] are the counters per path (bytes, transfers, blocks,
//!   queue depth, latency, failures).

pub(crate) mod completion;
mod engine;
mod executor;
mod hooks;
mod landing;
mod metrics;
mod request;

pub use completion::{WaitAll, WaitBlock};
pub use engine::{TransferEngine, TransferEngineBuilder, TransferError};
pub use hooks::{InFlightHooks, InFlightTable, NoHooks, TransferTicket};
pub use landing::{HostLanding, LayerTarget};
pub use metrics::{LatencyHistogram, LatencySummary, PathMetrics, PathStats, TransferMetrics};
pub use request::{
    BlockFailure, BlockMove, BlockResult, Span, TransferHandle, TransferOutcome, TransferRequest,
};
