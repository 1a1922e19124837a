//! The replay side of vLLM's ZMQ publisher: a ROUTER socket that resends
//! recent batches to a subscriber that saw a gap in `seq`.
//!
//! Protocol (vLLM `ZmqEventPublisher._service_replay`):
//!
//! ```text
//! request  (client -> ROUTER): ["", start_seq (u64, 8 bytes big-endian)]
//! replies  (ROUTER -> client): ["", seq (8 bytes BE), payload]   for each buffered seq >= start_seq
//! end mark (ROUTER -> client): ["", -1 (i64, 8 bytes BE), ""]
//! ```
//!
//! (The ROUTER adds and strips the client identity frame.) Requests that do
//! not have those two frames are ignored, as vLLM does.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use zeromq::{RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::SinkError;

/// The end-of-replay marker: -1 as a signed 64-bit big-endian integer.
pub const END_SEQ: [u8; 8] = (-1i64).to_be_bytes();

/// The last `capacity` published `(seq, payload)` pairs.
pub(crate) struct ReplayBuffer {
    entries: Mutex<VecDeque<(u64, Bytes)>>,
    capacity: usize,
}

impl ReplayBuffer {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            entries: Mutex::new(VecDeque::with_capacity(capacity.min(4096))),
            capacity: capacity.max(1),
        }
    }

    pub(crate) fn push(&self, seq: u64, payload: Bytes) {
        let mut entries = self.entries.lock();
        if entries.len() >= self.capacity {
            entries.pop_front();
        }
        entries.push_back((seq, payload));
    }

    fn since(&self, start: u64) -> Vec<(u64, Bytes)> {
        self.entries
            .lock()
            .iter()
            .filter(|(seq, _)| *seq >= start)
            .cloned()
            .collect()
    }
}

/// A running replay server; stops when dropped.
pub(crate) struct ReplayServer {
    task: JoinHandle<()>,
}

impl ReplayServer {
    /// Binds the ROUTER socket and serves requests from `buffer`. Returns
    /// the server and the bound endpoint.
    pub(crate) async fn bind(
        endpoint: &str,
        buffer: Arc<ReplayBuffer>,
    ) -> Result<(Self, String), SinkError> {
        let mut socket = RouterSocket::new();
        let bound = socket
            .bind(endpoint)
            .await
            .map_err(|source| SinkError::Zmq {
                op: "bind",
                endpoint: endpoint.to_owned(),
                source,
            })?;
        let bound = bound.to_string();
        let task = tokio::spawn(serve(socket, buffer, bound.clone()));
        Ok((Self { task }, bound))
    }
}

impl Drop for ReplayServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(mut socket: RouterSocket, buffer: Arc<ReplayBuffer>, endpoint: String) {
    loop {
        let request = match socket.recv().await {
            Ok(request) => request.into_vec(),
            Err(error) => {
                tracing::warn!(%endpoint, %error, "replay socket closed");
                return;
            }
        };
        // [identity, empty delimiter, start_seq]
        let [identity, _, start] = request.as_slice() else {
            tracing::debug!(%endpoint, frames = request.len(), "invalid replay request");
            continue;
        };
        let Ok(start) = <[u8; 8]>::try_from(start.as_ref()) else {
            tracing::debug!(%endpoint, "replay request without an 8-byte seq");
            continue;
        };
        let start = u64::from_be_bytes(start);
        let replies = buffer
            .since(start)
            .into_iter()
            .map(|(seq, payload)| (Bytes::copy_from_slice(&seq.to_be_bytes()), payload))
            .chain([(Bytes::from_static(&END_SEQ), Bytes::new())]);
        for (seq, payload) in replies {
            let reply = ZmqMessage::try_from(vec![identity.clone(), Bytes::new(), seq, payload]);
            let sent = match reply {
                Ok(reply) => socket.send(reply).await,
                Err(_) => continue, // a non-empty frame list always converts
            };
            if let Err(error) = sent {
                tracing::debug!(%endpoint, %error, "replay client went away");
                break;
            }
        }
    }
}
