//! [`SinkError`]: why a network sink could not start or send.

use kvtier_manager::events::EventError;

/// What can go wrong connecting, binding or feeding a network sink.
///
/// A transport failure while sending reaches the sink's queue as
/// [`EventError::Transport`] (see the [`From`] impl), which counts it and
/// loses that batch; the message is this error's.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// Connecting to the NATS server failed.
    #[error("connecting to NATS at {url}: {source}")]
    NatsConnect {
        /// The server address.
        url: String,
        /// The client's error.
        #[source]
        source: async_nats::ConnectError,
    },
    /// Publishing one batch to NATS failed.
    #[error("publishing to NATS subject {subject}: {source}")]
    NatsPublish {
        /// The subject.
        subject: String,
        /// The client's error.
        #[source]
        source: async_nats::PublishError,
    },
    /// A ZeroMQ socket operation failed.
    #[error("ZeroMQ {op} {endpoint}: {source}")]
    Zmq {
        /// The operation (`bind`, `send`).
        op: &'static str,
        /// The endpoint involved.
        endpoint: String,
        /// The socket's error.
        #[source]
        source: zeromq::ZmqError,
    },
    /// The sink's queue could not start (no Tokio runtime), or a batch
    /// could not be encoded.
    #[error(transparent)]
    Event(#[from] EventError),
}

impl From<SinkError> for EventError {
    fn from(error: SinkError) -> Self {
        match error {
            SinkError::Event(error) => error,
            transport => EventError::Transport(Box::new(transport)),
        }
    }
}
