//! [`NatsSink`]: event batches as JSON on a NATS subject, the cluster's event
//! plane (DESIGN.md; Dynamo's KVBM publishes on NATS the same way).
//!
//! One NATS message per batch; the payload is the JSON form of
//! [`EventBatch`] (schema in `docs/events.md`). Reconnecting is the
//! `async-nats` client's job: while the server is away the client buffers,
//! and once its buffer is full the sink's own queue fills and drops, so the
//! data path never waits.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use kvtier_manager::events::{
    BatchTransport, EventBatch, EventError, EventSink, QueueConfig, QueuedSink, SinkCounts,
};

use crate::SinkError;

/// Where a [`NatsSink`] publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsSinkConfig {
    /// Server address, e.g. `nats://127.0.0.1:4222`.
    pub url: String,
    /// Subject of every batch, e.g. `kvtier.events.node-a`.
    pub subject: String,
    /// The sink's queue. Default: [`QueueConfig::default`].
    pub queue: QueueConfig,
}

impl NatsSinkConfig {
    /// The subject a node publishes on: `kvtier.events.<node>`.
    pub fn node_subject(node: &str) -> String {
        format!("kvtier.events.{node}")
    }

    /// A configuration publishing on [`node_subject`](Self::node_subject).
    pub fn for_node(url: impl Into<String>, node: &str) -> Self {
        Self {
            url: url.into(),
            subject: Self::node_subject(node),
            queue: QueueConfig::default(),
        }
    }
}

/// How long shutdown waits for the client to flush to the server.
const FLUSH_ON_CLOSE: Duration = Duration::from_secs(2);

/// An [`EventSink`] publishing JSON batches to NATS.
pub struct NatsSink {
    inner: QueuedSink,
    subject: String,
}

impl NatsSink {
    /// Connects to the server and starts the sink's worker. Fails when the
    /// server cannot be reached now; later outages are ridden out by the
    /// client's reconnects.
    pub async fn connect(config: NatsSinkConfig) -> Result<Self, SinkError> {
        let client = async_nats::connect(config.url.as_str())
            .await
            .map_err(|source| SinkError::NatsConnect {
                url: config.url.clone(),
                source,
            })?;
        Self::with_client(client, config.subject, config.queue)
    }

    /// A sink over an existing client (shared with other publishers).
    pub fn with_client(
        client: async_nats::Client,
        subject: String,
        queue: QueueConfig,
    ) -> Result<Self, SinkError> {
        let transport = NatsTransport {
            client,
            subject: subject.clone(),
        };
        let inner = QueuedSink::spawn("nats", transport, queue)?;
        Ok(Self { inner, subject })
    }

    /// The subject batches go to.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// Closes the sink and waits until queued batches are handed to the
    /// client and flushed (bounded wait).
    pub async fn close_and_wait(&self) {
        self.inner.close_and_wait().await;
    }
}

impl EventSink for NatsSink {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn publish(&self, batch: Arc<EventBatch>) {
        self.inner.publish(batch);
    }

    fn counts(&self) -> SinkCounts {
        self.inner.counts()
    }

    fn close(&self) {
        self.inner.close();
    }
}

struct NatsTransport {
    client: async_nats::Client,
    subject: String,
}

impl BatchTransport for NatsTransport {
    async fn send(&mut self, batch: &EventBatch) -> Result<(), EventError> {
        let payload = serde_json::to_vec(batch).map_err(|e| EventError::Encode {
            format: "json",
            message: e.to_string(),
        })?;
        self.client
            .publish(self.subject.clone(), Bytes::from(payload))
            .await
            .map_err(|source| {
                EventError::from(SinkError::NatsPublish {
                    subject: self.subject.clone(),
                    source,
                })
            })
    }

    async fn shutdown(&mut self) {
        match tokio::time::timeout(FLUSH_ON_CLOSE, self.client.flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::warn!(subject = %self.subject, %error, "NATS flush on close")
            }
            Err(_) => tracing::warn!(subject = %self.subject, "NATS flush on close timed out"),
        }
    }
}
