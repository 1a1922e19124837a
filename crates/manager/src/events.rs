//! Block events: what the manager tells routers and storage advisors about
//! blocks stored on and removed from each tier.
//!
//! * [`KvEvent`] ([`BlockStored`], [`BlockRemoved`], `AllCleared`) and
//!   [`EventBatch`] are the model.
//! * [`EventPublisher`] batches events (by count, by age, on demand, on
//!   close) and fans each batch out to every [`EventSink`].
//! * Sinks: [`ChannelSink`] (in-process) here; the network sinks live in
//!   `kvtier-events`, so users of the manager that publish nowhere do not
//!   build NATS and ZeroMQ clients: `NatsSink` (JSON on a NATS subject, the
//!   cluster event plane) and `ZmqSink` (vLLM's msgpack `KVEventBatch`, as
//!   [`vllm`] encodes it, on a ZMQ PUB socket, so Dynamo / vLLM routers
//!   consume kvtier unchanged). They sit behind a bounded [`QueuedSink`]
//!   over a [`BatchTransport`]: a slow or absent consumer costs dropped,
//!   counted batches, never a blocked data path.
//!
//! Wire formats and their sources: `docs/events.md`.
//!
//! ```
//! use std::sync::Arc;
//! use kvtier_core::{BlockHash, TierKind};
//! use kvtier_manager::Tier;
//! use kvtier_manager::events::{BlockRemoved, ChannelSink, EventPublisher, KvEvent, PublisherConfig};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let (sink, mut batches) = ChannelSink::new(16);
//! let publisher = EventPublisher::new(PublisherConfig::default(), vec![Arc::new(sink)]).unwrap();
//! publisher.emit(KvEvent::Removed(BlockRemoved {
//!     block_hashes: vec![BlockHash(7)],
//!     tier: Tier::G2,
//!     kind: TierKind::Memory,
//! }));
//! publisher.flush();
//! let batch = batches.recv().await.unwrap();
//! assert_eq!((batch.seq, batch.events.len()), (0, 1));
//! # });
//! ```

mod channel;
mod error;
mod model;
mod publisher;
pub mod queue;
mod sink;
pub mod vllm;

pub use channel::ChannelSink;
pub use error::EventError;
pub use model::{BlockLocation, BlockRemoved, BlockStored, EventBatch, KvEvent};
pub use publisher::{EventPublisher, PublisherConfig};
pub use queue::{BatchTransport, Overflow, QueueConfig, QueuedSink};
pub use sink::{EventSink, SinkCounters, SinkCounts};
