//! [`ZmqSink`]: vLLM-format KV events on a ZeroMQ PUB socket, so routers
//! that subscribe to vLLM engines (Dynamo's `KvEventPublisher` ZMQ relay,
//! vLLM's own `kv_events_subscriber.py`) consume kvtier unchanged.
//!
//! Each batch is one multipart message, as vLLM's `ZmqEventPublisher` sends:
//!
//! ```text
//! [topic (UTF-8, may be empty), seq (u64, 8 bytes big-endian), payload (msgpack KVEventBatch)]
//! ```
//!
//! `seq` is the batch's [`EventBatch::seq`], so a subscriber sees a gap when
//! this sink's queue dropped batches. With a replay endpoint configured, a
//! ROUTER socket resends recent batches on request, as vLLM's does (see
//! [`replay`](crate::replay)). Uses the pure-Rust `zeromq` crate (ZMTP 3.x,
//! interoperates with libzmq); no system library is needed.

use std::sync::Arc;

use bytes::Bytes;
use zeromq::{PubSocket, Socket, SocketSend, ZmqMessage};

use kvtier_manager::events::vllm::encode_kv_event_batch;
use kvtier_manager::events::{
    BatchTransport, EventBatch, EventError, EventSink, QueueConfig, QueuedSink, SinkCounts,
};

use crate::SinkError;
use crate::replay::{ReplayBuffer, ReplayServer};

/// Where and how a [`ZmqSink`] publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZmqSinkConfig {
    /// Address the PUB socket binds, e.g. `tcp://0.0.0.0:5557` (`*` is taken
    /// for `0.0.0.0`; port 0 picks a free port, see [`ZmqSink::endpoint`]).
    /// Default: `tcp://127.0.0.1:5557`: vLLM's default port, on loopback
    /// (events name block hashes, which reveal shared prefixes; exposing
    /// them to other hosts is an explicit choice).
    pub endpoint: String,
    /// Topic frame of every message. Default: empty, as vLLM's default.
    pub topic: String,
    /// `data_parallel_rank` stamped on every batch. Default: 0.
    pub data_parallel_rank: i64,
    /// Address of the replay ROUTER socket, e.g. `tcp://0.0.0.0:5558`
    /// (vLLM's `replay_endpoint`); `None` serves no replays. Default: `None`.
    pub replay_endpoint: Option<String>,
    /// Batches kept for replay (vLLM's `buffer_steps`). Default: 10 000.
    pub replay_batches: usize,
    /// The sink's queue. Default: [`QueueConfig::default`].
    pub queue: QueueConfig,
}

impl Default for ZmqSinkConfig {
    fn default() -> Self {
        Self {
            endpoint: "tcp://127.0.0.1:5557".to_owned(),
            topic: String::new(),
            data_parallel_rank: 0,
            replay_endpoint: None,
            replay_batches: 10_000,
            queue: QueueConfig::default(),
        }
    }
}

/// An [`EventSink`] publishing vLLM `KVEventBatch`es on a ZeroMQ PUB
/// socket. PUB drops messages for subscribers that are absent or slow (ZMQ's
/// own policy); the queue in front drops when encoding falls behind.
pub struct ZmqSink {
    inner: QueuedSink,
    endpoint: String,
    replay_endpoint: Option<String>,
}

impl ZmqSink {
    /// Binds the PUB socket and starts the sink's worker.
    pub async fn bind(config: ZmqSinkConfig) -> Result<Self, SinkError> {
        let (replay, replay_endpoint) = match &config.replay_endpoint {
            Some(endpoint) => {
                let buffer = Arc::new(ReplayBuffer::new(config.replay_batches));
                let (server, bound) =
                    ReplayServer::bind(&wildcard_host(endpoint), Arc::clone(&buffer)).await?;
                (Some((buffer, server)), Some(bound))
            }
            None => (None, None),
        };
        let requested = wildcard_host(&config.endpoint);
        let mut socket = PubSocket::new();
        let bound = socket
            .bind(&requested)
            .await
            .map_err(|source| SinkError::Zmq {
                op: "bind",
                endpoint: requested.clone(),
                source,
            })?;
        let endpoint = bound.to_string();
        let transport = ZmqTransport {
            socket: Some(socket),
            topic: Bytes::from(config.topic.into_bytes()),
            data_parallel_rank: config.data_parallel_rank,
            endpoint: endpoint.clone(),
            replay,
        };
        let inner = QueuedSink::spawn("zmq", transport, config.queue)?;
        Ok(Self {
            inner,
            endpoint,
            replay_endpoint,
        })
    }

    /// The address the replay socket is bound to, when there is one.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// The address the socket is bound to, with the real port.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Closes the sink and waits until queued batches are sent and the
    /// socket is closed.
    pub async fn close_and_wait(&self) {
        self.inner.close_and_wait().await;
    }
}

impl EventSink for ZmqSink {
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

struct ZmqTransport {
    /// `None` once shut down.
    socket: Option<PubSocket>,
    topic: Bytes,
    data_parallel_rank: i64,
    endpoint: String,
    /// Sent batches kept for replay, and the server answering from them
    /// (stopped when the transport shuts down).
    replay: Option<(Arc<ReplayBuffer>, ReplayServer)>,
}

impl BatchTransport for ZmqTransport {
    async fn send(&mut self, batch: &EventBatch) -> Result<(), EventError> {
        let payload = Bytes::from(encode_kv_event_batch(batch, self.data_parallel_rank));
        if let Some((buffer, _)) = &self.replay {
            buffer.push(batch.seq, payload.clone());
        }
        let mut message = ZmqMessage::from(self.topic.clone());
        message.push_back(Bytes::copy_from_slice(&batch.seq.to_be_bytes()));
        message.push_back(payload);
        match self.socket.as_mut() {
            Some(socket) => socket.send(message).await.map_err(|source| {
                EventError::from(SinkError::Zmq {
                    op: "send",
                    endpoint: self.endpoint.clone(),
                    source,
                })
            }),
            None => Ok(()),
        }
    }

    async fn shutdown(&mut self) {
        self.replay = None;
        if let Some(socket) = self.socket.take() {
            for error in socket.close().await {
                tracing::debug!(endpoint = %self.endpoint, %error, "closing ZMQ socket");
            }
        }
    }
}

/// vLLM endpoints use `*` for "all interfaces"; the `zeromq` crate wants an
/// address.
fn wildcard_host(endpoint: &str) -> String {
    endpoint.replace("://*:", "://0.0.0.0:")
}
