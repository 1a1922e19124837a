//! Tutti's slack-aware I/O scheduler, in front of the transfer engine.
//!
//! - [`IoScheduler`] queues reads and writes, dispatches them to the
//!   [`TransferEngine`](crate::transfer::TransferEngine) as [`IoPolicy`]
//!   allows, and loads blocks layer by layer ([`IoScheduler::load`] ->
//!   [`LoadHandle`], whose [`wait_layer`](LoadHandle::wait_layer) resolves
//!   when one layer of every block is resident).
//! - [`IoPolicy`] holds the rules (reads first, a write budget while reads
//!   are pending, writes only in slack) as a pure state machine.
//! - [`SlackEstimator`] learns per-layer compute time and device bandwidth
//!   online (EWMA), optionally starting from a [`SlackProfile`] file.
//! - [`Clock`]: [`SystemClock`] in production, [`ManualClock`] in tests,
//!   which measure bubble time (consumer waiting in `wait_layer`) exactly.

mod clock;
mod io;
mod load;
mod policy;
mod slack;

pub use clock::{Clock, ManualClock, SystemClock};
pub use io::{IoScheduler, SchedulerConfig, SchedulerError, SchedulerStats};
pub use load::{LayerOutcome, LayerWait, LoadHandle};
pub use policy::{IoClass, IoPolicy, OpId, PolicyConfig, PolicyCounters, WriteBudget};
pub use slack::{ProfileError, SlackEstimator, SlackProfile};
