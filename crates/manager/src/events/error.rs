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
    /// A network transport failed (connect, bind, send); the sink crate's
    /// own error (`kvtier-events`' `SinkError`) says which and where.
    #[error(transparent)]
    Transport(Box<dyn std::error::Error + Send + Sync + 'static>),
    /// Encoding a batch failed.
    #[error("encoding an event batch as {format}: {message}")]
    Encode {
        /// The format (`json`, `msgpack`).
        format: &'static str,
        /// What went wrong.
        message: String,
    },
}
