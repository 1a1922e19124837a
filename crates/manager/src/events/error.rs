//! Errors of the event plane.

/// What can go wrong setting up or feeding an event sink.
///
/// Publishing itself never fails toward the data path: a sink that cannot
/// deliver counts the loss (see [`SinkCounts`](super::SinkCounts)) instead.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// The publisher or sink needs a Tokio runtime and was built outside one.
    #[error("event {what} must be created inside a Tokio runtime")]
    NoRuntime {
        /// What was being created.
        what: &'static str,
    },
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
    /// Encoding a batch failed.
    #[error("encoding an event batch as {format}: {message}")]
    Encode {
        /// The format (`json`, `msgpack`).
        format: &'static str,
        /// What went wrong.
        message: String,
    },
}
