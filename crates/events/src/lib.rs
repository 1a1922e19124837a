//! # kvtier-events
//!
//! The block manager's network event sinks, kept out of `kvtier-manager` so
//! that only the processes that publish events (the node daemon) build
//! NATS and ZeroMQ clients:
//!
//! * [`NatsSink`]: each [`EventBatch`](kvtier_manager::events::EventBatch)
//!   as JSON on a NATS subject (`kvtier.events.<node>`), the cluster's event
//!   plane.
//! * [`ZmqSink`]: vLLM's msgpack `KVEventBatch` on a ZeroMQ PUB socket, with
//!   vLLM's [`replay`] ROUTER socket, so Dynamo and vLLM routers consume
//!   kvtier unchanged.
//!
//! Both implement the manager's
//! [`EventSink`](kvtier_manager::events::EventSink) through its
//! [`QueuedSink`](kvtier_manager::events::QueuedSink): a bounded queue
//! drained by one task, so a slow or absent consumer costs dropped, counted
//! batches and never blocks the data path. Hand them to an
//! [`EventPublisher`](kvtier_manager::events::EventPublisher) (or list them
//! in the manager's configuration); the model, the publisher and the vLLM
//! encoding stay in `kvtier-manager`. Wire formats: `docs/events.md`.
//!
//! ```no_run
//! use std::sync::Arc;
//! use kvtier_events::{NatsSink, NatsSinkConfig};
//! use kvtier_manager::events::{EventPublisher, EventSink, PublisherConfig};
//!
//! # async fn start() -> Result<(), Box<dyn std::error::Error>> {
//! let sink = NatsSink::connect(NatsSinkConfig::for_node("nats://127.0.0.1:4222", "node-a")).await?;
//! let sinks: Vec<Arc<dyn EventSink>> = vec![Arc::new(sink)];
//! let publisher = EventPublisher::new(PublisherConfig::default(), sinks)?;
//! # drop(publisher);
//! # Ok(())
//! # }
//! ```

mod error;
mod nats;
pub mod replay;
mod zmq;

pub use error::SinkError;
pub use nats::{NatsSink, NatsSinkConfig};
pub use zmq::{ZmqSink, ZmqSinkConfig};
